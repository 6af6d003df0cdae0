"""Value specs: what a scenario says a call answers at scenario time (docs/scenarios.md, "Values").

A value spec is JSON: a literal (number, string, boolean, null), a list, an object of struct
attributes, or an object that names its kind by one key (``{"cycle": [...], "step_s": 5}``). Each
kind is one class here, with two methods:

- ``check(raw, where)`` validates the JSON and builds the spec; the first problem raises
  :class:`SpecError` naming the place (``gpus[0].values['nvmlDeviceGetPowerUsage'].cycle[2]``);
- ``at(t, ev)`` gives the value at scenario time ``t`` (an error spec raises ``ev.error(code)``).

The scenario validator (:mod:`exporter.common.scenarios.scenario`, which ``Config`` runs before anything
starts) and the fake (:mod:`exporter.worker.fakenvml.core`) both go through :func:`parse`, so a kind is
written once. A new kind is one subclass of :class:`Spec` listed in :data:`KINDS`, and one section
of docs/scenarios.md. Standard library only: the supervisor validates without ``pynvml``.
"""

from __future__ import annotations

import difflib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar, NoReturn

from exporter.common.nvml import errors
from exporter.common.scenarios.records import STRUCT_LAYOUTS, U32


class SpecError(ValueError):
    """A value spec (or another part of a scenario) is not valid: where, and what was expected."""

    def __init__(self, where: str, expected: str) -> None:
        super().__init__(f"{where}: expected {expected}")
        self.where = where
        self.expected = expected


def fail(where: str, expected: str) -> NoReturn:
    """Raise :class:`SpecError` for the place ``where``."""
    raise SpecError(where, expected)


def is_int(value: Any) -> bool:
    """A JSON integer (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A JSON number (not a boolean)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_error(raw: Any, where: str) -> int:
    """An NVML error name (``"GPU_IS_LOST"``, ``"NVML_ERROR_GPU_IS_LOST"``) or code, as a code."""
    try:
        return errors.parse_code(raw)
    except (ValueError, AttributeError) as exc:
        fail(where, f"an NVML error name or code ({exc})")


@dataclass(frozen=True)
class Evaluation:
    """What evaluating a spec needs from its caller.

    Attributes:
        error: the exception an error spec raises, built from an NVML return code.
        as_read: True: a struct spec gives its records as the binding misreads them (what the
            caller of a process-list function sees); False: as NVML meant them.
    """

    error: Callable[[int], BaseException]
    as_read: bool = True


class Spec(ABC):
    """A checked value spec. Each subclass is one kind."""

    KEY: ClassVar[str] = ""  # the key that names the kind; "" for literals, lists and objects
    KEYS: ClassVar[frozenset[str]] = frozenset()  # every key the kind's object may have

    @classmethod
    @abstractmethod
    def check(cls, raw: Any, where: str) -> Spec:
        """Validate ``raw`` (found at ``where``) and build the spec; raises SpecError."""

    @abstractmethod
    def at(self, t: float, ev: Evaluation) -> Any:
        """The value at scenario time ``t`` (seconds)."""


def parse(raw: Any, where: str) -> Spec:
    """Check and build any value spec: the kind an object names, else a list, object or literal.

    Raises:
        SpecError: the first problem, naming the place under ``where``.
    """
    if isinstance(raw, list):
        return Items.check(raw, where)
    if not isinstance(raw, dict):
        return Literal.check(raw, where)
    kind = next((k for k in KINDS if k.KEY in raw), None)
    if kind is None:
        return Attributes.check(raw, where)
    extra = set(raw) - kind.KEYS
    if extra:
        fail(f"{where} unknown keys {sorted(extra)}", f"only {sorted(kind.KEYS)} with {kind.KEY}")
    return kind.check(raw, where)


# -- the shapes without a kind key --------------------------------------------------------------


@dataclass(frozen=True)
class Literal(Spec):
    """A number, string, boolean or null: itself at every ``t``. Strings must be printable."""

    value: Any

    @classmethod
    def check(cls, raw: Any, where: str) -> Literal:
        if isinstance(raw, str) and not raw.isprintable():
            fail(where, "printable text (no control characters)")
        return cls(raw)

    def at(self, t: float, ev: Evaluation) -> Any:
        return self.value


@dataclass(frozen=True)
class Items(Spec):
    """A list: each item a spec of its own, all evaluated at the same ``t``."""

    items: tuple[Spec, ...]

    @classmethod
    def check(cls, raw: Any, where: str) -> Items:
        return cls(tuple(parse(v, f"{where}[{j}]") for j, v in enumerate(raw)))

    def at(self, t: float, ev: Evaluation) -> list[Any]:
        return [item.at(t, ev) for item in self.items]


@dataclass(frozen=True)
class Attributes(Spec):
    """An object of struct attributes: ``{"gpu": 5, "memory": 1}`` is an object with ``.gpu`` and
    ``.memory``. A key close to a kind's key (``"step"``, ``"recods"``) is taken for a typo."""

    attributes: tuple[tuple[str, Spec], ...]

    @classmethod
    def check(cls, raw: Any, where: str) -> Attributes:
        attributes = []
        for key, value in raw.items():
            close = difflib.get_close_matches(key, RESERVED, n=1, cutoff=0.75)
            if close:
                fail(f"{where} key {key!r}", f"{close[0]!r} (a value spec) or a struct attribute name")
            if not key.isidentifier():
                fail(f"{where} key {key!r}", "a struct attribute name (an identifier)")
            attributes.append((key, parse(value, f"{where}.{key}")))
        return cls(tuple(attributes))

    def at(self, t: float, ev: Evaluation) -> SimpleNamespace:
        return SimpleNamespace(**{key: value.at(t, ev) for key, value in self.attributes})


