"""exporter.common.decode and the snapshot's compiled path: they agree with the reflective path on
every input, and an error still names the field.

The compiled path (decoders made once per class) must accept, convert and refuse exactly what the
reflective path does: on generated inputs that mostly fit each annotation of every collector's
``Reading`` (with wrong values, missing and unknown fields mixed in), and on the real h200x8
snapshot with one value replaced at a time. Outcomes are compared by ``repr`` so that ``1`` and
``1.0`` differ.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

import pytest
from fuzzing import JSON_VALUES, TEXT
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.common import collectors, decode
from exporter.common.collectors import power
from exporter.common.collectors.base import SystemInfo
from exporter.common.decode import (
    DecodeError,
    Mismatch,
    compiled,
    converter,
    decode_dataclass,
    decode_dataclass_reflective,
    decode_value,
    decode_value_reflective,
)
from exporter.common.protocol import ProtocolError
from exporter.common.snapshotdecode import SnapshotDecoder, decode_message, decode_message_reflective

GOLDEN = Path(__file__).resolve().parent / "golden"
READINGS = sorted({c.Reading for c in collectors.COLLECTORS.values()}, key=lambda c: c.__module__)


def _annotations(cls: type, seen: set[Any]) -> None:
    for tp in typing.get_type_hints(cls).values():
        _walk(tp, seen)


def _walk(tp: Any, seen: set[Any]) -> None:
    if tp in seen or tp is type(None):
        return
    seen.add(tp)
    for arg in typing.get_args(tp):
        if arg is not Ellipsis:
            _walk(arg, seen)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        _annotations(tp, seen)


def every_annotation() -> list[Any]:
    seen: set[Any] = set()
    for cls in (*READINGS, SystemInfo):
        _walk(cls, seen)
    for tp in (dict[str, dict[str, float]], tuple[tuple[str, str, int], ...], dict[str, bool], tuple[str, ...]):
        _walk(tp, seen)
    return sorted(seen, key=repr)


ANNOTATIONS = every_annotation()


def fitting(tp: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Values that mostly fit ``tp``, with a wrong JSON value now and then at every level."""
    wrong = JSON_VALUES if depth < 3 else st.none()
    return st.one_of(_fitting(tp, depth), wrong) if depth else _fitting(tp, depth) | wrong


def _fitting(tp: Any, depth: int) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return st.one_of(*[st.none() if a is type(None) else _fitting(a, depth + 1) for a in args])
    if origin in (dict, Mapping):
        keys = (
            st.integers(-5, 99).map(str) | st.sampled_from(["x", "", "1.5", "²", "-", "07"]) if args[0] is int else TEXT
        )
        return st.dictionaries(keys, fitting(args[1], depth + 1), max_size=4)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(fitting(args[0], depth + 1), max_size=4)
        return st.one_of(
            st.tuples(*[fitting(a, depth + 1) for a in args]).map(list),
            st.lists(fitting(args[0], depth + 1), max_size=len(args) + 1),
        )
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers() | st.booleans()
    if tp is float:
        return st.floats() | st.integers()
    if tp is str:
        return TEXT
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from([m.value for m in tp]) | TEXT
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        fields = {f.name: fitting(hints[f.name], depth + 1) for f in dataclasses.fields(tp)}
        extra = st.dictionaries(st.sampled_from(["unknown", "usage"]), JSON_VALUES, max_size=1)
        return st.tuples(st.fixed_dictionaries({}, optional=fields), st.fixed_dictionaries(fields), extra).map(
            lambda t: {**(t[1] if len(t[0]) % 3 else t[0]), **(t[2] if len(t[0]) % 5 == 4 else {})}
        )
    raise AssertionError(f"no strategy for {tp}")


def outcome(fn: Any, *args: Any) -> tuple[str, str]:
    try:
        return "ok", repr(fn(*args))
    except DecodeError as exc:
        return "error", str(exc)


