"""A wall-clock step of an hour, forwards or back, changes no decision of either process.

Every duration, age, window and deadline is measured on ``time.monotonic()``; the wall clock only
stamps what is exported or logged. The ``wall_step`` fixture patches ``time.time`` (and
``time.time_ns``) so a test can step it while the code runs; the real exporter gets the same step in
both of its processes in ``tests/test_integration_clock.py``. The quarantine's window and TTL have
their own tests (tests/test_quarantine.py, tests/test_fuzz_state.py), the stuck signature its own
(tests/test_stuck.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from exporter.common.collectors import identity
from exporter.common.collectors.base import SystemInfo
from exporter.common.snapshot import GpuSample, Snapshot
from exporter.config import Config
from exporter.supervisor.gpuhealth import GpuHealth
from exporter.supervisor.kernel_xid import KernelXid
from exporter.supervisor.quarantine import QuarantineStore
from exporter.supervisor.served import ServedState
from exporter.supervisor.xid.parse import KernelXidEvent
from exporter.worker.gpuslot import GpuSlot, LastReadings

UUID = "GPU-00000000-0000-0000-0000-0000000000aa"
BUS = "00000000:18:00.0"


class WallStep:
    """``time.time`` as the code sees it: the real wall clock plus the steps so far."""

    def __init__(self) -> None:
        self.offset = 0.0

    def step(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def wall_step(monkeypatch: pytest.MonkeyPatch) -> Iterator[WallStep]:
    real, real_ns = time.time, time.time_ns
    clock = WallStep()
    monkeypatch.setattr(time, "time", lambda: real() + clock.offset)
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() + int(clock.offset * 1e9))
    yield clock


STEPS = pytest.mark.parametrize("step_s", [3600.0, -3600.0], ids=["forwards", "back"])


def snapshot(ts: float, sampled_at: float | None = None) -> Snapshot:
    gpu = GpuSample(0, UUID, "up", {"identity": identity.Reading("NVIDIA H200", BUS, None, 9)}, sampled_at or ts)
    return Snapshot(ts, 0.01, SystemInfo(), (gpu,), {}, {}, {}, 0, {})


@STEPS
def test_freshness_and_readiness_follow_the_monotonic_clock(wall_step: WallStep, step_s: float) -> None:
    """A snapshot taken just before the step stays fresh after it (and goes stale at the stale bound
    by the monotonic clock, not at once nor an hour late)."""
    state = ServedState(Config(state_file="", stale_s=15.0), QuarantineStore("", 3, 600.0, 86400.0), [])
    state.apply_snapshot(snapshot(time.time()))
    wall_step.step(step_s)
    assert state.fresh_snapshot() is not None and [g.uuid for g in state.fresh_gpus()] == [UUID]
    assert state.ready() == (True, "ok")
    assert state.last_mono is not None
    state.last_mono -= 16.0  # 16 s later by the monotonic clock
    assert state.fresh_snapshot() is None


@STEPS
def test_a_gpus_readings_age_is_measured_by_the_worker_on_its_monotonic_clock(step_s: float) -> None:
    """The readings were taken 0.5 s before the snapshot by the monotonic clock; the worker's wall
    clock stepped in between: ``ts - sampled_at`` is still 0.5 s."""
    slot = GpuSlot(0, SimpleNamespace(fork=lambda slot: SimpleNamespace(slot=slot)), uuid=UUID)  # type: ignore[arg-type]
    try:
        mono = time.monotonic()
        slot.state, slot.last = "up", LastReadings({}, mono - 0.5)
        ts = 1_800_000_000.0 + step_s
        view = slot.sample_view((), ts, mono)
        assert view.sampled_at == pytest.approx(ts - 0.5)
    finally:
        slot.close()


@STEPS
def test_the_probe_back_off_runs_on_the_monotonic_clock(wall_step: WallStep, step_s: float) -> None:
    health = GpuHealth(30.0, 600.0)
    health.on_hello([(0, UUID, BUS)])
    assert health.on_crash(UUID, "power", quarantined=False) is None  # the only GPU: never left out
    health.on_hello([(1, "GPU-b", "")])
    rec = health.on_crash(UUID, "power", quarantined=False)
    assert rec is not None
    wall_step.step(step_s)
    assert health.due_probe() is None  # not due at once after a step forwards, nor later after one back
    assert rec.next_probe is not None and rec.next_probe - time.monotonic() == pytest.approx(30.0, abs=1.0)


class Host:
    """What the kernel-log extension needs from the supervisor: the snapshot and the ledger."""

    def __init__(self, snap: Snapshot) -> None:
        self.snapshot = snap
        self.counted: list[tuple[str, int, float]] = []

    def record_xid(
        self, gpu: str, uuid: str, xid: int, ts: float, source: str, pid: int | None = None, process: str = ""
    ) -> None:
        self.counted.append((uuid, xid, ts))

    def attribute_xid(self, uuid: str, xid: int, ts: float, pid: int | None, process: str) -> None:
        pass

    def changed(self) -> None:
        pass


def kernel_event(xid: int, wall_time: float) -> KernelXidEvent:
    return KernelXidEvent(None, None, BUS, xid, None, None, f"Xid (PCI:{BUS}): {xid}", {}, wall_time)


@STEPS
def test_an_xid_seen_by_nvml_and_the_kernel_log_counts_once_across_a_step(
    wall_step: WallStep, step_s: float, tmp_path: Any
) -> None:
    """The kernel log was first read (its records' times come from the boot time taken then); the
    wall clock steps; an Xid 79 arrives as an NVML event (its wall time stepped) and the kernel
    log's record of it, 0.2 s apart: paired, counted once. A second Xid 79 a minute later (by the
    monotonic clock) is a new one."""
    ext = KernelXid(Config(state_file="", kmsg_path=str(tmp_path / "kmsg")))
    host = Host(snapshot(time.time()))
    ext.wall_to_mono = time.monotonic() - time.time()  # taken when the log was first read
    logged_at = time.time()  # the record's time: boot time (before the step) + its time since boot
    wall_step.step(step_s)
    assert ext.accept_xid(UUID, 79, time.time()) is True  # the NVML event: counted by the supervisor
    ext.count(host, [kernel_event(79, logged_at + 0.2)])
    assert host.counted == []  # the same Xid: not counted again
    ext.count(host, [kernel_event(79, logged_at + 60.0)])
    assert [(u, x) for u, x, _ in host.counted] == [(UUID, 79)]
