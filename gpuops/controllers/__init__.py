"""The controllers: each translates between Kubernetes objects (`gpuops.kube`) and pure decisions
(`gpuops.accounting`). One folder per controller (api.py, reconciler.py, side-effect adapters); no controller
imports another."""
