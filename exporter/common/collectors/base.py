"""What a collector is, and unit conversion in one visible place.

A collector is a module with (checked by ``mypy --strict`` through :class:`Collector`):

- ``FEATURE``: its feature name (a key of ``guards.featuretable.FEATURES``);
- ``NEEDS``: the features whose collectors must run before it in a GPU's sample pass, because its
  ``read`` uses what they keep about the GPU (``utilization`` and ``gpm`` read the MIG layout:
  ``(mig.FEATURE,)``); ``()`` for most. The registry's order is checked against it
  (:func:`exporter.common.collectors.order_problems`);
- ``Reading``: a frozen dataclass in NVML's native units, field names carrying the unit
  (``usage_mw``, ``energy_mj``, ``clock_mhz``);
- ``METRICS``: the :class:`~exporter.common.metric.MetricDef` of every family it can emit;
- ``CHECKS``: what each field of its ``Reading`` can hold (:mod:`exporter.common.plausibility`: ranges,
  parts of a total, limits, counters that never decrease, or an ``Exempt`` with the reason), applied
  by the worker right after ``read()``; a value that fails is dropped and counted, never exported;
- ``read(dev: DeviceClient) -> Reading | None``: runs in the worker. NVML errors are handled by the
  device client (a missing value is None); ``DeviceLost`` and ``NvmlFatal`` propagate;
- ``families(samples, system) -> Iterable[Metric]``: runs in the supervisor, pure. ``samples`` is
  a list of (``GpuKey``, ``Reading``) for every GPU that produced a reading in the snapshot;
  ``system`` carries the versions (:class:`SystemInfo`; identity uses them).

What a collector remembers about a GPU between passes is declared as a state class and reached
through ``dev.state_of(Kind)`` (:mod:`exporter.common.gpustate`), never a module global.

Conversions to base units happen only in ``families()``, through the helpers below.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric
    from exporter.common.metric import GpuKey, MetricDef
    from exporter.common.plausibility import Check
    from exporter.worker.nvml.client import DeviceClient


@dataclass(frozen=True)
class SystemInfo:
    """Versions the worker read after ``nvmlInit`` (empty strings when unknown); every snapshot
    carries them and ``families()`` receives them.

    Attributes:
        driver_version: ``nvmlSystemGetDriverVersion``, e.g. ``580.159.04``.
        nvml_version: ``nvmlSystemGetNVMLVersion``, e.g. ``13.580.159.04``.
        cuda_driver_version: ``nvmlSystemGetCudaDriverVersion`` as ``major.minor``.
        nvidia_ml_py_version: the installed binding's distribution version.
    """

    driver_version: str = ""
    nvml_version: str = ""
    cuda_driver_version: str = ""
    nvidia_ml_py_version: str = ""


# Value shapes in the processes collector's Reading: part of the snapshot (decoded in the supervisor),
# computed in the worker by exporter.worker.process_attribution. None = unknown.
Usage = tuple[int | None, int | None, int | None, int | None, int | None]
"""One process: (memory bytes, SM %, memory %, encoder %, decoder %)."""
Other = tuple[int, int | None, int | None, int | None, int | None, int | None]
"""The processes past the cap summed: (count, memory bytes, SM %, memory %, encoder %, decoder %)."""
PodUsage = tuple[int | None, int | None, int]
"""One pod: (memory bytes, SM %, processes)."""


class Collector(Protocol):
    """The shape of a collector module (see the module docstring)."""

    @property
    def FEATURE(self) -> str: ...  # noqa: N802 - module constants

    @property
    def NEEDS(self) -> tuple[str, ...]: ...  # noqa: N802

    @property
    def Reading(self) -> type[Any]: ...  # noqa: N802

    @property
    def METRICS(self) -> tuple[MetricDef, ...]: ...  # noqa: N802

    @property
    def CHECKS(self) -> tuple[Check, ...]: ...  # noqa: N802

    def read(self, dev: DeviceClient) -> Any: ...

    def families(self, samples: Sequence[tuple[GpuKey, Any]], system: SystemInfo) -> Iterable[Metric]: ...


def mw_to_watts(mw: float) -> float:
    """Milliwatts (NVML power) to watts."""
    return mw / 1000.0


def mj_to_joules(mj: float) -> float:
    """Millijoules (NVML energy) to joules."""
    return mj / 1000.0


def mhz_to_hertz(mhz: float) -> float:
    """Megahertz (NVML clocks) to hertz."""
    return mhz * 1_000_000.0


def percent_to_ratio(percent: float) -> float:
    """Percent (NVML utilization, fan) to a 0..1 ratio."""
    return percent / 100.0


def kib_to_bytes(kib: int) -> int:
    """KiB (NVLink throughput fields 138-141) to bytes."""
    return kib * 1024
