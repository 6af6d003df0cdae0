"""One worker's NVML state and sampling: init, one thread per GPU, feature states, snapshots.

Runs in the worker process only. :class:`Sampler` calls ``nvmlInit`` once on the main thread, reads
the versions, then attaches every GPU it is allowed to on that GPU's own thread
(:class:`~exporter.worker.gpuslot.GpuSlot`), reporting each finished step as progress so the supervisor's
init deadline follows it. Each :meth:`Sampler.tick` starts a pass on every GPU that is up, waits
for them at most one interval, and returns a :class:`~exporter.common.snapshot.Snapshot` of every GPU:
fresh readings for those that finished, the last readings (with their age) for one still busy, and
``hung`` for one whose call outlasted the deadline. Every NVML call goes through the
:class:`~exporter.worker.nvml.client.NvmlClient` (breadcrumb, counting); what an error means is decided in
:mod:`exporter.common.nvml.errors`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from exporter.common import collectors, logs
from exporter.common.collectors.base import SystemInfo
from exporter.common.nvml import errors
from exporter.common.snapshot import FeatureStat, InitFailed, Snapshot
from exporter.common.workerconfig import WorkerConfig
from exporter.worker.enumeration import Enumerator, GpuTable, Rediscovery
from exporter.worker.gpuslot import GpuPass, GpuSlot, merge_stats
from exporter.worker.nvml.client import DeviceClient, NvmlClient, NvmlFatal, Stopping
from guards import features as gf

log = logging.getLogger("exporter.worker")

_VERSION_CALLS = (
    ("driver_version", "nvmlSystemGetDriverVersion"),
    ("nvml_version", "nvmlSystemGetNVMLVersion"),
    ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion"),
)


def _text(value: Any) -> str:
    """A driver string as text: bytes decoded, unprintable characters (lone surrogates too) dropped."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return "".join(ch for ch in str(value) if ch.isprintable()).strip()


