"""Plausibility at the boundary: what each reading can hold, declared per collector, applied in one place.

NVML answers what the driver wrote into a struct the binding decoded with its own idea of the
layout; when binding and driver disagree, or a counter is read mid-update, a number comes back that
no GPU can produce (a utilization of 250 %, used memory above total, NVML_VALUE_NOT_AVAILABLE read
as 4294967295 °C, an energy counter that runs backwards). Nothing like that may go out as if it
were true. Each collector declares, next to its ``Reading``, the checks its fields must pass
(``CHECKS``: a tuple of the classes below, one entry or an :class:`Exempt` for every field, which
``tests/test_plausibility.py`` holds); the worker applies them once, right after ``read()``
(:mod:`exporter.worker.implausible`). A value that fails is dropped from the reading (a field that
may be None becomes None, a mapping loses that key, anything else costs the whole reading of that
feature on that GPU, for that sample), counted by reason in ``nvgpu_readings_dropped_total`` and
logged once per GPU, feature and reason with the versions (:mod:`exporter.worker.implausible`).

===========================  ====================================================================
reason                       the value dropped
===========================  ====================================================================
``out_of_range``             outside what the hardware can report: a utilization above 100 %, a
                             temperature outside -40 to 150 °C, NVML_VALUE_NOT_AVAILABLE, a
                             negative counter (:class:`Range`)
``above_total``              parts above their whole: memory used + free + reserved above total
                             (:class:`PartsAtMost`); every part and the total are dropped, since
                             which one is wrong cannot be told
``above_limit``              power more than 10 times the enforced limit (:class:`AtMost`)
``above_max``                a clock more than 1.5 times its own maximum (:class:`AtMost`)
``counter_decreased``        a counter below its last exported value with no reset in between
                             (:class:`Monotonic`)
``counter_too_fast``         a counter rising faster than the hardware can (energy above 10 kW)
``timestamp_in_future``      a sample stamped later than now: a field value (in the device client),
                             a kernel-log Xid (counted at the time it was read); per-process
                             utilization samples in ``nvgpu_process_records_dropped_total``. GPM
                             samples and NVML events carry no time the binding exposes: their
                             windows and times are taken on this host's clocks, never ahead
``join_unmatched``           one NVML answer naming what another does not have: a per-process
                             utilization sample for a PID in no process list, a GPM sample of a
                             GPU instance that is gone; counted, never turned into 0
===========================  ====================================================================

Counters (:class:`Monotonic`): a value exported as a Prometheus counter never decreases. A value
below the last one exported, or one that rose faster than ``max_rate``, is dropped for that sample.
The lower value becomes the new base only on evidence that the counter really restarted:

- the GPU was attached again (lost and back, readmitted after a probe, re-enumerated after a reset
  or drain): the bases live as long as the device client (``Lifetime.DEVICE``), so a new handle
  starts from whatever the counter reads; a driver reload restarts the worker, which starts afresh;
- or :data:`CONFIRM_SAMPLES` samples in a row agree with one another (each no lower and no faster
  than the one before): the counter was cleared in place (``nvidia-smi --reset-ecc-errors=0``
  clears the volatile ECC counts without a reset) or a 32-bit counter wrapped. The first two are
  dropped, the third is exported and Prometheus sees one counter reset, as it should.

A single misread (1000, 5, 1001) is one sample without a series, never two false resets (which
``increase()`` would read as a thousand new errors).

Pure and standard library only (the check classes, :func:`apply`, the per-GPU state); the family is
rendered by the supervisor (:func:`families`).
"""

from __future__ import annotations

import math
import typing
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeGuard

from exporter.common.gpustate import GpuState, Lifetime
from exporter.common.metric import GpuKey, MetricDef

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric

REASONS = (
    "out_of_range",
    "above_total",
    "above_limit",
    "above_max",
    "counter_decreased",
    "counter_too_fast",
    "timestamp_in_future",
    "join_unmatched",
)
CONFIRM_SAMPLES = 3
"""Samples in a row that must agree before a counter's lower (or jumped) value is its new base."""
FUTURE_TOLERANCE_S = 5.0
"""How far past now a sample's timestamp may lie (clock granularity; the driver stamps with the
host's clock, as ``time.time()`` reads it)."""

U32_NOT_AVAILABLE = 0xFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE in an unsigned int
U64_NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE in an unsigned long long
U32_MAX_VALUE = U32_NOT_AVAILABLE - 1  # the largest unsigned int that can be a value
U64_MAX_VALUE = U64_NOT_AVAILABLE - 1

