"""How a worker died and who ended it: only a death the worker caused itself names the call in flight.

``waitpid(2)`` gives the supervisor the signal that ended a child, never who sent it. What the
supervisor knows besides is what it did itself (a deadline kill, an orderly stop) and the kernel's
count of OOM kills. :func:`classify` turns these facts into the death's ``reason`` (the label of
``nvgpu_worker_restarts_total``) and ``signal_from`` (a field of the death record):

- the supervisor killed it for missing its deadline: ``hang``, from ``supervisor``;
- the supervisor was stopping it (shutdown, a replacement): ``stopped``, from ``supervisor``;
- a fault signal, SIGSEGV, SIGBUS, SIGABRT, SIGILL or SIGFPE (a Python fatal error and glibc's heap
  checks end in SIGABRT): ``crash``, from ``self``;
- SIGKILL while the kernel's OOM-kill count rose across the death: ``oom``, from ``oom_killer``;
- any other signal (SIGKILL, SIGTERM, SIGINT, SIGHUP, SIGQUIT …): ``killed``, from ``outside``;
- exit code 4 (NVML unusable): ``nvml_error``; any other exit code: ``exit`` (``signal_from`` "").

Only ``crash`` (the worker's own fault) and ``hang`` (a call that did not return) are counted
against the NVML call in flight (:mod:`exporter.supervisor.accounting`); a death from outside or
by the OOM killer is the node's business, whatever call the worker happened to be in. The worker
traps SIGTERM to stop in order and then ends itself by SIGTERM again (``exporter/worker/__main__.py``),
so a SIGTERM from outside reads as one here, not as a clean exit. A worker killed while the
supervisor was stopping or replacing it is ``stopped`` whoever sent the signal (the supervisor
wanted it gone).

OOM evidence (:class:`OomKills`), chosen for a container without privileges: the ``oom_kill`` count
of the container's own memory cgroup (cgroup v2 ``memory.events``, cgroup v1
``memory.oom_control``; both count kills of the cgroup's processes, by its limit or the node's
OOM killer, Linux 4.13 and later), else the node's ``oom_kill`` in ``/proc/vmstat``. The kernel
log would name the victim's PID, but reading it needs ``CAP_SYSLOG`` (or ``kernel.dmesg_restrict=0``)
and gives host PIDs, not the container's. What it cannot tell: which process of the container (or,
with ``/proc/vmstat``, of the node) the OOM killer chose, so an outside SIGKILL at the moment
another process is OOM-killed reads as ``oom``; the baseline is read at each snapshot, so the
window is about one sample interval. Nor can it tell a fault signal sent by another process
(``kill -SEGV``) from a real fault: both run the worker's faulthandler. Such a signal is taken by
the worker's main thread, which is rarely inside an NVML call, so it names no call in flight.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass

from exporter.common import fileio, protocol

SELF_INFLICTED = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE})
"""Signals a process gets from its own fault (memory access, abort, illegal instruction, arithmetic)."""

ORIGINS = ("self", "supervisor", "outside", "oom_killer")
"""Values of ``signal_from`` in the death record ("" for a worker that exited by itself)."""

_COUNTER_BYTES = 64 << 10  # memory.events is ~100 bytes, /proc/vmstat ~5 KiB


@dataclass(frozen=True)
class Death:
    """How one worker ended.

    Attributes:
        reason: ``crash``, ``hang``, ``killed``, ``oom``, ``stopped``, ``nvml_error`` or ``exit``.
        signal_from: one of :data:`ORIGINS`, "" when no signal ended it.
    """

    reason: str
    signal_from: str

    @property
    def self_inflicted(self) -> bool:
        """The worker's own fault: the call in flight is to blame."""
        return self.reason == "crash"


