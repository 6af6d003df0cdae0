"""Throttle time: exporter.common.collectors.throttle_time on the fake backend.

The point of the counters: a flag read once per sample aliases; the time counters give the true
share whatever the sampling phase. Shown here on the fake with a 0.5 s hardware power brake every
10 s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fake_device import DETAILS, Clock, device, devices, fake_of, render

from exporter.common.collectors import clocks, throttle_time

ROOT = Path(__file__).resolve().parent.parent
NS = 1_000_000_000
ALL_FIELDS = ("74", "75", "76", "77", "78", "79", "80", "81", "269", "270", "271")


def h200x2() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "examples" / "scenarios" / "h200x2.json").read_text())
    return data


def test_counters_follow_the_phases_of_the_load_model(tmp_path: Path) -> None:
    """h200x2: SW power cap holds in the capped phase (10-15 s of every 20 s), low utilization in the
    two idle phases; the counters grow exactly then."""
    clock = Clock(100.0)  # (a field value stamped at time 0 reads as unpopulated)
    dev = devices(tmp_path, h200x2(), clock, DETAILS)[0]
    r0 = throttle_time.read(dev)
    clock.t = 140.0  # two periods
    r1 = throttle_time.read(dev)
    assert r0 is not None and r1 is not None
    grown = {k: (r1.durations_ns[k] - r0.durations_ns[k]) / NS for k in r1.durations_ns}
    assert grown["sw_power_cap"] == 10.0
    assert grown["low_utilization"] == 20.0
    assert grown["total_base_clocks"] == 30.0
    assert grown["hw_power_brake_slowdown"] == 0.0
    assert set(r1.durations_ns) == {reason for reason, *_ in throttle_time.REASONS}  # driver 580.159: all eleven
    fams = render("throttle_time", [(dev, r1)])["nvgpu_clock_event_reason_seconds_total"]
    assert fams[("0", dev.uuid, "sw_power_cap")] == 35.0  # 140 s: 7 periods x 5 s
    assert fams[("0", dev.uuid, "low_utilization")] == pytest.approx(21.89857776 + 70.0)
    assert fake_of(dev).call_counts()["nvmlDeviceGetFieldValues"] == 2  # one call per sample
    assert "nvmlDeviceGetViolationStatus" not in fake_of(dev).call_counts()


@pytest.mark.parametrize(
    ("driver", "new_numbering"),
    [("580.159.04", True), ("580.82.07", True), ("590.44.01", True), ("580.65.06", False), ("575.57.08", False)],
)
def test_fields_269_to_271_only_where_the_driver_numbers_them_so(
    tmp_path: Path, driver: str, new_numbering: bool
) -> None:
    """Before driver 580.82 ids 269-271 are power-smoothing fields (nvidia-ml-py 13.580.82): never asked."""
    clock = Clock(1.0)
    dev = device(tmp_path, {"fields": dict.fromkeys(ALL_FIELDS, 7)}, clock, DETAILS, driver_version=driver)
    r = throttle_time.read(dev)
    assert r is not None
    new = {"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
    assert (new <= set(r.durations_ns)) is new_numbering
    assert len(r.durations_ns) == (11 if new_numbering else 8)
    throttle_time.read(dev)
    assert fake_of(dev).call_counts()["nvmlSystemGetDriverVersion"] == 1  # once per GPU and worker


@pytest.mark.parametrize(("text", "branch"), [("580.159.04", (580, 159)), (" 575.57", (575, 57)), ("r580", None)])
def test_driver_branch(text: str, branch: tuple[int, int] | None) -> None:
    assert throttle_time.driver_branch(text) == branch


def test_violation_status_where_the_driver_has_no_field(tmp_path: Path) -> None:
    clock = Clock(1.0)
    values = {
        "nvmlDeviceGetViolationStatus:0": {"referenceTime": 1, "violationTime": 5 * NS},
        "nvmlDeviceGetViolationStatus:4": {"referenceTime": 1, "violationTime": 7 * NS},
    }
    dev = device(tmp_path, {"values": values, "fields": {"78": 3 * NS}}, clock, DETAILS)
    r = throttle_time.read(dev)
    assert r is not None
    assert r.durations_ns == {"sw_power_cap": 5 * NS, "low_utilization": 3 * NS}  # the field wins for 78
    throttle_time.read(dev)
    counts = fake_of(dev).call_counts()
    # policy 0 twice (it answers); the policies that answered NOT_SUPPORTED are not asked again
    assert counts["nvmlDeviceGetViolationStatus"] == 2 + 6


def test_nothing_answers_the_feature_is_unsupported(tmp_path: Path) -> None:
    clock = Clock(0.0)
    dev = device(tmp_path, {"values": {}}, clock)
    assert throttle_time.read(dev) is None
    assert "throttle_time" in dev.feature_unsupported
    assert "throttle_time" not in dev.feature_ok  # the driver-version lookup does not count as support


def brake_scenario() -> dict[str, Any]:
    """A 0.5 s hardware power brake every 10 s: the flag and the time counter of the same cycle."""
    brake = [1] + [0] * 19
    flags = {"cycle": [0x80 * b for b in brake], "step_s": 0.5}
    return {
        "gpus": [
            {
                "uuid": "GPU-brake",
                "values": {"nvmlDeviceGetCurrentClocksEventReasons": flags},
                "fields": {"271": {"integral": {"cycle": brake, "step_s": 0.5}, "scale": NS}},
            }
        ]
    }


@pytest.mark.parametrize("phase", [0.0, 0.25, 0.6])
def test_the_counter_gives_the_true_share_where_the_flag_aliases(tmp_path: Path, phase: float) -> None:
    """Sampled every 1 s for 60 s: the flag shows the brake in 6, 6 or 0 of 60 samples (10 %, 10 %,
    0 %) depending on the sampling phase; the counter's increase gives 5 % every time."""
    start = 100.0 + phase
    clock = Clock(start)
    dev = devices(tmp_path, brake_scenario(), clock, DETAILS)[0]
    first = throttle_time.read(dev)
    flags = 0
    for k in range(60):
        clock.t = start + k
        c = clocks.read(dev)
        assert c is not None and c.event_reasons is not None
        flags += bool(c.event_reasons & 0x80)
    clock.t = start + 60
    last = throttle_time.read(dev)
    assert first is not None and last is not None
    share = (last.durations_ns["hw_power_brake_slowdown"] - first.durations_ns["hw_power_brake_slowdown"]) / NS / 60
    assert share == pytest.approx(0.05)
    assert flags / 60 == {0.0: 0.1, 0.25: 0.1, 0.6: 0.0}[phase]
