"""The verdicts' policy, case by case, on the real health, Xid ledger and stuck detector.

Each test builds the served state's parts the engine reads (:class:`State` satisfies the engine's
protocol) and asks for the verdict. The integration tests (tests/test_integration_verdicts.py) run
the same cases on the real exporter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from exporter.common import nativelib
from exporter.common.collectors import ecc, fabric, remapped_rows
from exporter.common.collectors.base import SystemInfo
from exporter.common.snapshot import GpuSample, Snapshot
from exporter.supervisor import verdicts as v
from exporter.supervisor.gpuhealth import GpuHealth
from exporter.supervisor.served import NvmlStatus
from exporter.supervisor.stuck import StuckDetector
from exporter.supervisor.xids import XidLedger

E = TypeVar("E")
U = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(4)]
T0 = 1_700_000_000.0
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class State:
    """What the engine reads of the served state, with real parts."""

    health: GpuHealth = field(default_factory=lambda: GpuHealth(5.0, 60.0))
    xids: XidLedger = field(default_factory=XidLedger)
    native: nativelib.NativeLibrary | None = None
    nvml_up: bool = True
    gpu_index: dict[str, str] = field(default_factory=dict)
    nvml: NvmlStatus = field(default_factory=NvmlStatus)
    system: SystemInfo = field(default_factory=SystemInfo)
    last: Snapshot | None = None
    fresh: bool = True
    stuck: StuckDetector | None = None

    def fresh_snapshot(self) -> Snapshot | None:
        return self.last if self.fresh else None

    def extension(self, kind: type[E]) -> E | None:
        return self.stuck if isinstance(self.stuck, kind) else None


class Clock:
    def __init__(self) -> None:
        self.mono, self.wall = 1000.0, T0

    def advance(self, s: float) -> None:
        self.mono += s
        self.wall += s


def gpu(
    i: int, state: str = "up", error: str = "", readings: Iterable[object] = (), uuid: str | None = None
) -> GpuSample:
    from exporter.common import collectors

    return GpuSample(
        i,
        U[i] if uuid is None else uuid,
        state,
        {collectors.feature_of(type(r)): r for r in readings},
        T0,
        "" if state == "up" else f"handle lookup failed: {error}",
        error=error,
    )


def snapshot(*gpus: GpuSample, ts: float = T0) -> Snapshot:
    return Snapshot(ts, 0.01, SystemInfo(), tuple(gpus), {}, {}, {}, 0, {})


class Case:
    """A state, a clock and an engine; ``see(*gpus)`` applies a snapshot and evaluates."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.state = State()
        self.state.xids = XidLedger(clock=lambda: self.clock.mono, wall=lambda: self.clock.wall)  # the same clocks
        self.engine = v.VerdictEngine(lambda: self.clock.mono, lambda: self.clock.wall)
        self.events: list[v.Event] = []
        self.engine.subscribe(self.events.append)

    def see(self, *gpus: GpuSample) -> dict[str, v.Verdict]:
        snap = snapshot(*gpus, ts=self.clock.wall)
        self.state.last = snap
        self.state.health.on_snapshot(snap)
        if self.state.stuck is not None:
            self.state.stuck.on_snapshot(snap)
        for g in gpus:
            if g.uuid:
                self.state.gpu_index[g.uuid] = str(g.index)
        self.engine.update(self.state)  # type: ignore[arg-type]
        return self.engine.current

    def verdict(self, i: int) -> tuple[str, str, str]:
        return self.engine.current[U[i]].key


def test_healthy_gpus_are_ok() -> None:
    c = Case()
    c.see(gpu(0), gpu(1))
    assert c.verdict(0) == c.verdict(1) == ("ok", "none", "none")


def test_the_device_cgroup_case_is_fix_exporter_naming_the_hidden_gpus_never_lost() -> None:
    """NVML counts 4 GPUs; the handle lookup of 2 and 3 answers NO_PERMISSION."""
    c = Case()
    hidden = [gpu(i, "lost", "NO_PERMISSION", uuid="") for i in (2, 3)]
    current = c.see(gpu(0), gpu(1), *hidden)
    for i in (2, 3):
        verdict = current[f"index:{i}"]
        assert verdict.key == ("fix_exporter", "exporter", "device_access_denied")
        assert f"/dev/nvidia{i}" in verdict.action and "not lost" in verdict.action
        assert c.state.health.gpus[f"#{i}"].state == "denied"  # no UUID, no bus id: keyed by its index
        assert c.state.health.gpus[f"#{i}"].faults["lost"] == 0
    assert c.verdict(0) == ("ok", "none", "none")
    fams = {m.name: m for m in c.state.health.families(True)}
    lost = [s for s in fams["nvgpu_device_state"].samples if s.labels["state"] == "lost" and s.value == 1]
    assert lost == []
    assert all(verdict.verdict != "reboot_node" for verdict in current.values())


