"""Probes: expendable one-shot workers that retry a hung or crashed GPU (exporter.supervisor.gpuhealth).

A probe is the worker module run with ``only`` (attach just this GPU: by PCI bus id when known, which
finds it wherever NVML now numbers it) and
``samples: 1``: it initialises NVML, attaches the GPU on its own thread, samples every enabled
feature once, reports the snapshot and exits. It has its own breadcrumb memory and the worker's
deadlines, so a probe that hangs is killed and one that crashes names the call. At most one runs at
a time, and none while an earlier one is stuck unreaped in the driver (no pile-up). A probe that
answers readmits the GPU (the running worker is told on its standard input); one that crashes or
hangs counts toward its feature's quarantine like any worker.

The loop sleeps until the earliest probe is due (:attr:`exporter.supervisor.gpuhealth.GpuRecord.next_probe`),
or until :meth:`Prober.poke` says the schedule changed; it does not poll, except every
:data:`PROBE_POLL_S` while an earlier probe is stuck unreaped (its end wakes nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from exporter.common.breadcrumb import BreadcrumbReader
from exporter.common.snapshot import InitFailed, Message, Snapshot
from exporter.config import Config
from exporter.supervisor.accounting import Accountant
from exporter.supervisor.gpuhealth import GpuRecord
from exporter.supervisor.quarantine import QuarantineStore
from exporter.supervisor.served import ServedState
from exporter.supervisor.workerproc import WorkerProcess, worker_config, worker_env

PROBE_POLL_S = 1.0  # while a probe is stuck unreaped in the driver: how often to look again


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
        config = worker_config(self.config, self.quarantine.details(), only=(rec.ref(),), samples=1)
        seen: dict[str, str] = {}

        def on_message(msg: Message) -> None:
            if isinstance(msg, Snapshot) and msg.gpus:
                seen["state"], seen["detail"] = msg.gpus[0].state, msg.gpus[0].detail
            elif isinstance(msg, InitFailed):
                seen["state"], seen["detail"] = "init_failed", msg.message

        probe = WorkerProcess(
            worker_env(config, self.epoch),
            self._crumbs,
            on_message,
            (self.config.init_deadline_s, self.config.interval_s + self.config.sample_deadline_s),
            self.proc_state_fn,
            on_error=lambda doing: self.state.count_error("probe", doing),
        )
        self.probe = probe
        out = await probe.run(await probe.spawn(), self.stopped, 1.0)
        if self.stopped():
            return
        ok = seen.get("state") == "up" and out.reason == "exit" and out.returncode == 0
        if out.reason in ("crash", "hang"):
            self.state.worker.crashes[out.place()] += 1
            if self.accountant.count_crash(out) is not None:
                self.accountant.replace_worker = True
        self.state.health.probe_done(rec, ok, seen.get("detail") or f"probe {out.reason}")
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
