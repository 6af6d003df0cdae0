"""Property: whatever a collector's read() returns, nothing that cannot be true is exported.

Readings of every collector are generated from the annotations of its ``Reading`` (nested
dataclasses included) with the numbers where bindings and drivers go wrong: NVML_VALUE_NOT_AVAILABLE
in 32 and 64 bits, 2^63, negative values, NaN and infinities, values just past a bound. A sequence of
them, one per sample, goes through the collector's declared checks (``plausibility.apply``, with the
counters' bases kept across the sequence, as the worker keeps them), the snapshot's JSON round trip
and the collector's ``families()``; what would be on ``/metrics`` is then judged by rules stated
here on the exported names and units, apart from the checks themselves:

- every value is finite;
- ratios within 0..1 (GPM activity within 1.01 for rounding; fan speed within 2: nvml.h says it
  "may exceed 100%"), temperatures within -40..150 °C, watts within 0..10,000 and the GPU's power
  within 10 times its limit, clocks within 10 GHz and 1.5 times their maximum, PCIe generation 1..7
  and width 1..32, memory used + free + reserved within total;
- a counter series never decreases from one sample to the next, unless it was absent for the
  samples before (the confirmation of a new base: at least ``CONFIRM_SAMPLES - 1`` of them).
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from collections.abc import Callable, Sequence
from typing import Any

import fuzzing  # noqa: F401 - loads the Hypothesis profile
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.common import collectors, plausibility
from exporter.common.collectors import gpm
from exporter.common.decode import decode_dataclass
from exporter.common.metric import GpuKey
from exporter.common.snapshot import SystemInfo

KEY = GpuKey("0", "GPU-00000000-0000-0000-0000-000000000001")

INTS = st.one_of(
    st.integers(min_value=-3, max_value=300),
    st.integers(min_value=0, max_value=10**12),
    st.sampled_from(
        [
            -1,
            -41,
            0,
            1,
            7,
            8,
            15,
            16,
            32,
            33,
            36,
            37,
            100,
            101,
            150,
            151,
            200,
            201,
            1980,
            2970,
            2971,
            700_000,
            7_000_001,
            10_000_001,
            2**31,
            2**32 - 2,
            2**32 - 1,
            2**63,
            2**64 - 2,
            2**64 - 1,
        ]
    ),
)
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1, max_value=120),
    st.sampled_from([0.0, 100.0, 100.9, 101.5, -0.0]),
)
# Keys of the mappings, as the collectors use them (families() interprets some: "<link>/<type>").
STR_KEYS = st.sampled_from(["sm", "memory", "graphics", "video", "replay", "recovery", "crc_flit", "crc_data"])
KEYS: dict[str, st.SearchStrategy[Any]] = {
    "link_errors": st.sampled_from(["0/replay", "3/recovery", "5/crc_flit", "5/crc_data"]),
    "durations_ns": st.sampled_from(["sw_power_cap", "thermal", "total_base_clocks", "hw_power_brake_slowdown"]),
    "volatile": st.sampled_from(["corrected", "uncorrected"]),
    "aggregate": st.sampled_from(["corrected", "uncorrected"]),
    # GPM: activity ids in one mapping, traffic (rate) ids in the other, as gpm.read() keeps them
    "activity_percent": st.sampled_from([m for m, _ in gpm.ACTIVITY] + [7, 11]),
    "transferred_bytes": st.sampled_from([m for m, _ in gpm.TRAFFIC]),
}
INT_KEYS = st.sampled_from([0, 1, 2, 3, 5, 10, 20, 21, 60, 61])
# Fields the worker fills itself (counts, names): not what NVML answers.
FIXED: dict[str, Any] = {"dropped": {}, "functions": {}, "fallbacks": {}, "labels": {}, "pod_names": {}, "sources": {}}
# Whole readings made of identifiers and worker-made values only: nothing to judge.
SKIPPED = {"identity", "processes"}


def strategy(hint: Any, name: str = "") -> st.SearchStrategy[Any]:
    """Values for an annotation of a Reading (or a nested dataclass)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is int:
        return INTS
    if hint is float:
        return FLOATS
    if hint is bool:
        return st.booleans()
    if hint is str:
        return st.text("abcdefgh.", max_size=6)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return st.one_of(*(st.none() if a is type(None) else strategy(a, name) for a in args))
    if origin is dict:
        keys = KEYS[name] if name in KEYS else (STR_KEYS if args[0] is str else INT_KEYS)
        return st.dictionaries(keys, strategy(args[1], name), max_size=4)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(strategy(args[0], name), max_size=3).map(tuple)
        return st.tuples(*(strategy(a, name) for a in args))
    if dataclasses.is_dataclass(hint):
        return reading_of(hint)
    raise AssertionError(f"no strategy for {hint!r} ({name})")


