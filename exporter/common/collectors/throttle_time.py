"""Cumulative time the clocks spent held down, per clock-event (throttle) reason, as counters.

``nvgpu_clock_event_reason_active`` (clocks feature) is a flag read once per sample, and a flag
read once per sample aliases: a 0.5 s hardware power brake every 10 s, sampled every 1 s on the
fake, showed the brake in 9 of 19 samples (47 %) against a true 5 %. The driver also keeps the
time spent in each reason; exported as counters in seconds, ``rate()`` gives the true share.

Sources, cheapest first (measured on H200 / 580.159.04, 2026-11-30):

- field values, one ``nvmlDeviceGetFieldValues`` call for all of them (4.5 ms for the eleven per
  GPU, nanoseconds, each entry's code checked): ``NVML_FI_DEV_PERF_POLICY_*`` 74-81 (power = SW
  power cap, thermal, sync boost, board limit, low utilization, reliability, total app clocks,
  total base clocks) and ``NVML_FI_DEV_CLOCKS_EVENT_REASON_{SW_THERM,HW_THERM,HW_POWER_BRAKE}_SLOWDOWN``
  269-271. Those three were 251-253 in the 575 header and nvidia-ml-py 12.575 and moved to 269-271
  with driver and binding 580.82 (the nvml.h of CUDA 13.1 and nvidia-ml-py 13.580.82; 580.159.04
  serves 269-271, measured); on older drivers 269-271 are other fields, so
  they are only asked for from driver 580.82 on (read once per GPU with nvmlSystemGetDriverVersion),
  and omitted before.
- ``nvmlDeviceGetViolationStatus`` per policy (0.9 ms a call, eight calls; DEPRECATED in NVML 13,
  "will be removed in CUDA 14.0"), only for a reason whose field this driver does not serve.

Counters reset when the driver reloads; ``rate()`` treats that as a counter reset. Reasons overlap
in time (the two totals contain the others; SW power cap and a thermal reason can hold at once):
never sum over ``reason``.

Default reasons (within the default budget of 60 series per GPU): the power and thermal ones and the
time below base clocks for any reason (:data:`DEFAULT_REASONS`). Sync boost (only with a sync-boost
group), board limit, low utilization (the GPU idling: ``nvgpu_gpu_utilization_ratio`` says as
much), reliability and the time below application clocks are read with the ``details`` feature.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.gpustate import GpuState, Lifetime
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import Check, Monotonic

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "throttle_time"
NEEDS: tuple[str, ...] = ()
DETAILS = "details"
DEFAULT_REASONS = frozenset(
    {
        "sw_power_cap",
        "thermal",
        "total_base_clocks",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }
)
NS_PER_S = 1e9
# Driver from which fields 269-271 are the clock-event-reason durations (nvidia-ml-py 13.580.82).
NEW_REASON_FIELDS_FROM = (580, 82)

# (reason label, field id, perf policy for nvmlDeviceGetViolationStatus or None, needs the 580.82 numbering)
Reason = tuple[str, int, int | None, bool]
REASONS: tuple[Reason, ...] = (
    ("sw_power_cap", 74, 0, False),  # NVML_FI_DEV_PERF_POLICY_POWER = ..._CLOCKS_EVENT_REASON_SW_POWER_CAP
    ("thermal", 75, 1, False),  # NVML_FI_DEV_PERF_POLICY_THERMAL
    ("sync_boost", 76, 2, False),  # NVML_FI_DEV_PERF_POLICY_SYNC_BOOST
    ("board_limit", 77, 3, False),  # NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT
    ("low_utilization", 78, 4, False),  # NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION
    ("reliability", 79, 5, False),  # NVML_FI_DEV_PERF_POLICY_RELIABILITY
    ("total_app_clocks", 80, 10, False),  # NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS: below application clocks
    ("total_base_clocks", 81, 11, False),  # NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS: below base clocks
    ("sw_thermal_slowdown", 269, None, True),  # NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN
    ("hw_thermal_slowdown", 270, None, True),  # ..._HW_THERM_SLOWDOWN
    ("hw_power_brake_slowdown", 271, None, True),  # ..._HW_POWER_BRAKE_SLOWDOWN
)

REASON_SECONDS = MetricDef(
    "nvgpu_clock_event_reason_seconds_total",
    "Time the clocks were held down by this clock event (throttle) reason since the driver loaded; rate() is "
    "the share of time; reasons overlap, do not sum (fields NVML_FI_DEV_PERF_POLICY_* 74-81 and "
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_* 269-271, ns; nvmlDeviceGetViolationStatus where a field is missing)",
    ("reason",),
)
METRICS = (REASON_SECONDS,)


@dataclass(frozen=True)
class Reading:
    durations_ns: dict[str, int]  # reason -> nanoseconds since the driver loaded


CHECKS: tuple[Check, ...] = (Monotonic("durations_ns"),)


def driver_branch(version: str) -> tuple[int, int] | None:
    """``"580.159.04"`` -> ``(580, 159)``; None for a string that does not start with two numbers."""
    match = re.match(r"\s*(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


@dataclass
class Wanted(GpuState):
    """The reasons this GPU's driver numbers as :data:`REASONS` says, until the next re-probe."""

    LIFETIME = Lifetime.PROBE
    reasons: tuple[Reason, ...] | None = None


def _wanted(dev: DeviceClient) -> tuple[Reason, ...]:
    """The reasons to ask this GPU for: the 269-271 ones only on a driver that numbers them so."""
    static = dev.state_of(Wanted)
    if static.reasons is not None:
        return static.reasons
    version = dev.call(
        FEATURE, "nvmlSystemGetDriverVersion", key=("nvmlSystemGetDriverVersion",), handle=False, discovery=True
    )
    if version is None:
        return tuple(r for r in REASONS if not r[3])  # not cached: asked again next sample
    text = version.decode() if isinstance(version, bytes) else str(version)
    branch = driver_branch(text)
    new_numbering = branch is not None and branch >= NEW_REASON_FIELDS_FROM
    wanted = tuple(r for r in REASONS if new_numbering or not r[3])
    static.reasons = wanted
    return wanted


def read(dev: DeviceClient) -> Reading | None:
    wanted = _wanted(dev)
    if DETAILS not in dev.enabled:
        wanted = tuple(r for r in wanted if r[0] in DEFAULT_REASONS)
    values = dev.fields(FEATURE, [(fid, 0) for _, fid, _, _ in wanted])
    out: dict[str, int] = {}
    for reason, fid, policy, _ in wanted:
        value = values.get((fid, 0))
        if value is not None:
            out[reason] = int(value)
        elif policy is not None and dev.field_unsupported(fid):
            status = dev.get(FEATURE, "nvmlDeviceGetViolationStatus", policy)
            if status is not None:
                out[reason] = int(status.violationTime)
    return Reading(out) if out else None


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    fam = REASON_SECONDS.family()
    for key, r in samples:
        for reason, _, _, _ in REASONS:
            ns = r.durations_ns.get(reason)
            fam.add(key, None if ns is None else ns / NS_PER_S, reason)
    yield from fam.done()
