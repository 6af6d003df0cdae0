"""Power draw by scope (GPU, module, memory), enforced limit, and total energy.

Power scope: on Grace Hopper and Grace Blackwell modules NVML can report the GPU alone or the whole
module (GPU + Grace CPU), and the two are different quantities. Series of different scopes never
share a family: each scope is its own family, and a scope NVML does not offer on a GPU is absent.

Sources: nvmlDeviceGetPowerUsage (mW, GPU scope; a 1-second average on Ampere except GA100 and
newer), field ``NVML_FI_DEV_POWER_AVERAGE`` (185, mW, 1 s average) with the power scope as scopeId:
``NVML_POWER_SCOPE_MODULE`` 1 (NVIDIA CPU modules only) and ``NVML_POWER_SCOPE_MEMORY`` 2;
nvmlDeviceGetEnforcedPowerLimit (mW), nvmlDeviceGetTotalEnergyConsumption (mJ since the driver was
last loaded, Volta+; ~3 ms per call and serialised across threads, measured). Measured on H200 /
580.159.04 (2026-11-30): field 185 answers for scope GPU (equal to
nvmlDeviceGetPowerUsage) and memory (39 W idle, 144 W under load), NOT_SUPPORTED for module; the
instant field 186 has no memory scope there, so the average is used for both.

Energy is exported as a counter; it resets with a driver reload, which Prometheus' rate() handles as
a counter reset. NVML does not say which scope the energy counter covers: the GPU on discrete boards,
possibly the whole module on Grace modules (where its rate() can exceed the GPU power gauge). Its
HELP says so; compare its rate() with the power family of the scope you expect.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.collectors.base import mj_to_joules, mw_to_watts
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import AtMost, Check, Monotonic, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "power"
NEEDS: tuple[str, ...] = ()
NVML_FI_DEV_POWER_AVERAGE = 185
NVML_POWER_SCOPE_MODULE = 1
NVML_POWER_SCOPE_MEMORY = 2
SCOPED = ((NVML_FI_DEV_POWER_AVERAGE, NVML_POWER_SCOPE_MODULE), (NVML_FI_DEV_POWER_AVERAGE, NVML_POWER_SCOPE_MEMORY))

USAGE = MetricDef(
    "nvgpu_power_usage_watts",
    "Power draw of the GPU alone, scope GPU (nvmlDeviceGetPowerUsage; 1 s average on Ampere and newer)",
)
MODULE_USAGE = MetricDef(
    "nvgpu_module_power_usage_watts",
    "Power draw of the whole module (GPU and NVIDIA CPU) on Grace modules, 1 s average; absent elsewhere "
    "(field NVML_FI_DEV_POWER_AVERAGE, scope NVML_POWER_SCOPE_MODULE)",
)
MEMORY_USAGE = MetricDef(
    "nvgpu_memory_power_usage_watts",
    "Power draw of the GPU's memory (HBM), 1 s average, where NVML reports it "
    "(field NVML_FI_DEV_POWER_AVERAGE, scope NVML_POWER_SCOPE_MEMORY)",
)
LIMIT = MetricDef("nvgpu_power_limit_watts", "Enforced power limit (nvmlDeviceGetEnforcedPowerLimit)")
ENERGY = MetricDef(
    "nvgpu_energy_consumption_joules_total",
    "Energy consumed since the driver was loaded (nvmlDeviceGetTotalEnergyConsumption). NVML does not report "
    "its scope: the GPU on discrete boards, possibly the whole module on Grace modules; compare its rate() "
    "with nvgpu_power_usage_watts and nvgpu_module_power_usage_watts",
)
METRICS = (
    USAGE,
    MODULE_USAGE,
    MEMORY_USAGE,
    LIMIT,
    ENERGY,
)


@dataclass(frozen=True)
class Reading:
    usage_mw: int | None
    limit_mw: int | None
    energy_mj: int | None
    module_usage_mw: int | None = None
    memory_usage_mw: int | None = None


MAX_MW = 10_000_000  # 10 kW: no GPU or module draws it (H200 700 W limit; a GB200 superchip about 2.7 kW)
CHECKS: tuple[Check, ...] = (
    Range("usage_mw", "module_usage_mw", "memory_usage_mw", "limit_mw", low=0, high=MAX_MW),
    AtMost("usage_mw", "limit_mw", factor=10, reason="above_limit"),
    AtMost("memory_usage_mw", "limit_mw", factor=10, reason="above_limit"),
    Monotonic("energy_mj", max_rate=MAX_MW),  # mJ per second is mW
)


def read(dev: DeviceClient) -> Reading | None:
    usage = dev.get(FEATURE, "nvmlDeviceGetPowerUsage")
    limit = dev.get(FEATURE, "nvmlDeviceGetEnforcedPowerLimit")
    energy = dev.get(FEATURE, "nvmlDeviceGetTotalEnergyConsumption")
    scoped = dev.fields(FEATURE, list(SCOPED))  # unsupported scopes are cached and not asked again
    module = scoped.get((NVML_FI_DEV_POWER_AVERAGE, NVML_POWER_SCOPE_MODULE))
    memory = scoped.get((NVML_FI_DEV_POWER_AVERAGE, NVML_POWER_SCOPE_MEMORY))
    r = Reading(
        usage_mw=None if usage is None else int(usage),  # a non-number from the driver raises here
        limit_mw=None if limit is None else int(limit),
        energy_mj=None if energy is None else int(energy),
        module_usage_mw=None if module is None else int(module),
        memory_usage_mw=None if memory is None else int(memory),
    )
    return None if r == Reading(None, None, None) else r


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    usage = USAGE.family()
    module = MODULE_USAGE.family()
    memory = MEMORY_USAGE.family()
    limit = LIMIT.family()
    energy = ENERGY.family()
    for key, r in samples:
        usage.add(key, None if r.usage_mw is None else mw_to_watts(r.usage_mw))
        module.add(key, None if r.module_usage_mw is None else mw_to_watts(r.module_usage_mw))
        memory.add(key, None if r.memory_usage_mw is None else mw_to_watts(r.memory_usage_mw))
        limit.add(key, None if r.limit_mw is None else mw_to_watts(r.limit_mw))
        energy.add(key, None if r.energy_mj is None else mj_to_joules(r.energy_mj))
    for fam in (usage, module, memory, limit, energy):
        yield from fam.done()
