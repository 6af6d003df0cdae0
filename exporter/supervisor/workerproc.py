"""One worker process: spawn (exec), its message and stderr streams, deadline, kill, reap -> Outcome.

:meth:`WorkerProcess.run` starts ``python -m exporter.worker`` (spawn/exec: NVML state is not
fork-safe) with the message pipe and the breadcrumb memory passed as descriptors, decodes each
message once (:class:`exporter.common.snapshotdecode.SnapshotDecoder`: one per worker, so repeated readings
are reused from its last snapshot) and hands it to ``on_message``, echoes the
worker's stderr while keeping its tail (the faulthandler stack of a crash), and watches the
deadline: ``init_deadline_s`` until the worker's ``hello``, then ``interval_s + sample_deadline_s``
after each snapshot, on a timer armed for the deadline itself (no polling: the loop wakes when the
worker exits, when the deadline passes, or when :meth:`WorkerProcess.wake` is called because the
caller's ``stopping()`` may have turned true). A worker past its deadline is asked to stop
(SIGTERM), then killed (SIGKILL); one that survives SIGKILL (uninterruptible sleep in the driver) is
reported as not reaped and left to the caller. It returns how the worker ended, and who ended it
(:mod:`exporter.supervisor.deaths`: only a fault signal of its own is a ``crash``; a signal from
outside, the OOM killer and the supervisor's own kills are counted as what they are); what happens next is
:mod:`exporter.supervisor.policy`'s call.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from exporter.common import fileio, protocol
from exporter.common.breadcrumb import Breadcrumb, BreadcrumbReader
from exporter.common.logs import WorkerLogRelay, log_once
from exporter.common.snapshot import Hello, Message, Progress, Snapshot
from exporter.common.snapshotdecode import SnapshotDecoder
from exporter.common.workerconfig import ENV_VAR, CollectorOptions, Exclusion, GpuRef, ProcessOptions, WorkerConfig
from exporter.supervisor import deaths
from exporter.supervisor.policy import Outcome
from exporter.supervisor.workerstderr import LineSplitter, StderrBlock

if TYPE_CHECKING:
    from exporter.config import Config

log = logging.getLogger("exporter.supervisor")

KILL_GRACE_S = 2.0  # SIGTERM -> SIGKILL
REAP_WAIT_S = 5.0  # SIGKILL -> "cannot be reaped"
STDERR_LINES = 400
_CURRENT_THREAD = re.compile(r"Current thread (0x[0-9a-fA-F]+)")
STDERR_CHUNK = 64 << 10  # bytes read from the worker's stderr at a time
MAX_LINE = 8 << 10  # bytes of one stderr line kept; the rest is dropped and counted
RELAY = WorkerLogRelay()  # shared by every worker: "once" INFO records stay once per exporter


def proc_state(pid: int) -> str | None:
    """The state letter from ``/proc/<pid>/stat`` (``R``, ``S``, ``D``, ``Z`` …), None if gone."""
    try:  # opened without blocking, bounded (the comm field is at most 64 bytes; the line ~300)
        data = fileio.read_bytes(f"/proc/{pid}/stat", 4096)
    except fileio.FileRefused:
        return None
    return data[data.rfind(b")") + 2 :].split(b" ", 1)[0].decode()


class WorkerProcess:
    """One worker's life.

    Args:
        env: environment additions (the worker configuration, the fake epoch).
        crumbs: the breadcrumb memory (the caller clears it before each worker).
        on_message: called on the event loop for each decoded message.
        deadlines: ``(init_deadline_s, sample_deadline_s)``: until the worker's ``hello``, then from
            each snapshot (events come from another thread and prove nothing about sampling).
        proc_state_fn: reads a process state letter (tests inject ``D``).
        on_error: called from an ``except`` block with what was being done when reading or handling
            the worker's messages raised something other than a protocol error (the supervisor
            counts it as component ``worker_io``); reading goes on with the next line.
        oom: the kernel's OOM-kill count (default: :func:`exporter.supervisor.deaths.oom_kills`),
            read at spawn and at each snapshot: a SIGKILL while it rose is the OOM killer's.
    """

    def __init__(
        self,
        env: Mapping[str, str],
        crumbs: BreadcrumbReader,
        on_message: Callable[[Message], None],
        deadlines: tuple[float, float],
        proc_state_fn: Callable[[int], str | None] = proc_state,
        on_error: Callable[[str], None] | None = None,
        oom: deaths.OomKills | None = None,
    ) -> None:
        self.env = env
        self.oom = oom if oom is not None else deaths.oom_kills()
        self.oom_before: int | None = None
        self.hung_gpus: set[str] = set()  # GPUs this worker reported hung: their calls are known, not a death's cause
        self.on_error = on_error or _log_error
        self.crumbs = crumbs
        self.on_message = on_message
        self.init_deadline_s, self.sample_deadline_s = deadlines
        self.proc_state_fn = proc_state_fn
        self.proc: asyncio.subprocess.Process | None = None
        self.hello = False
        self.killed_for_hang = False
        self.last_message_mono = 0.0
        self.spawned_mono = 0.0
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.decoder = SnapshotDecoder()
        self._wake = asyncio.Event()

    @property
    def pid(self) -> int | None:
        """The worker's PID once spawned."""
        return self.proc.pid if self.proc else None

    async def spawn(self) -> asyncio.StreamReader:
        """Start the process; returns the message stream.

        Raises:
            OSError: no descriptors or processes left (EMFILE, EAGAIN): nothing is left behind, no
                descriptor and no half-started worker; the caller retries later.
        """
        read_fd, write_fd = os.pipe()
        env = dict(os.environ)
        env.update(self.env, NVGPU_WORKER_FD=str(write_fd), NVGPU_BREADCRUMB_FD=str(self.crumbs.fd))
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "exporter.worker",
                stdin=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(write_fd, self.crumbs.fd),
                env=env,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self.spawned_mono = time.monotonic()
        self.oom_before = self.oom.read()
        reader = asyncio.StreamReader(limit=64 << 20)
        loop = asyncio.get_running_loop()
        pipe = None
        try:
            pipe = os.fdopen(read_fd, "rb", 0)
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        except BaseException:  # a worker nobody listens to must not live on as an NVML client
            if pipe is None:
                os.close(read_fd)
            else:
                pipe.close()
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            raise
        return reader

    def wake(self) -> None:
        """Make :meth:`run` look at ``stopping()`` now (the caller changed what it returns)."""
        self._wake.set()

    async def run(self, reader: asyncio.StreamReader, stopping: Callable[[], bool], drain_s: float) -> Outcome:
        """Watch the spawned worker until it ends (or ``stopping()``, looked at on :meth:`wake`);
        returns how it ended."""
        proc = self.proc
        assert proc is not None and proc.stderr is not None
        msg_task = asyncio.ensure_future(self._read_messages(reader))
        err_task = asyncio.ensure_future(self._read_stderr(proc.stderr))
        wait_task = asyncio.ensure_future(proc.wait())
        crumb, reaped = await _watch(self, wait_task, stopping)
        if stopping() and not wait_task.done():
            reaped = await self.stop(wait_task, drain_s)
        if reaped:
            try:
                await asyncio.wait_for(asyncio.gather(msg_task, err_task), timeout=2.0)
            except asyncio.TimeoutError:
                pass
        else:
            msg_task.cancel()
            err_task.cancel()
        return self._outcome(crumb or self.blame(self.dead_stack()), reaped, stopping())

    def _deadline(self) -> float:
        if not self.hello:  # init follows progress: each finished step (nvmlInit, a GPU) restarts it
            return max(self.spawned_mono, self.last_message_mono) + self.init_deadline_s
        return self.last_message_mono + self.sample_deadline_s

    def _log_hang(self, crumb: Breadcrumb | None) -> None:
        where = f"{crumb.feature}/{crumb.function} on {crumb.uuid or '-'}" if crumb else "no NVML call in flight"
        log.error(
            "worker %d missed its deadline (%s); stopping it",
            self.pid,
            where,
            extra={"feature": crumb.feature if crumb else "", "function": crumb.function if crumb else ""},
        )

    def _outcome(self, crumb: Breadcrumb | None, reaped: bool, stopped: bool) -> Outcome:
        assert self.proc is not None
        rc = self.proc.returncode
        sig = -rc if rc is not None and rc < 0 else 0
        death = deaths.classify(
            rc, deadline_kill=self.killed_for_hang, stopping=stopped, oom_rose=self.oom.rose(self.oom_before)
        )
        return Outcome(
            death.reason,
            rc,
            sig,
            crumb,
            time.monotonic() - self.spawned_mono,
            reaped,
            self.dead_stack(),
            death.signal_from,
        )

    async def _read_messages(self, reader: asyncio.StreamReader) -> None:
        """Decode and hand on each message line; nothing a line holds ends the reading."""
        while True:
            try:
                line = await reader.readline()
            except ValueError:  # longer than the reader's limit: asyncio drops it up to its newline
                self.on_error("reading a worker message longer than the stream limit")
                continue
            except Exception:  # noqa: BLE001 - the pipe itself failed: nothing more will come
                self.on_error("reading the worker's message pipe")
                return
            if not line:
                return
            try:
                msg = self.decoder.decode_message(protocol.decode(line))
            except protocol.ProtocolError as exc:
                log_once(log, logging.ERROR, ("protocol", str(exc)[:80]), "%s", exc)
                continue
            except Exception:  # noqa: BLE001 - e.g. RecursionError on a deeply nested line
                self.on_error("decoding a worker message")
                continue
            if isinstance(msg, (Hello, Snapshot)):  # sampling runs; events come from another thread
                self.last_message_mono = time.monotonic()
                if not self.hello:
                    self.hello = True
                    self._wake.set()  # the sample deadline replaces the init deadline: it may be sooner
            if isinstance(msg, Snapshot):
                self.hung_gpus = {k for g in msg.gpus if g.state == "hung" for k in (g.key, g.uuid) if k}
                # on the loop on purpose: a cgroupfs/procfs counter (deaths.oom_kills says why it cannot
                # block); read per snapshot, another process's OOM kill passes for the worker's only within one interval
                self.oom_before = self.oom.read()
            elif isinstance(msg, Progress):  # an init step finished: the init deadline starts again
                self.last_message_mono = time.monotonic()
            try:
                self.on_message(msg)
            except Exception:  # noqa: BLE001 - the supervisor's own bug: the next message still counts
                self.on_error(f"handling a {type(msg).__name__} message")

    async def _read_stderr(self, stream: asyncio.StreamReader) -> None:
        """Drain the worker's stderr in bounded chunks and turn it into log records.

        The worker logs JSON lines (:func:`worker_config`); each is written again through the
        supervisor's logging (:class:`exporter.common.logs.WorkerLogRelay`), so with ``--log.format json``
        every stderr line of the exporter is one JSON object and in text mode every line is text.
        Anything else the worker writes (faulthandler's ``Fatal Python error`` report, a Python
        traceback, a C library's message) is kept in :attr:`stderr_tail` and gathered into one
        record: a fatal report is not written at all, because the death record carries it
        (``stack``, from :meth:`dead_stack`: one traceback per crash); other text becomes one record
        once the worker has been quiet for :data:`exporter.supervisor.workerstderr.BLOCK_QUIET_S` or
        writes a log line again.

        Reading never waits for a newline: a line longer than :data:`MAX_LINE` bytes (a very long
        driver string) is cut there and marked with the number of bytes dropped, and the rest is
        still read, so the worker never blocks on a full pipe and nothing later is lost.
        """
        splitter = LineSplitter(MAX_LINE)
        block = StderrBlock(lambda: self.pid)
        try:
            while True:
                chunk = await stream.read(STDERR_CHUNK)
                if not chunk:
                    break
                for line in splitter.feed(chunk):
                    self._stderr_line(line, block)
            for line in splitter.close():
                self._stderr_line(line, block)
        finally:
            block.flush(at_exit=True)

    def _stderr_line(self, text: str, block: StderrBlock) -> None:
        stripped = text.strip()
        if stripped.startswith("{"):
            try:
                data = json.loads(stripped)
            except ValueError:
                data = None
            if isinstance(data, dict) and "msg" in data:
                block.flush()
                try:
                    RELAY.relay(data, self.pid)
                except Exception:  # noqa: BLE001 - an odd record must not stop the drain
                    log_once(log, logging.ERROR, ("relay",), "a worker log record could not be written", exc_info=True)
                return
        self.stderr_tail.append(text + "\n")
        block.add(text)

    def blame(self, stack: str) -> Breadcrumb | None:
        """The NVML call that ended the worker (:func:`blame`)."""
        return blame(self.crumbs.in_flight(), stack, self.hung_gpus)

    def dead_stack(self) -> str:
        """The faulthandler report at the end of the worker's stderr, if any."""
        lines = list(self.stderr_tail)
        for i in range(len(lines) - 1, -1, -1):
            if lines[i].startswith("Fatal Python error"):
                return "".join(lines[i:]).rstrip()
        return ""

    async def kill(self, wait_task: asyncio.Future[Any]) -> bool:
        """SIGTERM, wait, SIGKILL, wait; False if the process could not be reaped."""
        proc = self.proc
        assert proc is not None
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
        return False

    def send(self, command: Mapping[str, Any]) -> bool:
        """Write one command to the worker's standard input (``readmit``, ``reprobe``); False if
        the worker cannot take it (gone, or its pipe is full: commands are advice, never waited on)."""
        proc = self.proc
        if proc is None or proc.stdin is None or proc.returncode is not None:
            return False
        try:
            proc.stdin.write(protocol.encode(str(command["type"]), **{k: v for k, v in command.items() if k != "type"}))
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            return False
        return True

    async def stop(self, wait_task: asyncio.Future[Any], drain_s: float) -> bool:
        """Orderly stop: ask on stdin, wait ``drain_s``, then kill."""
        proc = self.proc
        assert proc is not None
        try:
            assert proc.stdin is not None
            proc.stdin.write(protocol.encode("shutdown"))
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError, AssertionError):
            pass
        done, _ = await asyncio.wait({wait_task}, timeout=drain_s)
        if done:
            return True
        log.warning("worker %d did not stop within %.1f s; killing it", proc.pid, drain_s)
        return await self.kill(wait_task)


