"""NVML calls that fill caller-allocated ctypes structs, each entry's own return code checked.

``fabric_info`` (the fabric info's three variants, with struct layouts of our own where the
bindings' are wrong) and ``gpm_metrics`` (``nvmlGpmMetricsGet``: one return code per metric, like
field values). They go
through a :class:`~exporter.worker.nvml.client.DeviceClient` (breadcrumb, counting, the unsupported
cache) and classify every code in :mod:`exporter.common.nvml.errors`.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Sequence
from typing import Any

from exporter.common.nvml import errors
from exporter.common.nvml.errors import ErrorClass
from exporter.worker.nvml.client import DeviceClient, DeviceLost

# nvmlGpmMetricsGet is not safe to call from two threads at once: on the H200 pair (driver
# 580.159.04, nvidia-ml-py 13.610.43, 2026-11-30) two GPU threads inside it together ended the worker
# with SIGSEGV in 4 of about 20 exporter starts (docs/validation/2026-11-30-h200x2/gpm-concurrency.md). It
# computes on host memory from two sample buffers (no device access, 0.9 ms per GPU measured), so
# serializing it costs little. A GPU thread waits at most GPM_METRICS_WAIT_S for its turn (eight GPUs
# take about 8 ms in all); past that it skips this sample's GPM metrics and counts
# nvgpu_nvml_errors_total{error="GPM_LOCK_WAIT"}, so a thread stuck inside the call costs the other
# GPUs their GPM ratios for that sample, never their sampling (the fault domain is the GPU).
GPM_METRICS_LOCK = threading.Lock()
GPM_METRICS_WAIT_S = 0.25


class GpuFabricInfoV1(ctypes.Structure):
    """``nvmlGpuFabricInfo_t`` as the C header lays it out (every header from 12.2): 28 bytes.

    nvidia-ml-py up to 13.610 declares ``c_nvmlGpuFabricInfo_t`` with an 80-byte ``clusterUuid``
    (92 bytes: ``state`` would be read past what the driver writes), so this struct is our own.
    ``cliqueId`` is ``partitionId`` in the 12.2 header (the same word).
    """

    _fields_ = [
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_int),  # nvmlReturn_t
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),  # nvmlGpuFabricState_t
    ]


class GpuFabricInfoV2(ctypes.Structure):
    """``nvmlGpuFabricInfo_v2_t`` (12.4 header, R550): 36 bytes, version ``0x02000024``.

    nvidia-ml-py 12.550.89 and 12.560.30 name it ``c_nvmlGpuFabricInfoV_t`` with an 80-byte
    ``clusterUuid`` (100 bytes, ``state`` at the wrong offset: it reads 0, a silent "no fabric");
    13.580.82 calls it ``c_nvmlGpuFabricInfo_v2_t``. Our own layout works with every binding.
    """

    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_int),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
        ("healthMask", ctypes.c_uint),
    ]


class GpuFabricInfoV3(ctypes.Structure):
    """``nvmlGpuFabricInfo_v3_t`` (13.0 header, R580): v2 and ``healthSummary``; 40 bytes, version
    ``0x03000028``."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_int),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
        ("healthMask", ctypes.c_uint),
        ("healthSummary", ctypes.c_ubyte),
    ]


def struct_version(cls: type[ctypes.Structure], major: int) -> int:
    """NVML's version word of a versioned struct: ``sizeof(struct) | major << 24`` (nvml.h
    ``NVML_STRUCT_VERSION``)."""
    return ctypes.sizeof(cls) | major << 24


FABRIC_FUNCTION = "nvmlDeviceGetGpuFabricInfoV"
FABRIC_V1_FUNCTION = "nvmlDeviceGetGpuFabricInfo"
# (function, struct major version, layout), newest first: the V call with v3 (R580+), then v2 (R550+),
# then the deprecated unversioned call (R535 has only this one).
FABRIC_VARIANTS: tuple[tuple[str, int, type[ctypes.Structure]], ...] = (
    (FABRIC_FUNCTION, 3, GpuFabricInfoV3),
    (FABRIC_FUNCTION, 2, GpuFabricInfoV2),
    (FABRIC_V1_FUNCTION, 1, GpuFabricInfoV1),
)