DROPPED = MetricDef(
    "nvgpu_readings_dropped_total",
    "Readings dropped because they cannot be true, since the worker started: out_of_range, above_total "
    "(memory parts above the total), above_limit (power over 10x the enforced limit), above_max (a clock "
    "over 1.5x its maximum), counter_decreased, counter_too_fast, timestamp_in_future, join_unmatched "
    "(an NVML answer naming a process or GPU instance another answer does not have)",
    ("feature", "reason"),
)
METRICS = (DROPPED,)


@dataclass(frozen=True)
class Drop:
    """One value that failed a check.

    Attributes:
        reason: one of :data:`REASONS`.
        where: the field, with the key or index for a mapping or tuple (``clock_mhz[sm]``).
        value: the value as read.
        why: what it was checked against, for the log line (``above 1.5 x max_clock_mhz[sm] 1980``).
    """

    reason: str
    where: str
    value: Any
    why: str


@dataclass
class Base:
    """What a counter last exported, and a lower (or jumped) value waiting for confirmation.

    Attributes:
        value: the last value exported.
        at: its time on the backend's clock (seconds).
        pending: the last value dropped, None when none waits.
        pending_at: its time.
        seen: dropped values in a row that agree with one another.
    """

    value: float
    at: float
    pending: float | None = None
    pending_at: float = 0.0
    seen: int = 0

    def offer(self, value: float, now: float, max_rate: float | None) -> str | None:
        """Judge the next value: None to export it, ``"restarted"`` when a lower or jumped value was
        confirmed and is exported as the new base, else the drop reason."""
        problem = _step(self.value, self.at, value, now, max_rate)
        if problem is None:
            self.value, self.at, self.pending, self.seen = value, now, None, 0
            return None
        agrees = self.pending is not None and _step(self.pending, self.pending_at, value, now, max_rate) is None
        self.seen = self.seen + 1 if agrees else 1
        self.pending, self.pending_at = value, now
        if self.seen >= CONFIRM_SAMPLES:
            self.value, self.at, self.pending, self.seen = value, now, None, 0
            return "restarted"
        return problem


def _step(old: float, old_at: float, new: float, now: float, max_rate: float | None) -> str | None:
    if new < old:
        return "counter_decreased"
    if max_rate is not None and now > old_at and (new - old) / (now - old_at) > max_rate:
        return "counter_too_fast"
    return None


@dataclass
class Context:
    """One application of a collector's checks.

    Attributes:
        now: the backend's clock, seconds (``NvmlClient.now``: monotonic, or scenario time for the fake).
        bases: (field, key) -> the counter's :class:`Base` (kept per GPU and feature by the caller).
        drops: the values dropped so far.
        restarts: (``where``, old value, new value) of counters whose new base was accepted.
        prefix: the enclosing field of an :class:`Each` (``gpu_instances[1].``).
    """

    now: float = 0.0
    bases: dict[tuple[str, Any], Base] = field(default_factory=dict)
    drops: list[Drop] = field(default_factory=list)
    restarts: list[tuple[str, float, float]] = field(default_factory=list)
    prefix: str = ""

    def drop(self, reason: str, name: str, key: Any, value: Any, why: str) -> None:
        self.drops.append(Drop(reason, self.prefix + _where(name, key), value, why))


def _where(name: str, key: Any) -> str:
    return name if key is None else f"{name}[{key}]"


_NUMBERS = (int, float)  # exactly: a bool is not a reading's number


def _number(value: Any) -> TypeGuard[int | float]:
    return type(value) in _NUMBERS


def _items(value: Any) -> Iterable[tuple[Any, Any]]:
    """(key, value) of a field: a mapping's items, a tuple's elements by index, a scalar with key
    None. Dropping builds a new reading (:func:`void`), so iterating the old value stays safe."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        return value.items()
    if isinstance(value, tuple):
        return enumerate(value)
    return ((None, value),)


_OPTIONAL: dict[tuple[type, str], bool] = {}


def _optional(cls: type, name: str) -> bool:
    """Whether the field ``name`` of the dataclass ``cls`` may hold None."""
    known = _OPTIONAL.get((cls, name))
    if known is None:
        hint = typing.get_type_hints(cls)[name]
        known = _OPTIONAL[(cls, name)] = type(None) in typing.get_args(hint)
    return known


def void(reading: Any, name: str, key: Any = None) -> Any:
    """``reading`` without the value at ``name`` (and ``key``): None in an optional field, the key
    gone from a mapping; None (the whole reading) where neither can be (a tuple element, a field
    that may not be None)."""
    value = getattr(reading, name)
    if key is None:
        return replace(reading, **{name: None}) if _optional(type(reading), name) else None
    if isinstance(value, Mapping):
        return replace(reading, **{name: {k: v for k, v in value.items() if k != key}})
    return None


class Check:
    """Base of the checks: ``fields`` are the Reading fields it covers."""

    fields: tuple[str, ...] = ()

    def apply(self, reading: Any, ctx: Context) -> Any:
        """The reading with what fails this check dropped (see :func:`void`); None when nothing is left."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}{self.fields}"


