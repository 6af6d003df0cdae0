"""GPU processes -> process name, pod and container, and the sums the processes collector exports.

A pid from NVML's process lists is looked up in ``/proc`` (:mod:`exporter.worker.procfs`: its ``comm``
and its cgroup, which names the pod by UID and the container by the runtime's id; this needs
``hostPID``, since NVML reports host PIDs), and the container id in the kubelet's
``/var/log/containers`` names (:mod:`exporter.worker.containerlogs`) for the namespace, pod and container.
Then: one entry per pid (a pid can hold several MIG instances), the largest processes of a GPU
with their own series and the rest summed (:func:`top`, :func:`other`), and per-pod sums
(:func:`pods`). Used by :mod:`exporter.common.collectors.processes` in the worker; standard library only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from exporter.common import fileio
from exporter.common.collectors.base import Other, PodUsage, Usage
from exporter.common.logs import log_once
from exporter.worker.containerlogs import ContainerLogIndex, ContainerRef
from exporter.worker.process_records import PID_MAX_LIMIT, ProcessRecord
from exporter.worker.procfs import PodCgroup, ProcFs

T = TypeVar("T")

# The collector's logger: its log lines kept the name they had before this module was split out.
log = logging.getLogger("exporter.common.collectors.processes")

PID_MAX_REFRESH_S = 60.0
# The /proc and container-log reads of one GPU's sample must answer within this. They run on a
# thread of the GPU's own (a read of /proc/<pid>/cgroup can wait on a kernel lock, a scandir of a
# container log directory on a hung mount), never on the GPU's sampling thread: a read that does
# not answer costs that process's attribution, never the GPU's sample deadline (the GPU is not
# taken for hung).
READ_BUDGET_S = 1.0
MAX_STUCK_READS = 2  # abandoned read threads per GPU; past that attribution waits for one to return


@dataclass(frozen=True)
class Found:
    """What ``/proc`` and the container log directory say of one pid (None: unknown)."""

    name: str | None = None
    cgroup: PodCgroup | None = None
    ref: ContainerRef | None = None


class HostView:
    """The host as one GPU's reads see it: ``/proc`` and the container log index, read within a
    time bound on a thread of its own (:data:`READ_BUDGET_S`).

    Args:
        proc_path: the host's ``/proc`` (injectable root).
        log_dir: the kubelet's container log symlinks.
        budget_s: the reads of one sample answer within this.

    Attributes:
        timeouts: samples whose reads did not answer within the budget (each logged once per pid).
        stuck_pids: pids whose read has not answered; skipped (unattributed) until it does.
    """

    def __init__(self, proc_path: str, log_dir: str, budget_s: float = READ_BUDGET_S) -> None:
        self.paths = (proc_path, log_dir)
        self.proc = ProcFs(proc_path)
        self.logs = ContainerLogIndex(log_dir)
        self.io = fileio.Runner("nvgpu-procfs", deadline_s=budget_s, max_stuck=MAX_STUCK_READS)
        self.timeouts = 0
        self.stuck_pids: set[int] = set()
        self._pid_max: int | None = None
        self._pid_max_at = -PID_MAX_REFRESH_S

    def _bounded(self, what: str, fn: Callable[[], T], default: T) -> T:
        try:
            return self.io.call(fn)
        except fileio.TimedOut:
            self._timed_out(what)
            return default

    def _timed_out(self, what: str) -> None:
        self.timeouts += 1
        log_once(
            log,
            logging.WARNING,
            ("procfs-timeout", what),
            "reading %s did not answer within %g s (a process holding a kernel lock, or a hung mount); "
            "what it would name stays unattributed, the GPU's sample goes on",
            what,
            self.io.deadline_s or 0.0,
        )

    def pid_max(self) -> int:
        """The kernel's pid_max, re-read every minute; PID_MAX_LIMIT when unreadable."""
        now = time.monotonic()
        if now - self._pid_max_at >= PID_MAX_REFRESH_S:
            self._pid_max, self._pid_max_at = self._bounded("pid_max", self.proc.pid_max, None), now
        return self._pid_max or PID_MAX_LIMIT

    def sources(self) -> tuple[bool, bool]:
        """(this process sees the host's PID namespace, the container log directory is readable)."""
        return self._bounded(
            "/proc/self/ns/pid and the container log directory",
            lambda: (bool(self.proc.host_pid_namespace()), bool(self.logs.check())),
            (False, False),
        )

    def resolve(self, pids: Collection[int], names: bool) -> tuple[PodCgroup | None, dict[int, Found]]:
        """(the exporter's own pod, pid -> what is known of it) within the budget.

        The reads run on this view's thread, one pid after the other; when they have not
        finished within the budget, the pid being read is remembered as stuck (skipped in later
        samples until its read answers) and the pids not reached yet stay unknown this sample.
        """
        self.stuck_pids &= set(pids)  # a pid that left the GPU is forgotten
        todo = [pid for pid in pids if pid not in self.stuck_pids]
        found: dict[int, Found] = {}
        own: list[PodCgroup | None] = []
        current: list[int] = []

        def read_all() -> None:
            own.append(self.proc.own_pod())
            for pid in todo:
                current[:] = [pid]
                cgroup = self.proc.pod(pid)
                ref = self.logs.lookup(cgroup.container_id) if cgroup is not None else None
                found[pid] = Found(self.proc.name(pid) if names else None, cgroup, ref)
                self.stuck_pids.discard(pid)  # answered (late, if it was given up on)
            current.clear()

        try:
            self.io.call(read_all)
        except fileio.TimedOut:
            stuck = list(current)
            self.stuck_pids.update(stuck)
            self._timed_out(f"/proc/{stuck[0]}" if stuck else "/proc/self/cgroup")
        return (own[0] if own else None), dict(found)


