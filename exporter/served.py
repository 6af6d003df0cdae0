"""The served state: everything ``/metrics``, the probes and the status page read.

The supervisor writes it (snapshots, worker deaths, self-checks), extensions write to it through
the :class:`~exporter.extensions.Host` methods it implements, and the HTTP side only reads it.
It holds what must survive worker restarts: the last snapshot with its arrival time (GPU series
are dropped once it is older than the stale bound), restart and crash counters, the NVML call and
error totals of earlier workers, the Xid ledger, and the UUID -> index map.
"""

from __future__ import annotations

import collections
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from exporter.logs import log_once
from exporter.snapshot import Snapshot, SystemInfo
from exporter.xids import XidLedger
from guards import features as gf
from guards.versions import SelfCheckResult

if TYPE_CHECKING:
    from exporter.config import Config
    from exporter.extensions import Extension
    from exporter.quarantine import QuarantineStore

log = logging.getLogger("exporter.supervisor")
E = TypeVar("E")


def _distribution_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


@dataclass
class WorkerStatus:
    """The current worker and the history of earlier ones.

    Attributes:
        pid: the current worker's PID.
        started_at: Unix time the current worker started.
        restarts: reason (crash, hang, exit, nvml_error) -> count.
        crashes: (feature, NVML function in flight) -> crashes and hangs.
        last_exit_signal: signal that ended the last worker (0: none).
        last_exit_code: exit code of the last worker that exited.
        stuck: a worker is in uninterruptible sleep, or respawning stopped.
        respawn_stopped: a second worker hung unreapably in the same place: no more respawns.
    """

    pid: int | None = None
    started_at: float | None = None
    restarts: collections.Counter[str] = field(default_factory=collections.Counter)
    crashes: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    last_exit_signal: int = 0
    last_exit_code: int = 0
    stuck: bool = False
    respawn_stopped: bool = False


class ServedState:
    """What the HTTP side serves; implements :class:`exporter.extensions.Host`.

    Args:
        config: parsed configuration (stale bound, feature modes).
        quarantine: the crash quarantine store (its quarantines override feature states).
        extensions: supervisor-side extensions, rendered in this order.
    """

    def __init__(self, config: Config, quarantine: QuarantineStore, extensions: list[Extension]) -> None:
        self.config = config
        self.quarantine = quarantine
        self.extensions = extensions
        self.python_version = platform.python_version()
        self.on_change: Callable[[], None] = lambda: None
        self.last: Snapshot | None = None
        self.last_mono: float | None = None
        # Until a worker reports, the installed binding's version (read without importing pynvml).
        self.system = SystemInfo(nvidia_ml_py_version=_distribution_version("nvidia-ml-py"))
        self.worker_states: dict[str, gf.FeatureState] = {}
        self.overrides: dict[str, gf.FeatureState] = {}  # set by extensions
        self.nvml_up = False
        self.last_init_error: str | None = None
        self.selfchecks: dict[str, SelfCheckResult] = {}
        self.worker = WorkerStatus()
        self.xids = XidLedger()
        self.gpu_index: dict[str, str] = {}  # uuid -> index, remembered across workers
        self._calls_done = 0
        self._errors_done: collections.Counter[tuple[str, str]] = collections.Counter()
        self._calls_now = 0
        self._errors_now: collections.Counter[tuple[str, str]] = collections.Counter()

    # -- Host (for extensions) -------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot | None:
        """The last snapshot (fresh or not)."""
        return self.last

    def changed(self) -> None:
        """Ask for a new rendering."""
        self.on_change()

    def record_xid(self, gpu: str, uuid: str, xid: int, ts: float, source: str) -> None:
        """Count one Xid."""
        self.xids.record_xid(gpu, uuid, xid, ts, source)

    def set_feature_state(self, state: gf.FeatureState) -> None:
        """Override one feature's state (an extension found it unsupported)."""
        self.overrides[state.feature] = state

    # -- writes by the supervisor ----------------------------------------------------------------

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Take a snapshot as the current one."""
        self.last = snap
        self.last_mono = time.monotonic()
        self.system = snap.system
        self.worker_states = dict(snap.feature_states)
        self.xids.events_enabled.update(snap.events_enabled)
        self._calls_now = snap.calls
        self._errors_now = collections.Counter(snap.errors)
        for g in snap.gpus:
            if g.uuid:
                self.gpu_index[g.uuid] = str(g.index)
        for ext in self.extensions:
            try:
                ext.on_snapshot(snap)
            except Exception:  # noqa: BLE001 - one extension's bug must not cost the snapshot
                log_once(log, logging.ERROR, ("on_snapshot", type(ext).__name__), "extension failed", exc_info=True)

    def worker_started(self, pid: int) -> None:
        """A new worker process: fold the last worker's call and error totals into the history."""
        self.worker.pid = pid
        self.worker.started_at = time.time()
        self._calls_done += self._calls_now
        self._errors_done += self._errors_now
        self._calls_now, self._errors_now = 0, collections.Counter()

    # -- reads -----------------------------------------------------------------------------------

    def extension(self, kind: type[E]) -> E | None:
        """The extension of class ``kind``, if one is attached."""
        for ext in self.extensions:
            if isinstance(ext, kind):
                return ext
        return None

    def fresh_snapshot(self) -> Snapshot | None:
        """The last snapshot if it is younger than the stale bound, else None."""
        if self.last is None or self.last_mono is None:
            return None
        if time.monotonic() - self.last_mono > self.config.stale_s:
            return None
        return self.last

    def ready(self) -> tuple[bool, str]:
        """Readiness: a fresh snapshot exists; otherwise why not."""
        if self.fresh_snapshot() is not None:
            return True, "ok"
        if self.last is None:
            return False, self.last_init_error or "no NVML sample yet"
        age = time.monotonic() - (self.last_mono or 0)
        why = f"last NVML sample is {age:.0f} s old (stale after {self.config.stale_s:g} s)"
        if self.last_init_error:
            why += f"; {self.last_init_error}"
        return False, why

    def feature_states(self) -> dict[str, gf.FeatureState]:
        """Effective feature states: the worker's view, extension overrides, then quarantines."""
        if self.worker_states:
            states = dict(self.worker_states)
        else:
            states = gf.resolve(self.config.feature_modes, quarantined=self.quarantine.details())
        states.update(self.overrides)
        for feature, detail in self.quarantine.details().items():
            states[feature] = gf.FeatureState(feature, False, gf.Reason.QUARANTINED, detail)
        return states

    def nvml_calls(self) -> int:
        """NVML calls made by every worker since the exporter started."""
        return self._calls_done + self._calls_now

    def nvml_errors(self) -> collections.Counter[tuple[str, str]]:
        """(feature, NVML error name) -> count over every worker since the exporter started."""
        return self._errors_done + self._errors_now
