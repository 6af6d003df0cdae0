"""Processes per GPU: validated records, their memory and utilization, per process and per pod.

Sources (worker side, per GPU and sample):

- ``nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses_v3``, ``_v2`` when the driver lacks
  the ``_v3`` symbol or when ``_v3``'s records fail validation while ``_v2``'s pass (drivers
  535.43-535.86 write a 32-byte ``_v3`` struct that nvidia-ml-py reads as 24 bytes; nvml-notes
  §5.1). Every record is checked (:mod:`exporter.process_records`): implausible ones are dropped
  and counted by reason, logged once with the binding and driver versions.
- ``nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)`` (about 2.7 ms per GPU on the
  H200 even with nothing to report), called only when per-process or per-pod usage needs it and
  the GPU lists processes; the timestamp passed is the newest sample seen before, so each call
  returns only new samples (0 on the first call: the driver's whole buffer). A process with no
  new sample had no utilization since the last read (NVML reports only busy processes). NOT_FOUND
  (nothing new) is not an error.
- ``nvmlDeviceGetMemoryInfo`` once, for the total that bounds a record's memory.
- ``/proc/<pid>/cgroup`` and ``/comm`` (:mod:`exporter.procfs`; needs ``hostPID``) and the kubelet's
  ``/var/log/containers`` names (:mod:`exporter.containerlogs`) for the pod of each process.

What it exports (``families``): the compute process count and memory (validated records only),
``nvgpu_process_records_dropped_total`` by reason, ``nvgpu_process_api_info`` (which struct
version answered each list, and why an older one), and, with the ``process_usage`` feature on,
per-process series: the ``NVGPU_PROCESS_SERIES_PER_GPU`` largest processes of each GPU (by
memory, then SM utilization, then pid) have their own, the rest are summed under ``pid="other"``.
Per-pod sums are carried in the reading for :mod:`exporter.pods` (feature ``pod_attribution``).

``usedGpuMemory`` None or 2^64-1 (NVML_VALUE_NOT_AVAILABLE) means unknown: never summed, never
exported. Instance ids (0xFFFFFFFF with MIG off) stay in the worker's records for per-instance
attribution and are not exported.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.collectors.base import percent_to_ratio
from exporter.containerlogs import ContainerLogIndex
from exporter.logs import log_once
from exporter.metric import GpuKey, MetricDef
from exporter.process_records import (
    KINDS,
    PID_MAX_LIMIT,
    ProcessRecord,
    UtilizationSample,
    merge,
    structural,
    validate_records,
    validate_samples,
)
from exporter.procfs import ProcFs

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from exporter.collectors.base import SystemInfo
    from exporter.nvml.client import DeviceClient
    from exporter.workerconfig import ProcessOptions

log = logging.getLogger(__name__)

FEATURE = "processes"
UTILIZATION_FUNCTION = "nvmlDeviceGetProcessUtilization"
VARIANTS: dict[str, tuple[str, ...]] = {
    "compute": ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
    "graphics": ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
    "mps": ("nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2"),
}
PROCESS_USAGE = "process_usage"  # the switch for per-process rows (in dev.enabled when on)
POD_ATTRIBUTION = "pod_attribution"  # the switch for per-pod sums
PID_MAX_REFRESH_S = 60.0
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
    "duplicate, memory_not_available, utilization_out_of_range (nvmlDeviceGet*RunningProcesses, "
    "nvmlDeviceGetProcessUtilization)",
    ("reason",),
)
API_INFO = MetricDef(
    "nvgpu_process_api_info",
    "The NVML function that answered each process list (and utilization); fallback says why not the "
    "newest struct version (unsupported, records_invalid); value is always 1",
    ("list", "function", "fallback"),
    per_gpu=False,
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
    API_INFO,
    PROCESS_MEMORY,
    PROCESS_SM,
    PROCESS_MEMORY_UTILIZATION,
    PROCESS_ENCODER,
    PROCESS_DECODER,
)

# (memory bytes, SM %, memory %, encoder %, decoder %); None = unknown
Usage = tuple[int | None, int | None, int | None, int | None, int | None]


@dataclass(frozen=True)
class Reading:
    """One GPU's processes.

    Attributes:
        count: validated compute processes.
        memory_used_bytes: their summed usedGpuMemory where known; None when none is known.
        dropped: reason -> records dropped by validation since the worker started.
        functions: list (``compute``, ``graphics``, ``mps``, ``utilization``) -> the NVML
            function that answered.
        fallbacks: list -> why not the newest struct version (``unsupported``,
            ``records_invalid``); absent when the newest answered.
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
    other: tuple[int, int | None, int | None, int | None, int | None, int | None] | None = None
    pods: dict[str, tuple[int | None, int | None, int]] = field(default_factory=dict)
    pod_names: dict[str, tuple[str, str]] = field(default_factory=dict)
    sources: dict[str, int] = field(default_factory=dict)


