"""ECC mode and total corrected / uncorrected error counters, volatile and aggregate.

Sources: nvmlDeviceGetEccMode ([current, pending]; NOT_SUPPORTED on GeForce and most RTX),
nvmlDeviceGetTotalEccErrors(errorType: NVML_MEMORY_ERROR_TYPE_CORRECTED 0 / UNCORRECTED 1,
counterType: NVML_VOLATILE_ECC 0 (since driver load) / NVML_AGGREGATE_ECC 1 (lifetime, inforom)).
Counters are read only when ECC is enabled.
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

FEATURE = "ecc"
ERROR_TYPES = (("corrected", 0), ("uncorrected", 1))
COUNTER_TYPES = (("volatile", 0), ("aggregate", 1))

ECC_ENABLED = MetricDef("nvgpu_ecc_enabled", "1 if ECC is currently enabled (nvmlDeviceGetEccMode)")
ECC_ERRORS = MetricDef(
    "nvgpu_ecc_errors_total",
    "ECC errors; volatile since driver load, aggregate over the board's life (nvmlDeviceGetTotalEccErrors)",
    ("error_type", "counter_type"),
)
METRICS = (
    ECC_ENABLED,
    ECC_ERRORS,
)


@dataclass(frozen=True)
class Reading:
    enabled: bool | None
    errors: dict[str, int]  # "<error_type>/<counter_type>" -> count


def read(dev: DeviceClient) -> Reading | None:
    mode = dev.get(FEATURE, "nvmlDeviceGetEccMode")
    if mode is None:
        return None
    enabled = bool(mode[0])
    counts: dict[str, int] = {}
    if enabled:
        for etype, e in ERROR_TYPES:
            for ctype, c in COUNTER_TYPES:
                value = dev.get(FEATURE, "nvmlDeviceGetTotalEccErrors", e, c)
                if value is not None:
                    counts[f"{etype}/{ctype}"] = int(value)
    return Reading(enabled, counts)


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    mode = ECC_ENABLED.family()
    errs = ECC_ERRORS.family()
    for key, r in samples:
        mode.add(key, None if r.enabled is None else int(r.enabled))
        for name, value in r.errors.items():
            etype, ctype = name.split("/")
            errs.add(key, value, etype, ctype)
    yield from mode.done()
    yield from errs.done()
