"""MIG reconfiguration while the real exporter runs (supervisor and worker on the
fake backend).

Timeline (scenario time, seconds since the exporter started):

- before 8 s: GPU 0 in MIG mode with a 1g.18gb (GI 1) and a 3g.71gb (GI 2); GPU 1 with MIG off;
- from 8 s: on GPU 0, GI 1 is destroyed, GI 2 gets a second compute instance and a 2g.35gb (GI 5)
  is created; GPU 1 goes into MIG mode with one 7g.141gb (MIG off -> on);
- from 16 s: GPU 0 leaves MIG mode (on -> off).

On a MIG-enabled GPU the layout is read every sample: GPU 0's changes show in the next sample. A
GPU with MIG off is asked again at the next re-probe (``NVGPU_REPROBE_SECONDS``) or at once after a
MIG configuration change event: both ways are run for GPU 1. Every scrape is checked for duplicate
series and for instances exported as GPUs (a parser, since promtool 2.42 does not flag
duplicates), and for stale instances next to new ones; the worker must never restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from exporter_proc import Exporter, Scrape, load_scenario, write_scenario
from series_checks import duplicate_series, instance_problems

REPROBE_S = 3.0
INTERVAL = 0.5


def _uuid(gpu: int, gi: int, ci: int) -> str:
    return f"MIG-{gpu:08x}-{gi:04x}-5000-8000-{ci:012x}"


def _inst(gpu: int, gi: int, ci: int, profile: int, used_gib: int) -> dict[str, Any]:
    return {
        "gpu_instance_id": gi,
        "compute_instance_id": ci,
        "profile_id": profile,
        "uuid": _uuid(gpu, gi, ci),
        "values": {"nvmlDeviceGetMemoryInfo": {"total": 40 << 30, "used": used_gib << 30, "free": 0, "reserved": 0}},
    }


PROFILES = {
    "19": {"name": "MIG 1g.18gb", "index": 0},
    "14": {"name": "MIG 2g.35gb", "index": 1},
    "9": {"name": "MIG 3g.71gb", "index": 2},
    "0": {"name": "MIG 7g.141gb", "index": 4},
}
GPU0_BEFORE = {_uuid(0, 1, 0), _uuid(0, 2, 0)}
GPU0_AFTER = {_uuid(0, 2, 0), _uuid(0, 2, 1), _uuid(0, 5, 0)}
GPU1_AFTER = {_uuid(1, 0, 0)}


def scenario(events: bool) -> dict[str, Any]:
    data: dict[str, Any] = load_scenario("h200x2")
    data["description"] = "tests/test_integration_mig.py: MIG layouts and modes changing at 8 s and 16 s"
    g0, g1 = data["gpus"]
    for g in (g0, g1):
        del g["values"]["nvmlDeviceGetMigMode"]
    g0["mig"] = {
        "mode": {"sequence": [{"until_s": 16, "value": [1, 1]}, {"value": [0, 0]}]},
        "profiles": PROFILES,
        "layouts": [
            {"until_s": 8, "instances": [_inst(0, 1, 0, 19, 1), _inst(0, 2, 0, 9, 2)]},
            {"instances": [_inst(0, 2, 0, 9, 2), _inst(0, 2, 1, 9, 2), _inst(0, 5, 0, 14, 5)]},
        ],
    }
    g1["mig"] = {
        "mode": {"sequence": [{"until_s": 8, "value": [0, 0]}, {"value": [1, 1]}]},
        "profiles": PROFILES,
        "layouts": [{"instances": [_inst(1, 0, 0, 0, 7)]}],
    }
    if events:
        data["events"] = [{"at_s": 8.2, "gpu": 1, "event_type": "MigConfigChange"}]
    return data


def instances(s: Scrape, gpu: str) -> set[str]:
    return {x.labels["mig_uuid"] for x in s.find("nvgpu_mig_instance_info", gpu=gpu)}


def gpu_instances(s: Scrape, gpu: str) -> set[str]:
    return {x.labels["gpu_instance_id"] for x in s.find("nvgpu_mig_memory_used_bytes", gpu=gpu)}


class Checked:
    """Every scrape: no duplicate series, no instance exported as a GPU, no stale instance next to a
    new one, no worker restart."""

    def __init__(self) -> None:
        self.scrapes = 0

    def __call__(self, s: Scrape) -> Scrape:
        self.scrapes += 1
        assert duplicate_series(s.text) == [], duplicate_series(s.text)
        assert instance_problems(s.text) == []
        seen = instances(s, "0")
        assert seen in (set(), GPU0_BEFORE, GPU0_AFTER), f"GPU 0 instances mixed: {sorted(seen)}"
        assert instances(s, "1") in (set(), GPU1_AFTER)
        assert not any(x.value for x in s.find("nvgpu_worker_restarts_total")), "the worker restarted"
        return s


@pytest.mark.parametrize("how", ["periodic", "event"])
def test_reconfiguration_without_blind_spots(tmp_path: Path, how: str) -> None:
    env = {"NVGPU_REPROBE_SECONDS": str(REPROBE_S) if how == "periodic" else "3600"}
    check = Checked()
    with Exporter(write_scenario(tmp_path, scenario(how == "event")), tmp_path, env=env, interval=INTERVAL) as exp:
        # before 8 s
        s = exp.wait_for(lambda s: check(s).value("nvgpu_up") == 1.0 and instances(s, "0"), what="up")
        assert instances(s, "0") == GPU0_BEFORE and gpu_instances(s, "0") == {"1", "2"}
        assert s.value("nvgpu_mig_mode", gpu="0") == 1.0 and s.value("nvgpu_mig_mode", gpu="1") is None
        assert not s.find("nvgpu_gpu_utilization_ratio", gpu="0")  # absent on the MIG GPU, not 0
        assert s.value("nvgpu_gpu_feature_unsupported", gpu="0", feature="utilization") == 1.0
        assert s.find("nvgpu_gpu_utilization_ratio", gpu="1") and not instances(s, "1")

        # from 8 s: GPU 0's new layout in the next sample (the worker enumerates every sample on it)
        s = exp.wait_for(lambda s: instances(check(s), "0") == GPU0_AFTER, timeout=20, what="GPU 0's new layout")
        assert gpu_instances(s, "0") == {"2", "5"}  # GI 1 gone, GI 5 new, GI 2 once for its two CIs
        # GPU 1 (MIG off -> on) within one re-probe period, or at once after the event
        s = exp.wait_for(
            lambda s: instances(check(s), "1") == GPU1_AFTER,
            timeout=REPROBE_S + 4 * INTERVAL + 2,
            what="GPU 1's MIG layout within a re-probe period",
        )
        assert s.value("nvgpu_mig_mode", gpu="1") == 1.0
        s = exp.wait_for(lambda s: not check(s).find("nvgpu_gpu_utilization_ratio", gpu="1"), timeout=5)
        assert s.value("nvgpu_gpu_feature_unsupported", gpu="1", feature="utilization") == 1.0

        # from 16 s: GPU 0 leaves MIG mode; its MIG series go and utilization comes back at once
        s = exp.wait_for(lambda s: not instances(check(s), "0"), timeout=20, what="GPU 0 out of MIG mode")
        s = exp.wait_for(
            lambda s: check(s).find("nvgpu_gpu_utilization_ratio", gpu="0"),
            timeout=4 * INTERVAL + 2,
            what="utilization on GPU 0 back without waiting for the periodic re-probe",
        )
        assert not any(x.labels.get("gpu") == "0" for x in s.samples if x.name.startswith("nvgpu_mig_"))
        assert not s.find("nvgpu_gpu_feature_unsupported", gpu="0", feature="utilization")
        assert instances(s, "1") == GPU1_AFTER
        assert check.scrapes > 10
        logs = exp.logs()
        assert exp.terminate() == 0
    assert "MIG device(s)" in logs  # each layout change is logged