def classify(
    returncode: int | None,
    *,
    deadline_kill: bool,
    stopping: bool,
    oom_rose: bool,
) -> Death:
    """The death's reason and who sent its signal (the table of this module).

    Args:
        returncode: the process's return code (negative: the signal), None if it could not be reaped.
        deadline_kill: the supervisor killed it for missing its deadline.
        stopping: the supervisor was stopping it (shutdown or a replacement).
        oom_rose: the kernel's OOM-kill count rose between the last sign of life and the death.
    """
    sig = -returncode if returncode is not None and returncode < 0 else 0
    if deadline_kill:
        return Death("hang", "supervisor")
    if stopping:
        return Death("stopped", "supervisor" if sig else "")
    if sig in SELF_INFLICTED:
        return Death("crash", "self")
    if sig == signal.SIGKILL and oom_rose:
        return Death("oom", "oom_killer")
    if sig:
        return Death("killed", "outside")
    if returncode == protocol.EXIT_NVML_FATAL:
        return Death("nvml_error", "")
    return Death("exit", "")


def _field(text: str, key: str) -> int | None:
    """The integer after ``key`` on a ``key value`` line (memory.events, memory.oom_control, vmstat)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None


class OomKills:
    """The kernel's count of OOM kills that could have hit the worker (see the module docstring).

    Args:
        root: where ``/proc`` and ``/sys`` are found ("/"; tests give a directory).
        read: reads at most ``n`` bytes of a path (default :func:`exporter.common.fileio.read_bytes`:
            without blocking, regular files only).

    Attributes:
        source: the file counted ("" when none could be read: then no death is taken for an OOM kill).
        scope: ``container`` (the memory cgroup) or ``node`` (``/proc/vmstat``), "" without a source.
    """

    def __init__(self, root: str = "/", read: Callable[[str, int], bytes] = fileio.read_bytes) -> None:
        self.root = root.rstrip("/")
        self._read = read
        self.source, self.scope = "", ""
        for path, scope in self._candidates():
            if self._count(path) is not None:
                self.source, self.scope = path, scope
                break

    def _text(self, path: str) -> str | None:
        try:
            return self._read(path, _COUNTER_BYTES).decode("ascii", "replace")
        except (OSError, fileio.FileRefused):
            return None

    def _candidates(self) -> list[tuple[str, str]]:
        """The container's memory cgroup files (from ``/proc/self/cgroup``), then ``/proc/vmstat``."""
        v2, v1 = "", ""
        for line in (self._text(f"{self.root}/proc/self/cgroup") or "").splitlines():
            _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
            if controllers == "" and not v2:
                v2 = path.strip()
            elif "memory" in controllers.split(","):
                v1 = path.strip()
        sys_cgroup = f"{self.root}/sys/fs/cgroup"
        found: list[tuple[str, str]] = []
        if v1:  # cgroup v1 (a v2 "0::/" line may sit beside it, with the memory controller not in it)
            found += [(f"{sys_cgroup}/memory{v1.rstrip('/')}/memory.oom_control", "container")]
            found += [(f"{sys_cgroup}/memory/memory.oom_control", "container")]
        if v2:
            found += [(f"{sys_cgroup}{v2.rstrip('/')}/memory.events", "container")]
            found += [(f"{sys_cgroup}/memory.events", "container")]  # a cgroup namespace shows "/"
        found.append((f"{self.root}/proc/vmstat", "node"))
        return list(dict.fromkeys(found))

    def _count(self, path: str) -> int | None:
        text = self._text(path)
        return None if text is None else _field(text, "oom_kill")

    def read(self) -> int | None:
        """The count now, None when it cannot be read."""
        return self._count(self.source) if self.source else None

    def rose(self, before: int | None) -> bool:
        """The count is above ``before`` (False when either reading is missing)."""
        now = self.read()
        return before is not None and now is not None and now > before


ATTRIBUTED = ("crash", "hang")
"""Reasons counted against the NVML call in flight: the worker's own fault, a call that did not return."""

_DEFAULT: list[OomKills] = []


def oom_kills() -> OomKills:
    """The process's :class:`OomKills` on ``/`` (found once, shared by every worker and probe).

    Found on the event loop, at the first worker: it reads ``/proc/self/cgroup`` and a few
    cgroupfs or procfs counters, kernel pseudo-files answered from memory (no storage, no mount
    that can hang; at worst /proc/vmstat's per-CPU sum waits out a CPU hotplug), each through
    :func:`exporter.common.fileio.read_bytes` (``O_NONBLOCK``, regular files only, bounded). The
    workers read the count on the loop too, at spawn, at each snapshot and at death."""
    if not _DEFAULT:
        _DEFAULT.append(OomKills())
    return _DEFAULT[0]
