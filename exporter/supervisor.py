"""The supervisor: owns the worker process, its restarts, and everything that must survive it.

It starts the NVML worker with spawn/exec, reads its JSON-line messages, and keeps the state the
HTTP side serves: the last snapshot (dropped once older than the stale bound), counters that must
survive worker restarts (Xid events, restarts, crashes by feature), feature states and quarantines.

Failure handling (DESIGN.md, failure model):

- a worker that exits or dies by a signal is restarted with bounded exponential backoff; the
  NVML call in flight (shared-memory breadcrumb) names the feature, function and GPU, and the dead
  worker's faulthandler stack is logged with it in one structured record;
- a worker that misses its deadline is asked to stop (SIGTERM), then killed (SIGKILL), then
  replaced; a worker that cannot be reaped (uninterruptible sleep, ``D``) is reported and kept as
  the one allowed unreaped worker; a second one stops respawning instead of piling up workers;
- the same feature in flight at N crashes/hangs within a window is quarantined
  (:mod:`exporter.quarantine`).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import platform
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter import protocol, selfcheck
from exporter.breadcrumb import SLOT_EVENTS, SLOT_SAMPLER, Breadcrumb, BreadcrumbReader
from exporter.config import Config
from exporter.logs import log_once
from exporter.quarantine import QuarantineStore

log = logging.getLogger("exporter.supervisor")

KILL_GRACE_S = 2.0  # SIGTERM -> SIGKILL
REAP_WAIT_S = 5.0  # SIGKILL -> "cannot be reaped"
STDERR_LINES = 400
CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE}


def _distribution_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


def proc_state(pid: int) -> str | None:
    """The state letter from ``/proc/<pid>/stat`` (``R``, ``S``, ``D``, ``Z`` …), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split(b" ", 1)[0].decode()


@dataclass
class Outcome:
    """How a worker ended."""

    reason: str  # crash, hang, exit, nvml_error, stopped
    returncode: int | None
    signal: int
    crumb: Breadcrumb | None
    lifetime_s: float
    reaped: bool
    stack: str


