"""What goes on the timeline, through the real supervisor parts (no worker): messages in, events out."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from timeline_fixtures import BUS, U0, U1, build, gpu, hello, snapshot

from exporter.common import collectors
from exporter.common.breadcrumb import Breadcrumb
from exporter.common.collectors import fabric, remapped_rows
from exporter.common.collectors.base import SystemInfo
from exporter.common.snapshot import Attribution, GpuSample, InitFailed, NvmlEvent
from exporter.supervisor.policy import Outcome
from exporter.supervisor.supervisor import Supervisor
from exporter.supervisor.timeline import NODE


def kinds(sup: Supervisor, lane: str | None = None) -> list[str]:
    tl = sup.state.recorder.timeline
    return [e.kind for e in tl.events([lane] if lane else None)]


def test_the_first_samples_record_the_boot_and_each_gpus_state_and_verdict_then_nothing_repeats(
    tmp_path: Path,
) -> None:
    sup = build(tmp_path)
    sup.handle(hello())
    sup.handle(snapshot(gpu(0), gpu(1)))
    assert kinds(sup, NODE) == ["exporter_start", "boot"]
    assert kinds(sup, U0) == ["state", "verdict"]
    lane = sup.state.recorder.timeline.lanes[U0]
    assert lane.identity["vbios"] == "96.00.A5.00.1A" and lane.identity["pci_bus_id"] == BUS[0]
    before = len(kinds(sup))
    for _ in range(3):
        sup.handle(snapshot(gpu(0), gpu(1)))
    assert len(kinds(sup)) == before
    sup.close()


def test_an_exporter_restart_records_its_start_and_nothing_the_file_already_holds(tmp_path: Path) -> None:
    sup = build(tmp_path)
    sup.handle(hello())
    sup.handle(snapshot(gpu(0), gpu(1)))
    sup.close()
    again = build(tmp_path)
    again.handle(hello())
    again.handle(snapshot(gpu(0), gpu(1)))
    tl = again.state.recorder.timeline
    starts = tl.events(kinds=["exporter_start"])
    assert len(starts) == 2 and isinstance(starts[1].data["away_s"], float)
    assert kinds(again, U0) == ["state", "verdict"]  # the first process's: no "new -> up" again
    assert tl.events(kinds=["boot"]).__len__() == 1  # the same boot
    again.close()


def with_readings(g: GpuSample, *readings: Any, index: int | None = None) -> GpuSample:
    """``g`` with these readings added or replaced (and another index)."""
    more = {collectors.feature_of(type(r)): r for r in readings}
    return dataclasses.replace(g, readings={**g.readings, **more}, index=g.index if index is None else index)


def test_row_remaps_recovery_actions_fabric_and_a_moved_index_are_each_one_event(tmp_path: Path) -> None:
    sup = build(tmp_path)
    sup.handle(hello())
    healthy = with_readings(gpu(0), fabric.Reading(fabric.STATE_COMPLETED, 0))
    sup.handle(snapshot(healthy, gpu(1)))
    before = len(kinds(sup, U0))
    for _ in range(2):  # each change once, however often it is seen
        sup.handle(
            snapshot(with_readings(healthy, remapped_rows.Reading(0, 1, True, False, 1), fabric.Reading(1, 0)), gpu(1))
        )
    new = kinds(sup, U0)[before:]
    assert {"row_remap", "recovery_action", "fabric"} <= set(new)
    assert all(new.count(k) == 1 for k in ("row_remap", "recovery_action", "fabric"))
    tl = sup.state.recorder.timeline
    (remap,) = tl.events([U0], kinds=["row_remap"])
    assert (remap.data["pending"], remap.data["uncorrectable"]) == (True, 1)
    assert tl.events([U0], kinds=["recovery_action"])[0].data["value"] == 1
    assert tl.events([U0], kinds=["fabric"])[0].data == {"state": 1, "status": 0}
    sup.handle(snapshot(with_readings(gpu(1), index=0), with_readings(gpu(0), index=1)))  # renumbered
    (moved,) = tl.events([U0], kinds=["identity"])
    assert moved.data == {"index": "1"} and moved.gpu == "1"
    sup.close()


def test_a_new_boot_id_is_a_reboot_and_its_first_sample_a_boot_event(tmp_path: Path) -> None:
    sup = build(tmp_path)
    sup.handle(hello())
    sup.handle(snapshot(gpu(0), gpu(1, ecc_uncorrected=2)))
    assert sup.state.verdicts.current[U1].verdict == "reset_gpu"
    sup.close()
    path = tmp_path / "timeline.json"
    data = json.loads(path.read_text())
    data["meta"]["boot_id"] = data["meta"]["sampled_boot"] = "an-earlier-boot"  # as if written in an earlier boot
    path.write_text(json.dumps(data))
    again = build(tmp_path)
    start = again.state.recorder.timeline.events(kinds=["exporter_start"])[-1]
    assert "the node rebooted since (boot id an-earlier-boot ->" in start.summary
    watch = again.state.recorder.recovery.latest(U1)
    assert watch is not None and watch.state == "pending" and watch.action == "reboot"
    again.handle(hello())
    again.handle(snapshot(gpu(0), gpu(1)))
    assert again.state.recorder.recovery.latest(U1).state == "watching"  # type: ignore[union-attr]
    assert len(again.state.recorder.timeline.events(kinds=["boot"])) == 2
    again.close()


def test_a_gpu_back_from_lost_and_falling_volatile_ecc_counts_are_resets(tmp_path: Path) -> None:
    sup = build(tmp_path)
    sup.handle(hello())
    sup.handle(snapshot(gpu(0, ecc_uncorrected=3), gpu(1)))
    sup.handle(snapshot(gpu(0, ecc_uncorrected=0), gpu(1, "lost")))
    sup.handle(snapshot(gpu(0), gpu(1)))
    tl = sup.state.recorder.timeline
    resets = {e.lane: e.summary for e in tl.events(kinds=["reset"])}
    assert "volatile ECC counts fell" in resets[U0]
    assert resets[U1] == "GPU answers again after being lost"
    ecc_events = tl.events([U0], kinds=["ecc"])
    assert [e.data["volatile_uncorrected"] for e in ecc_events] == [0]  # the first sighting is the base
    states = [(e.data["from"], e.data["to"]) for e in tl.events([U1], kinds=["state"])]
    assert states == [(None, "up"), ("up", "lost"), ("lost", "up")]
    sup.close()


def test_driver_changes_and_failed_inits_are_driver_events_and_a_driver_reload(tmp_path: Path) -> None:
    sup = build(tmp_path)
    sup.handle(hello())
    sup.handle(snapshot(gpu(0), gpu(1, ecc_uncorrected=1)))
    sup.handle(InitFailed(18, "LIB_RM_VERSION_MISMATCH", "RM has detected an NVML/RM version mismatch"))
    sup.handle(InitFailed(18, "LIB_RM_VERSION_MISMATCH", "again"))
    new = SystemInfo("580.170.01", "13.580.170.01", "13.0", "13.615.71")
    sup.handle(hello(new, "580.170.01"))
    summaries = [e.summary for e in sup.state.recorder.timeline.events(kinds=["driver"])]
    assert summaries == [
        "nvmlInit failed: LIB_RM_VERSION_MISMATCH",
        "driver 580.159.04 -> 580.170.01, kernel module 580.159.04 -> 580.170.01, nvml 13.580.159.04 -> 13.580.170.01",
        "nvmlInit works again after LIB_RM_VERSION_MISMATCH",
    ]
    watch = sup.state.recorder.recovery.latest(U1)
    assert watch is not None and watch.action == "driver_reload"
    sup.close()


def test_an_xid_gets_its_process_from_the_kernel_log_and_its_pod_from_the_worker(tmp_path: Path) -> None:
    sup = build(tmp_path)
    sup.handle(hello())
    sup.handle(snapshot(gpu(0), gpu(1)))
    now = time.time()
    sup.handle(NvmlEvent(now, 0, U0, "xid", 13))
    sup.state.attribute_xid(U0, 13, now + 0.5, 4242, "python3")  # the kernel log's line of it
    sup.handle(Attribution(4242, "python3", "uid-1", "ml", "train-0", "trainer"))
    sup.state.record_xid("0", U0, 43, now + 1, "kernel log", 4242, "python3")
    sup.handle(NvmlEvent(now, 0, U0, "mig_config_change", None))
    xids = sup.state.recorder.timeline.events([U0], kinds=["xid"])
    assert [(e.data["xid"], e.data["source"], e.data["pid"]) for e in xids] == [
        (13, "NVML event", 4242),
        (43, "kernel log", 4242),
    ]
    assert xids[0].data["pod"] == "train-0" and xids[0].data["pod_uid"] == "uid-1"
    assert "in ml/train-0" in xids[0].summary
    assert kinds(sup, U0)[-1] == "mig"
    sup.close()


def test_worker_deaths_name_the_call_in_flight_and_a_crash_loop_is_one_event_with_a_count(tmp_path: Path) -> None:
    sup = build(tmp_path, NVGPU_QUARANTINE_AFTER="3")
    crumb = Breadcrumb("nvlink_throughput", "nvmlDeviceGetFieldValues", U0, 0.0, True)
    for _ in range(3):
        sup.account(Outcome("crash", -11, 11, crumb, 0.2, True, ""))
    tl = sup.state.recorder.timeline
    deaths = tl.events([NODE], kinds=["worker_death"])
    assert len(deaths) == 1 and deaths[0].count == 3
    assert deaths[0].data["function"] == "nvmlDeviceGetFieldValues" and deaths[0].data["signal"] == "SIGSEGV"
    assert tl.events([U0], kinds=["worker_death"])[0].count == 3
    quarantines = tl.events([NODE], kinds=["quarantine"])
    assert len(quarantines) == 1 and quarantines[0].data["feature"] == "nvlink_throughput"
    assert deaths[0].seq < quarantines[0].seq
    sup.close()


def test_a_death_from_outside_or_by_the_oom_killer_is_filed_in_the_node_lane_only(tmp_path: Path) -> None:
    sup = build(tmp_path)
    sup.handle(hello())
    crumb = Breadcrumb("nvlink_throughput", "nvmlDeviceGetFieldValues", U0, 0.0, True)
    sup.account(Outcome("killed", -9, 9, crumb, 0.2, True, "", "outside"))
    sup.account(Outcome("oom", -9, 9, crumb, 0.2, True, "", "oom_killer"))
    tl = sup.state.recorder.timeline
    assert {e.data["reason"] for e in tl.events([NODE], kinds=["worker_death"])} == {"killed", "oom"}
    assert tl.events([U0], kinds=["worker_death"]) == []
    sup.account(Outcome("hang", -9, 9, crumb, 0.2, True, "", "supervisor"))
    assert [e.data["reason"] for e in tl.events([U0], kinds=["worker_death"])] == ["hang"]
    sup.close()


def test_a_recorder_bug_is_counted_and_never_costs_the_xid_count(tmp_path: Path) -> None:
    sup = build(tmp_path)

    def broken(*args: object) -> None:
        raise RuntimeError("timeline bug")

    sup.state.recorder.xid = broken  # type: ignore[method-assign]
    sup.state.record_xid("0", U0, 13, 0.0, "NVML event")
    assert sup.state.xids.xids[(U0, 13)].count == 1
    assert sup.state.component_errors["timeline"] == 1
    sup.close()
