"""Issue 30 prototype (a): the snapshot decoded by functions compiled once per dataclass.

Not product code. ``exporter/common/snapshot.py`` decodes each snapshot reflectively: for every field of
every reading of every GPU it asks ``typing.get_origin`` / ``get_args`` what the annotation is,
walks ``dataclasses.fields`` twice and builds a ``where`` string for the error message it might
need. This prototype keeps the same rules and builds, once per class, a Python function (source
generated from the annotations and ``exec``-ed) that checks each field inline (``type(v) is int``,
``v is None or …``) and calls small converters made once per annotation for containers. It builds
no message on the good path: on the first value that does not fit, it stops and asks the
reflective decoder, which raises the exact error it raises today, naming the field, or (for a
reading) lets the feature be listed as undecodable as today. So the compiled path accepts exactly
what the reflective one accepts (checked below), and errors read the same.

What it measures on real snapshot lines of the worker (``bench/capture.py``: h200x8 on the fake,
1 s apart), in CPU time of this process (``time.process_time``, best of ``--repeat`` rounds: the
machine is shared):

* ``json.loads`` of a line (``exporter.common.protocol.decode``), the same for both;
* ``exporter.common.snapshotdecode.decode_message`` (reflective) against :func:`decode_message` here (compiled);
* equivalence: every captured snapshot decodes to an equal ``Snapshot``; then every field of every
  reading of one snapshot, and the snapshot's and each GPU's own fields, are replaced in turn by
  each value of :data:`MUTATIONS` (plus a missing field and an unknown one): both decoders must
  agree on the outcome (the same ``Snapshot``, the same ``undecodable`` set, or a ``ProtocolError``
  with the same message).

``python bench/proto_decode.py [--lines FILE] [--repeat 7] [--json OUT]``
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import enum
import json
import statistics
import sys
import time
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Union

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import capture  # noqa: E402

from exporter.common import collectors, protocol, snapshot, snapshotdecode  # noqa: E402
from exporter.common.decode import DecodeError  # noqa: E402
from exporter.common.protocol import ProtocolError  # noqa: E402
from guards.features import FeatureState, Reason  # noqa: E402


class _Fail(Exception):
    """A value that does not fit; carries no message (the reflective decoder makes it)."""


_FAIL = _Fail()
Conv = Callable[[Any], Any]
_CONVERTERS: dict[Any, Conv] = {}
_DECODERS: dict[type, Conv] = {}
_MISSING = object()


def _c_bool(v: Any) -> bool:
    if v is True or v is False:
        return bool(v)
    raise _FAIL


def _c_int(v: Any) -> int:
    if type(v) is int:
        return v
    raise _FAIL


def _c_float(v: Any) -> float:
    t = type(v)
    if t is float:
        return v  # type: ignore[no-any-return]
    if t is int:
        return float(v)
    raise _FAIL


def _c_str(v: Any) -> str:
    if type(v) is str:
        return v
    raise _FAIL


_SCALARS: dict[Any, Conv] = {bool: _c_bool, int: _c_int, float: _c_float, str: _c_str}


def converter(tp: Any) -> Conv:
    """A function checking and converting a decoded-JSON value to the annotation ``tp`` (made once)."""
    try:
        return _CONVERTERS[tp]
    except (KeyError, TypeError):
        pass
    conv = _make(tp)
    _CONVERTERS[tp] = conv
    return conv


def _make(tp: Any) -> Conv:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        nullable = type(None) in args
        options = [converter(a) for a in args if a is not type(None)]
        if len(options) == 1:
            only = options[0]

            def optional(v: Any) -> Any:
                return None if v is None else only(v)

            return optional if nullable else only

        def union(v: Any) -> Any:
            if v is None and nullable:
                return None
            for option in options:
                try:
                    return option(v)
                except _Fail:
                    continue
            raise _FAIL

        return union
    if origin in (dict, Mapping):
        key_t, val_t = typing.get_args(tp)
        val = converter(val_t)
        if key_t is int:

            def int_keys(v: Any) -> dict[int, Any]:
                if type(v) is not dict:
                    raise _FAIL
                out = {}
                for k, x in v.items():
                    if not (type(k) is str and k.lstrip("-").isdigit()):
                        raise _FAIL
                    try:
                        key = int(k)
                    except ValueError:  # a non-ASCII digit: the reflective decoder decides
                        raise _FAIL from None
                    out[key] = val(x)
                return out

            return int_keys

        def str_keys(v: Any) -> dict[Any, Any]:
            if type(v) is not dict:
                raise _FAIL
            return {k: val(x) for k, x in v.items()}

        return str_keys
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            item = converter(args[0])

            def var_tuple(v: Any) -> tuple[Any, ...]:
                if type(v) is not list:
                    raise _FAIL
                return tuple([item(x) for x in v])

            return var_tuple
        items = [converter(a) for a in args]
        n = len(items)

        def fixed_tuple(v: Any) -> tuple[Any, ...]:
            if type(v) is not list or len(v) != n:
                raise _FAIL
            return tuple([c(x) for c, x in zip(items, v, strict=True)])

        return fixed_tuple
    if tp in _SCALARS:
        return _SCALARS[tp]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        cls = tp

        def enum_value(v: Any) -> Any:
            try:
                return cls(v)
            except ValueError:
                raise _FAIL from None

        return enum_value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return compiled(tp)
    raise TypeError(f"no decoder for {tp}")  # as the reflective decoder: a type to learn


# Inline checks for the commonest annotations: (statement with {v}) ; anything else calls a converter.
_INLINE: dict[Any, str] = {
    int: "if type({v}) is not int: raise _FAIL",
    str: "if type({v}) is not str: raise _FAIL",
    bool: "if {v} is not True and {v} is not False: raise _FAIL",
    float: "if type({v}) is int: {v} = float({v})\n    elif type({v}) is not float: raise _FAIL",
    int | None: "if {v} is not None and type({v}) is not int: raise _FAIL",
    str | None: "if {v} is not None and type({v}) is not str: raise _FAIL",
    bool | None: "if {v} is not None and {v} is not True and {v} is not False: raise _FAIL",
}


def compiled(cls: type) -> Conv:
    """The decoder of dataclass ``cls``: generated source, compiled once; raises :class:`_Fail`."""
    have = _DECODERS.get(cls)
    if have is not None:
        return have

    # a placeholder breaks recursion for self-referencing classes
    def pending(v: Any) -> Any:
        return _DECODERS[cls](v)

    _DECODERS[cls] = pending
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    ns: dict[str, Any] = {"_FAIL": _FAIL, "_MISSING": _MISSING, "cls": cls}
    ns["NAMES"] = frozenset(f.name for f in fields)
    lines = ["def decode(data):", "    if type(data) is not dict or not data.keys() <= NAMES: raise _FAIL"]
    args = []
    for i, f in enumerate(fields):
        v = f"v{i}"
        args.append(v)
        lines.append(f"    {v} = data.get({f.name!r}, _MISSING)")
        lines.append(f"    if {v} is _MISSING:")
        if f.default is not dataclasses.MISSING:
            ns[f"d{i}"] = f.default
            lines.append(f"        {v} = d{i}")
        elif f.default_factory is not dataclasses.MISSING:
            ns[f"d{i}"] = f.default_factory
            lines.append(f"        {v} = d{i}()")
        else:
            lines.append("        raise _FAIL")
        tp = hints[f.name]
        inline = _INLINE.get(tp)
        lines.append("    else:")
        if inline is not None:
            lines.append("        " + inline.format(v=v).replace("\n    ", "\n        "))
        else:
            ns[f"c{i}"] = converter(tp)
            lines.append(f"        {v} = c{i}({v})")
    lines.append(f"    return cls({', '.join(args)})")
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<decoder of {cls.__qualname__}>", "exec"), ns)  # noqa: S102 - our own source
    decode: Conv = ns["decode"]
    decode.source = source  # type: ignore[attr-defined]
    _DECODERS[cls] = decode
    return decode


# -- the snapshot, mirroring exporter/common/snapshot.py's _snapshot and _gpu -----------------------------

_FEATURES = converter(dict[str, dict[str, float]])
_ERRORS = converter(tuple[tuple[str, str, int], ...])
_EVENTS = converter(dict[str, bool])
_UNSUPPORTED = converter(tuple[str, ...])
_SYSTEM = compiled(snapshot.SystemInfo)
_READERS = {name: (compiled(c.Reading), c.Reading) for name, c in collectors.COLLECTORS.items()}


def _states(raw: Any) -> dict[str, FeatureState]:
    if type(raw) is not dict:
        raise _FAIL
    out = {}
    for name, st in raw.items():
        if type(st) is not dict:
            raise _FAIL
        enabled = st.get("enabled")
        if enabled is not True and enabled is not False:
            raise _FAIL
        try:
            reason = Reason(st.get("reason"))
        except ValueError:
            raise _FAIL from None
        detail = st.get("detail", "")
        if type(detail) is not str:
            raise _FAIL
        out[name] = FeatureState(name, enabled, reason, detail)
    return out


Memo = tuple[dict[tuple[int, str], tuple[Any, Any]], dict[tuple[int, str], tuple[Any, Any]], Any]


def _gpu(raw: Any, where: str, undecodable: set[str], memo: Memo | None = None, i: int = 0) -> snapshot.GpuSample:
    if type(raw) is not dict:
        raise _FAIL
    raw_readings = raw.get("readings", {})
    if type(raw_readings) is not dict:
        raise _FAIL
    readings: dict[str, object] = {}
    for feature, data in raw_readings.items():
        reader = _READERS.get(feature)
        if reader is None:
            undecodable.add(feature)
            continue
        if memo is not None:
            have = memo[0].get((i, feature))
            if have is not None and have[0] == data:
                readings[feature] = have[1]
                memo[1][(i, feature)] = have
                memo[2].hits += 1
                continue
            memo[2].misses += 1
        try:
            readings[feature] = reader[0](data)
            if memo is not None:
                memo[1][(i, feature)] = (data, readings[feature])
        except _Fail:  # as today: that reading is left out, the feature listed (the slow path decides)
            try:
                readings[feature] = snapshot.decode_dataclass(reader[1], data, f"{where}.readings.{feature}")
            except DecodeError:  # exactly what the reflective _gpu catches
                undecodable.add(feature)
    state = raw.get("state")
    if type(state) is not str or state not in snapshot.GPU_STATES:
        raise _FAIL
    index, uuid = raw.get("index"), raw.get("uuid")
    detail, feature, function = raw.get("detail", ""), raw.get("feature", ""), raw.get("function", "")
    sampled_at = raw.get("sampled_at")
    if type(sampled_at) is int:
        sampled_at = float(sampled_at)
    if (
        type(index) is not int
        or type(uuid) is not str
        or type(detail) is not str
        or type(feature) is not str
        or type(function) is not str
        or (sampled_at is not None and type(sampled_at) is not float)
    ):
        raise _FAIL
    return snapshot.GpuSample(
        index=index,
        uuid=uuid,
        state=state,
        readings=readings,
        sampled_at=sampled_at,
        detail=detail,
        unsupported=_UNSUPPORTED(raw.get("unsupported", [])),
        feature=feature,
        function=function,
    )


def _snapshot(msg: dict[str, Any], memo: Memo | None = None) -> snapshot.Snapshot:
    undecodable: set[str] = set()
    gpus = msg.get("gpus")
    if type(gpus) is not list:
        raise _FAIL
    features = _FEATURES(msg.get("features", {}))
    errors = _ERRORS(msg.get("errors", []))
    ts, duration, calls = msg.get("ts"), msg.get("duration_s"), msg.get("calls", 0)
    ts = _c_float(ts)
    duration = _c_float(duration)
    if type(calls) is not int:
        raise _FAIL
    return snapshot.Snapshot(
        ts=ts,
        duration_s=duration,
        system=_SYSTEM(msg.get("system", {})),
        gpus=tuple([_gpu(g, f"snapshot.gpus[{i}]", undecodable, memo, i) for i, g in enumerate(gpus)]),
        features={
            f: snapshot.FeatureStat(bool(s.get("success", 0)), float(s.get("duration_s", 0.0)))
            for f, s in features.items()
        },
        feature_states=_states(msg.get("feature_states", {})),
        errors={(f, n): c for f, n, c in errors},
        calls=calls,
        events_enabled=_EVENTS(msg.get("events_enabled", {})),
        undecodable=frozenset(undecodable),
    )


def decode_message(msg: dict[str, Any]) -> snapshot.Message:
    """As :func:`exporter.common.snapshotdecode.decode_message`; snapshots take the compiled path."""
    if msg.get("type") != "snapshot":
        return snapshotdecode.decode_message(msg)
    try:
        return _snapshot(msg)
    except (_Fail, KeyError, TypeError, AttributeError, ValueError):
        pass
    # the slow path names the field; that it accepts what the fast path refused would be our bug
    result = snapshotdecode.decode_message(msg)
    raise AssertionError(f"compiled decoder refused a snapshot the reflective one accepts: {result!r:.300}")


class MemoDecoder:
    """The compiled decoder, plus: a GPU's reading whose JSON object equals (``==``, done in C) the
    one this decoder saw for the same GPU index and feature in the previous snapshot is not decoded
    again: the reading decoded then is reused (the same object, which also lets a renderer's cache
    compare readings by identity). About three readings in four repeat between two samples on
    h200x8 at 1 s (``bench/proto_render.py --changes``)."""

    def __init__(self) -> None:
        self.last: dict[tuple[int, str], tuple[Any, Any]] = {}
        self.hits = self.misses = 0

    def decode_message(self, msg: dict[str, Any]) -> snapshot.Message:
        if msg.get("type") != "snapshot":
            return snapshotdecode.decode_message(msg)
        keep: dict[tuple[int, str], tuple[Any, Any]] = {}
        try:
            result = _snapshot(msg, (self.last, keep, self))
        except (_Fail, KeyError, TypeError, AttributeError, ValueError):
            return decode_message(msg)  # the full path decides and names the problem
        self.last = keep
        return result


# -- measurement ---------------------------------------------------------------------------------


def cpu_per_call(fn: Callable[[], Any], repeat: int, min_s: float = 0.2) -> dict[str, float]:
    """CPU seconds per call of ``fn`` (best and median of ``repeat`` rounds of at least ``min_s``)."""
    n = 1
    while True:
        t0 = time.process_time()
        for _ in range(n):
            fn()
        if time.process_time() - t0 >= min_s / 4:
            break
        n *= 2
    rounds = []
    for _ in range(repeat):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        rounds.append((time.process_time() - t0) / n)
    return {"best_ms": round(1000 * min(rounds), 4), "median_ms": round(1000 * statistics.median(rounds), 4)}


MUTATIONS: tuple[Any, ...] = ("x", "", 1.5, 7, -3, True, None, [], [1], {}, {"a": 1}, {"1": "x"}, {"-2": 3})


def _outcome(decode: Callable[[dict[str, Any]], Any], msg: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "ok", decode(copy.deepcopy(msg))
    except ProtocolError as exc:
        return "error", str(exc)
    except Exception as exc:  # noqa: BLE001 - compared, not hidden
        return "raised", f"{type(exc).__name__}: {exc}"


def equivalence(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The reflective, compiled and memo (primed with the first snapshot) decoders on the captured
    snapshots and on mutated copies of the first one."""
    cases = agree = 0
    disagreements: list[str] = []

    def check(msg: dict[str, Any], label: str) -> None:
        nonlocal cases, agree
        cases += 1
        m = MemoDecoder()
        m.last = dict(primed.last)
        a, b, c = (
            _outcome(snapshotdecode.decode_message, msg),
            _outcome(decode_message, msg),
            _outcome(m.decode_message, msg),
        )
        if a == b == c:
            agree += 1
        elif len(disagreements) < 20:
            disagreements.append(f"{label}: reflective {a!r:.200} / compiled {b!r:.200} / memo {c!r:.200}")

    primed = MemoDecoder()  # has seen the first snapshot: its readings are reused when repeated
    primed.decode_message(copy.deepcopy(messages[0]))

    for i, msg in enumerate(messages):
        check(msg, f"captured[{i}]")
    base = messages[0]
    for gi, gpu in enumerate(base["gpus"]):
        for feature, reading in gpu["readings"].items():
            for name in [*reading, "no_such_field"]:
                for value in (*MUTATIONS, _MISSING):
                    msg = copy.deepcopy(base)
                    r = msg["gpus"][gi]["readings"][feature]
                    if value is _MISSING:
                        r.pop(name, None)
                    else:
                        r[name] = value
                    check(msg, f"gpus[{gi}].readings.{feature}.{name}={value!r}")
        for name in list(gpu):
            if name == "readings":
                continue
            for value in (*MUTATIONS, _MISSING):
                msg = copy.deepcopy(base)
                if value is _MISSING:
                    msg["gpus"][gi].pop(name)
                else:
                    msg["gpus"][gi][name] = value
                check(msg, f"gpus[{gi}].{name}={value!r}")
    for name in [k for k in base if k not in ("type", "v", "gpus")]:
        for value in (*MUTATIONS, _MISSING):
            msg = copy.deepcopy(base)
            if value is _MISSING:
                msg.pop(name)
            else:
                msg[name] = value
            check(msg, f"{name}={value!r}")
    return {"cases": cases, "agree": agree, "disagreements": disagreements}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="prototype (a): compiled snapshot decoder vs the reflective one")
    p.add_argument("--lines", help="worker lines captured by bench/capture.py (default: capture 20 now)")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--json", help="write the result here")
    p.add_argument("--show-source", help="print the generated decoder of this feature's Reading")
    args = p.parse_args(argv)
    lines = capture.snapshots(capture.load_or_capture(args.lines, 20))
    messages = [protocol.decode(ln) for ln in lines]
    if args.show_source:
        print(compiled(collectors.COLLECTORS[args.show_source].Reading).source)  # type: ignore[attr-defined]
    eq = equivalence(messages)
    print(f"equivalence: {eq['agree']}/{eq['cases']} cases agree")
    for d in eq["disagreements"]:
        print("  DIFFERS", d)

    def each(fn: Callable[[Any], Any], items: list[Any]) -> Callable[[], None]:
        def run() -> None:
            for x in items:
                fn(x)

        return run

    k = len(lines)
    t_json = cpu_per_call(each(protocol.decode, lines), args.repeat)
    t_reflective = cpu_per_call(each(snapshotdecode.decode_message, messages), args.repeat)
    t_compiled = cpu_per_call(each(decode_message, messages), args.repeat)
    # the worker's side of the same snapshots: Snapshot.to_wire + protocol.encode (json.dumps)
    snaps = [snapshotdecode.decode_message(m) for m in messages]
    t_to_wire = cpu_per_call(each(lambda sn: sn.to_wire(), snaps), args.repeat)
    wires = [sn.to_wire() for sn in snaps]
    t_encode = cpu_per_call(each(lambda w: protocol.encode("snapshot", **w), wires), args.repeat)
    # a wire that leaves out readings equal to the previous snapshot's (what a delta protocol would send)
    delta_bytes = []
    for prev, cur in zip(messages, messages[1:], strict=False):
        d = copy.deepcopy(cur)
        for g, pg in zip(d["gpus"], prev["gpus"], strict=True):
            g["readings"] = {f: r for f, r in g["readings"].items() if pg["readings"].get(f) != r}
        delta_bytes.append(len(json.dumps(d, separators=(",", ":"))))
    memo = MemoDecoder()
    memo_equal = all(memo.decode_message(m) == snapshotdecode.decode_message(m) for m in messages)
    fresh = MemoDecoder()
    t_memo = cpu_per_call(each(fresh.decode_message, messages), args.repeat)
    per = {
        name: {key: round(v / k, 4) for key, v in t.items()}
        for name, t in (
            ("json_loads", t_json),
            ("reflective", t_reflective),
            ("compiled", t_compiled),
            ("compiled + memo", t_memo),
        )
    }
    speedup = per["reflective"]["best_ms"] / per["compiled"]["best_ms"]
    result = {
        "snapshots": k,
        "snapshot_bytes": [min(map(len, lines)), max(map(len, lines))],
        "cpu_ms_per_snapshot": per,
        "speedup_best": round(speedup, 2),
        "worker_side_cpu_ms_per_snapshot": {
            "to_wire": {key: round(v / k, 4) for key, v in t_to_wire.items()},
            "protocol.encode (json.dumps)": {key: round(v / k, 4) for key, v in t_encode.items()},
        },
        "wire_bytes_full_vs_without_repeated_readings": {
            "full_median": statistics.median(map(len, lines)),
            "without_repeats_median": statistics.median(delta_bytes),
        },
        "memo": {
            "equal_to_reflective": memo_equal,
            "readings_reused": memo.hits,
            "readings_decoded": memo.misses,
            "note": "memo timed over the captured sequence in order, repeated (one big change at each wrap)",
        },
        "equivalence": eq,
    }
    for name, t in per.items():
        print(f"{name:>11}: {t['best_ms']:.3f} ms per snapshot (median {t['median_ms']:.3f})")
    print(f"compiled is {speedup:.1f}x faster than reflective (best of {args.repeat})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"memo: equal to reflective on every snapshot: {memo_equal}; reused {memo.hits}, decoded {memo.misses}")
    return 0 if eq["agree"] == eq["cases"] and memo_equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
