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

The module's own limit: field ``NVML_FI_DEV_POWER_CURRENT_LIMIT`` (190) with the module scope (a
GB300 tray: 2900 W for the module against 1400 W for the GPU, NVIDIA/k8s-test-infra#676), where NVML
reports it; the GPU's limit stays nvmlDeviceGetEnforcedPowerLimit.

Energy is exported as a counter; it resets with a driver reload, which Prometheus' rate() handles as
a counter reset. NVML does not say which scope nvmlDeviceGetTotalEnergyConsumption covers: the GPU on
discrete boards; on a Grace Hopper module the whole module (CPU, GPU, memory: ml-energy/zeus#172,
where its rate() exceeds the GPU power gauge). So its scope is decided per GPU once per re-probe: a
GPU whose module power (185, module scope) answers is on a Grace module, and its counter goes to
``nvgpu_module_energy_consumption_joules_total``, next to the module power it can be compared with;
elsewhere it is ``nvgpu_energy_consumption_joules_total``, the GPU's. For Grace Blackwell (GB200) no
public source says the scope; it is taken to be the module's, as on GH200, and the HELP says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.collectors.base import mj_to_joules, mw_to_watts
from exporter.common.gpustate import GpuState, Lifetime
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import AtMost, Check, Exempt, Monotonic, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "power"
NEEDS: tuple[str, ...] = ()
NVML_FI_DEV_POWER_AVERAGE = 185
NVML_FI_DEV_POWER_CURRENT_LIMIT = 190
NVML_POWER_SCOPE_MODULE = 1
NVML_POWER_SCOPE_MEMORY = 2
SCOPED = (
    (NVML_FI_DEV_POWER_AVERAGE, NVML_POWER_SCOPE_MODULE),
    (NVML_FI_DEV_POWER_AVERAGE, NVML_POWER_SCOPE_MEMORY),
    (NVML_FI_DEV_POWER_CURRENT_LIMIT, NVML_POWER_SCOPE_MODULE),
)

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
LIMIT = MetricDef("nvgpu_power_limit_watts", "Enforced power limit of the GPU (nvmlDeviceGetEnforcedPowerLimit)")
MODULE_LIMIT = MetricDef(
    "nvgpu_module_power_limit_watts",
    "Power limit of the whole module (GPU and NVIDIA CPU) on Grace modules; absent elsewhere "
    "(field NVML_FI_DEV_POWER_CURRENT_LIMIT, scope NVML_POWER_SCOPE_MODULE)",
)
ENERGY = MetricDef(
    "nvgpu_energy_consumption_joules_total",
    "Energy the GPU consumed since the driver was loaded, on boards without an NVIDIA CPU "
    "(nvmlDeviceGetTotalEnergyConsumption); rate() compares with nvgpu_power_usage_watts",
)
MODULE_ENERGY = MetricDef(
    "nvgpu_module_energy_consumption_joules_total",
    "Energy the whole Grace module (GPU, CPU, memory) consumed since the driver was loaded "
    "(nvmlDeviceGetTotalEnergyConsumption on a GPU whose module power NVML reports: module scope on GH200, "
    "ml-energy/zeus#172; taken to be the same on GB200, for which no source says); rate() compares with "
    "nvgpu_module_power_usage_watts, not with the GPU's power",
)
METRICS = (
    USAGE,
    MODULE_USAGE,
    MEMORY_USAGE,
    LIMIT,
    MODULE_LIMIT,
    ENERGY,
    MODULE_ENERGY,
)


@dataclass(frozen=True)
class Reading:
    usage_mw: int | None
    limit_mw: int | None
    energy_mj: int | None
    module_usage_mw: int | None = None
    memory_usage_mw: int | None = None
    module_limit_mw: int | None = None
    energy_is_module: bool = False  # the energy counter covers the Grace module (see the module docstring)


@dataclass
class Scope(GpuState):
    """Whether the GPU is on a Grace module (its module power answers), decided once per re-probe."""

    LIFETIME = Lifetime.PROBE
    grace_module: bool | None = None


MAX_MW = 10_000_000  # 10 kW: no GPU or module draws it (H200 700 W limit; a GB200 superchip about 2.7 kW)
CHECKS: tuple[Check, ...] = (
    Range("usage_mw", "module_usage_mw", "memory_usage_mw", "limit_mw", "module_limit_mw", low=0, high=MAX_MW),
    Exempt("energy_is_module", why="a flag: which family the energy counter goes to"),
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
    module_limit = scoped.get((NVML_FI_DEV_POWER_CURRENT_LIMIT, NVML_POWER_SCOPE_MODULE))
    scope = dev.state_of(Scope)
    if scope.grace_module is None or (module is not None and not scope.grace_module):
        if module is not None:
            scope.grace_module = True
        elif dev.field_unsupported(NVML_FI_DEV_POWER_AVERAGE, NVML_POWER_SCOPE_MODULE):
            scope.grace_module = False  # a transient miss decides nothing
    r = Reading(
        usage_mw=None if usage is None else int(usage),  # a non-number from the driver raises here
        limit_mw=None if limit is None else int(limit),
        # until the scope is known (a transient answer of the module field) the counter is not shown:
        # it would land in the wrong scope's family for a sample
        energy_mj=None if energy is None or scope.grace_module is None else int(energy),
        module_usage_mw=None if module is None else int(module),
        memory_usage_mw=None if memory is None else int(memory),
        module_limit_mw=None if module_limit is None else int(module_limit),
        energy_is_module=bool(scope.grace_module),
    )
    return None if r == Reading(None, None, None, energy_is_module=r.energy_is_module) else r


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    usage = USAGE.family()
    module = MODULE_USAGE.family()
    memory = MEMORY_USAGE.family()
    limit = LIMIT.family()
    module_limit = MODULE_LIMIT.family()
    energy = ENERGY.family()
    module_energy = MODULE_ENERGY.family()
    for key, r in samples:
        usage.add(key, None if r.usage_mw is None else mw_to_watts(r.usage_mw))
        module.add(key, None if r.module_usage_mw is None else mw_to_watts(r.module_usage_mw))
        memory.add(key, None if r.memory_usage_mw is None else mw_to_watts(r.memory_usage_mw))
        limit.add(key, None if r.limit_mw is None else mw_to_watts(r.limit_mw))
        module_limit.add(key, None if r.module_limit_mw is None else mw_to_watts(r.module_limit_mw))
        joules = None if r.energy_mj is None else mj_to_joules(r.energy_mj)
        (module_energy if r.energy_is_module else energy).add(key, joules)
    for fam in (usage, module, memory, limit, module_limit, energy, module_energy):
        yield from fam.done()
