"""Plausibility at the boundary: each collector declares what its reading can hold, one function
drops what cannot be true, counters never go backwards without evidence, and the drops are counted."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
from fake_device import Clock, device

from exporter.common import collectors, plausibility
from exporter.common.collectors import clocks, fan, gpm, memory, mig, nvlink, power, temperature, utilization
from exporter.common.gpustate import GpuStates
from exporter.common.plausibility import Context, Monotonic
from exporter.worker import implausible


def _run(checks: tuple[plausibility.Check, ...], reading: Any, ctx: Context | None = None) -> tuple[Any, list[str]]:
    ctx = ctx or Context()
    out = plausibility.apply(checks, reading, ctx)
    return out, [f"{d.reason}:{d.where}" for d in ctx.drops]


# -- every field of every reading is declared -------------------------------------------------------


def _dataclass_fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("feature", sorted(collectors.COLLECTORS))
def test_every_reading_field_has_a_check_or_an_exemption(feature: str) -> None:
    """A new field fails here until its collector says what it can hold (or why nothing needs saying)."""
    collector = collectors.COLLECTORS[feature]
    fields = _dataclass_fields(collector.Reading)
    covered = plausibility.covered(collector.CHECKS)
    assert fields - covered == set(), f"{feature}: declare a check or an Exempt in CHECKS for these fields"
    assert covered - fields == set(), f"{feature}: CHECKS names fields the Reading does not have"


@pytest.mark.parametrize("feature", sorted(collectors.COLLECTORS))
def test_nested_readings_are_declared_too(feature: str) -> None:
    """A tuple of dataclasses (MIG GPU instances, GPM per GPU instance) is checked element by element."""
    collector = collectors.COLLECTORS[feature]
    hints = typing.get_type_hints(collector.Reading)
    each = {c.name: c for c in collector.CHECKS if isinstance(c, plausibility.Each)}
    for name, hint in hints.items():
        args = typing.get_args(hint)
        if typing.get_origin(hint) is tuple and args and dataclasses.is_dataclass(args[0]):
            assert name in each, f"{feature}.{name}: a tuple of {args[0].__name__} needs an Each check"
            assert plausibility.covered(each[name].checks) == _dataclass_fields(args[0])


def test_exemptions_say_why_and_counters_are_not_nested() -> None:
    for feature, collector in collectors.COLLECTORS.items():
        for check in collector.CHECKS:
            inner = check.checks if isinstance(check, plausibility.Each) else (check,)
            for c in inner:
                if isinstance(c, plausibility.Exempt):
                    assert c.why.strip(), feature
                if check is not c:
                    assert not isinstance(c, Monotonic), f"{feature}: no counter inside Each (see its docstring)"


def test_every_counter_family_is_guarded_by_a_monotonic_check() -> None:
    """A family exported as a Prometheus counter comes from a field a Monotonic check holds (or from
    counts the worker makes itself: drops, the process-record validation)."""
    own_counts = {"nvgpu_process_records_dropped_total"}
    for feature, collector in collectors.COLLECTORS.items():
        counters = [m.name for m in collector.METRICS if m.counter and m.name not in own_counts]
        monotonic = [c for c in collector.CHECKS if isinstance(c, Monotonic)]
        assert bool(counters) == bool(monotonic), f"{feature}: counters {counters}, Monotonic checks {monotonic}"


# -- what each kind of check drops ------------------------------------------------------------------


def test_a_utilization_of_250_is_dropped_and_the_rest_kept() -> None:
    out, drops = _run(utilization.CHECKS, utilization.Reading(250, 3, None, None))
    assert out == utilization.Reading(None, 3, None, None)
    assert drops == ["out_of_range:gpu_percent"]


def test_used_above_total_drops_every_part_of_the_framebuffer_and_keeps_bar1() -> None:
    reading = memory.Reading(1000, 900, 200, 50, 64, 1)
    out, drops = _run(memory.CHECKS, reading)
    assert out == memory.Reading(None, None, None, None, 64, 1)
    assert drops == ["above_total:used_bytes + free_bytes + reserved_bytes"]


def test_v2_memory_of_the_idle_h200_passes() -> None:
    measured = memory.Reading(150_754_820_096, 0, 150_109_880_320, 644_939_776, None, None)
    assert _run(memory.CHECKS, measured) == (measured, [])


def test_power_far_above_the_limit_is_dropped_and_an_unknown_limit_judges_nothing_but_the_bound() -> None:
    out, drops = _run(power.CHECKS, power.Reading(7_000_001, 700_000, 10))
    assert out.usage_mw is None and drops == ["above_limit:usage_mw"]
    assert _run(power.CHECKS, power.Reading(6_999_999, None, 10))[1] == []
    assert _run(power.CHECKS, power.Reading(10_000_001, None, 10))[1] == ["out_of_range:usage_mw"]


def test_a_clock_far_above_its_maximum_loses_only_that_clock() -> None:
    reading = clocks.Reading({"sm": 4000, "memory": 3201}, {"sm": 1980}, None, None)
    out, drops = _run(clocks.CHECKS, reading)
    assert out.clock_mhz == {"memory": 3201} and out.max_clock_mhz == {"sm": 1980}
    assert drops == ["above_max:clock_mhz[sm]"]
    boosted = clocks.Reading({"sm": 2100}, {"sm": 1980}, None, None)  # a clock offset: plausible
    assert _run(clocks.CHECKS, boosted)[1] == []


def test_temperature_not_available_is_dropped() -> None:
    out, drops = _run(temperature.CHECKS, temperature.Reading(34, 4294967295))
    assert out == temperature.Reading(34, None) and drops == ["out_of_range:memory_celsius"]


def test_one_implausible_fan_costs_the_fan_reading_since_a_fans_label_is_its_place() -> None:
    assert _run(fan.CHECKS, fan.Reading((45, 110)))[1] == []  # nvml.h: may exceed 100 %
    out, drops = _run(fan.CHECKS, fan.Reading((45, 65535)))
    assert out is None and drops == ["out_of_range:speeds_percent[1]"]


def test_nested_gpu_instances_are_checked_one_by_one() -> None:
    reading = mig.Reading(
        1,
        1,
        (mig.GpuInstance(1, 9, "3g.71gb", 100, 10), mig.GpuInstance(2, 14, "2g.35gb", 100, 300)),
    )
    out, drops = _run(mig.CHECKS, reading)
    assert out.gpu_instances[0] == reading.gpu_instances[0]
    assert out.gpu_instances[1] == mig.GpuInstance(2, 14, "2g.35gb", None, None)
    assert drops == ["above_total:gpu_instances[1].memory_used_bytes"]
    assert _run(mig.CHECKS, dataclasses.replace(reading, current_mode=7)) == (None, ["out_of_range:current_mode"])


def test_gpm_activity_allows_rounding_not_misreads() -> None:
    out, drops = _run(gpm.CHECKS, gpm.Reading({1: 100.4, 2: 250.0, 3: float("nan")}, {20: 1.0}))
    assert out.activity_percent == {1: 100.4}
    assert sorted(drops) == ["out_of_range:activity_percent[2]", "out_of_range:activity_percent[3]"]


# -- counters ---------------------------------------------------------------------------------------


def _counter_run(values: list[float | None], times: list[float] | None = None, max_rate: float | None = None) -> list:
    """What a counter exports for each read value (None: dropped), and the context of the last."""
    check = (Monotonic("value", max_rate=max_rate),)

    @dataclasses.dataclass(frozen=True)
    class R:
        value: float | None

    bases: dict[Any, plausibility.Base] = {}
    out = []
    for i, v in enumerate(values):
        ctx = Context(now=times[i] if times else float(i), bases=bases)
        got = plausibility.apply(check, R(v), ctx)
        out.append((got.value if got else None, [d.reason for d in ctx.drops], ctx.restarts))
    return out


def test_a_single_misread_below_is_one_missing_sample_not_two_resets() -> None:
    got = _counter_run([1000, 5, 1001, 1002])
    assert [v for v, _, _ in got] == [1000, None, 1001, 1002]
    assert got[1][1] == ["counter_decreased"]


def test_a_counter_cleared_in_place_is_accepted_after_three_agreeing_samples() -> None:
    """nvidia-smi --reset-ecc-errors=0 clears the volatile counts without a reset: confirmed, then exported."""
    got = _counter_run([1000, 0, 0, 1, 2])
    assert [v for v, _, _ in got] == [1000, None, None, 1, 2]
    assert got[3][2] == [("value", 1000, 1)]


def test_lower_values_that_disagree_are_never_a_new_base() -> None:
    got = _counter_run([1000, 7, 3, 9, 2, 8, 1003])
    assert [v for v, _, _ in got] == [1000, None, None, None, None, None, 1003]


def test_a_counter_rising_faster_than_the_hardware_is_dropped() -> None:
    """Energy: 10 kW is 10,000,000 mJ per second; a jump of 10^15 mJ in a second is a misread."""
    got = _counter_run([1_000, 2_000, 10**15, 3_000], times=[0, 1, 2, 3], max_rate=power.MAX_MW)
    assert [v for v, _, _ in got] == [1_000, 2_000, None, 3_000]
    assert got[2][1] == ["counter_too_fast"]


def test_a_negative_counter_is_out_of_range_and_keeps_the_base() -> None:
    got = _counter_run([10, -1, 11])
    assert [v for v, _, _ in got] == [10, None, 11] and got[1][1] == ["out_of_range"]


def test_each_link_is_its_own_counter() -> None:
    bases: dict[Any, plausibility.Base] = {}
    first = nvlink.Reading(18, {"replay": 10}, {}, {"3/replay": 10})
    second = nvlink.Reading(18, {"replay": 4}, {}, {"3/replay": 4})
    plausibility.apply(nvlink.CHECKS, first, Context(0.0, bases))
    ctx = Context(1.0, bases)
    out = plausibility.apply(nvlink.CHECKS, second, ctx)
    assert out.errors == {} and out.link_errors == {}
    assert sorted(d.where for d in ctx.drops) == ["errors[replay]", "link_errors[3/replay]"]


# -- in the worker: counted per GPU, bases per device client, logged once with the versions ----------


H200 = {
    "name": "NVIDIA H200",
    "values": {
        "nvmlDeviceGetTotalEnergyConsumption": {"sequence": [{"until_s": 10, "value": 5000}, {"value": 4000}]},
        "nvmlDeviceGetPowerUsage": 80000,
        "nvmlDeviceGetEnforcedPowerLimit": 700000,
        "nvmlDeviceGetUtilizationRates": {"gpu": 250, "memory": 0},
    },
}


def test_the_worker_drops_counts_and_logs_once_with_the_versions(tmp_path: Path, caplog: Any) -> None:
    clock = Clock(0.0)
    dev = device(tmp_path, H200, clock, driver_version="580.159.04")
    reads = []
    for t in (0.0, 20.0, 21.0):
        clock.t = t
        for feature in ("power", "utilization"):
            collector = collectors.COLLECTORS[feature]
            reads.append(implausible.checked(dev, feature, collector, collector.read(dev)))
        counts = implausible.report(dev)
    assert reads[0].energy_mj == 5000 and reads[2].energy_mj is None and reads[4].energy_mj is None
    assert reads[1].gpu_percent is None and reads[1].memory_busy_percent == 0
    assert counts == {"power": {"counter_decreased": 2}, "utilization": {"out_of_range": 3}}
    lines = [r for r in caplog.records if "cannot be true" in r.getMessage()]
    assert len(lines) == 2, [r.getMessage() for r in lines]
    text = lines[0].getMessage()
    assert "NVIDIA H200" in text and "580.159.04" in text and "nvidia-ml-py" in text
    assert lines[0].gpu_model == "NVIDIA H200" and lines[0].driver_version == "580.159.04"


def test_a_gpu_attached_again_starts_its_counters_afresh_and_keeps_its_drop_counts() -> None:
    states = GpuStates()
    states.of(plausibility.Bases).by_feature["power"] = {"energy_mj": plausibility.Base(5000, 0.0)}
    states.of(plausibility.Dropped).counts[("power", "counter_decreased")] = 2
    again = states.reattached()
    assert again.of(plausibility.Bases).by_feature == {}
    assert again.of(plausibility.Dropped).by_feature() == {"power": {"counter_decreased": 2}}


def test_families_render_the_counts_per_gpu() -> None:
    from exporter.common.metric import GpuKey

    (metric,) = plausibility.families(
        [(GpuKey("0", "GPU-a"), {"power": {"counter_decreased": 2}}), (GpuKey("1", "GPU-b"), {})]
    )
    assert metric.name == "nvgpu_readings_dropped_total"
    samples = [(s.labels, s.value) for s in metric.samples if s.name.endswith("_total")]
    assert samples == [({"gpu": "0", "uuid": "GPU-a", "feature": "power", "reason": "counter_decreased"}, 2.0)]


def test_a_field_value_stamped_in_the_future_is_omitted_and_counted(tmp_path: Path) -> None:
    """nvmlFieldValue_t carries the CPU time of the value (µs since 1970, measured on the H200); one
    later than now is not this sample's value."""
    clock = Clock(100.0)
    dev = device(tmp_path, {"fields": {"82": 37, "185:2": 39000}}, clock)
    real = dev.client.backend.field_values

    def stamped_ahead(handle: Any, pairs: list[tuple[int, int]]) -> list[Any]:
        return [
            dataclasses.replace(e, timestamp_us=e.timestamp_us + 3600 * 10**6) if e.field_id == 82 else e
            for e in real(handle, pairs)
        ]

    dev.client.backend.field_values = stamped_ahead
    assert dev.fields("temperature", [(82, 0), (185, 2)]) == {(185, 2): 39000}
    assert dev.state_of(plausibility.Dropped).by_feature() == {"temperature": {"timestamp_in_future": 1}}
    assert not dev.client.errors


