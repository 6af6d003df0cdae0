"""The supervisor: keeps a worker running and applies what it reports to the served state.

One loop (:meth:`Supervisor.run`): spawn a :class:`~exporter.workerproc.WorkerProcess`, apply its
messages to the :class:`~exporter.served.ServedState` as they arrive (:meth:`Supervisor.handle`),
and when it ends, account for the death (:meth:`Supervisor.account`): count it by reason and by
the NVML call in flight, log one structured record with the dead worker's stack, count it toward a
feature quarantine (:mod:`exporter.quarantine`), and wait the delay the restart policy
(:mod:`exporter.policy`) decides. Workers that survived SIGKILL are kept aside (at most one before
respawning stops) and watched until they go.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from exporter import collectors, protocol, selfcheck
from exporter.breadcrumb import BreadcrumbReader
from exporter.config import Config
from exporter.extensions import Extension, default_extensions
from exporter.logs import log_once
from exporter.policy import Outcome, RestartPolicy
from exporter.quarantine import Quarantine, QuarantineStore
from exporter.served import ServedState
from exporter.snapshot import Bye, Hello, InitFailed, Message, NvmlEvent, Snapshot
from exporter.workerproc import WorkerProcess, proc_state, worker_env
from guards.versions import SelfCheckResult

log = logging.getLogger("exporter.supervisor")

RESPAWN_STOPPED_POLL_S = 5.0


class Supervisor:
    """Worker lifecycle; the state it keeps is :attr:`state`.

    Args:
        config: parsed configuration.
        extensions: supervisor-side extensions; ``None`` attaches the default set for ``config``
            (:func:`exporter.extensions.default_extensions`).
        proc_state_fn: reads a process state letter (tests inject ``D``).
    """

    def __init__(
        self,
        config: Config,
        extensions: list[Extension] | None = None,
        proc_state_fn: Callable[[int], str | None] = proc_state,
    ) -> None:
        self.config = config
        self.proc_state_fn = proc_state_fn
        self.epoch = time.time()
        self.crumbs = BreadcrumbReader()
        self.quarantine = QuarantineStore(
            config.state_file, config.quarantine_after, config.quarantine_window_s, config.quarantine_ttl_s
        )
        if extensions is None:
            extensions = default_extensions(config, self.quarantine)
        self.state = ServedState(config, self.quarantine, extensions)
        self.policy = RestartPolicy(
            config.backoff_initial_s,
            config.backoff_max_s,
            healthy_after_s=max(30.0, 5 * config.interval_s),
            quarantinable={*collectors.COLLECTORS, "events"},
        )
        self.current: WorkerProcess | None = None
        self.unreaped: list[WorkerProcess] = []
        self.fatal_exit: int | None = None  # set when strict self-check refuses to run
        self._stopping = False
        self._wake = asyncio.Event()
        self._stale_timer: asyncio.TimerHandle | None = None
        self.state.selfchecks["supervisor"] = selfcheck.run_in_process("supervisor")

    # -- messages ----------------------------------------------------------------------------

    def handle(self, msg: Message) -> None:
        """Apply one decoded message from the worker, then ask for a new rendering."""
        if isinstance(msg, Snapshot):
            self.state.apply_snapshot(msg)
            self._schedule_stale_render()
        elif isinstance(msg, Hello):
            self._on_hello(msg)
        elif isinstance(msg, SelfCheckResult):
            self._on_selfcheck(msg)
        elif isinstance(msg, NvmlEvent):
            self._on_event(msg)
        elif isinstance(msg, InitFailed):
            self._on_init_failed(msg)
        elif isinstance(msg, Bye):
            log.info("worker stopped (nvmlShutdown %s)", "done" if msg.nvml_shutdown else "skipped")
        self.state.changed()

    def _on_hello(self, msg: Hello) -> None:
        st = self.state
        st.nvml_up = True
        st.last_init_error = None
        st.system = msg.system
        st.worker_states = dict(msg.feature_states)
        for index, uuid in msg.gpus:
            st.gpu_index[uuid] = str(index)
        log.info(
            "worker %s ready: %d GPU(s), driver %s, NVML %s, nvidia-ml-py %s",
            msg.pid,
            len(msg.gpus),
            msg.system.driver_version,
            msg.system.nvml_version,
            msg.system.nvidia_ml_py_version,
        )

    def _on_selfcheck(self, result: SelfCheckResult) -> None:
        self.state.selfchecks["worker"] = result
        for problem in result.problems:
            log_once(log, logging.WARNING, ("selfcheck", "worker", problem), "self-check (worker): %s", problem)
        if result.problems and self.config.selfcheck == "strict":
            log.error(
                "NVGPU_SELFCHECK=strict: the worker's self-check failed; refusing to run:\n  %s",
                "\n  ".join(result.problems),
            )
            self.fatal_exit = protocol.EXIT_SELFCHECK
            self._wake.set()

    def _on_event(self, msg: NvmlEvent) -> None:
        st = self.state
        gpu = str(msg.gpu) if msg.gpu is not None else st.gpu_index.get(msg.uuid, "")
        if msg.event_type != "xid" or msg.xid is None:
            st.xids.record_event(gpu, msg.uuid, msg.event_type)
        elif all(ext.accept_xid(msg.uuid, msg.xid, msg.ts) for ext in st.extensions):
            st.record_xid(gpu, msg.uuid, msg.xid, msg.ts, source="NVML event")

    def _on_init_failed(self, msg: InitFailed) -> None:
        self.state.nvml_up = False
        self.state.last_init_error = f"NVML unavailable: {msg.message}"
        log_once(
            log,
            logging.ERROR,
            ("init_failed", msg.error),
            "%s; retrying with backoff. Without a GPU, try the demo: nvgpu-exporter --nvml-backend fake:h200x2",
            self.state.last_init_error,
            extra={"nvml_error": msg.error},
        )

    def _schedule_stale_render(self) -> None:
        if self._stale_timer is not None:
            self._stale_timer.cancel()
        loop = asyncio.get_running_loop()
        self._stale_timer = loop.call_later(self.config.stale_s + 0.05, self.state.changed)

    # -- worker lifecycle --------------------------------------------------------------------

    def _stopped(self) -> bool:
        return self._stopping or self.fatal_exit is not None

    async def run(self) -> None:
        """Keep a worker running until :meth:`stop`."""
        while not self._stopped():
            if self.state.worker.respawn_stopped:
                self._reap_finished()
                if self.state.worker.respawn_stopped:
                    await self._sleep(RESPAWN_STOPPED_POLL_S)
                    continue
            outcome = await self._run_one()
            if self._stopped():
                break
            delay = self.account(outcome)
            if delay > 0:
                await self._sleep(delay)

    async def _sleep(self, seconds: float) -> None:
        """Wait ``seconds`` or until :meth:`stop` (or a fatal self-check) wakes the loop."""
        if self._stopped():
            return
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass

    async def _run_one(self) -> Outcome:
        self.crumbs.clear()
        worker = WorkerProcess(
            worker_env(self.config.worker_config(self.quarantine.details()), self.epoch),
            self.crumbs,
            self.handle,
            (self.config.init_deadline_s, self.config.interval_s + self.config.sample_deadline_s),
            self.proc_state_fn,
        )
        reader = await worker.spawn()
        self.current = worker
        self.state.worker_started(worker.pid or 0)
        self.state.changed()
        outcome = await worker.run(reader, self._stopped, self.config.shutdown_timeout_s * 0.6)
        if not outcome.reaped:
            self.unreaped.append(worker)
        return outcome

    def _reap_finished(self) -> None:
        self.unreaped = [w for w in self.unreaped if w.proc is not None and w.proc.returncode is None]
        w = self.state.worker
        stuck = [p for p in self.unreaped if p.pid is not None and self.proc_state_fn(p.pid) == "D"]
        if w.respawn_stopped and not self.unreaped:
            log.warning("the hung workers are gone; respawning resumes")
            w.respawn_stopped = False
        w.stuck = bool(stuck) or w.respawn_stopped

    def account(self, out: Outcome) -> float:
        """Count the death, log one record, quarantine if due; returns the restart delay."""
        w = self.state.worker
        w.restarts[out.reason] += 1
        w.last_exit_signal = out.signal
        if out.returncode is not None and out.returncode >= 0:
            w.last_exit_code = out.returncode
        if out.reason in ("crash", "hang"):
            w.crashes[out.place()] += 1
        self._log_death(out)
        new = None
        candidate = self.policy.quarantine_candidate(out)
        if candidate is not None:
            new = self.quarantine.record(*candidate)
            if new is not None:
                self._log_quarantine(new)
        decision = self.policy.decide(
            out, unreaped=len(self.unreaped), had_snapshot=self.state.last is not None, new_quarantine=new is not None
        )
        if decision.stop_respawn and not w.respawn_stopped:
            w.respawn_stopped = True
            log.error(
                "the replacement worker hung in the same place (%s/%s) and cannot be reaped: respawning "
                "stopped; /metrics keeps serving; the node needs attention (GPU reset or reboot)",
                *out.place(),
            )
        self._reap_finished()
        self.state.changed()
        return decision.delay_s

    def _log_death(self, out: Outcome) -> None:
        record = out.record()
        if out.reason in ("crash", "hang"):
            feature, function = out.place()
            log.error(
                "worker died: %s in %s/%s on GPU %s after %.1f s",
                out.reason,
                feature,
                function,
                (out.crumb.uuid if out.crumb else "") or "-",
                out.lifetime_s,
                extra={**record, "stack": out.stack},
            )
        elif out.reason == "nvml_error":
            log.debug("worker exited: %s", self.state.last_init_error or "NVML unavailable", extra=record)
        else:
            log.warning("worker exited with code %s after %.1f s", out.returncode, out.lifetime_s, extra=record)

    def _log_quarantine(self, new: Quarantine) -> None:
        log.warning(
            "feature %s QUARANTINED: %s. All other features keep being sampled. To retry earlier: "
            "`nvgpu-exporter quarantine --clear %s` (or delete %s) and restart; NVGPU_FEATURE_%s=on does not "
            "override a quarantine.",
            new.feature,
            new.detail(),
            new.feature,
            self.config.state_file or "the state file",
            new.feature.upper(),
            extra={"feature": new.feature, "function": new.function},
        )

    async def stop(self) -> None:
        """Stop the worker in order (drain, nvmlShutdown, exit) and end :meth:`run`."""
        self._stopping = True
        self._wake.set()

    def close(self) -> None:
        """Release the shared memory."""
        if self._stale_timer is not None:
            self._stale_timer.cancel()
        self.crumbs.close()