@given(st.data())
def test_compiled_and_reflective_agree_on_every_annotation(data: st.DataObject) -> None:
    tp = data.draw(st.sampled_from(ANNOTATIONS))
    value = data.draw(fitting(tp))
    reflective = outcome(decode_value_reflective, tp, copy.deepcopy(value), "v")
    assert outcome(decode_value, tp, copy.deepcopy(value), "v") == reflective
    try:  # the compiled path alone: refuses exactly where the reflective one does (JSON has no int subclasses)
        fast = ("ok", repr(converter(tp)(copy.deepcopy(value))))
    except (Mismatch, OverflowError):  # OverflowError: float() of a huge integer
        fast = ("refused", "")
    assert fast[0] == ("ok" if reflective[0] == "ok" else "refused"), (tp, value, reflective)
    if fast[0] == "ok":
        assert fast == reflective


@pytest.mark.parametrize("cls", READINGS, ids=lambda c: c.__module__.rsplit(".", 1)[-1])
@settings(max_examples=40)  # per Reading class: 40 x 17 in all
@given(data=st.data())
def test_every_reading_decodes_the_same_on_both_paths(cls: type, data: st.DataObject) -> None:
    value = data.draw(fitting(cls))
    reflective = outcome(decode_dataclass_reflective, cls, copy.deepcopy(value), "r")
    assert outcome(decode_dataclass, cls, copy.deepcopy(value), "r") == reflective
    try:
        fast = ("ok", repr(compiled(cls)(copy.deepcopy(value))))
    except (Mismatch, OverflowError):  # OverflowError: float() of a huge integer
        fast = ("refused", "")
    assert fast[0] == ("ok" if reflective[0] == "ok" else "refused"), (value, reflective)
    if fast[0] == "ok":
        assert fast == reflective


def test_the_complete_mode_requires_every_field_on_both_paths() -> None:
    data = {"usage_mw": 1, "limit_mw": 2, "energy_mj": 3}  # module_usage_mw and memory_usage_mw have defaults
    assert decode_dataclass(power.Reading, data, "power") == power.Reading(1, 2, 3)
    with pytest.raises(DecodeError, match=r"power: missing field 'module_usage_mw'"):
        decode_dataclass(power.Reading, data, "power", complete=True)


def test_a_wrong_field_is_named() -> None:
    good = {"usage_mw": 85000, "limit_mw": 700000, "energy_mj": 1}
    with pytest.raises(DecodeError, match=r"^snapshot.power.usage_mw: 'n/a' is not int \| None$"):
        decode_dataclass(power.Reading, {**good, "usage_mw": "n/a"}, "snapshot.power")
    with pytest.raises(DecodeError, match=r"unknown field\(s\) \['usage_watts'\]"):
        decode_dataclass(power.Reading, {**good, "usage_watts": 85.0}, "snapshot.power")


def test_a_non_ascii_digit_key_is_a_decode_error() -> None:
    """``"²".isdigit()`` is true but ``int("²")`` raises: both paths name the key."""
    with pytest.raises(DecodeError, match=r"m: key '²' is not an integer"):
        decode_value(dict[int, int], {"²": 1}, "m")
    assert decode_value(dict[int, int], {"-3": 1, "07": 2}, "m") == {-3: 1, 7: 2}


