"""Each versioned call falls back once per worker to what the binding and driver have, and says so
in one info family (``nvgpu_nvml_api_info``, exporter/supervisor/apis.py): memory v2 -> v1 (the
reserved memory then counted as used), temperature V -> legacy, clock event reasons -> throttle
reasons, process lists ``_v3`` -> ``_v2``, fabric info v3 -> v2 -> v1 (tests/test_fabric.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from fake_device import DETAILS, Clock, device, fake_of

from exporter.common.collectors import clocks, memory, temperature
from exporter.common.logs import _once_keys
from exporter.common.snapshot import GpuSample
from exporter.supervisor import apis
from exporter.worker.nvml.client import ApiChoices

MEM = {"total": 150754820096, "reserved": 644939776, "free": 150109880320, "used": 0}


def choices(dev: Any) -> dict[str, tuple[str, str, str]]:
    return dict(dev.state_of(ApiChoices).calls)


def test_memory_v2_keeps_the_reserved_memory_apart(tmp_path: Path) -> None:
    dev = device(tmp_path, {"values": {"nvmlDeviceGetMemoryInfo": MEM}}, Clock(1.0))
    r = memory.read(dev)
    assert r is not None and r.used_bytes == 0 and r.reserved_bytes == 644939776 and not r.includes_reserved
    assert choices(dev) == {"memory": ("nvmlDeviceGetMemoryInfo_v2", "2", "")}


def test_memory_without_v2_falls_back_to_v1_once_and_says_reserved_is_counted_as_used(tmp_path: Path) -> None:
    """v1 ``used`` includes the driver's reservation (measured H200: v1 used 644,939,776 B = v2
    reserved): no reserved series, and the reading says so (the stuck signature will not judge
    "empty" by it)."""
    missing = {"missing_functions": ["nvmlDeviceGetMemoryInfo_v2"]}
    dev = device(tmp_path, {"values": {"nvmlDeviceGetMemoryInfo": MEM}}, Clock(1.0), **missing)
    r = memory.read(dev)
    assert r is not None and r.used_bytes == 644939776 and r.reserved_bytes is None and r.includes_reserved
    memory.read(dev)
    dev.forget()  # a re-probe does not ask v2 again: the symbol stays missing for this worker
    memory.read(dev)
    assert fake_of(dev).call_counts()["nvmlDeviceGetMemoryInfo"] == 4  # v2 once, then v1 three times
    assert choices(dev) == {"memory": ("nvmlDeviceGetMemoryInfo", "1", "function_not_found")}


def test_temperature_without_the_v_call_uses_the_legacy_one(tmp_path: Path) -> None:
    gpu = {"values": {"nvmlDeviceGetTemperature:0": 35, "nvmlDeviceGetTemperatureV:0": 35}}
    dev = device(tmp_path, gpu, Clock(1.0), driver_branch="R550")  # TemperatureV arrives with R570
    r = temperature.read(dev)
    assert r is not None and r.gpu_celsius == 35
    temperature.read(dev)
    counts = fake_of(dev).call_counts()
    assert counts["nvmlDeviceGetTemperatureV"] == 1 and counts["nvmlDeviceGetTemperature"] == 2
    assert choices(dev)["temperature"] == ("nvmlDeviceGetTemperature", "", "function_not_found")


def test_temperature_v_is_the_choice_where_it_answers(tmp_path: Path) -> None:
    dev = device(tmp_path, {"values": {"nvmlDeviceGetTemperatureV:0": 40}}, Clock(1.0))
    temperature.read(dev)
    assert choices(dev)["temperature"] == ("nvmlDeviceGetTemperatureV", "", "")


def test_clock_event_reasons_fall_back_to_the_throttle_reasons_spelling(tmp_path: Path) -> None:
    gpu = {"values": {"nvmlDeviceGetCurrentClocksThrottleReasons": 0x4, "nvmlDeviceGetClockInfo:1": 1980}}
    top = {"missing_functions": ["nvmlDeviceGetCurrentClocksEventReasons"]}
    dev = device(tmp_path, gpu, Clock(1.0), DETAILS, **top)
    r = clocks.read(dev)
    assert r is not None and r.event_reasons == 0x4
    assert choices(dev)["clock_event_reasons"] == (
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "",
        "function_not_found",
    )


@pytest.fixture
def fresh_log_once() -> Any:
    _once_keys.clear()
    yield
    _once_keys.clear()


@pytest.mark.usefixtures("fresh_log_once")
def test_a_fallback_is_logged_once_per_worker_not_per_gpu_or_reprobe(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="exporter.worker.nvml.client")
    top = {"missing_functions": ["nvmlDeviceGetMemoryInfo_v2"]}
    for i in range(3):  # three GPUs, each re-probed
        sub = tmp_path / str(i)
        sub.mkdir()
        dev = device(sub, {"values": {"nvmlDeviceGetMemoryInfo": MEM}}, Clock(1.0), **top)
        memory.read(dev)
        dev.forget()
        memory.read(dev)
    said = [r for r in caplog.records if "using nvmlDeviceGetMemoryInfo v1" in r.getMessage()]
    assert len(said) == 1 and "FUNCTION_NOT_FOUND" in said[0].getMessage()


def test_the_family_is_one_series_per_distinct_choice_over_the_gpus() -> None:
    v1 = ("memory", "nvmlDeviceGetMemoryInfo", "1", "function_not_found")
    legacy = ("temperature", "nvmlDeviceGetTemperature", "", "function_not_found")
    gpus = [GpuSample(0, "GPU-a", apis=(v1, legacy)), GpuSample(1, "GPU-b", apis=(v1,))]
    (fam,) = apis.families(gpus)
    assert fam.name == "nvgpu_nvml_api_info"
    got = sorted((tuple(s.labels.values()), s.value) for s in fam.samples)
    assert got == [(v1, 1.0), (legacy, 1.0)]
    assert "gpu" not in fam.samples[0].labels
    assert apis.families([GpuSample(0, "GPU-a")]) == []


def test_an_r535_node_takes_each_fallback_once_says_so_and_reprobes_quietly(tmp_path: Path) -> None:
    """The shipped A100 / R535 scenario on the real exporter, re-probed every second: the legacy
    temperature call is chosen once per worker and shown in nvgpu_nvml_api_info, said once in the
    log; four re-probe periods later nothing more is logged, nothing answers "again", and nothing
    is a warning (the hardware saying no is not a fault)."""
    from exporter_proc import SCENARIOS, Exporter

    env = {"NVGPU_REPROBE_SECONDS": "1"}
    with Exporter(SCENARIOS / "a100x2-r535.json", tmp_path, env=env, interval=0.25) as exp:
        s = exp.wait_for(lambda s: bool(s.find("nvgpu_nvml_api_info", call="temperature")), what="the api info")
        legacy = {"call": "temperature", "function": "nvmlDeviceGetTemperature", "fallback": "function_not_found"}
        assert s.value("nvgpu_nvml_api_info", **legacy) == 1.0
        assert not s.find("nvgpu_fabric_state") and not s.find("nvgpu_gpm_sm_activity_ratio")
        assert s.value("nvgpu_feature_enabled", feature="gpm", reason="unsupported") == 0.0
        exp.wait_samples(16)
        records = list(exp.log_records())
        said = [r for r in records if r.get("msg", "").startswith("temperature: using nvmlDeviceGetTemperature")]
        assert len(said) == 1, said
        assert not [r for r in records if "answers again" in r.get("msg", "")]
        assert not [r for r in records if r.get("level") in ("WARNING", "ERROR")], [
            r["msg"] for r in records if r.get("level") in ("WARNING", "ERROR")
        ]
        assert exp.terminate() == 0