# -- worker-side state ------------------------------------------------------------------------------


class _Node:
    """Node-wide helpers shared by every GPU of the worker: /proc and the container log index."""

    def __init__(self, proc_path: str, log_dir: str) -> None:
        self.proc = ProcFs(proc_path)
        self.logs = ContainerLogIndex(log_dir)
        self._pid_max: int | None = None
        self._pid_max_at = -PID_MAX_REFRESH_S
        self.versions: tuple[str, str] | None = None

    def pid_max(self) -> int:
        """The kernel's pid_max, re-read every minute; PID_MAX_LIMIT when unreadable."""
        now = time.monotonic()
        if now - self._pid_max_at >= PID_MAX_REFRESH_S:
            self._pid_max, self._pid_max_at = self.proc.pid_max(), now
        return self._pid_max or PID_MAX_LIMIT


_NODES: dict[tuple[str, str], _Node] = {}


def _node(opts: ProcessOptions) -> _Node:
    key = (opts.proc_path, opts.container_log_dir)
    node = _NODES.get(key)
    if node is None:
        node = _NODES[key] = _Node(*key)
    return node


@dataclass
class _GpuState:
    """What one GPU's reads remember for the worker's life (by UUID, not in ``DeviceClient.cache``,
    which a re-probe clears: the drop counter and the struct fallback must not reset with it).
    Each GPU's state is used by that GPU's sampling only."""

    start: dict[str, int] = field(default_factory=dict)  # list -> index of the variant to begin with
    fallbacks: dict[str, str] = field(default_factory=dict)
    dropped: Counter[str] = field(default_factory=Counter)
    last_seen_us: int = 0
    memory_total: int | None = None
    memory_total_read: bool = False


_STATES: dict[str, _GpuState] = {}  # GPU UUID -> state; bounded by the GPUs of the node


def _state(dev: DeviceClient) -> _GpuState:
    st = _STATES.get(dev.uuid)
    if st is None:
        st = _STATES[dev.uuid] = _GpuState()
    return st


def _memory_total(dev: DeviceClient, st: _GpuState) -> int | None:
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
    dev: DeviceClient, st: _GpuState, function: str, kind: str, pid_max: int
) -> tuple[list[ProcessRecord], Counter[str]] | None:
    """One call and its validation; None when the call gave nothing (error or unsupported).

    The GPU's total memory is read after the first list answers: a GPU whose lists are all
    unsupported must not look as if the feature worked (the worker then switches it off).
    """
    raw = dev.get(FEATURE, function)
    if raw is None:
        return None
    drops: Counter[str] = Counter()
    total = _memory_total(dev, st)
    return validate_records(raw, kind, pid_max=pid_max, memory_total=total, drops=drops), drops


def _read_list(dev: DeviceClient, st: _GpuState, node: _Node, kind: str, drops: Counter[str]) -> _List | None:
    """The newest struct version that answers with plausible records.

    A version whose records fail validation is kept only when the next older one fails too;
    when the older one reads clean, the binding and the driver disagree on the newer struct and
    the older one is used for the rest of this worker's life (logged once).
    """
    variants = VARIANTS[kind]
    pid_max = node.pid_max()
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
                    _log_mismatch(dev, node, kind, fn, bad, len(records) + sum(bad.values()), older)
                    return _List(older, alt[0])
                break
            _log_mismatch(dev, node, kind, fn, bad, len(records) + sum(bad.values()), None)
        drops.update(local)
        if fn != variants[0]:
            st.fallbacks.setdefault(kind, "unsupported")
        return _List(fn, records)
    return None


