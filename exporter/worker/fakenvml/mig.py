"""MIG in the fake (docs/scenarios.md, "MIG"): the calls on a GPU with a ``mig`` object, and every
call made with a MIG device handle, answered from its instance (:class:`~exporter.worker.fakenvml.mig_model.MigModel`).

A GPU without a ``mig`` object answers ``nvmlDeviceGetMigMode`` and ``nvmlDeviceGetMaxMigDeviceCount``
from its ``values`` and has no MIG device.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from exporter.common.nvml import errors
from exporter.worker.fakenvml.core import FakeCore, memory_info, nvml_error
from exporter.worker.fakenvml.faults import crash_segfault
from exporter.worker.fakenvml.mig_model import FakeGpuInstance, FakeMigHandle, MigModel


class MigCalls(FakeCore):
    """MIG mode, MIG device handles, GPU instances and profiles; calls with MIG device handles."""

    def __init__(self, path: str, epoch: float | None = None, clock: Callable[[], float] | None = None) -> None:
        super().__init__(path, epoch, clock)
        self.mig = MigModel(self.gpu_at, self.resolve, self.now)

    def enter_parent(self, fn: str, handle: Any) -> int | None:
        """Enter ``fn`` on a GPU handle; the GPU index when it has a ``mig`` object, else None
        (answered from ``values`` by the caller). A MIG device handle answers NOT_SUPPORTED (or
        INVALID_ARGUMENT when its instance is gone)."""
        self.enter(fn, getattr(handle, "index", getattr(handle, "gpu", None)))
        if isinstance(handle, FakeMigHandle):
            self.mig.instance(handle)  # a stale handle answers INVALID_ARGUMENT
            raise nvml_error(errors.NOT_SUPPORTED)  # not on a MIG device handle
        self.gpu_of(handle)
        return handle.gpu if self.mig.spec(handle.gpu) is not None else None

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:  # noqa: N802
        gpu = self.enter_parent("nvmlDeviceGetMigMode", handle)
        if gpu is None:
            return list(self.value(self.gpu_of(handle), "nvmlDeviceGetMigMode", ()))
        return self.mig.mode(gpu)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:  # noqa: N802
        gpu = self.enter_parent("nvmlDeviceGetMaxMigDeviceCount", handle)
        if gpu is None:
            values = self.gpu_of(handle)["values"]
            if "nvmlDeviceGetMaxMigDeviceCount" not in values and "nvmlDeviceGetMigMode" in values:
                return 0  # a MIG-capable GPU with MIG off answers 0 (measured on the H200, driver 580.159.04)
            return int(self.value(self.gpu_of(handle), "nvmlDeviceGetMaxMigDeviceCount", ()))
        return self.mig.max_devices(gpu)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> FakeMigHandle:  # noqa: N802
        gpu = self.enter_parent("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if gpu is None:
            raise nvml_error(errors.NOT_FOUND)  # no MIG device without a mig object (as with MIG off)
        return self.mig.handle(gpu, int(index))

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gpu_instance_id: int) -> FakeGpuInstance:  # noqa: N802
        gpu = self.enter_parent("nvmlDeviceGetGpuInstanceById", handle)
        if gpu is None or not self.mig.enabled(gpu):
            raise nvml_error(errors.NOT_SUPPORTED)
        spec = self.gpu_at(gpu)["values"].get("nvmlDeviceGetGpuInstanceById")
        if spec is not None:
            self.resolve(spec, self.now())  # e.g. {"error": "NO_PERMISSION"}: an unprivileged caller
        self.mig.gpu_instance(gpu, int(gpu_instance_id))
        return FakeGpuInstance(gpu, int(gpu_instance_id))

    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any) -> SimpleNamespace:  # noqa: N802
        self.enter("nvmlGpuInstanceGetInfo", getattr(gpu_instance, "gpu", None))
        if not isinstance(gpu_instance, FakeGpuInstance):
            crash_segfault()  # a wild pointer
        return self.mig.gpu_instance_info(gpu_instance)

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, handle: Any, profile_id: int) -> SimpleNamespace:  # noqa: N802
        gpu = self.enter_parent("nvmlDeviceGetGpuInstanceProfileInfoById", handle)
        if gpu is None:
            raise nvml_error(errors.NOT_SUPPORTED)
        return self.mig.profile(gpu, profile_id=int(profile_id))

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> SimpleNamespace:  # noqa: N802
        gpu = self.enter_parent("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        if gpu is None:
            raise nvml_error(errors.NOT_SUPPORTED)
        return self.mig.profile(gpu, index=int(profile))

    # -- calls with a MIG device handle --------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Any) -> str:  # noqa: N802
        if isinstance(handle, FakeMigHandle):
            self.enter("nvmlDeviceGetUUID", handle.gpu)
            return str(self.mig.instance(handle)["uuid"])
        return super().nvmlDeviceGetUUID(handle)

    def nvmlDeviceGetName(self, handle: Any) -> str:  # noqa: N802
        if isinstance(handle, FakeMigHandle):
            self.enter("nvmlDeviceGetName", handle.gpu)
            gpu = self.gpu_at(handle.gpu)
            return self.mig.name(handle, str(gpu.get("name", "NVIDIA H200")))
        return super().nvmlDeviceGetName(handle)

    def _mig_id(self, fn: str, handle: Any, key: str) -> int:
        self.enter(fn, getattr(handle, "gpu", None))
        if not isinstance(handle, FakeMigHandle):
            self.gpu_of(handle)
            raise nvml_error(errors.INVALID_ARGUMENT)  # not a MIG device handle
        return int(self.mig.instance(handle)[key])

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:  # noqa: N802
        return self._mig_id("nvmlDeviceGetGpuInstanceId", handle, "gpu_instance_id")

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:  # noqa: N802
        return self._mig_id("nvmlDeviceGetComputeInstanceId", handle, "compute_instance_id")

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> SimpleNamespace:  # noqa: N802
        if not isinstance(handle, FakeMigHandle):
            return super().nvmlDeviceGetMemoryInfo(handle, version)
        self.enter("nvmlDeviceGetMemoryInfo", handle.gpu)
        return memory_info(self.mig.value(handle, "nvmlDeviceGetMemoryInfo", ()), version)

    def __getattr__(self, fn: str) -> Callable[..., Any]:
        on_gpu = super().__getattr__(fn)  # AttributeError for anything that is not a device call

        def call(handle: Any, *args: Any) -> Any:
            if not isinstance(handle, FakeMigHandle):
                return on_gpu(handle, *args)
            self.enter(fn, handle.gpu)
            return self.mig.value(handle, fn, args)

        call.__name__ = fn
        return call
