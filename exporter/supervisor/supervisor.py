"""The supervisor: keeps a worker running and applies what it reports to the served state.

One loop (:meth:`Supervisor.run`): spawn a :class:`~exporter.supervisor.workerproc.WorkerProcess`, apply its
messages to the :class:`~exporter.supervisor.served.ServedState` as they arrive (:meth:`Supervisor.handle`),
and when it ends, account for the death (:meth:`Supervisor.account`): count it by reason and by
the NVML call in flight, log one structured record with the dead worker's stack, count it toward a
feature quarantine (:mod:`exporter.supervisor.quarantine`), and wait the delay the restart policy
(:mod:`exporter.supervisor.policy`) decides. Workers that survived SIGKILL are kept aside (at most one before
respawning stops) and watched until they go. Beside the worker it runs the probe loop and each
extension's background work, the latter while the decided state of its feature is on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from exporter.common import collectors, protocol, selfcheck
from exporter.common.breadcrumb import BreadcrumbReader
from exporter.common.logs import log_once
from exporter.common.nativelib import NativeLibrary
from exporter.common.snapshot import Attribution, Bye, Hello, InitFailed, Message, NvmlEvent, Progress, Snapshot
from exporter.config import Config
from exporter.supervisor import unavailable
from exporter.supervisor.accounting import Accountant
from exporter.supervisor.gpuhealth import GpuHealth
from exporter.supervisor.policy import Outcome, RestartPolicy
from exporter.supervisor.probes import Prober
from exporter.supervisor.served import ServedState
from exporter.supervisor.workerproc import WorkerProcess, proc_state, worker_config, worker_env
from guards.versions import SelfCheckResult

log = logging.getLogger("exporter.supervisor")

RESPAWN_STOPPED_POLL_S = 5.0
STALE_RENDER_S = 10.0  # while no snapshot arrives: the age of the last one is rendered this often
LOOP_ERROR_BACKOFF_S = (1.0, 60.0)  # the supervisor's own failures: bounded retry


class ExtensionTasks:
    """Each extension's background work (:meth:`Extension.run`), run while the decided state of its
    feature is on: started with the provisional view, cancelled once the worker decides the feature
    off (a known-issue rule), started again if a later decision turns it on.

    Args:
        state: the served state (its extensions and decided feature states).
        contained: runs a body for the exporter's life, counting and retrying its failures
            (:meth:`Supervisor.contained`).
    """

    def __init__(
        self,
        state: ServedState,
        contained: Callable[[str, Callable[[Any], Coroutine[Any, Any, None]]], Coroutine[Any, Any, None]],
    ) -> None:
        self.state = state
        self.contained = contained
        self.running = False
        self.tasks: dict[int, asyncio.Future[None]] = {}  # id(extension) -> its run()

    def start(self) -> None:
        """The supervisor runs: start what is on."""
        self.running = True
        self.follow()

    def follow(self) -> None:
        """Start or cancel each extension's work as the decided state now says (after a report)."""
        if not self.running:
            return
        active = {id(ext) for ext in self.state.active_extensions()}
        for ext in self.state.extensions:
            task = self.tasks.get(id(ext))
            if id(ext) in active and task is None:
                self.tasks[id(ext)] = asyncio.ensure_future(self.contained(ext.component, ext.run))
            elif id(ext) not in active and task is not None:
                task.cancel()
                del self.tasks[id(ext)]
                state = self.state.decided_states()[ext.feature]
                log.info(
                    "feature %s is off (%s: %s); its %s stops",
                    ext.feature,
                    state.reason.value,
                    state.detail,
                    type(ext).__name__,
                    extra={"feature": ext.feature},
                )

    def stop(self) -> None:
        """The supervisor stops: cancel every extension's work."""
        self.running = False
        for task in self.tasks.values():
            task.cancel()
        self.tasks.clear()