def _versions(dev: DeviceClient, node: _Node) -> tuple[str, str]:
    """(nvidia-ml-py version, driver version) for log lines, read once; "unknown" where unreadable."""
    if node.versions is None:
        try:
            binding = str(dev.client.backend.binding_version() or "unknown")
        except Exception:  # noqa: BLE001 - informational
            binding = "unknown"
        try:
            raw = dev.client.raw(FEATURE, "nvmlSystemGetDriverVersion", "")
            driver = raw.decode() if isinstance(raw, bytes) else str(raw)
        except Exception:  # noqa: BLE001 - informational; Stopping is a BaseException and propagates
            driver = "unknown"
        node.versions = (binding, driver)
    return node.versions


def _log_mismatch(
    dev: DeviceClient, node: _Node, kind: str, function: str, bad: Mapping[str, int], listed: int, older: str | None
) -> None:
    """Once per GPU, list and function: which records failed, and the versions that disagree."""
    binding, driver = _versions(dev, node)
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
        "records that the binding reads as 24 bytes; nvml-notes 5.1)",
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
    dev: DeviceClient, st: _GpuState, node: _Node, drops: Counter[str]
) -> dict[int, UtilizationSample] | None:
    """Samples newer than the last read, latest per pid; {} when there is nothing new; None when
    NVML gave no answer (unsupported, error)."""
    raw = dev.sample(FEATURE, UTILIZATION_FUNCTION, st.last_seen_us, absent=[])
    if raw is None:
        return None
    stamps = [ts for ts in (getattr(s, "timeStamp", None) for s in raw) if isinstance(ts, int)]
    if stamps:
        st.last_seen_us = max(st.last_seen_us, *stamps)
    return validate_samples(raw, pid_max=node.pid_max(), drops=drops)


@dataclass
class _Proc:
    """One pid's usage and attribution over its records (a pid can hold several MIG instances)."""

    memory: int | None = None
    utilization: tuple[int, int, int, int] | None = None
    name: str = ""
    pod_uid: str = ""
    names: tuple[str, str, str] = ("", "", "")  # namespace, pod, container

    def usage(self) -> Usage:
        sm, mem, enc, dec = self.utilization if self.utilization is not None else (None, None, None, None)
        return (self.memory, sm, mem, enc, dec)


