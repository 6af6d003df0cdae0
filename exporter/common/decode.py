"""Decoded JSON to typed dataclasses: every field checked against its annotation, once, on receipt.

Both directions of the process boundary use it: the supervisor decodes the worker's messages
(:mod:`exporter.common.snapshot`), the worker decodes its configuration (:mod:`exporter.common.workerconfig`).
:func:`decode_dataclass` builds a dataclass from a JSON object and refuses a missing or unknown
field and a value of the wrong type, with the place named (``snapshot.gpus[0].readings.power.usage_mw:
expected an integer, got 'n/a'``). Annotations understood: ``bool``, ``int``, ``float`` (an integer
is accepted), ``str``, enums (by value), unions and ``X | None``, ``dict``/``Mapping`` (JSON's string
keys become ints where the key type is ``int``), ``tuple[X, ...]`` and fixed tuples (from lists), and
nested dataclasses. Standard library only, so the worker pays nothing for it.

Two paths, one set of rules. The **compiled** path (:func:`compiled`, :func:`converter`) is made
once per dataclass and annotation: for a dataclass, Python source generated from its annotations
(inline ``type(v) is int`` checks, converters made once for containers) and compiled, as
:mod:`dataclasses` makes ``__init__``; it builds no error message and stops at the first value that
does not fit. The **reflective** path (:func:`decode_dataclass_reflective`) walks the annotations on
every call and names the place of a problem. :func:`decode_dataclass` and :func:`decode_value` take
the compiled path and, on the first value it refuses, run the reflective one on the same input, so
a value is accepted, converted and refused exactly as the reflective path says, and every error
reads the same (``tests/test_decode.py`` holds both to agreement on generated inputs).
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, Union

__all__ = [
    "DecodeError",
    "compiled",
    "converter",
    "decode_dataclass",
    "decode_dataclass_reflective",
    "decode_value",
    "decode_value_reflective",
]

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
        try:
            return float(value)
        except OverflowError:  # JSON integers have no bound
            raise DecodeError(f"{where}: an integer of {len(str(value))} digits is beyond a float") from None
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
            return decode_value_reflective(option, value, where, complete)
        except DecodeError:
            continue
    raise DecodeError(f"{where}: {value!r} is not {tp}")


def _is_int_key(k: str) -> bool:
    """An optional ``-`` and ASCII digits (``str.isdigit`` alone also takes ``"²"``, which ``int`` refuses)."""
    digits = k[1:] if k.startswith("-") else k
    return digits.isascii() and digits.isdigit()


def _mapping(tp: Any, value: Any, where: str, complete: bool) -> dict[Any, Any]:
    key_t, val_t = typing.get_args(tp)
    if not isinstance(value, dict):
        raise DecodeError(f"{where}: expected an object, got {type(value).__name__}")
    out = {}
    for k, v in value.items():
        key = k
        if key_t is int:  # JSON keys are strings: "3" -> 3
            if not (isinstance(k, str) and _is_int_key(k)):
                raise DecodeError(f"{where}: key {k!r} is not an integer")
            key = int(k)
        out[key] = decode_value_reflective(val_t, v, f"{where}[{k!r}]", complete)
    return out


def _tuple(tp: Any, value: Any, where: str, complete: bool) -> tuple[Any, ...]:
    args = typing.get_args(tp)
    if not isinstance(value, list):
        raise DecodeError(f"{where}: expected a list, got {type(value).__name__}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(decode_value_reflective(args[0], v, f"{where}[{i}]", complete) for i, v in enumerate(value))
    if len(args) != len(value):
        raise DecodeError(f"{where}: expected {len(args)} items, got {len(value)}")
    items = zip(args, value, strict=True)
    return tuple(decode_value_reflective(a, v, f"{where}[{i}]", complete) for i, (a, v) in enumerate(items))


def decode_value_reflective(tp: Any, value: Any, where: str, complete: bool = False) -> Any:
    """:func:`decode_value` on the reflective path only (the annotation walked on every call)."""
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
        return decode_dataclass_reflective(tp, value, where, complete)
    raise DecodeError(f"{where}: no decoder for {tp}")  # a type this module must learn: our bug


def decode_dataclass_reflective(cls: type[T], data: Any, where: str, complete: bool = False) -> T:
    """:func:`decode_dataclass` on the reflective path only: it names the place of a problem."""
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
        kwargs[f.name] = decode_value_reflective(hints[f.name], data[f.name], f"{where}.{f.name}", complete)
    return cls(**kwargs)


def decode_value(tp: Any, value: Any, where: str, complete: bool = False) -> Any:
    """``value`` (decoded JSON) as the annotation ``tp`` says (``complete``: see :func:`decode_dataclass`).

    Raises:
        DecodeError: the value does not fit; the message names ``where``.
    """
    try:
        return converter(tp, complete)(value)
    except (Mismatch, OverflowError):  # OverflowError: float() of a huge integer
        return decode_value_reflective(tp, value, where, complete)


def decode_dataclass(cls: type[T], data: Any, where: str, complete: bool = False) -> T:
    """Build ``cls`` from a JSON object, checking every field against its annotation.

    A field with a default may be absent, unless ``complete``: then every field of every nested
    dataclass must be there (a message whose writer always writes every field, such as the
    worker's configuration, so that a field renamed on one side only fails here).

    Raises:
        DecodeError: a missing or unknown field, or a value of the wrong type; the message names
            the place (``where`` and the field).
    """
    try:
        out: T = compiled(cls, complete)(data)
        return out
    except (Mismatch, OverflowError):  # OverflowError: float() of a huge integer
        return decode_dataclass_reflective(cls, data, where, complete)


# -- the compiled path ---------------------------------------------------------------------------


class Mismatch(Exception):
    """A value the compiled path does not take; no message: the reflective path makes it."""


_MISMATCH = Mismatch()
_MISSING = object()
Conv = Callable[[Any], Any]
_CONVERTERS: dict[tuple[Any, bool], Conv] = {}
_COMPILED: dict[tuple[type, bool], Conv] = {}


def _c_bool(v: Any) -> bool:
    if v is True or v is False:
        return bool(v)
    raise _MISMATCH


def _c_int(v: Any) -> int:
    if type(v) is int:
        return v
    raise _MISMATCH


def _c_float(v: Any) -> float:
    if type(v) is float:
        return v
    if type(v) is int:
        return float(v)
    raise _MISMATCH


def _c_str(v: Any) -> str:
    if type(v) is str:
        return v
    raise _MISMATCH


_C_SCALARS: dict[Any, Conv] = {bool: _c_bool, int: _c_int, float: _c_float, str: _c_str}


def converter(tp: Any, complete: bool = False) -> Conv:
    """The compiled check-and-convert function of annotation ``tp``, made once.

    It returns what :func:`decode_value_reflective` returns, or raises :class:`Mismatch` (or
    ``OverflowError`` for an integer beyond a float; never a :class:`DecodeError`) where that would
    raise; it may also refuse a value the reflective path takes (an ``int`` subclass), which
    :func:`decode_value` then decodes reflectively. For an annotation this module does not know, it
    refuses every value (the reflective path then says so).
    """
    key = (tp, complete)
    try:
        return _CONVERTERS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable annotation: made again each time, still correct
        return _make(tp, complete)
    conv = _CONVERTERS[key] = _make(tp, complete)
    return conv


def _make(tp: Any, complete: bool) -> Conv:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _make_union(tp, complete)
    if origin in (dict, Mapping):
        return _make_mapping(tp, complete)
    if origin is tuple:
        return _make_tuple(tp, complete)
    if tp in _C_SCALARS:
        return _C_SCALARS[tp]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        kind = tp

        def enum_value(v: Any) -> Any:
            try:
                return kind(v)
            except ValueError:
                raise _MISMATCH from None

        return enum_value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return compiled(tp, complete)
    return _refuse  # a type this module must learn: the reflective path says "no decoder"


def _make_union(tp: Any, complete: bool) -> Conv:
    args = typing.get_args(tp)
    nullable = type(None) in args
    options = [converter(a, complete) for a in args if a is not type(None)]
    if len(options) == 1 and nullable:
        only = options[0]

        def optional(v: Any) -> Any:
            return None if v is None else only(v)

        return optional

    def union(v: Any) -> Any:
        if v is None and nullable:
            return None
        for option in options:
            try:
                return option(v)
            except Mismatch:
                continue
        raise _MISMATCH

    return union


def _make_mapping(tp: Any, complete: bool) -> Conv:
    key_t, val_t = typing.get_args(tp)
    val = converter(val_t, complete)
    if key_t is int:

        def int_keys(v: Any) -> dict[int, Any]:
            if type(v) is not dict:
                raise _MISMATCH
            out = {}
            for k, x in v.items():  # as _is_int_key, inline (one call per key: a link index each)
                if type(k) is not str or not (
                    (k.isdigit() and k.isascii()) or (k[:1] == "-" and k[1:].isdigit() and k.isascii())
                ):
                    raise _MISMATCH
                out[int(k)] = val(x)
            return out

        return int_keys

    def other_keys(v: Any) -> dict[Any, Any]:
        if type(v) is not dict:
            raise _MISMATCH
        return {k: val(x) for k, x in v.items()}

    return other_keys


def _make_tuple(tp: Any, complete: bool) -> Conv:
    args = typing.get_args(tp)
    if len(args) == 2 and args[1] is Ellipsis:
        item = converter(args[0], complete)

        def var_tuple(v: Any) -> tuple[Any, ...]:
            if type(v) is not list:
                raise _MISMATCH
            return tuple([item(x) for x in v])

        return var_tuple
    items = [converter(a, complete) for a in args]
    n = len(items)

    def fixed_tuple(v: Any) -> tuple[Any, ...]:
        if type(v) is not list or len(v) != n:
            raise _MISMATCH
        return tuple([c(x) for c, x in zip(items, v, strict=True)])

    return fixed_tuple


# The commonest annotations are checked inline in the generated source ({v}: the field's local).
_INLINE: dict[Any, str] = {
    int: "if type({v}) is not int: raise _MISMATCH",
    str: "if type({v}) is not str: raise _MISMATCH",
    bool: "if {v} is not True and {v} is not False: raise _MISMATCH",
    float: "if type({v}) is int: {v} = float({v})\nelif type({v}) is not float: raise _MISMATCH",
    int | None: "if {v} is not None and type({v}) is not int: raise _MISMATCH",
    str | None: "if {v} is not None and type({v}) is not str: raise _MISMATCH",
    bool | None: "if {v} is not None and {v} is not True and {v} is not False: raise _MISMATCH",
    float
    | None: "if type({v}) is int: {v} = float({v})\nelif {v} is not None and type({v}) is not float: raise _MISMATCH",
}


def compiled(cls: type[T], complete: bool = False) -> Callable[[Any], T]:
    """The compiled decoder of dataclass ``cls`` (``complete``: see :func:`decode_dataclass`), made
    once: a function of a decoded JSON object that returns ``cls(...)`` or raises :class:`Mismatch`.

    The generated source is kept on the function as ``source`` (to read it when debugging).
    A dataclass whose fields cannot all be passed to ``__init__`` in order (``init=False``,
    keyword-only) gets a decoder that always answers :class:`Mismatch`: the reflective path decodes it.
    """
    key = (cls, complete)
    have = _COMPILED.get(key)
    if have is not None:
        return have

    def pending(v: Any) -> Any:  # a class that contains itself: resolved once compiled
        return _COMPILED[key](v)

    _COMPILED[key] = pending
    decode = _COMPILED[key] = _compile(cls, complete)
    return decode


def _refuse(_v: Any) -> Any:
    raise _MISMATCH


def _compile(cls: type, complete: bool) -> Conv:
    fields = dataclasses.fields(cls)
    if any(not f.init or f.kw_only for f in fields):
        return _refuse
    hints = _hints(cls)
    ns: dict[str, Any] = {"_MISMATCH": _MISMATCH, "_MISSING": _MISSING, "cls": cls}
    ns["NAMES"] = frozenset(f.name for f in fields)
    lines = ["def decode(data):", "    if type(data) is not dict or not data.keys() <= NAMES: raise _MISMATCH"]
    args = []
    for i, f in enumerate(fields):
        v = f"v{i}"
        args.append(v)
        lines.append(f"    {v} = data.get({f.name!r}, _MISSING)")
        lines.append(f"    if {v} is _MISSING:")
        if complete or (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING):
            lines.append("        raise _MISMATCH")
        elif f.default is not dataclasses.MISSING:
            ns[f"d{i}"] = f.default
            lines.append(f"        {v} = d{i}")
        else:
            ns[f"d{i}"] = f.default_factory
            lines.append(f"        {v} = d{i}()")
        tp = hints[f.name]
        lines.append("    else:")
        inline = _INLINE.get(tp)
        if inline is not None:
            lines += ["        " + part for part in inline.format(v=v).split("\n")]
        else:
            ns[f"c{i}"] = converter(tp, complete)
            lines.append(f"        {v} = c{i}({v})")
    lines.append(f"    return cls({', '.join(args)})")
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<decoder of {cls.__qualname__}>", "exec"), ns)  # our own source, as dataclasses does
    decode: Conv = ns["decode"]
    decode.source = source  # type: ignore[attr-defined]
    return decode