async def _watch(
    w: WorkerProcess, wait_task: asyncio.Future[Any], stopping: Callable[[], bool]
) -> tuple[Breadcrumb | None, bool]:
    """:meth:`WorkerProcess.run`'s wait: until the worker exits, ``stopping()`` (looked at on
    :meth:`WorkerProcess.wake`) or its deadline passes (then it is killed); returns (the call to
    blame for a hang, whether the process was reaped)."""
    woken: asyncio.Future[Any] | None = None
    try:
        while not stopping():
            left = w._deadline() - time.monotonic()
            if left < 0:
                crumb = w.blame("")
                w._log_hang(crumb)
                w.killed_for_hang = True
                return crumb, await w.kill(wait_task)
            if woken is None or woken.done():
                w._wake.clear()
                woken = asyncio.ensure_future(w._wake.wait())
            # the deadline only moves later while this waits (each message), except at the
            # hello, which wakes it (the init deadline gives way to the sample deadline)
            done, _ = await asyncio.wait({wait_task, woken}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if wait_task in done:
                break
    finally:
        if woken is not None:
            woken.cancel()
    return None, True


def blame(in_flight: Sequence[Breadcrumb], stack: str, hung_gpus: Collection[str] = ()) -> Breadcrumb | None:
    """The NVML call that ended a worker, from the breadcrumbs of its threads in flight.

    A native crash prints the crashing thread (faulthandler: ``Current thread 0x…``); the call
    in flight on that thread is the one to blame, whatever other GPU threads were doing. Without
    a stack (a hang, SIGKILL), the one call in flight is blamed, or the oldest of several (a call
    stuck longest is the likeliest cause of a hang); a wait for events is never blamed, nor,
    without a stack, the stuck call of a GPU the worker already reported hung (``hung_gpus``: it
    was counted when reported, and it is the oldest call by construction).
    """
    crumbs = [c for c in in_flight if c.function != "nvmlEventSetWait_v2"]
    match = _CURRENT_THREAD.search(stack)
    if match is not None:
        tid = int(match.group(1), 16)
        return next((c for c in crumbs if c.thread == tid), None)
    crumbs = [c for c in crumbs if not (c.uuid and c.uuid in hung_gpus)]
    return min(crumbs, key=lambda c: c.entered_at) if crumbs else None


def _log_error(doing: str) -> None:
    exc = sys.exc_info()[1]
    log_once(log, logging.ERROR, ("worker_io", type(exc).__name__), "failed while %s", doing, exc_info=True)


def worker_config(
    config: Config,
    quarantined: Mapping[str, str],
    exclude: Sequence[Exclusion] = (),
    only: Sequence[GpuRef] = (),
    samples: int | None = None,
) -> WorkerConfig:
    """What a worker (or, with ``only`` and ``samples``, a probe) is started with.

    Args:
        config: the parsed settings.
        quarantined: feature -> why, the quarantines in force (:meth:`QuarantineStore.details`).
        exclude: GPUs it must not attach (:meth:`exporter.supervisor.gpuhealth.GpuHealth.exclusions`).
        only: attach just these GPUs (a probe).
        samples: stop after this many samples (a probe); None: run until stopped.
    """
    return WorkerConfig(
        backend=config.nvml_backend,
        interval_s=config.interval_s,
        deadline_s=config.sample_deadline_s,
        reprobe_s=config.reprobe_s,
        enumerate_s=config.enumerate_s,
        drain_s=max(1.0, config.shutdown_timeout_s / 2),
        log_level=config.log_level,
        # The worker always logs JSON lines: the supervisor parses them and writes them again in
        # NVGPU_LOG_FORMAT (WorkerLogRelay), so its stderr is one stream whatever the format.
        log_format="json",
        modes=dict(config.feature_modes),
        quarantined=dict(quarantined),
        collectors=CollectorOptions(
            processes=ProcessOptions(
                proc_path=config.proc_path,
                container_log_dir=config.container_log_dir,
                series_per_gpu=config.process_series_per_gpu,
            )
        ),
        exclude=tuple(exclude),
        only=tuple(only),
        samples=samples,
    )


def worker_env(config: WorkerConfig, epoch: float) -> dict[str, str]:
    """The environment additions of a worker: its configuration and the fake backend's epoch (the
    supervisor's ``time.monotonic()`` at start: a wall-clock step does not move scenario time)."""
    return {ENV_VAR: json.dumps(config.to_wire()), "NVGPU_FAKE_EPOCH": repr(epoch)}
