"""The served state: everything ``/metrics``, the probes and the status page read.

The supervisor writes it (snapshots, worker deaths, self-checks), extensions write to it through
the :class:`~exporter.supervisor.extensions.Host` methods it implements, and the HTTP side only reads it.
It holds what must survive worker restarts: the last snapshot with its arrival time (GPU series
are dropped once it is older than the stale bound), restart and crash counters, the NVML call and
error totals of earlier workers, the Xid ledger, and the UUID -> index map.

Feature state has one authority, the worker: it alone sees the GPU models and the driver that the
known-issue rules match, so its decision (modes, known issues, quarantine, support) is what
:meth:`ServedState.decided_states` returns once it has reported. Before that the supervisor shows a
provisional view (:func:`provisional_states`: modes and quarantine), the only other place the
precedence of ``guards.features.resolve`` is applied; the decision may turn a feature off, never
on. Supervisor-side extensions follow the decided state of their feature
(:meth:`ServedState.active_extensions`).
"""

from __future__ import annotations

import collections
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from exporter.common.collectors.base import SystemInfo
from exporter.common.logs import log_once
from exporter.common.nativelib import NativeLibrary
from exporter.common.snapshot import GpuSample, Snapshot
from exporter.supervisor.gpuhealth import GpuHealth, GpuRecord
from exporter.supervisor.verdicts import VerdictEngine
from exporter.supervisor.xids import XidLedger
from guards import features as gf
from guards.versions import SelfCheckResult

if TYPE_CHECKING:
    from collections.abc import Mapping

    from exporter.config import Config
    from exporter.supervisor.extensions import Extension
    from exporter.supervisor.quarantine import QuarantineStore

log = logging.getLogger("exporter.supervisor")
E = TypeVar("E")
PID_LOOKUP_MAX_AGE_S = 600.0  # an Xid's PID is mapped to its pod only while the process may still exist


def provisional_states(modes: Mapping[str, gf.Mode], quarantined: Mapping[str, str]) -> dict[str, gf.FeatureState]:
    """The supervisor's view of the feature states before a worker has decided: the operator's
    modes and the quarantines (the worker adds the known-issue rules and what the GPUs support)."""
    return gf.resolve(modes, quarantined=quarantined)