# -- the kinds, each named by its key -------------------------------------------------------------


@dataclass(frozen=True)
class Cycle(Spec):
    """``{"cycle": [v0, v1, ...], "step_s": s}``: ``v[floor(t / s) % len]``; each ``v`` any spec."""

    KEY = "cycle"
    KEYS = frozenset({"cycle", "step_s"})
    values: tuple[Spec, ...]
    step_s: float

    @classmethod
    def check(cls, raw: Any, where: str) -> Cycle:
        if not isinstance(raw["cycle"], list) or not raw["cycle"]:
            fail(where, "cycle to be a non-empty list")
        if not is_number(raw.get("step_s")) or raw["step_s"] <= 0:
            fail(where, "step_s > 0 with cycle")
        return cls(tuple(parse(v, f"{where}.cycle[{j}]") for j, v in enumerate(raw["cycle"])), raw["step_s"])

    def at(self, t: float, ev: Evaluation) -> Any:
        return self.values[int(math.floor(t / self.step_s)) % len(self.values)].at(t, ev)


@dataclass(frozen=True)
class Ramp(Spec):
    """``{"ramp": start, "per_s": r}``: ``start + r * t`` as an integer (a counter)."""

    KEY = "ramp"
    KEYS = frozenset({"ramp", "per_s"})
    start: float
    per_s: float

    @classmethod
    def check(cls, raw: Any, where: str) -> Ramp:
        if not is_number(raw["ramp"]) or not is_number(raw.get("per_s")):
            fail(where, "numbers ramp and per_s")
        return cls(raw["ramp"], raw["per_s"])

    def at(self, t: float, ev: Evaluation) -> int:
        return int(self.start + self.per_s * max(t, 0.0))


@dataclass(frozen=True)
class Sequence(Spec):
    """``{"sequence": [{"until_s": 60, "value": ...}, {"value": ...}]}``: the first entry whose
    ``until_s`` is above ``t`` (an entry without one always matches); past the last, NOT_SUPPORTED."""

    KEY = "sequence"
    KEYS = frozenset({"sequence"})
    ENTRY_KEYS: ClassVar[frozenset[str]] = frozenset({"until_s", "value"})
    entries: tuple[tuple[float | None, Spec], ...]

    @classmethod
    def check(cls, raw: Any, where: str) -> Sequence:
        seq = raw["sequence"]
        if not isinstance(seq, list) or not all(isinstance(e, dict) and set(e) <= cls.ENTRY_KEYS for e in seq):
            fail(where, "sequence to be a list of {until_s, value}")
        entries = []
        for j, entry in enumerate(seq):
            if "until_s" in entry and not is_number(entry["until_s"]):
                fail(f"{where}.sequence[{j}].until_s", "a number of seconds")
            entries.append((entry.get("until_s"), parse(entry.get("value"), f"{where}.sequence[{j}].value")))
        return cls(tuple(entries))

    def at(self, t: float, ev: Evaluation) -> Any:
        for until_s, value in self.entries:
            if until_s is None or t < until_s:
                return value.at(t, ev)
        raise ev.error(errors.NOT_SUPPORTED)


