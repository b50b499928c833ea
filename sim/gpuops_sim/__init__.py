"""The emulated GPU cluster: an API server, and later a scheduler, kubelets, clouds and GPUs.

Production code never imports this package; it talks to the emulator over HTTP only.
"""
