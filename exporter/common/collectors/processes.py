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

import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.common.collectors.base import Other, PodUsage, Usage, percent_to_ratio
from exporter.common.gpustate import GpuState, Lifetime
from exporter.common.logs import log_once
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import Check, Exempt, in_future

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.common.workerconfig import ProcessOptions
    from exporter.worker.nvml.client import DeviceClient
    from exporter.worker.process_attribution import HostView, Proc
    from exporter.worker.process_records import ProcessRecord, UtilizationSample

log = logging.getLogger(__name__)

FEATURE = "processes"
NEEDS: tuple[str, ...] = ()
UTILIZATION_FUNCTION = "nvmlDeviceGetProcessUtilization"
VARIANTS: dict[str, tuple[str, ...]] = {
    "compute": ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
    "graphics": ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
    "mps": ("nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2"),
}
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


# -- worker-side state ------------------------------------------------------------------------------


@dataclass
class State(GpuState):
    """What one GPU's reads remember for the worker's life: kept by UUID across re-probes and a GPU
    attached again, since the drop counter is exported as counted since the worker started and the
    struct fallback is a property of this binding and driver.

    Attributes:
        start: list -> index in :data:`VARIANTS` of the variant to begin with.
        fallbacks: list -> why not the newest struct version.
        dropped: reason -> records dropped by validation.
        last_seen_us: the newest utilization sample's timestamp (the next call's lastSeenTimeStamp).
        memory_total: the GPU's total memory (bounds a record's memory); None when unreadable.
        memory_total_read: ``nvmlDeviceGetMemoryInfo`` was asked.
        versions: (nvidia-ml-py version, driver version) for log lines, once read.
        host: ``/proc`` and the container log index at the configured paths, once used: one per
            GPU, so no GPU's thread shares it with another's.
    """

    LIFETIME = Lifetime.WORKER
    start: dict[str, int] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)
    dropped: Counter[str] = field(default_factory=Counter)
    last_seen_us: int = 0
    memory_total: int | None = None
    memory_total_read: bool = False
    versions: tuple[str, str] | None = None
    host: HostView | None = None

    def dropped_so_far(self) -> dict[str, int]:
        """Reason -> records dropped since the worker started, sorted, without zeros."""
        return {r: n for r, n in sorted(self.dropped.items()) if n}

    def fallbacks_of(self, functions: Mapping[str, str]) -> dict[str, str]:
        """The fallbacks of the lists that answered this time (``functions``' keys), sorted."""
        return {k: v for k, v in sorted(self.fallbacks.items()) if k in functions}


def _host(st: State, opts: ProcessOptions) -> HostView:
    from exporter.worker.process_attribution import HostView

    paths = (opts.proc_path, opts.container_log_dir)
    if st.host is None or st.host.paths != paths:
        st.host = HostView(*paths)
    return st.host


def _memory_total(dev: DeviceClient, st: State) -> int | None:
    if not st.memory_total_read:
        st.memory_total_read = True
        info = dev.get(FEATURE, "nvmlDeviceGetMemoryInfo")
        total = getattr(info, "total", None)
        st.memory_total = total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else None
    return st.memory_total


# -- reading ----------------------------------------------------------------------------------------


@dataclass
class _List:
    function: str
    records: list[ProcessRecord]


def _validated(
    dev: DeviceClient, st: State, function: str, kind: str, pid_max: int
) -> tuple[list[ProcessRecord], Counter[str]] | None:
    """One call and its validation; None when the call gave nothing (error or unsupported).

    The GPU's total memory is read after the first list answers: a GPU whose lists are all
    unsupported must not look as if the feature worked (the worker then switches it off).
    """
    from exporter.worker.process_records import validate_records

    raw = dev.get(FEATURE, function)
    if raw is None:
        return None
    drops: Counter[str] = Counter()
    total = _memory_total(dev, st)
    return validate_records(raw, kind, pid_max=pid_max, memory_total=total, drops=drops), drops


def _read_lists(dev: DeviceClient, st: State, host: HostView, drops: Counter[str]) -> dict[str, _List] | None:
    """Every list that answers, by kind; None when the compute list gives no answer."""
    from exporter.worker.process_records import KINDS

    lists: dict[str, _List] = {}
    for kind in KINDS:
        got = _read_list(dev, st, host, kind, drops)
        if got is None:
            if kind == "compute":
                return None
            continue
        lists[kind] = got
    return lists


