"""Decoded JSON to typed dataclasses: every field checked against its annotation, once, on receipt.

Both directions of the process boundary use it: the supervisor decodes the worker's messages
(:mod:`exporter.common.snapshot`), the worker decodes its configuration (:mod:`exporter.common.workerconfig`).
:func:`decode_dataclass` builds a dataclass from a JSON object and refuses a missing or unknown
field and a value of the wrong type, with the place named (``snapshot.gpus[0].readings.power.usage_mw:
expected an integer, got 'n/a'``). Annotations understood: ``bool``, ``int``, ``float`` (an integer
is accepted), ``str``, enums (by value), unions and ``X | None``, ``dict``/``Mapping`` (JSON's string
keys become ints where the key type is ``int``), ``tuple[X, ...]`` and fixed tuples (from lists), and
nested dataclasses. Standard library only, so the worker pays nothing for it.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, Union

__all__ = ["DecodeError", "decode_dataclass", "decode_value"]

T = TypeVar("T")


class DecodeError(ValueError):
    """A value that does not fit its annotation; the message names the place."""


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    raise DecodeError(f"{where}: expected true or false, got {value!r}")


def _int(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise DecodeError(f"{where}: expected an integer, got {value!r}")


def _float(value: Any, where: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise DecodeError(f"{where}: expected a number, got {value!r}")


def _str(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    raise DecodeError(f"{where}: expected a string, got {value!r}")


_SCALARS: dict[Any, Callable[[Any, str], Any]] = {bool: _bool, int: _int, float: _float, str: _str}


def _union(tp: Any, value: Any, where: str, complete: bool) -> Any:
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    for option in (a for a in args if a is not type(None)):
        try:
            return decode_value(option, value, where, complete)
        except DecodeError:
            continue
    raise DecodeError(f"{where}: {value!r} is not {tp}")


def _mapping(tp: Any, value: Any, where: str, complete: bool) -> dict[Any, Any]:
    key_t, val_t = typing.get_args(tp)
    if not isinstance(value, dict):
        raise DecodeError(f"{where}: expected an object, got {type(value).__name__}")
    out = {}
    for k, v in value.items():
        key = k
        if key_t is int:  # JSON keys are strings: "3" -> 3
            if not (isinstance(k, str) and k.lstrip("-").isdigit()):
                raise DecodeError(f"{where}: key {k!r} is not an integer")
            key = int(k)
        out[key] = decode_value(val_t, v, f"{where}[{k!r}]", complete)
    return out


def _tuple(tp: Any, value: Any, where: str, complete: bool) -> tuple[Any, ...]:
    args = typing.get_args(tp)
    if not isinstance(value, list):
        raise DecodeError(f"{where}: expected a list, got {type(value).__name__}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(decode_value(args[0], v, f"{where}[{i}]", complete) for i, v in enumerate(value))
    if len(args) != len(value):
        raise DecodeError(f"{where}: expected {len(args)} items, got {len(value)}")
    items = zip(args, value, strict=True)
    return tuple(decode_value(a, v, f"{where}[{i}]", complete) for i, (a, v) in enumerate(items))


def decode_value(tp: Any, value: Any, where: str, complete: bool = False) -> Any:
    """``value`` (decoded JSON) as the annotation ``tp`` says (``complete``: see :func:`decode_dataclass`).

    Raises:
        DecodeError: the value does not fit; the message names ``where``.
    """
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _union(tp, value, where, complete)
    if origin in (dict, Mapping):
        return _mapping(tp, value, where, complete)
    if origin is tuple:
        return _tuple(tp, value, where, complete)
    if tp in _SCALARS:
        return _SCALARS[tp](value, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise DecodeError(f"{where}: {value!r} is not one of {[m.value for m in tp]}") from None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return decode_dataclass(tp, value, where, complete)
    raise DecodeError(f"{where}: no decoder for {tp}")  # a type this module must learn: our bug


def decode_dataclass(cls: type[T], data: Any, where: str, complete: bool = False) -> T:
    """Build ``cls`` from a JSON object, checking every field against its annotation.

    A field with a default may be absent, unless ``complete``: then every field of every nested
    dataclass must be there (a message whose writer always writes every field, such as the
    worker's configuration, so that a field renamed on one side only fails here).

    Raises:
        DecodeError: a missing or unknown field, or a value of the wrong type; the message names
            the place (``where`` and the field).
    """
    if not isinstance(data, dict):
        raise DecodeError(f"{where}: expected an object, got {type(data).__name__}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - names
    if unknown:
        raise DecodeError(f"{where}: unknown field(s) {sorted(unknown)}")
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in data:
            if complete or (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING):
                raise DecodeError(f"{where}: missing field {f.name!r}")
            continue
        kwargs[f.name] = decode_value(hints[f.name], data[f.name], f"{where}.{f.name}", complete)
    return cls(**kwargs)