def _add(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


def _processes(merged: Sequence[ProcessRecord], node: _Node, names: bool) -> dict[int, _Proc]:
    """One entry per pid: summed memory, and its name and pod from /proc where visible."""
    out: dict[int, _Proc] = {}
    for rec in merged:
        p = out.setdefault(rec.pid, _Proc())
        p.memory = _add(p.memory, rec.memory_bytes)
    own = node.proc.own_pod() if out else None
    for pid, p in out.items():
        cg = node.proc.pod(pid)
        if own is not None and cg is not None and cg.pod_uid == own.pod_uid:
            # a PID of another namespace that names one of our own processes (see ProcFs.own_pod)
            log_once(
                log,
                logging.WARNING,
                ("own-pod-pid",),
                "GPU process pid %d resolves to the exporter's own pod in %s: NVML reports PIDs of another PID "
                "namespace (give the exporter hostPID: true); such processes are not named or attributed",
                pid,
                node.proc.root,
            )
            continue
        if names:
            p.name = node.proc.name(pid) or ""
        if cg is not None:
            p.pod_uid = cg.pod_uid
            ref = node.logs.lookup(cg.container_id)
            if ref is not None:
                p.names = (ref.namespace, ref.pod, ref.container)
    return out


def _top(procs: Mapping[int, _Proc], cap: int) -> tuple[list[int], list[int]]:
    """(pids with their own series, pids summed under "other"): largest memory, then SM, then pid."""

    def order(pid: int) -> tuple[int, int, int]:
        u = procs[pid].usage()
        return (-(u[0] or 0), -(u[1] or 0), pid)

    ranked = sorted(procs, key=order)
    return ranked[:cap], ranked[cap:]


def _other(
    procs: Mapping[int, _Proc], pids: Sequence[int]
) -> tuple[int, int | None, int | None, int | None, int | None, int | None] | None:
    if not pids:
        return None
    sums: list[int | None] = [None] * 5
    for pid in pids:
        for i, v in enumerate(procs[pid].usage()):
            sums[i] = _add(sums[i], v)
    return (len(pids), sums[0], sums[1], sums[2], sums[3], sums[4])


def _pods(
    procs: Mapping[int, _Proc],
) -> tuple[dict[str, tuple[int | None, int | None, int]], dict[str, tuple[str, str]]]:
    sums: dict[str, tuple[int | None, int | None, int]] = {}
    names: dict[str, tuple[str, str]] = {}
    for p in procs.values():
        if not p.pod_uid:
            continue
        mem, sm, n = sums.get(p.pod_uid, (None, None, 0))
        sums[p.pod_uid] = (_add(mem, p.memory), _add(sm, p.utilization[0] if p.utilization else None), n + 1)
        if p.names[1]:
            names[p.pod_uid] = (p.names[0], p.names[1])
    return dict(sorted(sums.items())), dict(sorted(names.items()))


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
    opts = dev.client.options.processes
    per_process, per_pod = PROCESS_USAGE in dev.enabled, POD_ATTRIBUTION in dev.enabled
    st, node = _state(dev), _node(opts)
    drops: Counter[str] = Counter()
    lists: dict[str, _List] = {}
    for kind in KINDS:
        got = _read_list(dev, st, node, kind, drops)
        if got is None:
            if kind == "compute":
                st.dropped.update(drops)
                return None
            continue
        lists[kind] = got
    merged = merge(lst.records for lst in lists.values())
    compute = lists["compute"].records
    known = [r.memory_bytes for r in compute if r.memory_bytes is not None]
    functions = {kind: lst.function for kind, lst in lists.items()}

    procs: dict[int, _Proc] = {}
    if merged and (per_process or per_pod):
        procs = _processes(merged, node, per_process)
        if per_process or any(p.pod_uid for p in procs.values()):
            samples = _utilization(dev, st, node, drops)
            if samples is not None:
                functions["utilization"] = UTILIZATION_FUNCTION
                for pid, p in procs.items():
                    s = samples.get(pid)
                    p.utilization = (s.sm, s.memory, s.encoder, s.decoder) if s else (0, 0, 0, 0)
    st.dropped.update(drops)

    rows: dict[int, Usage] = {}
    labels: dict[int, tuple[str, str, str, str]] = {}
    other = None
    if per_process:
        own, rest = _top(procs, opts.series_per_gpu)
        rows = {pid: procs[pid].usage() for pid in own}
        labels = {pid: (procs[pid].name, *procs[pid].names) for pid in own}
        other = _other(procs, rest)
    pods: dict[str, tuple[int | None, int | None, int]] = {}
    pod_names: dict[str, tuple[str, str]] = {}
    sources: dict[str, int] = {}
    if per_pod:
        pods, pod_names = _pods(procs)
        host = node.proc.host_pid_namespace()
        sources = {
            "proc": int(bool(host) or bool(pods)),
            "container_logs": int(bool(node.logs.check())),
        }
    return Reading(
        count=len(compute),
        memory_used_bytes=sum(known) if known or not compute else None,
        dropped={r: n for r, n in sorted(st.dropped.items()) if n},
        functions=functions,
        fallbacks={k: v for k, v in sorted(st.fallbacks.items()) if k in functions},
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
    count, mem, dropped, api = COUNT.family(), MEMORY_USED.family(), DROPPED.family(), API_INFO.family()
    # per-process families, each with the position of its value in a Usage and whether it is a percentage
    per_process = [
        (PROCESS_MEMORY.family(), 0, False),
        (PROCESS_SM.family(), 1, True),
        (PROCESS_MEMORY_UTILIZATION.family(), 2, True),
        (PROCESS_ENCODER.family(), 3, True),
        (PROCESS_DECODER.family(), 4, True),
    ]
    apis: set[tuple[str, str, str]] = set()
    for key, r in samples:
        count.add(key, r.count)
        mem.add(key, r.memory_used_bytes)
        for reason, n in sorted(r.dropped.items()):
            dropped.add(key, n, reason)
        apis.update((lst, fn, r.fallbacks.get(lst, "")) for lst, fn in r.functions.items())
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
    for lst, fn, fallback in sorted(apis):
        api.add_labels([lst, fn, fallback], 1)
    yield from count.done()
    yield from mem.done()
    yield from dropped.done()
    yield from api.done()
    for fam, _, _ in per_process:
        yield from fam.done()
