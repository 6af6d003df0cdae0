"""What a probe's end does to its GPU's record (exporter.supervisor.probes.Prober.run), with a
stand-in for the probe process: a probe killed from outside or by the OOM killer proves nothing."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from exporter.common.collectors.base import SystemInfo
from exporter.common.snapshot import Bye, GpuSample, Message, Snapshot
from exporter.config import Config
from exporter.supervisor import probes
from exporter.supervisor.accounting import Accountant
from exporter.supervisor.gpuhealth import GpuRecord
from exporter.supervisor.policy import Outcome, RestartPolicy
from exporter.supervisor.probes import Prober
from exporter.supervisor.quarantine import QuarantineStore
from exporter.supervisor.served import ServedState

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"


class StandIn:
    """Takes the place of WorkerProcess: reports ``states`` as snapshots, then ends as ``out``."""

    states: tuple[str, ...] = ()
    clock: tuple[float, ...] = ()  # each snapshot's ts (its readings are its own: sampled_at == ts)
    spacing = 1.0  # else the snapshots are this far apart (the sample interval)
    out: Outcome = Outcome("exit", 0, 0, None, 1.0, True, "")

    def __init__(self, env: Any, crumbs: Any, on_message: Callable[[Message], None], *args: Any, **kw: Any) -> None:
        self.on_message = on_message
        self.proc = None

    async def spawn(self) -> None:
        return None

    async def run(self, _proc: Any, _stopping: Any, _poll: float) -> Outcome:
        for i, state in enumerate(self.states):
            ts = self.clock[i] if self.clock else 1_800_000_000.0 + i * self.spacing
            gpu = GpuSample(0, GPU0, state, {}, ts)
            self.on_message(Snapshot(ts, 0.0, SystemInfo(), (gpu,), {}, {}, {}, 0, {}))
        self.on_message(Bye(True))
        return self.out

    def wake(self) -> None:
        pass


@pytest.fixture
def prober(monkeypatch: pytest.MonkeyPatch) -> Iterator[Prober]:
    monkeypatch.setattr(probes, "WorkerProcess", StandIn)
    config = Config(state_file="")
    monkeypatch.setattr(StandIn, "spacing", config.interval_s)
    quarantine = QuarantineStore("", 3, 600.0, 86400.0)
    state = ServedState(config, quarantine, [])
    accountant = Accountant(config, state, quarantine, RestartPolicy(1.0, 60.0, 30.0, ()))
    p = Prober(config, state, quarantine, accountant, time.time(), lambda _pid: None, lambda _k: None, lambda: False)
    yield p
    p.close()


def _hung(p: Prober) -> GpuRecord:
    rec = p.state.health.gpus[GPU0] = GpuRecord(0, GPU0)
    rec.state, rec.excluded, rec.backoff_s = "hung", "", 30.0
    rec.next_probe = p.state.health.clock() - 1.0
    return rec


@pytest.mark.parametrize("reason,origin", [("killed", "outside"), ("oom", "oom_killer")])
async def test_a_probe_killed_from_outside_is_retried_at_the_same_backoff_without_a_fault(
    prober: Prober, monkeypatch: pytest.MonkeyPatch, reason: str, origin: str
) -> None:
    monkeypatch.setattr(StandIn, "states", ("up", "up"))
    monkeypatch.setattr(StandIn, "out", Outcome(reason, -9, 9, None, 1.0, True, "", origin))
    rec = _hung(prober)
    await prober.run(rec)
    assert rec.faults["probe_failed"] == 0 and rec.backoff_s == 30.0
    assert rec.next_probe is not None and rec.next_probe - prober.state.health.clock() == pytest.approx(30.0, abs=5)
    assert rec.state == "hung"  # not readmitted either


async def test_a_killed_probe_whose_gpu_already_failed_counts_and_backs_off(
    prober: Prober, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(StandIn, "states", ("up", "lost"))
    monkeypatch.setattr(StandIn, "out", Outcome("killed", -9, 9, None, 1.0, True, "", "outside"))
    rec = _hung(prober)
    await prober.run(rec)
    assert rec.faults["probe_failed"] == 1 and rec.backoff_s == 60.0


async def test_a_wall_clock_step_back_during_a_probe_does_not_make_a_healthy_gpu_fail(
    prober: Prober, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = probes.probe_samples(prober.config.interval_s)
    wall = [1_800_000_000.0 + i * prober.config.interval_s for i in range(n)]
    wall[n // 2 :] = [t - 30.0 for t in wall[n // 2 :]]  # NTP steps the clock back 30 s mid-probe
    monkeypatch.setattr(StandIn, "states", ("up",) * n)
    monkeypatch.setattr(StandIn, "clock", tuple(wall))
    monkeypatch.setattr(StandIn, "out", Outcome("exit", 0, 0, None, 6.0, True, ""))
    readmitted: list[str] = []
    prober.readmit = readmitted.append
    rec = _hung(prober)
    await prober.run(rec)
    assert readmitted == [GPU0] and rec.faults["probe_failed"] == 0


async def test_a_gpu_whose_readings_stay_those_of_an_earlier_pass_does_not_answer(
    prober: Prober, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = probes.probe_samples(prober.config.interval_s)
    monkeypatch.setattr(StandIn, "states", ("up",) * n)
    monkeypatch.setattr(StandIn, "out", Outcome("exit", 0, 0, None, 6.0, True, ""))
    real = StandIn.run

    async def stale(self: StandIn, *a: Any) -> Outcome:
        on_message = self.on_message

        def older(msg: Message) -> None:  # every snapshot after the first keeps the first's readings
            if isinstance(msg, Snapshot) and msg.ts > 1_800_000_000.0:
                g = dataclasses.replace(msg.gpus[0], sampled_at=1_800_000_000.0)
                msg = dataclasses.replace(msg, gpus=(g,))
            on_message(msg)

        self.on_message = older
        return await real(self, *a)

    monkeypatch.setattr(StandIn, "run", stale)
    rec = _hung(prober)
    await prober.run(rec)
    assert rec.faults["probe_failed"] == 1


async def test_a_probe_whose_gpu_reports_not_up_wakes_its_watch(
    prober: Prober, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe's watch looks at its stop condition only when woken: a GPU reported hung or lost
    must wake it, or the probe runs on to its deadline and is counted as a hang of its own."""
    woken: list[int] = []
    monkeypatch.setattr(StandIn, "states", ("up", "hung"))
    monkeypatch.setattr(StandIn, "wake", lambda self: woken.append(1))
    rec = _hung(prober)
    await prober.run(rec)
    assert woken == [1]  # once, at the snapshot that said hung