def _read_list(dev: DeviceClient, st: State, host: HostView, kind: str, drops: Counter[str]) -> _List | None:
    """The newest struct version that answers with plausible records.

    A version whose records fail validation is kept only when the next older one fails too;
    when the older one reads clean, the binding and the driver disagree on the newer struct and
    the older one is used for the rest of this worker's life (logged once).
    """
    from exporter.worker.process_records import structural

    variants = VARIANTS[kind]
    pid_max = host.pid_max()
    candidates = [fn for fn in variants[st.start.get(kind, 0) :] if (fn,) not in dev.unsupported]
    for i, fn in enumerate(candidates):
        got = _validated(dev, st, fn, kind, pid_max)
        if got is None:
            if (fn,) in dev.unsupported:
                continue
            return None  # an error that omits this sample (counted by the device client)
        records, local = got
        bad = structural(local)
        if bad:
            for older in candidates[i + 1 :]:
                alt = _validated(dev, st, older, kind, pid_max)
                if alt is None:
                    if (older,) in dev.unsupported:
                        continue
                    break
                if not structural(alt[1]):
                    st.start[kind] = variants.index(older)
                    st.fallbacks[kind] = "records_invalid"
                    drops.update(local)
                    drops.update(alt[1])
                    _log_mismatch(dev, st, kind, fn, bad, len(records) + sum(bad.values()), older)
                    dev.chose(f"{kind}_processes", older, "", "records_invalid")
                    return _List(older, alt[0])
                break
            _log_mismatch(dev, st, kind, fn, bad, len(records) + sum(bad.values()), None)
        drops.update(local)
        if fn != variants[0]:
            newest = dev.unsupported.get((variants[0],), (FEATURE, "unsupported"))[1]
            st.fallbacks.setdefault(kind, newest.lower())
        dev.chose(f"{kind}_processes", fn, "", st.fallbacks.get(kind, ""))
        return _List(fn, records)
    return None


def _versions(dev: DeviceClient, st: State) -> tuple[str, str]:
    """(nvidia-ml-py version, driver version) for log lines, read once; "unknown" where unreadable."""
    if st.versions is None:
        try:
            binding = str(dev.client.backend.binding_version() or "unknown")
        except Exception:  # noqa: BLE001 - informational
            binding = "unknown"
        try:
            raw = dev.client.raw(FEATURE, "nvmlSystemGetDriverVersion", "")
            driver = raw.decode() if isinstance(raw, bytes) else str(raw)
        except Exception:  # noqa: BLE001 - informational; Stopping is a BaseException and propagates
            driver = "unknown"
        st.versions = (binding, driver)
    return st.versions


def _log_mismatch(
    dev: DeviceClient, st: State, kind: str, function: str, bad: Mapping[str, int], listed: int, older: str | None
) -> None:
    """Once per GPU, list and function: which records failed, and the versions that disagree."""
    binding, driver = _versions(dev, st)
    kept = listed - sum(bad.values())
    action = (
        f"{older} reads the list clean and is used for this GPU from now on"
        if older
        else f"{kept} record(s) kept; no older struct version reads the list clean"
    )
    log_once(
        log,
        logging.WARNING,
        ("process-records", dev.uuid, kind, function),
        "GPU %s: %d of %d records from %s failed validation (%s) and were dropped "
        "(nvgpu_process_records_dropped_total); %s. Usual cause: the binding and the driver disagree "
        "on the process struct: nvidia-ml-py %s, driver %s (drivers 535.43-535.86 write 32-byte _v3 "
        "records that the binding reads as 24 bytes)",
        dev.uuid,
        sum(bad.values()),
        listed,
        function,
        ", ".join(f"{r} {c}" for r, c in sorted(bad.items())),
        action,
        binding,
        driver,
        extra={
            "uuid": dev.uuid,
            "function": function,
            "nvidia_ml_py_version": binding,
            "driver_version": driver,
            "reasons": dict(bad),
        },
    )


def _utilization(
    dev: DeviceClient, st: State, host: HostView, drops: Counter[str], rejected: set[int]
) -> dict[int, UtilizationSample] | None:
    """Samples newer than the last read, latest per pid; {} when there is nothing new; None when
    NVML gave no answer (unsupported, error). ``rejected`` gains the pids whose samples failed
    validation."""
    from exporter.worker.process_records import validate_samples

    raw = dev.sample(FEATURE, UTILIZATION_FUNCTION, st.last_seen_us, absent=[])
    if raw is None:
        return None
    now_us = dev.client.timestamp_us()
    # The next call asks for samples newer than the newest seen; a timestamp in the future must not
    # move it there, or every later sample would be "older" and never returned.
    stamps = [
        ts for ts in (getattr(s, "timeStamp", None) for s in raw) if isinstance(ts, int) and not in_future(ts, now_us)
    ]
    if stamps:
        st.last_seen_us = max(st.last_seen_us, *stamps)
    return validate_samples(raw, pid_max=host.pid_max(), drops=drops, now_us=now_us, rejected=rejected)


