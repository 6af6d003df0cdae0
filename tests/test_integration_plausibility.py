"""The real exporter (supervisor + worker) on readings that cannot be true: the series are absent,
``nvgpu_readings_dropped_total`` counts them by feature and reason, and each reason is logged once per
GPU with the versions (issue 25, plausibility at the boundary).

Scenario values use the ordinary value kinds: a literal utilization of 250 %, used memory above
total, an energy counter whose ``sequence`` goes backwards, a process-utilization sample stamped in
the year 2100 and one for a PID that no process list names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporter_proc import Exporter, Scrape, load_scenario, write_scenario

INTERVAL = 0.5
BACK_AT_S = 4.0  # scenario time at which GPU 1's energy counter reads lower
YEAR_2100_US = 4_102_444_800 * 10**6


def implausible_scenario() -> dict[str, Any]:
    scenario = load_scenario("h200x2")
    g0, g1 = (g["values"] for g in scenario["gpus"])
    g0["nvmlDeviceGetUtilizationRates"] = {"gpu": 250, "memory": 20}
    g0["nvmlDeviceGetMemoryInfo"] = {"total": 150754820096, "reserved": 644939776, "free": 0, "used": 200 << 30}
    g0["nvmlDeviceGetComputeRunningProcesses_v3"] = [
        {"pid": 4100, "usedGpuMemory": 1 << 30, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF}
    ]
    g0["nvmlDeviceGetProcessUtilization"] = [
        {"pid": 4100, "timeStamp": YEAR_2100_US, "smUtil": 80, "memUtil": 5, "encUtil": 0, "decUtil": 0},
        {"pid": 4199, "smUtil": 30, "memUtil": 1, "encUtil": 0, "decUtil": 0},  # in no list
    ]
    g1["nvmlDeviceGetTotalEnergyConsumption"] = {
        "sequence": [{"until_s": BACK_AT_S, "value": {"ramp": 5_000_000, "per_s": 100_000}}, {"value": 1000}]
    }
    return scenario


def dropped(scrape: Scrape, gpu: str) -> dict[tuple[str, str], float]:
    return {
        (s.labels["feature"], s.labels["reason"]): s.value
        for s in scrape.find("nvgpu_readings_dropped_total")
        if s.labels["gpu"] == gpu
    }


def test_impossible_readings_are_absent_counted_and_logged_once_with_the_versions(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, implausible_scenario())
    env = {"NVGPU_FEATURE_PROCESS_USAGE": "on"}
    energy_seen: list[float | None] = []  # GPU 1's energy on /metrics, each change (None: absent)

    def energy_restarted(scrape: Scrape) -> bool:
        value = scrape.value("nvgpu_energy_consumption_joules_total", gpu="1")
        if energy_seen[-1:] != [value] and (value is not None or energy_seen):
            energy_seen.append(value)
        return value == 1.0

    with Exporter(path, tmp_path, env=env, interval=INTERVAL) as exp:
        scrape = exp.wait_for(energy_restarted, timeout=30, what="GPU 1's energy counter accepted at its new base")
        scrape = exp.wait_samples(4)
        # GPU 0: utilization of 250 % and used above total are not exported; GPU 1's are.
        assert scrape.value("nvgpu_gpu_utilization_ratio", gpu="0") is None
        assert scrape.value("nvgpu_memory_copy_utilization_ratio", gpu="0") == 0.2
        assert scrape.value("nvgpu_gpu_utilization_ratio", gpu="1") is not None
        for name in ("nvgpu_memory_used_bytes", "nvgpu_memory_total_bytes", "nvgpu_memory_reserved_bytes"):
            assert scrape.value(name, gpu="0") is None, name
            assert scrape.value(name, gpu="1") is not None, name
        assert "nan" not in scrape.text.lower()
        # the counter counts: every GPU 0 sample for the two values, exactly two energy samples of GPU 1
        counts = dropped(scrape, "0")
        assert counts[("utilization", "out_of_range")] >= 4
        assert counts[("memory", "above_total")] == counts[("utilization", "out_of_range")]
        # the fake stamps PID 4199 a new sample at every call (a busy process), each one counted
        assert counts[("processes", "join_unmatched")] >= 4
        assert dropped(scrape, "1") == {("power", "counter_decreased"): 2}
        # on /metrics the energy counter was absent while the lower value waited for confirmation, and
        # went backwards only once, to its confirmed new base
        gap = energy_seen.index(None)
        values = [v for v in energy_seen if v is not None]
        assert energy_seen[gap + 1 :] == [1.0] and gap >= 1, energy_seen
        assert values[:-1] == sorted(values[:-1]) and values[-1] < values[-2], energy_seen
        # the process's sample from the year 2100 (newer than any lastSeenTimeStamp, so NVML returns it
        # every time): dropped by the record validation each time, its utilization unknown, not 0
        records = {s.labels["reason"]: s.value for s in scrape.find("nvgpu_process_records_dropped_total", gpu="0")}
        assert set(records) == {"timestamp_in_future"} and records["timestamp_in_future"] >= 4
        assert scrape.value("nvgpu_process_memory_used_bytes", gpu="0", pid="4100") == float(1 << 30)
        assert scrape.value("nvgpu_process_sm_utilization_ratio", gpu="0", pid="4100") is None
        assert not scrape.find("nvgpu_process_sm_utilization_ratio", pid="4199")
        warnings = [r for r in exp.log_records() if "cannot be true" in r.get("msg", "")]
        by_reason = sorted((r["gpu"], r["feature"], r["reason"]) for r in warnings)
        assert by_reason == [
            (0, "memory", "above_total"),
            (0, "processes", "join_unmatched"),
            (0, "utilization", "out_of_range"),
            (1, "power", "counter_decreased"),
        ], by_reason
        assert {(r["gpu_model"], r["driver_version"]) for r in warnings} == {("NVIDIA H200", "580.159.04")}
        assert all(r["nvidia_ml_py_version"] not in ("", "unknown") for r in warnings)
        restarted = [r for r in exp.log_records() if "restarted at" in r.get("msg", "")]
        assert len(restarted) == 1 and restarted[0]["field"] == "energy_mj"
        assert exp.terminate() == 0