class _Host:
    def __init__(self, snapshot: Any) -> None:
        self.snapshot = snapshot
        self.xids: list[tuple[str, str, int, float]] = []

    def changed(self) -> None:
        pass

    def record_xid(
        self, gpu: str, uuid: str, xid: int, ts: float, source: str, pid: int | None = None, process: str = ""
    ) -> None:
        self.xids.append((gpu, uuid, xid, ts))

    def attribute_xid(self, uuid: str, xid: int, ts: float, pid: int | None, process: str) -> None:
        pass


def test_a_kernel_log_xid_stamped_in_the_future_is_counted_at_the_time_it_was_read(tmp_path: Path) -> None:
    """A text log in local time ahead of UTC: the Xid still counts, but not at a time that has not come."""
    import time
    from types import SimpleNamespace

    from exporter.common.collectors import identity
    from exporter.common.snapshot import GpuSample, Snapshot, SystemInfo
    from exporter.supervisor.kernel_xid import KernelXid
    from exporter.supervisor.xid.parse import KernelXidEvent

    bus, uuid = "00000000:18:00.0", "GPU-a"
    snap = Snapshot(
        1.0,
        0.0,
        SystemInfo(),
        (GpuSample(0, uuid, readings={"identity": identity.Reading("H200", bus, "", 9)}),),
        {},
        {},
        {},
        0,
        {},
    )
    config = SimpleNamespace(kmsg_cursor_file=None, state_file="", kmsg_path=str(tmp_path / "kmsg"))
    ext = KernelXid(config)  # type: ignore[arg-type]
    host = _Host(snap)
    now = time.time()
    ahead = KernelXidEvent(1, None, bus, 13, None, None, "", {}, wall_time=now + 3 * 3600)
    past = KernelXidEvent(2, None, bus, 31, None, None, "", {}, wall_time=now - 60)
    before = time.time()
    ext.count(host, [ahead, past])  # type: ignore[arg-type]
    (_, _, x13, t13), (_, _, x31, t31) = host.xids
    assert (x13, x31) == (13, 31) and before <= t13 <= time.time() and t31 == past.wall_time
    (metric,) = ext.gpu_families(snap)
    samples = [(s.labels["feature"], s.labels["reason"], s.value) for s in metric.samples if s.name.endswith("_total")]
    assert samples == [("kernel_xid", "timestamp_in_future", 1.0)]
