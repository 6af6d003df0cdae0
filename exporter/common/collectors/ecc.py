"""ECC mode (current and pending) and total corrected / uncorrected error counters.

Sources: nvmlDeviceGetEccMode ([current, pending]; NOT_SUPPORTED on GeForce and most RTX; pending
differs from current after ``nvidia-smi -e`` until the next GPU reset or reboot),
nvmlDeviceGetTotalEccErrors(errorType: NVML_MEMORY_ERROR_TYPE_CORRECTED 0 / UNCORRECTED 1,
counterType: NVML_VOLATILE_ECC 0 / NVML_AGGREGATE_ECC 1). Counters are read only when ECC is
enabled.

The two counter types are two families, not one family with a ``counter_type`` label: the
volatile count (since the driver was loaded; a GPU reset or driver reload clears it) is part of
the aggregate count (the board's life, kept in the inforom), so a ``sum()`` over both counted
every error twice. The volatile family's standing value is what the uncorrectable-ECC alert reads
(deploy/prometheus/rules.yaml): errors counted before the exporter started never "increase".

The aggregate (lifetime) counters are read only with the ``details`` feature on (the default
budget is 60 series per GPU): they are the board's history, which no alert reads; the
volatile counters are the state to act on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import Check, Exempt, Monotonic

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "ecc"
NEEDS: tuple[str, ...] = ()
DETAILS = "details"
ERROR_TYPES = (("corrected", 0), ("uncorrected", 1))
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1

ECC_ENABLED = MetricDef("nvgpu_ecc_enabled", "1 if ECC is currently enabled (nvmlDeviceGetEccMode, current)")
ECC_PENDING = MetricDef(
    "nvgpu_ecc_pending_enabled",
    "1 if ECC will be enabled after the next GPU reset or reboot (nvmlDeviceGetEccMode, pending); "
    "differs from nvgpu_ecc_enabled while a mode change waits for that reset",
)
VOLATILE_ERRORS = MetricDef(
    "nvgpu_ecc_volatile_errors_total",
    "ECC errors since the driver was loaded; a GPU reset or driver reload clears it "
    "(nvmlDeviceGetTotalEccErrors, NVML_VOLATILE_ECC)",
    ("error_type",),
)
AGGREGATE_ERRORS = MetricDef(
    "nvgpu_ecc_aggregate_errors_total",
    "ECC errors over the board's life, kept in the inforom; includes the volatile count, do not add the two "
    "(nvmlDeviceGetTotalEccErrors, NVML_AGGREGATE_ECC)",
    ("error_type",),
)
METRICS = (
    ECC_ENABLED,
    ECC_PENDING,
    VOLATILE_ERRORS,
    AGGREGATE_ERRORS,
)


@dataclass(frozen=True)
class Reading:
    enabled: bool
    pending_enabled: bool | None
    volatile: dict[str, int]  # error type -> count since driver load
    aggregate: dict[str, int]  # error type -> lifetime count


CHECKS: tuple[Check, ...] = (
    Exempt("enabled", "pending_enabled", why="flags"),
    Monotonic("volatile", "aggregate"),
)


def read(dev: DeviceClient) -> Reading | None:
    mode = dev.get(FEATURE, "nvmlDeviceGetEccMode")
    if mode is None:
        return None
    enabled = bool(mode[0])
    pending = bool(mode[1]) if len(mode) > 1 else None
    counts: dict[int, dict[str, int]] = {NVML_VOLATILE_ECC: {}, NVML_AGGREGATE_ECC: {}}
    types = (NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC) if DETAILS in dev.enabled else (NVML_VOLATILE_ECC,)
    if enabled:
        for etype, e in ERROR_TYPES:
            for counter_type in types:
                out = counts[counter_type]
                value = dev.get(FEATURE, "nvmlDeviceGetTotalEccErrors", e, counter_type)
                if value is not None:
                    out[etype] = int(value)
    return Reading(enabled, pending, counts[NVML_VOLATILE_ECC], counts[NVML_AGGREGATE_ECC])


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    mode = ECC_ENABLED.family()
    pending = ECC_PENDING.family()
    volatile = VOLATILE_ERRORS.family()
    aggregate = AGGREGATE_ERRORS.family()
    for key, r in samples:
        mode.add(key, int(r.enabled))
        pending.add(key, None if r.pending_enabled is None else int(r.pending_enabled))
        for etype, value in r.volatile.items():
            volatile.add(key, value, etype)
        for etype, value in r.aggregate.items():
            aggregate.add(key, value, etype)
    for fam in (mode, pending, volatile, aggregate):
        yield from fam.done()
