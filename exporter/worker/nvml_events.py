"""The worker's NVML event thread: Xid and other device events, sent as ``event`` messages.

``nvmlEventSetCreate``, then per GPU ``nvmlDeviceGetSupportedEventTypes`` and
``nvmlDeviceRegisterEvents`` with every supported type we want (a GPU whose registration fails has
events off, the others keep them), then ``nvmlEventSetWait_v2`` in a loop with a 1 s timeout
(TIMEOUT is the normal answer; other errors back off up to 30 s). The thread has its own
breadcrumb slot, so a crash inside the wait is attributed to ``events``. Events that arrive before
registration are not recorded by NVML, so a restarted worker does not see old events again; the
supervisor owns the counters (:mod:`exporter.supervisor.xids`), which therefore survive restarts.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from exporter.common.breadcrumb import SLOT_EVENTS
from exporter.common.nvml import errors
from exporter.worker.nvml.client import DeviceClient, NvmlClient, Stopping

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
XID_EVENT = 0x8
REPROBE_EVENTS = 0x100 | 0x4000 | 0x8000  # MIG config change, GPU unavailable, GPU recovery action
ENUMERATE_EVENTS = 0x4000 | 0x8000  # GPU unavailable, GPU recovery action: a reset or removal may follow
BUS_XIDS = frozenset({79})  # "GPU has fallen off the bus": NVML may no longer enumerate it


class EventWatcher:
    """The event thread of one worker.

    Args:
        client: the sampler's client (forked to the events breadcrumb slot; shares its stop latch).
        devices: the GPUs attached at start.
        send: ``send(kind, **fields)`` to the supervisor (thread-safe).
        enabled: UUID -> whether registration succeeded (shared with the sampler's snapshots).
        reprobe: called with a GPU's UUID after an event that can change what it supports (MIG
            configuration change, GPU recovery action, GPU unavailable).
        rediscover: called with a reason after an event that can change which GPUs NVML enumerates
            (GPU unavailable, GPU recovery action, Xid 79): the sampler enumerates again.
    """

    def __init__(
        self,
        client: NvmlClient,
        devices: list[DeviceClient],
        send: Callable[..., None],
        enabled: dict[str, bool],
        reprobe: Callable[[str], None] = lambda uuid: None,
        rediscover: Callable[[str], None] = lambda why: None,
    ) -> None:
        self.client = client.fork(SLOT_EVENTS)
        self.devices = list(devices)
        self.send = send
        self.enabled = enabled
        self.reprobe = reprobe
        self.rediscover = rediscover
        self.thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._arrived: queue.SimpleQueue[DeviceClient] = queue.SimpleQueue()  # attached after the start

    def add(self, dev: DeviceClient) -> None:
        """A GPU attached after the thread started (hot-added, back from a reset): registered between
        two waits (thread-safe)."""
        self._arrived.put(dev)

    def start(self) -> None:
        """Start the thread."""
        self.thread.start()

    def join(self, timeout_s: float) -> bool:
        """Wait for the thread to end (after the stop latch is set); False if it is still in a call."""
        self.thread.join(timeout_s)
        return not self.thread.is_alive()

    def _run(self) -> None:
        try:
            event_set = self.client.raw("events", "nvmlEventSetCreate", "")
        except Stopping:
            return
        except Exception as exc:  # noqa: BLE001
            log.warning("nvmlEventSetCreate failed (%s); NVML events are off", errors.classify(exc).message)
            return
        try:
            by_handle = self._register(event_set, self.devices)
            self._wait_loop(event_set, by_handle)
        except Stopping:
            pass
        finally:
            if self.client.stop.is_set():
                try:  # past the stop latch on purpose: shutdown waits for this thread first
                    self.client.raw_during_shutdown("events", "nvmlEventSetFree", "", event_set)
                except Exception:  # noqa: BLE001 - best effort at shutdown
                    pass

    def _register(self, event_set: Any, devices: list[DeviceClient]) -> dict[int, DeviceClient]:
        by_handle: dict[int, DeviceClient] = {}
        for dev in devices:
            try:
                supported = int(self.client.raw("events", "nvmlDeviceGetSupportedEventTypes", dev.uuid, dev.handle))
                self.client.raw(
                    "events", "nvmlDeviceRegisterEvents", dev.uuid, dev.handle, supported & EVENT_MASK_WANTED, event_set
                )
            except Stopping:
                raise
            except Exception as exc:  # noqa: BLE001 - per GPU: events off for that GPU only
                self.enabled[dev.uuid] = False
                log.warning(
                    "GPU %s: NVML event registration failed (%s); events are off for this GPU",
                    dev.uuid,
                    errors.classify(exc).message,
                    extra={"uuid": dev.uuid},
                )
                continue
            self.enabled[dev.uuid] = True
            by_handle[id(dev.handle)] = dev
        return by_handle

    def _wait_loop(self, event_set: Any, by_handle: dict[int, DeviceClient]) -> None:
        backoff = 1.0
        stop = self.client.stop
        while not stop.is_set():
            arrived = []
            while not self._arrived.empty():
                arrived.append(self._arrived.get_nowait())
            if arrived:
                known = {id(d) for d in self.devices}
                fresh = [d for d in arrived if id(d) not in known]
                self.devices.extend(fresh)
                by_handle.update(self._register(event_set, fresh))
            try:
                data = self.client.raw("events", "nvmlEventSetWait_v2", "", event_set, EVENT_WAIT_MS)
            except Stopping:
                raise
            except Exception as exc:  # noqa: BLE001 - classified below
                failure = errors.classify(exc)
                if failure.code == errors.TIMEOUT:
                    backoff = 1.0
                    continue
                log.warning("nvmlEventSetWait_v2 failed (%s); retrying in %.0f s", failure.message, backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            backoff = 1.0
            found = self._device_of(data.device, by_handle)
            etype = int(data.eventType)
            if etype & REPROBE_EVENTS:
                self.reprobe(found.uuid if found else "")
            name = EVENT_TYPE_NAMES.get(etype, f"type_{etype:#x}")
            if etype & ENUMERATE_EVENTS or (etype == XID_EVENT and int(data.eventData) in BUS_XIDS):
                what = f"Xid {int(data.eventData)}" if etype == XID_EVENT else name
                self.rediscover(f"{what} on {found.uuid if found else 'a GPU'}")
            self.send(
                "event",
                ts=time.time(),
                gpu=found.index if found else None,
                uuid=found.uuid if found else "",
                event_type=name,
                xid=int(data.eventData) if etype == XID_EVENT else None,
            )

    def _device_of(self, handle: Any, by_handle: Mapping[int, DeviceClient]) -> DeviceClient | None:
        """The GPU an event's handle names: the same object, an equal handle (the fake's), or the same
        address (pynvml's handles are ctypes pointers, which compare by identity). The newest match
        wins: a GPU attached again after a reset has a new device client."""
        dev = by_handle.get(id(handle))
        if dev is not None:
            return dev
        address = _address(handle)
        for d in reversed(self.devices):
            if d.handle == handle or (address is not None and _address(d.handle) == address):
                return d
        return None


def _address(handle: Any) -> int | None:
    """The address a ctypes pointer handle holds, None for anything else."""
    import ctypes

    try:
        value: int | None = ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None
    return value