class Sampler:
    """Sampling state of one worker process.

    Args:
        config: the worker configuration (its ``interval_s``, ``deadline_s`` per GPU, ``modes``,
            ``quarantined``, ``exclude``, ``only`` and ``reprobe_s`` are used here).
        client: the NVML client of the main thread.
        binding_version: the installed nvidia-ml-py version (empty if unknown).
        progress: called with the name of each finished init step.
    """

    def __init__(
        self,
        config: WorkerConfig,
        client: NvmlClient,
        binding_version: str,
        progress: Callable[[str], None] = lambda step: None,
    ) -> None:
        self.config = config
        self.client = client
        self.binding_version = binding_version
        self.progress = progress
        self.interval_s = config.interval_s
        self.deadline_s = config.deadline_s
        self.system = SystemInfo(nvidia_ml_py_version=binding_version)
        self.table = GpuTable(client, config.reprobe_s, config.exclude)
        self.slots = self.table.slots  # GPU key (UUID, else PCI bus id) -> its slot
        self.enumerator = None if config.only else Enumerator(client, config.deadline_s)
        self.rediscovery = Rediscovery(self.enumerator, self.table, config.enumerate_s, config.deadline_s)
        self.on_attached: Callable[[DeviceClient], None] = lambda dev: None  # the event thread registers it
        self.resolved: dict[str, gf.FeatureState] = {}
        self.states: dict[str, gf.FeatureState] = {}
        self.events_enabled: dict[str, bool] = {}  # written by the event thread
        self.commands: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()  # from the supervisor
        self._last_calls = (0, 0)

    # -- start-up ----------------------------------------------------------------------------

    def init(self) -> InitFailed | None:
        """``nvmlInit``, versions, enumeration. Returns the failure to report, or None.

        Raises:
            NvmlFatal: a handle lookup said NVML itself is unusable.
            Stopping: a shutdown was requested meanwhile.
        """
        try:
            self.client.raw("init", "nvmlInit", "")
        except Stopping:
            raise
        except Exception as exc:
            failure = errors.classify(exc)
            return InitFailed(failure.code, failure.name, failure.message)
        self.progress("nvmlInit")
        versions: dict[str, str] = {}
        for key, fn in _VERSION_CALLS:
            try:
                value = self.client.raw("init", fn, "")
            except Stopping:
                raise
            except Exception as exc:  # noqa: BLE001 - version strings are informational
                log.warning("%s failed: %s", fn, errors.classify(exc).message)
                continue
            if key == "cuda_driver_version":
                value = f"{int(value) // 1000}.{int(value) % 1000 // 10}"
            versions[key] = _text(value)
        self.system = SystemInfo(nvidia_ml_py_version=self.binding_version, **versions)
        self.enumerate()
        return None

    def enumerate(self) -> None:
        """Start-up: a slot per GPU NVML enumerates (or per ``only`` GPU of a probe), keyed by UUID,
        exclusions applied (an index where a hung one was last seen is not asked); attach the others,
        each on its own thread, waiting at most the deadline for each; report progress per GPU."""
        if self.config.only:
            for ref in self.config.only:
                self.table.add(self.table.new_slot(ref.index, uuid=ref.uuid, bus_id=ref.bus_id))
        else:
            assert self.enumerator is not None
            count = int(self.client.raw("init", "nvmlDeviceGetCount", ""))
            hung = {e.gpu.index: e for e in self.config.exclude if e.state == "hung" and 0 <= e.gpu.index < count}
            self.rediscovery.count = count
            self.table.apply(self.enumerator.wait(count, hung, self.progress), hung, starting=True)
        for slot in self.slots.values():
            if slot.state == "lost":
                slot.start_attach()
        for slot in list(self.slots.values()):
            if slot.future is None:
                continue
            try:
                slot.future.result(timeout=max(0.0, self.deadline_s - (time.monotonic() - slot.started_mono)))
            except concurrent.futures.TimeoutError:
                slot.mark_hung()
                continue
            self._attached(slot, slot.harvest())
            self.progress(f"GPU {slot.index} attached" if slot.state == "up" else f"GPU {slot.index} {slot.state}")

    def resolve_features(self) -> None:
        """Effective feature states: env modes, quarantine, known-issue rules for these GPUs."""
        from guards import known_issues

        models = []
        for slot in self.slots.values():
            if slot.dev is None:
                continue
            try:
                models.append(str(slot.client.raw("identity", "nvmlDeviceGetName", slot.uuid, slot.dev.handle)))
            except Stopping:
                raise
            except Exception:  # noqa: BLE001 - a model we cannot read matches no rule
                continue
        hits = known_issues.match_known_issues(
            known_issues.load_known_issues(),
            gpu_models=models,
            driver_version=self.system.driver_version or "0",
            binding_version=self.system.nvidia_ml_py_version or None,
            on_unparsable=lambda why: log.error("known-issue rules: %s", why),
        )
        # The one decision: the supervisor shows it (nvgpu_feature_enabled), its extensions follow it,
        # and collectors read it as dev.enabled.
        self.resolved = gf.resolve(self.config.modes, known_issues=hits, quarantined=self.config.quarantined)
        self.states = dict(self.resolved)
        for name, state in self.resolved.items():
            if state.reason is gf.Reason.KNOWN_ISSUE:
                log.warning(
                    "feature %s is off: known issue on this node: %s (set NVGPU_FEATURE_%s=on to override)",
                    name,
                    state.detail,
                    name.upper(),
                )

    # -- sampling ----------------------------------------------------------------------------

    def enabled(self, feature: str) -> bool:
        """Whether ``feature`` is on in this worker."""
        state = self.states.get(feature)
        return bool(state and state.enabled)

    def tick(self) -> Snapshot:
        """One sample: start a pass on every GPU that is up, wait at most an interval, report all.

        Raises:
            NvmlFatal: NVML is unusable (a fatal error, or every call of the sample failed).
            Stopping: a shutdown was requested.
        """
        started, t0, mono = time.time(), time.perf_counter(), time.monotonic()
        self._commands()
        passes = self._harvest()
        self.rediscovery.step(self.client)
        features = [f for f in collectors.COLLECTORS if self.enabled(f)]
        # Switches are read from the resolved states (env, quarantine, known issues), not from
        # "unsupported": a collector's series set stays the same for the worker's life.
        switches = frozenset(f for f, st in self.resolved.items() if st.enabled)
        for slot in self.slots.values():
            if slot.busy or slot.removed:
                continue
            if slot.state == "up":
                slot.start_sample(features, switches)
            elif slot.state == "lost":
                slot.start_attach()
        waiting = [s.future for s in self.slots.values() if s.future is not None]
        concurrent.futures.wait(waiting, timeout=self.interval_s)
        passes.update(self._harvest())
        self._check_deadlines()
        self._mark_unsupported()
        self._check_every_call_failed()
        seconds, ok = merge_stats(passes)
        configured = {f for f, st in self.resolved.items() if st.enabled and f in collectors.COLLECTORS}
        order = sorted(self.slots.values(), key=lambda s: (s.removed, s.index, s.key))
        gpus = tuple(s.sample_view(configured, started, mono) for s in order)
        self.table.drop_removed()
        return Snapshot(
            ts=started,
            duration_s=time.perf_counter() - t0,
            system=self.system,
            gpus=gpus,
            features={f: FeatureStat(ok[f], seconds[f]) for f in seconds},
            feature_states=dict(self.states),
            errors=dict(self.error_counts()),
            calls=self.calls()[0],
            events_enabled=dict(self.events_enabled),
        )

    def _harvest(self) -> dict[str, GpuPass]:
        passes: dict[str, GpuPass] = {}
        for slot in list(self.slots.values()):
            if slot.state == "hung":
                if slot.future is not None and slot.future.done():
                    slot.future = None  # the stuck call returned; the GPU stays out until readmitted
                continue
            result = slot.harvest()
            if isinstance(result, GpuPass):
                slot.apply(result)
                passes[slot.key] = result
                if result.lost:
                    self.rediscovery.ask(f"{slot.label()} lost")
            elif result is not None:
                self._attached(slot, result)
        return passes

    def _attached(self, slot: GpuSlot, result: Any) -> None:
        """After an attach: key it by the UUID it read, ask for an enumeration when it found another
        GPU, tell the event thread about a device it can register."""
        self.rediscovery.ask(self.table.attached(slot))
        if result is True and slot.dev is not None and self.slots.get(slot.key) is slot:
            self.on_attached(slot.dev)

    def _check_deadlines(self) -> None:
        for slot in self.slots.values():
            if slot.state != "hung" and slot.overdue(self.deadline_s):
                slot.mark_hung()

    def _commands(self) -> None:
        """Apply what the supervisor asked (readmit a GPU whose probe succeeded, re-probe one) and
        what the event thread asked (enumerate again after a reset or bus event)."""
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return
            if cmd.get("type") == "enumerate":
                self.rediscovery.ask(str(cmd.get("why", "asked")))
            else:
                self.table.command(cmd)

    def request_reprobe(self, uuid: str) -> None:
        """Ask the GPU ``uuid`` (every GPU if empty) again what it supports (MIG change, recovery)."""
        for slot in self.slots.values():
            if not uuid or uuid in (slot.uuid, slot.key):
                slot.request_reprobe()

    def _mark_unsupported(self) -> None:
        """A feature that no attached GPU supports is off (reason ``unsupported``) until a re-probe
        finds one that does; every other feature is in its resolved state."""
        devices = [s.dev for s in self.slots.values() if s.dev is not None and s.state == "up"]
        for feature in collectors.COLLECTORS:
            resolved = self.resolved.get(feature)
            if resolved is None or not resolved.enabled or not devices:
                continue
            unsupported = all(feature in d.feature_unsupported and feature not in d.feature_ok for d in devices)
            current = self.states[feature]
            if not unsupported:
                if current.reason is gf.Reason.UNSUPPORTED:
                    log.info("feature %s answers again on a GPU: back on", feature)
                self.states[feature] = resolved
                continue
            if current.reason is gf.Reason.UNSUPPORTED:
                continue
            missing = sorted(
                {
                    str(k[0]) if k[0] != "field" else f"field {k[1]}"
                    for d in devices
                    for k, (f, _) in d.unsupported.items()
                    if f == feature
                }
            )
            detail = f"no GPU supports it ({', '.join(missing)})"
            self.states[feature] = gf.FeatureState(feature, False, gf.Reason.UNSUPPORTED, detail)
            answers = {why for d in devices for (f, why) in d.unsupported.values() if f == feature}
            _log_unsupported(feature, detail, answers)

    def calls(self) -> tuple[int, int]:
        """(calls, calls that answered) over the main, enumeration and every GPU thread."""
        return self.table.calls(self._threads())

    def error_counts(self) -> Counter[tuple[str, str]]:
        """(feature, NVML error name) -> count over the main, enumeration and every GPU thread."""
        return self.table.errors(self._threads())

    def _threads(self) -> list[NvmlClient]:
        return [self.client, *([self.enumerator.client] if self.enumerator is not None else [])]

    def _check_every_call_failed(self) -> None:
        calls, ok = self.calls()
        made, answered = calls - self._last_calls[0], ok - self._last_calls[1]
        self._last_calls = (calls, ok)
        if any(s.state == "up" for s in self.slots.values()) or made:
            failure = errors.sample_failed_everywhere(made, answered)
            if failure is not None:
                raise NvmlFatal(failure, "sample")

    def stop_threads(self, drain_s: float) -> bool:
        """Let the GPU threads finish within ``drain_s``; False if one is still in a call."""
        deadline = time.monotonic() + drain_s
        clean = True
        for slot in self.slots.values():
            if slot.state == "hung" and slot.busy:  # it outlasted the deadline once: do not wait again
                clean = False
            elif slot.future is not None:
                try:
                    slot.future.result(timeout=max(0.0, deadline - time.monotonic()))
                except concurrent.futures.TimeoutError:
                    clean = False
                except BaseException:  # noqa: BLE001 - Stopping or the call's own error: it returned
                    pass
            slot.close()
        if self.enumerator is not None:
            clean = clean and not self.enumerator.busy
            self.enumerator.close()
        return clean


def _log_unsupported(feature: str, detail: str, answers: set[str]) -> None:
    """The hardware saying no (no fan on an H200, no NVLink on a single GPU) is not a fault: INFO,
    once (the supervisor keeps it once across workers too). A missing symbol or a refused
    permission is worth a WARNING: a newer binding or driver, or the container's device access,
    would change it."""
    logs.log_once(
        log,
        logging.WARNING if answers & _NOT_HARDWARE else logging.INFO,
        ("unsupported-feature", feature, detail),
        "feature %s is unsupported on every GPU (%s): off until a re-probe finds it",
        feature,
        detail,
        extra={"feature": feature},
    )


_NOT_HARDWARE = {"FUNCTION_NOT_FOUND", "ARGUMENT_VERSION_MISMATCH", "NO_PERMISSION"}  # binding, driver, container
