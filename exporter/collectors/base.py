"""Shared pieces of collectors: unit conversion in one visible place, family builders.

A collector module defines ``FEATURE`` (its feature name), a frozen ``Reading`` dataclass in NVML's
native units (field names carry the unit), ``read(dev) -> Reading | None`` (runs in the worker; may
raise DeviceLost / NvmlFatal, everything else is a missing value), and
``families(samples) -> Iterable[Metric]`` (runs in the supervisor; pure). ``samples`` is a list of
(``GpuKey``, ``Reading``) for every GPU that produced a reading in the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # the worker imports collectors for read(); only the supervisor renders
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

GPU_LABELS = ("gpu", "uuid")


class GpuKey(NamedTuple):
    """Labels every per-GPU series carries."""

    gpu: str
    uuid: str


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


class Family:
    """Builds one metric family over GPUs; adds nothing for a None value."""

    def __init__(self, name: str, doc: str, extra_labels: Sequence[str] = (), counter: bool = False) -> None:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels = [*GPU_LABELS, *extra_labels]
        self.metric: CounterMetricFamily | GaugeMetricFamily
        if counter:
            self.metric = CounterMetricFamily(name, doc, labels=labels)
        else:
            self.metric = GaugeMetricFamily(name, doc, labels=labels)
        self.counter = counter

    def add(self, key: GpuKey, value: float | int | bool | None, *extra: str) -> None:
        """Add one sample unless ``value`` is None."""
        if value is None:
            return
        self.metric.add_metric([key.gpu, key.uuid, *extra], float(value))

    def done(self) -> Iterable[Metric]:
        """Yield the family if it holds any sample."""
        if self.metric.samples:
            yield self.metric
