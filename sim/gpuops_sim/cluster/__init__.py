"""The emulated cluster's moving parts (KWOK-like): scheduler, kubelets, node lifecycle, Job controller.

They run in the emulator's own process and event loop and read and write through its object API, so every
change they make goes through the same validation, resourceVersions and watch events a client sees.
"""
