"""One authority for feature state, on the real exporter (supervisor + worker on the fake backend).

Only the worker sees the GPU models and the driver that known-issue rules match, so its decision is
the one everything follows: the collectors (no NVML call for a feature it turned off), the series
(absent), ``nvgpu_feature_enabled`` (0, reason ``known_issue``) and the supervisor's extensions (pod
attribution stops). The rules are the product's own mechanism (``guards/known_issues.json`` read by
``guards.known_issues.load_known_issues`` in the worker); the test points the worker at a table of
its own through a wrapper around the worker's interpreter (tests/faultinject.py ``worker_python``),
so no test hook lives in the product. The scenario aborts the worker in the very call each rule is
about, as the H20/580 driver did in the NVLink throughput query: without the rule, the worker dies.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from exporter_proc import Exporter, Scrape, load_scenario, write_scenario
from fakeproc import Container, make_container_logs, make_proc

NOT_MIG = 0xFFFFFFFF
POD = Container("ml", "train-0", "trainer")
GPM_CALL = "nvmlGpmQueryDeviceSupport"  # the gpm collector's first call on a GPU
UTIL_CALL = "nvmlDeviceGetProcessUtilization"  # made for per-pod sums once a process is in a pod


def _rule(feature: str) -> dict[str, Any]:
    return {
        "id": f"test-{feature}",
        "feature": feature,
        "gpu_models": ["NVIDIA H200"],
        "driver": {"min": "580", "max_exclusive": "581"},
        "reason": f"a crash in the {feature} calls (test rule)",
        "reference": "tests/test_feature_authority.py",
    }


def _start(tmp_path: Path, features: list[str]) -> Exporter:
    """The exporter on one H200 whose GPM query and process utilization abort the worker, with one
    process in a pod (so per-pod sums would ask for utilization), the kubelet's socket absent, and
    known-issue rules for ``features``."""
    table = tmp_path / "known_issues.json"
    table.write_text(json.dumps([_rule(f) for f in features]))
    code = (
        "import runpy, guards.known_issues as k; "
        f"k.DEFAULT_PATH = {str(table)!r}; "
        "runpy.run_module('exporter.worker', run_name='__main__', alter_sys=True)"
    )
    wrapper = tmp_path / "python-with-rules"
    wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(code)}\n")
    wrapper.chmod(0o755)
    scenario = load_scenario("h200x1")
    scenario["gpus"][0]["values"]["nvmlDeviceGetComputeRunningProcesses_v3"] = [
        {"pid": 101, "usedGpuMemory": 1 << 30, "gpuInstanceId": NOT_MIG, "computeInstanceId": NOT_MIG}
    ]
    scenario["faults"] = [{"function": GPM_CALL, "action": "abort"}, {"function": UTIL_CALL, "action": "abort"}]
    env = {
        "FAULT_WORKER_PYTHON": str(wrapper),
        "NVGPU_PROC_PATH": str(make_proc(tmp_path / "proc", {101: ("python3", POD)})),
        "NVGPU_CONTAINER_LOG_DIR": str(make_container_logs(tmp_path / "containers", [POD])),
        "NVGPU_POD_RESOURCES_SOCKET": str(tmp_path / "no-kubelet.sock"),
    }
    return Exporter(write_scenario(tmp_path, scenario), tmp_path, env=env, fault="worker_python")


def _samples_later(exp: Exporter, first: Scrape, n: int) -> Scrape:
    ts = first.value("nvgpu_last_sample_timestamp_seconds") or 0.0
    return exp.wait_for(
        lambda s: (s.value("nvgpu_last_sample_timestamp_seconds") or 0.0) >= ts + n * 0.5, what=f"{n} more samples"
    )


def test_known_issue_rules_for_gpm_and_pod_attribution_are_obeyed_everywhere(tmp_path: Path) -> None:
    with _start(tmp_path, ["gpm", "pod_attribution"]) as exp:
        first = exp.wait_for(
            lambda s: (
                s.value("nvgpu_feature_enabled", feature="gpm", reason="known_issue") == 0
                and s.value("nvgpu_compute_processes", gpu="0") == 1
            ),
            what="the worker's decision and a sample",
        )
        s = _samples_later(exp, first, 4)
        # nvgpu_feature_enabled shows the worker's decision, for a collector and for a switch the
        # processes collector and a supervisor extension follow
        for feature in ("gpm", "pod_attribution"):
            assert s.value("nvgpu_feature_enabled", feature=feature, reason="known_issue") == 0, feature
            assert not [x for x in s.find("nvgpu_feature_enabled", feature=feature) if x.value != 0]
        # the collectors made no call of those features: the worker, which aborts in either, lives
        assert not [x for x in s.find("nvgpu_worker_restarts_total") if x.value], exp.logs()[-3000:]
        assert s.value("nvgpu_up") == 1
        # their series are absent; the processes collector still counts, without per-pod sums
        assert not [n for n in s.names() if n.startswith("nvgpu_gpm_")]
        assert not [n for n in s.names() if n.startswith("nvgpu_pod_")]  # the extension renders nothing
        assert not s.find("nvgpu_nvml_api_info", call="process_utilization")
        assert s.value("nvgpu_compute_processes_memory_used_bytes", gpu="0") == 1 << 30
        records = list(exp.log_records())
        assert any("feature gpm is off: known issue on this node" in r.get("msg", "") for r in records)
        assert any("feature pod_attribution is off (known_issue" in r.get("msg", "") for r in records)
        assert exp.terminate() == 0


@pytest.mark.parametrize(
    ("rules", "feature", "function"),
    [(["pod_attribution"], "gpm", GPM_CALL), (["gpm"], "processes", UTIL_CALL)],
    ids=["without-the-gpm-rule", "without-the-pod-attribution-rule"],
)
def test_without_its_rule_the_call_is_made_and_kills_the_worker(
    tmp_path: Path, rules: list[str], feature: str, function: str
) -> None:
    """The scenario's faults are armed: the test above can fail."""
    with _start(tmp_path, rules) as exp:
        exp.wait_for(
            lambda s: (s.value("nvgpu_worker_crashes_total", feature=feature, function=function) or 0) >= 1,
            what=f"a crash in {function}",
        )
        assert exp.terminate() == 0