class ComponentErrors:
    """Exceptions in the supervisor's own work, counted by component
    (``nvgpu_supervisor_errors_total``); built first, so that every part (the quarantine store's
    saves included) can be handed :meth:`count` when it is constructed."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def count(self, component: str, doing: str) -> None:
        """Count the exception being handled (call from an ``except`` block) for ``component``; log
        it once per component and exception type with its traceback; the caller carries on."""
        import sys

        exc = sys.exc_info()[1]
        self.counts[component] += 1
        log_once(
            log,
            logging.ERROR,
            ("component", component, type(exc).__name__),
            "%s failed while %s (%s: %s); contained, the exporter keeps serving",
            component,
            doing,
            type(exc).__name__,
            exc,
            exc_info=True,
            extra={"component": component},
        )


def _distribution_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


@dataclass
class NvmlStatus:
    """Whether NVML works on this node, and failures that do not heal by themselves.

    Attributes:
        ever_worked: a worker initialised NVML and attached a GPU since the exporter started.
        init_failures: NVML error name -> failed initialisations (and samples that found NVML
            unusable).
        last_error: the last such error's name.
        broken_since: monotonic time since which NVML answers UNKNOWN to everything after having
            worked (a container that lost its device access); None when it works.
        kernel_module_version: the loaded kernel module (``/proc/driver/nvidia/version``).
    """

    ever_worked: bool = False
    init_failures: collections.Counter[str] = field(default_factory=collections.Counter)
    last_error: str = ""
    broken_since: float | None = None
    kernel_module_version: str = ""

    @property
    def driver_reload_required(self) -> bool:
        """The userspace library and the loaded kernel module differ: only a driver reload or a
        reboot cures it (LIB_RM_VERSION_MISMATCH)."""
        return self.last_error == "LIB_RM_VERSION_MISMATCH"


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
    """What the HTTP side serves; implements :class:`exporter.supervisor.extensions.Host`.

    Args:
        config: parsed configuration (stale bound, feature modes).
        quarantine: the crash quarantine store (its quarantines override feature states).
        extensions: supervisor-side extensions, rendered in this order.
        errors: where the supervisor's own failures are counted (a new counter when None).
    """

    def __init__(
        self,
        config: Config,
        quarantine: QuarantineStore,
        extensions: list[Extension],
        errors: ComponentErrors | None = None,
    ) -> None:
        self.config = config
        self.quarantine = quarantine
        self.extensions = extensions
        self.errors = errors if errors is not None else ComponentErrors()
        self.python_version = platform.python_version()
        self._listeners: list[Callable[[], None]] = []
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
        self.nvml = NvmlStatus()
        self.native: NativeLibrary | None = None  # the worker's native library check, last reported
        self.health = GpuHealth(config.gpu_retry_s, config.gpu_retry_max_s, expected=config.expected_gpus)
        self.xids = XidLedger()
        self.verdicts = VerdictEngine()  # every GPU's verdict, updated on each change (exporter.supervisor.verdicts)
        self.pid_lookups: list[int] = []  # Xid PIDs the worker is to map to pods
        self._calls_done = 0
        self._errors_done: collections.Counter[tuple[str, str]] = collections.Counter()
        self._calls_now = 0
        self._errors_now: collections.Counter[tuple[str, str]] = collections.Counter()
        self.component_errors = self.errors.counts
        self.render_errors: collections.Counter[str] = collections.Counter()  # family -> series dropped
        self.render_failed: str | None = None  # why the whole exposition could not be rendered

    # -- Host (for extensions) -------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot | None:
        """The last snapshot (fresh or not)."""
        return self.last

    def changed(self) -> None:
        """The state changed: the verdicts are evaluated again, then every subscriber is told (the
        renderer renders again, coalesced)."""
        try:
            self.verdicts.update(self)
        except Exception:  # noqa: BLE001 - a verdict bug must not cost the exposition
            self.count_error("verdicts", "evaluating the GPUs' verdicts")
        for listener in self._listeners:
            listener()

    def record_xid(
        self, gpu: str, uuid: str, xid: int, ts: float, source: str, pid: int | None = None, process: str = ""
    ) -> None:
        """Count one Xid; a PID is queued for the worker to map to its pod (:meth:`take_pid_lookups`)."""
        self.xids.record_xid(gpu, uuid, xid, ts, source, pid, process)
        if pid is not None and abs(time.time() - ts) <= PID_LOOKUP_MAX_AGE_S:  # history since boot: long gone
            self.pid_lookups.append(pid)

    def attribute_xid(self, uuid: str, xid: int, ts: float, pid: int | None, process: str) -> None:
        """Name the process of an Xid counted from an NVML event (the kernel log's record of it)."""
        if self.xids.attribute(uuid, xid, ts, pid, process) is not None and pid is not None:
            self.pid_lookups.append(pid)

    def take_pid_lookups(self) -> list[int]:
        """PIDs of new Xids, for the worker to map to pods (each once, then forgotten here)."""
        pids, self.pid_lookups = list(dict.fromkeys(self.pid_lookups)), []
        return pids

    def set_native(self, native: NativeLibrary | None) -> bool:
        """Take the worker's native library check; True when it differs from the last one."""
        if native is None or native == self.native:
            return False
        self.native = native
        return True

    def set_feature_state(self, state: gf.FeatureState) -> None:
        """Override one feature's state (an extension found it unsupported)."""
        self.overrides[state.feature] = state

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` on every :meth:`changed` (the renderer that follows this state)."""
        self._listeners.append(listener)

    # -- writes by the supervisor ----------------------------------------------------------------

    def count_error(self, component: str, doing: str) -> None:
        """An exception in the supervisor's own work (call from an ``except`` block): see
        :meth:`ComponentErrors.count`."""
        self.errors.count(component, doing)

    def add_errors(self, errors: tuple[tuple[str, str, int], ...]) -> None:
        """The dying worker's error totals (its last sample found NVML unusable and no snapshot
        carried them): they replace what its last snapshot said, since they include it."""
        if errors:
            self._errors_now = collections.Counter({(feature, name): count for feature, name, count in errors})

    def apply_snapshot(self, snap: Snapshot) -> list[GpuRecord]:
        """Take a snapshot as the current one; returns GPUs that just became hung."""
        self.last = snap
        self.last_mono = time.monotonic()
        if any(g.up for g in snap.gpus):
            self.nvml.ever_worked = True
            self.nvml.broken_since = None
            self.nvml.last_error = ""
        self.system = snap.system
        self.worker_states = dict(snap.feature_states)
        self.xids.events_enabled.update(snap.events_enabled)
        self._calls_now = snap.calls
        self._errors_now = collections.Counter(snap.errors)
        for ext in self.active_extensions():
            try:
                ext.on_snapshot(snap)
            except Exception:  # noqa: BLE001 - one extension's bug must not cost the snapshot
                self.count_error(ext.component, "handing it a snapshot")
        hung = self.health.on_snapshot(snap)
        for g in snap.gpus:
            if g.state == "removed":  # the GPU left the node: its Xid and event series go with it
                self.xids.forget(g.uuid or g.key)
        return hung

    @property
    def gpu_index(self) -> dict[str, str]:
        """UUID (PCI bus id without one) -> the ``gpu`` label of each GPU known now."""
        return {r.uuid or r.key: str(r.index) for r in self.health.gpus.values()}

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

    def active_extensions(self) -> list[Extension]:
        """The attached extensions whose feature the decided state has on (those without a feature
        always), in rendering order: only these get snapshots, Xids and render calls."""
        decided = self.decided_states()
        out = []
        for ext in self.extensions:
            state = decided.get(ext.feature) if ext.feature else None
            if state is None or state.enabled:
                out.append(ext)
        return out

    def fresh_snapshot(self) -> Snapshot | None:
        """The last snapshot if it is younger than the stale bound, else None."""
        if self.last is None or self.last_mono is None:
            return None
        if time.monotonic() - self.last_mono > self.config.stale_s:
            return None
        return self.last

    def sample_age(self) -> float | None:
        """Seconds since the last snapshot arrived (monotonic), None before the first."""
        return None if self.last_mono is None else max(0.0, time.monotonic() - self.last_mono)

    def reading_age(self, g: GpuSample) -> float | None:
        """Seconds since GPU ``g``'s readings were taken, None if it has none; measured from the
        snapshot's arrival (monotonic), so a worker's wall clock never makes data look fresh."""
        if g.sampled_at is None or self.last is None or self.last_mono is None:
            return None
        return time.monotonic() - self.last_mono + max(0.0, self.last.ts - g.sampled_at)

    def fresh_gpus(self) -> list[GpuSample]:
        """GPUs of the fresh snapshot whose readings are younger than the stale bound."""
        snap = self.fresh_snapshot()
        if snap is None:
            return []
        out = []
        for g in snap.gpus:
            age = self.reading_age(g)
            if age is not None and age <= self.config.stale_s:
                out.append(g)
        return out

    def ready(self) -> tuple[bool, str]:
        """Readiness: a fresh snapshot in which any GPU is served (or there are none), and an
        exposition that renders; else why not."""
        if self.render_failed:
            return False, f"the exposition cannot be rendered: {self.render_failed}"
        snap = self.fresh_snapshot()
        if snap is not None and (not snap.gpus or any(g.up for g in self.fresh_gpus())):
            return True, "ok"
        if snap is not None:
            return False, "no GPU has fresh readings: " + "; ".join(
                f"GPU {g.index} {g.state}{f' ({g.detail})' if g.detail else ''}" for g in snap.gpus
            )
        if self.last is None:
            return False, self.last_init_error or "no NVML sample yet"
        age = time.monotonic() - (self.last_mono or 0)
        why = f"last NVML sample is {age:.0f} s old (stale after {self.config.stale_s:g} s)"
        if self.last_init_error:
            why += f"; {self.last_init_error}"
        return False, why

    def driver_reload_required(self) -> bool:
        """LIB_RM_VERSION_MISMATCH on the host's library (or a host driver replaced under the running
        worker): a driver reload or a reboot is the cure. Not when the library is the image's own:
        then the image is to be fixed (``nvgpu_nvml_library_info{origin="image"}``)."""
        native = self.native
        if native is not None and native.origin == "image":
            return False
        return self.nvml.driver_reload_required or (native is not None and native.state == "driver_upgraded")

    def liveness(self) -> tuple[bool, str]:
        """Liveness: fails only when NVML worked, then answered UNKNOWN to every call and re-init
        for longer than ``NVGPU_UNHEALTHY_AFTER_SECONDS`` (a container that lost its device access:
        a restart is the cure). Never for a driver/library mismatch or a missing GPU."""
        bound = self.config.unhealthy_after_s
        since = self.nvml.broken_since
        if bound and since is not None and time.monotonic() - since > bound:
            return False, (
                f"NVML has answered UNKNOWN to every call and re-init for {time.monotonic() - since:.0f} s after "
                "working: the container likely lost its device access; restarting it is the cure"
            )
        return True, "ok"

    def decided_states(self) -> dict[str, gf.FeatureState]:
        """The authority's answer: the worker's decision once a worker reported, the provisional view
        (:func:`provisional_states`) before; a quarantine made since the worker started on top."""
        quarantined = self.quarantine.details()
        states = (
            dict(self.worker_states)
            if self.worker_states
            else provisional_states(self.config.feature_modes, quarantined)
        )
        for feature, detail in quarantined.items():
            states[feature] = gf.FeatureState(feature, False, gf.Reason.QUARANTINED, detail)
        return states

    def feature_states(self) -> dict[str, gf.FeatureState]:
        """What ``nvgpu_feature_enabled`` shows: the decided states, with an extension's finding
        about its own feature (the kernel log is unreadable: unsupported) where that feature is on."""
        states = self.decided_states()
        for feature, state in self.overrides.items():
            decided = states.get(feature)
            if decided is None or decided.enabled:
                states[feature] = state
        return states

    def nvml_calls(self) -> int:
        """NVML calls made by every worker since the exporter started."""
        return self._calls_done + self._calls_now

    def nvml_errors(self) -> collections.Counter[tuple[str, str]]:
        """(feature, NVML error name) -> count over every worker since the exporter started."""
        return self._errors_done + self._errors_now
