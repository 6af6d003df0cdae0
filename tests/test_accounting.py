"""What a worker's death does to the blamed GPU's record (exporter.supervisor.accounting.count_crash)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from timeline_fixtures import U0, U1, build, gpu, hello, snapshot

from exporter.common.breadcrumb import Breadcrumb
from exporter.supervisor.policy import Outcome

CRUMB = Breadcrumb("nvlink_throughput", "nvmlDeviceGetFieldValues", U0, 0.0, True)


def test_a_deadline_kill_is_not_a_crash_of_the_gpu_in_flight(tmp_path: Path) -> None:
    sup = build(tmp_path, NVGPU_QUARANTINE_AFTER="5")
    sup.handle(hello())
    sup.handle(snapshot(gpu(0), gpu(1)))
    sup.account(Outcome("hang", -9, 9, CRUMB, 2.0, True, "", "supervisor"))
    rec = sup.state.health.gpus[U0]
    assert rec.state == "up" and not rec.excluded and rec.faults["crash"] == 0
    assert sup.state.worker.crashes[("nvlink_throughput", "nvmlDeviceGetFieldValues")] == 1  # still counted
    sup.account(Outcome("crash", -11, 11, CRUMB, 2.0, True, "", "self"))
    assert rec.state == "crashed" and rec.excluded == "crashed" and rec.faults["crash"] == 1
    assert not sup.state.health.gpus[U1].excluded
    sup.close()


def test_a_hang_on_a_hung_gpu_leaves_it_hung(tmp_path: Path) -> None:
    sup = build(tmp_path, NVGPU_QUARANTINE_AFTER="5")
    sup.handle(hello())
    hung = dataclasses.replace(gpu(0), state="hung", readings={})
    sup.handle(snapshot(hung, gpu(1)))
    rec = sup.state.health.gpus[U0]
    assert rec.state == "hung" and rec.faults["hang"] == 1
    sup.account(Outcome("hang", -9, 9, CRUMB, 2.0, True, "", "supervisor"))  # e.g. its probe hung
    assert rec.state == "hung" and rec.excluded != "crashed" and rec.faults["crash"] == 0
    sup.close()