class Range(Check):
    """Each value of ``fields`` (a number, or every value of a mapping or tuple) within [low, high].

    Args:
        fields: the field names.
        low: smallest possible value.
        high: largest possible value.
    """

    def __init__(self, *fields: str, low: float, high: float) -> None:
        self.fields, self.low, self.high = fields, low, high

    def apply(self, reading: Any, ctx: Context) -> Any:
        for name in self.fields:
            for key, value in _items(getattr(reading, name)):
                if _number(value) and self.low <= value <= self.high:
                    continue
                ctx.drop("out_of_range", name, key, value, f"outside [{self.low}, {self.high}]")
                reading = void(reading, name, key)
                if reading is None:
                    return None
        return reading


class AtMost(Check):
    """``field`` at most ``factor`` times ``bound`` (another field of the reading: a number, or a
    mapping with the same keys); nothing is judged where the bound is unknown.

    Args:
        name: the field checked.
        bound: the field holding its limit (not dropped when the check fails).
        factor: how far above the bound a value may go.
        reason: ``above_limit`` or ``above_max``.
    """

    def __init__(self, name: str, bound: str, *, factor: float, reason: str) -> None:
        self.fields, self.name, self.bound, self.factor, self.reason = (name,), name, bound, factor, reason

    def apply(self, reading: Any, ctx: Context) -> Any:
        limits = getattr(reading, self.bound)
        for key, value in _items(getattr(reading, self.name)):
            limit = limits.get(key) if isinstance(limits, Mapping) else (limits if key is None else None)
            if not _number(limit) or limit <= 0 or not _number(value) or value <= self.factor * limit:
                continue
            ctx.drop(self.reason, self.name, key, value, f"above {self.factor} x {_where(self.bound, key)} {limit}")
            reading = void(reading, self.name, key)
            if reading is None:
                return None
        return reading


class PartsAtMost(Check):
    """The known ``parts`` summed at most ``total``; when not, every part and the total are dropped.

    Args:
        parts: the fields that make up the whole.
        total: the field of the whole.
    """

    def __init__(self, *parts: str, total: str) -> None:
        self.fields, self.parts, self.total = (*parts, total), parts, total

    def apply(self, reading: Any, ctx: Context) -> Any:
        total = getattr(reading, self.total)
        known = [(p, getattr(reading, p)) for p in self.parts if getattr(reading, p) is not None]
        if not _number(total) or not known or not all(_number(v) for _, v in known):
            return reading
        summed = sum(v for _, v in known)
        if summed <= total:
            return reading
        named = " + ".join(p for p, _ in known)
        ctx.drop("above_total", named, None, summed, f"above {self.total} {total}")
        for name in (*(p for p, _ in known), self.total):
            reading = void(reading, name)
            if reading is None:
                return None
        return reading


class Monotonic(Check):
    """Counters: never below the last value exported (see the module docstring), never negative,
    and, with ``max_rate``, never rising faster than that many units per second.

    Args:
        fields: the field names (a number, or every value of a mapping: one counter per key).
        max_rate: the fastest the hardware can count, units per second of the backend's clock.
    """

    def __init__(self, *fields: str, max_rate: float | None = None) -> None:
        self.fields, self.max_rate = fields, max_rate

    def apply(self, reading: Any, ctx: Context) -> Any:
        bases, now, max_rate = ctx.bases, ctx.now, self.max_rate
        for name in self.fields:
            for key, value in _items(getattr(reading, name)):
                if type(value) not in _NUMBERS or not 0 <= value < math.inf:  # NaN fails both
                    ctx.drop("out_of_range", name, key, value, "not a count")
                    reading = void(reading, name, key)
                    if reading is None:
                        return None
                    continue
                base = bases.get((name, key))
                if base is None:
                    bases[(name, key)] = Base(value, now)
                    continue
                if max_rate is None and base.pending is None and value >= base.value:
                    base.value, base.at = value, now  # the common case, without a call
                    continue
                before = base.value
                verdict = base.offer(value, now, max_rate)
                if verdict is None:
                    continue
                if verdict == "restarted":
                    ctx.restarts.append((_where(name, key), before, value))
                    continue
                ctx.drop(verdict, name, key, value, f"last exported {before:g}")
                reading = void(reading, name, key)
                if reading is None:
                    return None
        return reading


