"""GPU die and memory (HBM) temperature in degrees Celsius.

Sources: nvmlDeviceGetTemperatureV (570+ drivers; signed) falling back to the deprecated
nvmlDeviceGetTemperature (NVML 13 deprecates it, "will be removed in CUDA 14.0"), sensor
NVML_TEMPERATURE_GPU (0); field NVML_FI_DEV_MEMORY_TEMP (82) for memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import Check, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "temperature"
NEEDS: tuple[str, ...] = ()
NVML_TEMPERATURE_GPU = 0
NVML_FI_DEV_MEMORY_TEMP = 82

GPU_TEMPERATURE = MetricDef(
    "nvgpu_gpu_temperature_celsius", "GPU die temperature (nvmlDeviceGetTemperatureV, sensor NVML_TEMPERATURE_GPU)"
)
MEMORY_TEMPERATURE = MetricDef(
    "nvgpu_memory_temperature_celsius", "Memory (HBM) temperature (field NVML_FI_DEV_MEMORY_TEMP)"
)
METRICS = (
    GPU_TEMPERATURE,
    MEMORY_TEMPERATURE,
)


@dataclass(frozen=True)
class Reading:
    gpu_celsius: int | None
    memory_celsius: int | None


# Physical bounds: no board operates below -40 °C, and every GPU shuts down far below 150 °C (H200:
# slowdown and shutdown within 10 °C of its 87 °C limit). The deprecated unsigned call reads a
# negative value as about 4294967295.
CHECKS: tuple[Check, ...] = (Range("gpu_celsius", "memory_celsius", low=-40, high=150),)


def read(dev: DeviceClient) -> Reading | None:
    gpu = dev.first(
        FEATURE,
        [
            ("nvmlDeviceGetTemperatureV", (NVML_TEMPERATURE_GPU,)),
            ("nvmlDeviceGetTemperature", (NVML_TEMPERATURE_GPU,)),
        ],
    )
    mem = dev.fields(FEATURE, [(NVML_FI_DEV_MEMORY_TEMP, 0)]).get((NVML_FI_DEV_MEMORY_TEMP, 0))
    if gpu is None and mem is None:
        return None
    return Reading(int(gpu) if gpu is not None else None, int(mem) if mem is not None else None)


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    gpu = GPU_TEMPERATURE.family()
    mem = MEMORY_TEMPERATURE.family()
    for key, r in samples:
        gpu.add(key, r.gpu_celsius)
        mem.add(key, r.memory_celsius)
    yield from gpu.done()
    yield from mem.done()
