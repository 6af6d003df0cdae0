"""Xid and NVML event counters, owned by the supervisor so they survive worker restarts.

Xids arrive from the worker's NVML event thread (:mod:`exporter.worker.nvml_events`) and from the kernel
log (:mod:`exporter.supervisor.kernel_xid`); both call :meth:`XidLedger.record_xid`. Other NVML event types
(ECC, power source, MIG config change, …) are counted by type. The families here are per GPU.

Each Xid is also kept as an :class:`XidRecord` with the process the kernel log names (``pid=``,
``name=``) and, where the worker maps that PID to a pod (its cgroup names the pod UID, the kubelet's
container log names the namespace and pod), the pod: bounded, the last :data:`RECENT_PER_GPU` per
GPU, shown on ``/`` and in ``nvgpu_xid_process_last_timestamp_seconds`` (never a label of the
counter). An NVML event carries no PID: when the kernel log reports the same Xid (the deduplicator
pairs them and counts it once), the kernel record's process is written onto the NVML one
(:meth:`XidLedger.attribute`). The application Xids of the last :data:`APPLICATION_WINDOW_S` seconds
give the number of distinct processes that raised them on each GPU (the fault atlas: several
different processes hitting one GPU is a GPU-level anomaly, one process failing twice is its own).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.common.metric import GpuKey, MetricDef
from exporter.supervisor import xid as xid_catalog

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric

log = logging.getLogger("exporter.supervisor")
_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.ERROR}  # catalog severity

XID_ERRORS = MetricDef("nvgpu_xid_errors_total", "Xid errors reported by NVML events or the kernel log", ("xid",))
XID_LAST = MetricDef("nvgpu_xid_last_timestamp_seconds", "Unix time of the last Xid of this code", ("xid",))
XID_LAST_CODE = MetricDef(
    "nvgpu_xid_last_code",
    "The Xid code of the GPU's most recent Xid since the exporter started (dcgm-exporter's "
    "DCGM_FI_DEV_XID_ERRORS); absent before the first",
)
EVENTS = MetricDef("nvgpu_events_total", "NVML events other than Xid, by type", ("event_type",))
EVENTS_ENABLED = MetricDef("nvgpu_events_enabled", "1 if NVML event registration succeeded for this GPU")
XID_PROCESS = MetricDef(
    "nvgpu_xid_process_last_timestamp_seconds",
    "Unix time of one of the GPU's last 5 Xids, with the process the kernel log names (pid=, name=) and its pod "
    "where the PID maps to one (empty when unknown: an NVML event without a kernel-log record)",
    ("xid", "pid", "process", "namespace", "pod"),
)
APPLICATION_PROCESSES = MetricDef(
    "nvgpu_xid_application_processes",
    "Distinct processes (by the kernel log's pid and name) that raised an application-class Xid on the GPU in the "
    "last 30 minutes; present once the GPU had an application Xid",
)
METRICS = (XID_ERRORS, XID_LAST, XID_LAST_CODE, EVENTS, EVENTS_ENABLED, XID_PROCESS, APPLICATION_PROCESSES)
RECENT_PER_GPU = 5
APPLICATION_WINDOW_S = 1800.0
_APPLICATION_KEEP = 256  # application Xid records per GPU kept for the window (a storm is bounded)
ATTRIBUTE_WINDOW_S = 120.0  # an NVML event and the kernel record of the same Xid lie this close at most


@dataclass
class XidRecord:
    """One Xid, with its process and pod where known.

    Attributes:
        xid: the Xid number.
        ts: Unix time of the event.
        source: "NVML event" or "kernel log".
        pid: the process the kernel log names, None when unknown.
        process: its name (the kernel log's ``name=``).
        namespace: the pod's namespace where the PID maps to a pod.
        pod: the pod's name.
        container: the container's name.
        pod_uid: the pod's UID (from the PID's cgroup).
        mono: the event's time on the supervisor's monotonic clock (its age when it was recorded,
            taken from now): the windows that count Xids are measured on it, not on ``ts``.
    """

    xid: int
    ts: float
    source: str
    pid: int | None = None
    process: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""
    pod_uid: str = ""
    mono: float = 0.0

    @property
    def who(self) -> str:
        """The process in words: ``name (pid 4242) in ns/pod``, "" when unknown."""
        if self.pid is None and not self.process:
            return ""
        text = f"{self.process or '?'} (pid {self.pid if self.pid is not None else '?'})"
        return text + (f" in {self.namespace}/{self.pod}" if self.pod else "")


@dataclass
class _GpuXids:
    recent: collections.deque[XidRecord] = field(default_factory=lambda: collections.deque(maxlen=RECENT_PER_GPU))
    application: collections.deque[XidRecord] = field(
        default_factory=lambda: collections.deque(maxlen=_APPLICATION_KEEP)
    )


@dataclass
class XidCount:
    """How often one Xid code was seen on one GPU, when last (Unix time: the event's own), and the
    ``gpu`` label it came with (used only while the GPU's current index is unknown)."""

    count: int = 0
    last_ts: float = 0.0
    gpu: str = ""
    last_mono: float = 0.0  # the last one's time on the monotonic clock (windows are measured on it)


class XidLedger:
    """Counts per (GPU UUID, Xid) and per (GPU UUID, event type); the ``gpu`` label is the GPU's
    current NVML index, looked up when rendering, so a renumbering moves the label and keeps the count.

    Each Xid also gets its time on the monotonic clock (now, less its age by the wall clock when it
    is recorded): the windows that count Xids (``application_records``, the verdicts') measure on
    it, so a wall-clock step later neither empties a window nor keeps old Xids in it.

    Args:
        clock: monotonic clock (tests).
        wall: wall clock (tests).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.wall = wall
        self.records: dict[str, _GpuXids] = {}  # uuid -> its recent and application Xid records
        self.xids: dict[tuple[str, int], XidCount] = {}
        self.events: collections.Counter[tuple[str, str]] = collections.Counter()
        self.event_gpu: dict[str, str] = {}  # uuid -> the gpu label its events came with
        self.events_enabled: dict[str, bool] = {}  # uuid -> registration succeeded

    def record_xid(
        self, gpu: str, uuid: str, xid: int, ts: float, source: str, pid: int | None = None, process: str = ""
    ) -> XidRecord:
        """Count one Xid (NVML event or kernel log) and log it with the catalog's meaning.

        The log level follows the catalog's severity (info -> INFO, warning -> WARNING, critical ->
        ERROR); the line and its fields carry the mnemonic, class, meaning and action bucket
        (:mod:`exporter.supervisor.xid`), so an operator reading the log needs no lookup.

        Args:
            gpu: NVML index as text ("" if unknown).
            uuid: GPU UUID.
            xid: the Xid number.
            ts: Unix time of the event.
            source: "NVML event" or "kernel log", for the log line.
            pid: the process the kernel log names (None: unknown).
            process: its name.

        Returns:
            The record kept for it (its pod is filled in later, :meth:`attribute_pod`).
        """
        mono = self.clock() - max(0.0, self.wall() - ts)
        entry = self.xids.setdefault((uuid, xid), XidCount())
        entry.count += 1
        entry.last_ts = max(entry.last_ts, ts)
        entry.last_mono = max(entry.last_mono, mono)
        entry.gpu = gpu or entry.gpu
        info = xid_catalog.classify(xid)
        record = XidRecord(xid, ts, source, pid, process, mono=mono)
        mine = self.records.setdefault(uuid, _GpuXids())
        mine.recent.append(record)
        if info.xid_class == "application":
            mine.application.append(record)
        nvidia = f", NVIDIA: {info.nvidia_action}" if info.nvidia_action else ""
        who = f" by {record.who}" if record.who else ""
        log.log(
            _LEVELS.get(info.severity, logging.WARNING),
            "Xid %d on GPU %s (%s) from %s%s: %s (%s, %s) %s Action: %s%s; see docs/runbook.md",
            xid,
            gpu or "?",
            uuid,
            source,
            who,
            info.mnemonic,
            info.xid_class,
            info.severity,
            info.meaning.rstrip(".") + ".",
            info.action,
            nvidia,
            extra={
                "xid": xid,
                "gpu": gpu,
                "uuid": uuid,
                "source": source,
                "mnemonic": info.mnemonic,
                "xid_class": info.xid_class,
                "severity": info.severity,
                "action": info.action,
                "xid_pid": pid,
                "xid_process": process,
            },
        )
        return record

    def attribute(self, uuid: str, xid: int, ts: float, pid: int | None, process: str) -> XidRecord | None:
        """The kernel log's record of an Xid already counted from an NVML event: give the NVML
        record (the nearest in time without a process, within :data:`ATTRIBUTE_WINDOW_S`) its
        process. Returns that record, None when none matches."""
        mine = self.records.get(uuid)
        if mine is None or (pid is None and not process):
            return None
        candidates = [
            r
            for r in mine.recent
            if r.xid == xid and r.pid is None and not r.process and abs(r.ts - ts) <= ATTRIBUTE_WINDOW_S
        ]
        if not candidates:
            return None
        record = min(candidates, key=lambda r: abs(r.ts - ts))
        record.pid, record.process = pid, process
        if xid_catalog.classify(xid).xid_class == "application" and record not in mine.application:
            mine.application.append(record)
        log.info(
            "Xid %d on %s (counted from an NVML event) was raised by %s (kernel log)",
            xid,
            uuid,
            record.who,
            extra={"xid": xid, "uuid": uuid, "xid_pid": pid, "xid_process": process},
        )
        return record

    def attribute_pod(self, pid: int, pod_uid: str, namespace: str, pod: str, container: str) -> bool:
        """The worker mapped ``pid`` to a pod: every record of that PID without a pod gets it.
        Returns whether any did."""
        hit = False
        for mine in self.records.values():
            for record in {id(r): r for r in (*mine.recent, *mine.application)}.values():
                if record.pid == pid and not record.pod_uid and (pod_uid or pod):
                    record.pod_uid, record.namespace, record.pod, record.container = pod_uid, namespace, pod, container
                    hit = True
        return hit

    def recent(self, uuid: str) -> list[XidRecord]:
        """The GPU's last :data:`RECENT_PER_GPU` Xids, oldest first."""
        mine = self.records.get(uuid)
        return list(mine.recent) if mine else []

    def application_records(self, uuid: str, now: float, window_s: float = APPLICATION_WINDOW_S) -> list[XidRecord]:
        """The GPU's application-class Xids of the last ``window_s`` seconds (``now`` on the
        monotonic clock)."""
        mine = self.records.get(uuid)
        return [r for r in mine.application if now - r.mono <= window_s] if mine else []

    def application_processes(self, uuid: str, now: float, window_s: float = APPLICATION_WINDOW_S) -> int:
        """Distinct processes (pid and name, as the kernel log names them) with application Xids in
        the window; records without a process are not counted (an NVML event alone cannot tell)."""
        return len({(r.pid, r.process) for r in self.application_records(uuid, now, window_s) if r.pid is not None})

    def record_event(self, gpu: str, uuid: str, event_type: str) -> None:
        """Count one NVML event that is not an Xid."""
        self.events[(uuid, event_type)] += 1
        self.event_gpu[uuid] = gpu or self.event_gpu.get(uuid, "")

    def forget(self, uuid: str) -> None:
        """The GPU ``uuid`` left the node (NVML no longer enumerates it): its series go."""
        self.xids = {k: v for k, v in self.xids.items() if k[0] != uuid}
        self.events = collections.Counter({k: v for k, v in self.events.items() if k[0] != uuid})
        self.event_gpu.pop(uuid, None)
        self.events_enabled.pop(uuid, None)

    def latest(self, uuid: str) -> tuple[int, XidCount, int] | None:
        """(Xid, its count, all Xids of the GPU) for the most recent Xid on ``uuid``, or None."""
        mine = [(xid, c) for (u, xid), c in self.xids.items() if u == uuid]
        if not mine:
            return None
        xid, count = max(mine, key=lambda item: item[1].last_ts)
        return xid, count, sum(c.count for _x, c in mine)

    def families(self, live: Iterable[str], index: dict[str, str], now: float | None = None) -> list[Metric]:
        """The Xid and event families; ``events_enabled`` only for GPUs in ``live`` (up in the snapshot).

        Args:
            live: UUIDs of the GPUs that answered in the snapshot.
            index: UUID -> current NVML index (the ``gpu`` label).
        """
        total, last, code = XID_ERRORS.family(), XID_LAST.family(), XID_LAST_CODE.family()
        latest: dict[str, tuple[float, int, str]] = {}
        for (uuid, xid), c in sorted(self.xids.items()):
            key = GpuKey(index.get(uuid, c.gpu), uuid)
            total.add(key, c.count, str(xid))
            last.add(key, c.last_ts, str(xid))
            if uuid not in latest or c.last_ts >= latest[uuid][0]:
                latest[uuid] = (c.last_ts, xid, key.gpu)
        for uuid, (_ts, xid, gpu) in sorted(latest.items()):
            code.add(GpuKey(gpu, uuid), xid)
        events = EVENTS.family()
        for (uuid, etype), n in sorted(self.events.items()):
            events.add(GpuKey(index.get(uuid, self.event_gpu.get(uuid, "")), uuid), n, etype)
        enabled = EVENTS_ENABLED.family()
        alive = set(live)
        for uuid, ok in sorted(self.events_enabled.items()):
            if uuid in alive:
                enabled.add(GpuKey(index.get(uuid, ""), uuid), 1 if ok else 0)
        procs, apps = XID_PROCESS.family(), APPLICATION_PROCESSES.family()
        mono = self.clock() if now is None else now
        for uuid, mine in sorted(self.records.items()):
            key = GpuKey(index.get(uuid, ""), uuid)
            latest_by_labels: dict[tuple[str, ...], float] = {}
            for r in mine.recent:
                labels: tuple[str, ...] = (
                    str(r.xid),
                    "" if r.pid is None else str(r.pid),
                    r.process,
                    r.namespace,
                    r.pod,
                )
                latest_by_labels[labels] = max(latest_by_labels.get(labels, 0.0), r.ts)
            for labels, ts in sorted(latest_by_labels.items()):
                procs.add(key, ts, *labels)
            if mine.application:
                apps.add(key, self.application_processes(uuid, mono))
        return [
            total.always(),
            last.always(),
            code.always(),
            events.always(),
            enabled.always(),
            procs.always(),
            apps.always(),
        ]