class Each(Check):
    """``checks`` applied to every element of a tuple of dataclasses (``gpu_instances``); an element
    that cannot keep its values is left out of the tuple. No :class:`Monotonic` inside: an element's
    place in the tuple is not its identity.

    Args:
        name: the tuple field.
        checks: the element's checks.
    """

    def __init__(self, name: str, *checks: Check) -> None:
        self.fields, self.name, self.checks = (name,), name, checks

    def apply(self, reading: Any, ctx: Context) -> Any:
        kept = []
        for i, element in enumerate(getattr(reading, self.name)):
            inner = Context(ctx.now, {}, ctx.drops, ctx.restarts, f"{ctx.prefix}{self.name}[{i}].")
            for check in self.checks:
                element = check.apply(element, inner)
                if element is None:
                    break
            if element is not None:
                kept.append(element)
        return replace(reading, **{self.name: tuple(kept)})


class Exempt(Check):
    """Fields that need no check, and why (an identifier, a string, a flag, values validated where
    they are read)."""

    def __init__(self, *fields: str, why: str) -> None:
        self.fields, self.why = fields, why

    def apply(self, reading: Any, ctx: Context) -> Any:
        return reading


def covered(checks: Iterable[Check]) -> set[str]:
    """Every field some check names."""
    return {name for check in checks for name in check.fields}


def apply(checks: Sequence[Check], reading: Any, ctx: Context) -> Any:
    """``reading`` with every value that fails a check dropped, in the order the checks are declared;
    None when the whole reading had to go. ``ctx`` collects the drops and keeps the counters' bases."""
    for check in checks:
        if reading is None:
            return None
        reading = check.apply(reading, ctx)
    return reading


def in_future(timestamp_us: int, now_us: int) -> bool:
    """Whether an NVML timestamp (µs since 1970) lies past ``now_us`` by more than :data:`FUTURE_TOLERANCE_S`."""
    return timestamp_us > now_us + FUTURE_TOLERANCE_S * 1e6


# -- per-GPU state in the worker ---------------------------------------------------------------------


@dataclass
class Dropped(GpuState):
    """One GPU's drops since the worker started (kept by UUID across re-attaches: the family counts
    since the worker started), and the first drop of each (feature, reason) not yet logged.

    Attributes:
        counts: (feature, reason) -> values dropped.
        unlogged: (feature, drop) of the first drop of each (feature, reason), until the worker logs it.
        restarted: (feature, where, old, new) of counters restarted, until the worker logs them.
    """

    LIFETIME = Lifetime.WORKER
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    unlogged: list[tuple[str, Drop]] = field(default_factory=list)
    restarted: list[tuple[str, str, float, float]] = field(default_factory=list)

    def add(self, feature: str, drop: Drop, n: int = 1) -> None:
        """Count ``n`` values dropped for ``drop``'s reason; keep it for the log line if it is the
        first of its (feature, reason)."""
        key = (feature, drop.reason)
        if not self.counts[key]:
            self.unlogged.append((feature, drop))
        self.counts[key] += n

    def by_feature(self) -> dict[str, dict[str, int]]:
        """feature -> reason -> count, sorted, zeros left out (the snapshot's ``GpuSample.dropped``)."""
        out: dict[str, dict[str, int]] = {}
        for (feature, reason), n in sorted(self.counts.items()):
            if n:
                out.setdefault(feature, {})[reason] = n
        return out


@dataclass
class Bases(GpuState):
    """The counters' bases of one device client: a GPU attached again starts afresh (a reset is
    evidence enough that its counters restarted)."""

    LIFETIME = Lifetime.DEVICE
    by_feature: dict[str, dict[tuple[str, Any], Base]] = field(default_factory=dict)


# -- rendering (supervisor) --------------------------------------------------------------------------


def families(samples: Sequence[tuple[GpuKey, Mapping[str, Mapping[str, int]]]]) -> Iterable[Metric]:
    """``nvgpu_readings_dropped_total`` from each GPU's ``GpuSample.dropped``."""
    fam = DROPPED.family()
    for key, dropped in samples:
        for feature, reasons in sorted(dropped.items()):
            for reason, n in sorted(reasons.items()):
                fam.add(key, n, feature, reason)
    yield from fam.done()
