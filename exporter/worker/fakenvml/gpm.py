"""GPM (GPU performance monitoring, Hopper and newer) in the fake, for whole GPUs and GPU instances.

As pynvml shapes it: ``nvmlGpmSampleAlloc`` returns a ``c_nvmlGpmSample_t`` (an opaque pointer);
``nvmlGpmSampleGet`` fills it for one GPU, ``nvmlGpmMigSampleGet`` for one GPU instance;
``nvmlGpmMetricsGet`` takes a ``c_nvmlGpmMetricsGet_t`` (version, numMetrics, sample1, sample2,
``metrics[i].metricId``) and fills each entry's ``nvmlReturn`` and ``value``; ``nvmlGpmSampleFree``
releases it. Per GPU, ``"nvmlGpmQueryDeviceSupport": {"isSupportedDevice": 1}`` says whether GPM
works (no value: NOT_SUPPORTED, as an old driver), and ``"nvmlGpmMetricsGet:<metric id>"`` gives
each metric's value (percent or MiB/s, any value spec, evaluated at the newer sample's time; an
error spec sets that entry's ``nvmlReturn``; no value: NOT_SUPPORTED); a GPU instance's own
``nvmlGpmMetricsGet:<id>`` comes first for its samples (docs/scenarios.md, "MIG"). Misuse behaves
like the real library: a NULL sample is INVALID_ARGUMENT, an unknown pointer crashes (SIGSEGV),
freeing twice aborts (SIGABRT), and two threads inside ``nvmlGpmMetricsGet`` at once crash.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pynvml

from exporter.common.nvml import errors
from exporter.worker.fakenvml.core import FakeHandle, nvml_error
from exporter.worker.fakenvml.faults import crash_segfault
from exporter.worker.fakenvml.mig import MigCalls


class GpmSample:
    """One ``nvmlGpmSampleAlloc`` buffer: the memory its pointer points at, and what it holds."""

    def __init__(self) -> None:
        self.buffer = ctypes.create_string_buffer(16)
        self.gpu: int | None = None  # GPU index of the last sample taken, None while empty
        self.gi: int | None = None  # GPU instance of an nvmlGpmMigSampleGet, None for the whole GPU
        self.t = 0.0  # scenario time of that sample


def _address(sample: Any) -> int | None:
    return ctypes.cast(sample, ctypes.c_void_p).value if sample is not None else None


class GpmCalls(MigCalls):
    """The GPM calls (on top of MIG: a GPU in MIG mode is sampled per GPU instance)."""

    c_nvmlGpmMetricsGet_t = getattr(pynvml, "c_nvmlGpmMetricsGet_t", None)
    NVML_GPM_METRICS_GET_VERSION = getattr(pynvml, "NVML_GPM_METRICS_GET_VERSION", None)

    def __init__(self, path: str, epoch: float | None = None, clock: Callable[[], float] | None = None) -> None:
        super().__init__(path, epoch, clock)
        self._gpm_samples: dict[int, GpmSample] = {}  # address of an allocated sample -> its state
        self._metrics_get_inside = 0  # threads in nvmlGpmMetricsGet (the real one is not reentrant)
        self._metrics_get_count = threading.Lock()

    def _gpm_supported(self, gpu: dict[str, Any]) -> bool:
        try:
            support = self.value(gpu, "nvmlGpmQueryDeviceSupport", ())
        except self.NVMLError:
            return False
        return bool(getattr(support, "isSupportedDevice", 0))

    def _gpm_sample(self, sample: Any) -> GpmSample:
        address = _address(sample)
        if not address:
            raise nvml_error(errors.INVALID_ARGUMENT)
        state = self._gpm_samples.get(address)
        if state is None:  # never allocated, or freed: a wild pointer
            crash_segfault()
        assert state is not None
        return state

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> SimpleNamespace:  # noqa: N802
        fn = "nvmlGpmQueryDeviceSupport"
        self.enter(fn, getattr(handle, "gpu", None))
        value = self.value(self.gpu_of(handle), fn, ())
        return SimpleNamespace(version=1, isSupportedDevice=int(getattr(value, "isSupportedDevice", 0)))

    def nvmlGpmSampleAlloc(self) -> Any:  # noqa: N802
        self.enter("nvmlGpmSampleAlloc", None)
        state = GpmSample()
        address = ctypes.addressof(state.buffer)
        self._gpm_samples[address] = state
        return ctypes.cast(state.buffer, pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:  # noqa: N802
        self.enter("nvmlGpmSampleFree", None)
        address = _address(sample)
        if not address:
            raise nvml_error(errors.INVALID_ARGUMENT)
        if self._gpm_samples.pop(address, None) is None:
            os.abort()  # double free: glibc aborts

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:  # noqa: N802
        fn = "nvmlGpmSampleGet"
        if isinstance(handle, FakeHandle) and self.mig.enabled(handle.gpu):
            self.enter(fn, handle.gpu)
            raise nvml_error(errors.NOT_SUPPORTED)  # the whole GPU is not sampled in MIG mode
        self.enter(fn, getattr(handle, "gpu", None))
        gpu = self.gpu_of(handle)
        state = self._gpm_sample(sample)
        spec = gpu["values"].get(fn)
        if spec is not None:
            self.resolve(spec, self.now())  # raises the scenario's error, if any
        if not self._gpm_supported(gpu):
            raise nvml_error(errors.NOT_SUPPORTED)
        state.gpu, state.gi, state.t = handle.gpu, None, self.now()
        return sample

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: int, sample: Any) -> Any:  # noqa: N802
        fn = "nvmlGpmMigSampleGet"
        gpu = self.enter_parent(fn, handle)
        state = self._gpm_sample(sample)
        if gpu is None or not self.mig.enabled(gpu) or not self._gpm_supported(self.gpu_at(gpu)):
            raise nvml_error(errors.NOT_SUPPORTED)
        inst = self.mig.gpu_instance(gpu, int(gpu_instance_id))  # INVALID_ARGUMENT when gone
        if fn in inst["values"]:
            self.mig.value_spec(inst, fn)  # a per-instance error spec
        state.gpu, state.gi, state.t = gpu, int(gpu_instance_id), self.now()
        return sample

    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any:  # noqa: N802
        """As the real library: two threads inside at once die by SIGSEGV (measured on the H200 pair,
        driver 580.159.04: docs/validation/2026-11-30-h200x2/gpm-concurrency.md). The call holds for
        a moment, so that callers that do not serialize it overlap here as they do on hardware."""
        with self._metrics_get_count:
            overlapping = self._metrics_get_inside > 0
            self._metrics_get_inside += 1
        try:
            if overlapping:
                crash_segfault()
            time.sleep(0.003)
            return self._metrics_get(metrics_get)
        finally:
            with self._metrics_get_count:
                self._metrics_get_inside -= 1

    def _metrics_get(self, metrics_get: Any) -> Any:
        first = self._gpm_samples.get(_address(metrics_get.sample1) or 0)
        second = self._gpm_samples.get(_address(metrics_get.sample2) or 0)
        if first is None or second is None or (first.gi is None and second.gi is None):
            return self._gpu_metrics_get(metrics_get, first)
        return self._instance_metrics_get(metrics_get, first, second)

    def _gpu_metrics_get(self, metrics_get: Any, older: GpmSample | None) -> Any:
        """Metrics between two samples of one whole GPU."""
        fn = "nvmlGpmMetricsGet"
        self.enter(fn, older.gpu if older is not None else None)  # the GPU, for faults matching "gpu"
        if metrics_get.version != self.NVML_GPM_METRICS_GET_VERSION:
            raise nvml_error(errors.ARGUMENT_VERSION_MISMATCH)
        first, second = self._gpm_sample(metrics_get.sample1), self._gpm_sample(metrics_get.sample2)
        if first.gpu is None or second.gpu is None or first.gpu != second.gpu or second.t < first.t:
            raise nvml_error(errors.INVALID_ARGUMENT)  # unfilled samples, two GPUs, or in the wrong order
        if not 0 < metrics_get.numMetrics <= len(metrics_get.metrics):
            raise nvml_error(errors.INVALID_ARGUMENT)
        gpu = self.gpu_at(second.gpu)
        for i in range(metrics_get.numMetrics):
            entry = metrics_get.metrics[i]
            try:
                value = self.value(gpu, fn, (int(entry.metricId),), t=second.t)
            except self.NVMLError as exc:
                entry.nvmlReturn, entry.value = int(exc.value), 0.0
            else:
                entry.nvmlReturn, entry.value = 0, float(value)
        return metrics_get

    def _instance_metrics_get(self, metrics_get: Any, first: GpmSample, second: GpmSample) -> Any:
        """Metrics between two samples of one GPU instance (``nvmlGpmMigSampleGet``)."""
        fn = "nvmlGpmMetricsGet"
        self.enter(fn, first.gpu)
        if metrics_get.version != self.NVML_GPM_METRICS_GET_VERSION:
            raise nvml_error(errors.ARGUMENT_VERSION_MISMATCH)
        if first.gpu != second.gpu or first.gi != second.gi or second.t < first.t:
            raise nvml_error(errors.INVALID_ARGUMENT)  # two GPUs or GPU instances, or the wrong order
        assert second.gpu is not None and second.gi is not None
        self.mig.gpu_instance(second.gpu, second.gi)  # INVALID_ARGUMENT when it went away
        for i in range(metrics_get.numMetrics):
            entry = metrics_get.metrics[i]
            try:
                value = self.mig.gpm_metric(second.gpu, second.gi, int(entry.metricId), second.t)
            except KeyError:
                entry.nvmlReturn, entry.value = errors.NOT_SUPPORTED, 0.0
            except self.NVMLError as exc:
                entry.nvmlReturn, entry.value = int(exc.value), 0.0
            else:
                entry.nvmlReturn, entry.value = 0, float(value)
        return metrics_get
