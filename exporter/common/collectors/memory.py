"""Framebuffer and BAR1 memory in bytes.

Sources: nvmlDeviceGetMemoryInfo with ``version=nvmlMemory_v2`` (C ``nvmlDeviceGetMemoryInfo_v2``,
in every header from CUDA 12.2 / R535; ``used`` excludes the driver's ``reserved`` memory, as
nvidia-smi shows it; idle H200: v1 used 644,939,776 = v2 reserved, v2 used 0, measured on
580.159.04), falling back to v1 when v2 is not there (a binding or driver without it): then
``used`` includes the reserved memory and there is no reserved series, the documented difference
(the reading says so in ``includes_reserved``: the stuck-context signature does not judge "empty"
by it). The choice is made once per worker and shown in ``nvgpu_nvml_api_info{call="memory"}``;
nvmlDeviceGetBAR1MemoryInfo.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import U64_MAX_VALUE, Check, Exempt, PartsAtMost, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "memory"
NEEDS: tuple[str, ...] = ()
DETAILS = "details"  # free (total - reserved - used) and BAR1: outside the default budget of 60 series per GPU
NVML_MEMORY_V2 = 0x02000028  # sizeof(nvmlMemory_v2_t) | 2 << 24
_SRC = "nvmlDeviceGetMemoryInfo, v2 when available"

USED = MetricDef(
    "nvgpu_memory_used_bytes", f"Framebuffer memory used by processes, excluding driver-reserved memory on v2 ({_SRC})"
)
FREE = MetricDef("nvgpu_memory_free_bytes", f"Framebuffer memory free ({_SRC})")
RESERVED = MetricDef(
    "nvgpu_memory_reserved_bytes", "Framebuffer memory reserved by the driver (nvmlDeviceGetMemoryInfo v2)"
)
TOTAL = MetricDef("nvgpu_memory_total_bytes", f"Framebuffer memory total ({_SRC})")
BAR1_USED = MetricDef("nvgpu_bar1_memory_used_bytes", "BAR1 memory used (nvmlDeviceGetBAR1MemoryInfo)")
BAR1_TOTAL = MetricDef("nvgpu_bar1_memory_total_bytes", "BAR1 memory total (nvmlDeviceGetBAR1MemoryInfo)")
METRICS = (
    USED,
    FREE,
    RESERVED,
    TOTAL,
    BAR1_USED,
    BAR1_TOTAL,
)


@dataclass(frozen=True)
class Reading:
    total_bytes: int | None
    used_bytes: int | None
    free_bytes: int | None
    reserved_bytes: int | None
    bar1_total_bytes: int | None
    bar1_used_bytes: int | None
    includes_reserved: bool = False  # v1: used counts the driver-reserved memory


V2_KEY = ("nvmlDeviceGetMemoryInfo", ("version", NVML_MEMORY_V2))  # the device client's cache key of v2


# v2: used + free + reserved = total, byte for byte (idle H200: 0 + 150,109,880,320 + 644,939,776 =
# 150,754,820,096, measured on 580.159.04); v1: used (with the reservation) + free = total.
CHECKS: tuple[Check, ...] = (
    Range(
        "total_bytes",
        "used_bytes",
        "free_bytes",
        "reserved_bytes",
        "bar1_total_bytes",
        "bar1_used_bytes",
        low=0,
        high=U64_MAX_VALUE,
    ),
    PartsAtMost("used_bytes", "free_bytes", "reserved_bytes", total="total_bytes"),
    PartsAtMost("bar1_used_bytes", total="bar1_total_bytes"),
    Exempt("includes_reserved", why="a flag: which memory info version answered"),
)


def read(dev: DeviceClient) -> Reading | None:
    mem = None
    if V2_KEY not in dev.unsupported:
        mem = dev.get(FEATURE, "nvmlDeviceGetMemoryInfo", version=NVML_MEMORY_V2)
    reserved = getattr(mem, "reserved", None) if mem is not None else None
    v1 = mem is None
    if mem is not None:
        dev.chose("memory", "nvmlDeviceGetMemoryInfo_v2", "2")
    else:
        mem = dev.get(FEATURE, "nvmlDeviceGetMemoryInfo")
        why = dev.unsupported.get(V2_KEY)
        if mem is not None and why is not None:  # v2 unsupported, not merely failing this sample
            dev.chose("memory", "nvmlDeviceGetMemoryInfo", "1", why[1].lower())
    details = DETAILS in dev.enabled
    bar1 = dev.get(FEATURE, "nvmlDeviceGetBAR1MemoryInfo") if details else None
    if mem is None and bar1 is None:
        return None
    return Reading(
        total_bytes=int(mem.total) if mem is not None else None,
        used_bytes=int(mem.used) if mem is not None else None,
        free_bytes=int(mem.free) if mem is not None and details else None,
        reserved_bytes=int(reserved) if reserved is not None else None,
        bar1_total_bytes=int(bar1.bar1Total) if bar1 is not None else None,
        bar1_used_bytes=int(bar1.bar1Used) if bar1 is not None else None,
        includes_reserved=v1 and mem is not None,
    )


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    used = USED.family()
    free = FREE.family()
    reserved = RESERVED.family()
    total = TOTAL.family()
    b_used = BAR1_USED.family()
    b_total = BAR1_TOTAL.family()
    for key, r in samples:
        used.add(key, r.used_bytes)
        free.add(key, r.free_bytes)
        reserved.add(key, r.reserved_bytes)
        total.add(key, r.total_bytes)
        b_used.add(key, r.bar1_used_bytes)
        b_total.add(key, r.bar1_total_bytes)
    for fam in (used, free, reserved, total, b_used, b_total):
        yield from fam.done()
