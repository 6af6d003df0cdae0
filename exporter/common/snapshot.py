"""The typed messages from the worker to the supervisor; the snapshot is the heart of the contract.

(The other direction, what the supervisor starts a worker with, is :mod:`exporter.common.workerconfig`.)
The worker builds a :class:`Snapshot` from collectors' frozen ``Reading`` dataclasses and sends
``snapshot.to_wire()`` through :mod:`exporter.common.protocol` (JSON lines). The supervisor decodes each
line once, on receipt (:mod:`exporter.common.snapshotdecode`: every field checked against the
annotations here and in the collectors), and everything downstream (served state, rendering, the
status page, the stuck signature, pod and kernel-log extensions) reads attributes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from exporter.common import collectors
from exporter.common.collectors.base import SystemInfo
from exporter.common.gpuid import gpu_key
from exporter.common.nativelib import NativeLibrary
from guards.features import FeatureState
from guards.versions import SelfCheckResult

R = TypeVar("R")


@dataclass(frozen=True)
class FeatureStat:
    """One feature's last sample: success on every GPU it ran on, and time spent (seconds)."""

    success: bool
    duration_s: float


GPU_STATES = ("up", "lost", "hung", "crashed", "removed")
"""What a worker says of a GPU. ``up``: sampled. ``lost``: GPU_IS_LOST or its handle lookup failed
(retried every sample). ``hung``: an NVML call on it outlasted the deadline; this worker calls it no
more (the supervisor's probe retries it). ``crashed``: the supervisor excluded it after a native crash
in one of its calls (the probe retries it). ``removed``: NVML no longer enumerates it (drained,
unplugged): said in one snapshot, then the GPU is gone from the next. The supervisor adds
``unknown`` for a GPU without a fresh report (docs/metrics.md, ``nvgpu_device_state``)."""


@dataclass(frozen=True)
class GpuSample:
    """One GPU in a snapshot.

    Attributes:
        index: NVML index at the worker's last enumeration (the ``gpu`` label; it moves when a GPU
            leaves or arrives: state is keyed by :attr:`key`).
        uuid: GPU UUID; empty when the handle lookup failed before it was read.
        state: one of :data:`GPU_STATES`.
        readings: feature name -> that collector's ``Reading``, in the order sampled; the last
            good ones for a GPU that is not ``up`` (they age out by ``sampled_at``).
        sampled_at: Unix time the readings were taken, on the clock of the snapshot's ``ts``: the
            worker measures their age on its monotonic clock, so ``ts - sampled_at`` is a true age
            whatever the wall clock did meanwhile; None if there never were any.
        detail: why the GPU is not up (the NVML call and error), empty when up.
        unsupported: enabled features none of whose calls this GPU supports.
        feature: for a hung GPU, the feature of the call that did not return.
        function: for a hung GPU, the NVML function that did not return.
        bus_id: PCI bus id, "" until known (the key of a GPU whose UUID cannot be read).
        dropped: feature -> reason -> values the worker dropped as implausible on this GPU since it
            started (:mod:`exporter.common.plausibility`; ``nvgpu_readings_dropped_total``).
        error: for a GPU that is not up, the NVML return code name that made it so
            (``NO_PERMISSION`` for a handle lookup the container's device cgroup refused,
            ``GPU_IS_LOST`` …); "" when up or not an NVML answer.
        apis: which variant answers each versioned call on this GPU, chosen once per worker:
            (call, NVML function, struct version or "", fallback or ""), sorted by call.
    """

    index: int
    uuid: str
    state: str = "up"
    readings: Mapping[str, object] = field(default_factory=dict)
    sampled_at: float | None = None
    detail: str = ""
    unsupported: tuple[str, ...] = ()
    feature: str = ""
    function: str = ""
    dropped: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    error: str = ""
    apis: tuple[tuple[str, str, str, str], ...] = ()
    bus_id: str = ""

    @property
    def key(self) -> str:
        """The GPU's state key (:func:`exporter.common.gpuid.gpu_key`): UUID, else PCI bus id."""
        return gpu_key(self.uuid, self.bus_id, self.index)

    @property
    def up(self) -> bool:
        """The GPU answered in this sample."""
        return self.state == "up"

    def reading(self, kind: type[R]) -> R | None:
        """The reading of the collector whose ``Reading`` class is ``kind``, or None."""
        value = self.readings.get(collectors.feature_of(kind))
        return value if isinstance(value, kind) else None


