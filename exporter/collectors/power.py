"""Power draw, enforced limit, and total energy.

Sources: nvmlDeviceGetPowerUsage (mW; a 1-second average on Ampere except GA100 and newer),
nvmlDeviceGetEnforcedPowerLimit (mW), nvmlDeviceGetTotalEnergyConsumption (mJ since the driver was
last loaded, Volta+; ~3 ms per call and serialised — nvml-notes §3.3). Energy is exported as a
counter; it resets with a driver reload, which Prometheus' rate() handles as a counter reset.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.collectors.base import Family, GpuKey, mj_to_joules, mw_to_watts

if TYPE_CHECKING:
    from prometheus_client.core import Metric

FEATURE = "power"


@dataclass(frozen=True)
class Reading:
    usage_mw: int | None
    limit_mw: int | None
    energy_mj: int | None


def read(dev: Any) -> Reading | None:
    usage = dev.get(FEATURE, "nvmlDeviceGetPowerUsage")
    limit = dev.get(FEATURE, "nvmlDeviceGetEnforcedPowerLimit")
    energy = dev.get(FEATURE, "nvmlDeviceGetTotalEnergyConsumption")
    r = Reading(
        usage_mw=None if usage is None else int(usage),  # a non-number from the driver raises here
        limit_mw=None if limit is None else int(limit),
        energy_mj=None if energy is None else int(energy),
    )
    return None if r == Reading(None, None, None) else r


def families(samples: Sequence[tuple[GpuKey, Reading]]) -> Iterable[Metric]:
    usage = Family("nvgpu_power_usage_watts", "Power draw (nvmlDeviceGetPowerUsage; 1 s average on Ampere and newer)")
    limit = Family("nvgpu_power_limit_watts", "Enforced power limit (nvmlDeviceGetEnforcedPowerLimit)")
    energy = Family(
        "nvgpu_energy_consumption_joules",
        "Energy consumed since the driver was loaded (nvmlDeviceGetTotalEnergyConsumption)",
        counter=True,
    )
    for key, r in samples:
        usage.add(key, None if r.usage_mw is None else mw_to_watts(r.usage_mw))
        limit.add(key, None if r.limit_mw is None else mw_to_watts(r.limit_mw))
        energy.add(key, None if r.energy_mj is None else mj_to_joules(r.energy_mj))
    for fam in (usage, limit, energy):
        yield from fam.done()
