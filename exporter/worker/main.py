"""The NVML worker process: the only process that imports ``pynvml``.

Started by the supervisor with ``python -m exporter.worker`` (:mod:`exporter.worker.__main__`;
spawn/exec: NVML state is not fork-safe). It calls ``nvmlInit`` once, enumerates GPUs by index keyed
by UUID (and again when the count changes, after a lost GPU, a reset or bus event, and
periodically), samples every enabled feature every interval, and writes one ``snapshot`` line per sample
to the message pipe. An NVML event thread writes ``event`` lines. Before each NVML call the
breadcrumb in shared memory names the call, so a native crash or a hang can be attributed by the
supervisor.

Environment (set by the supervisor): ``NVGPU_WORKER_CONFIG`` (a
:class:`~exporter.common.workerconfig.WorkerConfig` as JSON, decoded once at start), ``NVGPU_WORKER_FD``
(message pipe), ``NVGPU_BREADCRUMB_FD`` (shared memory). Standard input: ``{"type": "shutdown"}``
or EOF asks for an orderly stop: sampling stops between calls, the event thread is drained with a bound,
and ``nvmlShutdown`` runs only when no NVML call is in flight (the race nvitop 1.7.1 fixed).
SIGTERM stops it in the same order, and then the process ends by SIGTERM again
(:data:`TERMINATED`, :mod:`exporter.worker.__main__`): the supervisor reads a SIGTERM it did not
send as a death from outside, never as a clean exit.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from exporter.common import logs, nativelib, protocol
from exporter.common.breadcrumb import SLOT_SAMPLER, BreadcrumbWriter
from exporter.common.nvml import errors
from exporter.common.snapshot import selfcheck_to_wire, states_to_wire
from exporter.common.workerconfig import WorkerConfig
from exporter.worker.nvml.client import NvmlClient, NvmlFatal, Stopping
from exporter.worker.nvml_events import EventWatcher
from exporter.worker.sampler import Sampler

TERMINATED = threading.Event()
"""Set by SIGTERM: the process ends by that signal once stopped in order (``__main__``)."""

log = logging.getLogger("exporter.worker")


class Channel:
    """Thread-safe writer of protocol lines to the supervisor."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    def send(self, kind: str, **fields: Any) -> None:
        data = protocol.encode(kind, **fields)
        with self._lock:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]


def parent_death_signal() -> None:
    """Ask the kernel to SIGKILL this process when the supervisor dies (``PR_SET_PDEATHSIG``).

    A supervisor killed by SIGKILL cannot stop its worker, and an orphaned worker is still an NVML
    client, which blocks a GPU reset or a driver unload on a host with nothing to clean up. Linux
    only; elsewhere this does nothing (the stdin watcher still stops an idle worker).
    """
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG = 1
            return
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the supervisor died before the request took effect
        os._exit(protocol.EXIT_ERROR)


def shutdown(client: NvmlClient, sampler: Sampler, events: EventWatcher | None, drain_s: float) -> bool:
    """Stop, drain the GPU threads and the event thread within ``drain_s``, then nvmlShutdown if no
    NVML call is in flight (the race nvitop 1.7.1 fixed); False when it was skipped."""
    client.stop.set()
    deadline = time.monotonic() + drain_s
    clean = sampler.stop_threads(drain_s)
    if events is not None and not events.join(max(0.0, deadline - time.monotonic())):
        clean = False
    if not clean:
        log.warning("an NVML call is still in flight after %.1f s; skipping nvmlShutdown", drain_s)
        return False
    try:
        client.raw_during_shutdown("shutdown", "nvmlShutdown", "")
    except Exception as exc:  # noqa: BLE001 - an extra shutdown raises Uninitialized on 580
        log.warning("nvmlShutdown failed: %s", errors.classify(exc).message)
        return False
    return True


def _stdin_watcher(stop: threading.Event, sampler_commands: Any, attribute: Any = None) -> None:
    """Commands from the supervisor: ``shutdown`` (or end of file) stops; ``readmit``, ``reprobe``
    (``{"type": ..., "gpu": <UUID or PCI bus id>}``) and ``enumerate`` go to the sampler's queue;
    ``attribute`` (an Xid's PID) is answered at once by ``attribute(pid)`` (the process may be about
    to exit)."""
    for line in sys.stdin.buffer:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict):
            continue
        if msg.get("type") == "shutdown":
            break
        if msg.get("type") in ("readmit", "reprobe", "enumerate"):
            sampler_commands.put(msg)
        elif msg.get("type") == "attribute" and attribute is not None and isinstance(msg.get("pid"), int):
            attribute(msg["pid"])
    stop.set()