def test_a_lost_gpu_stops_scheduling_then_asks_for_a_reboot_once_it_stays_lost() -> None:
    c = Case()
    c.see(gpu(0), gpu(1))
    c.see(gpu(0), gpu(1, "lost", "GPU_IS_LOST"))
    assert c.verdict(1) == ("stop_scheduling", "gpu", "gpu_lost")
    c.clock.advance(v.LOST_HOLD_S)
    c.see(gpu(0), gpu(1, "lost", "GPU_IS_LOST"))
    assert c.verdict(1) == ("reboot_node", "gpu", "gpu_lost")
    assert c.verdict(0) == ("ok", "none", "none")


def test_a_gpu_that_fell_off_the_bus_asks_for_a_reboot_at_once() -> None:
    c = Case()
    c.see(gpu(0), gpu(1))
    c.state.xids.record_xid("1", U[1], 79, c.clock.wall, "kernel log")
    c.see(gpu(0), gpu(1, "lost", "GPU_IS_LOST"))
    verdict = c.engine.current[U[1]]
    assert verdict.key == ("reboot_node", "gpu", "fell_off_bus")
    assert any("Xid 79" in e for e in verdict.faults[0].evidence)


def test_xid_79_on_a_gpu_that_still_answers_stops_scheduling_only() -> None:
    c = Case()
    c.state.xids.record_xid("0", U[0], 79, c.clock.wall, "NVML event")
    c.see(gpu(0))
    assert c.verdict(0) == ("stop_scheduling", "gpu", "fell_off_bus")


def test_every_gpu_lost_at_once_is_the_nodes_fault() -> None:
    c = Case()
    c.see(gpu(0), gpu(1))
    c.see(gpu(0, "lost", "GPU_IS_LOST"), gpu(1, "lost", "GPU_IS_LOST"))
    assert c.verdict(0) == c.verdict(1) == ("reboot_node", "node", "all_gpus_lost")


def test_one_process_twice_is_watch_two_processes_stop_scheduling() -> None:
    c = Case()
    c.state.xids.record_xid("0", U[0], 13, c.clock.wall, "kernel log", 100, "train")
    c.state.xids.record_xid("0", U[0], 13, c.clock.wall + 120, "kernel log", 100, "train")
    c.clock.advance(121)
    c.see(gpu(0), gpu(1))
    assert c.verdict(0) == ("watch", "application", "application_xid")
    c.state.xids.record_xid("0", U[0], 13, c.clock.wall, "kernel log", 200, "other")
    c.see(gpu(0), gpu(1))
    assert c.verdict(0) == ("stop_scheduling", "gpu", "application_xids_several_processes")
    evidence = " ".join(c.engine.current[U[0]].faults[0].evidence)
    assert "train (pid 100)" in evidence and "other (pid 200)" in evidence
    c.clock.advance(v.APPLICATION_WINDOW_S + 1)
    c.see(gpu(0), gpu(1))
    assert c.verdict(0) == ("ok", "none", "none")


@pytest.mark.parametrize("step_s", [3600.0, -3600.0], ids=["forwards", "back"])
def test_a_wall_clock_step_neither_ends_nor_extends_the_xid_window(step_s: float) -> None:
    """Two processes' application Xids stop scheduling; the wall clock then steps an hour: the window
    is measured on the monotonic clock, so the verdict holds until the window ends by that clock."""
    c = Case()
    for pid, name in ((100, "train"), (200, "other")):
        c.state.xids.record_xid("0", U[0], 13, c.clock.wall, "kernel log", pid, name)
    c.see(gpu(0), gpu(1))
    assert c.verdict(0) == ("stop_scheduling", "gpu", "application_xids_several_processes")
    c.clock.wall += step_s
    c.clock.advance(60)
    c.see(gpu(0), gpu(1))
    assert c.verdict(0) == ("stop_scheduling", "gpu", "application_xids_several_processes")
    c.clock.advance(v.APPLICATION_WINDOW_S)
    c.see(gpu(0), gpu(1))
    assert c.verdict(0) == ("ok", "none", "none")