def reading_of(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    fields = {
        f.name: (st.just(FIXED[f.name]) if f.name in FIXED else strategy(hints[f.name], f.name))
        for f in dataclasses.fields(cls)
    }  # type: ignore[arg-type]
    return st.builds(cls, **fields)


def exported(feature: str, reading: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, labels) -> value, as /metrics would carry the reading after the wire."""
    collector = collectors.COLLECTORS[feature]
    wire = json.loads(json.dumps(collectors.to_json(reading), allow_nan=True))
    decoded = decode_dataclass(collector.Reading, wire, feature)
    out = {}
    for metric in collector.families([(KEY, decoded)], SystemInfo()):
        for s in metric.samples:
            if not s.name.endswith("_created"):
                out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("gpu", "uuid"))))] = s.value
    return out


def _value(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def impossible(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> list[str]:
    """What in one sample's exposition cannot be true (the module docstring's rules)."""
    bad = []
    bounds: list[tuple[Callable[[str], bool], float, float]] = [
        (lambda n: n.startswith(("nvgpu_gpm_", "nvgpu_mig_gpm_")) and n.endswith("_ratio"), 0.0, 1.01),
        (lambda n: n == "nvgpu_fan_speed_ratio", 0.0, 2.0),
        (lambda n: n.endswith("_ratio"), 0.0, 1.0),
        (lambda n: n.endswith("_celsius"), -40.0, 150.0),
        (lambda n: n.endswith("_watts"), 0.0, 10_000.0),
        (lambda n: n.endswith("_hertz"), 0.0, 10e9),
        (lambda n: n.startswith("nvgpu_pcie_link_") and "generation" in n, 1.0, 7.0),
        (lambda n: n.startswith("nvgpu_pcie_link_") and "width" in n, 1.0, 32.0),
        (lambda n: n.endswith("_total") or n.endswith("_bytes"), 0.0, math.inf),
    ]
    for (name, labels), value in samples.items():
        if not math.isfinite(value):
            bad.append(f"{name}{labels} = {value}")
            continue
        for applies, low, high in bounds:
            if applies(name):
                if not low <= value <= high:
                    bad.append(f"{name}{labels} = {value} outside [{low}, {high}]")
                break
    usage, limit = _value(samples, "nvgpu_power_usage_watts"), _value(samples, "nvgpu_power_limit_watts")
    if usage is not None and limit and usage > 10 * limit:
        bad.append(f"power {usage} W above 10 x the limit {limit} W")
    for clock in ("sm", "memory", "graphics", "video"):
        now, top = (
            _value(samples, "nvgpu_clock_hertz", clock=clock),
            _value(samples, "nvgpu_clock_max_hertz", clock=clock),
        )
        if now is not None and top and now > 1.5 * top:
            bad.append(f"clock {clock} {now} above 1.5 x its max {top}")
    total = _value(samples, "nvgpu_memory_total_bytes")
    parts = [_value(samples, f"nvgpu_memory_{p}_bytes") for p in ("used", "free", "reserved")]
    if total is not None and sum(p for p in parts if p is not None) > total:
        bad.append(f"memory parts {parts} above total {total}")
    return bad


def counters_going_back(history: Sequence[dict[tuple[str, tuple[tuple[str, str], ...]], float]]) -> list[str]:
    """Counter series that decrease without the confirmation gap before."""
    bad = []
    names = {k for samples in history for k in samples if k[0].endswith("_total")}
    for series in names:
        last: float | None = None
        absent = 0
        for samples in history:
            value = samples.get(series)
            if value is None:
                absent += 1
                continue
            if last is not None and value < last and absent < plausibility.CONFIRM_SAMPLES - 1:
                bad.append(f"{series} {last} -> {value} after {absent} absent samples")
            last, absent = value, 0
    return bad


CHECKED = sorted(set(collectors.COLLECTORS) - SKIPPED)


@pytest.mark.parametrize("feature", CHECKED)
@settings(max_examples=max(20, settings.default.max_examples // 3))  # 16 collectors: a third of the profile each
@given(data=st.data())
def test_nothing_impossible_is_ever_exported(feature: str, data: st.DataObject) -> None:
    collector = collectors.COLLECTORS[feature]
    readings = data.draw(st.lists(reading_of(collector.Reading), min_size=1, max_size=5), label="readings")
    bases: dict[Any, plausibility.Base] = {}
    history = []
    for i, reading in enumerate(readings):
        checked = plausibility.apply(collector.CHECKS, reading, plausibility.Context(now=float(i), bases=bases))
        samples = exported(feature, checked) if checked is not None else {}
        assert impossible(samples) == [], f"sample {i}: {reading}"
        history.append(samples)
    assert counters_going_back(history) == [], readings


def test_the_property_sees_every_collector_with_something_to_judge() -> None:
    for feature in SKIPPED:
        checks = collectors.COLLECTORS[feature].CHECKS
        assert all(isinstance(c, plausibility.Exempt) for c in checks), f"{feature} now has checks: add it to CHECKED"
