"""``process_*`` metrics of the supervisor and of the current worker (psutil).

The standard names (client_python's and client_golang's process collector), so a "memory of the
exporter" panel works as for any exporter, and next to the container's 256 Mi limit:

- the supervisor's series carry no label, like every exporter's;
- the worker's carry ``process="worker"`` (it is a second interpreter with NVML loaded, and most
  of the pod's memory: docs/performance.md). ``sum without (process) (process_resident_memory_bytes)``
  is the pod's total. A restarted worker starts its CPU counter again (its start time moves).

Read at rendering time (``/metrics`` renders again when the last rendering is older than 5 s), from
``/proc`` through psutil; a process that is gone or unreadable yields no series.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.metric import MetricDef

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric


def _m(name: str, help: str) -> MetricDef:
    return MetricDef(name, help, ("process",), per_gpu=False)


CPU = _m("process_cpu_seconds_total", 'Total user and system CPU time spent in seconds (worker: process="worker")')
RESIDENT = _m("process_resident_memory_bytes", "Resident memory size in bytes")
VIRTUAL = _m("process_virtual_memory_bytes", "Virtual memory size in bytes")
START = _m("process_start_time_seconds", "Start time of the process since unix epoch in seconds")
OPEN_FDS = _m("process_open_fds", "Number of open file descriptors")
MAX_FDS = _m("process_max_fds", "Maximum number of open file descriptors (soft limit)")
METRICS = (CPU, RESIDENT, VIRTUAL, START, OPEN_FDS, MAX_FDS)


@dataclass(frozen=True)
class ProcStats:
    """One process's numbers, in base units."""

    cpu_seconds: float
    resident_bytes: int
    virtual_bytes: int
    start_time: float
    open_fds: int
    max_fds: int | None


def read(pid: int) -> ProcStats | None:
    """The numbers of process ``pid``, None if it is gone or cannot be read.

    Source: ``/proc/<pid>/{stat,statm,fd,limits}`` through psutil.
    """
    import psutil

    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            times = proc.cpu_times()
            mem = proc.memory_info()
            start = proc.create_time()
            fds = proc.num_fds()
        if pid == os.getpid():
            max_fds: int | None = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        else:
            max_fds = proc.rlimit(psutil.RLIMIT_NOFILE)[0]
    except (psutil.Error, OSError, AttributeError):
        return None
    if max_fds is not None and max_fds < 0:  # RLIM_INFINITY
        max_fds = None
    return ProcStats(times.user + times.system, mem.rss, mem.vms, start, fds, max_fds)


def families(worker_pid: int | None, reader: Callable[[int], ProcStats | None] | None = None) -> list[Metric]:
    """The ``process_*`` families: the supervisor unlabelled, the worker with ``process="worker"``.

    Args:
        worker_pid: the current worker's PID, None when there is none.
        reader: reads one process (tests pass fixed numbers); :func:`read` by default.
    """
    read_one = reader or read
    rows: list[tuple[list[str], ProcStats]] = []
    me = read_one(os.getpid())
    if me is not None:
        rows.append(([], me))
    if worker_pid is not None:
        worker = read_one(worker_pid)
        if worker is not None:
            rows.append((["worker"], worker))
    out = []
    for spec, field in (
        (CPU, "cpu_seconds"),
        (RESIDENT, "resident_bytes"),
        (VIRTUAL, "virtual_bytes"),
        (START, "start_time"),
        (OPEN_FDS, "open_fds"),
        (MAX_FDS, "max_fds"),
    ):
        fam = spec.family()
        for labels, stats in rows:
            fam.add_labels(labels, getattr(stats, field))  # [] = no label (the supervisor)
        out.append(fam.always())
    return out