def test_application_xids_in_three_separate_slots_are_repeats() -> None:
    c = Case()
    for k in range(3):
        c.state.xids.record_xid("0", U[0], 31, T0 + k * v.REPEAT_SLOT_S, "NVML event")
    c.clock.advance(2 * v.REPEAT_SLOT_S + 1)
    c.see(gpu(0))
    assert c.verdict(0) == ("stop_scheduling", "gpu", "application_xids_repeated")


def stuck_case() -> Case:
    from exporter.common.collectors import memory, processes, utilization

    c = Case()
    c.state.stuck = StuckDetector(utilization=0.95, memory_bytes=64 << 20, after_s=60.0, clock=lambda: c.clock.mono)
    c.busy = [  # type: ignore[attr-defined]
        utilization.Reading(100, 0, 0, 0),
        memory.Reading(150 << 30, 0, 150 << 30, 0, None, None),
        processes.Reading(count=0, memory_used_bytes=None),
    ]
    return c


def test_the_stuck_gpu_after_xid_43_asks_for_a_reset_then_a_reboot_when_it_comes_back() -> None:
    c = stuck_case()
    for xid in (13, 31, 43):
        c.state.xids.record_xid("0", U[0], xid, c.clock.wall, "kernel log", 77, "bad_kernel")
    for _ in range(3):
        c.see(gpu(0, readings=c.busy))  # type: ignore[attr-defined]
        c.clock.advance(40)
    verdict = c.engine.current[U[0]]
    assert verdict.key == ("reset_gpu", "gpu", "stuck_context")
    assert any("Xid 43" in e for e in verdict.faults[0].evidence)
    from exporter.common.collectors import memory, processes, utilization

    idle = [
        utilization.Reading(0, 0, 0, 0),
        memory.Reading(150 << 30, 0, 150 << 30, 0, None, None),
        processes.Reading(0, None),
    ]
    c.see(gpu(0, readings=idle))  # the reset cured it
    assert c.verdict(0)[0] != "reset_gpu"
    for _ in range(3):
        c.see(gpu(0, readings=c.busy))  # type: ignore[attr-defined]
        c.clock.advance(40)
    verdict = c.engine.current[U[0]]
    assert verdict.key == ("reboot_node", "gpu", "stuck_context")
    assert any("a reset did not cure it" in e for e in verdict.faults[0].evidence)


def test_busy_and_empty_without_xid_43_is_watched_then_stops_scheduling() -> None:
    c = stuck_case()
    for _ in range(3):
        c.see(gpu(0, readings=c.busy))  # type: ignore[attr-defined]
        c.clock.advance(40)
    assert c.verdict(0) == ("watch", "gpu", "busy_and_empty")
    c.clock.advance(v.BUSY_EMPTY_HOLD_S)
    c.see(gpu(0, readings=c.busy))  # type: ignore[attr-defined]
    assert c.verdict(0) == ("stop_scheduling", "gpu", "busy_and_empty")


@pytest.mark.parametrize(
    ("action", "want"),
    [(0, "ok"), (1, "reset_gpu"), (2, "reboot_node"), (3, "stop_scheduling"), (4, "reset_gpu"), (7, "reboot_node")],
)
def test_nvidias_recovery_action_maps_as_nvidia_documents(action: int, want: str) -> None:
    c = Case()
    c.see(gpu(0, readings=[remapped_rows.Reading(0, 0, False, False, action)]))
    assert c.verdict(0)[0] == want


def test_ecc_row_remapping_and_fabric() -> None:
    c = Case()
    c.see(gpu(0, readings=[ecc.Reading(True, True, {"uncorrected": 2, "corrected": 5}, {})]))
    assert c.verdict(0) == ("reset_gpu", "gpu", "ecc_uncorrectable")
    c = Case()
    c.see(gpu(0, readings=[remapped_rows.Reading(0, 1, False, True, 0)]))
    assert c.verdict(0) == ("stop_scheduling", "gpu", "row_remap_failed")
    c = Case()
    c.see(gpu(0, readings=[fabric.Reading(2, 0)]))
    assert c.verdict(0) == ("ok", "none", "none")  # registration takes time
    c.clock.advance(v.FABRIC_HOLD_S)
    c.see(gpu(0, readings=[fabric.Reading(2, 0)]))
    assert c.verdict(0) == ("stop_scheduling", "link", "fabric_not_registered")


def test_a_hung_gpu_asks_for_a_reset() -> None:
    c = Case()
    c.see(gpu(0))
    hung = GpuSample(
        0, U[0], "hung", {}, T0, "nvmlDeviceGetPowerUsage did not return", (), "power", "nvmlDeviceGetPowerUsage"
    )
    c.see(hung)
    assert c.verdict(0) == ("reset_gpu", "gpu", "nvml_call_hung")


