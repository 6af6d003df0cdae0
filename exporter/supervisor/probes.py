"""Probes: expendable one-shot workers that retry a hung or crashed GPU (exporter.supervisor.gpuhealth).

A probe is the worker module run with ``only`` (attach just this GPU: by PCI bus id when known, which
finds it wherever NVML now numbers it) and ``samples`` (:func:`probe_samples`): it initialises
NVML, attaches the GPU on its own thread, samples every enabled feature that many times, one
interval apart, reports each snapshot and exits. It has its own breadcrumb memory and the worker's
deadlines, so a probe that hangs is killed and one that crashes names the call. At most one runs at
a time, and none while an earlier one is stuck unreaped in the driver (no pile-up).

A probe *answers* (:func:`answered`) only when every one of its snapshots shows the GPU up with
readings from that very pass (a call still in flight leaves the previous readings, or none: a
worker reports a GPU ``up`` until its call outlasts the deadline), there were at least
:data:`PROBE_MIN_SAMPLES` of them over at least :data:`PROBE_MIN_S`, and the probe ended by itself
with ``nvmlShutdown`` done (it is skipped while any call is in flight). Before this, one snapshot
taken an interval after start counted: a GPU whose call hangs at once "answered" and was readmitted
again and again. A probe that answers readmits the GPU (the running worker is told on its standard
input); one whose GPU is reported not up is stopped at once (it has answered no); one that
crashes or hangs counts toward its feature's quarantine like any worker; one killed from outside
proves nothing either way and is retried later at the same backoff, with no ``probe_failed`` fault.

The loop sleeps until the earliest probe is due (:attr:`exporter.supervisor.gpuhealth.GpuRecord.next_probe`),
or until :meth:`Prober.poke` says the schedule changed; it does not poll, except every
:data:`PROBE_POLL_S` while an earlier probe is stuck unreaped (its end wakes nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from typing import Any

from exporter.common.breadcrumb import BreadcrumbReader
from exporter.common.snapshot import Bye, InitFailed, Message, Snapshot
from exporter.config import Config
from exporter.supervisor.accounting import Accountant
from exporter.supervisor.gpuhealth import GpuRecord
from exporter.supervisor.quarantine import QuarantineStore
from exporter.supervisor.served import ServedState
from exporter.supervisor.workerproc import WorkerProcess, worker_config, worker_env

PROBE_POLL_S = 1.0  # while a probe is stuck unreaped in the driver: how often to look again
PROBE_MIN_SAMPLES = 3  # snapshots a probe must answer with fresh readings
PROBE_MIN_S = 5.0  # ... spread over at least this long (more samples at a short interval)


def probe_samples(interval_s: float) -> int:
    """Samples a probe takes: :data:`PROBE_MIN_SAMPLES`, more when the interval is short, so the
    first and the last are at least :data:`PROBE_MIN_S` apart (6 at 1 s, 11 at 0.5 s)."""
    return max(PROBE_MIN_SAMPLES, math.ceil(PROBE_MIN_S / max(interval_s, 1e-3)) + 1)


def answered(
    snaps: list[tuple[str, float | None]], samples: int, clean_exit: bool, max_age_s: float
) -> tuple[bool, str]:
    """Whether a probe's snapshots readmit its GPU, and why (not).

    Readings are fresh when their age is under ``max_age_s``: the worker stamps a pass's readings
    with the snapshot's own time (age 0), and readings left from an earlier pass are a sample
    interval older. The age is the worker's monotonic measure, so a wall-clock step (NTP) between
    samples changes nothing; comparing ``sampled_at`` across snapshots would.

    Args:
        snaps: (state, age) of the GPU in each snapshot, in order; age: the snapshot's ``ts`` less
            the GPU's ``sampled_at``, seconds, None without readings.
        samples: snapshots asked for.
        clean_exit: it exited 0 after ``nvmlShutdown`` (no NVML call left in flight).
        max_age_s: the oldest readings that count as the pass's own, seconds (half the interval).

    Returns:
        (answered, why): True when every one of ``samples`` snapshots shows the GPU up with fresh
        readings and the probe exited cleanly; ``why`` says so, or names the first sample (or the
        exit) that failed, in words for the log.
    """
    if len(snaps) < samples:
        return False, f"{len(snaps)} of {samples} samples"
    for i, (state, age) in enumerate(snaps):
        if state != "up":
            return False, f"sample {i + 1} of {samples}: {state}"
        if age is None or age >= max_age_s:
            return False, f"sample {i + 1} of {samples}: no fresh readings (a call still in flight)"
    if not clean_exit:
        return False, "an NVML call was still in flight at its end"
    return True, f"{samples} samples with fresh readings"


class Prober:
    """Runs probes when :meth:`exporter.supervisor.gpuhealth.GpuHealth.due_probe` says one is due.

    Args:
        config: parsed configuration.
        state: the served state (GPU health, counters).
        quarantine: feature quarantines (a probe runs without quarantined features).
        accountant: counts a probe's crash or hang.
        epoch: the fake backend's scenario time 0 (``time.monotonic()``).
        proc_state_fn: reads a process state letter.
        readmit: called with a GPU's key (UUID, else PCI bus id) when its probe answered.
        stopped: True once the exporter stops.
    """

    def __init__(
        self,
        config: Config,
        state: ServedState,
        quarantine: QuarantineStore,
        accountant: Accountant,
        epoch: float,
        proc_state_fn: Callable[[int], str | None],
        readmit: Callable[[str], None],
        stopped: Callable[[], bool],
    ) -> None:
        self.config = config
        self.state = state
        self.quarantine = quarantine
        self.accountant = accountant
        self.epoch = epoch
        self.proc_state_fn = proc_state_fn
        self.readmit = readmit
        self.stopped = stopped
        self.probe: WorkerProcess | None = None  # the running (or unreaped) probe
        self._crumbs: BreadcrumbReader | None = None
        self._wake = asyncio.Event()
        self._sleeping_until: float | None = None  # the next_probe the loop sleeps for

    def _earliest(self) -> float | None:
        due = [r.next_probe for r in self.state.health.gpus.values() if r.next_probe is not None]
        return min(due) if due else None

    def poke(self) -> None:
        """The probe schedule may have changed (a GPU hung, crashed, was readmitted) or the exporter
        stops: wake the loop if it sleeps for another time than the earliest due now."""
        if self.stopped() or self._earliest() != self._sleeping_until:
            self._wake.set()
        if self.stopped() and self.probe is not None:
            self.probe.wake()

    async def _sleep(self) -> None:
        """Until the earliest probe is due, or :meth:`poke`; :data:`PROBE_POLL_S` while one is stuck."""
        self._wake.clear()
        earliest = self._earliest()
        self._sleeping_until = earliest
        stuck = self.probe is not None and self.probe.proc is not None and self.probe.proc.returncode is None
        delay = None if earliest is None else max(0.0, earliest - self.state.health.clock())
        if stuck:
            delay = PROBE_POLL_S if delay is None else max(delay, PROBE_POLL_S)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=delay)

    async def loop(self, host: Any = None) -> None:
        """Start due probes, one at a time, until the exporter stops."""
        while not self.stopped():
            await self._sleep()
            if self.stopped():
                return
            if self.probe is not None:
                if self.probe.proc is not None and self.probe.proc.returncode is None:
                    continue  # an earlier probe is stuck in the driver: do not pile up another
                self.probe = None
            rec = self.state.health.due_probe()
            if rec is not None:
                await self.run(rec)

    async def run(self, rec: GpuRecord) -> None:
        """A one-shot worker that attaches only this GPU and samples it once."""
        if self._crumbs is None:
            self._crumbs = BreadcrumbReader()
        self._crumbs.clear()
        samples = probe_samples(self.config.interval_s)
        config = worker_config(self.config, self.quarantine.details(), only=(rec.ref(),), samples=samples)
        seen: dict[str, str] = {}
        snaps: list[tuple[str, float | None]] = []

        def on_message(msg: Message) -> None:
            if isinstance(msg, Snapshot) and msg.gpus:
                seen["state"], seen["detail"] = msg.gpus[0].state, msg.gpus[0].detail
                at = msg.gpus[0].sampled_at
                snaps.append((msg.gpus[0].state, None if at is None else msg.ts - at))
                if msg.gpus[0].state != "up":
                    seen["failed"] = msg.gpus[0].state  # decided: stop it rather than wait for the rest
                    if self.probe is not None:
                        self.probe.wake()  # its watch looks at stopping() only when woken
            elif isinstance(msg, InitFailed):
                seen["state"], seen["detail"] = "init_failed", msg.message
            elif isinstance(msg, Bye):
                seen["bye"] = "clean" if msg.nvml_shutdown else "in_flight"

        probe = WorkerProcess(
            worker_env(config, self.epoch),
            self._crumbs,
            on_message,
            (self.config.init_deadline_s, self.config.interval_s + self.config.sample_deadline_s),
            self.proc_state_fn,
            on_error=lambda doing: self.state.count_error("probe", doing),
        )
        self.probe = probe
        out = await probe.run(await probe.spawn(), lambda: self.stopped() or "failed" in seen, 1.0)
        if self.stopped():
            return
        clean = out.reason == "exit" and out.returncode == 0 and seen.get("bye") == "clean"
        ok, why = answered(snaps, samples, clean, self.config.interval_s / 2)
        if not ok and seen.get("state") not in (None, "up"):
            why = seen.get("detail") or why
        elif out.reason not in ("exit", "stopped"):
            why = f"probe {out.reason}" + (f" by {out.signal_from}" if out.signal_from else "")
        if out.reason in ("crash", "hang"):
            self.state.worker.crashes[out.place()] += 1
            if self.accountant.count_crash(out) is not None:
                self.accountant.replace_worker = True
        if out.reason in ("killed", "oom") and "failed" not in seen:
            self.state.health.probe_inconclusive(rec, why)  # its GPU said nothing wrong: not a fault
        else:
            self.state.health.probe_done(rec, ok, why)
        if ok:
            self.readmit(rec.key)
        if out.reaped:
            self.probe = None
        self.state.changed()

    async def stop(self) -> None:
        """Kill a probe still running (the exporter stops)."""
        probe = self.probe
        if probe is None or probe.proc is None or probe.proc.returncode is not None:
            return
        wait_task = asyncio.ensure_future(probe.proc.wait())
        await probe.kill(wait_task)

    def close(self) -> None:
        """Release the probes' breadcrumb memory."""
        if self._crumbs is not None:
            self._crumbs.close()
