"""Clocks (current and max, in hertz), performance state, and clock-event (throttle) reasons.

Sources: nvmlDeviceGetClockInfo / nvmlDeviceGetMaxClockInfo (MHz; NVML_CLOCK_GRAPHICS 0, SM 1,
MEM 2, VIDEO 3; the max is static and costs ~1.4 ms serialised, so it is read once per worker life),
nvmlDeviceGetPerformanceState (P0..P15, 32 = unknown), nvmlDeviceGetCurrentClocksEventReasons
(bitmask, 535+ drivers; bits from nvml.h ``nvmlClocksEventReason*``), falling back once per worker to
the older spelling nvmlDeviceGetCurrentClocksThrottleReasons (the same bits; DEPRECATED in the 13.0
header) where the binding lacks the new name (``nvgpu_nvml_api_info{call="clock_event_reasons"}``).

Default series (within the default budget of 60 per GPU): the SM and memory clocks and the SM maximum
(what a share-of-maximum panel needs; dcgm-exporter's default set has the same two clocks). With
the ``details`` feature on, also the graphics and video clocks (graphics equals SM on every data
centre GPU measured: H200 345/345 MHz idle, 1980/1980 MHz max), the other maxima (the HBM memory
clock's maximum is its current value), the performance state (P0 on an idle H200 in persistence
mode) and the point-sample clock-event flags, which alias and which the ``throttle_time`` counters
measure exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.collectors.base import mhz_to_hertz
from exporter.common.gpustate import GpuState, Lifetime
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import U64_MAX_VALUE, AtMost, Check, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "clocks"
NEEDS: tuple[str, ...] = ()
DETAILS = "details"  # the switch that adds the series outside the default budget
CLOCKS = (("graphics", 0), ("sm", 1), ("memory", 2), ("video", 3))
DEFAULT_CLOCKS = ("sm", "memory")
DEFAULT_MAX_CLOCKS = ("sm",)
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


MAX_MHZ = 10_000  # no GPU clock reaches 10 GHz (H200: SM 1980 MHz, HBM 3201 MHz at most)
# A current clock may pass its maximum a little (clock offsets); 1.5 times it is a misread.
CHECKS: tuple[Check, ...] = (
    Range("clock_mhz", low=0, high=MAX_MHZ),
    Range("max_clock_mhz", low=1, high=MAX_MHZ),
    AtMost("clock_mhz", "max_clock_mhz", factor=1.5, reason="above_max"),
    Range("pstate", low=0, high=15),
    Range("event_reasons", low=0, high=U64_MAX_VALUE),
)


@dataclass
class MaxClocks(GpuState):
    """The maximum clocks (static; ~1.4 ms to read), until the next re-probe."""

    LIFETIME = Lifetime.PROBE
    mhz: dict[str, int] | None = None


def read(dev: DeviceClient) -> Reading | None:
    details = DETAILS in dev.enabled
    current = {}
    for name, clock_type in CLOCKS:
        if not details and name not in DEFAULT_CLOCKS:
            continue
        value = dev.get(FEATURE, "nvmlDeviceGetClockInfo", clock_type)
        if value is not None:
            current[name] = int(value)
    static = dev.state_of(MaxClocks)
    maxima = static.mhz
    if maxima is None:
        maxima = {}
        for name, clock_type in CLOCKS:
            if not details and name not in DEFAULT_MAX_CLOCKS:
                continue
            value = dev.get(FEATURE, "nvmlDeviceGetMaxClockInfo", clock_type)
            if value is not None:
                maxima[name] = int(value)
        static.mhz = maxima
    pstate = reasons = None
    if details:
        pstate = dev.get(FEATURE, "nvmlDeviceGetPerformanceState")
        reasons = dev.first(
            FEATURE,
            [("nvmlDeviceGetCurrentClocksEventReasons", ()), ("nvmlDeviceGetCurrentClocksThrottleReasons", ())],
            call="clock_event_reasons",
        )
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
