"""The NVML worker process: the only process that imports ``pynvml``.

Started by the supervisor with ``python -m exporter.worker`` (spawn/exec: NVML state is not
fork-safe). It calls ``nvmlInit`` once, enumerates GPUs by index keyed by UUID, samples every
enabled feature every interval, and writes one ``snapshot`` line per sample to the message pipe.
An NVML event thread writes ``event`` lines. Before each NVML call the breadcrumb in shared memory
names the call, so a native crash or a hang can be attributed by the supervisor.

Environment (set by the supervisor): ``NVGPU_WORKER_CONFIG`` (JSON), ``NVGPU_WORKER_FD`` (message
pipe), ``NVGPU_BREADCRUMB_FD`` (shared memory). Standard input: ``{"type": "shutdown"}`` or EOF
asks for an orderly stop: sampling stops between calls, the event thread is drained with a bound,
and ``nvmlShutdown`` runs only when no NVML call is in flight (the race nvitop 1.7.1 fixed).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from exporter import collectors, logs, protocol
from exporter.breadcrumb import SLOT_EVENTS, SLOT_SAMPLER, BreadcrumbWriter
from exporter.nvml import errors
from exporter.nvml.client import DeviceClient, DeviceLost, NvmlClient, NvmlFatal

log = logging.getLogger("exporter.worker")

EVENT_WAIT_MS = 1000
EVENT_TYPE_NAMES = {
    0x1: "single_bit_ecc",
    0x2: "double_bit_ecc",
    0x4: "pstate",
    0x8: "xid",
    0x10: "clock",
    0x80: "power_source_change",
    0x100: "mig_config_change",
    0x200: "single_bit_ecc_storm",
    0x400: "dram_retirement",
    0x800: "dram_retirement_failure",
    0x1000: "non_fatal_poison",
    0x2000: "fatal_poison",
    0x4000: "gpu_unavailable",
    0x8000: "gpu_recovery_action",
}
EVENT_MASK_WANTED = sum(EVENT_TYPE_NAMES) & ~0x10 & ~0x4  # P-state and clock events are noise


class Stopping(BaseException):
    """Raised between NVML calls once a shutdown was requested.

    A BaseException, like KeyboardInterrupt, so that the per-call error handling
    (``except Exception`` -> classify) does not mistake it for an NVML error.
    """


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


class StoppableClient(NvmlClient):
    """An NvmlClient that refuses new calls once ``stop`` is set (calls in flight finish)."""

    stop: threading.Event

    def raw(self, feature: str, function: str, uuid: str, *args: Any, **kwargs: Any) -> Any:
        if self.stop.is_set():
            raise Stopping()
        return super().raw(feature, function, uuid, *args, **kwargs)

    def field_values(self, feature: str, uuid: str, handle: Any, pairs: list[tuple[int, int]]) -> Any:
        if self.stop.is_set():
            raise Stopping()
        return super().field_values(feature, uuid, handle, pairs)

    def fork(self, slot: int) -> StoppableClient:
        other = StoppableClient(self.backend, self.crumbs, slot)
        other.stop = self.stop
        return other


class Worker:
    """Sampling state of one worker process."""

    def __init__(self, config: Mapping[str, Any], channel: Channel, crumbs: BreadcrumbWriter) -> None:
        self.config = config
        self.channel = channel
        self.crumbs = crumbs
        self.stop = threading.Event()
        self.interval = float(config["interval_s"])
        self.devices: list[DeviceClient] = []
        self.lost: dict[int, str] = {}  # index -> uuid ("" if never known)
        self.states: dict[str, Any] = {}
        self.system: dict[str, str] = {}
        self.client: StoppableClient
        self.event_thread: threading.Thread | None = None
        self.events_enabled: dict[str, bool] = {}

    # -- start-up ----------------------------------------------------------------------------

    def init(self) -> bool:
        """Load the backend and call nvmlInit once. False (after reporting) on failure."""
        from exporter.nvml import backend as backend_mod

        try:
            backend = backend_mod.load(self.config["backend"])
        except ValueError as exc:  # ScenarioError: the file changed since the supervisor checked it
            self.channel.send("init_failed", code=-1, error="BAD_BACKEND", message=str(exc))
            return False
        client = StoppableClient(backend, self.crumbs, SLOT_SAMPLER)
        client.stop = self.stop
        self.client = client
        try:
            client.raw("init", "nvmlInit", "")
        except Exception as exc:
            failure = errors.classify(exc)
            self.channel.send("init_failed", code=failure.code, error=failure.name, message=failure.message)
            return False  # the supervisor logs it once per distinct error
        for key, fn in (
            ("driver_version", "nvmlSystemGetDriverVersion"),
            ("nvml_version", "nvmlSystemGetNVMLVersion"),
            ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion"),
        ):
            try:
                value = client.raw("init", fn, "")
                if key == "cuda_driver_version":
                    value = f"{int(value) // 1000}.{int(value) % 1000 // 10}"
                self.system[key] = value.decode() if isinstance(value, bytes) else str(value)
            except Exception as exc:  # noqa: BLE001 - version strings are informational
                log.warning("%s failed: %s", fn, errors.classify(exc).message)
        self.system["nvidia_ml_py_version"] = backend.binding_version() or ""
        self.enumerate()
        return True

    def enumerate(self) -> None:
        """Get a handle and UUID per NVML index; a GPU whose lookup fails is recorded as lost."""
        count = self.client.raw("init", "nvmlDeviceGetCount", "")
        known = {d.index for d in self.devices}
        for index in range(int(count)):
            if index in known:
                continue
            self._attach(index)

    def _attach(self, index: int) -> None:
        try:
            handle = self.client.raw("init", "nvmlDeviceGetHandleByIndex", "", index)
            uuid_raw = self.client.raw("init", "nvmlDeviceGetUUID", "", handle)
        except Stopping:
            raise
        except Exception as exc:
            failure = errors.classify(exc, handle_lookup=True)
            if failure.error_class is errors.ErrorClass.FATAL:
                raise NvmlFatal(failure, "nvmlDeviceGetHandleByIndex") from exc
            self.lost.setdefault(index, "")
            logs.log_once(
                log,
                logging.WARNING,
                ("attach", str(index), failure.name),
                "GPU %d: handle lookup failed (%s); it is skipped and retried every sample",
                index,
                failure.message,
                extra={"gpu": index, "nvml_error": failure.name},
            )
            return
        uuid = uuid_raw.decode() if isinstance(uuid_raw, bytes) else str(uuid_raw)
        self.lost.pop(index, None)
        self.devices.append(DeviceClient(self.client, index, uuid, handle))
        self.devices.sort(key=lambda d: d.index)

    def resolve_features(self) -> None:
        """Effective feature states: env modes, quarantine, known-issue rules for these GPUs."""
        from guards import features as gf
        from guards import known_issues

        gpu_models = []
        for dev in self.devices:
            try:
                gpu_models.append(str(self.client.raw("identity", "nvmlDeviceGetName", dev.uuid, dev.handle)))
            except Stopping:
                raise
            except Exception:  # noqa: BLE001 - a model we cannot read matches no rule
                continue
        hits: dict[str, str] = {}
        try:
            hits = known_issues.match_known_issues(
                known_issues.load_known_issues(),
                gpu_models=gpu_models,
                driver_version=self.system.get("driver_version", "0"),
                binding_version=self.system.get("nvidia_ml_py_version") or None,
            )
        except ValueError as exc:
            log.error("known-issue rules could not be evaluated: %s", exc)
        modes = {name: gf.Mode(value) for name, value in self.config["modes"].items()}
        resolved = gf.resolve(modes, known_issues=hits, quarantined=self.config.get("quarantined", {}))
        for name, state in resolved.items():
            self.states[name] = {"enabled": state.enabled, "reason": state.reason.value, "detail": state.detail}
            if state.reason is gf.Reason.KNOWN_ISSUE:
                log.warning(
                    "feature %s is off: known issue on this node: %s (set NVGPU_FEATURE_%s=on to override)",
                    name,
                    state.detail,
                    name.upper(),
                )

    # -- sampling ----------------------------------------------------------------------------

    def enabled(self, feature: str) -> bool:
        state = self.states.get(feature)
        return bool(state and state["enabled"])

    def sample(self) -> dict[str, Any]:
        """One pass over every GPU and enabled feature."""
        started = time.time()
        t0 = time.perf_counter()
        for index in list(self.lost):
            self._attach(index)
        feature_time: dict[str, float] = {}
        feature_ok: dict[str, int] = {}
        gpus: list[dict[str, Any]] = []
        calls_before, ok_before = self.client.calls, self.client.ok_calls
        for dev in list(self.devices):
            readings: dict[str, Any] = {}
            up = True
            for feature, collector in collectors.COLLECTORS.items():
                if not self.enabled(feature):
                    continue
                f0 = time.perf_counter()
                before = sum(v for (f, _), v in self.client.errors.items() if f == feature)
                ok = 1
                try:
                    reading = collector.read(dev)
                    if reading is not None:
                        readings[feature] = collectors.to_json(reading)
                except DeviceLost as exc:
                    up = False
                    ok = 0
                    log.error(
                        "GPU %s (index %d) lost: %s; its series are dropped until it comes back",
                        dev.uuid,
                        dev.index,
                        exc,
                        extra={"uuid": dev.uuid, "gpu": dev.index},
                    )
                except (NvmlFatal, Stopping):
                    raise
                except Exception:  # a collector bug must not fail the sample
                    ok = 0
                    self.client.errors[(feature, "exception")] += 1
                    logs.log_once(
                        log, logging.ERROR, ("collector", feature), "collector %s raised", feature, exc_info=True
                    )
                after = sum(v for (f, _), v in self.client.errors.items() if f == feature)
                if after > before:
                    ok = 0
                feature_time[feature] = feature_time.get(feature, 0.0) + time.perf_counter() - f0
                feature_ok[feature] = min(feature_ok.get(feature, 1), ok)
                if not up:
                    break
            if not up:
                self.devices.remove(dev)
                self.lost[dev.index] = dev.uuid
                gpus.append({"index": dev.index, "uuid": dev.uuid, "up": False, "readings": {}})
                continue
            gpus.append({"index": dev.index, "uuid": dev.uuid, "up": True, "readings": readings})
        for index, uuid in self.lost.items():
            if not any(g["index"] == index for g in gpus):
                gpus.append({"index": index, "uuid": uuid, "up": False, "readings": {}})
        gpus.sort(key=lambda g: g["index"])
        self._mark_unsupported()
        if self.devices and self.client.calls > calls_before and self.client.ok_calls == ok_before:
            # Every call of every GPU failed: NVML is in a bad state ("Unknown Error" after a driver
            # problem). Re-initialising in a fresh worker is the cure; the supervisor backs off.
            raise NvmlFatal(
                errors.NvmlFailure(
                    errors.UNKNOWN, "UNKNOWN", errors.ErrorClass.FATAL, "every NVML call of this sample failed"
                ),
                "sample",
            )
        return {
            "ts": started,
            "duration_s": time.perf_counter() - t0,
            "system": self.system,
            "gpus": gpus,
            "features": {f: {"success": feature_ok[f], "duration_s": feature_time[f]} for f in feature_time},
            "feature_states": self.states,
            "errors": [[f, n, c] for (f, n), c in sorted(self.client.errors.items())],
            "calls": self.client.calls,
            "events_enabled": self.events_enabled,
        }

    def _mark_unsupported(self) -> None:
        """A feature that no GPU supports is switched off with reason ``unsupported``."""
        if not self.devices:
            return
        for feature in collectors.COLLECTORS:
            state = self.states.get(feature)
            if not state or not state["enabled"]:
                continue
            if all(feature in d.feature_unsupported and feature not in d.feature_ok for d in self.devices):
                missing = sorted(
                    {
                        str(k[0]) if k[0] != "field" else f"field {k[1]}"
                        for d in self.devices
                        for k, (f, _) in d.unsupported.items()
                        if f == feature
                    }
                )
                state.update(enabled=False, reason="unsupported", detail=f"no GPU supports it ({', '.join(missing)})")
                log.warning(
                    "feature %s is unsupported on every GPU (%s): it is switched off for this worker's life",
                    feature,
                    state["detail"],
                    extra={"feature": feature},
                )

    # -- events ------------------------------------------------------------------------------

    def start_events(self) -> None:
        if not self.enabled("events"):
            return
        self.event_thread = threading.Thread(target=self._events_loop, name="nvml-events", daemon=True)
        self.event_thread.start()

    def _events_loop(self) -> None:
        client = self.client.fork(SLOT_EVENTS)
        try:
            event_set = client.raw("events", "nvmlEventSetCreate", "")
        except Stopping:
            return
        except Exception as exc:  # noqa: BLE001
            log.warning("nvmlEventSetCreate failed (%s); NVML events are off", errors.classify(exc).message)
            return
        by_handle: dict[int, DeviceClient] = {}
        for dev in list(self.devices):
            try:
                supported = int(client.raw("events", "nvmlDeviceGetSupportedEventTypes", dev.uuid, dev.handle))
                client.raw(
                    "events", "nvmlDeviceRegisterEvents", dev.uuid, dev.handle, supported & EVENT_MASK_WANTED, event_set
                )
                self.events_enabled[dev.uuid] = True
                by_handle[id(dev.handle)] = dev
            except Stopping:
                return
            except Exception as exc:  # noqa: BLE001 - per GPU: events off for that GPU only
                self.events_enabled[dev.uuid] = False
                log.warning(
                    "GPU %s: NVML event registration failed (%s); events are off for this GPU",
                    dev.uuid,
                    errors.classify(exc).message,
                    extra={"uuid": dev.uuid},
                )
        backoff = 1.0
        try:
            while not self.stop.is_set():
                try:
                    data = client.raw("events", "nvmlEventSetWait_v2", "", event_set, EVENT_WAIT_MS)
                except Stopping:
                    break
                except Exception as exc:  # noqa: BLE001 - classified below
                    failure = errors.classify(exc)
                    if failure.code == errors.TIMEOUT:
                        backoff = 1.0
                        continue
                    log.warning("nvmlEventSetWait_v2 failed (%s); retrying in %.0f s", failure.message, backoff)
                    self.stop.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                backoff = 1.0
                found = self._device_of(data.device, by_handle)
                etype = int(data.eventType)
                self.channel.send(
                    "event",
                    ts=time.time(),
                    gpu=found.index if found else None,
                    uuid=found.uuid if found else "",
                    event_type=EVENT_TYPE_NAMES.get(etype, f"type_{etype:#x}"),
                    xid=int(data.eventData) if etype == 0x8 else None,
                )
        finally:
            if self.stop.is_set():
                try:  # past the stop latch on purpose: shutdown waits for this thread first
                    NvmlClient.raw(client, "events", "nvmlEventSetFree", "", event_set)
                except Exception:  # noqa: BLE001 - best effort at shutdown
                    pass

    def _device_of(self, handle: Any, by_handle: Mapping[int, DeviceClient]) -> DeviceClient | None:
        dev = by_handle.get(id(handle))
        if dev is not None:
            return dev
        index = getattr(handle, "index", None)  # the fake's handles; real ones compare by value
        for d in self.devices:
            if d.index == index or d.handle == handle:
                return d
        return None

    # -- shutdown ----------------------------------------------------------------------------

    def shutdown(self, drain_s: float) -> bool:
        """Stop, drain the event thread within ``drain_s``, nvmlShutdown if nothing is in flight."""
        self.stop.set()
        if self.event_thread is not None:
            self.event_thread.join(drain_s)
            if self.event_thread.is_alive():
                log.warning("NVML event thread still in a call after %.1f s; skipping nvmlShutdown", drain_s)
                return False
        try:
            NvmlClient.raw(self.client, "shutdown", "nvmlShutdown", "")
        except Exception as exc:  # noqa: BLE001 - an extra shutdown raises Uninitialized on 580
            log.warning("nvmlShutdown failed: %s", errors.classify(exc).message)
            return False
        return True


def _stdin_watcher(stop: threading.Event) -> None:
    for line in sys.stdin.buffer:
        try:
            if json.loads(line).get("type") == "shutdown":
                break
        except ValueError:
            continue
    stop.set()


def main() -> int:
    """Worker entry point; returns the process exit code."""
    config = json.loads(os.environ["NVGPU_WORKER_CONFIG"])
    logs.setup(config.get("log_level", "INFO"), config.get("log_format", "text"))
    faulthandler.enable(file=sys.stderr, all_threads=True)
    channel = Channel(int(os.environ["NVGPU_WORKER_FD"]))
    crumb_fd = os.environ.get("NVGPU_BREADCRUMB_FD")
    crumbs = BreadcrumbWriter(int(crumb_fd) if crumb_fd else None)
    worker = Worker(config, channel, crumbs)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop.set())
    threading.Thread(target=_stdin_watcher, args=(worker.stop,), name="stdin", daemon=True).start()

    from exporter import selfcheck

    # What this process imported, before NVML can fail; again with the driver version after init.
    channel.send("selfcheck", **selfcheck.run_in_process("worker"))
    try:
        if not worker.init():
            return protocol.EXIT_NVML_FATAL
        channel.send("selfcheck", **selfcheck.run_in_process("worker", worker.system.get("driver_version")))
        worker.resolve_features()
    except NvmlFatal as exc:
        channel.send("init_failed", code=exc.failure.code, error=exc.failure.name, message=str(exc))
        return protocol.EXIT_NVML_FATAL
    except Stopping:
        channel.send("bye", nvml_shutdown=False)
        return protocol.EXIT_OK
    channel.send(
        "hello",
        pid=os.getpid(),
        system=worker.system,
        gpus=[{"index": d.index, "uuid": d.uuid} for d in worker.devices],
        feature_states=worker.states,
    )
    worker.start_events()
    next_at = time.monotonic()
    try:
        while not worker.stop.is_set():
            snap = worker.sample()
            try:
                channel.send("snapshot", **snap)
            except (TypeError, ValueError):  # a value JSON cannot carry: our bug, not a reason to die
                logs.log_once(
                    log, logging.ERROR, ("snapshot-encode",), "snapshot not encodable; skipped", exc_info=True
                )
            next_at += worker.interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a slow sample): start the schedule again from now
                next_at = time.monotonic()
                delay = 0
            worker.stop.wait(delay)
    except Stopping:
        pass
    except NvmlFatal as exc:
        log.error(
            "NVML unusable: %s; exiting so the supervisor re-initialises",
            exc,
            extra={"nvml_error": exc.failure.name, "function": exc.function},
        )
        channel.send("init_failed", code=exc.failure.code, error=exc.failure.name, message=str(exc))
        return protocol.EXIT_NVML_FATAL
    clean = worker.shutdown(float(config.get("drain_s", 5.0)))
    channel.send("bye", nvml_shutdown=clean)
    return protocol.EXIT_OK


if __name__ == "__main__":
    try:
        code = main()
    except BaseException:  # noqa: BLE001 - report, then leave without interpreter teardown
        import traceback

        traceback.print_exc()
        code = protocol.EXIT_ERROR
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # do not run interpreter teardown with NVML threads possibly alive
