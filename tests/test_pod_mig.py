"""Pods holding MIG devices are placed on their parent GPU and instance; a device
id the exporter cannot place is counted in a self-metric and logged once, never dropped silently.

The tried-as-a-new-user case of the issue: a fake kubelet with three time-sliced pods, two MPS
pods and one MIG pod; before, the five GPU pods appeared and the MIG pod silently did not.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.common.collectors import mig, power
from exporter.common.metric import GpuKey
from exporter.common.snapshot import GpuSample, Snapshot, SystemInfo
from exporter.config import Config
from exporter.supervisor import exposition, textformat
from exporter.supervisor.podresources import PodRef
from exporter.supervisor.pods import Layout, PodAttribution

GPU0, GPU1, GPU2 = (f"GPU-0000000{i}-1111-2222-3333-444455556666" for i in range(3))
MIG_A = "MIG-aaaaaaaa-0000-5000-8000-000000000001"
MIG_B = "MIG-aaaaaaaa-0000-5000-8000-000000000002"


def layout_reading() -> mig.Reading:
    return mig.Reading(
        1,
        1,
        (mig.GpuInstance(2, 9, "3g.71gb"), mig.GpuInstance(9, 19, "1g.18gb")),
        (mig.MigDevice(0, 2, 0, MIG_A), mig.MigDevice(1, 9, 0, MIG_B)),
    )


def snapshot() -> Snapshot:
    gpus = (
        GpuSample(0, GPU0, "up", {}, 1.0),  # time-sliced
        GpuSample(1, GPU1, "up", {}, 1.0),  # MPS
        GpuSample(2, GPU2, "up", {"mig": layout_reading()}, 1.0),  # MIG
    )
    return Snapshot(1.0, 0.0, SystemInfo(), gpus, {}, {}, {}, 0, {})


def families(metrics: Any) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(textformat.encode(list(metrics)).decode())}


def attribution() -> PodAttribution:
    ext = PodAttribution(Config())
    ext.up = True
    ext.assignments = {
        GPU0: (PodRef("ml", "ts-0", "main"), PodRef("ml", "ts-1", "main"), PodRef("ml", "ts-2", "main")),
        GPU1: (PodRef("infer", "mps-0", "server"), PodRef("infer", "mps-1", "server")),
        MIG_A: (PodRef("ml", "mig-0", "trainer"),),
    }
    return ext


def test_the_issue_case_six_pods_the_mig_one_included() -> None:
    ext = attribution()
    snap = snapshot()
    ext.on_snapshot(snap)
    fams = families([*ext.gpu_families(snap), *ext.self_families()])
    rows = {(s.labels["pod"], s.labels["gpu"], s.labels["gpu_instance_id"]) for s in fams["nvgpu_gpu_pod_info"].samples}
    assert rows == {
        ("ts-0", "0", ""),
        ("ts-1", "0", ""),
        ("ts-2", "0", ""),
        ("mps-0", "1", ""),
        ("mps-1", "1", ""),
        ("mig-0", "2", "2"),  # on its parent GPU, with its instance
    }
    (mig_row,) = [s.labels for s in fams["nvgpu_gpu_pod_info"].samples if s.labels["pod"] == "mig-0"]
    assert mig_row["uuid"] == GPU2 and mig_row["mig_uuid"] == MIG_A
    assert (mig_row["compute_instance_id"], mig_row["mig_profile"]) == ("0", "3g.71gb")
    unmapped = {s.labels["reason"]: s.value for s in fams["nvgpu_pod_attribution_unmapped_devices"].samples}
    assert unmapped == {"not_a_uuid": 0.0, "unknown_gpu": 0.0, "unknown_mig_device": 0.0, "dra_unresolved": 0.0}


def test_the_pre_r470_mig_uuid_form_is_placed_too() -> None:
    where = Layout(snapshot()).place(f"MIG-{GPU2}/9/0")
    assert where == (GpuKey("2", GPU2), ("9", "0", "1g.18gb", MIG_B))


def test_device_ids_that_cannot_be_placed_are_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    ext = attribution()
    ext.assignments = {
        **ext.assignments,
        "MIG-ffffffff-0000-5000-8000-000000000009": (PodRef("ml", "gone", "main"),),  # in no layout
        "GPU-99999999-1111-2222-3333-444455556666": (PodRef("ml", "elsewhere", "main"),),  # NVML does not list it
    }
    ext.unparsed = {"0:1": (PodRef("legacy", "index", "app"),), "1": (PodRef("legacy", "index", "app"),)}
    snap = snapshot()
    with caplog.at_level(logging.WARNING, logger="exporter.supervisor.pods"):
        for _ in range(3):
            ext.on_snapshot(snap)
            fams = families([*ext.gpu_families(snap), *ext.self_families()])
    unmapped = {s.labels["reason"]: s.value for s in fams["nvgpu_pod_attribution_unmapped_devices"].samples}
    assert unmapped == {"not_a_uuid": 2.0, "unknown_gpu": 1.0, "unknown_mig_device": 1.0, "dra_unresolved": 0.0}
    logged = [r.getMessage() for r in caplog.records if "cannot be mapped" in r.getMessage()]
    assert len(logged) == 4  # once per device id, however often it is rendered
    assert any("deviceIDStrategy=index" in m and "legacy/index/app" in m for m in logged)
    pods = {s.labels["pod"] for s in fams["nvgpu_gpu_pod_info"].samples}
    assert "gone" not in pods and "mig-0" in pods


def test_no_unmapped_series_before_the_kubelet_and_the_worker_answer() -> None:
    ext = attribution()
    assert "nvgpu_pod_attribution_unmapped_devices" not in families(ext.self_families())  # no snapshot yet
    ext.on_snapshot(snapshot())
    ext.up = False
    assert "nvgpu_pod_attribution_unmapped_devices" not in families(ext.self_families())


def test_pod_labels_on_series_follow_the_mig_device_not_the_parent() -> None:
    """NVGPU_POD_LABELS: a MIG device's series get its one holder; the parent GPU's own series get
    none (its pods hold instances, not the GPU)."""
    ext = attribution()
    info = mig.INSTANCE_INFO.family()
    info.add(GpuKey("2", GPU2), 1, "2", "0", "3g.71gb", MIG_A)
    watts = power.USAGE.family()
    watts.add(GpuKey("2", GPU2), 300.0)
    (relabelled,) = exposition._with_pod_labels(info, ext).samples
    assert (relabelled.labels["namespace"], relabelled.labels["pod"]) == ("ml", "mig-0")
    (parent,) = exposition._with_pod_labels(watts, ext).samples
    assert parent.labels["pod"] == ""
