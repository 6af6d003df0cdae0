"""The typed messages from the worker to the supervisor; the snapshot is the heart of the contract.

(The other direction, what the supervisor starts a worker with, is :mod:`exporter.common.workerconfig`.)
The worker builds a :class:`Snapshot` from collectors' frozen ``Reading`` dataclasses and sends
``snapshot.to_wire()`` through :mod:`exporter.common.protocol` (JSON lines). The supervisor decodes each
line once, on receipt, with :func:`decode_message`: every field is checked against the dataclass
annotations here and in the collectors (:func:`exporter.common.decode.decode_dataclass`: ``int | None``,
``dict[int, int]``, ``tuple[int, ...]`` …; JSON's string keys become ints where the annotation says
so), and everything downstream (served state, rendering, the status page, the stuck signature, pod
and kernel-log extensions) reads attributes. A renamed reading field therefore fails here, with the
field named, not in a golden.

A reading that does not fit its dataclass (a worker of another version, a driver string where an
integer belongs) costs only that GPU's reading of that feature: it is left out and the feature is
listed in :attr:`Snapshot.undecodable`, so its ``nvgpu_feature_success`` reads 0. Anything else
malformed raises :class:`~exporter.common.protocol.ProtocolError`.

A snapshot is decoded on the compiled path of :mod:`exporter.common.decode` first (decoders made
once per class; no error text is built); at the first value it refuses, the whole message is
decoded again on the reflective path (:func:`decode_message_reflective`), which accepts, refuses
and names exactly as before. A :class:`SnapshotDecoder` (one per worker) also keeps each GPU's
readings of the previous snapshot with the JSON object they came from: a reading whose JSON equals
the last one's (``==`` on the decoded JSON, done in C) is the same object again, not decoded anew
(about three readings in four repeat between two samples at a 1 s interval).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from exporter.common import collectors
from exporter.common.collectors.base import SystemInfo
from exporter.common.decode import (
    DecodeError,
    Mismatch,
    compiled,
    converter,
    decode_dataclass_reflective,
    decode_value_reflective,
)
from exporter.common.gpuid import gpu_key
from exporter.common.nativelib import NativeLibrary
from exporter.common.protocol import ProtocolError
from guards.features import FeatureState, Reason
from guards.versions import ModuleReport, SelfCheckResult

T = TypeVar("T")
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


# -- decoding ----------------------------------------------------------------------------------


def _states(raw: Any, where: str) -> dict[str, FeatureState]:
    if not isinstance(raw, dict):
        raise DecodeError(f"{where}: expected an object")
    out = {}
    for name, st in raw.items():
        if not isinstance(st, dict):
            raise DecodeError(f"{where}[{name!r}]: expected an object")
        out[name] = FeatureState(
            name,
            decode_value_reflective(bool, st.get("enabled"), f"{where}[{name!r}].enabled"),
            decode_value_reflective(Reason, st.get("reason"), f"{where}[{name!r}].reason"),
            decode_value_reflective(str, st.get("detail", ""), f"{where}[{name!r}].detail"),
        )
    return out


def _gpu(raw: Any, where: str, undecodable: set[str]) -> GpuSample:
    if not isinstance(raw, dict):
        raise DecodeError(f"{where}: expected an object")
    readings: dict[str, object] = {}
    raw_readings = raw.get("readings", {})
    if not isinstance(raw_readings, dict):
        raise DecodeError(f"{where}.readings: expected an object")
    for feature, data in raw_readings.items():
        collector = collectors.COLLECTORS.get(feature)
        if collector is None:
            undecodable.add(feature)
            continue
        try:
            readings[feature] = decode_dataclass_reflective(collector.Reading, data, f"{where}.readings.{feature}")
        except DecodeError:
            undecodable.add(feature)
    state = decode_value_reflective(str, raw.get("state"), f"{where}.state")
    if state not in GPU_STATES:
        raise DecodeError(f"{where}.state: {state!r} is not one of {GPU_STATES}")
    return GpuSample(
        index=decode_value_reflective(int, raw.get("index"), f"{where}.index"),
        uuid=decode_value_reflective(str, raw.get("uuid"), f"{where}.uuid"),
        state=state,
        readings=readings,
        sampled_at=decode_value_reflective(float | None, raw.get("sampled_at"), f"{where}.sampled_at"),
        detail=decode_value_reflective(str, raw.get("detail", ""), f"{where}.detail"),
        unsupported=decode_value_reflective(tuple[str, ...], raw.get("unsupported", []), f"{where}.unsupported"),
        feature=decode_value_reflective(str, raw.get("feature", ""), f"{where}.feature"),
        function=decode_value_reflective(str, raw.get("function", ""), f"{where}.function"),
        bus_id=decode_value_reflective(str, raw.get("bus_id", ""), f"{where}.bus_id"),
        dropped=decode_value_reflective(dict[str, dict[str, int]], raw.get("dropped", {}), f"{where}.dropped"),
        error=decode_value_reflective(str, raw.get("error", ""), f"{where}.error"),
        apis=decode_value_reflective(tuple[tuple[str, str, str, str], ...], raw.get("apis", []), f"{where}.apis"),
    )


def _snapshot(msg: dict[str, Any]) -> Snapshot:
    undecodable: set[str] = set()
    gpus = msg.get("gpus")
    if not isinstance(gpus, list):
        raise DecodeError("snapshot.gpus: expected a list")
    features = decode_value_reflective(dict[str, dict[str, float]], msg.get("features", {}), "snapshot.features")
    errors = decode_value_reflective(tuple[tuple[str, str, int], ...], msg.get("errors", []), "snapshot.errors")
    return Snapshot(
        ts=decode_value_reflective(float, msg.get("ts"), "snapshot.ts"),
        duration_s=decode_value_reflective(float, msg.get("duration_s"), "snapshot.duration_s"),
        system=decode_dataclass_reflective(SystemInfo, msg.get("system", {}), "snapshot.system"),
        gpus=tuple(_gpu(g, f"snapshot.gpus[{i}]", undecodable) for i, g in enumerate(gpus)),
        features={
            f: FeatureStat(bool(s.get("success", 0)), float(s.get("duration_s", 0.0))) for f, s in features.items()
        },
        feature_states=_states(msg.get("feature_states", {}), "snapshot.feature_states"),
        errors={(f, n): c for f, n, c in errors},
        calls=decode_value_reflective(int, msg.get("calls", 0), "snapshot.calls"),
        events_enabled=decode_value_reflective(
            dict[str, bool], msg.get("events_enabled", {}), "snapshot.events_enabled"
        ),
        undecodable=frozenset(undecodable),
    )


def _hello(msg: dict[str, Any]) -> Hello:
    gpus = decode_value_reflective(tuple[dict[str, int | str], ...], msg.get("gpus", []), "hello.gpus")
    return Hello(
        pid=decode_value_reflective(int, msg.get("pid", 0), "hello.pid"),
        system=decode_dataclass_reflective(SystemInfo, msg.get("system", {}), "hello.system"),
        gpus=tuple((int(g["index"]), str(g["uuid"]), str(g.get("bus_id", ""))) for g in gpus),
        feature_states=_states(msg.get("feature_states", {}), "hello.feature_states"),
        kernel_module_version=decode_value_reflective(
            str, msg.get("kernel_module_version", ""), "hello.kernel_module_version"
        ),
        native=decode_value_reflective(NativeLibrary | None, msg.get("native"), "hello.native"),
    )


def _selfcheck(msg: dict[str, Any]) -> SelfCheckResult:
    modules = msg.get("modules", [])
    if not isinstance(modules, list):
        raise DecodeError("selfcheck.modules: expected a list")
    return SelfCheckResult(
        process=decode_value_reflective(str, msg.get("process"), "selfcheck.process"),
        reports=tuple(
            decode_dataclass_reflective(ModuleReport, m, f"selfcheck.modules[{i}]") for i, m in enumerate(modules)
        ),
        problems=decode_value_reflective(tuple[str, ...], msg.get("problems", []), "selfcheck.problems"),
        notes=decode_value_reflective(tuple[str, ...], msg.get("notes", []), "selfcheck.notes"),
    )


def _fields(cls: type[T]) -> typing.Callable[[dict[str, Any]], T]:
    def decode(msg: dict[str, Any]) -> T:
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return decode_dataclass_reflective(cls, {k: v for k, v in msg.items() if k in names}, cls.__name__.lower())

    return decode


_DECODERS: dict[str, typing.Callable[[dict[str, Any]], Message]] = {
    "snapshot": _snapshot,
    "hello": _hello,
    "selfcheck": _selfcheck,
    "init_failed": _fields(InitFailed),
    "progress": _fields(Progress),
    "event": _fields(NvmlEvent),
    "bye": _fields(Bye),
    "native": _fields(NativeLibrary),
    "attribution": _fields(Attribution),
}


def decode_message_reflective(msg: dict[str, Any]) -> Message:
    """:func:`decode_message` on the reflective path only (what the compiled path must agree with).

    Raises:
        ProtocolError: an unknown message type, or a message that does not fit its type (the
            error names the field).
    """
    decoder = _DECODERS.get(msg["type"])
    if decoder is None:
        raise ProtocolError(f"worker sent an unknown message type {msg['type']!r}")
    try:
        return decoder(msg)
    except (DecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ProtocolError(f"worker sent a malformed {msg['type']} message: {exc}") from exc


def decode_message(msg: dict[str, Any]) -> Message:
    """Turn a decoded protocol line (:func:`exporter.common.protocol.decode`) into its typed message.

    Raises:
        ProtocolError: an unknown message type, or a message that does not fit its type (the
            error names the field).
    """
    return SnapshotDecoder(memo=False).decode_message(msg)


# -- the compiled path of a snapshot -----------------------------------------------------------

_Memo = dict[tuple[int, str], tuple[Any, object]]
"""(position of the GPU in the snapshot, feature) -> (the reading's decoded JSON, the reading)."""

_FEATURES: Any = converter(dict[str, dict[str, float]])
_ERRORS: Any = converter(tuple[tuple[str, str, int], ...])
_EVENTS: Any = converter(dict[str, bool])
_UNSUPPORTED: Any = converter(tuple[str, ...])
_DROPPED: Any = converter(dict[str, dict[str, int]])
_APIS: Any = converter(tuple[tuple[str, str, str, str], ...])
_SYSTEM: Any = compiled(SystemInfo)
_MISMATCH = Mismatch()


class SnapshotDecoder:
    """:func:`decode_message` with a memo of the last snapshot's readings (see the module docstring);
    the supervisor keeps one per worker, so a new worker starts with an empty memo.

    Args:
        memo: keep and reuse the last snapshot's readings.
    """

    def __init__(self, memo: bool = True) -> None:
        self.memo = memo
        self._last: _Memo = {}
        self.reused = 0
        """Readings taken from the memo since this decoder was made."""

    def decode_message(self, msg: dict[str, Any]) -> Message:
        """As :func:`decode_message`.

        Raises:
            ProtocolError: as :func:`decode_message_reflective`.
        """
        if msg.get("type") == "snapshot":
            keep: _Memo = {}
            try:
                snap = self._snapshot(msg, keep)
            except (Mismatch, KeyError, TypeError, AttributeError, ValueError, OverflowError):
                pass  # the reflective path decides, and names the problem
            else:
                if self.memo:
                    self._last = keep
                return snap
        return decode_message_reflective(msg)

    def _snapshot(self, msg: dict[str, Any], keep: _Memo) -> Snapshot:
        undecodable: set[str] = set()
        gpus = msg.get("gpus")
        if type(gpus) is not list:
            raise _MISMATCH
        features = _FEATURES(msg.get("features", {}))
        errors = _ERRORS(msg.get("errors", []))
        ts, duration, calls = msg.get("ts"), msg.get("duration_s"), msg.get("calls", 0)
        if type(ts) is int:
            ts = float(ts)
        if type(duration) is int:
            duration = float(duration)
        if type(ts) is not float or type(duration) is not float or type(calls) is not int:
            raise _MISMATCH
        return Snapshot(
            ts=ts,
            duration_s=duration,
            system=_SYSTEM(msg.get("system", {})),
            gpus=tuple([self._gpu(g, i, undecodable, keep) for i, g in enumerate(gpus)]),
            features={
                f: FeatureStat(bool(s.get("success", 0)), float(s.get("duration_s", 0.0))) for f, s in features.items()
            },
            feature_states=_fast_states(msg.get("feature_states", {})),
            errors={(f, n): c for f, n, c in errors},
            calls=calls,
            events_enabled=_EVENTS(msg.get("events_enabled", {})),
            undecodable=frozenset(undecodable),
        )

    def _gpu(self, raw: Any, i: int, undecodable: set[str], keep: _Memo) -> GpuSample:
        if type(raw) is not dict:
            raise _MISMATCH
        raw_readings = raw.get("readings", {})
        if type(raw_readings) is not dict:
            raise _MISMATCH
        readings: dict[str, object] = {}
        last = self._last
        for feature, data in raw_readings.items():
            collector = collectors.COLLECTORS.get(feature)
            if collector is None:
                undecodable.add(feature)
                continue
            have = last.get((i, feature))
            if have is not None and have[0] == data:
                readings[feature] = have[1]
                keep[(i, feature)] = have
                self.reused += 1
                continue
            try:
                reading = compiled(collector.Reading)(data)
            except (Mismatch, OverflowError):  # as the reflective path: the reading is left out, the feature listed
                try:
                    reading = decode_dataclass_reflective(
                        collector.Reading, data, f"snapshot.gpus[{i}].readings.{feature}"
                    )
                except DecodeError:
                    undecodable.add(feature)
                    continue
            readings[feature] = reading
            if self.memo:
                keep[(i, feature)] = (data, reading)
        state, index, uuid = raw.get("state"), raw.get("index"), raw.get("uuid")
        detail, feature, function = raw.get("detail", ""), raw.get("feature", ""), raw.get("function", "")
        bus_id, error = raw.get("bus_id", ""), raw.get("error", "")
        sampled_at = raw.get("sampled_at")
        if type(sampled_at) is int:
            sampled_at = float(sampled_at)
        if (
            type(state) is not str
            or state not in GPU_STATES
            or type(index) is not int
            or type(uuid) is not str
            or type(detail) is not str
            or type(feature) is not str
            or type(function) is not str
            or type(bus_id) is not str
            or type(error) is not str
            or (sampled_at is not None and type(sampled_at) is not float)
        ):
            raise _MISMATCH
        return GpuSample(
            index=index,
            uuid=uuid,
            state=state,
            readings=readings,
            sampled_at=sampled_at,
            detail=detail,
            unsupported=_UNSUPPORTED(raw.get("unsupported", [])),
            feature=feature,
            function=function,
            bus_id=bus_id,
            dropped=_DROPPED(raw.get("dropped", {})),
            error=error,
            apis=_APIS(raw.get("apis", [])),
        )


def _fast_states(raw: Any) -> dict[str, FeatureState]:
    if type(raw) is not dict:
        raise _MISMATCH
    out = {}
    for name, st in raw.items():
        if type(st) is not dict:
            raise _MISMATCH
        enabled, detail = st.get("enabled"), st.get("detail", "")
        if (enabled is not True and enabled is not False) or type(detail) is not str:
            raise _MISMATCH
        try:
            reason = Reason(st.get("reason"))
        except ValueError:
            raise _MISMATCH from None
        out[name] = FeatureState(name, enabled, reason, detail)
    return out
