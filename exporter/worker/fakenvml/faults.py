"""The scenario's faults (docs/scenarios.md, "Faults"), and the real crash the fake dies by.

Each fault matches calls (function, GPU, fields, time window, call numbers) and acts before the
value lookup: an NVML error, a real SIGSEGV (a NULL read through ctypes), ``abort()`` (SIGABRT, as
glibc on heap corruption), ``os._exit``, or a hang or delay that may ignore SIGTERM.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def crash_segfault() -> None:
    """Die by a real SIGSEGV: read address 0 through ctypes."""
    ctypes.string_at(0)


class Faults:
    """The scenario's ``faults`` list, applied to each call in order.

    Args:
        faults: the scenario's fault objects (validated by :mod:`exporter.common.scenarios.scenario`).
        error: builds the exception an ``"action": "error"`` fault raises from its ``error``
            (an NVML error name or code).
    """

    def __init__(self, faults: list[dict[str, Any]], error: Callable[[int | str], BaseException]) -> None:
        self._faults = faults
        self._error = error
        self._exclusive = threading.Lock()  # "exclusive": true: one such delay at a time (a driver lock)

    def apply(self, fn: str, gpu: int | None, count: int, fields: Sequence[int], t: float) -> None:
        """Act on every fault that matches this call, in order.

        Args:
            fn: the pynvml function name.
            gpu: GPU index of the handle argument, None for calls without one.
            count: this call's 1-based number among the calls of ``fn`` in this process.
            fields: the field ids of an ``nvmlDeviceGetFieldValues`` call, else empty.
            t: scenario time in seconds.
        """
        for fault in self._faults:
            if self._matches(fault, fn, gpu, count, fields, t):
                if fault.get("exclusive"):
                    with self._exclusive:
                        self._act(fault)
                else:
                    self._act(fault)

    @staticmethod
    def _matches(
        fault: Mapping[str, Any], fn: str, gpu: int | None, count: int, fields: Sequence[int], t: float
    ) -> bool:
        name = fault.get("function", "*")
        return (
            (name == "*" or name == fn)
            and ("gpu" not in fault or fault["gpu"] == gpu)
            and ("fields" not in fault or bool(set(fault["fields"]) & set(fields)))
            and ("from_s" not in fault or t >= fault["from_s"])
            and ("until_s" not in fault or t < fault["until_s"])
            and ("calls" not in fault or count in fault["calls"])
            and ("after_calls" not in fault or count >= fault["after_calls"])
        )

    def _act(self, fault: Mapping[str, Any]) -> None:
        action = fault["action"]
        if action == "error":
            raise self._error(fault["error"])
        if action == "segfault":
            crash_segfault()
        if action == "abort":
            os.abort()
        if action == "exit":
            os._exit(int(fault.get("code", 1)))
        if action in ("hang", "delay"):
            if fault.get("ignore_sigterm"):
                if threading.current_thread() is threading.main_thread():
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                else:  # only the main thread may set handlers; keep SIGTERM away from this thread
                    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            seconds = fault.get("seconds")
            deadline = None if seconds is None else time.monotonic() + float(seconds)
            while deadline is None or time.monotonic() < deadline:
                time.sleep(0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic())))
