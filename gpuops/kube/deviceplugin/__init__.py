"""The kubelet device-plugin API (gRPC v1beta1): `server.DevicePluginServer` serves one extended resource to the
kubelet (the MIG agent runs one per `gpuops.io/mig-<profile>`). The kubelet's side, for the emulated cluster, is
`gpuops_sim.cluster.devicemanager`. `api_pb2*` are generated from `api.proto` by `make proto`."""