class Supervisor:
    """Worker lifecycle and the state behind ``/metrics`` and the probes.

    Args:
        config: parsed configuration.
        on_change: called (on the event loop) whenever the exposition must be re-rendered.
        proc_state_fn: reads a process state letter (tests inject D-state).
    """

    def __init__(
        self,
        config: Config,
        on_change: Callable[[], None] = lambda: None,
        proc_state_fn: Callable[[int], str | None] = proc_state,
    ) -> None:
        self.config = config
        self.on_change = on_change
        self.proc_state_fn = proc_state_fn
        self.epoch = time.time()
        self.python_version = platform.python_version()
        self.crumbs = BreadcrumbReader()
        self.quarantine = QuarantineStore(
            config.state_file, config.quarantine_after, config.quarantine_window_s, config.quarantine_ttl_s
        )
        # served state
        self.last_snapshot: dict[str, Any] | None = None
        self.last_snapshot_mono: float | None = None
        # Until a worker reports, the installed binding's version (read without importing pynvml).
        self.system: dict[str, str] = {"nvidia_ml_py_version": _distribution_version("nvidia-ml-py")}
        self.worker_states: dict[str, Any] = {}
        self.nvml_up = False
        self.last_init_error: str | None = None
        self.restarts: collections.Counter[str] = collections.Counter()
        self.crashes: collections.Counter[tuple[str, str]] = collections.Counter()
        self.last_exit_signal = 0
        self.last_exit_code = 0
        self.worker_started_at: float | None = None
        self.worker_pid: int | None = None
        self.worker_stuck = False
        self.respawn_stopped = False
        self.selfchecks: dict[str, dict[str, Any]] = {}
        self.xids: dict[tuple[str, str, int], list[float]] = {}  # (gpu, uuid, xid) -> [count, last ts]
        self.events: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.events_enabled: dict[str, bool] = {}
        self.gpu_index: dict[str, str] = {}  # uuid -> index, remembered across workers
        self._calls_done = 0
        self._errors_done: collections.Counter[tuple[str, str]] = collections.Counter()
        self._calls_now = 0
        self._errors_now: collections.Counter[tuple[str, str]] = collections.Counter()
        # hooks for other concerns (stuck signature, kernel log, pods) to add families
        self.gpu_family_hooks: list[Callable[[dict[str, Any]], Iterable[Metric]]] = []
        self.self_family_hooks: list[Callable[[], Iterable[Metric]]] = []
        self.snapshot_hooks: list[Callable[[dict[str, Any]], None]] = []
        self.state_overrides: dict[str, dict[str, Any]] = {}  # feature -> state set by a supervisor-side concern
        self.xid_filter: Callable[[str, str, int, float], bool] = lambda gpu, uuid, xid, ts: True
        self.stuck_state: Callable[[str], bool] = lambda uuid: False
        self.pod_labels: Callable[[str], tuple[str, str, str]] | None = None
        # lifecycle
        self._proc: asyncio.subprocess.Process | None = None
        self._unreaped: list[asyncio.subprocess.Process] = []
        self._stopping = False
        self._wake = asyncio.Event()
        self._hello = False
        self._killed_for_hang = False
        self._last_msg_mono = 0.0
        self._spawn_mono = 0.0
        self._consecutive = 0
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._last_hang_place: tuple[str, str] | None = None
        self._stale_timer: asyncio.TimerHandle | None = None
        self.fatal_exit: int | None = None  # set when strict self-check refuses to run
        self.selfchecks["supervisor"] = selfcheck.run_in_process("supervisor")

    # -- what the HTTP side reads ---------------------------------------------------------------

    def fresh_snapshot(self) -> dict[str, Any] | None:
        """The last snapshot if it is younger than the stale bound, else None."""
        if self.last_snapshot is None or self.last_snapshot_mono is None:
            return None
        if time.monotonic() - self.last_snapshot_mono > self.config.stale_s:
            return None
        return self.last_snapshot

    def ready(self) -> tuple[bool, str]:
        """Readiness: a fresh snapshot exists."""
        if self.fresh_snapshot() is not None:
            return True, "ok"
        if self.last_snapshot is None:
            why = self.last_init_error or "no NVML sample yet"
        else:
            age = time.monotonic() - (self.last_snapshot_mono or 0)
            why = f"last NVML sample is {age:.0f} s old (stale after {self.config.stale_s:g} s)"
            if self.last_init_error:
                why += f"; {self.last_init_error}"
        return False, why

    def feature_states(self) -> dict[str, dict[str, Any]]:
        """Effective feature states: the worker's view, with quarantines applied."""
        from guards import features as gf

        if self.worker_states:
            states = {k: dict(v) for k, v in self.worker_states.items()}
        else:
            resolved = gf.resolve(self.config.feature_modes, quarantined=self.quarantine.details())
            states = {
                k: {"enabled": s.enabled, "reason": s.reason.value, "detail": s.detail} for k, s in resolved.items()
            }
        states.update({k: dict(v) for k, v in self.state_overrides.items()})
        for feature, detail in self.quarantine.details().items():
            states[feature] = {"enabled": False, "reason": "quarantined", "detail": detail}
        return states

    def nvml_calls(self) -> int:
        return self._calls_done + self._calls_now

    def nvml_errors(self) -> collections.Counter[tuple[str, str]]:
        return self._errors_done + self._errors_now

    def extra_gpu_families(self, snap: dict[str, Any]) -> list[Metric]:
        out: list[Metric] = []
        xid_total = CounterMetricFamily(
            "nvgpu_xid_errors", "Xid errors reported by NVML events or the kernel log", labels=["gpu", "uuid", "xid"]
        )
        xid_last = GaugeMetricFamily(
            "nvgpu_xid_last_timestamp_seconds", "Unix time of the last Xid of this code", labels=["gpu", "uuid", "xid"]
        )
        for (gpu, uuid, xid), (count, ts) in sorted(self.xids.items()):
            xid_total.add_metric([gpu, uuid, str(xid)], count)
            xid_last.add_metric([gpu, uuid, str(xid)], ts)
        events = CounterMetricFamily(
            "nvgpu_events", "NVML events other than Xid, by type", labels=["gpu", "uuid", "event_type"]
        )
        for (gpu, uuid, etype), count in sorted(self.events.items()):
            events.add_metric([gpu, uuid, etype], float(count))
        enabled = GaugeMetricFamily(
            "nvgpu_events_enabled", "1 if NVML event registration succeeded for this GPU", labels=["gpu", "uuid"]
        )
        live = {g["uuid"] for g in snap["gpus"] if g["up"]}
        for uuid, ok in sorted(self.events_enabled.items()):
            if uuid in live:
                enabled.add_metric([self.gpu_index.get(uuid, ""), uuid], 1.0 if ok else 0.0)
        out += [xid_total, xid_last, events, enabled]
        for hook in self.gpu_family_hooks:
            out.extend(hook(snap))
        return out

    def extra_self_families(self) -> list[Metric]:
        out: list[Metric] = []
        info = GaugeMetricFamily(
            "nvgpu_module_info",
            "Modules each process imported: file, __version__, distribution; value is always 1",
            labels=["process", "module", "version", "distribution", "distribution_version", "path"],
        )
        failures = GaugeMetricFamily(
            "nvgpu_selfcheck_failures", "Failed self-check rules per process (0 = healthy)", labels=["process"]
        )
        for process, res in sorted(self.selfchecks.items()):
            for m in res.get("modules", []):
                info.add_metric(
                    [
                        process,
                        m["module"],
                        m["version"] or "",
                        m["distribution"],
                        m["distribution_version"] or "",
                        m["path"] or "",
                    ],
                    1.0,
                )
            failures.add_metric([process], float(len(res.get("problems", []))))
        out += [info, failures]
        for hook in self.self_family_hooks:
            out.extend(hook())
        return out

    # -- messages ----------------------------------------------------------------------------

    def _changed(self) -> None:
        try:
            self.on_change()
        except Exception:  # noqa: BLE001 - rendering errors are logged by the renderer
            log.exception("re-rendering the exposition failed")

    def handle(self, msg: dict[str, Any]) -> None:
        """Apply one message from the worker."""
        kind = msg["type"]
        if kind == "snapshot":
            self._last_msg_mono = time.monotonic()
            self.last_snapshot = msg
            self.last_snapshot_mono = self._last_msg_mono
            self.system = msg.get("system", self.system)
            self.worker_states = msg.get("feature_states", self.worker_states)
            self.events_enabled.update(msg.get("events_enabled", {}))
            self._calls_now = int(msg.get("calls", 0))
            self._errors_now = collections.Counter({(f, n): int(c) for f, n, c in msg.get("errors", [])})
            for g in msg["gpus"]:
                if g["uuid"]:
                    self.gpu_index[g["uuid"]] = str(g["index"])
            for hook in self.snapshot_hooks:
                try:
                    hook(msg)
                except Exception:  # noqa: BLE001
                    log_once(
                        log,
                        logging.ERROR,
                        ("snapshot-hook", getattr(hook, "__qualname__", "?")),
                        "snapshot hook failed",
                        exc_info=True,
                    )
            self._schedule_stale_render()
        elif kind == "hello":
            self._hello = True
            self._last_msg_mono = time.monotonic()
            self.nvml_up = True
            self.last_init_error = None
            self.system = msg.get("system", {})
            self.worker_states = msg.get("feature_states", {})
            for g in msg.get("gpus", []):
                self.gpu_index[g["uuid"]] = str(g["index"])
            log.info(
                "worker %s ready: %d GPU(s), driver %s, NVML %s, nvidia-ml-py %s",
                msg.get("pid"),
                len(msg.get("gpus", [])),
                self.system.get("driver_version"),
                self.system.get("nvml_version"),
                self.system.get("nvidia_ml_py_version"),
            )
        elif kind == "selfcheck":
            result: dict[str, Any] = {k: msg[k] for k in ("process", "modules", "problems", "notes") if k in msg}
            self.selfchecks["worker"] = result
            for problem in result.get("problems", []):
                log_once(log, logging.WARNING, ("selfcheck", "worker", problem), "self-check (worker): %s", problem)
            if result.get("problems") and self.config.selfcheck == "strict":
                log.error(
                    "NVGPU_SELFCHECK=strict: the worker's self-check failed; refusing to run:\n  %s",
                    "\n  ".join(result["problems"]),
                )
                self.fatal_exit = protocol.EXIT_SELFCHECK
                self._wake.set()
        elif kind == "event":
            self._event(msg)
        elif kind == "init_failed":
            self.nvml_up = False
            self.last_init_error = f"NVML unavailable: {msg.get('message')}"
            log_once(
                log,
                logging.ERROR,
                ("init_failed", str(msg.get("error"))),
                "%s; retrying with backoff. Without a GPU, try the demo: "
                "nvgpu-exporter --nvml-backend fake:examples/scenarios/h200x2.json",
                self.last_init_error,
                extra={"nvml_error": msg.get("error")},
            )
        elif kind == "bye":
            log.info("worker stopped (nvmlShutdown %s)", "done" if msg.get("nvml_shutdown") else "skipped")
        self._changed()

    def _event(self, msg: dict[str, Any]) -> None:
        uuid = msg.get("uuid") or ""
        gpu = str(msg.get("gpu")) if msg.get("gpu") is not None else self.gpu_index.get(uuid, "")
        if msg.get("event_type") == "xid" and msg.get("xid") is not None:
            ts = float(msg.get("ts", time.time()))
            if self.xid_filter(gpu, uuid, int(msg["xid"]), ts):
                self.record_xid(gpu, uuid, int(msg["xid"]), ts, source="NVML event")
        else:
            self.events[(gpu, uuid, str(msg.get("event_type")))] += 1

    def record_xid(self, gpu: str, uuid: str, xid: int, ts: float, source: str) -> None:
        """Count one Xid (NVML event or kernel log)."""
        entry = self.xids.setdefault((gpu, uuid, xid), [0.0, 0.0])
        entry[0] += 1
        entry[1] = max(entry[1], ts)
        log.warning(
            "Xid %d on GPU %s (%s) from %s", xid, gpu, uuid, source, extra={"xid": xid, "uuid": uuid, "source": source}
        )

    def _schedule_stale_render(self) -> None:
        if self._stale_timer is not None:
            self._stale_timer.cancel()
        loop = asyncio.get_running_loop()
        self._stale_timer = loop.call_later(self.config.stale_s + 0.05, self._changed)

    # -- worker lifecycle --------------------------------------------------------------------

    async def run(self) -> None:
        """Keep a worker running until :meth:`stop`."""
        while not self._stopping and self.fatal_exit is None:
            if self.respawn_stopped:
                self._reap_finished()
                if self.respawn_stopped:
                    await self._sleep(5.0)
                    continue
            outcome = await self._run_one()
            if self._stopping or self.fatal_exit is not None:
                break
            delay = self._account(outcome)
            if delay > 0:
                await self._sleep(delay)

    async def _sleep(self, seconds: float) -> None:
        """Wait ``seconds`` or until :meth:`stop` (or a fatal self-check) wakes the loop."""
        if self._stopping or self.fatal_exit is not None:
            return
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass

    def _reap_finished(self) -> None:
        self._unreaped = [p for p in self._unreaped if p.returncode is None]
        stuck = [p for p in self._unreaped if self.proc_state_fn(p.pid) == "D"]
        if self.respawn_stopped and not self._unreaped:
            log.warning("the hung workers are gone; respawning resumes")
            self.respawn_stopped = False
        self.worker_stuck = bool(stuck) or self.respawn_stopped

    async def _spawn(self) -> tuple[asyncio.subprocess.Process, asyncio.StreamReader]:
        self.crumbs.clear()
        read_fd, write_fd = os.pipe()
        env = dict(os.environ)
        env.update(
            NVGPU_WORKER_CONFIG=json.dumps(self.config.worker_config(self.quarantine.details())),
            NVGPU_WORKER_FD=str(write_fd),
            NVGPU_BREADCRUMB_FD=str(self.crumbs.fd),
            NVGPU_FAKE_EPOCH=repr(self.epoch),
        )
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "exporter.worker",
                stdin=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(write_fd, self.crumbs.fd),
                env=env,
            )
        finally:
            os.close(write_fd)
        reader = asyncio.StreamReader(limit=64 << 20)
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0))
        return proc, reader

    async def _read_messages(self, reader: asyncio.StreamReader) -> None:
        while True:
            line = await reader.readline()
            if not line:
                return
            try:
                msg = protocol.decode(line)
            except protocol.ProtocolError as exc:
                log_once(log, logging.ERROR, ("protocol", str(exc)[:80]), "%s", exc)
                continue
            self.handle(msg)

    async def _read_stderr(self, stream: asyncio.StreamReader) -> None:
        out = sys.stderr
        while True:
            line = await stream.readline()
            if not line:
                return
            text = line.decode("utf-8", "replace")
            self._stderr_tail.append(text)
            out.write(text)
            out.flush()

    async def _run_one(self) -> Outcome:
        self._hello = False
        self._killed_for_hang = False
        self._stderr_tail.clear()
        proc, reader = await self._spawn()
        self._proc = proc
        self.worker_pid = proc.pid
        self.worker_started_at = time.time()
        self._spawn_mono = time.monotonic()
        self._calls_done += self._calls_now
        self._errors_done += self._errors_now
        self._calls_now, self._errors_now = 0, collections.Counter()
        self._changed()
        msg_task = asyncio.ensure_future(self._read_messages(reader))
        assert proc.stderr is not None
        err_task = asyncio.ensure_future(self._read_stderr(proc.stderr))
        wait_task = asyncio.ensure_future(proc.wait())
        crumb: Breadcrumb | None = None
        reaped = True
        while True:
            done, _ = await asyncio.wait({wait_task}, timeout=0.25)
            if done or self._stopping or self.fatal_exit is not None:
                break
            now = time.monotonic()
            limit = (
                self._spawn_mono + self.config.init_deadline_s
                if not self._hello
                else self._last_msg_mono + self.config.interval_s + self.config.sample_deadline_s
            )
            if now > limit:
                crumb = self._in_flight()
                where = (
                    f"{crumb.feature}/{crumb.function} on {crumb.uuid or '-'}" if crumb else "no NVML call in flight"
                )
                log.error(
                    "worker %d missed its deadline (%s); stopping it",
                    proc.pid,
                    where,
                    extra={"feature": crumb.feature if crumb else "", "function": crumb.function if crumb else ""},
                )
                self._killed_for_hang = True
                reaped = await self._kill(proc, wait_task)
                break
        if (self._stopping or self.fatal_exit is not None) and not wait_task.done():
            reaped = await self._stop_worker(proc, wait_task)
        if reaped:
            try:
                await asyncio.wait_for(asyncio.gather(msg_task, err_task), timeout=2.0)
            except asyncio.TimeoutError:
                pass
        else:
            msg_task.cancel()
            err_task.cancel()
        if crumb is None:
            crumb = self._in_flight() or None
        rc = proc.returncode
        sig = -rc if rc is not None and rc < 0 else 0
        if self._killed_for_hang:
            reason = "hang"
        elif self._stopping:
            reason = "stopped"
        elif sig:
            reason = "crash"
        elif rc == protocol.EXIT_NVML_FATAL:
            reason = "nvml_error"
        else:
            reason = "exit"
        return Outcome(reason, rc, sig, crumb, time.monotonic() - self._spawn_mono, reaped, self._dead_stack())

    def _in_flight(self) -> Breadcrumb | None:
        """The call in flight: the sampler's first, then the event thread's (a wait is normal)."""
        sampler = self.crumbs.read(SLOT_SAMPLER)
        if sampler is not None and sampler.in_flight:
            return sampler
        events = self.crumbs.read(SLOT_EVENTS)
        if events is not None and events.in_flight and events.function != "nvmlEventSetWait_v2":
            return events
        return None

    def _dead_stack(self) -> str:
        lines = list(self._stderr_tail)
        for i in range(len(lines) - 1, -1, -1):
            if lines[i].startswith("Fatal Python error"):
                return "".join(lines[i:]).rstrip()
        return ""

    async def _kill(self, proc: asyncio.subprocess.Process, wait_task: asyncio.Future[int]) -> bool:
        """SIGTERM, wait, SIGKILL, wait; False if the process could not be reaped."""
        for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, REAP_WAIT_S)):
            if proc.returncode is not None:
                return True
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                return True
            done, _ = await asyncio.wait({wait_task}, timeout=wait)
            if done:
                return True
        state = self.proc_state_fn(proc.pid)
        log.error(
            "worker %d survived SIGKILL (state %s%s); it is kept aside and not waited for",
            proc.pid,
            state,
            ": uninterruptible sleep in the driver" if state == "D" else "",
        )
        self._unreaped.append(proc)
        return False

    async def _stop_worker(self, proc: asyncio.subprocess.Process, wait_task: asyncio.Future[int]) -> bool:
        """Orderly stop: ask on stdin, wait the shutdown timeout, then kill."""
        try:
            assert proc.stdin is not None
            proc.stdin.write(protocol.encode("shutdown"))
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError, AssertionError):
            pass
        done, _ = await asyncio.wait({wait_task}, timeout=self.config.shutdown_timeout_s * 0.6)
        if done:
            return True
        log.warning("worker %d did not stop within %.1f s; killing it", proc.pid, self.config.shutdown_timeout_s * 0.6)
        return await self._kill(proc, wait_task)

    def _account(self, out: Outcome) -> float:
        """Count the death, log one record, quarantine if due; returns the restart delay."""
        self.restarts[out.reason] += 1
        self.last_exit_signal = out.signal
        if out.returncode is not None and out.returncode >= 0:
            self.last_exit_code = out.returncode
        crumb = out.crumb
        record = {
            "reason": out.reason,
            "exit_code": out.returncode if out.returncode is not None and out.returncode >= 0 else None,
            "signal": signal.Signals(out.signal).name if out.signal else None,
            "feature": crumb.feature if crumb else None,
            "function": crumb.function if crumb else None,
            "uuid": crumb.uuid if crumb else None,
            "worker_lifetime_s": round(out.lifetime_s, 3),
        }
        if out.reason in ("crash", "hang"):
            feature = crumb.feature if crumb else "unknown"
            function = crumb.function if crumb else "unknown"
            self.crashes[(feature, function)] += 1
            log.error(
                "worker died: %s in %s/%s on GPU %s after %.1f s",
                out.reason,
                feature,
                function,
                (crumb.uuid if crumb else "") or "-",
                out.lifetime_s,
                extra={**record, "stack": out.stack},
            )
            from exporter import collectors

            if crumb and (crumb.feature in collectors.COLLECTORS or crumb.feature == "events"):
                new = self.quarantine.record(crumb.feature, crumb.function)
                if new is not None:
                    log.warning(
                        "feature %s QUARANTINED: %s. All other features keep being sampled. To retry earlier: "
                        "`nvgpu-exporter quarantine --clear %s` (or delete %s) and restart; "
                        "NVGPU_FEATURE_%s=on does not "
                        "override a quarantine.",
                        new.feature,
                        new.detail(),
                        new.feature,
                        self.config.state_file or "the state file",
                        new.feature.upper(),
                        extra={"feature": new.feature, "function": new.function},
                    )
                    self._consecutive = 0
            if out.reason == "hang" and not out.reaped:
                place = (feature, function)
                if len(self._unreaped) > 1 or self._last_hang_place == place:
                    self.respawn_stopped = True
                    log.error(
                        "the replacement worker hung in the same place (%s/%s) and cannot be reaped: respawning "
                        "stopped; /metrics keeps serving; the node needs attention (GPU reset or reboot)",
                        *place,
                    )
                self._last_hang_place = place
        elif out.reason == "nvml_error":
            log.debug("worker exited: %s", self.last_init_error or "NVML unavailable", extra=record)
        else:
            log.warning("worker exited with code %s after %.1f s", out.returncode, out.lifetime_s, extra=record)
        self._reap_finished()
        if out.lifetime_s >= max(30.0, 5 * self.config.interval_s) and self.last_snapshot is not None:
            self._consecutive = 0
        self._consecutive += 1
        delay = min(self.config.backoff_initial_s * float(2 ** (self._consecutive - 1)), self.config.backoff_max_s)
        self._changed()
        return delay

    async def stop(self) -> None:
        """Stop the worker in order (drain, nvmlShutdown, exit) and end :meth:`run`."""
        self._stopping = True
        self._wake.set()

    def close(self) -> None:
        """Release the shared memory."""
        if self._stale_timer is not None:
            self._stale_timer.cancel()
        self.crumbs.close()


SupervisorState = Supervisor
