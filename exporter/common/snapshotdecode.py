"""Decoding the worker's messages (:mod:`exporter.common.snapshot` says what they are).

The supervisor decodes each line once, on receipt, with :func:`decode_message`: every field is
checked against the dataclass annotations of :mod:`exporter.common.snapshot` and the collectors
(:func:`exporter.common.decode.decode_dataclass`: ``int | None``, ``dict[int, int]``,
``tuple[int, ...]`` …; JSON's string keys become ints where the annotation says so). A renamed
reading field therefore fails here, with the field named, not in a golden.

A reading that does not fit its dataclass (a worker of another version, a driver string where an
integer belongs) costs only that GPU's reading of that feature: it is left out and the feature is
listed in :attr:`~exporter.common.snapshot.Snapshot.undecodable`, so its ``nvgpu_feature_success``
reads 0. Anything else malformed raises :class:`~exporter.common.protocol.ProtocolError`.

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
from exporter.common.nativelib import NativeLibrary
from exporter.common.protocol import ProtocolError
from exporter.common.snapshot import (
    GPU_STATES,
    Attribution,
    Bye,
    FeatureStat,
    GpuSample,
    Hello,
    InitFailed,
    Message,
    NvmlEvent,
    Progress,
    Snapshot,
)
from guards.features import FeatureState, Reason
from guards.versions import ModuleReport, SelfCheckResult

T = TypeVar("T")


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
