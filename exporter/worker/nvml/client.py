"""Every NVML call goes through here.

:class:`NvmlClient` wraps the backend for the worker: before each call it leaves a breadcrumb
(feature, function, GPU) in shared memory, counts the call, and after an error asks
:mod:`exporter.common.nvml.errors` what it means. :class:`DeviceClient` is the per-GPU view collectors use:
``get`` returns the value, or ``None`` when the reading is missing for a reason that only omits the
sample (unsupported — cached so the call is never repeated on that GPU —, absent, transient —
counted —, or a bug — logged with its traceback). A lost GPU raises :class:`DeviceLost`; an
unusable library raises :class:`NvmlFatal`: the worker's loop decides what happens next.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from exporter.common import plausibility
from exporter.common.breadcrumb import SLOT_SAMPLER, BreadcrumbWriter
from exporter.common.gpustate import GpuStates, S
from exporter.common.logs import log_once
from exporter.common.nvml import errors
from exporter.common.nvml.errors import ErrorClass, NvmlFailure
from exporter.common.workerconfig import CollectorOptions
from exporter.worker.nvml.backend import UNPOPULATED, FieldValue

log = logging.getLogger(__name__)

FIELD_CALL = ("field", "call")  # unsupported-cache key of nvmlDeviceGetFieldValues failing as a whole


class Stopping(BaseException):
    """Raised instead of a new NVML call once a shutdown was requested.

    A BaseException, like KeyboardInterrupt, so that the per-call error handling
    (``except Exception`` -> classify) does not mistake it for an NVML error.
    """


class DeviceLost(Exception):
    """The GPU answered GPU_IS_LOST (or equivalent): drop it until re-enumeration."""

    def __init__(self, failure: NvmlFailure, function: str) -> None:
        super().__init__(f"{function}: {failure.message}")
        self.failure = failure
        self.function = function


class NvmlFatal(Exception):
    """NVML itself is unusable (driver gone, library mismatch, uninitialised)."""

    def __init__(self, failure: NvmlFailure, function: str) -> None:
        super().__init__(f"{function}: {failure.message}")
        self.failure = failure
        self.function = function


class NvmlClient:
    """Process-wide wrapper: breadcrumbs, call counting, error bookkeeping.

    Args:
        backend: ``RealNvml`` or ``FakeBackend`` (pynvml-shaped).
        crumbs: shared-memory breadcrumb writer.
        slot: breadcrumb slot of the calling thread (sampler by default).
        stop: once set, new calls raise :class:`Stopping` (calls in flight finish).
        options: per-collector settings of the worker configuration
            (:attr:`exporter.common.workerconfig.WorkerConfig.collectors`); collectors read them through
            their :class:`DeviceClient`'s ``client``. Their defaults when None.
    """

    def __init__(
        self,
        backend: Any,
        crumbs: BreadcrumbWriter,
        slot: int = SLOT_SAMPLER,
        stop: threading.Event | None = None,
        options: CollectorOptions | None = None,
    ) -> None:
        self.backend = backend
        self.crumbs = crumbs
        self.slot = slot
        self.stop = stop or threading.Event()
        self.options = options if options is not None else CollectorOptions()
        self.calls = 0
        self.ok_calls = 0  # calls that returned: "every call failing" is told apart from "no call needed"
        self.errors: Counter[tuple[str, str]] = Counter()  # (feature, error name) -> count
        self._fns: dict[str, Callable[..., Any]] = {}

    def now(self) -> float:
        """Seconds on the backend's clock: ``time.monotonic()`` for real NVML, scenario time for the
        fake (so a window measured here agrees with the fake's counters and value cycles)."""
        clock: Callable[[], float] = self.backend.clock
        return clock()

    def timestamp_us(self) -> int:
        """Now as NVML stamps samples (µs since 1970; the fake's clock for the fake): what a sample's
        timestamp is checked against (:func:`exporter.common.plausibility.in_future`)."""
        stamp: Callable[[], int] = self.backend.timestamp_us
        return stamp()

    def fork(self, slot: int) -> NvmlClient:
        """A client for another thread, sharing the backend and breadcrumb memory."""
        other = NvmlClient(self.backend, self.crumbs, slot, self.stop, self.options)
        other._fns = self._fns
        return other

    def _fn(self, name: str) -> Callable[..., Any]:
        fn = self._fns.get(name)
        if fn is None:
            fn = getattr(self.backend, name)  # AttributeError = function not in this binding
            self._fns[name] = fn
        return fn

    def raw(self, feature: str, function: str, uuid: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``function`` with a breadcrumb; exceptions propagate unclassified.

        Raises:
            Stopping: a shutdown was requested (the call is not made).
        """
        if self.stop.is_set():
            raise Stopping()
        return self.raw_during_shutdown(feature, function, uuid, *args, **kwargs)

    def raw_during_shutdown(self, feature: str, function: str, uuid: str, *args: Any, **kwargs: Any) -> Any:
        """Like :meth:`raw`, past the stop latch: for ``nvmlShutdown`` and freeing the event set."""
        self.crumbs.enter(self.slot, feature, function, uuid)
        self.calls += 1
        try:
            value = self._fn(function)(*args, **kwargs)
        finally:
            self.crumbs.exit(self.slot)
        self.ok_calls += 1
        return value

    def field_values(self, feature: str, uuid: str, handle: Any, pairs: list[tuple[int, int]]) -> list[FieldValue]:
        """``nvmlDeviceGetFieldValues`` through the backend's safe implementation."""
        if self.stop.is_set():
            raise Stopping()
        self.crumbs.enter(self.slot, feature, "nvmlDeviceGetFieldValues", uuid)
        self.calls += 1
        try:
            result: list[FieldValue] = self.backend.field_values(handle, pairs)
        finally:
            self.crumbs.exit(self.slot)
        self.ok_calls += 1
        return result


class DeviceClient:
    """One GPU as collectors see it.

    Attributes:
        index: NVML index (``gpu`` label).
        uuid: GPU UUID.
        handle: NVML device handle.
        unsupported: (function, args) keys that answered an unsupported class; never called again.
        enabled: every feature enabled in this worker, collectors or not, set by the sampler before
            each pass: a collector reads the series a switch adds (``details``, ``nvlink_links``)
            only when that switch is in here.
        states: what collectors remember about this GPU, by kind and lifetime
            (:mod:`exporter.common.gpustate`); reached through :meth:`state_of`.

    Args:
        states: the states to start from (``GpuStates.reattached()`` of the GPU's previous device
            client, which keeps the worker-lived ones); new and empty when None.
    """

    def __init__(self, client: NvmlClient, index: int, uuid: str, handle: Any, states: GpuStates | None = None) -> None:
        self.client = client
        self.index = index
        self.uuid = uuid
        self.handle = handle
        self.unsupported: dict[tuple[Any, ...], tuple[str, str]] = {}  # key -> (feature, error name)
        self.states = GpuStates() if states is None else states
        self.feature_ok: set[str] = set()  # features with at least one successful call this life
        self.feature_unsupported: set[str] = set()
        # Set by a collector that saw the GPU change under it (MIG mode): the GPU's thread re-probes
        # before its next pass, as after a MIG configuration change event.
        self.reprobe_requested = False
        self.enabled: frozenset[str] = frozenset()

    def state_of(self, kind: type[S]) -> S:
        """This GPU's state of ``kind`` (a :class:`~exporter.common.gpustate.GpuState` subclass a collector
        declares), made on first use in its lifetime."""
        return self.states.of(kind)

    def forget(self) -> None:
        """Forget the unsupported answers that can change, and every static reading (the
        ``Lifetime.PROBE`` states): ask again (a re-probe after a MIG change, a reset or a recovery
        event, or periodically). A function the binding or driver lacks (FUNCTION_NOT_FOUND,
        ARGUMENT_VERSION_MISMATCH, DEPRECATED) stays unsupported: that changes only with a new
        driver, which restarts the worker anyway. The other states stay."""
        self.unsupported = {k: v for k, v in self.unsupported.items() if v[1] in errors.PERMANENTLY_UNSUPPORTED}
        self.states.forget()
        self.feature_ok.clear()
        self.feature_unsupported = {feature for feature, _ in self.unsupported.values()}

    def handle_error(
        self,
        feature: str,
        function: str,
        key: tuple[Any, ...],
        exc: BaseException,
        quiet: bool = False,
        context: errors.Context | None = None,
    ) -> None:
        if context is None:
            context = errors.Context.INDEXED if len(key) > 1 else errors.Context.CALL
        failure = errors.classify(exc, context)
        cls = failure.error_class
        if cls is ErrorClass.UNSUPPORTED:
            self.unsupported[key] = (feature, failure.name)
            self.feature_unsupported.add(feature)
            if quiet:
                return
            log_once(
                log,
                logging.INFO,
                ("unsupported", self.uuid, function),
                "%s not supported on GPU %s (%s); its series are omitted and it is not called again",
                function,
                self.uuid,
                failure.name,
                extra={"feature": feature, "function": function, "uuid": self.uuid, "nvml_error": failure.name},
            )
        elif cls is ErrorClass.ABSENT:
            return
        elif cls is ErrorClass.TRANSIENT:
            self.client.errors[(feature, failure.name)] += 1
        elif cls is ErrorClass.BUG:
            self.client.errors[(feature, failure.name)] += 1
            log_once(
                log,
                logging.ERROR,
                ("bug", feature, function, failure.name),
                "unexpected error from %s on GPU %s: %s",
                function,
                self.uuid,
                failure.message,
                exc_info=exc,
                extra={"feature": feature, "function": function},
            )
        elif cls is ErrorClass.DEVICE_LOST:
            raise DeviceLost(failure, function) from exc
        else:
            raise NvmlFatal(failure, function) from exc

    def get(self, feature: str, function: str, *args: Any, **kwargs: Any) -> Any:
        """Call a per-device function: ``function(handle, *args, **kwargs)``.

        Returns:
            The value, or None when it is missing (unsupported, absent, transient, bug).

        Raises:
            DeviceLost: the GPU is gone.
            NvmlFatal: NVML is unusable.
        """
        return self._get(feature, function, args, kwargs, quiet=False)

    def probe(self, feature: str, function: str, *args: Any) -> Any:
        """Like :meth:`get`, for discovery (link 0, 1, … until the driver says no): an
        unsupported answer is cached but not logged, since it is the expected end of the probe."""
        return self._get(feature, function, args, {}, quiet=True)

    def _get(self, feature: str, function: str, args: tuple[Any, ...], kwargs: dict[str, Any], quiet: bool) -> Any:
        key = (function, *args, *sorted(kwargs.items()))
        if key in self.unsupported:
            return None
        try:
            value = self.client.raw(feature, function, self.uuid, self.handle, *args, **kwargs)
        except Exception as exc:  # classified in one place: errors.classify
            self.handle_error(feature, function, key, exc, quiet)
            return None
        self.feature_ok.add(feature)
        return value

    def call(
        self,
        feature: str,
        function: str,
        *args: Any,
        key: tuple[Any, ...],
        handle: bool = True,
        discovery: bool = False,
        context: errors.Context = errors.Context.CALL,
        absent: Any = None,
    ) -> Any:
        """Like :meth:`get`, for calls whose arguments cannot key the unsupported cache.

        ctypes structures and GPM sample buffers are unhashable, and a new one each time, so ``key``
        names the call in the cache instead (an unsupported answer is never asked again). With
        ``handle=False`` the device handle is not passed (``nvmlGpmSampleAlloc``,
        ``nvmlGpmSampleFree``, ``nvmlGpmMetricsGet`` take none); the call is still made on this
        GPU's behalf: its breadcrumb, its unsupported cache, its error counts. Errors are classified
        as for an ordinary per-GPU call unless ``context`` says otherwise (``MIG_DEVICE`` for a call
        on a MIG device handle, which the caller then passes itself with ``handle=False``).
        ``discovery=True`` for a call that only decides what to ask for (the driver version): its
        success does not make the feature look supported.
        An ABSENT answer (in ``context``: a MIG device gone since it was enumerated) returns
        ``absent``, which tells "not there any more" from "no answer" (None) where that matters.

        Returns:
            The value, or None when it is missing (unsupported, absent, transient, bug).

        Raises:
            DeviceLost: the GPU is gone.
            NvmlFatal: NVML is unusable.
        """
        if key in self.unsupported:
            return None
        call_args = (self.handle, *args) if handle else args
        try:
            value = self.client.raw(feature, function, self.uuid, *call_args)
        except Exception as exc:  # classified in one place: errors.classify
            if absent is not None and errors.classify(exc, context).error_class is ErrorClass.ABSENT:
                return absent
            self.handle_error(feature, function, key, exc, context=context)
            return None
        if not discovery:
            self.feature_ok.add(feature)
        return value

    def sample(self, feature: str, function: str, *args: Any, absent: Any = None) -> Any:
        """Like :meth:`get`, for calls whose arguments change every time (a last-seen timestamp).

        The unsupported cache is keyed by the function alone, so a GPU that answers
        NOT_SUPPORTED (nvmlDeviceGetProcessUtilization with MIG on) is not asked again with the
        next timestamp; and an ABSENT answer (NOT_FOUND: "no samples newer than the timestamp")
        returns ``absent``, which tells "nothing new" from "no answer" (None).

        Raises:
            DeviceLost: the GPU is gone.
            NvmlFatal: NVML is unusable.
        """
        key: tuple[Any, ...] = (function,)
        if key in self.unsupported:
            return None
        try:
            value = self.client.raw(feature, function, self.uuid, self.handle, *args)
        except Exception as exc:  # classified in one place: errors.classify
            if errors.classify(exc).error_class is ErrorClass.ABSENT:
                self.feature_ok.add(feature)
                return absent
            self.handle_error(feature, function, key, exc)
            return None
        self.feature_ok.add(feature)
        return value

    def nothing_to_read(self, feature: str, function: str, why: str, announce: bool = True) -> None:
        """Mark ``feature`` unsupported on this GPU although ``function`` answered.

        For a discovery call that succeeds but leaves nothing to read: ``nvmlDeviceGetNumFans``
        answering 0 on a passive board, or a fan count whose every fan answers NOT_SUPPORTED. The
        discovery call's success must not keep the feature looking supported (the worker switches
        a feature off with reason ``unsupported`` only when no GPU has it), and ``function`` is
        never called again on this GPU.

        Args:
            feature: the feature (collector) name.
            function: the discovery call, cached as unsupported (key ``(function,)``).
            why: short reason for logs and the feature-state detail, e.g. ``"0 fans"``.
            announce: log it once; False when the client already logged the unsupported call.
        """
        self.unsupported.setdefault((function,), (feature, why))
        self.feature_unsupported.add(feature)
        self.feature_ok.discard(feature)
        if announce:
            log_once(
                log,
                logging.INFO,
                ("unsupported", self.uuid, function),
                "%s on GPU %s: %s; its series are omitted and it is not called again",
                function,
                self.uuid,
                why,
                extra={"feature": feature, "function": function, "uuid": self.uuid},
            )

    def first(self, feature: str, calls: Sequence[tuple[str, tuple[Any, ...]]]) -> Any:
        """The first call in ``calls`` that is supported and answers; None if none does.

        Used for versioned symbols (``_v3`` then ``_v2``; ``TemperatureV`` then ``Temperature``).
        Once a variant answered unsupported it is skipped for the life of the worker.
        """
        for function, args in calls:
            if (function, *args) in self.unsupported:
                continue
            value = self.get(feature, function, *args)
            if value is not None or (function, *args) not in self.unsupported:
                return value
        return None

    def fields(self, feature: str, pairs: Sequence[tuple[int, int]]) -> dict[tuple[int, int], int | float]:
        """Field values that succeeded, keyed by (field id, scope id); each entry's code checked.

        Entries answering NOT_SUPPORTED or INVALID_ARGUMENT are cached and never requested again;
        entries the driver left unpopulated are omitted this time only. A call that fails as a whole
        with an unsupported class (a binding or driver without the function) is not made again
        until a re-probe: :meth:`field_unsupported` then says yes for every pair.
        """
        if FIELD_CALL in self.unsupported:
            return {}
        wanted = [p for p in pairs if ("field", *p) not in self.unsupported]
        if not wanted:
            return {}
        try:
            entries = self.client.field_values(feature, self.uuid, self.handle, list(wanted))
        except Exception as exc:
            self.handle_error(feature, "nvmlDeviceGetFieldValues", FIELD_CALL, exc)
            return {}
        out: dict[tuple[int, int], int | float] = {}
        now_us = self.client.timestamp_us()
        for entry in entries:
            pair = (entry.field_id, entry.scope_id)
            if entry.code == errors.SUCCESS and entry.value is not None:
                if plausibility.in_future(entry.timestamp_us, now_us):
                    self._stamped_in_future(feature, entry, now_us)
                    continue
                out[pair] = entry.value
                continue
            if entry.code == UNPOPULATED:
                continue
            failure = errors.classify_entry(entry.code)
            if failure.error_class is ErrorClass.UNSUPPORTED:
                field_key: tuple[Any, ...] = ("field", *pair)
                self.unsupported[field_key] = (feature, failure.name)
            elif failure.error_class is ErrorClass.DEVICE_LOST:
                raise DeviceLost(failure, "nvmlDeviceGetFieldValues")
            else:
                self.client.errors[(feature, failure.name)] += 1
        if out:
            self.feature_ok.add(feature)
        elif wanted and all(("field", *p) in self.unsupported for p in wanted):
            self.feature_unsupported.add(feature)
        return out

    def _stamped_in_future(self, feature: str, entry: FieldValue, now_us: int) -> None:
        """A field value the driver stamped later than now: not this sample's value (omitted, counted
        in ``nvgpu_readings_dropped_total{reason="timestamp_in_future"}``, logged once per GPU)."""
        where = f"field {entry.field_id}" + (f":{entry.scope_id}" if entry.scope_id else "")
        ahead = (entry.timestamp_us - now_us) / 1e6
        drop = plausibility.Drop("timestamp_in_future", where, entry.value, f"stamped {ahead:.0f} s ahead of now")
        self.state_of(plausibility.Dropped).add(feature, drop)

    def field_unsupported(self, field_id: int, scope_id: int = 0) -> bool:
        """Whether this GPU answered unsupported for the field (or for the field-value call itself)."""
        return FIELD_CALL in self.unsupported or ("field", field_id, scope_id) in self.unsupported
