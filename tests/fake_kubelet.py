"""A kubelet PodResourcesLister with canned answers (the generated servicer of our own
proto/podresources/v1/api.proto, served by a real gRPC server in the tests that use it).

The messages are the upstream v1 ones, ``dynamic_resources`` included: :func:`dra_pod` builds a pod
whose container got its devices through a ResourceClaim, as a kubelet with Dynamic Resource
Allocation reports it (driver, pool, device and CDI device names per claim).

Needs grpcio (the ``kubernetes`` extra): importing this module without it raises ImportError.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exporter.supervisor.podresources.v1 import api_pb2, api_pb2_grpc


def dra_pod(namespace: str, name: str, container: str, claim: str, *devices: tuple[str, str, str, list[str]]) -> Any:
    """A pod with one container holding one ResourceClaim ``namespace/claim``; each device is
    (driver, pool, device, CDI device names)."""
    resources = [
        api_pb2.ClaimResource(
            driver_name=driver, pool_name=pool, device_name=device, cdi_devices=[api_pb2.CDIDevice(name=n) for n in cdi]
        )
        for driver, pool, device, cdi in devices
    ]
    dynamic = api_pb2.DynamicResource(claim_name=claim, claim_namespace=namespace, claim_resources=resources)
    return api_pb2.PodResources(
        namespace=namespace,
        name=name,
        containers=[api_pb2.ContainerResources(name=container, dynamic_resources=[dynamic])],
    )


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """The PodResourcesLister service with canned answers and optional behaviours."""

    def __init__(
        self,
        pods: list[Any],
        allocatable: list[Any] | None = None,
        allocatable_error: tuple[Any, str] | None = None,
        list_hook: Callable[[], None] | None = None,
    ) -> None:
        self.pods = pods
        self.allocatable = allocatable
        self.allocatable_error = allocatable_error
        self.list_hook = list_hook
        self.list_calls = 0
        self.allocatable_calls = 0

    def List(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        self.list_calls += 1
        if self.list_hook is not None:
            self.list_hook()
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.allocatable_calls += 1
        if self.allocatable_error is not None:
            code, details = self.allocatable_error
            context.abort(code, details)
        if self.allocatable is None:
            # The generated base class answers UNIMPLEMENTED, as a kubelet before 1.21 does.
            return super().GetAllocatableResources(request, context)
        return api_pb2.AllocatableResourcesResponse(devices=self.allocatable)
