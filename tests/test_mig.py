"""MIG: exporter.common.collectors.mig, GPM per GPU instance, utilization and the stuck signature
on MIG GPUs, on the fake backend (docs/scenarios.md, "MIG"), and the shipped scenario's golden.

The checks against duplicate series use prometheus_client's parser: promtool 2.42 does not flag
a series that appears twice in one exposition (Prometheus rejects such a scrape).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from exporter_proc import load_scenario
from fake_device import Clock, device, fake_of, render, wire
from prometheus_client.parser import text_string_to_metric_families
from series_checks import duplicate_series, instance_problems

from exporter.common.collectors import gpm, mig, utilization
from exporter.common.snapshot import GpuSample, Snapshot, SystemInfo
from exporter.supervisor.stuck import StuckDetector
from exporter.worker.nvml.client import DeviceClient

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "h200x2-mig.prom"
GIB = 1 << 30
PROFILES = {
    "19": {"name": "MIG 1g.18gb", "index": 0, "sliceCount": 1, "memorySizeMB": 17920},
    "14": {"name": "MIG 2g.35gb", "index": 1, "sliceCount": 2, "memorySizeMB": 35840},
    "9": {"name": "MIG 3g.71gb", "index": 2, "sliceCount": 3, "memorySizeMB": 71680},
}


def inst(gi: int, ci: int, profile: int, uuid: str, **values: Any) -> dict[str, Any]:
    """One MIG device of a layout (memory listed unless given: every instance of a real GPU answers)."""
    values.setdefault("nvmlDeviceGetMemoryInfo", {"total": 18 * GIB, "used": gi * GIB, "free": 0, "reserved": 0})
    return {"gpu_instance_id": gi, "compute_instance_id": ci, "profile_id": profile, "uuid": uuid, "values": values}


LAYOUT = [
    inst(
        2,
        0,
        9,
        "MIG-aaaaaaaa-0000-5000-8000-000000000002",
        nvmlDeviceGetComputeRunningProcesses_v3=[
            {"pid": 101, "usedGpuMemory": 3 * GIB, "gpuInstanceId": 2, "computeInstanceId": 0}
        ],
        **{"nvmlGpmMetricsGet:2": 80.0},
    ),
    # one GPU instance, two compute instances: its memory once, each its own processes
    inst(
        3,
        0,
        14,
        "MIG-aaaaaaaa-0000-5000-8000-000000000030",
        nvmlDeviceGetComputeRunningProcesses_v3=[
            {"pid": 201, "usedGpuMemory": GIB, "gpuInstanceId": 3, "computeInstanceId": 0},
            {"pid": 202, "usedGpuMemory": 2 * GIB, "gpuInstanceId": 3, "computeInstanceId": 1},  # the other CI's
        ],
    ),
    inst(3, 1, 14, "MIG-aaaaaaaa-0000-5000-8000-000000000031"),
    inst(9, 0, 19, "MIG-aaaaaaaa-0000-5000-8000-000000000090"),
]


def mig_gpu(mode: Any = (1, 1), layouts: Any = None, **values: Any) -> dict[str, Any]:
    gpm_values = {f"nvmlGpmMetricsGet:{m}": 10.0 for m in gpm.MIG_METRIC_IDS}
    return {
        "values": {
            "nvmlGpmQueryDeviceSupport": {"isSupportedDevice": 1},
            "nvmlDeviceGetUtilizationRates": {"gpu": 0, "memory": 0},
            **gpm_values,
            **values,
        },
        "mig": {
            "mode": list(mode) if isinstance(mode, tuple) else mode,
            "max_devices": 7,
            "profiles": PROFILES,
            "layouts": layouts if layouts is not None else [{"instances": copy.deepcopy(LAYOUT)}],
        },
    }


def calls(dev: DeviceClient, fn: str) -> int:
    return fake_of(dev).call_counts().get(fn, 0)


# -- 1. enumeration -----------------------------------------------------------------------------------


def test_enumeration_ids_profiles_uuids_memory_once_per_gpu_instance(tmp_path: Path) -> None:
    dev = device(tmp_path, mig_gpu(), Clock())
    r = mig.read(dev)
    assert r is not None and r.enabled and (r.current_mode, r.pending_mode) == (1, 1)
    assert [(d.index, d.gpu_instance_id, d.compute_instance_id) for d in r.devices] == [
        (0, 2, 0),
        (1, 3, 0),
        (2, 3, 1),
        (3, 9, 0),
    ]
    # profiles from the MIG devices' names ("NVIDIA H200 MIG 3g.71gb"): no privileged call needed
    assert [(g.gpu_instance_id, g.profile) for g in r.gpu_instances] == [(2, "3g.71gb"), (3, "2g.35gb"), (9, "1g.18gb")]
    assert calls(dev, "nvmlDeviceGetGpuInstanceById") == 0
    assert [d.profile for d in r.devices] == ["3g.71gb", "2g.35gb", "2g.35gb", "1g.18gb"]
    assert {g.gpu_instance_id: g.memory_used_bytes for g in r.gpu_instances} == {2: 2 * GIB, 3: 3 * GIB, 9: 9 * GIB}
    by_ci = {(d.gpu_instance_id, d.compute_instance_id): d for d in r.devices}
    assert (by_ci[(2, 0)].processes, by_ci[(2, 0)].processes_memory_bytes) == (1, 3 * GIB)
    assert (by_ci[(3, 0)].processes, by_ci[(3, 0)].processes_memory_bytes) == (1, GIB)  # pid 202 is CI 1's
    assert (by_ci[(9, 0)].processes, by_ci[(9, 0)].processes_memory_bytes) == (0, 0)
    fams = render("mig", [(dev, r)])
    key = ("0", dev.uuid)
    assert fams["nvgpu_mig_mode"] == {key: 1.0} and fams["nvgpu_mig_mode_pending"] == {key: 1.0}
    assert len(fams["nvgpu_mig_instance_info"]) == 4
    assert fams["nvgpu_mig_memory_used_bytes"] == {
        (*key, "2", "3g.71gb"): 2 * GIB,
        (*key, "3", "2g.35gb"): 3 * GIB,  # one series for the GPU instance of two compute instances
        (*key, "9", "1g.18gb"): 9 * GIB,
    }
    assert (
        fams["nvgpu_mig_compute_processes"][(*key, "3", "1", "2g.35gb", "MIG-aaaaaaaa-0000-5000-8000-000000000031")]
        == 0.0
    )


def test_a_gpu_with_mig_off_costs_one_mode_read_per_reprobe_and_has_no_series(tmp_path: Path) -> None:
    dev = device(tmp_path, mig_gpu(mode=(0, 0)), Clock())
    for _ in range(5):
        r = mig.read(dev)
        assert r is not None and not r.enabled and r.devices == ()
    assert calls(dev, "nvmlDeviceGetMigMode") == 1
    assert calls(dev, "nvmlDeviceGetMaxMigDeviceCount") == 0
    assert render("mig", [(dev, r)]) == {}  # MIG off and staying off: no MIG series at all
    dev.forget()  # a re-probe (periodic, or after a MIG configuration change event)
    mig.read(dev)
    assert calls(dev, "nvmlDeviceGetMigMode") == 2


def test_a_pending_change_is_exported(tmp_path: Path) -> None:
    dev = device(tmp_path, mig_gpu(mode=(0, 1)), Clock())
    r = mig.read(dev)
    fams = render("mig", [(dev, r)])
    assert fams["nvgpu_mig_mode"] == {("0", dev.uuid): 0.0}
    assert fams["nvgpu_mig_mode_pending"] == {("0", dev.uuid): 1.0}
    assert "nvgpu_mig_instance_info" not in fams


def test_a_gpu_without_mig_has_no_reading_and_the_feature_unsupported(tmp_path: Path) -> None:
    dev = device(tmp_path, {"values": {}}, Clock())  # nvmlDeviceGetMigMode answers NOT_SUPPORTED
    assert mig.read(dev) is None and mig.read(dev) is None
    assert calls(dev, "nvmlDeviceGetMigMode") == 1
    assert "mig" in dev.feature_unsupported and "mig" not in dev.feature_ok


def nameless() -> list[dict[str, Any]]:
    """LAYOUT with MIG device names that say no profile (the profile must be asked for)."""
    layout = copy.deepcopy(LAYOUT)
    for i in layout:
        i["values"]["nvmlDeviceGetName"] = "NVIDIA H200"
    return layout


def test_a_compute_instance_names_its_own_profile_and_its_gpu_instance_the_gi_profile(tmp_path: Path) -> None:
    layout = copy.deepcopy(LAYOUT)
    for i in layout[1:3]:  # GI 3 split into two compute instances of one slice each
        i["values"]["nvmlDeviceGetName"] = "NVIDIA H200 MIG 1c.2g.35gb"
    dev = device(tmp_path, mig_gpu(layouts=[{"instances": layout}]), Clock())
    r = mig.read(dev)
    assert r is not None and [d.profile for d in r.devices] == ["3g.71gb", "1c.2g.35gb", "1c.2g.35gb", "1g.18gb"]
    assert r.profile_of(3) == "2g.35gb"
    fams = render("mig", [(dev, r)])
    assert {k[4] for k in fams["nvgpu_mig_instance_info"] if k[2] == "3"} == {"1c.2g.35gb"}
    assert ("0", dev.uuid, "3", "2g.35gb") in fams["nvgpu_mig_memory_used_bytes"]


def test_profile_by_id_when_the_names_say_nothing(tmp_path: Path) -> None:
    dev = device(tmp_path, mig_gpu(layouts=[{"instances": nameless()}]), Clock())
    r = mig.read(dev)
    assert r is not None and [(g.profile_id, g.profile) for g in r.gpu_instances] == [
        (9, "3g.71gb"),  # nvmlGpuInstanceProfileInfo_v2_t.name "MIG 3g.71gb" without the prefix
        (14, "2g.35gb"),
        (19, "1g.18gb"),
    ]
    assert r.device_profile(r.devices[0]) == "3g.71gb"


def test_profile_names_by_index_when_the_by_id_call_is_missing(tmp_path: Path) -> None:
    missing = ["nvmlDeviceGetGpuInstanceProfileInfoById"]
    dev = device(tmp_path, mig_gpu(layouts=[{"instances": nameless()}]), Clock(), missing_functions=missing)
    r = mig.read(dev)
    assert r is not None and [g.profile for g in r.gpu_instances] == ["3g.71gb", "2g.35gb", "1g.18gb"]
    mig.read(dev)
    assert calls(dev, "nvmlDeviceGetGpuInstanceProfileInfo") == mig.PROFILE_COUNT  # every index once
    assert ("nvmlDeviceGetGpuInstanceProfileInfoById",) in dev.unsupported


def test_an_unprivileged_exporter_without_profile_names_still_lists_its_instances(tmp_path: Path) -> None:
    """nvmlDeviceGetGpuInstanceById "Requires privileged user": NO_PERMISSION is cached, the profile
    label stays empty, everything else is read, and the call is not repeated every sample."""
    gpu = mig_gpu(layouts=[{"instances": nameless()}], nvmlDeviceGetGpuInstanceById={"error": "NO_PERMISSION"})
    dev = device(tmp_path, gpu, Clock())
    for _ in range(3):
        r = mig.read(dev)
    assert r is not None and [g.profile for g in r.gpu_instances] == ["", "", ""]
    assert len(r.devices) == 4 and r.gpu_instances[0].memory_used_bytes == 2 * GIB
    assert calls(dev, "nvmlDeviceGetGpuInstanceById") == 1
    assert not dev.client.errors


# -- 5. per-instance errors ---------------------------------------------------------------------------


def test_per_instance_errors_cost_that_instance_only(tmp_path: Path) -> None:
    layout = copy.deepcopy(LAYOUT)
    layout[0]["values"]["nvmlDeviceGetMemoryInfo"] = {"error": "UNKNOWN"}  # GI 2's memory: transient
    layout[3]["values"]["nvmlDeviceGetMigDeviceHandleByIndex"] = {"error": "UNKNOWN"}  # GI 9's handle
    dev = device(tmp_path, mig_gpu(layouts=[{"instances": layout}]), Clock())
    r = mig.read(dev)
    assert r is not None
    assert [d.gpu_instance_id for d in r.devices] == [2, 3, 3]  # GI 9's MIG device left out this sample
    mem = {g.gpu_instance_id: g.memory_used_bytes for g in r.gpu_instances}
    assert mem == {2: None, 3: 3 * GIB}
    assert dev.client.errors[("mig", "UNKNOWN")] == 2  # counted, not cached as unsupported
    assert not any(k[:2] == ("mig", "nvmlDeviceGetMemoryInfo") for k in dev.unsupported)


def test_a_handle_whose_instance_went_away_only_omits_the_reading(tmp_path: Path) -> None:
    """Handles "must be requested again" after a destroy (NVML API reference): the stale handle's
    INVALID_ARGUMENT is neither a bug nor unsupported; the next sample enumerates again."""
    clock = Clock()
    layouts = [{"until_s": 10, "instances": copy.deepcopy(LAYOUT)}, {"instances": copy.deepcopy(LAYOUT[1:])}]
    dev = device(tmp_path, mig_gpu(layouts=layouts), clock)
    stale = dev.client.raw("mig", "nvmlDeviceGetMigDeviceHandleByIndex", dev.uuid, dev.handle, 0)
    clock.t = 20.0
    assert mig._on(dev, "nvmlDeviceGetUUID", stale) is None
    assert not dev.client.errors and ("mig", "nvmlDeviceGetUUID") not in dev.unsupported
    r = mig.read(dev)
    assert r is not None and [d.gpu_instance_id for d in r.devices] == [3, 3, 9]


# -- 3. reconfiguration in the collectors ----------------------------------------------------------------


def test_instances_created_and_destroyed_show_in_the_next_sample(tmp_path: Path) -> None:
    clock = Clock()
    later = [inst(1, 0, 19, "MIG-bbbbbbbb-0000-5000-8000-000000000010"), *copy.deepcopy(LAYOUT[1:3])]
    dev = device(
        tmp_path, mig_gpu(layouts=[{"until_s": 10, "instances": copy.deepcopy(LAYOUT)}, {"instances": later}]), clock
    )
    before = mig.read(dev)
    clock.t = 10.0
    after = mig.read(dev)
    assert before is not None and after is not None
    assert {d.uuid for d in after.devices} == {i["uuid"] for i in later}
    assert [g.gpu_instance_id for g in after.gpu_instances] == [1, 3]
    fams = render("mig", [(dev, after)])
    assert {k[-1] for k in fams["nvgpu_mig_instance_info"]} == {i["uuid"] for i in later}  # stale ones gone


def test_mig_going_off_under_a_running_worker_asks_for_a_reprobe(tmp_path: Path) -> None:
    clock = Clock()
    mode = {"sequence": [{"until_s": 10, "value": [1, 1]}, {"value": [0, 0]}]}
    dev = device(tmp_path, mig_gpu(mode=mode), clock)
    assert mig.read(dev) is not None and utilization.read(dev) is None
    assert "utilization" in dev.feature_unsupported - dev.feature_ok  # absent, the reason visible on the GPU
    clock.t = 10.0
    r = mig.read(dev)
    assert r is not None and not r.enabled and dev.reprobe_requested
    dev.forget()  # what the GPU's thread does before its next pass
    assert mig.read(dev) is not None
    u = utilization.read(dev)
    assert u is not None and u.gpu_percent == 0 and "utilization" not in dev.feature_unsupported - dev.feature_ok


# -- 2. GPM per GPU instance --------------------------------------------------------------------------------


def test_gpm_per_gpu_instance_with_windows_freed_and_restarted(tmp_path: Path) -> None:
    clock = Clock()
    reshaped = copy.deepcopy(LAYOUT[:2])
    reshaped[1]["profile_id"] = 19  # GPU instance 3 destroyed and created again as a 1g.18gb
    dev = device(
        tmp_path, mig_gpu(layouts=[{"until_s": 10, "instances": copy.deepcopy(LAYOUT)}, {"instances": reshaped}]), clock
    )
    fake = fake_of(dev)

    def sample(t: float) -> gpm.Reading | None:
        clock.t = t
        mig.read(dev)
        return gpm.read(dev)

    assert sample(0.0) is None  # first sample of every window
    assert len(fake._gpm_samples) == 6  # two buffers per GPU instance, none for the whole GPU
    r = sample(5.0)
    assert r is not None and r.activity_percent == {} and r.transferred_bytes == {}
    assert {g.gpu_instance_id: g.activity_percent[gpm.SM_UTIL] for g in r.instances} == {2: 80.0, 3: 10.0, 9: 10.0}
    fams = render("gpm", [(dev, r)])
    assert fams["nvgpu_mig_gpm_sm_activity_ratio"][("0", dev.uuid, "2", "3g.71gb")] == pytest.approx(0.8)
    assert not any(name.startswith("nvgpu_gpm_") for name in fams)  # nothing for the whole GPU
    r = sample(10.0)  # GI 9 gone, GI 3 reshaped: GI 2's window goes on, GI 3's starts again
    assert r is not None and [g.gpu_instance_id for g in r.instances] == [2]
    assert len(fake._gpm_samples) == 4  # GI 9's and the old GI 3's buffers freed
    r = sample(15.0)
    assert r is not None and {g.gpu_instance_id: g.profile for g in r.instances} == {2: "3g.71gb", 3: "1g.18gb"}
    assert "gpm" not in dev.feature_unsupported


def test_gpm_windows_follow_mig_mode(tmp_path: Path) -> None:
    clock = Clock()
    mode = {"sequence": [{"until_s": 10, "value": [0, 0]}, {"until_s": 20, "value": [1, 1]}, {"value": [0, 0]}]}
    dev = device(tmp_path, mig_gpu(mode=mode, **{f"nvmlGpmMetricsGet:{m}": 5.0 for m in gpm.METRIC_IDS}), clock)
    fake = fake_of(dev)
    for t in (0.0, 5.0):
        clock.t = t
        mig.read(dev)
        gpm.read(dev)
    assert len(fake._gpm_samples) == 2  # the whole GPU's window
    clock.t = 10.0
    dev.forget()  # the MIG configuration change event's re-probe
    mig.read(dev)
    gpm.read(dev)
    assert len(fake._gpm_samples) == 6  # the GPU's window freed, one per GPU instance
    clock.t = 20.0
    mig.read(dev)
    dev.forget()
    mig.read(dev)
    assert gpm.read(dev) is None and len(fake._gpm_samples) == 2  # per-instance windows freed
    clock.t = 25.0
    mig.read(dev)
    r = gpm.read(dev)
    assert r is not None and r.activity_percent[gpm.SM_UTIL] == 5.0 and r.instances == ()


def test_without_the_mig_feature_gpm_skips_a_mig_gpu(tmp_path: Path) -> None:
    dev = device(tmp_path, mig_gpu(), Clock())
    assert gpm.read(dev) is None  # the mig feature did not read a layout: GPM probes the mode itself
    assert "gpm" in dev.feature_unsupported
    assert any("mig feature" in why for _, why in dev.unsupported.values())


# -- the wire and the supervisor ---------------------------------------------------------------------------


def test_readings_survive_the_wire_nested(tmp_path: Path) -> None:
    clock = Clock()
    dev = device(tmp_path, mig_gpu(), clock)
    r = mig.read(dev)
    assert wire(r) == r
    gpm.read(dev)
    clock.t = 5.0
    mig.read(dev)
    g = gpm.read(dev)
    assert g is not None and wire(g) == g


def test_the_stuck_signature_is_not_evaluated_on_a_mig_gpu() -> None:
    from exporter.common.collectors import memory, processes

    readings: dict[str, object] = {
        "mig": mig.Reading(1, 1),
        "utilization": utilization.Reading(100, 0, 0, 0),  # a driver that answered anyway
        "processes": processes.Reading(0, 0),
        "memory": memory.Reading(150 * GIB, 0, 150 * GIB, 0, 0, 0),
    }
    det = StuckDetector(0.99, 64 << 20, 0.0)
    det.on_snapshot(Snapshot(1.0, 0.0, SystemInfo(), (GpuSample(0, "GPU-0", "up", readings, 1.0),), {}, {}, {}, 0, {}))
    assert not det.gpus[next(iter(det.gpus))].evaluable
    assert not list(det.gpu_families(Snapshot(1.0, 0.0, SystemInfo(), (), {}, {}, {}, 0, {})))[0].samples


# -- the golden: no duplicate series, instances never exported as GPUs -------------------------------------


def test_lint_helpers_catch_what_they_look_for() -> None:
    dup = 'nvgpu_mig_mode{gpu="0",uuid="GPU-a"} 1\nnvgpu_mig_mode{uuid="GPU-a",gpu="0"} 1\n'
    assert duplicate_series(dup) == [("nvgpu_mig_mode", (("gpu", "0"), ("uuid", "GPU-a")))]
    bad = 'nvgpu_memory_used_bytes{gpu="0",uuid="MIG-x",gpu_instance_id="1"} 1\n'
    assert len(instance_problems(bad)) == 2


def test_golden_has_no_duplicate_series_and_no_instance_as_a_gpu() -> None:
    text = GOLDEN.read_text()
    assert "nvgpu_mig_instance_info" in text
    assert duplicate_series(text) == []
    assert instance_problems(text) == []


def test_golden_mig_gpu_has_no_device_wide_utilization_and_says_why() -> None:
    fams = {f.name: f for f in text_string_to_metric_families(GOLDEN.read_text())}
    uuid0 = next(s.labels["uuid"] for s in fams["nvgpu_mig_mode"].samples)
    util = [s for s in fams["nvgpu_gpu_utilization_ratio"].samples if s.labels["uuid"] == uuid0]
    assert util == []  # absent, not 0
    unsupported = {
        s.labels["feature"] for s in fams["nvgpu_gpu_feature_unsupported"].samples if s.labels["uuid"] == uuid0
    }
    assert "utilization" in unsupported and "gpm" not in unsupported
    assert [s.value for s in fams["nvgpu_mig_mode"].samples] == [1.0]  # only the MIG GPU has MIG series
    assert not [s for s in fams["nvgpu_stuck_context_suspected"].samples if s.labels["uuid"] == uuid0]


def test_scenario_h200x2_mig_is_one_mig_gpu_with_mixed_profiles_and_one_not() -> None:
    data = load_scenario("h200x2-mig")
    g0, g1 = data["gpus"]
    assert "mig" in g0 and "mig" not in g1 and g1["values"]["nvmlDeviceGetMigMode"] == [0, 0]
    profiles = {i["profile_id"] for i in g0["mig"]["layouts"][0]["instances"]}
    assert len(profiles) >= 3


def test_a_gpm_sample_of_a_gpu_instance_gone_since_the_layout_is_counted_not_zero(tmp_path: Path) -> None:
    """The layout of this pass lists GPU instance 9; by the time GPM samples it, it is gone."""
    from exporter.common import plausibility

    clock = Clock()
    layouts = [{"until_s": 10, "instances": copy.deepcopy(LAYOUT)}, {"instances": copy.deepcopy(LAYOUT[:3])}]
    dev = device(tmp_path, mig_gpu(layouts=layouts), clock)
    for t in (0.0, 5.0):
        clock.t = t
        mig.read(dev)
        gpm.read(dev)
    clock.t = 9.9
    mig.read(dev)  # still lists GPU instance 9
    clock.t = 10.0
    r = gpm.read(dev)
    assert r is not None and 9 not in {g.gpu_instance_id for g in r.instances}
    assert dev.state_of(plausibility.Dropped).by_feature() == {"gpm": {"join_unmatched": 1}}
    assert not dev.client.errors and ("nvmlGpmMigSampleGet",) not in dev.unsupported