@dataclass(frozen=True)
class Snapshot:
    """One sample of every GPU and enabled feature.

    Attributes:
        ts: Unix time the sample started.
        duration_s: wall time of the sample.
        system: versions.
        gpus: every GPU NVML enumerated, by index (and, once, each that left: state ``removed``).
        features: per-feature success and duration of this sample.
        feature_states: the worker's effective feature states (env, known issues, unsupported).
        errors: (feature, NVML error name) -> count since this worker started.
        calls: NVML calls since this worker started.
        events_enabled: UUID -> whether NVML event registration succeeded.
        undecodable: features with a reading the supervisor could not decode (see module doc).
    """

    ts: float
    duration_s: float
    system: SystemInfo
    gpus: tuple[GpuSample, ...]
    features: Mapping[str, FeatureStat]
    feature_states: Mapping[str, FeatureState]
    errors: Mapping[tuple[str, str], int]
    calls: int
    events_enabled: Mapping[str, bool]
    undecodable: frozenset[str] = frozenset()

    def to_wire(self) -> dict[str, Any]:
        """The ``snapshot`` message fields (JSON-ready)."""
        return {
            "ts": self.ts,
            "duration_s": self.duration_s,
            "system": dataclasses.asdict(self.system),
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "state": g.state,
                    "readings": {f: collectors.to_json(r) for f, r in g.readings.items()},
                    "sampled_at": g.sampled_at,
                    "detail": g.detail,
                    "unsupported": list(g.unsupported),
                    "feature": g.feature,
                    "function": g.function,
                    "bus_id": g.bus_id,
                    "dropped": {f: dict(r) for f, r in g.dropped.items()},
                    "error": g.error,
                    "apis": [list(a) for a in g.apis],
                }
                for g in self.gpus
            ],
            "features": {f: {"success": int(s.success), "duration_s": s.duration_s} for f, s in self.features.items()},
            "feature_states": states_to_wire(self.feature_states),
            "errors": [[f, n, c] for (f, n), c in sorted(self.errors.items())],
            "calls": self.calls,
            "events_enabled": dict(self.events_enabled),
        }


@dataclass(frozen=True)
class Hello:
    """The worker initialised NVML and enumerated GPUs (``index``, ``uuid``, PCI ``bus_id``) triples."""

    pid: int
    system: SystemInfo
    gpus: tuple[tuple[int, str, str], ...]
    feature_states: Mapping[str, FeatureState]
    kernel_module_version: str = ""
    native: NativeLibrary | None = None


@dataclass(frozen=True)
class Progress:
    """An init step finished (``nvmlInit``, one GPU's handle): the init deadline starts again."""

    step: str


@dataclass(frozen=True)
class InitFailed:
    """``nvmlInit`` (or NVML as a whole) failed; ``error`` is the NVML code name.

    Attributes:
        code: NVML return code (-1 when the failure is not NVML's).
        error: its name without the prefix, e.g. ``LIB_RM_VERSION_MISMATCH``.
        message: text for logs.
        kernel_module_version: the loaded kernel module (``/proc/driver/nvidia/version``), "" if none.
        errors: (feature, error, count) of the calls that failed in the worker's last sample, which
            no snapshot carried (the sample that found NVML unusable).
        native: the native library check after the failed init (the library stays mapped).
    """

    code: int
    error: str
    message: str
    kernel_module_version: str = ""
    errors: tuple[tuple[str, str, int], ...] = ()
    native: NativeLibrary | None = None


@dataclass(frozen=True)
class NvmlEvent:
    """An NVML event; ``xid`` is set for Xid events (``event_type == "xid"``)."""

    ts: float
    gpu: int | None
    uuid: str
    event_type: str
    xid: int | None


@dataclass(frozen=True)
class Attribution:
    """The worker's answer to ``attribute``: an Xid's PID mapped to its process and pod ("" unknown)."""

    pid: int
    process: str = ""
    pod_uid: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""


@dataclass(frozen=True)
class Bye:
    """Orderly worker shutdown; ``nvml_shutdown`` says whether ``nvmlShutdown`` ran."""

    nvml_shutdown: bool


Message = Snapshot | Hello | Progress | InitFailed | NvmlEvent | Bye | SelfCheckResult | NativeLibrary | Attribution
"""``native`` (a :class:`~exporter.common.nativelib.NativeLibrary`) is sent when the worker's native
library check changes while it samples (the mapped file replaced on disk under it)."""


def states_to_wire(states: Mapping[str, FeatureState]) -> dict[str, dict[str, Any]]:
    """Feature states as the wire carries them: ``{feature: {enabled, reason, detail}}``."""
    return {k: {"enabled": s.enabled, "reason": s.reason.value, "detail": s.detail} for k, s in states.items()}


def selfcheck_to_wire(result: SelfCheckResult) -> dict[str, Any]:
    """A self-check result as the ``selfcheck`` message and ``selfcheck --json`` carry it."""
    return {
        "process": result.process,
        "modules": [dataclasses.asdict(r) for r in result.reports],
        "problems": list(result.problems),
        "notes": list(result.notes),
    }
