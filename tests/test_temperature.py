"""Temperatures, their thresholds and the margins to them (exporter/common/collectors/temperature.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fake_device import DETAILS, Clock, device, fake_of, render

from exporter.common.collectors import temperature

H200 = {  # measured on H200 / 580.159.04 (memory max: synthetic)
    "nvmlDeviceGetTemperatureV:0": 35,
    "nvmlDeviceGetTemperature:0": 35,
    "nvmlDeviceGetTemperatureThreshold:0": 95,
    "nvmlDeviceGetTemperatureThreshold:1": 89,
    "nvmlDeviceGetTemperatureThreshold:2": 95,
    "nvmlDeviceGetTemperatureThreshold:3": 87,
    "nvmlDeviceGetMarginTemperature": 50,
}


def gpu(values: dict[str, Any], hbm: Any = 34) -> dict[str, Any]:
    return {"values": values, "fields": {"82": hbm}}


def test_margins_from_nvml_and_the_memory_maximum(tmp_path: Path) -> None:
    dev = device(tmp_path, gpu(H200), Clock(1.0))
    r = temperature.read(dev)
    assert r == temperature.Reading(35, 34, {}, 50, 61)
    fams = render("temperature", [(dev, r)])
    key = ("0", dev.uuid)
    assert fams["nvgpu_temperature_margin_celsius"] == {key: 50.0}
    assert fams["nvgpu_memory_temperature_margin_celsius"] == {key: 61.0}
    assert "nvgpu_temperature_threshold_celsius" not in fams  # the thresholds themselves: details


def test_thresholds_with_details_are_read_once_per_reprobe(tmp_path: Path) -> None:
    dev = device(tmp_path, gpu(H200), Clock(1.0), DETAILS)
    r = temperature.read(dev)
    assert r is not None and r.thresholds_celsius == {"shutdown": 95, "slowdown": 89, "memory_max": 95, "gpu_max": 87}
    temperature.read(dev)
    assert fake_of(dev).call_counts()["nvmlDeviceGetTemperatureThreshold"] == 4
    dev.forget()
    temperature.read(dev)
    assert fake_of(dev).call_counts()["nvmlDeviceGetTemperatureThreshold"] == 8
    fams = render("temperature", [(dev, r)])
    assert fams["nvgpu_temperature_threshold_celsius"][("0", dev.uuid, "slowdown")] == 89.0


def test_a_threshold_that_failed_transiently_is_asked_again_next_sample(tmp_path: Path) -> None:
    """The slowdown threshold answers UNKNOWN until t = 5 s: not cached as absent (the computed margin
    would stay absent until the next re-probe); asked again, then kept. The memory maximum is
    NOT_SUPPORTED: cached, never asked again."""
    values = {k: v for k, v in H200.items() if k not in ("nvmlDeviceGetMarginTemperature",)}
    values["nvmlDeviceGetTemperatureThreshold:1"] = {
        "sequence": [{"until_s": 5, "value": {"error": "UNKNOWN"}}, {"value": 89}]
    }
    values["nvmlDeviceGetTemperatureThreshold:2"] = {"error": "NOT_SUPPORTED"}
    clock = Clock(1.0)
    dev = device(tmp_path, gpu(values), clock, DETAILS, driver_branch="R550")
    r = temperature.read(dev)
    assert r is not None and r.margin_celsius is None and "slowdown" not in r.thresholds_celsius
    clock.t = 6.0
    r = temperature.read(dev)
    assert r is not None and r.margin_celsius == 54 and r.thresholds_celsius["slowdown"] == 89
    assert r.memory_margin_celsius is None and "memory_max" not in r.thresholds_celsius
    clock.t = 7.0
    temperature.read(dev)
    assert fake_of(dev).call_counts()["nvmlDeviceGetTemperatureThreshold"] == 4 + 1  # slowdown once more, then kept


def test_without_the_margin_call_the_margin_is_slowdown_minus_temperature(tmp_path: Path) -> None:
    """R535/R550 lack nvmlDeviceGetMarginTemperature (12.8 header): slowdown 89 - 35 = 54."""
    dev = device(tmp_path, gpu(H200), Clock(1.0), driver_branch="R550")
    r = temperature.read(dev)
    assert r is not None and r.gpu_celsius == 35 and r.margin_celsius == 54


def test_a_gddr_board_without_memory_sensor_or_maximum_has_no_memory_margin(tmp_path: Path) -> None:
    """L40S-like: field 82 and the memory maximum answer NOT_SUPPORTED; the GPU margin stays."""
    values = {k: v for k, v in H200.items() if k != "nvmlDeviceGetTemperatureThreshold:2"}
    dev = device(tmp_path, gpu(values, hbm={"error": "NOT_SUPPORTED"}), Clock(1.0))
    r = temperature.read(dev)
    assert r is not None and r.memory_celsius is None and r.memory_margin_celsius is None
    assert r.margin_celsius == 50
