"""Through the real exporter (supervisor + worker) on the fake backend: GPM series and their
agreement with the NVLink byte counters, a crash inside a GPM call quarantining only GPM, and a
driver without GPM or fabric leaving those series absent (never NaN, never 0)."""

from __future__ import annotations

from pathlib import Path

from exporter_proc import Exporter, load_scenario, write_scenario

UUID0 = "GPU-ef65bf38-0ae6-479b-9ebc-46c6463961e6"
GPM_RATIOS = {
    "nvgpu_gpm_graphics_activity_ratio",
    "nvgpu_gpm_sm_activity_ratio",
    "nvgpu_gpm_sm_occupancy_ratio",
    "nvgpu_gpm_tensor_activity_ratio",
    "nvgpu_gpm_dram_bandwidth_ratio",
}


def test_gpm_nvlink_bytes_measure_the_traffic_where_the_field_counters_are_off(tmp_path: Path) -> None:
    """GPM is asked for NVLink traffic only while nvlink_throughput is off (the H20 / 580
    known issue, here by env); then its counters carry the scenario's traffic (GPU 0 sends
    1000 KiB/s on each of 18 links), and the field counters are absent."""
    env = {"NVGPU_FEATURE_NVLINK_THROUGHPUT": "off"}
    with Exporter(write_scenario(tmp_path, load_scenario("h200x2")), tmp_path, env=env, interval=0.5) as exp:
        first = exp.wait_for(
            lambda s: s.value("nvgpu_gpm_nvlink_transmit_bytes_total", gpu="0", uuid=UUID0) is not None,
            what="GPM NVLink counters",
        )
        t0 = first.value("nvgpu_last_sample_timestamp_seconds") or 0.0
        last = exp.wait_for(
            lambda s: (s.value("nvgpu_last_sample_timestamp_seconds") or 0) >= t0 + 3.0, what="3 s of samples"
        )
        seconds = (last.value("nvgpu_last_sample_timestamp_seconds") or 0.0) - t0
        gpm = [s.value("nvgpu_gpm_nvlink_transmit_bytes_total", gpu="0", uuid=UUID0) or 0.0 for s in (first, last)]
        expected = 18 * 1000 * 1024 * seconds
        assert abs((gpm[1] - gpm[0]) - expected) <= 0.03 * expected, (gpm, expected)
        assert not last.find("nvgpu_nvlink_transmit_bytes_total")
        assert {s.name for s in last.samples if s.labels.get("gpu") == "0"} >= GPM_RATIOS
        assert "nan" not in last.text.lower()
        assert exp.terminate() == 0


def test_gpm_does_not_duplicate_the_nvlink_byte_counters(tmp_path: Path) -> None:
    """With nvlink_throughput on (the default), NVLink bytes come from the field counters
    only: GPM's would be the same numbers twice."""
    with Exporter(write_scenario(tmp_path, load_scenario("h200x2")), tmp_path, interval=0.5) as exp:
        s = exp.wait_for(
            lambda s: bool(s.find("nvgpu_gpm_sm_activity_ratio")) and bool(s.find("nvgpu_nvlink_transmit_bytes_total")),
            what="GPM and the NVLink byte counters",
        )
        assert not s.find("nvgpu_gpm_nvlink_transmit_bytes_total")
        assert not s.find("nvgpu_gpm_nvlink_receive_bytes_total")
        assert exp.terminate() == 0


def test_a_crash_in_a_gpm_call_quarantines_gpm_only(tmp_path: Path) -> None:
    scenario = load_scenario("h200x2")
    scenario["faults"] = [{"function": "nvmlGpmMetricsGet", "action": "segfault", "comment": "native crash in GPM"}]
    env = {"NVGPU_QUARANTINE_AFTER": "1"}
    with Exporter(write_scenario(tmp_path, scenario), tmp_path, env=env, interval=0.5) as exp:
        s = exp.wait_for(
            lambda s: (
                s.value("nvgpu_feature_enabled", feature="gpm", reason="quarantined") == 0.0
                and s.value("nvgpu_up") == 1.0
                and bool(s.find("nvgpu_power_usage_watts"))
            ),
            timeout=30,
            what="gpm quarantined, sampling again",
        )
        crashes = {(x.labels["feature"], x.labels["function"]): x.value for x in s.find("nvgpu_worker_crashes_total")}
        # one per GPU: the first crash is contained to its GPU, the second, on the other GPU, quarantines gpm
        assert crashes == {("gpm", "nvmlGpmMetricsGet"): 2.0}
        names = {x.name for x in s.samples}
        assert not names & GPM_RATIOS
        assert {
            "nvgpu_clock_event_reason_seconds_total",
            "nvgpu_fabric_state",
            "nvgpu_memory_power_usage_watts",
        } <= names
        assert exp.terminate() == 0


def test_driver_without_gpm_or_fabric(tmp_path: Path) -> None:
    """An older driver: every GPM and fabric function missing (the v1 fabric call too: the exporter
    falls back to it where only the V call is missing). The features are switched off as
    unsupported, their series are absent and nothing else is affected."""
    scenario = load_scenario("h200x2")
    scenario["missing_functions"] = [
        "nvmlGpmQueryDeviceSupport",
        "nvmlGpmSampleAlloc",
        "nvmlGpmSampleGet",
        "nvmlGpmMetricsGet",
        "nvmlDeviceGetGpuFabricInfoV",
        "nvmlDeviceGetGpuFabricInfo",
    ]
    with Exporter(write_scenario(tmp_path, scenario), tmp_path, interval=0.5) as exp:
        s = exp.wait_for(
            lambda s: (
                s.value("nvgpu_feature_enabled", feature="gpm", reason="unsupported") == 0.0
                and s.value("nvgpu_feature_enabled", feature="fabric", reason="unsupported") == 0.0
            ),
            what="gpm and fabric unsupported",
        )
        names = {x.name for x in s.samples}
        assert not {n for n in names if n.startswith(("nvgpu_gpm_", "nvgpu_fabric_"))}
        assert "nan" not in s.text.lower()
        assert s.value("nvgpu_feature_success", feature="power") == 1.0
        assert {x.labels["gpu"] for x in s.find("nvgpu_clock_event_reason_seconds_total")} == {"0", "1"}
        assert exp.terminate() == 0
