"""Loaded by the processes of emulated pods only (their PYTHONPATH names this folder): see `sitecustomize`."""
