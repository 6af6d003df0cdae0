"""kubelet PodResources v1 client: which namespace, pod and container holds each GPU.

Importing this package imports only the standard library; h2 and protobuf (the
``kubernetes`` extra) load when a :class:`PodResourcesClient` is built.
"""

from exporter.supervisor.podresources.client import (
    DEFAULT_SOCKET,
    DEFAULT_TIMEOUT_S,
    DRA_GPU_DRIVERS,
    Assignments,
    DraDevice,
    PodRef,
    PodResourcesClient,
    PodResourcesError,
    PodResourcesUnsupported,
    allocatable_replicas,
    allocatable_unparsed,
    assignments,
    check_socket,
    dra_devices,
    gpu_assignments,
    gpu_uuid_from_device_id,
    is_gpu_resource,
    unmapped_assignments,
    unsupported_reason,
    uuid_from_cdi_devices,
)

__all__ = [
    "DEFAULT_SOCKET",
    "DRA_GPU_DRIVERS",
    "Assignments",
    "DraDevice",
    "DEFAULT_TIMEOUT_S",
    "PodRef",
    "PodResourcesClient",
    "PodResourcesError",
    "PodResourcesUnsupported",
    "allocatable_replicas",
    "allocatable_unparsed",
    "assignments",
    "check_socket",
    "dra_devices",
    "gpu_assignments",
    "gpu_uuid_from_device_id",
    "is_gpu_resource",
    "unmapped_assignments",
    "unsupported_reason",
    "uuid_from_cdi_devices",
]
