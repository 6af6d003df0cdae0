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
attached again gets a new device client: only its ``Lifetime.WORKER`` states carry over.

A slot is one GPU, keyed by its UUID (:func:`exporter.common.gpuid.gpu_key`); its NVML index is only
where the last enumeration found it (:attr:`GpuSlot.index`, the ``gpu`` label), and moves when a GPU
before it leaves or arrives (:mod:`exporter.worker.enumeration`).
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
from exporter.common.gpuid import gpu_key
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
        sampled_mono: ``time.monotonic()`` when the pass started (the readings' age is measured on it).
        dropped: feature -> reason -> values dropped as implausible since the worker started.
    """

    readings: dict[str, object] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    ok: dict[str, bool] = field(default_factory=dict)
    lost: str = ""
    lost_error: str = ""
    sampled_mono: float = 0.0
    dropped: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class LastReadings:
    """A GPU's last good readings, when they were taken (``time.monotonic()``), and the values dropped
    as implausible so far."""

    readings: dict[str, object]
    sampled_mono: float
    dropped: dict[str, dict[str, int]] = field(default_factory=dict)


class GpuSlot:
    """One GPU of the worker, whichever NVML index it has.

    Args:
        index: NVML index where the enumeration found it (a label; :attr:`index` follows it).
        client: the worker's NVML client; forked to this GPU's breadcrumb slot and counters.
        position: this slot's breadcrumb position (unique among the worker's live slots).
        state: initial state (``lost`` until attached; ``crashed``/``hung`` when the supervisor
            excluded it: then nothing is called until readmitted).
        uuid: the UUID, when known before attaching (enumeration, exclusions, a probe's GPU).
        bus_id: PCI bus id; attaching without a handle looks the GPU up by it
            (``nvmlDeviceGetHandleByPciBusId``) before trying the index.
        detail: why it is excluded.
        reprobe_s: how often unsupported answers are asked again.
        handle: the handle the enumeration read (attaching then makes no lookup).
    """

    def __init__(
        self,
        index: int,
        client: NvmlClient,
        *,
        position: int | None = None,
        state: str = "lost",
        uuid: str = "",
        bus_id: str = "",
        detail: str = "",
        reprobe_s: float = 300.0,
        handle: Any = None,
    ) -> None:
        self.index = index
        self.position = index if position is None else position
        self.client = client.fork(gpu_slot(self.position))
        self.state = state
        self.uuid = uuid
        self.bus_id = bus_id
        self.detail = detail
        self.error = ""  # the NVML code name that made it lost (NO_PERMISSION: the container's device cgroup)
        self.reprobe_s = reprobe_s
        self.handle = handle
        self.dev: DeviceClient | None = None
        self.last: LastReadings | None = None
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"gpu{self.position}")
        self.future: concurrent.futures.Future[Any] | None = None
        self.started_mono = 0.0
        self.hung_in = ("", "")  # (feature, function) of the call that did not return
        self.next_reprobe = time.monotonic() + reprobe_s
        self._reprobe_now = False
        self._states: GpuStates | None = None  # the states of this GPU's last device client
        self.removed = False  # NVML no longer enumerates it: reported once as removed, then dropped
        self.mismatch = ""  # an attach found another GPU where this one was looked up

    @property
    def key(self) -> str:
        """This GPU's state key: UUID, else PCI bus id, else ``#<index>``."""
        return gpu_key(self.uuid, self.bus_id, self.index)

    def label(self) -> str:
        """How logs name it: ``GPU 1 (GPU-7bca…, PCI 00000000:2A:00.0)``."""
        ids = ", ".join(x for x in (self.uuid or "uuid unknown", f"PCI {self.bus_id}" if self.bus_id else "") if x)
        return f"GPU {self.index} ({ids})"

    def moved(self, index: int) -> None:
        """The enumeration found this GPU at another NVML index: only its label changes."""
        log.info(
            "%s is now NVML index %d (was %d): GPUs before it left or arrived; its state is kept",
            self.label(),
            index,
            self.index,
            extra={"gpu": index, "uuid": self.uuid},
        )
        self.index = index
        if self.dev is not None:
            self.dev.index = index

    # -- what the main thread asks --------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A call of this GPU's thread has not returned."""
        return self.future is not None and not self.future.done()

    def overdue(self, deadline_s: float) -> bool:
        """Busy for longer than ``deadline_s``."""
        return self.busy and time.monotonic() - self.started_mono > deadline_s

    def start_attach(self, handle: Any = None) -> None:
        """Attach on its thread: with ``handle`` (the enumeration's), else looked up by PCI bus id
        when known, else by index (the UUID read then must be this GPU's)."""
        if handle is not None:
            self.handle = handle
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
            "%s: %s; this GPU is no longer called by this worker, the others keep being sampled",
            self.label(),
            self.detail,
            extra={"gpu": self.index, "uuid": self.uuid, "function": crumb.function if crumb else ""},
        )

    def request_reprobe(self) -> None:
        """Ask unsupported calls and static readings again at the next pass."""
        self._reprobe_now = True

    def sample_view(self, enabled: Collection[str], ts: float, mono: float) -> GpuSample:
        """This GPU as the snapshot of time ``ts`` (``time.time()``) taken at ``mono``
        (``time.monotonic()``) reports it: state, last readings, unsupported features. The readings'
        ``sampled_at`` is ``ts`` less their monotonic age, so a wall-clock step between the pass and
        the snapshot cannot make them look older or younger than they are."""
        last = self.last
        unsupported: tuple[str, ...] = ()
        if self.dev is not None:
            unsupported = tuple(
                f
                for f in collectors.COLLECTORS
                if f in enabled and f in self.dev.feature_unsupported - self.dev.feature_ok
            )
        feature, function = self.hung_in if self.state == "hung" else ("", "")
        state = "removed" if self.removed else self.state
        return GpuSample(
            self.index,
            self.uuid,
            state,
            last.readings if last and not self.removed else {},
            ts - max(0.0, mono - last.sampled_mono) if last else None,
            "" if state == "up" else self.detail,
            unsupported,
            feature,
            function,
            last.dropped if last else {},
            error="" if self.state == "up" else self.error,
            bus_id=self.bus_id,
        )

    # -- on the GPU's thread --------------------------------------------------------------------

    def _attach(self) -> bool:
        """True if attached; a lookup that fails marks the GPU lost (FATAL raises). With the
        enumeration's handle nothing is called: the enumeration just read its UUID there."""
        handle, self.handle = self.handle, None  # an enumeration's handle is used once
        uuid, how = self.uuid, "nvmlDeviceGetHandleByIndex"
        try:
            if handle is None:
                if self.bus_id:
                    how = "nvmlDeviceGetHandleByPciBusId"
                    handle = self.client.raw("init", how, "", self.bus_id)
                else:
                    handle = self.client.raw("init", how, "", self.index)
                how = "nvmlDeviceGetUUID"
                uuid = _text(self.client.raw("init", how, "", handle))
        except Stopping:
            raise
        except Exception as exc:
            failure = errors.classify(exc, errors.Context.HANDLE_LOOKUP)
            if failure.error_class is errors.ErrorClass.FATAL:
                raise NvmlFatal(failure, how) from exc
            if how != "nvmlDeviceGetUUID" or self.uuid or not self.bus_id:
                self.state, self.detail = "lost", f"handle lookup failed: {failure.message}"
                self.error = failure.name
                logs.log_once(
                    log,
                    logging.WARNING,
                    ("attach", self.key, failure.name),
                    "%s: handle lookup failed (%s); it is skipped and retried every sample",
                    self.label(),
                    failure.message,
                    extra={"gpu": self.index, "uuid": self.uuid, "nvml_error": failure.name},
                )
                return False
            uuid = ""  # found by its bus id, whose UUID cannot be read: the bus id stays its key
        if self.uuid and uuid != self.uuid:
            # looked up where this GPU was, and another answered: the sampler re-enumerates
            self.state, self.detail, self.mismatch = "lost", f"index {self.index} now answers {uuid}", uuid
            return False
        self.uuid = uuid
        states = self._states = GpuStates() if self._states is None else self._states.reattached()
        self.dev = DeviceClient(self.client, self.index, self.uuid or self.key, handle, states)
        self.state, self.detail, self.error = "up", "", ""
        return True

    def _sample(self, features: tuple[str, ...], enabled: frozenset[str]) -> GpuPass:
        dev = self.dev
        assert dev is not None
        dev.enabled = enabled
        self._maybe_reprobe(dev)
        out = GpuPass(sampled_mono=time.monotonic())
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
            log.debug("%s: asking unsupported calls and static readings again", self.label())
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
                "%s lost: %s; its series are dropped until it comes back",
                self.label(),
                result.lost,
                extra={"uuid": self.uuid, "gpu": self.index},
            )
            self.state, self.detail, self.dev = "lost", result.lost, None
            self.error = result.lost_error
            return
        ident = result.readings.get("identity")
        bus = getattr(ident, "pci_bus_id", None)
        if isinstance(bus, str) and bus:
            self.bus_id = bus
        self.last = LastReadings(result.readings, result.sampled_mono, result.dropped)

    def close(self) -> None:
        """Let the thread end once idle (a hung one stays until its call returns)."""
        self.executor.shutdown(wait=False, cancel_futures=True)


def _text(value: Any) -> str:
    return (value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)).strip()


def merge_stats(passes: Mapping[str, GpuPass]) -> tuple[dict[str, float], dict[str, bool]]:
    """Per-feature time (summed) and success (all GPUs) over the GPU passes of one sample."""
    seconds: dict[str, float] = {}
    ok: dict[str, bool] = {}
    for p in passes.values():
        for feature, spent in p.seconds.items():
            seconds[feature] = seconds.get(feature, 0.0) + spent
            ok[feature] = ok.get(feature, True) and p.ok.get(feature, False)
    return seconds, ok
