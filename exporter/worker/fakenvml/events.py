"""NVML event sets in the fake (docs/scenarios.md, "Events").

A scenario event is delivered by ``nvmlEventSetWait_v2`` once scenario time passes its ``at_s``,
only to a set whose GPU registered before ``at_s``: as with real NVML, events before registration
are not recorded, so a restarted worker does not see old events again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from exporter.common.nvml import errors
from exporter.common.scenarios.scenario import EVENT_TYPES
from exporter.worker.fakenvml.core import FakeCore, nvml_error

NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of an event that is not a MIG device's


class FakeEventSet:
    """An event set: which GPUs registered, when, and which scenario events were delivered."""

    def __init__(self) -> None:
        self.registered: dict[int, float] = {}  # scenario GPU -> scenario time of registration
        self.delivered: set[int] = set()  # positions in the scenario's events list


class EventCalls(FakeCore):
    """``nvmlEventSetCreate``, ``nvmlDeviceRegisterEvents``, ``nvmlEventSetWait_v2``, ``nvmlEventSetFree``."""

    def __init__(self, path: str, epoch: float | None = None, clock: Callable[[], float] | None = None) -> None:
        super().__init__(path, epoch, clock)
        self._events: list[dict[str, Any]] = self.scenario.get("events", [])

    def nvmlEventSetCreate(self) -> FakeEventSet:  # noqa: N802
        self.enter("nvmlEventSetCreate", None)
        return FakeEventSet()

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:  # noqa: N802
        self.enter("nvmlEventSetFree", None)

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, event_set: FakeEventSet) -> None:  # noqa: N802
        fn = "nvmlDeviceRegisterEvents"
        self.enter(fn, getattr(handle, "gpu", None))
        gpu = self.gpu_of(handle)
        spec = gpu["values"].get(fn)
        if spec is not None:
            self.resolve(spec, self.now())  # raises the scenario's error, if any
        supported = self.value(gpu, "nvmlDeviceGetSupportedEventTypes", ())
        if mask & ~int(supported):
            raise nvml_error(errors.NOT_SUPPORTED)
        event_set.registered[handle.gpu] = self.now()

    def nvmlEventSetWait_v2(self, event_set: FakeEventSet, timeout_ms: int) -> SimpleNamespace:  # noqa: N802
        self.enter("nvmlEventSetWait_v2", None)
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            t = self.now()
            for i, ev in enumerate(self._events):
                reg = event_set.registered.get(ev["gpu"])
                if i in event_set.delivered or reg is None or not reg <= ev["at_s"] <= t:
                    continue
                event_set.delivered.add(i)
                return SimpleNamespace(
                    device=self.handle_of(ev["gpu"]),
                    eventType=EVENT_TYPES[ev["event_type"]],
                    eventData=int(ev.get("data", 0)),
                    gpuInstanceId=NO_INSTANCE,
                    computeInstanceId=NO_INSTANCE,
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise nvml_error(errors.TIMEOUT)
            time.sleep(min(remaining, 0.05))
