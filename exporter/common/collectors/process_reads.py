"""The processes collector's worker side (:mod:`exporter.common.collectors.processes` reads through it).

One GPU's :class:`State` for the worker's life; each process list read by the newest struct version
that answers with plausible records (:data:`VARIANTS`: ``_v3``, else ``_v2`` when the driver lacks
``_v3`` or its records fail validation while ``_v2``'s pass, logged once with the binding and driver
versions); and the join of the validated records with ``nvmlDeviceGetProcessUtilization``'s samples
since the last read and with each process's pod (:mod:`exporter.worker.process_attribution`): the
per-process rows under the cap and the per-pod sums. What only the worker has (the NVML device
client, ``/proc``) is imported inside the functions that need it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.common.collectors.base import Other, PodUsage, Usage
from exporter.common.gpustate import GpuState, Lifetime
from exporter.common.logs import log_once
from exporter.common.plausibility import in_future

if TYPE_CHECKING:
    from exporter.common.workerconfig import ProcessOptions
    from exporter.worker.nvml.client import DeviceClient
    from exporter.worker.process_attribution import HostView, Proc
    from exporter.worker.process_records import ProcessRecord, UtilizationSample

# The collector's log lines keep the logger name they have always had.
log = logging.getLogger("exporter.common.collectors.processes")

FEATURE = "processes"
UTILIZATION_FUNCTION = "nvmlDeviceGetProcessUtilization"
VARIANTS: dict[str, tuple[str, ...]] = {
    "compute": ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
    "graphics": ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
    "mps": ("nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2"),
}


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


def host_view(st: State, opts: ProcessOptions) -> HostView:
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
class ProcessList:
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


def read_lists(dev: DeviceClient, st: State, host: HostView, drops: Counter[str]) -> dict[str, ProcessList] | None:
    """Every list that answers, by kind; None when the compute list gives no answer."""
    from exporter.worker.process_records import KINDS

    lists: dict[str, ProcessList] = {}
    for kind in KINDS:
        got = _read_list(dev, st, host, kind, drops)
        if got is None:
            if kind == "compute":
                return None
            continue
        lists[kind] = got
    return lists


def _read_list(dev: DeviceClient, st: State, host: HostView, kind: str, drops: Counter[str]) -> ProcessList | None:
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
                    return ProcessList(older, alt[0])
                break
            _log_mismatch(dev, st, kind, fn, bad, len(records) + sum(bad.values()), None)
        drops.update(local)
        if fn != variants[0]:
            newest = dev.unsupported.get((variants[0],), (FEATURE, "unsupported"))[1]
            st.fallbacks.setdefault(kind, newest.lower())
        dev.chose(f"{kind}_processes", fn, "", st.fallbacks.get(kind, ""))
        return ProcessList(fn, records)
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


def attributed(
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


def process_rows(
    procs: Mapping[int, Proc], cap: int
) -> tuple[dict[int, Usage], dict[int, tuple[str, str, str, str]], Other | None]:
    """(pid -> usage, pid -> labels) of the ``cap`` largest processes, and the rest summed."""
    from exporter.worker import process_attribution as attribution

    own, rest = attribution.top(procs, cap)
    rows = {pid: procs[pid].usage() for pid in own}
    labels = {pid: (procs[pid].name, *procs[pid].names) for pid in own}
    return rows, labels, attribution.other(procs, rest)


def pod_sums(
    procs: Mapping[int, Proc], host: HostView
) -> tuple[dict[str, PodUsage], dict[str, tuple[str, str]], dict[str, int]]:
    """Per-pod sums and names, and which attribution sources work (see :class:`Reading`)."""
    from exporter.worker import process_attribution as attribution

    pods, pod_names = attribution.pods(procs)
    host_pid, logs_readable = host.sources()  # read within a time bound
    sources = {"proc": int(host_pid or bool(pods)), "container_logs": int(logs_readable)}
    return pods, pod_names, sources


def compute_memory(compute: Sequence[ProcessRecord]) -> int | None:
    """The compute processes' summed memory where known; None when none of them is known."""
    known = [r.memory_bytes for r in compute if r.memory_bytes is not None]
    return sum(known) if known or not compute else None
