"""A kubelet PodResourcesLister with canned answers (the generated servicer of our own
proto/podresources/v1/api.proto, served by a real gRPC server in the tests that use it).

Needs grpcio (the ``kubernetes`` extra): importing this module without it raises ImportError.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exporter.supervisor.podresources.v1 import api_pb2, api_pb2_grpc


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

    def List(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        self.list_calls += 1
        if self.list_hook is not None:
            self.list_hook()
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        if self.allocatable_error is not None:
            code, details = self.allocatable_error
            context.abort(code, details)
        if self.allocatable is None:
            # The generated base class answers UNIMPLEMENTED, as a kubelet before 1.21 does.
            return super().GetAllocatableResources(request, context)
        return api_pb2.AllocatableResourcesResponse(devices=self.allocatable)