@dataclass(frozen=True)
class Error(Spec):
    """``{"error": "NOT_SUPPORTED"}``: raise that NVML error (a name as in ``NVML_ERROR_<NAME>``, or a code)."""

    KEY = "error"
    KEYS = frozenset({"error"})
    code: int

    @classmethod
    def check(cls, raw: Any, where: str) -> Error:
        return cls(check_error(raw["error"], where))

    def at(self, t: float, ev: Evaluation) -> NoReturn:
        raise ev.error(self.code)


@dataclass(frozen=True)
class Integral(Spec):
    """``{"integral": {"cycle": [...], "step_s": s}, "scale": k, "initial": x}``: ``x + k * ∫₀ᵗ cycle``
    as an integer: a counter that grows only while the cycle is non-zero (time spent in a state)."""

    KEY = "integral"
    KEYS = frozenset({"integral", "scale", "initial"})
    values: tuple[float, ...]
    step_s: float
    scale: float = 1
    initial: float = 0

    @classmethod
    def check(cls, raw: Any, where: str) -> Integral:
        inner = raw["integral"]
        if (
            not isinstance(inner, dict)
            or set(inner) != {"cycle", "step_s"}
            or not isinstance(inner["cycle"], list)
            or not inner["cycle"]
            or not all(is_number(v) for v in inner["cycle"])
            or not is_number(inner["step_s"])
            or inner["step_s"] <= 0
        ):
            fail(f"{where}.integral", "a cycle of numbers: {cycle: [...], step_s > 0}")
        for key in ("scale", "initial"):
            if key in raw and not is_number(raw[key]):
                fail(f"{where}.{key}", "a number")
        values = tuple(float(v) for v in inner["cycle"])
        return cls(values, float(inner["step_s"]), raw.get("scale", 1), raw.get("initial", 0))

    def at(self, t: float, ev: Evaluation) -> int:
        return int(self.initial + self.scale * self.area(t))

    def area(self, t: float) -> float:
        """The integral of the cycle from 0 to ``t``."""
        t = max(t, 0.0)
        periods, rest = divmod(t, self.step_s * len(self.values))
        total = periods * self.step_s * sum(self.values)
        for v in self.values:
            if rest <= 0:
                break
            total += v * min(self.step_s, rest)
            rest -= self.step_s
        return total


_RECORD_IDS = ("usedGpuMemory", "gpuInstanceId", "computeInstanceId")


@dataclass(frozen=True)
class Struct(Spec):
    """``{"struct": "r535_v3", "records": [...]}``: process records as a driver writes them and the
    binding misreads them (:data:`exporter.common.scenarios.records.STRUCT_LAYOUTS`). A record is plain
    data, not a spec: ``pid``, ``usedGpuMemory``, ``gpuInstanceId``, ``computeInstanceId``."""

    KEY = "struct"
    KEYS = frozenset({"struct", "records"})
    layout: str
    records: tuple[dict[str, Any], ...]

    @classmethod
    def check(cls, raw: Any, where: str) -> Struct:
        layout = raw["struct"]
        if not isinstance(layout, str) or layout not in STRUCT_LAYOUTS:
            fail(f"{where}.struct={layout!r}", f"one of {list(STRUCT_LAYOUTS)}")
        records = raw.get("records")
        if not isinstance(records, list):
            fail(f"{where}.records", "a list of process records")
        for j, rec in enumerate(records):
            if not isinstance(rec, dict) or not is_int(rec.get("pid")):
                fail(f"{where}.records[{j}]", "an object with an integer pid")
            for key in _RECORD_IDS:
                if key in rec and rec[key] is not None and (not is_int(rec[key]) or rec[key] < 0):
                    fail(f"{where}.records[{j}].{key}", "a non-negative integer or null")
        return cls(layout, tuple(records))

    def at(self, t: float, ev: Evaluation) -> list[Any]:
        records = [SimpleNamespace(**rec) for rec in self.records]
        return STRUCT_LAYOUTS[self.layout](records) if ev.as_read else records


