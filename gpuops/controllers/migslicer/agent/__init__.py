"""The MIG slicer's node agent: it creates and destroys MIG slices on its node's GPUs for the allocator's
claims. `gpus.MigBackend` does the MIG work over NVML: the real `pynvml`, or an NVML-shaped module another
distribution contributes (`backends`) when the node is emulated. Nothing is imported here, so importing the
package stays cheap."""
