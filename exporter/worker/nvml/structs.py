"""NVML calls that fill caller-allocated ctypes structs, each entry's own return code checked.

``versioned`` (the ``…V`` calls: the newest struct version both binding and driver know) and
``gpm_metrics`` (``nvmlGpmMetricsGet``: one return code per metric, like field values). They go
through a :class:`~exporter.worker.nvml.client.DeviceClient` (breadcrumb, counting, the unsupported
cache) and classify every code in :mod:`exporter.common.nvml.errors`.
"""

from __future__ import annotations

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


def versioned(dev: DeviceClient, feature: str, function: str, structs: Sequence[str]) -> Any:
    """``function(handle, byref(struct))`` with the newest struct version both sides know.

    For the ``…V`` calls whose pynvml wrapper takes a caller-allocated, versioned struct
    (``nvmlDeviceGetGpuFabricInfoV``). ``structs`` names the binding's struct classes, newest
    first (``c_nvmlGpuFabricInfo_v3_t``, ``c_nvmlGpuFabricInfo_v2_t``). A class this binding
    lacks is skipped; a version the driver rejects (ARGUMENT_VERSION_MISMATCH, or another
    unsupported answer) is cached, quietly unless it was the last candidate, and the next older
    one is tried; each version is tried at most once per worker life.

    Returns:
        The filled struct, or None (unsupported in every version, or an error that only omits
        this sample).

    Raises:
        DeviceLost: the GPU is gone.
        NvmlFatal: NVML is unusable.
    """
    import ctypes

    candidates = [name for name in structs if (function, name) not in dev.unsupported]
    for i, name in enumerate(candidates):
        key = (function, name)
        cls = getattr(dev.client.backend, name, None)
        if cls is None:  # the binding is older than this struct version
            dev.unsupported[key] = (feature, "FUNCTION_NOT_FOUND")
            continue
        struct = cls()
        try:
            dev.client.raw(feature, function, dev.uuid, dev.handle, ctypes.byref(struct))
        except Exception as exc:  # classified in one place: errors.classify
            last = i == len(candidates) - 1
            dev.handle_error(feature, function, key, exc, quiet=not last, context=errors.Context.CALL)
            if key in dev.unsupported:
                continue
            return None
        dev.feature_ok.add(feature)
        return struct
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
