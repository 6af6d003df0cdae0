"""Clocks (current and max, in hertz), performance state, and clock-event (throttle) reasons.

Sources: nvmlDeviceGetClockInfo / nvmlDeviceGetMaxClockInfo (MHz; NVML_CLOCK_GRAPHICS 0, SM 1,
MEM 2, VIDEO 3; the max is static and costs ~1.4 ms serialised, so it is read once per worker life),
nvmlDeviceGetPerformanceState (P0..P15, 32 = unknown), nvmlDeviceGetCurrentClocksEventReasons
(bitmask, 535+ drivers; bits from nvml.h ``nvmlClocksEventReason*``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.collectors.base import mhz_to_hertz
from exporter.metric import GpuKey, MetricDef

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from exporter.nvml.client import DeviceClient
    from exporter.snapshot import SystemInfo

FEATURE = "clocks"
CLOCKS = (("graphics", 0), ("sm", 1), ("memory", 2), ("video", 3))
PSTATE_UNKNOWN = 32
REASONS = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)

CLOCK = MetricDef("nvgpu_clock_hertz", "Current clock (nvmlDeviceGetClockInfo)", ("clock",))
CLOCK_MAX = MetricDef("nvgpu_clock_max_hertz", "Maximum clock (nvmlDeviceGetMaxClockInfo)", ("clock",))
PERFORMANCE_STATE = MetricDef(
    "nvgpu_performance_state", "Performance state, 0 = P0 (maximum) to 15 (nvmlDeviceGetPerformanceState)"
)
EVENT_REASON_ACTIVE = MetricDef(
    "nvgpu_clock_event_reason_active",
    "1 if this clock event (throttle) reason is active (nvmlDeviceGetCurrentClocksEventReasons)",
    ("reason",),
)
METRICS = (
    CLOCK,
    CLOCK_MAX,
    PERFORMANCE_STATE,
    EVENT_REASON_ACTIVE,
)


@dataclass(frozen=True)
class Reading:
    clock_mhz: dict[str, int]
    max_clock_mhz: dict[str, int]
    pstate: int | None
    event_reasons: int | None


def read(dev: DeviceClient) -> Reading | None:
    current = {}
    for name, clock_type in CLOCKS:
        value = dev.get(FEATURE, "nvmlDeviceGetClockInfo", clock_type)
        if value is not None:
            current[name] = int(value)
    maxima = dev.cache.get("max_clock_mhz")
    if maxima is None:
        maxima = {}
        for name, clock_type in CLOCKS:
            value = dev.get(FEATURE, "nvmlDeviceGetMaxClockInfo", clock_type)
            if value is not None:
                maxima[name] = int(value)
        dev.cache["max_clock_mhz"] = maxima
    pstate = dev.get(FEATURE, "nvmlDeviceGetPerformanceState")
    reasons = dev.get(FEATURE, "nvmlDeviceGetCurrentClocksEventReasons")
    if pstate is not None and int(pstate) == PSTATE_UNKNOWN:
        pstate = None
    r = Reading(
        current, dict(maxima), None if pstate is None else int(pstate), None if reasons is None else int(reasons)
    )
    return None if r == Reading({}, {}, None, None) else r


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    cur = CLOCK.family()
    mx = CLOCK_MAX.family()
    ps = PERFORMANCE_STATE.family()
    ev = EVENT_REASON_ACTIVE.family()
    for key, r in samples:
        for name, mhz in r.clock_mhz.items():
            cur.add(key, mhz_to_hertz(mhz), name)
        for name, mhz in r.max_clock_mhz.items():
            mx.add(key, mhz_to_hertz(mhz), name)
        ps.add(key, r.pstate)
        if r.event_reasons is not None:
            for name, bit in REASONS:
                ev.add(key, 1 if r.event_reasons & bit else 0, name)
    for fam in (cur, mx, ps, ev):
        yield from fam.done()
