"""Power draw, enforced limit, and total energy.

Sources: nvmlDeviceGetPowerUsage (mW; a 1-second average on Ampere except GA100 and newer),
nvmlDeviceGetEnforcedPowerLimit (mW), nvmlDeviceGetTotalEnergyConsumption (mJ since the driver was
last loaded, Volta+; ~3 ms per call and serialised — nvml-notes §3.3). Energy is exported as a
counter; it resets with a driver reload, which Prometheus' rate() handles as a counter reset.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.collectors.base import mj_to_joules, mw_to_watts
from exporter.metric import GpuKey, MetricDef

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from exporter.nvml.client import DeviceClient
    from exporter.snapshot import SystemInfo

FEATURE = "power"

USAGE = MetricDef("nvgpu_power_usage_watts", "Power draw (nvmlDeviceGetPowerUsage; 1 s average on Ampere and newer)")
LIMIT = MetricDef("nvgpu_power_limit_watts", "Enforced power limit (nvmlDeviceGetEnforcedPowerLimit)")
ENERGY = MetricDef(
    "nvgpu_energy_consumption_joules_total",
    "Energy consumed since the driver was loaded (nvmlDeviceGetTotalEnergyConsumption)",
)
METRICS = (
    USAGE,
    LIMIT,
    ENERGY,
)


@dataclass(frozen=True)
class Reading:
    usage_mw: int | None
    limit_mw: int | None
    energy_mj: int | None


def read(dev: DeviceClient) -> Reading | None:
    usage = dev.get(FEATURE, "nvmlDeviceGetPowerUsage")
    limit = dev.get(FEATURE, "nvmlDeviceGetEnforcedPowerLimit")
    energy = dev.get(FEATURE, "nvmlDeviceGetTotalEnergyConsumption")
    r = Reading(
        usage_mw=None if usage is None else int(usage),  # a non-number from the driver raises here
        limit_mw=None if limit is None else int(limit),
        energy_mj=None if energy is None else int(energy),
    )
    return None if r == Reading(None, None, None) else r


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    usage = USAGE.family()
    limit = LIMIT.family()
    energy = ENERGY.family()
    for key, r in samples:
        usage.add(key, None if r.usage_mw is None else mw_to_watts(r.usage_mw))
        limit.add(key, None if r.limit_mw is None else mw_to_watts(r.limit_mw))
        energy.add(key, None if r.energy_mj is None else mj_to_joules(r.energy_mj))
    for fam in (usage, limit, energy):
        yield from fam.done()
