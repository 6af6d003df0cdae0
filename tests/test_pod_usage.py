"""exporter.supervisor.pods: per-pod usage joined from the worker's pod sums and the kubelet's holders."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.common.collectors.processes import Reading
from exporter.common.snapshot import GpuSample, Snapshot, SystemInfo
from exporter.config import Config
from exporter.supervisor import textformat
from exporter.supervisor.podresources import PodRef
from exporter.supervisor.pods import PodAttribution, pod_usage

UID_A, UID_B, UID_C = "aaaaaaaa-0000-0000-0000-000000000001", "bbbbbbbb-0000-0000-0000-000000000002", "c" * 32
GIB = 1 << 30
UTIL = {"compute": "nvmlDeviceGetComputeRunningProcesses_v3", "utilization": "nvmlDeviceGetProcessUtilization"}


def reading(
    pods: dict[str, tuple[int | None, int | None, int]], names: dict[str, tuple[str, str]], proc: int = 1
) -> Reading:
    return Reading(
        count=len(pods),
        memory_used_bytes=None,
        functions=dict(UTIL),
        pods=pods,
        pod_names=names,
        sources={"proc": proc, "container_logs": int(bool(names))},
    )


def test_named_pods_sharing_a_gpu() -> None:
    r = reading({UID_A: (3 * GIB, 10, 1), UID_B: (7 * GIB, 80, 2)}, {UID_A: ("ml", "a"), UID_B: ("ml", "b")})
    assert pod_usage(r, {("ml", "a"), ("ml", "b")}) == {("ml", "a"): (3 * GIB, 10), ("ml", "b"): (7 * GIB, 80)}


def test_the_one_unnamed_pod_is_the_one_remaining_holder() -> None:
    """No /var/log/containers: a GPU held by one pod still names its processes' pod."""
    assert pod_usage(reading({UID_A: (GIB, 5, 1)}, {}), {("ml", "trainer-0")}) == {("ml", "trainer-0"): (GIB, 5)}
    # one named, one not: the unnamed one is the other holder
    r = reading({UID_A: (GIB, 5, 1), UID_B: (2 * GIB, 6, 1)}, {UID_A: ("ml", "a")})
    assert pod_usage(r, {("ml", "a"), ("ml", "b")}) == {("ml", "a"): (GIB, 5), ("ml", "b"): (2 * GIB, 6)}


def test_pods_that_cannot_be_named_are_summed_under_empty_names() -> None:
    r = reading({UID_A: (GIB, 5, 1), UID_B: (2 * GIB, None, 1)}, {})
    assert pod_usage(r, {("ml", "a"), ("ml", "b")}) == {("", ""): (3 * GIB, 5)}


def test_holders_without_processes_use_zero_only_when_processes_are_visible() -> None:
    r = reading({UID_A: (GIB, 5, 1)}, {UID_A: ("ml", "a")})
    holders = {("ml", "a"), ("ml", "idle")}
    assert pod_usage(r, holders) == {("ml", "a"): (GIB, 5), ("ml", "idle"): (0, 0)}
    blind = reading({}, {}, proc=0)  # no hostPID: nothing is known about the holders' usage
    assert pod_usage(blind, holders) == {}
    idle_gpu = Reading(count=0, memory_used_bytes=0, functions={"compute": "x"}, sources={"proc": 1})
    assert pod_usage(idle_gpu, {("ml", "idle")}) == {("ml", "idle"): (0, 0)}
    no_util = Reading(
        count=1,
        memory_used_bytes=GIB,
        pods={UID_A: (GIB, None, 1)},
        pod_names={UID_A: ("ml", "a")},
        sources={"proc": 1},
    )
    assert pod_usage(no_util, holders) == {("ml", "a"): (GIB, None), ("ml", "idle"): (0, None)}


def test_a_pod_using_a_gpu_it_does_not_hold_is_shown() -> None:
    r = reading({UID_C: (GIB, 1, 1)}, {UID_C: ("kube-system", "privileged-debug")})
    assert pod_usage(r, set()) == {("kube-system", "privileged-debug"): (GIB, 1)}


# A GPU that answered: ``up=True`` here, ``state="up"`` once GpuSample carries a state (a later design).
_UP: dict[str, Any] = {"state": "up"} if "state" in {f.name for f in dataclasses.fields(GpuSample)} else {"up": True}


def _snapshot(readings: dict[int, Reading]) -> Snapshot:
    return Snapshot(
        ts=1.0,
        duration_s=0.0,
        system=SystemInfo(),
        gpus=tuple(GpuSample(index=i, uuid=f"GPU-{i}", readings={"processes": r}, **_UP) for i, r in readings.items()),
        features={},
        feature_states={},
        errors={},
        calls=0,
        events_enabled={},
    )


def _text(metrics: Any) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(textformat.encode(list(metrics)).decode())}


def test_families_and_sources(caplog: pytest.LogCaptureFixture) -> None:
    ext = PodAttribution(Config())
    ext.up = True
    ext.assignments = {
        "GPU-0": (PodRef("ml", "a", "main"), PodRef("ml", "b", "main")),  # time-sliced
        "GPU-1": (PodRef("ml", "c", "main"),),
    }
    snap = _snapshot(
        {
            0: reading({UID_A: (3 * GIB, 10, 1), UID_B: (7 * GIB, 80, 1)}, {UID_A: ("ml", "a"), UID_B: ("ml", "b")}),
            1: reading({}, {UID_A: ("ml", "a")}),
        }
    )
    with caplog.at_level(logging.INFO):
        ext.on_snapshot(snap)
        ext.on_snapshot(snap)
    fams = _text([*ext.gpu_families(snap), *ext.self_families()])
    mem = {(s.labels["gpu"], s.labels["pod"]): s.value for s in fams["nvgpu_pod_memory_used_bytes"].samples}
    assert mem == {("0", "a"): 3 * GIB, ("0", "b"): 7 * GIB, ("1", "c"): 0}
    sm = {(s.labels["gpu"], s.labels["pod"]): s.value for s in fams["nvgpu_pod_sm_utilization_ratio"].samples}
    assert sm == {("0", "a"): 0.1, ("0", "b"): 0.8, ("1", "c"): 0.0}
    sources = {s.labels["source"]: s.value for s in fams["nvgpu_pod_attribution_source_up"].samples}
    assert sources == {"proc": 1.0, "container_logs": 1.0}
    logged = [r.getMessage() for r in caplog.records if "per-pod GPU usage" in r.getMessage()]
    assert len(logged) == 1 and "hostPID" not in logged[0]


def test_sources_missing_are_said_once_with_the_fix(caplog: pytest.LogCaptureFixture) -> None:
    ext = PodAttribution(Config(proc_path="/proc", container_log_dir="/var/log/containers"))
    snap = _snapshot({0: Reading(count=0, memory_used_bytes=0, sources={"proc": 0, "container_logs": 0})})
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            ext.on_snapshot(snap)
    logged = [r.getMessage() for r in caplog.records if "per-pod GPU usage" in r.getMessage()]
    assert len(logged) == 1
    assert "needs hostPID: true" in logged[0] and "/var/log/containers: no" in logged[0]
    fams = _text(ext.self_families())
    assert {s.labels["source"]: s.value for s in fams["nvgpu_pod_attribution_source_up"].samples} == {
        "proc": 0.0,
        "container_logs": 0.0,
    }


def test_no_source_series_before_the_worker_reports() -> None:
    assert "nvgpu_pod_attribution_source_up" not in _text(PodAttribution(Config()).self_families())