def _with_usage(dev: DeviceClient, st: State, host: HostView, procs: Mapping[int, Proc], drops: Counter[str]) -> bool:
    """Each process's latest utilization sample ((0, 0, 0, 0) for one with none new: NVML reports
    only busy processes; unknown for one whose only new samples failed validation); False when
    NVML gave no answer (the processes keep none)."""
    rejected: set[int] = set()
    samples = _utilization(dev, st, host, drops, rejected)
    if samples is None:
        return False
    for pid, p in procs.items():
        s = samples.get(pid)
        if s is not None:
            p.utilization = (s.sm, s.memory, s.encoder, s.decoder)
        elif pid not in rejected:
            p.utilization = (0, 0, 0, 0)
    unmatched = sorted(pid for pid in samples if pid not in procs)
    if unmatched:  # a process that left between the two calls, or one NVML lists nowhere: counted, not used
        from exporter.worker import implausible

        why = "a utilization sample for a PID in no process list of this pass"
        implausible.count(dev, FEATURE, "join_unmatched", "utilization pid", unmatched[0], why, len(unmatched))
    return True


def _attributed(
    dev: DeviceClient,
    st: State,
    host: HostView,
    merged: Sequence[ProcessRecord],
    options: tuple[bool, bool],
    drops: Counter[str],
) -> tuple[dict[int, Proc], bool]:
    """(pid -> usage and attribution, whether utilization answered), when per-process or per-pod
    usage is on (``options``: (per_process, per_pod)); utilization is asked only when a row or a
    pod needs it."""
    from exporter.worker import process_attribution as attribution

    per_process, per_pod = options
    if not merged or not (per_process or per_pod):
        return {}, False
    procs = attribution.attribute(merged, host, per_process)
    if not per_process and not any(p.pod_uid for p in procs.values()):
        return procs, False
    return procs, _with_usage(dev, st, host, procs, drops)


def _per_process(
    procs: Mapping[int, Proc], cap: int
) -> tuple[dict[int, Usage], dict[int, tuple[str, str, str, str]], Other | None]:
    """(pid -> usage, pid -> labels) of the ``cap`` largest processes, and the rest summed."""
    from exporter.worker import process_attribution as attribution

    own, rest = attribution.top(procs, cap)
    rows = {pid: procs[pid].usage() for pid in own}
    labels = {pid: (procs[pid].name, *procs[pid].names) for pid in own}
    return rows, labels, attribution.other(procs, rest)


def _per_pod(
    procs: Mapping[int, Proc], host: HostView
) -> tuple[dict[str, PodUsage], dict[str, tuple[str, str]], dict[str, int]]:
    """Per-pod sums and names, and which attribution sources work (see :class:`Reading`)."""
    from exporter.worker import process_attribution as attribution

    pods, pod_names = attribution.pods(procs)
    host_pid, logs_readable = host.sources()  # read within a time bound
    sources = {"proc": int(host_pid or bool(pods)), "container_logs": int(logs_readable)}
    return pods, pod_names, sources


def _compute_memory(compute: Sequence[ProcessRecord]) -> int | None:
    """The compute processes' summed memory where known; None when none of them is known."""
    known = [r.memory_bytes for r in compute if r.memory_bytes is not None]
    return sum(known) if known or not compute else None


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
    st = dev.state_of(State)
    host = _host(st, opts)
    drops: Counter[str] = Counter()
    lists = _read_lists(dev, st, host, drops)
    if lists is None:
        st.dropped.update(drops)
        return None
    functions = {kind: lst.function for kind, lst in lists.items()}
    merged = merge(lst.records for lst in lists.values())
    procs, utilization = _attributed(dev, st, host, merged, (per_process, per_pod), drops)
    if utilization:
        functions["utilization"] = UTILIZATION_FUNCTION
        dev.chose("process_utilization", UTILIZATION_FUNCTION)
    st.dropped.update(drops)
    rows: dict[int, Usage] = {}
    labels: dict[int, tuple[str, str, str, str]] = {}
    other = None
    if per_process:
        rows, labels, other = _per_process(procs, opts.series_per_gpu)
    pods, pod_names, sources = _per_pod(procs, host) if per_pod else ({}, {}, {})
    compute = lists["compute"].records
    return Reading(
        count=len(compute),
        memory_used_bytes=_compute_memory(compute),
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