def pid_attributor(config: WorkerConfig, channel: Channel) -> Any:
    """``attribute(pid)``: the PID's process name and pod through the processes collector's own path
    (:func:`exporter.worker.process_attribution.attribute_pid`), sent as an ``attribution`` message."""
    from exporter.worker.process_attribution import HostView, attribute_pid

    opts = config.collectors.processes
    host = HostView(opts.proc_path, opts.container_log_dir) if opts.proc_path else None

    def attribute(pid: int) -> None:
        if host is None:
            return
        try:
            p = attribute_pid(pid, host)
        except Exception:  # noqa: BLE001 - a /proc surprise costs this answer only
            logs.log_once(log, logging.WARNING, ("attribute-pid",), "cannot attribute pid %d", pid, exc_info=True)
            return
        namespace, pod, container = p.names
        channel.send(
            "attribution", pid=pid, process=p.name, pod_uid=p.pod_uid, namespace=namespace, pod=pod, container=container
        )

    return attribute


NATIVE_RECHECK_S = 60.0  # /proc/self/maps again (or each re-probe, when sooner): a library replaced on disk


def native_check(backend: Any, kernel_module: str, nvml_version: str, init_error: str = "") -> nativelib.NativeLibrary:
    """The native library check of this process (:mod:`exporter.common.nativelib`), read through the
    backend (the fake presents its scenario's library; the real one reads ``/proc/self``)."""
    try:
        view = backend.proc_view()
    except Exception:  # noqa: BLE001 - an unreadable /proc leaves the check unknown, never the worker dead
        view = nativelib.ProcView("", "")
    return nativelib.inspect(view, kernel_module, nvml_version, backend.realpath, init_error)


def selfcheck_with_native(result: dict[str, Any], backend_spec: str) -> dict[str, Any]:
    """``nvgpu-exporter selfcheck``'s worker part: load the NVML backend as the worker does,
    ``nvmlInit``, and add the native library check (``native``, and a problem or a note) to the
    module check's ``result``."""
    from exporter.worker.nvml import backend as backend_mod

    init_error, nvml_version = "", ""
    try:
        backend = backend_mod.load(backend_spec)
    except Exception as exc:  # noqa: BLE001 - say it, the module check still stands
        result["notes"] = [*result.get("notes", []), f"native library: backend {backend_spec!r} not loaded: {exc}"]
        return result
    try:
        backend.nvmlInit()
        nvml_version = str(backend.nvmlSystemGetNVMLVersion())
    except Exception as exc:  # noqa: BLE001 - the library stays mapped after a failed init: still checked
        init_error = errors.classify(exc).name
    native = native_check(backend, backend.kernel_module_version(), nvml_version, init_error)
    result["native"] = dataclasses.asdict(native)
    if native.problem:
        key = "problems" if native.refused_by_strict else "notes"
        result[key] = [*result.get(key, []), f"native library: {nativelib.describe(native)}"]
    return result


def _with_native(check: Any, native: nativelib.NativeLibrary) -> Any:
    """The worker's self-check with the native library's finding: a library that is not the host's
    while the host's is visible is a problem (``NVGPU_SELFCHECK=strict`` refuses it); any other
    finding is a note (a driver upgraded under the node is not cured by refusing to start)."""
    line = f"native library: {nativelib.describe(native)}"
    if native.refused_by_strict:
        return dataclasses.replace(check, problems=(*check.problems, line))
    return dataclasses.replace(check, notes=(*check.notes, line))


def _run(
    channel: Channel,
    sampler: Sampler,
    interval_s: float,
    samples: int | None,
    recheck: Any = None,
    recheck_s: float = NATIVE_RECHECK_S,
) -> int | None:
    """Sample every ``interval_s`` until stopped (or ``samples`` done); returns an exit code if NVML
    became unusable. ``recheck`` (every ``recheck_s``) returns the native library check
    when it changed, which is sent as a ``native`` message."""
    stop = sampler.client.stop
    next_at = time.monotonic()
    next_native = time.monotonic() + recheck_s
    done = 0
    try:
        while not stop.is_set() and (samples is None or done < samples):
            snap = sampler.tick()
            done += 1
            if recheck is not None and time.monotonic() >= next_native:
                next_native = time.monotonic() + recheck_s
                changed = recheck()
                if changed is not None:
                    channel.send("native", **dataclasses.asdict(changed))
            try:
                channel.send("snapshot", **snap.to_wire())
            except (TypeError, ValueError):  # a value JSON cannot carry: our bug, not a reason to die
                logs.log_once(log, logging.ERROR, ("snapshot-encode",), "snapshot not encodable", exc_info=True)
            next_at += interval_s
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a slow sample): start the schedule again from now
                next_at = time.monotonic()
                delay = 0
            if samples is None or done < samples:
                stop.wait(delay)
    except Stopping:
        pass
    except NvmlFatal as exc:
        log.error(
            "NVML unusable: %s; exiting so the supervisor re-initialises",
            exc,
            extra={"nvml_error": exc.failure.name, "function": exc.function},
        )
        channel.send(
            "init_failed",
            code=exc.failure.code,
            error=exc.failure.name,
            message=str(exc),
            errors=[[f, n, c] for (f, n), c in sorted(sampler.error_counts().items())],
        )
        return protocol.EXIT_NVML_FATAL
    return None


