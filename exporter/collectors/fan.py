"""Fan speed as a ratio of the maximum (may exceed 1: it is the *intended* speed).

Sources: nvmlDeviceGetNumFans, nvmlDeviceGetFanSpeed_v2 (percent). Passive data-centre boards
(H200 SXM) answer NOT_SUPPORTED, at ~160 µs per call even then (nvml-notes §3.2): the client caches
the answer and never asks again on that GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import Metric

from exporter.collectors.base import Family, GpuKey, percent_to_ratio

FEATURE = "fan"


@dataclass(frozen=True)
class Reading:
    speeds_percent: tuple[int, ...]


def read(dev: Any) -> Reading | None:
    count = dev.get(FEATURE, "nvmlDeviceGetNumFans")
    if not count:
        return None
    speeds = []
    for fan in range(int(count)):
        speed = dev.get(FEATURE, "nvmlDeviceGetFanSpeed_v2", fan)
        if speed is None:
            return None
        speeds.append(int(speed))
    return Reading(tuple(speeds))


def families(samples: Sequence[tuple[GpuKey, Reading]]) -> Iterable[Metric]:
    fam = Family("nvgpu_fan_speed_ratio", "Intended fan speed as a fraction of maximum (nvmlDeviceGetFanSpeed_v2)", ("fan",))
    for key, r in samples:
        for i, speed in enumerate(r.speeds_percent):
            fam.add(key, percent_to_ratio(speed), str(i))
    yield from fam.done()
