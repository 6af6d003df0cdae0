"""Fan speed as a ratio of the maximum (may exceed 1: it is the *intended* speed).

Sources: nvmlDeviceGetNumFans, nvmlDeviceGetFanSpeed_v2 (percent). Passive data-centre boards
(H200 SXM) answer NOT_SUPPORTED, at ~160 µs per call even then (measured on 580.159.04): the client caches
the answer and never asks again on that GPU. A board that answers the fan count (0, or a count
whose fans all answer NOT_SUPPORTED) is marked unsupported the same way, so the worker switches
the feature off when no GPU has a readable fan.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.collectors.base import percent_to_ratio
from exporter.common.gpustate import GpuState, Lifetime
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import Check, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "fan"
NEEDS: tuple[str, ...] = ()

FAN_SPEED = MetricDef(
    "nvgpu_fan_speed_ratio", "Intended fan speed as a fraction of maximum (nvmlDeviceGetFanSpeed_v2)", ("fan",)
)
METRICS = (FAN_SPEED,)


@dataclass(frozen=True)
class Reading:
    speeds_percent: tuple[int, ...]


# Not 100: nvml.h says of the fan speed "This value may exceed 100% in certain cases". Twice the
# product's maximum noise-tolerance speed, or NVML_VALUE_NOT_AVAILABLE, is no fan's intended speed.
# A fan's label is its place in the tuple, so one implausible fan costs the GPU's fan reading.
CHECKS: tuple[Check, ...] = (Range("speeds_percent", low=0, high=200),)


@dataclass
class Fans(GpuState):
    """The fan count (static: fans do not come and go), until the next re-probe."""

    LIFETIME = Lifetime.PROBE
    count: int | None = None


def read(dev: DeviceClient) -> Reading | None:
    fans = dev.state_of(Fans)
    count = fans.count
    if count is None:
        value = dev.get(FEATURE, "nvmlDeviceGetNumFans")
        if value is None:  # unsupported (cached by the client) or transient (asked again next time)
            return None
        count = fans.count = int(value)
    if count <= 0:
        # A passive board may answer 0 instead of NOT_SUPPORTED: unsupported here, said once.
        dev.nothing_to_read(FEATURE, "nvmlDeviceGetNumFans", "0 fans")
        return None
    speeds = []
    for fan in range(count):
        speed = dev.get(FEATURE, "nvmlDeviceGetFanSpeed_v2", fan)
        if speed is None:
            if all(("nvmlDeviceGetFanSpeed_v2", i) in dev.unsupported for i in range(fan + 1)):
                # Every fan asked so far answered NOT_SUPPORTED (the client logged it once): the
                # successful fan count must not keep the feature looking supported on this GPU.
                dev.nothing_to_read(FEATURE, "nvmlDeviceGetNumFans", "fan speed not supported", announce=False)
            return None
        speeds.append(int(speed))
    return Reading(tuple(speeds))


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    fam = FAN_SPEED.family()
    for key, r in samples:
        for i, speed in enumerate(r.speeds_percent):
            fam.add(key, percent_to_ratio(speed), str(i))
    yield from fam.done()
