"""The stuck-context signature (exporter.supervisor.stuck), with and without GPM.

Busy by utilization, no SM activity and no processes is the strongest evidence of a wedged
context; without GPM the signature falls back to "no memory in use".
"""

from __future__ import annotations

import pytest

from exporter.common.collectors import gpm, memory, processes, utilization
from exporter.common.snapshot import GpuSample, Snapshot, SystemInfo
from exporter.supervisor.stuck import StuckDetector

GIB = 1 << 30


def snap(ts: float, *, util: int, procs: int, used: int | None, sm: float | None) -> Snapshot:
    readings: dict[str, object] = {
        "utilization": utilization.Reading(util, 0, 0, 0),
        "processes": processes.Reading(procs, 0 if procs == 0 else GIB),
    }
    if used is not None:
        readings["memory"] = memory.Reading(
            total_bytes=150 * GIB,
            used_bytes=used,
            free_bytes=0,
            reserved_bytes=0,
            bar1_total_bytes=0,
            bar1_used_bytes=0,
        )
    if sm is not None:
        readings["gpm"] = gpm.Reading({gpm.SM_UTIL: sm, gpm.GRAPHICS_UTIL: float(util)}, {})
    gpu = GpuSample(0, "GPU-0", "up", readings, ts)
    return Snapshot(ts, 0.01, SystemInfo(), (gpu,), {}, {}, {}, 0, {})


class Clock:
    """The supervisor's monotonic clock, set by the test."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def feed(det: StuckDetector, clock: Clock, t: float, ts: float | None = None, **conditions: object) -> None:
    """A snapshot arriving at monotonic ``t`` whose wall time is ``ts`` (default 1000 + t)."""
    clock.t = t
    det.on_snapshot(snap(1000.0 + t if ts is None else ts, **conditions))  # type: ignore[arg-type]


def run(**conditions: object) -> tuple[bool, bool]:
    """(evaluable, holding) after 90 s of the same conditions, 60 s required."""
    clock = Clock()
    det = StuckDetector(0.99, 64 << 20, 60.0, sm_activity=0.01, clock=clock)
    for t in range(0, 91, 5):
        feed(det, clock, t, **conditions)
    st = det.gpus[next(iter(det.gpus))]
    return st.evaluable, st.holding


@pytest.mark.parametrize(
    ("conditions", "holding"),
    [
        # the incident: 100 % busy, nothing in memory, no process; GPM: no SM working
        ({"util": 100, "procs": 0, "used": 0, "sm": 0.0}, True),
        # a dead context still pinning memory: memory alone says "in use", GPM says nothing runs
        ({"util": 100, "procs": 0, "used": 40 * GIB, "sm": 0.2}, True),
        # a real job the exporter cannot see (no hostPID) using little memory: GPM shows SMs working
        ({"util": 100, "procs": 0, "used": 0, "sm": 35.0}, False),
        # without GPM (pre-Hopper, feature off): the memory test, as before
        ({"util": 100, "procs": 0, "used": 0, "sm": None}, True),
        ({"util": 100, "procs": 0, "used": 40 * GIB, "sm": None}, False),
        # not busy, or a process listed: never stuck
        ({"util": 40, "procs": 0, "used": 0, "sm": 0.0}, False),
        ({"util": 100, "procs": 1, "used": 0, "sm": 0.0}, False),
    ],
    ids=["incident", "dead_context_pins_memory", "invisible_real_job", "no_gpm_empty", "no_gpm_in_use", "idle", "proc"],
)
def test_signature(conditions: dict[str, object], holding: bool) -> None:
    assert run(**conditions) == (True, holding)


def test_not_evaluable_without_gpm_or_memory() -> None:
    assert run(util=100, procs=0, used=None, sm=None) == (False, False)


def test_gpm_reading_arriving_later_keeps_the_signature() -> None:
    """The first sample after a worker start has no GPM window: the memory test bridges it."""
    clock = Clock()
    det = StuckDetector(0.99, 64 << 20, 60.0, clock=clock)
    feed(det, clock, 0, util=100, procs=0, used=0, sm=None)
    for t in range(5, 66, 5):
        feed(det, clock, t, util=100, procs=0, used=0, sm=0.0)
    assert det.suspected("GPU-0")
    fams = {m.name: m.samples for m in det.gpu_families(None)}  # type: ignore[arg-type]
    assert [s.value for s in fams["nvgpu_stuck_context_suspected"]] == [1.0]
    assert [s.value for s in fams["nvgpu_stuck_context_since_timestamp_seconds"]] == [1000.0]


@pytest.mark.parametrize("step_s", [3600.0, -3600.0])
def test_a_wall_clock_step_changes_no_decision(step_s: float) -> None:
    """The snapshots' wall time steps by an hour 30 s into the signature: it still fires 60 s after it
    began by the monotonic clock, not at once (forwards) or an hour late (backwards); the exported
    since-timestamp stays the wall time it began at."""
    clock = Clock()
    det = StuckDetector(0.99, 64 << 20, 60.0, clock=clock)
    conditions = {"util": 100, "procs": 0, "used": 0, "sm": 0.0}
    for t in range(0, 56, 5):
        feed(det, clock, t, ts=1000.0 + t + (step_s if t >= 30 else 0.0), **conditions)
    assert not det.suspected("GPU-0")
    feed(det, clock, 60, ts=1060.0 + step_s, **conditions)
    assert det.suspected("GPU-0")
    fams = {m.name: m.samples for m in det.gpu_families(None)}  # type: ignore[arg-type]
    assert [s.value for s in fams["nvgpu_stuck_context_since_timestamp_seconds"]] == [1000.0]
