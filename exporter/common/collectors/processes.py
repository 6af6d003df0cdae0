"""Processes per GPU: validated records, their memory and utilization, per process and per pod.

Sources (worker side, per GPU and sample):

- ``nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses_v3``, ``_v2`` when the driver lacks
  the ``_v3`` symbol or when ``_v3``'s records fail validation while ``_v2``'s pass (drivers
  535.43-535.86 write a 32-byte ``_v3`` struct that nvidia-ml-py reads as 24 bytes; XuehaiPan/nvitop
  PRs #89 and #94). Every record is checked (:mod:`exporter.worker.process_records`): implausible ones are dropped
  and counted by reason, logged once with the binding and driver versions.
- ``nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)`` (about 2.7 ms per GPU on the
  H200 even with nothing to report), called only when per-process or per-pod usage needs it and
  the GPU lists processes; the timestamp passed is the newest sample seen before, so each call
  returns only new samples (0 on the first call: the driver's whole buffer). A process with no
  new sample had no utilization since the last read (NVML reports only busy processes). NOT_FOUND
  (nothing new) is not an error.
- ``nvmlDeviceGetMemoryInfo`` once, for the total that bounds a record's memory.
- ``/proc/<pid>/cgroup`` and ``/comm`` (:mod:`exporter.worker.procfs`; needs ``hostPID``) and the kubelet's
  ``/var/log/containers`` names (:mod:`exporter.worker.containerlogs`) for the pod of each process
  (:mod:`exporter.worker.process_attribution`).

What it exports (``families``): the compute process count and memory (validated records only),
``nvgpu_process_records_dropped_total`` by reason, and, with the ``process_usage`` feature on,
per-process series: the ``NVGPU_PROCESS_SERIES_PER_GPU`` largest processes of each GPU (by
memory, then SM utilization, then pid) have their own, the rest are summed under ``pid="other"``.
Per-pod sums are carried in the reading for :mod:`exporter.supervisor.pods` (feature ``pod_attribution``).

``usedGpuMemory`` None or 2^64-1 (NVML_VALUE_NOT_AVAILABLE) means unknown: never summed, never
exported. Instance ids (0xFFFFFFFF with MIG off) stay in the worker's records for per-instance
attribution and are not exported.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.common.collectors import process_reads as reads
from exporter.common.collectors.base import Other, PodUsage, Usage, percent_to_ratio
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import Check, Exempt

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = reads.FEATURE  # one name: the worker-side reads call NVML under it
NEEDS: tuple[str, ...] = ()
PROCESS_USAGE = "process_usage"  # the switch for per-process rows (in dev.enabled when on)
POD_ATTRIBUTION = "pod_attribution"  # the switch for per-pod sums
OTHER = "other"  # the pid label of the series that sums processes past the cap

COUNT = MetricDef("nvgpu_compute_processes", "Compute processes on the GPU (nvmlDeviceGetComputeRunningProcesses)")
MEMORY_USED = MetricDef(
    "nvgpu_compute_processes_memory_used_bytes",
    "Memory used by compute processes, where readable (nvmlDeviceGetComputeRunningProcesses)",
)
DROPPED = MetricDef(
    "nvgpu_process_records_dropped_total",
    "Process records (or their memory value, reason memory_not_available) dropped by validation since "
    "the worker started: malformed, pid_zero, pid_not_available, pid_above_max, memory_above_total, "
    "duplicate, memory_not_available, utilization_out_of_range, timestamp_in_future "
    "(nvmlDeviceGet*RunningProcesses, nvmlDeviceGetProcessUtilization)",
    ("reason",),
)
_PROCESS_LABELS = ("pid", "process", "namespace", "pod", "container")
PROCESS_MEMORY = MetricDef(
    "nvgpu_process_memory_used_bytes",
    "GPU memory used by the process (usedGpuMemory of nvmlDeviceGet*RunningProcesses); pid=other sums "
    "the processes past NVGPU_PROCESS_SERIES_PER_GPU",
    _PROCESS_LABELS,
)
PROCESS_SM = MetricDef(
    "nvgpu_process_sm_utilization_ratio",
    "Share of time the process ran kernels, latest sample since the last read (smUtil of "
    "nvmlDeviceGetProcessUtilization)",
    _PROCESS_LABELS,
)
PROCESS_MEMORY_UTILIZATION = MetricDef(
    "nvgpu_process_memory_utilization_ratio",
    "Share of time the process read or wrote device memory (memUtil of nvmlDeviceGetProcessUtilization)",
    _PROCESS_LABELS,
)
PROCESS_ENCODER = MetricDef(
    "nvgpu_process_encoder_utilization_ratio",
    "Encoder utilization of the process (encUtil of nvmlDeviceGetProcessUtilization)",
    _PROCESS_LABELS,
)
PROCESS_DECODER = MetricDef(
    "nvgpu_process_decoder_utilization_ratio",
    "Decoder utilization of the process (decUtil of nvmlDeviceGetProcessUtilization)",
    _PROCESS_LABELS,
)
METRICS = (
    COUNT,
    MEMORY_USED,
    DROPPED,
    PROCESS_MEMORY,
    PROCESS_SM,
    PROCESS_MEMORY_UTILIZATION,
    PROCESS_ENCODER,
    PROCESS_DECODER,
)


@dataclass(frozen=True)
class Reading:
    """One GPU's processes.

    Attributes:
        count: validated compute processes.
        memory_used_bytes: their summed usedGpuMemory where known; None when none is known.
        dropped: reason -> records dropped by validation since the worker started.
        functions: list (``compute``, ``graphics``, ``mps``, ``utilization``) -> the NVML
            function that answered.
        fallbacks: list -> why not the newest struct version (the newest one's unsupported answer,
            e.g. ``function_not_found``, or ``records_invalid``); absent when the newest answered.
            Which variant answers each list is also in ``nvgpu_nvml_api_info``
            (``{kind}_processes``, ``process_utilization``).
        processes: per-process feature only: pid -> :data:`Usage`, the largest
            ``series_per_gpu`` processes.
        labels: pid -> (process name, namespace, pod, container); empty strings when not visible.
        other: the processes past the cap summed: (count, memory bytes, SM %, memory %,
            encoder %, decoder %); None when none are past it.
        pods: per-pod usage only: pod UID -> (memory bytes, SM %, processes), over every
            process in a pod's cgroup.
        pod_names: pod UID -> (namespace, pod) where the container log directory names it.
        sources: per-pod usage only: ``proc`` (NVML's pids resolve in /proc: hostPID) and
            ``container_logs`` (the kubelet's container log directory is readable) -> 0/1.
    """

    count: int
    memory_used_bytes: int | None
    dropped: dict[str, int] = field(default_factory=dict)
    functions: dict[str, str] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)
    processes: dict[int, Usage] = field(default_factory=dict)
    labels: dict[int, tuple[str, str, str, str]] = field(default_factory=dict)
    other: Other | None = None
    pods: dict[str, PodUsage] = field(default_factory=dict)
    pod_names: dict[str, tuple[str, str]] = field(default_factory=dict)
    sources: dict[str, int] = field(default_factory=dict)


CHECKS: tuple[Check, ...] = (
    Exempt(
        "count",
        "memory_used_bytes",
        "processes",
        "other",
        "pods",
        why="records and samples validated one by one where they are read (exporter.worker.process_records)",
    ),
    Exempt(
        "dropped", "functions", "fallbacks", "labels", "pod_names", "sources", why="counts and names of the worker's"
    ),
)


def read(dev: DeviceClient) -> Reading | None:
    """Validated process lists of one GPU, with usage and pods as the worker's switches ask.

    Per-process rows when :data:`PROCESS_USAGE` is in ``dev.enabled``, per-pod sums when
    :data:`POD_ATTRIBUTION` is (the worker's feature states: modes, quarantine, known issues);
    ``/proc``, the container log directory and the cap from ``dev.client.options.processes``.

    Returns:
        None when the compute list gives no answer this sample (unsupported, transient error).

    Raises:
        DeviceLost, NvmlFatal: from the device client.
    """
    from exporter.worker.process_records import merge

    opts = dev.client.options.processes
    per_process, per_pod = PROCESS_USAGE in dev.enabled, POD_ATTRIBUTION in dev.enabled
    st = dev.state_of(reads.State)
    host = reads.host_view(st, opts)
    drops: Counter[str] = Counter()
    lists = reads.read_lists(dev, st, host, drops)
    if lists is None:
        st.dropped.update(drops)
        return None
    functions = {kind: lst.function for kind, lst in lists.items()}
    merged = merge(lst.records for lst in lists.values())
    procs, utilization = reads.attributed(dev, st, host, merged, (per_process, per_pod), drops)
    if utilization:
        functions["utilization"] = reads.UTILIZATION_FUNCTION
        dev.chose("process_utilization", reads.UTILIZATION_FUNCTION)
    st.dropped.update(drops)
    rows: dict[int, Usage] = {}
    labels: dict[int, tuple[str, str, str, str]] = {}
    other = None
    if per_process:
        rows, labels, other = reads.process_rows(procs, opts.series_per_gpu)
    pods, pod_names, sources = reads.pod_sums(procs, host) if per_pod else ({}, {}, {})
    compute = lists["compute"].records
    return Reading(
        count=len(compute),
        memory_used_bytes=reads.compute_memory(compute),
        dropped=st.dropped_so_far(),
        functions=functions,
        fallbacks=st.fallbacks_of(functions),
        processes=rows,
        labels=labels,
        other=other,
        pods=pods,
        pod_names=pod_names,
        sources=sources,
    )


# -- rendering (supervisor) ---------------------------------------------------------------------------


def _ratio(percent: int | None) -> float | None:
    return None if percent is None else percent_to_ratio(percent)


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    count, mem, dropped = COUNT.family(), MEMORY_USED.family(), DROPPED.family()
    # per-process families, each with the position of its value in a Usage and whether it is a percentage
    per_process = [
        (PROCESS_MEMORY.family(), 0, False),
        (PROCESS_SM.family(), 1, True),
        (PROCESS_MEMORY_UTILIZATION.family(), 2, True),
        (PROCESS_ENCODER.family(), 3, True),
        (PROCESS_DECODER.family(), 4, True),
    ]
    for key, r in samples:
        count.add(key, r.count)
        mem.add(key, r.memory_used_bytes)
        for reason, n in sorted(r.dropped.items()):
            dropped.add(key, n, reason)
        rows: list[tuple[tuple[str, ...], Usage]] = [
            ((str(pid), *r.labels.get(pid, ("", "", "", ""))), usage) for pid, usage in sorted(r.processes.items())
        ]
        if r.other is not None:
            _, *summed = r.other
            rows.append(((OTHER, "", "", "", ""), (summed[0], summed[1], summed[2], summed[3], summed[4])))
        for labels, usage in rows:
            for fam, position, percent in per_process:
                value = usage[position]
                fam.add(key, _ratio(value) if percent else value, *labels)
    yield from count.done()
    yield from mem.done()
    yield from dropped.done()
    for fam, _, _ in per_process:
        yield from fam.done()
