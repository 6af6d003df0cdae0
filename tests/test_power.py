"""Power by scope: exporter.common.collectors.power on the fake backend. Each scope is its own
family, so GPU and module power never share a family and labels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fake_device import Clock, device, devices, fake_of, render

from exporter.common.collectors import power

ROOT = Path(__file__).resolve().parent.parent


def gh200() -> dict[str, Any]:
    """The issue's fake: GPU 300 W, module 650 W, energy rising at 650 W (a Grace module)."""
    return {
        "values": {
            "nvmlDeviceGetPowerUsage": 300_000,
            "nvmlDeviceGetEnforcedPowerLimit": 900_000,
            "nvmlDeviceGetTotalEnergyConsumption": {"ramp": 0, "per_s": 650_000},
        },
        "fields": {"185:0": 300_000, "185:1": 650_000, "185:2": 60_000, "190:1": 1_000_000},
    }


def test_each_scope_is_its_own_family(tmp_path: Path) -> None:
    clock = Clock(10.0)
    dev = device(tmp_path, gh200(), clock)
    r = power.read(dev)
    fams = render("power", [(dev, r)])
    key = ("0", dev.uuid)
    assert fams["nvgpu_power_usage_watts"] == {key: 300.0}
    assert fams["nvgpu_module_power_usage_watts"] == {key: 650.0}
    assert fams["nvgpu_memory_power_usage_watts"] == {key: 60.0}
    assert fams["nvgpu_power_limit_watts"] == {key: 900.0}
    assert fams["nvgpu_module_power_limit_watts"] == {key: 1000.0}
    # the energy counter of a Grace module covers the module: its own family, next to the module power
    assert fams["nvgpu_module_energy_consumption_joules_total"] == {key: 6500.0}  # 10 s at 650 W
    assert "nvgpu_energy_consumption_joules_total" not in fams
    assert "module" in power.MODULE_ENERGY.help and "zeus#172" in power.MODULE_ENERGY.help
    assert "scope GPU" in power.USAGE.help


def test_the_energy_scope_is_decided_once_per_reprobe_and_not_by_a_transient_miss(tmp_path: Path) -> None:
    spec = gh200()
    spec["fields"]["185:1"] = {"sequence": [{"until_s": 5, "value": {"error": "UNKNOWN"}}, {"value": 650_000}]}
    clock = Clock(1.0)
    dev = device(tmp_path, spec, clock)
    first = power.read(dev)
    assert first is not None and first.module_usage_mw is None and first.energy_mj is None  # scope not known yet
    clock.t = 6.0
    later = power.read(dev)
    assert later is not None and later.energy_is_module  # the module power answered: a Grace module


def test_h200_has_memory_power_and_no_module_scope(tmp_path: Path) -> None:
    """Measured (misc.json): scope 2 answers ~39 W idle, scope 1 NOT_SUPPORTED, asked once."""
    clock = Clock(1.0)
    dev = devices(tmp_path, json.loads((ROOT / "examples" / "scenarios" / "h200x2.json").read_text()), clock)[0]
    readings = []
    for t in (1.0, 2.0, 3.0):
        clock.t = t
        readings.append(power.read(dev))
    r = readings[-1]
    assert r is not None and r.memory_usage_mw == 38_874 and r.module_usage_mw is None
    assert ("field", 185, 1) in dev.unsupported
    fams = render("power", [(dev, r)])
    assert "nvgpu_module_power_usage_watts" not in fams and "nvgpu_module_energy_consumption_joules_total" not in fams
    assert fams["nvgpu_memory_power_usage_watts"] == {("0", dev.uuid): 38.874}
    assert ("0", dev.uuid) in fams["nvgpu_energy_consumption_joules_total"]  # a discrete board: the GPU's
    assert (
        fake_of(dev).call_counts()["nvmlDeviceGetFieldValues"] == 3
    )  # one call per sample, memory only after the first


def test_no_scoped_field_no_field_call_after_the_first(tmp_path: Path) -> None:
    clock = Clock(1.0)
    dev = device(tmp_path, {"values": {"nvmlDeviceGetPowerUsage": 100_000}}, clock)
    for _ in range(3):
        r = power.read(dev)
        assert r is not None and r.usage_mw == 100_000 and r.memory_usage_mw is None
    assert fake_of(dev).call_counts()["nvmlDeviceGetFieldValues"] == 1
    assert "power" in dev.feature_ok