@dataclass
class Proc:
    """One pid's usage and attribution over its records (a pid can hold several MIG instances)."""

    memory: int | None = None
    utilization: tuple[int, int, int, int] | None = None  # SM, memory, encoder, decoder %
    name: str = ""
    pod_uid: str = ""
    names: tuple[str, str, str] = ("", "", "")  # namespace, pod, container

    def usage(self) -> Usage:
        sm, mem, enc, dec = self.utilization if self.utilization is not None else (None, None, None, None)
        return (self.memory, sm, mem, enc, dec)


def add(a: int | None, b: int | None) -> int | None:
    """A sum where None is unknown: the other value, or None when both are."""
    return b if a is None else a if b is None else a + b


def attribute(merged: Sequence[ProcessRecord], host: HostView, names: bool) -> dict[int, Proc]:
    """One entry per pid: summed memory, and (with ``names``) its process name and its pod from
    /proc where visible (:meth:`HostView.resolve`: within a time bound). A pid that resolves to
    the exporter's own pod is left unattributed."""
    out: dict[int, Proc] = {}
    for rec in merged:
        p = out.setdefault(rec.pid, Proc())
        p.memory = add(p.memory, rec.memory_bytes)
    if not out:
        return out
    own, found = host.resolve(list(out), names)
    for pid, p in out.items():
        seen = found.get(pid)
        if seen is None:  # not read in time: unattributed this sample
            continue
        cg = seen.cgroup
        if own is not None and cg is not None and cg.pod_uid == own.pod_uid:
            # a PID of another namespace that names one of our own processes (see ProcFs.own_pod)
            log_once(
                log,
                logging.WARNING,
                ("own-pod-pid",),
                "GPU process pid %d resolves to the exporter's own pod in %s: NVML reports PIDs of another PID "
                "namespace (give the exporter hostPID: true); such processes are not named or attributed",
                pid,
                host.proc.root,
            )
            continue
        if names:
            p.name = seen.name or ""
        if cg is not None:
            p.pod_uid = cg.pod_uid
            if seen.ref is not None:
                p.names = (seen.ref.namespace, seen.ref.pod, seen.ref.container)
    return out


def attribute_pid(pid: int, host: HostView) -> Proc:
    """One PID that is not (or no longer) in a GPU process list, the way :func:`attribute` names
    one: its process name, and its pod and container where its cgroup and the container log name
    them (an Xid's PID from the kernel log). Empty when it has exited or is the exporter's own."""
    return attribute([ProcessRecord(pid, None)], host, names=True).get(pid, Proc())


def top(procs: Mapping[int, Proc], cap: int) -> tuple[list[int], list[int]]:
    """(pids with their own series, pids summed under "other"): largest memory, then SM, then pid."""

    def order(pid: int) -> tuple[int, int, int]:
        u = procs[pid].usage()
        return (-(u[0] or 0), -(u[1] or 0), pid)

    ranked = sorted(procs, key=order)
    return ranked[:cap], ranked[cap:]


def other(procs: Mapping[int, Proc], pids: Sequence[int]) -> Other | None:
    """The usage of ``pids`` summed, with their count; None when there are none."""
    if not pids:
        return None
    sums: list[int | None] = [None] * 5
    for pid in pids:
        for i, v in enumerate(procs[pid].usage()):
            sums[i] = add(sums[i], v)
    return (len(pids), sums[0], sums[1], sums[2], sums[3], sums[4])


def pods(procs: Mapping[int, Proc]) -> tuple[dict[str, PodUsage], dict[str, tuple[str, str]]]:
    """(pod UID -> usage over every process in its cgroup, pod UID -> (namespace, pod) where the
    container log directory names it), both sorted by UID."""
    sums: dict[str, PodUsage] = {}
    names: dict[str, tuple[str, str]] = {}
    for p in procs.values():
        if not p.pod_uid:
            continue
        mem, sm, n = sums.get(p.pod_uid, (None, None, 0))
        sums[p.pod_uid] = (add(mem, p.memory), add(sm, p.utilization[0] if p.utilization else None), n + 1)
        if p.names[1]:
            names[p.pod_uid] = (p.names[0], p.names[1])
    return dict(sorted(sums.items())), dict(sorted(names.items()))
