"""Profiling through NVML GPM (GPU Performance Monitoring; Hopper and newer): SM, tensor and DRAM
activity, PCIe and NVLink traffic, without a DCGM host engine.

"GPU utilization" (``nvgpu_gpu_utilization_ratio``) is the share of time any kernel ran: 100 % for
a kernel that occupies one SM, and 100 % on a wedged GPU whose context was never cleaned up. GPM
gives what dcgm-exporter users read in its ``DCGM_FI_PROF_*`` fields: how many SMs were busy, how
full they were, how much of the time the tensor pipes ran, how much DRAM bandwidth was used.

How a reading is made: GPM computes each metric over the window between two samples of the GPU's
performance counters. The worker keeps two sample buffers per GPU (:class:`Windows`, kept across
re-probes for the device client's life) and alternates them: each sample pass fills one and asks
for the metrics between it and the previous one, so a reading covers the previous sample interval
(the first pass after a worker starts gives none). A failed sample or metrics call keeps the older sample, so the next
window simply spans two intervals. Activity is exported as gauges of the last window (0 to 1).
Traffic, which GPM gives as MiB/s over the window, is integrated (rate x window length, measured
on the backend's clock between the two ``nvmlGpmSampleGet`` calls) into byte counters: ``rate()``
over any range is then exact, where a rate gauge read every 15-30 s would alias. The counters
restart from 0 with the worker (``rate()`` handles that as a counter reset).

Sources (nvml.h ``NVML_GPM_METRIC_*``): nvmlGpmQueryDeviceSupport and nvmlDeviceGetMigMode (once per
GPU and worker life), nvmlGpmSampleAlloc (two buffers, once), nvmlGpmSampleGet and
nvmlGpmMetricsGet (every sample; every entry's own return code is checked and an unsupported
metric is not asked again), nvmlGpmSampleFree (when the GPU stops answering). Measured on H200 /
driver 580.159.04 / nvidia-ml-py 13.615 (2026-11-30):
supported on both GPUs; nvmlGpmSampleGet about 0.5 ms and nvmlGpmMetricsGet for 11 metrics 5-7 ms
per GPU; idle, every activity metric reads 0; under a bf16 matmul SM activity 0.90 and tensor 0.83.

Buffers are freed when a GPU stops answering GPM (NOT_SUPPORTED); otherwise they live as long as
the worker, and the process's exit releases them (a GPU that is lost and attached again gets a new
device client and two new buffers: two small allocations per loss).

MIG: on a MIG-enabled GPU (the layout the ``mig`` feature read earlier in the same
pass, :func:`exporter.common.collectors.mig.layout`) the five activity metrics are read per GPU instance
instead: :func:`take` with a window per GPU instance (key ``gpm:mig:<id>:<profile>``, so a GPU
instance destroyed and created again with another profile under the same id starts a new window)
and ``nvmlGpmMigSampleGet(device, gpuInstanceId, buffer)`` as the sampling call (NVML API
reference, GPM Functions: "Read a sample of GPM metrics into the provided gpmSample buffer for a
MIG GPU Instance"; Hopper and newer). The windows of GPU instances that went away, and the GPU's
own window when MIG goes on, are freed at once. PCIe and NVLink traffic and the pipes
(``gpm_pipes``) are not read per GPU instance: absent on MIG GPUs. Without the ``mig`` feature a
MIG-enabled GPU is skipped (the feature is unsupported there).

NVLink traffic is asked of GPM only while the ``nvlink_throughput`` feature is off (env, known issue
as on H20 / 580, quarantine; fixed for the worker's life): otherwise the NVLink byte counters of
that feature measure the same traffic exactly, since the driver loaded, and GPM's would be two more
series per GPU for the same numbers (the default budget is 60 series per GPU).

The pipe-level detail (HMMA, IMMA, DMMA, DFMA, FP64, FP32, FP16) is the separate, off-by-default
feature ``gpm_pipes`` (:mod:`exporter.common.collectors.gpm_pipes`), with its own buffers: seven more
series per GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from exporter.common.collectors import mig
from exporter.common.collectors.base import percent_to_ratio
from exporter.common.gpustate import GpuState, Lifetime
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import Check, Each, Exempt, Monotonic, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "gpm"
NEEDS: tuple[str, ...] = (mig.FEATURE,)  # mig.layout: whole GPU or per GPU instance
MIB = 1 << 20

# NVML_GPM_METRIC_* ids (nvml.h, nvidia-ml-py 13.615).
GRAPHICS_UTIL = 1
SM_UTIL = 2
SM_OCCUPANCY = 3
ANY_TENSOR_UTIL = 5
DRAM_BW_UTIL = 10
PCIE_TX_PER_SEC = 20
PCIE_RX_PER_SEC = 21
NVLINK_TOTAL_RX_PER_SEC = 60
NVLINK_TOTAL_TX_PER_SEC = 61

GRAPHICS_ACTIVITY = MetricDef(
    "nvgpu_gpm_graphics_activity_ratio",
    "Fraction of the last sample interval a graphics or compute engine was active "
    "(GPM NVML_GPM_METRIC_GRAPHICS_UTIL; dcgm-exporter DCGM_FI_PROF_GR_ENGINE_ACTIVE)",
)
SM_ACTIVITY = MetricDef(
    "nvgpu_gpm_sm_activity_ratio",
    "Fraction of the SMs busy, averaged over the last sample interval; a kernel on one SM reads near 0 "
    "where GPU utilization reads 1 (GPM NVML_GPM_METRIC_SM_UTIL; DCGM_FI_PROF_SM_ACTIVE)",
)
SM_OCCUPANCY_RATIO = MetricDef(
    "nvgpu_gpm_sm_occupancy_ratio",
    "Resident warps as a fraction of the SMs' maximum, over the last sample interval "
    "(GPM NVML_GPM_METRIC_SM_OCCUPANCY; DCGM_FI_PROF_SM_OCCUPANCY)",
)
TENSOR_ACTIVITY = MetricDef(
    "nvgpu_gpm_tensor_activity_ratio",
    "Fraction of the last sample interval the SMs' tensor pipes (any type) were active "
    "(GPM NVML_GPM_METRIC_ANY_TENSOR_UTIL; DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)",
)
DRAM_BANDWIDTH = MetricDef(
    "nvgpu_gpm_dram_bandwidth_ratio",
    "DRAM bandwidth used as a fraction of the theoretical maximum, over the last sample interval "
    "(GPM NVML_GPM_METRIC_DRAM_BW_UTIL; DCGM_FI_PROF_DRAM_ACTIVE)",
)
PCIE_TRANSMIT = MetricDef(
    "nvgpu_gpm_pcie_transmit_bytes_total",
    "PCIe bytes sent by the GPU: GPM's rate over each sample interval times its length, summed since the "
    "worker started (GPM NVML_GPM_METRIC_PCIE_TX_PER_SEC; DCGM_FI_PROF_PCIE_TX_BYTES)",
)
PCIE_RECEIVE = MetricDef(
    "nvgpu_gpm_pcie_receive_bytes_total",
    "PCIe bytes received by the GPU: GPM's rate over each sample interval times its length, summed since the "
    "worker started (GPM NVML_GPM_METRIC_PCIE_RX_PER_SEC; DCGM_FI_PROF_PCIE_RX_BYTES)",
)
NVLINK_TRANSMIT = MetricDef(
    "nvgpu_gpm_nvlink_transmit_bytes_total",
    "NVLink bytes sent over all links: GPM's rate over each sample interval times its length, summed since "
    "the worker started (GPM NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC; DCGM_FI_PROF_NVLINK_TX_BYTES)",
)
NVLINK_RECEIVE = MetricDef(
    "nvgpu_gpm_nvlink_receive_bytes_total",
    "NVLink bytes received over all links: GPM's rate over each sample interval times its length, summed "
    "since the worker started (GPM NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC; DCGM_FI_PROF_NVLINK_RX_BYTES)",
)
_MIG_LABELS = ("gpu_instance_id", "mig_profile")
_PER_GI = "per GPU instance of a MIG-enabled GPU (nvmlGpmMigSampleGet)"
MIG_GRAPHICS_ACTIVITY = MetricDef(
    "nvgpu_mig_gpm_graphics_activity_ratio",
    f"As nvgpu_gpm_graphics_activity_ratio, {_PER_GI}: the GPU instance's graphics or compute engine active",
    _MIG_LABELS,
)
MIG_SM_ACTIVITY = MetricDef(
    "nvgpu_mig_gpm_sm_activity_ratio",
    f"As nvgpu_gpm_sm_activity_ratio, {_PER_GI}: the share of the GPU instance's SMs busy",
    _MIG_LABELS,
)
MIG_SM_OCCUPANCY = MetricDef(
    "nvgpu_mig_gpm_sm_occupancy_ratio", f"As nvgpu_gpm_sm_occupancy_ratio, {_PER_GI}", _MIG_LABELS
)
MIG_TENSOR_ACTIVITY = MetricDef(
    "nvgpu_mig_gpm_tensor_activity_ratio", f"As nvgpu_gpm_tensor_activity_ratio, {_PER_GI}", _MIG_LABELS
)
MIG_DRAM_BANDWIDTH = MetricDef(
    "nvgpu_mig_gpm_dram_bandwidth_ratio", f"As nvgpu_gpm_dram_bandwidth_ratio, {_PER_GI}", _MIG_LABELS
)
METRICS = (
    GRAPHICS_ACTIVITY,
    SM_ACTIVITY,
    SM_OCCUPANCY_RATIO,
    TENSOR_ACTIVITY,
    DRAM_BANDWIDTH,
    PCIE_TRANSMIT,
    PCIE_RECEIVE,
    NVLINK_TRANSMIT,
    NVLINK_RECEIVE,
    MIG_GRAPHICS_ACTIVITY,
    MIG_SM_ACTIVITY,
    MIG_SM_OCCUPANCY,
    MIG_TENSOR_ACTIVITY,
    MIG_DRAM_BANDWIDTH,
)

ACTIVITY: tuple[tuple[int, MetricDef], ...] = (
    (GRAPHICS_UTIL, GRAPHICS_ACTIVITY),
    (SM_UTIL, SM_ACTIVITY),
    (SM_OCCUPANCY, SM_OCCUPANCY_RATIO),
    (ANY_TENSOR_UTIL, TENSOR_ACTIVITY),
    (DRAM_BW_UTIL, DRAM_BANDWIDTH),
)
TRAFFIC: tuple[tuple[int, MetricDef], ...] = (
    (PCIE_TX_PER_SEC, PCIE_TRANSMIT),
    (PCIE_RX_PER_SEC, PCIE_RECEIVE),
    (NVLINK_TOTAL_TX_PER_SEC, NVLINK_TRANSMIT),
    (NVLINK_TOTAL_RX_PER_SEC, NVLINK_RECEIVE),
)
MIG_ACTIVITY: tuple[tuple[int, MetricDef], ...] = (
    (GRAPHICS_UTIL, MIG_GRAPHICS_ACTIVITY),
    (SM_UTIL, MIG_SM_ACTIVITY),
    (SM_OCCUPANCY, MIG_SM_OCCUPANCY),
    (ANY_TENSOR_UTIL, MIG_TENSOR_ACTIVITY),
    (DRAM_BW_UTIL, MIG_DRAM_BANDWIDTH),
)
METRIC_IDS = tuple(m for m, _ in ACTIVITY + TRAFFIC)
MIG_METRIC_IDS = tuple(m for m, _ in MIG_ACTIVITY)
NVLINK_IDS = frozenset({NVLINK_TOTAL_TX_PER_SEC, NVLINK_TOTAL_RX_PER_SEC})
_ACTIVITY_IDS = frozenset(m for m, _ in ACTIVITY)
MIG_WINDOW_PREFIX = "gpm:mig:"


@dataclass(frozen=True)
class InstanceActivity:
    """GPM activity of one GPU instance over the last sample interval.

    Attributes:
        gpu_instance_id: the GPU instance.
        profile: its profile name (``1g.18gb``; "" when unknown).
        activity_percent: GPM metric id -> percent.
    """

    gpu_instance_id: int
    profile: str
    activity_percent: dict[int, float]


@dataclass(frozen=True)
class Reading:
    activity_percent: dict[int, float]  # GPM metric id -> percent over the last window
    transferred_bytes: dict[int, float]  # GPM rate metric id -> bytes since the worker started
    instances: tuple[InstanceActivity, ...] = ()  # MIG-enabled GPU: per GPU instance, the GPU's own dicts empty


# GPM's percentages are floating-point ratios: 1 % above 100 is rounding, more is a misread.
CHECKS: tuple[Check, ...] = (
    Range("activity_percent", low=0, high=101),
    Monotonic("transferred_bytes"),
    Each(
        "instances",
        Exempt("gpu_instance_id", "profile", why="identifiers from the MIG layout"),
        Range("activity_percent", low=0, high=101),
    ),
)


# -- the two-sample window, shared with gpm_pipes (and a future per GPU instance variant) ----------


@dataclass
class Window:
    """Two GPM sample buffers of one GPU (or, later, one GPU instance), used alternately.

    Attributes:
        buffers: the two ``nvmlGpmSampleAlloc`` buffers.
        newest: index of the buffer holding the last good sample; None before the first.
        taken_at: backend clock (seconds) when that sample was taken.
        totals: per rate metric id, bytes integrated so far (for the traffic counters).
    """

    buffers: tuple[Any, Any]
    newest: int | None = None
    taken_at: float = 0.0
    totals: dict[int, float] = field(default_factory=dict)


@dataclass
class Windows(GpuState):
    """The open windows of one GPU, by key (one per feature and scope, see :func:`take`): kept across
    re-probes, since their buffers and byte totals must be."""

    LIFETIME = Lifetime.DEVICE
    open: dict[str, Window] = field(default_factory=dict)


@dataclass
class Unavailable(GpuState):
    """Keys of the windows that cannot open on this GPU (unsupported, MIG enabled), until the next
    re-probe."""

    LIFETIME = Lifetime.PROBE
    keys: set[str] = field(default_factory=set)


def device_sample(dev: DeviceClient, feature: str) -> Callable[[Any], Any]:
    """The sampling call for a whole GPU: ``nvmlGpmSampleGet(handle, buffer)``."""
    return lambda buffer: dev.call(feature, "nvmlGpmSampleGet", buffer, key=("nvmlGpmSampleGet",))


_GONE = object()  # nvmlGpmMigSampleGet's answer for a GPU instance that went away


def instance_sample(dev: DeviceClient, feature: str, gpu_instance_id: int) -> Callable[[Any], Any]:
    """The sampling call for one GPU instance: ``nvmlGpmMigSampleGet(handle, gpuInstanceId, buffer)``;
    a GPU instance destroyed since the layout was read omits this sample, counted as a join that does
    not match (``nvgpu_readings_dropped_total{reason="join_unmatched"}``), never read as 0."""
    from exporter.common.nvml import errors
    from exporter.worker import implausible

    def sample(buffer: Any) -> Any:
        got = dev.call(
            feature,
            "nvmlGpmMigSampleGet",
            gpu_instance_id,
            buffer,
            key=("nvmlGpmMigSampleGet",),
            context=errors.Context.MIG_DEVICE,
            absent=_GONE,
        )
        if got is _GONE:
            why = "a GPU instance of this pass's MIG layout, gone when GPM sampled it"
            implausible.count(
                dev, feature, "join_unmatched", f"gpu_instance_id {gpu_instance_id}", gpu_instance_id, why
            )
            return None
        return got

    return sample


def release(dev: DeviceClient, feature: str, cache_key: str) -> None:
    """Free the window kept under ``cache_key`` (a GPU instance that went away, MIG going on)."""
    window = dev.state_of(Windows).open.pop(cache_key, None)
    if window is not None:
        _free(dev, feature, window.buffers)


def _free(dev: DeviceClient, feature: str, buffers: Iterable[Any]) -> None:
    for buffer in buffers:
        dev.call(feature, "nvmlGpmSampleFree", buffer, key=("nvmlGpmSampleFree",), handle=False)


def _open(dev: DeviceClient, feature: str, per_instance: bool = False) -> Window | Literal[False] | None:
    """Support checks and buffers. Returns a Window, False (never on this GPU), or None (retry).

    A whole-GPU window is refused on a MIG-enabled GPU; a per-GPU-instance one (``per_instance``)
    only exists there."""
    support = dev.get(feature, "nvmlGpmQueryDeviceSupport")
    if support is None:
        if ("nvmlGpmQueryDeviceSupport",) in dev.unsupported:
            dev.nothing_to_read(feature, "nvmlGpmQueryDeviceSupport", "GPM not supported", announce=False)
            return False
        return None
    if not int(getattr(support, "isSupportedDevice", 0)):
        dev.nothing_to_read(feature, "nvmlGpmQueryDeviceSupport", "GPM not supported on this GPU (Hopper and newer)")
        return False
    state = mig.layout(dev)
    if state is not None:
        partitioned = state.enabled
    else:
        mode = dev.probe(feature, "nvmlDeviceGetMigMode")  # NOT_SUPPORTED: a GPU without MIG
        partitioned = mode is not None and int(mode[0]) == mig.MIG_ENABLE
    if partitioned and not per_instance:
        dev.nothing_to_read(
            feature,
            "nvmlGpmSampleGet",
            "MIG enabled: GPM is read per GPU instance, by the gpm feature with the mig feature on",
        )
        return False
    buffers: list[Any] = []
    for _ in range(2):
        buffer = dev.call(feature, "nvmlGpmSampleAlloc", key=("nvmlGpmSampleAlloc",), handle=False)
        if buffer is None:
            _free(dev, feature, buffers)
            if ("nvmlGpmSampleAlloc",) in dev.unsupported:
                dev.nothing_to_read(feature, "nvmlGpmSampleAlloc", "GPM sample buffers unavailable", announce=False)
                return False
            return None
        buffers.append(buffer)
    return Window((buffers[0], buffers[1]))


def _close(dev: DeviceClient, feature: str, cache_key: str, window: Window, why: str, function: str) -> None:
    _free(dev, feature, window.buffers)
    dev.state_of(Windows).open.pop(cache_key, None)
    dev.state_of(Unavailable).keys.add(cache_key)
    dev.nothing_to_read(feature, function, why, announce=False)


def take(
    dev: DeviceClient,
    feature: str,
    cache_key: str,
    metric_ids: Sequence[int],
    sample: Callable[[Any], Any] | None = None,
    sample_key: tuple[Any, ...] = ("nvmlGpmSampleGet",),
    per_instance: bool = False,
) -> tuple[Window, dict[int, float], float] | None:
    """One GPM reading of this GPU: the metrics over the window since the previous call.

    Args:
        dev: the GPU.
        feature: the feature making the calls (breadcrumbs, error accounting).
        cache_key: the window's key in :class:`Windows` (one per feature and scope: the feature's
            name for a whole GPU); the same key in :class:`Unavailable` means "not on this GPU"
            (unsupported, MIG enabled) until the next re-probe.
        metric_ids: ``NVML_GPM_METRIC_*`` ids to compute.
        sample: fills a buffer (default :func:`device_sample`); returns None on failure.
        sample_key: the unsupported-cache key of the sampling call (``("nvmlGpmMigSampleGet",)`` per
            GPU instance): once it is unsupported the window is closed.
        per_instance: a window of one GPU instance (:func:`instance_sample`) on a MIG-enabled GPU.

    Returns:
        (the window, metric id -> value in NVML's unit, window length in seconds on the backend's
        clock), or None: first call, unsupported, or a failed sample or metrics call.

    Raises:
        DeviceLost: the GPU is gone.
        NvmlFatal: NVML is unusable.
    """
    from exporter.worker.nvml import structs

    windows = dev.state_of(Windows).open
    window = windows.get(cache_key)
    if window is None:
        unavailable = dev.state_of(Unavailable).keys
        if cache_key in unavailable:  # not on this GPU (until a re-probe)
            return None
        opened = _open(dev, feature, per_instance)
        if opened is None:
            return None
        if opened is False:
            unavailable.add(cache_key)
            return None
        window = windows[cache_key] = opened
    target = 0 if window.newest is None else 1 - window.newest
    got = (sample or device_sample(dev, feature))(window.buffers[target])
    now = dev.client.now()
    if got is None:
        if sample_key in dev.unsupported:
            _close(dev, feature, cache_key, window, "GPM sampling no longer supported", str(sample_key[0]))
        return None  # the older sample stays: the next window spans both intervals
    if window.newest is None:
        window.newest, window.taken_at = target, now
        return None
    values = structs.gpm_metrics(dev, feature, window.buffers[window.newest], window.buffers[target], metric_ids)
    if all(("gpm_metric", m) in dev.unsupported for m in metric_ids):
        _close(dev, feature, cache_key, window, "no GPM metric of this feature supported", "nvmlGpmMetricsGet")
        return None
    if not values:
        return None  # keep the older sample, as above
    seconds = max(0.0, now - window.taken_at)
    window.newest, window.taken_at = target, now
    return window, values, seconds


# -- the collector ---------------------------------------------------------------------------------


def metric_ids(dev: DeviceClient) -> tuple[int, ...]:
    """The metrics to ask: NVLink traffic only while ``nvlink_throughput`` is off in this worker."""
    if "nvlink_throughput" in dev.enabled:
        return tuple(m for m in METRIC_IDS if m not in NVLINK_IDS)
    return METRIC_IDS


def read(dev: DeviceClient) -> Reading | None:
    state = mig.layout(dev)
    if state is not None and state.enabled:
        release(dev, FEATURE, FEATURE)  # MIG went on under a running worker
        return _read_instances(dev, state)
    for key in [k for k in dev.state_of(Windows).open if k.startswith(MIG_WINDOW_PREFIX)]:
        release(dev, FEATURE, key)  # MIG went off: no GPU instances any more
    got = take(dev, FEATURE, FEATURE, metric_ids(dev))
    if got is None:
        return None
    window, values, seconds = got
    for metric_id, _ in TRAFFIC:
        rate = values.get(metric_id)
        if rate is not None and rate >= 0:
            window.totals[metric_id] = window.totals.get(metric_id, 0.0) + rate * MIB * seconds
    activity = {m: v for m, v in values.items() if m in _ACTIVITY_IDS and v >= 0}
    return Reading(activity, dict(window.totals))


def _read_instances(dev: DeviceClient, state: mig.Reading) -> Reading | None:
    """Activity per GPU instance of a MIG-enabled GPU; windows of GPU instances gone are freed."""
    out: list[InstanceActivity] = []
    live: set[str] = set()
    for gi in state.gpu_instances:
        key = f"{MIG_WINDOW_PREFIX}{gi.gpu_instance_id}:{gi.profile}:{gi.profile_id}"
        live.add(key)
        got = take(
            dev,
            FEATURE,
            key,
            MIG_METRIC_IDS,
            sample=instance_sample(dev, FEATURE, gi.gpu_instance_id),
            sample_key=("nvmlGpmMigSampleGet",),
            per_instance=True,
        )
        if got is not None:
            values = {m: v for m, v in got[1].items() if v >= 0}
            out.append(InstanceActivity(gi.gpu_instance_id, gi.profile, values))
    for key in [k for k in dev.state_of(Windows).open if k.startswith(MIG_WINDOW_PREFIX) and k not in live]:
        release(dev, FEATURE, key)
    return Reading({}, {}, tuple(out)) if out else None


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    fams = {m: spec.family() for m, spec in ACTIVITY + TRAFFIC}
    per_gi = {m: spec.family() for m, spec in MIG_ACTIVITY}
    for key, r in samples:
        for g in r.instances:
            for metric_id, percent in g.activity_percent.items():
                if metric_id in per_gi:
                    per_gi[metric_id].add(key, percent_to_ratio(percent), str(g.gpu_instance_id), g.profile)
        for metric_id, percent in r.activity_percent.items():
            if metric_id in fams:
                fams[metric_id].add(key, percent_to_ratio(percent))
        for metric_id, total in r.transferred_bytes.items():
            if metric_id in fams:
                fams[metric_id].add(key, total)
    for metric_id, _ in ACTIVITY + TRAFFIC:
        yield from fams[metric_id].done()
    for metric_id, _ in MIG_ACTIVITY:
        yield from per_gi[metric_id].done()