LIB = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05"
BIND = f"1 0 0:50 / / rw - overlay overlay rw\n2 1 259:1 {LIB} {LIB} ro - ext4 /dev/sda1 rw\n"


def native(origin: str, kernel: str) -> nativelib.NativeLibrary:
    maps = f"7f1-7f2 r-xp 0 fd:00 2 {LIB}\n"
    mounts = BIND if origin == "host" else "1 0 0:50 / / rw - overlay overlay rw\n"
    return nativelib.inspect(nativelib.ProcView(maps, mounts, (f"/host/{LIB}",)), kernel, "13.580.95.05")


def test_a_host_driver_upgrade_under_the_node_is_the_drivers_not_the_exporters() -> None:
    c = Case()
    c.see(gpu(0))
    c.state.nvml_up, c.state.fresh = False, False
    c.state.nvml.last_error, c.state.nvml.kernel_module_version = "LIB_RM_VERSION_MISMATCH", "580.82.07"
    c.state.native = native("host", "580.82.07")
    c.engine.update(c.state)  # type: ignore[arg-type]
    assert c.verdict(0) == ("reboot_node", "driver", "driver_library_mismatch")


def test_the_images_own_library_is_fix_exporter_even_with_a_version_mismatch() -> None:
    c = Case()
    c.see(gpu(0))
    c.state.nvml_up, c.state.fresh = False, False
    c.state.nvml.last_error = "LIB_RM_VERSION_MISMATCH"
    c.state.native = native("image", "580.82.07")
    c.engine.update(c.state)  # type: ignore[arg-type]
    assert c.verdict(0) == ("fix_exporter", "exporter", "nvml_library_not_hosts")


def test_no_fresh_sample_is_unknown_not_a_fault() -> None:
    c = Case()
    c.see(gpu(0))
    c.state.fresh = False
    c.engine.update(c.state)  # type: ignore[arg-type]
    assert c.verdict(0) == ("unknown", "none", "no_fresh_sample")


def test_each_transition_is_logged_once_and_handed_on_typed(caplog: pytest.LogCaptureFixture) -> None:
    c = Case()
    with caplog.at_level("INFO", logger="exporter.supervisor.verdicts"):
        c.see(gpu(0))
        c.see(gpu(0))
        c.state.xids.record_xid("0", U[0], 13, c.clock.wall, "kernel log", 5, "job")
        c.see(gpu(0))
        c.see(gpu(0))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "new -> ok" in lines[0] and "ok -> watch" in lines[1] and "job (pid 5)" in lines[1]
    transitions = [e for e in c.events if isinstance(e, v.VerdictTransition)]
    assert [(t.before[0], t.after.verdict) for t in transitions] == [("", "ok"), ("ok", "watch")]
    raised = [e for e in c.events if isinstance(e, v.FaultEvent) and e.kind == "raised"]
    assert [e.fault.cause for e in raised] == ["application_xid"]
    assert c.engine.current[U[0]].since_wall == transitions[-1].wall


def test_the_json_document_has_its_schema_version_and_every_gpu() -> None:
    c = Case()
    c.see(gpu(0), gpu(1, "lost", "NO_PERMISSION", uuid=""))
    doc = v.document(c.engine, c.state)  # type: ignore[arg-type]
    assert doc["schema_version"] == v.SCHEMA_VERSION
    gpus: list[dict[str, Any]] = doc["gpus"]  # type: ignore[assignment]
    assert [(g["gpu"], g["verdict"]) for g in gpus] == [("0", "ok"), ("1", "fix_exporter")]
    assert gpus[1]["faults"][0]["cause"] == "device_access_denied" and gpus[1]["uuid"] == ""
    assert doc["node"]["verdict"] == "fix_exporter"  # type: ignore[index]
    assert v.summary(doc).startswith("GPU 1 fix_exporter (exporter: device_access_denied)")


def test_every_cause_is_in_the_design_table_and_every_row_is_a_cause() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## Fault domains and verdicts", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (\w+) \| `(\w+)` \|", section, re.M)
    assert {r[0] for r in rows} == set(v.CAUSES)
    for cause, domain, verdict in rows:
        assert (v.CAUSES[cause].domain, v.CAUSES[cause].verdict) == (domain, verdict), cause


def test_every_verdict_has_a_runbook_entry() -> None:
    text = (ROOT / "docs" / "runbook.md").read_text()
    for verdict in v.VERDICTS:
        assert f"### Verdict `{verdict}`" in text, verdict
