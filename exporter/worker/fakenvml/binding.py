"""FakeNvml: the scenario-driven stand-in for the ``pynvml`` module, with real faults.

The worker loads it instead of ``pynvml`` when ``NVGPU_NVML_BACKEND=fake:<scenario>``
(:func:`exporter.worker.nvml.backend.load`). It answers the pynvml functions the exporter uses from the
scenario (docs/scenarios.md), raises real ``pynvml.NVMLError`` codes, and injects faults that behave
like the real thing: a NULL read through ctypes (SIGSEGV), ``abort()`` (SIGABRT, as glibc on heap
corruption), hangs that may ignore SIGTERM.

Each domain's calls live in their own module; this class only puts them together. A call with a
new shape goes into its domain's class (or a new one listed here); a plain getter needs no code.
"""

from __future__ import annotations

from exporter.worker.fakenvml.events import EventCalls
from exporter.worker.fakenvml.fabric import FabricCalls
from exporter.worker.fakenvml.gpm import GpmCalls
from exporter.worker.fakenvml.processes import ProcessCalls

__all__ = ["FakeNvml"]


class FakeNvml(GpmCalls, FabricCalls, ProcessCalls, EventCalls):
    """pynvml look-alike answering from a scenario.

    Args:
        path: scenario JSON file.
        epoch: the ``time.monotonic()`` instant that is scenario time 0 (the supervisor's start); default: now.
        clock: the scenario and wall clock (tests); default: scenario time on the monotonic clock.

    Raises:
        exporter.common.scenarios.scenario.ScenarioError: the file is unreadable or not a valid scenario.
    """