def fabric_info(dev: DeviceClient, feature: str) -> tuple[Any, int] | None:
    """The GPU's fabric info with the newest variant this binding and driver answer, and its version.

    ``nvmlDeviceGetGpuFabricInfoV(handle, byref(v3))``, then v2, then
    ``nvmlDeviceGetGpuFabricInfo(handle, byref(v1))``: the binding's wrappers pass the pointer
    through, so our own layouts (:class:`GpuFabricInfoV3` …) work whatever the binding declares. Only
    an answer that says the variant is missing (FUNCTION_NOT_FOUND: no symbol in the driver or no
    wrapper in the binding; ARGUMENT_VERSION_MISMATCH: a driver older than the struct) moves to the
    next older one, once per worker (those answers are never asked again); NOT_SUPPORTED means the GPU
    has no fabric, whatever the variant, and ends the search. The variant used is recorded
    (``nvgpu_nvml_api_info{call="fabric"}``).

    Returns:
        (the filled struct, its major version), or None (unsupported, or an error that only omits
        this sample).

    Raises:
        DeviceLost: the GPU is gone.
        NvmlFatal: NVML is unusable.
    """
    newest_answer = ""
    for i, (function, major, layout) in enumerate(FABRIC_VARIANTS):
        key = (function, f"v{major}")
        cached = dev.unsupported.get(key)
        if cached is not None:
            if cached[1] not in errors.PERMANENTLY_UNSUPPORTED:
                return None  # no fabric on this GPU (until a re-probe asks again)
            newest_answer = newest_answer or cached[1]
            continue
        struct = layout()
        if major > 1:
            struct.version = struct_version(layout, major)
        try:
            dev.client.raw(feature, function, dev.uuid, dev.handle, ctypes.byref(struct))
        except Exception as exc:  # classified in one place: errors.classify
            last = i == len(FABRIC_VARIANTS) - 1
            missing = errors.code_of(exc) in (errors.FUNCTION_NOT_FOUND, errors.ARGUMENT_VERSION_MISMATCH)
            dev.handle_error(feature, function, key, exc, quiet=missing and not last, context=errors.Context.CALL)
            found = dev.unsupported.get(key)
            if found is not None and found[1] in errors.PERMANENTLY_UNSUPPORTED:
                newest_answer = newest_answer or found[1]
                if found[1] == "FUNCTION_NOT_FOUND":  # no symbol: its other struct versions need no call
                    for other, version, _ in FABRIC_VARIANTS[i + 1 :]:
                        if other == function:
                            dev.unsupported.setdefault((other, f"v{version}"), found)
                continue
            return None
        dev.feature_ok.add(feature)
        dev.chose("fabric", function, str(major), newest_answer.lower())
        return struct, major
    dev.feature_unsupported.add(feature)
    return None


def gpm_metrics(
    dev: DeviceClient, feature: str, sample1: Any, sample2: Any, metric_ids: Sequence[int]
) -> dict[int, float]:
    """GPM metrics between two samples of this GPU (``nvmlGpmMetricsGet``), each entry checked.

    Builds the binding's ``c_nvmlGpmMetricsGet_t`` (version, count, the two samples, the metric
    ids) and reads back every entry's own return code, as :meth:`fields` does for field values:
    ids answering an unsupported class (NOT_SUPPORTED; INVALID_ARGUMENT for an id this driver
    does not know) are cached and never requested again on this GPU; other failures are
    counted. A binding without GPM structures counts as FUNCTION_NOT_FOUND.

    Args:
        feature: the feature making the call.
        sample1: the older sample (``nvmlGpmSampleAlloc`` buffer filled by ``nvmlGpmSampleGet``).
        sample2: the newer sample.
        metric_ids: ``NVML_GPM_METRIC_*`` ids.

    Returns:
        Metric id -> value over the window between the samples, in NVML's unit for that id
        (percent for the activity ids, MiB/s for the byte rates); finite values only.

    Raises:
        DeviceLost: the GPU is gone.
        NvmlFatal: NVML is unusable.
    """
    wanted = [m for m in metric_ids if ("gpm_metric", m) not in dev.unsupported]
    if not wanted or ("nvmlGpmMetricsGet",) in dev.unsupported:
        return {}
    backend = dev.client.backend
    request_cls = getattr(backend, "c_nvmlGpmMetricsGet_t", None)
    version = getattr(backend, "NVML_GPM_METRICS_GET_VERSION", None)
    if request_cls is None or version is None:
        dev.unsupported[("nvmlGpmMetricsGet",)] = (feature, "FUNCTION_NOT_FOUND")
        dev.feature_unsupported.add(feature)
        return {}
    request = request_cls()
    request.version = version
    request.numMetrics = len(wanted)
    request.sample1 = sample1
    request.sample2 = sample2
    for i, metric_id in enumerate(wanted):
        request.metrics[i].metricId = metric_id
    if not GPM_METRICS_LOCK.acquire(timeout=GPM_METRICS_WAIT_S):  # one thread at a time: see the lock
        dev.client.errors[(feature, "GPM_LOCK_WAIT")] += 1
        return {}
    try:
        answered = dev.call(feature, "nvmlGpmMetricsGet", request, key=("nvmlGpmMetricsGet",), handle=False)
    finally:
        GPM_METRICS_LOCK.release()
    if answered is None:
        return {}
    out: dict[int, float] = {}
    for i, metric_id in enumerate(wanted):
        entry = request.metrics[i]
        code = int(entry.nvmlReturn)
        if code == errors.SUCCESS:
            value = float(entry.value)
            if math.isfinite(value):
                out[metric_id] = value
            else:  # NaN or infinity from the library: never exported, counted
                dev.client.errors[(feature, "NOT_FINITE")] += 1
            continue
        failure = errors.classify_entry(code)
        if failure.error_class is ErrorClass.UNSUPPORTED:
            dev.unsupported[("gpm_metric", metric_id)] = (feature, failure.name)
        elif failure.error_class is ErrorClass.DEVICE_LOST:
            raise DeviceLost(failure, "nvmlGpmMetricsGet")
        else:
            dev.client.errors[(feature, failure.name)] += 1
    if not out and all(("gpm_metric", m) in dev.unsupported for m in wanted):
        dev.feature_unsupported.add(feature)
    return out