def main() -> int:
    """Worker entry point; returns the process exit code."""
    from exporter.common import selfcheck
    from exporter.worker.nvml import backend as backend_mod

    parent_death_signal()
    try:
        config = WorkerConfig.from_environ(os.environ)  # decoded once; everything below reads attributes
    except ValueError as exc:  # a supervisor of another version, or started by hand: say which field
        print(f"nvgpu-exporter worker: {exc}", file=sys.stderr)
        return protocol.EXIT_ERROR
    logs.setup(config.log_level, config.log_format)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    channel = Channel(int(os.environ["NVGPU_WORKER_FD"]))
    crumb_fd = os.environ.get("NVGPU_BREADCRUMB_FD")
    stop = threading.Event()

    def on_sigterm(*_: object) -> None:
        TERMINATED.set()
        stop.set()

    signal.signal(signal.SIGTERM, on_sigterm)

    # What this process imported, before NVML can fail; again with the driver version after init.
    channel.send("selfcheck", **selfcheck_to_wire(selfcheck.run_in_process("worker")))
    try:
        backend = backend_mod.load(config.backend)
    except ValueError as exc:  # ScenarioError: the file changed since the supervisor checked it
        channel.send("init_failed", code=-1, error="BAD_BACKEND", message=str(exc))
        return protocol.EXIT_NVML_FATAL
    kernel_module = backend.kernel_module_version()
    crumbs = BreadcrumbWriter(int(crumb_fd) if crumb_fd else None)
    client = NvmlClient(backend, crumbs, SLOT_SAMPLER, stop, config.collectors)
    sampler = Sampler(config, client, backend.binding_version() or "", lambda step: channel.send("progress", step=step))
    threading.Thread(
        target=_stdin_watcher, args=(stop, sampler.commands, pid_attributor(config, channel)), name="stdin", daemon=True
    ).start()
    try:
        failed = sampler.init()
        if failed is not None:
            native = native_check(backend, kernel_module, "", failed.error)
            channel.send(
                "init_failed",
                code=failed.code,
                error=failed.error,
                message=failed.message,
                kernel_module_version=kernel_module,
                native=dataclasses.asdict(native),
            )
            return protocol.EXIT_NVML_FATAL
        native = native_check(backend, kernel_module, sampler.system.nvml_version)
        check = selfcheck.run_in_process("worker", sampler.system.driver_version or None)
        channel.send("selfcheck", **selfcheck_to_wire(_with_native(check, native)))
        sampler.resolve_features()
    except NvmlFatal as exc:
        channel.send(
            "init_failed",
            code=exc.failure.code,
            error=exc.failure.name,
            message=str(exc),
            kernel_module_version=kernel_module,
        )
        return protocol.EXIT_NVML_FATAL
    except Stopping:
        channel.send("bye", nvml_shutdown=False)
        return protocol.EXIT_OK
    channel.send(
        "hello",
        pid=os.getpid(),
        system=dataclasses.asdict(sampler.system),
        gpus=[
            {"index": s.index, "uuid": s.uuid, "bus_id": s.bus_id} for s in sampler.slots.values() if s.state == "up"
        ],
        feature_states=states_to_wire(sampler.states),
        kernel_module_version=kernel_module,
        native=dataclasses.asdict(native),
    )
    events = None
    if sampler.enabled("events") and config.samples is None:
        devices = [s.dev for s in sampler.slots.values() if s.dev is not None]
        events = EventWatcher(
            client,
            devices,
            channel.send,
            sampler.events_enabled,
            sampler.request_reprobe,
            lambda why: sampler.commands.put({"type": "enumerate", "why": why}),
        )
        sampler.on_attached = events.add
        events.start()
    last_native = [native]

    def recheck() -> nativelib.NativeLibrary | None:
        now = native_check(backend, backend.kernel_module_version(), sampler.system.nvml_version)
        if now == last_native[0]:
            return None
        last_native[0] = now
        return now

    recheck_s = min(NATIVE_RECHECK_S, config.reprobe_s)
    code = _run(channel, sampler, config.interval_s, config.samples, recheck, recheck_s)
    if code is not None:
        return code
    clean = shutdown(client, sampler, events, config.drain_s)
    channel.send("bye", nvml_shutdown=clean)
    return protocol.EXIT_OK
