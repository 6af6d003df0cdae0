"""Compute processes per GPU: count and the memory they use.

Sources: nvmlDeviceGetComputeRunningProcesses_v3, falling back to _v2 when the driver lacks the
``_v3`` symbol (an old driver under new bindings); when neither exists the feature is
unsupported. ``usedGpuMemory`` is None (pynvml's translation of NVML_VALUE_NOT_AVAILABLE) or, from
other paths, 2^64-1 when unknown: such values are not summed, and no value of 2^63 or more is
exported. Instance ids are 0xFFFFFFFF on a non-MIG GPU and are not exported as labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.metric import GpuKey, MetricDef

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from exporter.nvml.client import DeviceClient
    from exporter.snapshot import SystemInfo

FEATURE = "processes"
VALUE_NOT_AVAILABLE_LIMIT = 1 << 63  # anything this large is a sentinel, not a byte count

COUNT = MetricDef("nvgpu_compute_processes", "Compute processes on the GPU (nvmlDeviceGetComputeRunningProcesses)")
MEMORY_USED = MetricDef(
    "nvgpu_compute_processes_memory_used_bytes",
    "Memory used by compute processes, where readable (nvmlDeviceGetComputeRunningProcesses)",
)
METRICS = (
    COUNT,
    MEMORY_USED,
)


@dataclass(frozen=True)
class Reading:
    count: int
    memory_used_bytes: int | None


def read(dev: DeviceClient) -> Reading | None:
    procs = dev.first(
        FEATURE,
        [
            ("nvmlDeviceGetComputeRunningProcesses_v3", ()),
            ("nvmlDeviceGetComputeRunningProcesses_v2", ()),
        ],
    )
    if procs is None:
        return None
    total = 0
    known = False
    for proc in procs:
        used = getattr(proc, "usedGpuMemory", None)
        if isinstance(used, int) and 0 <= used < VALUE_NOT_AVAILABLE_LIMIT:
            total += used
            known = True
    return Reading(len(procs), total if known or not procs else None)


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    count = COUNT.family()
    mem = MEMORY_USED.family()
    for key, r in samples:
        count.add(key, r.count)
        mem.add(key, r.memory_used_bytes)
    yield from count.done()
    yield from mem.done()