class Supervisor:
    """Worker lifecycle; the state it keeps is :attr:`state` (built by :mod:`exporter.app`).

    Args:
        config: parsed configuration.
        state: the served state, with its quarantine store and extensions.
        proc_state_fn: reads a process state letter (tests inject ``D``).

    Attributes:
        selfcheck: this process's self-check, run at construction (shown unless
            ``NVGPU_SELFCHECK=off``).
        loop_error: what ended :meth:`run` with an exception, None while it runs (``/healthz``).
    """

    def __init__(
        self, config: Config, state: ServedState, proc_state_fn: Callable[[int], str | None] = proc_state
    ) -> None:
        self.config = config
        self.proc_state_fn = proc_state_fn
        self.epoch = time.monotonic()  # the fake backend's scenario time 0, on the clock every process shares
        self.crumbs = BreadcrumbReader()
        self.state = state
        self.quarantine = state.quarantine
        self.policy = RestartPolicy(
            config.backoff_initial_s,
            config.backoff_max_s,
            healthy_after_s=max(30.0, 5 * config.interval_s),
            quarantinable={*collectors.COLLECTORS, "events"},
        )
        self.current: WorkerProcess | None = None
        self.unreaped: list[WorkerProcess] = []
        self.accountant = Accountant(config, self.state, self.quarantine, self.policy)
        self.prober = Prober(
            config,
            self.state,
            self.quarantine,
            self.accountant,
            self.epoch,
            proc_state_fn,
            self._readmit,
            self._stopped,
        )
        self._loop_errors = 0
        self.fatal_exit: int | None = None  # set when strict self-check refuses to run
        self._stopping = False
        self._wake = asyncio.Event()
        self._stale_timer: asyncio.TimerHandle | None = None
        self.extension_tasks = ExtensionTasks(state, self.contained)
        self.loop_error: BaseException | None = None
        state.subscribe(self._ask_attributions)
        self.selfcheck = selfcheck.run_in_process("supervisor")
        if config.selfcheck != "off":
            self.state.selfchecks["supervisor"] = self.selfcheck
        state.subscribe(lambda: _follow_changes(self))

    def handle(self, msg: Message) -> None:
        """Apply one decoded message from the worker, then ask for a new rendering. A failure here
        is the supervisor's own bug: contained, counted (component ``worker_io``), logged once."""
        try:
            self._dispatch(msg)
            if isinstance(msg, (Hello, Snapshot)):  # they carry the worker's feature decision
                self.extension_tasks.follow()
        except Exception:  # noqa: BLE001 - never let one message end the supervisor
            self.state.count_error("worker_io", f"handling a {type(msg).__name__} message")
        self.state.changed()

    def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, Snapshot):
            for rec in self.state.apply_snapshot(msg):
                log.error(
                    "%s hung: %s; its readings go stale, every other GPU keeps being sampled; "
                    "a probe retries it in %.0f s",
                    rec.label(),
                    rec.detail,
                    rec.backoff_s,
                    extra={"gpu": rec.index, "uuid": rec.uuid, "feature": rec.hung_in[0], "function": rec.hung_in[1]},
                )
                self.accountant.gpu_hung(rec.key, *rec.hung_in)
            self._schedule_stale_render()
        elif isinstance(msg, Progress):
            log.debug("worker init: %s", msg.step)
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
        elif isinstance(msg, NativeLibrary):
            unavailable.native_reported(self.state, msg)
        elif isinstance(msg, Attribution):
            self.state.attribute_pod(msg.pid, msg.pod_uid, msg.namespace, msg.pod, msg.container)

    def _ask_attributions(self) -> None:
        """Ask the worker to map the PIDs of new Xids to pods (it answers with ``attribution``)."""
        pids = self.state.take_pid_lookups()
        worker = self.current
        for pid in pids:
            if worker is not None:
                worker.send({"type": "attribute", "pid": pid})

    def _on_hello(self, msg: Hello) -> None:
        st = self.state
        st.nvml_up = True
        st.last_init_error = None
        st.system = msg.system
        st.nvml.kernel_module_version = msg.kernel_module_version or st.nvml.kernel_module_version
        st.worker_states = dict(msg.feature_states)
        st.worker_ready(msg)
        unavailable.native_reported(self.state, msg.native)
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
        gpu, uuid = _event_gpu(st.health, msg)
        if msg.event_type != "xid" or msg.xid is None:
            st.record_event(gpu, uuid, msg.event_type)
        elif all(ext.accept_xid(uuid, msg.xid, msg.ts) for ext in st.active_extensions()):
            st.record_xid(gpu, uuid, msg.xid, msg.ts, source="NVML event")

    def _on_init_failed(self, msg: InitFailed) -> None:
        unavailable.native_reported(self.state, msg.native)
        text = unavailable.record(self.state, msg, self.config.unhealthy_after_s)
        # the demo hint ends with a command to paste: no field after it (the error is in the text)
        extra = {} if text.endswith(unavailable.DEMO_COMMAND) else {"nvml_error": msg.error}
        log_once(log, logging.ERROR, ("init_failed", msg.error), "%s", text, extra=extra)

    def _schedule_stale_render(self) -> None:
        """Render again when the snapshot goes stale, and every ``STALE_RENDER_S`` after that until the
        next one arrives: ``nvgpu_last_sample_age_seconds`` keeps growing while no sample comes."""
        if self._stale_timer is not None:
            self._stale_timer.cancel()
        loop = asyncio.get_running_loop()
        self._stale_timer = loop.call_later(self.config.stale_s + 0.05, self._stale_render)

    def _stale_render(self) -> None:
        self.state.changed()
        self._stale_timer = asyncio.get_running_loop().call_later(STALE_RENDER_S, self._stale_render)

    # -- worker lifecycle --------------------------------------------------------------------

    def _stopped(self) -> bool:
        return self._stopping or self.fatal_exit is not None

    async def run(self) -> None:
        """Keep a worker running until :meth:`stop`; probe hung or crashed GPUs beside it.

        Only :meth:`stop` (SIGTERM/SIGINT) or a strict self-check failure ends this loop: a failure in
        the supervisor's own work (spawning, accounting) is counted as component ``lifecycle`` and
        retried after a bounded backoff.
        """
        probes = asyncio.ensure_future(self.contained("probe", self.prober.loop))
        self.extension_tasks.start()
        try:
            while not self._stopped():
                try:
                    delay = await self._one_round()
                    self._loop_errors = 0
                except Exception:  # noqa: BLE001 - e.g. EMFILE creating the worker's pipe
                    self._loop_errors += 1
                    self.state.count_error("lifecycle", "starting or accounting for a worker")
                    low, high = LOOP_ERROR_BACKOFF_S
                    delay = min(low * 2.0 ** min(self._loop_errors - 1, 16), high)
                if delay > 0:
                    await self._sleep(delay)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self.loop_error = exc
            raise
        finally:
            probes.cancel()
            self.extension_tasks.stop()
            await self.prober.stop()

    async def _one_round(self) -> float:
        if self.state.worker.respawn_stopped:
            self._reap_finished()
            if self.state.worker.respawn_stopped:
                return RESPAWN_STOPPED_POLL_S
        outcome = await self._run_one()
        if self._stopped():
            return 0.0
        return self.account(outcome)

    async def contained(self, component: str, body: Callable[[Any], Coroutine[Any, Any, None]]) -> None:
        """Run ``body(state)`` for the exporter's life (an extension's ``run``, the probe loop); after
        a failure count it by ``component``, log it once, and run it again after a bounded backoff."""
        failures = 0
        while not self._stopped():
            try:
                await body(self.state)
                return
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001
                failures += 1
                self.state.count_error(component, f"the {component} loop")
                await asyncio.sleep(min(2.0 ** min(failures, 6), 60.0))

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
            worker_env(
                worker_config(self.config, self.quarantine.details(), self.state.health.exclusions()), self.epoch
            ),
            self.crumbs,
            self.handle,
            (self.config.init_deadline_s, self.config.interval_s + self.config.sample_deadline_s),
            self.proc_state_fn,
            on_error=lambda doing: self.state.count_error("worker_io", doing),
        )
        self.current = worker  # before spawning: a shutdown that runs out of time kills what it finds here
        reader = await worker.spawn()
        self.state.worker_started(worker.pid or 0)
        self.state.changed()
        outcome = await worker.run(
            reader, lambda: self._stopped() or self.accountant.replace_worker, self.config.shutdown_timeout_s * 0.6
        )
        if self.accountant.replace_worker and not self._stopped():
            self.accountant.replace_worker = False
            outcome = dataclasses.replace(outcome, reason="quarantine")
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
        """Account for an ended worker (:class:`~exporter.supervisor.accounting.Accountant`); returns the delay."""
        delay = self.accountant.worker_ended(out, len(self.unreaped))
        self._reap_finished()
        self.state.changed()
        return delay

    def _readmit(self, key: str) -> None:
        if self.current is not None:
            self.current.send({"type": "readmit", "gpu": key})

    async def kill_now(self) -> None:
        """SIGKILL the worker and any probe, and wait for them briefly (shutdown ran out of time:
        an exporter never exits leaving an NVML client behind)."""
        for proc in (w.proc for w in (self.current, self.prober.probe, *self.unreaped) if w is not None):
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(proc.wait(), timeout=1.0)

    async def stop(self) -> None:
        """Stop the worker in order (drain, nvmlShutdown, exit) and end :meth:`run`."""
        self._stopping = True
        _follow_changes(self, stopping=True)

    def close(self) -> None:
        """Release the shared memory."""
        if self._stale_timer is not None:
            self._stale_timer.cancel()
        self.crumbs.close()
        self.prober.close()
        self.state.record(self.state.recorder.close)


def _event_gpu(health: GpuHealth, msg: NvmlEvent) -> tuple[str, str]:
    """(``gpu`` label, UUID) of the GPU an NVML event names by its key (UUID, else PCI bus id): the
    record's current index, not the worker's at the time of the event."""
    rec = health.by_key(msg.uuid)
    if rec is None:
        return ("" if msg.gpu is None else str(msg.gpu)), msg.uuid
    return str(rec.index), rec.uuid


def _follow_changes(sup: Supervisor, stopping: bool = False) -> None:
    """After every change of the served state (and when stopping: :meth:`Supervisor.run` too): wake
    what waits on a condition that may have turned (the worker's watch on stopping or replacing it,
    the probe schedule); nothing polls."""
    if stopping:
        sup._wake.set()
    if sup.current is not None and (sup._stopped() or sup.accountant.replace_worker):
        sup.current.wake()
    sup.prober.poke()