@dataclass(frozen=True)
class Churn(Spec):
    """``{"churn": {"first_pid", "per_s", "lifetime_s", "used_bytes", "count"}}``: short-lived
    processes; process ``i`` (pid ``first_pid + i``) starts at ``i / per_s`` and exits
    ``lifetime_s`` later; ``count`` processes in all (unbounded without it)."""

    KEY = "churn"
    KEYS = frozenset({"churn"})
    NEEDED: ClassVar[frozenset[str]] = frozenset({"first_pid", "per_s", "lifetime_s"})
    ALLOWED: ClassVar[frozenset[str]] = NEEDED | {"used_bytes", "count"}
    first_pid: int
    per_s: float
    lifetime_s: float
    used_bytes: int | None
    count: int | None

    @classmethod
    def check(cls, raw: Any, where: str) -> Churn:
        churn, where = raw["churn"], f"{where}.churn"
        if not isinstance(churn, dict) or not cls.NEEDED <= set(churn) <= cls.ALLOWED:
            fail(where, "an object with first_pid, per_s, lifetime_s (and optionally used_bytes, count)")
        if not is_int(churn["first_pid"]) or churn["first_pid"] <= 0:
            fail(f"{where}.first_pid", "a positive integer")
        for key in ("per_s", "lifetime_s"):
            if not is_number(churn[key]) or churn[key] <= 0:
                fail(f"{where}.{key}", "a positive number")
        if churn.get("used_bytes") is not None and (not is_int(churn["used_bytes"]) or churn["used_bytes"] < 0):
            fail(f"{where}.used_bytes", "a non-negative integer or null")
        if "count" in churn and (not is_int(churn["count"]) or churn["count"] <= 0):
            fail(f"{where}.count", "a positive integer")
        return cls(
            churn["first_pid"],
            float(churn["per_s"]),
            float(churn["lifetime_s"]),
            churn.get("used_bytes"),
            churn.get("count"),
        )

    def at(self, t: float, ev: Evaluation) -> list[SimpleNamespace]:
        last = math.floor(t * self.per_s + 1e-9)
        first = max(0, math.floor((t - self.lifetime_s) * self.per_s + 1e-9) + 1)
        if self.count is not None:
            last = min(last, self.count - 1)
        return [
            SimpleNamespace(
                pid=self.first_pid + i, usedGpuMemory=self.used_bytes, gpuInstanceId=U32, computeInstanceId=U32
            )
            for i in range(first, last + 1)
        ]


@dataclass(frozen=True)
class PerProcessSample:
    """A ``per_process`` spec evaluated: the utilization sample each process of the GPU's compute
    list gets (``values.smUtil`` ...; an attribute not given is 0)."""

    values: SimpleNamespace


@dataclass(frozen=True)
class PerProcess(Spec):
    """``{"per_process": {"smUtil": 60, "memUtil": 20}}``: for ``nvmlDeviceGetProcessUtilization``,
    one sample per process of the GPU's compute list as NVML meant it; each value any spec."""

    KEY = "per_process"
    KEYS = frozenset({"per_process"})
    UTILIZATION: ClassVar[frozenset[str]] = frozenset({"smUtil", "memUtil", "encUtil", "decUtil"})
    values: tuple[tuple[str, Spec], ...]

    @classmethod
    def check(cls, raw: Any, where: str) -> PerProcess:
        util = raw["per_process"]
        if not isinstance(util, dict) or not set(util) <= cls.UTILIZATION:
            fail(f"{where}.per_process", f"an object with keys from {sorted(cls.UTILIZATION)}")
        return cls(tuple((key, parse(value, f"{where}.per_process.{key}")) for key, value in util.items()))

    def at(self, t: float, ev: Evaluation) -> PerProcessSample:
        return PerProcessSample(SimpleNamespace(**{key: value.at(t, ev) for key, value in self.values}))


# The kinds, in the order an object's keys are matched against them (an object naming two kinds is
# reported as the first with the other's key unknown).
KINDS: tuple[type[Spec], ...] = (Cycle, Ramp, Sequence, Error, Integral, Struct, Churn, PerProcess)
# Keys no struct attribute may be close to: a near miss is a mistyped spec (checked with difflib).
RESERVED = sorted(frozenset().union(*(k.KEYS for k in KINDS)) | Sequence.ENTRY_KEYS)
