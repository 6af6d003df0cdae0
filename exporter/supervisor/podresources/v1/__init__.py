"""Generated protobuf and gRPC modules for the kubelet PodResources v1 API (see regenerate.py)."""