def test_the_good_path_is_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fitting reading never reaches the reflective path (which would be the slow one)."""

    def slow(*_args: Any, **_kw: Any) -> Any:
        raise AssertionError("the reflective path ran")

    monkeypatch.setattr(decode, "decode_dataclass_reflective", slow)
    monkeypatch.setattr(decode, "decode_value_reflective", slow)
    data = {"usage_mw": 85000, "limit_mw": 700000, "energy_mj": 2445309, "module_usage_mw": None}
    assert decode_dataclass(power.Reading, data, "power") == power.Reading(85000, 700000, 2445309)
    assert "def decode(data):" in compiled(power.Reading).source  # type: ignore[attr-defined]


def test_an_unknown_annotation_is_still_refused_by_name() -> None:
    @dataclasses.dataclass(frozen=True)
    class Odd:
        when: complex

    with pytest.raises(DecodeError, match=r"odd.when: no decoder for <class 'complex'>"):
        decode_dataclass(Odd, {"when": 1}, "odd")


# -- the snapshot --------------------------------------------------------------------------------


def _golden_snapshot() -> dict[str, Any]:
    messages = json.loads((GOLDEN / "h200x8.snapshot.json").read_text())["messages"]
    msg: dict[str, Any] = next(m for m in messages if m["type"] == "snapshot")
    return msg


SNAPSHOT = _golden_snapshot()


def snapshot_outcome(decode_fn: Any, msg: dict[str, Any]) -> tuple[str, str]:
    try:
        return "ok", repr(decode_fn(copy.deepcopy(msg)))
    except ProtocolError as exc:
        return "error", str(exc)


def _places(msg: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Every place one value can be replaced: snapshot fields, GPU fields, reading fields."""
    out: list[tuple[Any, ...]] = [(k,) for k in msg if k not in ("type", "v")]
    for gi, gpu in enumerate(msg["gpus"]):
        out += [("gpus", gi, k) for k in gpu if k != "readings"]
        for feature, reading in gpu["readings"].items():
            out += [("gpus", gi, "readings", feature, k) for k in [*reading, "no_such_field"]]
    return out


PLACES = _places(SNAPSHOT)
_DELETE = object()


@given(place=st.sampled_from(PLACES), value=st.one_of(JSON_VALUES, st.just(_DELETE)), primed=st.booleans())
def test_a_snapshot_decodes_the_same_on_both_paths(place: tuple[Any, ...], value: Any, primed: bool) -> None:
    msg = copy.deepcopy(SNAPSHOT)
    *parents, last = place
    target = msg
    for key in parents:
        target = target[key]
    if value is _DELETE:
        target.pop(last, None)
    else:
        target[last] = value
    decoder = SnapshotDecoder()
    if primed:  # the memo holds the unchanged snapshot's readings: a changed one is not reused
        decoder.decode_message(copy.deepcopy(SNAPSHOT))
    assert snapshot_outcome(decoder.decode_message, msg) == snapshot_outcome(decode_message_reflective, msg)


def test_a_reading_that_does_not_fit_is_undecodable_on_the_compiled_path() -> None:
    msg = copy.deepcopy(SNAPSHOT)
    msg["gpus"][3]["readings"]["power"]["usage_mw"] = "n/a"
    snap = SnapshotDecoder().decode_message(msg)
    assert snap == decode_message_reflective(copy.deepcopy(msg))
    assert snap.undecodable == frozenset({"power"})  # type: ignore[union-attr]
    assert "power" not in snap.gpus[3].readings and "power" in snap.gpus[2].readings  # type: ignore[union-attr]


def test_repeated_readings_are_reused_and_changed_ones_decoded() -> None:
    decoder = SnapshotDecoder()
    first = decoder.decode_message(copy.deepcopy(SNAPSHOT))
    msg = copy.deepcopy(SNAPSHOT)
    msg["gpus"][0]["readings"]["power"]["usage_mw"] += 1
    second = decoder.decode_message(msg)
    assert second == decode_message(copy.deepcopy(msg))
    a, b = first.gpus, second.gpus  # type: ignore[union-attr]
    assert b[1].readings["power"] is a[1].readings["power"]  # equal JSON: the same object again
    assert b[0].readings["power"] is not a[0].readings["power"]
    assert b[0].readings["power"].usage_mw == a[0].readings["power"].usage_mw + 1  # type: ignore[attr-defined]
    assert decoder.reused == sum(len(g.readings) for g in b) - 1


def test_without_memo_nothing_is_kept() -> None:
    decoder = SnapshotDecoder(memo=False)
    first = decoder.decode_message(copy.deepcopy(SNAPSHOT))
    second = decoder.decode_message(copy.deepcopy(SNAPSHOT))
    assert first == second and decoder.reused == 0
    assert second.gpus[0].readings["power"] is not first.gpus[0].readings["power"]  # type: ignore[union-attr]
