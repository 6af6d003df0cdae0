"""One GPU in the worker: its own thread, breadcrumb slot and NVML counters, so its faults stay its own.

Every NVML call that takes this GPU (the handle lookup included) runs on the GPU's single thread,
never on the worker's main thread. A call that outlasts the deadline leaves only this GPU ``hung``:
the main thread keeps sending snapshots of the other GPUs, and this worker makes no further call on
this GPU (a hung thread cannot be cancelled, and a second call would only join it). The supervisor
retries such a GPU in an expendable probe process and readmits it when the probe succeeds
(:mod:`exporter.supervisor.gpuhealth`). Measured on the H200 pair (driver 580.159.04,
2026-11-30): ``nvmlInit`` attaches every GPU, and an init that
does not attach cannot attach one GPU later, so a fresh NVML client cannot avoid a wedged GPU at
init; keeping this worker alive is what keeps the healthy GPUs sampled.

A GPU whose calls answer NOT_SUPPORTED is re-probed every ``reprobe_s`` seconds and at once after a
MIG configuration change, a recovery-action event or a readmission (:meth:`GpuSlot.request_reprobe`),
or when a collector saw the GPU change under it (``DeviceClient.reprobe_requested``: the MIG
collector reading a new MIG mode): the device client forgets what it cached as unsupported and
every static reading (its ``Lifetime.PROBE`` states, :mod:`exporter.common.gpustate`). A GPU lost and
attached again gets a new device client: only its ``Lifetime.WORKER`` states, kept here by UUID,
carry over.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.common import collectors, logs
from exporter.common.breadcrumb import gpu_slot
from exporter.common.collectors.base import Collector
from exporter.common.gpustate import GpuStates, Lifetime
from exporter.common.nvml import errors
from exporter.common.snapshot import GpuSample
from exporter.worker import implausible
from exporter.worker.nvml.client import DeviceClient, DeviceLost, NvmlClient, NvmlFatal, Stopping

log = logging.getLogger("exporter.worker")

_FAILED = object()  # a collector raised: no reading, feature failed


@dataclass
class GpuPass:
    """One GPU's part of a sample.

    Attributes:
        readings: feature -> Reading.
        seconds: feature -> time spent.
        ok: feature -> every call answered (no counted error, no collector exception).
        lost: the GPU answered GPU_IS_LOST (or equivalent) during the pass.
        lost_error: the NVML code name of that answer.
        sampled_at: Unix time the pass started.
        dropped: feature -> reason -> values dropped as implausible since the worker started.
    """

    readings: dict[str, object] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    ok: dict[str, bool] = field(default_factory=dict)
    lost: str = ""
    lost_error: str = ""
    sampled_at: float = 0.0
    dropped: dict[str, dict[str, int]] = field(default_factory=dict)


class GpuSlot:
    """One GPU index of the worker.

    Args:
        index: NVML index.
        client: the worker's NVML client; forked to this GPU's breadcrumb slot and counters.
        state: initial state (``lost`` until attached; ``crashed``/``hung`` when the supervisor
            excluded it: then nothing is called until :meth:`readmit`).
        uuid: the UUID, when known before attaching (exclusions, readmissions).
        bus_id: PCI bus id to attach by (``nvmlDeviceGetHandleByPciBusId``) instead of the index.
        detail: why it is excluded.
        reprobe_s: how often unsupported answers are asked again.
    """

    def __init__(
        self,
        index: int,
        client: NvmlClient,
        *,
        state: str = "lost",
        uuid: str = "",
        bus_id: str = "",
        detail: str = "",
        reprobe_s: float = 300.0,
    ) -> None:
        self.index = index
        self.client = client.fork(gpu_slot(index))
        self.state = state
        self.uuid = uuid
        self.bus_id = bus_id
        self.detail = detail
        self.error = ""  # the NVML code name that made it lost (NO_PERMISSION: the container's device cgroup)
        self.reprobe_s = reprobe_s
        self.dev: DeviceClient | None = None
        self.last: GpuSample | None = None
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"gpu{index}")
        self.future: concurrent.futures.Future[Any] | None = None
        self.started_mono = 0.0
        self.hung_in = ("", "")  # (feature, function) of the call that did not return
        self.next_reprobe = time.monotonic() + reprobe_s
        self._reprobe_now = False
        # GPU UUID -> the states of its last device client here; bounded by the GPUs seen at this index
        self._states: dict[str, GpuStates] = {}

    # -- what the main thread asks --------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A call of this GPU's thread has not returned."""
        return self.future is not None and not self.future.done()

    def overdue(self, deadline_s: float) -> bool:
        """Busy for longer than ``deadline_s``."""
        return self.busy and time.monotonic() - self.started_mono > deadline_s

    def start_attach(self) -> None:
        """Look the GPU up (by PCI bus id when known, else by index) on its thread."""
        self._submit(self._attach)

    def start_sample(self, features: Collection[str], enabled: frozenset[str] = frozenset()) -> None:
        """Sample the enabled collector ``features`` on its thread; ``enabled``: every feature on in
        this worker (collectors or not), which the collectors read their switches from."""
        self._submit(self._sample, tuple(features), enabled or frozenset(features))

    def _submit(self, fn: Any, *args: Any) -> None:
        self.started_mono = time.monotonic()
        self.future = self.executor.submit(fn, *args)

    def harvest(self) -> Any:
        """The finished call's result (None if none finished since the last harvest).

        Raises:
            NvmlFatal, Stopping: from the GPU's thread.
        """
        if self.future is None or not self.future.done():
            return None
        future, self.future = self.future, None
        return future.result()

    def mark_hung(self) -> None:
        """The call in flight outlasted the deadline: no more calls on this GPU from this worker."""
        crumb = self.client.crumbs.read(self.client.slot)
        where = f"{crumb.function} ({crumb.feature})" if crumb and crumb.in_flight else "an NVML call"
        self.hung_in = (crumb.feature, crumb.function) if crumb and crumb.in_flight else ("", "")
        self.state = "hung"
        self.detail = f"{where} did not return within the deadline"
        log.error(
            "GPU %d (%s): %s; this GPU is no longer called by this worker, the others keep being sampled",
            self.index,
            self.uuid or "uuid unknown",
            self.detail,
            extra={"gpu": self.index, "uuid": self.uuid, "function": crumb.function if crumb else ""},
        )

    def request_reprobe(self) -> None:
        """Ask unsupported calls and static readings again at the next pass."""
        self._reprobe_now = True

    def sample_view(self, enabled: Collection[str]) -> GpuSample:
        """This GPU as the snapshot reports it: state, last readings, unsupported features."""
        last = self.last
        unsupported: tuple[str, ...] = ()
        if self.dev is not None:
            unsupported = tuple(
                f
                for f in collectors.COLLECTORS
                if f in enabled and f in self.dev.feature_unsupported - self.dev.feature_ok
            )
        feature, function = self.hung_in if self.state == "hung" else ("", "")
        return GpuSample(
            self.index,
            self.uuid,
            self.state,
            last.readings if last else {},
            last.sampled_at if last else None,
            "" if self.state == "up" else self.detail,
            unsupported,
            feature,
            function,
            last.dropped if last else {},
            error="" if self.state == "up" else self.error,
        )

    # -- on the GPU's thread --------------------------------------------------------------------

    def _attach(self) -> bool:
        """True if attached; a lookup that fails marks the GPU lost (FATAL raises)."""
        try:
            if self.bus_id:
                handle = self.client.raw("init", "nvmlDeviceGetHandleByPciBusId", "", self.bus_id)
            else:
                handle = self.client.raw("init", "nvmlDeviceGetHandleByIndex", "", self.index)
            uuid_raw = self.client.raw("init", "nvmlDeviceGetUUID", "", handle)
        except Stopping:
            raise
        except Exception as exc:
            failure = errors.classify(exc, errors.Context.HANDLE_LOOKUP)
            if failure.error_class is errors.ErrorClass.FATAL:
                raise NvmlFatal(failure, "nvmlDeviceGetHandleByIndex") from exc
            self.state, self.detail = "lost", f"handle lookup failed: {failure.message}"
            self.error = failure.name
            logs.log_once(
                log,
                logging.WARNING,
                ("attach", str(self.index), failure.name),
                "GPU %d: handle lookup failed (%s); it is skipped and retried every sample",
                self.index,
                failure.message,
                extra={"gpu": self.index, "nvml_error": failure.name},
            )
            return False
        uuid = uuid_raw.decode() if isinstance(uuid_raw, bytes) else str(uuid_raw)
        if self.uuid and uuid != self.uuid:
            log.warning("GPU %d is now %s (was %s): the index moved", self.index, uuid, self.uuid)
        self.uuid = uuid
        before = self._states.get(uuid)
        states = self._states[uuid] = GpuStates() if before is None else before.reattached()
        self.dev = DeviceClient(self.client, self.index, uuid, handle, states)
        self.state, self.detail, self.error = "up", "", ""
        return True

    def _sample(self, features: tuple[str, ...], enabled: frozenset[str]) -> GpuPass:
        dev = self.dev
        assert dev is not None
        dev.enabled = enabled
        self._maybe_reprobe(dev)
        out = GpuPass(sampled_at=time.time())
        for feature in features:
            collector = collectors.COLLECTORS[feature]
            f0 = time.perf_counter()
            errors_before = self._feature_errors(feature)
            try:
                reading = self._read(dev, feature, collector)
            except DeviceLost as exc:
                out.seconds[feature] = time.perf_counter() - f0
                out.ok[feature] = False
                out.lost = str(exc)
                out.lost_error = exc.failure.name
                return out
            if reading is not None and reading is not _FAILED:
                out.readings[feature] = reading
            out.seconds[feature] = time.perf_counter() - f0
            out.ok[feature] = reading is not _FAILED and self._feature_errors(feature) == errors_before
        out.dropped = implausible.report(dev)
        return out

    def _maybe_reprobe(self, dev: DeviceClient) -> None:
        now = time.monotonic()
        if not self._reprobe_now and not dev.reprobe_requested and now < self.next_reprobe:
            return
        self._reprobe_now = dev.reprobe_requested = False
        self.next_reprobe = now + self.reprobe_s
        if dev.unsupported or dev.states.holds(Lifetime.PROBE):
            log.debug("GPU %d: asking unsupported calls and static readings again", self.index)
        dev.forget()

    def _read(self, dev: DeviceClient, feature: str, collector: Collector) -> object:
        """The collector's reading, its implausible values dropped (:mod:`exporter.worker.implausible`);
        ``_FAILED`` when the collector raised (our bug, counted)."""
        try:
            return implausible.checked(dev, feature, collector, collector.read(dev))
        except (DeviceLost, NvmlFatal, Stopping):
            raise
        except Exception:  # a collector bug must not fail the sample
            self.client.errors[(feature, "exception")] += 1
            logs.log_once(log, logging.ERROR, ("collector", feature), "collector %s raised", feature, exc_info=True)
            return _FAILED

    def _feature_errors(self, feature: str) -> int:
        return sum(v for (f, _), v in self.client.errors.items() if f == feature)

    # -- applied by the main thread -------------------------------------------------------------

    def apply(self, result: GpuPass) -> None:
        """Take a finished pass: the GPU's last readings, or lost."""
        if result.lost:
            log.error(
                "GPU %s (index %d) lost: %s; its series are dropped until it comes back",
                self.uuid,
                self.index,
                result.lost,
                extra={"uuid": self.uuid, "gpu": self.index},
            )
            self.state, self.detail, self.dev = "lost", result.lost, None
            self.error = result.lost_error
            return
        self.last = GpuSample(self.index, self.uuid, "up", result.readings, result.sampled_at, dropped=result.dropped)

    def close(self) -> None:
        """Let the thread end once idle (a hung one stays until its call returns)."""
        self.executor.shutdown(wait=False, cancel_futures=True)


def merge_stats(passes: Mapping[int, GpuPass]) -> tuple[dict[str, float], dict[str, bool]]:
    """Per-feature time (summed) and success (all GPUs) over the GPU passes of one sample."""
    seconds: dict[str, float] = {}
    ok: dict[str, bool] = {}
    for p in passes.values():
        for feature, spent in p.seconds.items():
            seconds[feature] = seconds.get(feature, 0.0) + spent
            ok[feature] = ok.get(feature, True) and p.ok.get(feature, False)
    return seconds, ok
