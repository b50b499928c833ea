"""The MIG slicer: on-demand MIG slices for pods that ask for `nvidia.com/mig-<profile>`, chosen by a
fragmentation-aware allocator, created by a node agent, bound by the default scheduler."""
