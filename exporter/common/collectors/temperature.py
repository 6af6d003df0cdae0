"""GPU die and memory (HBM) temperature, the temperature thresholds, and the margin to them, in °C.

Sources: nvmlDeviceGetTemperatureV (570+ drivers, nvidia-ml-py 12.570+; signed) falling back to the
deprecated nvmlDeviceGetTemperature (NVML 13 deprecates it, "will be removed in CUDA 14.0") where
the driver or the binding lacks the V call (R535, R550: FUNCTION_NOT_FOUND), chosen once per worker
(``nvgpu_nvml_api_info{call="temperature"}``), sensor NVML_TEMPERATURE_GPU (0); field
NVML_FI_DEV_MEMORY_TEMP (82) for memory (not exposed on GDDR boards: absent there).

Thresholds: nvmlDeviceGetTemperatureThreshold(device, type) with
``NVML_TEMPERATURE_THRESHOLD_SHUTDOWN`` 0, ``SLOWDOWN`` 1, ``MEM_MAX`` 2, ``GPU_MAX`` 3 (°C; static:
an answer is kept until the next re-probe, NOT_SUPPORTED too, a transient failure is asked again next
sample; in every header from 12.2). On Ada and later the header calls this call "no
longer the preferred interface" for them, pointing to fields 193-196
(``NVML_FI_DEV_TEMPERATURE_*_TLIMIT``), which are on the T.Limit scale (degrees relative to the GPU's
maximum operating temperature: H200 -8, -2, 0 where the call gives 95, 89, 87 °C, measured) and cannot
be turned into °C without that maximum; so the call is used, and a threshold it does not answer is
absent. Measured on H200 / 580.159.04: shutdown 95, slowdown 89, GPU max 87 °C.

Margins, the series to alert on instead of a fixed temperature (a fixed number is wrong for some
board: 85 °C is far from an H200's slowdown at 89 °C and past an L4's): the GPU's margin is
nvmlDeviceGetMarginTemperature ("the thermal margin temperature (distance to nearest slowdown
threshold)", 12.8 header, R570+; 50 on an idle H200, measured), else the slowdown threshold minus the
GPU temperature; the memory's is the memory maximum minus the HBM temperature. They are computed
where both numbers are there, and absent otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.common.gpustate import GpuState, Lifetime
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import Check, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "temperature"
NEEDS: tuple[str, ...] = ()
DETAILS = "details"  # the thresholds themselves; the margins are default series
NVML_TEMPERATURE_GPU = 0
NVML_FI_DEV_MEMORY_TEMP = 82
# nvmlTemperatureThresholds_t: label -> type
THRESHOLDS = (("shutdown", 0), ("slowdown", 1), ("memory_max", 2), ("gpu_max", 3))

GPU_TEMPERATURE = MetricDef(
    "nvgpu_gpu_temperature_celsius", "GPU die temperature (nvmlDeviceGetTemperatureV, sensor NVML_TEMPERATURE_GPU)"
)
MEMORY_TEMPERATURE = MetricDef(
    "nvgpu_memory_temperature_celsius", "Memory (HBM) temperature (field NVML_FI_DEV_MEMORY_TEMP)"
)
THRESHOLD = MetricDef(
    "nvgpu_temperature_threshold_celsius",
    "Temperature threshold of the GPU: shutdown, slowdown, gpu_max (maximum operating), memory_max "
    "(nvmlDeviceGetTemperatureThreshold); with the details feature",
    ("threshold",),
)
MARGIN = MetricDef(
    "nvgpu_temperature_margin_celsius",
    "Degrees the GPU is below its slowdown threshold (nvmlDeviceGetMarginTemperature on R570+, else the "
    "slowdown threshold of nvmlDeviceGetTemperatureThreshold minus the GPU temperature); alert on it, not on "
    "a fixed temperature",
)
MEMORY_MARGIN = MetricDef(
    "nvgpu_memory_temperature_margin_celsius",
    "Degrees the memory (HBM) is below its maximum operating temperature (nvmlDeviceGetTemperatureThreshold "
    "NVML_TEMPERATURE_THRESHOLD_MEM_MAX minus field NVML_FI_DEV_MEMORY_TEMP)",
)
METRICS = (GPU_TEMPERATURE, MEMORY_TEMPERATURE, THRESHOLD, MARGIN, MEMORY_MARGIN)


@dataclass(frozen=True)
class Reading:
    """One GPU's temperatures in °C and margins in degrees (None: did not answer or not known).

    Attributes:
        gpu_celsius: die temperature (``nvmlDeviceGetTemperatureV`` / ``nvmlDeviceGetTemperature``).
        memory_celsius: HBM temperature (field ``NVML_FI_DEV_MEMORY_TEMP``, 82; absent on GDDR boards).
        thresholds_celsius: label (shutdown, slowdown, memory_max, gpu_max) -> °C
            (``nvmlDeviceGetTemperatureThreshold``); empty without the details feature.
        margin_celsius: degrees below slowdown (``nvmlDeviceGetMarginTemperature``, else slowdown minus
            the GPU temperature).
        memory_margin_celsius: degrees below the memory maximum (memory_max minus the HBM temperature).
    """

    gpu_celsius: int | None
    memory_celsius: int | None
    thresholds_celsius: dict[str, int] = field(default_factory=dict)  # with the details feature
    margin_celsius: int | None = None  # to slowdown: nvmlDeviceGetMarginTemperature, else computed
    memory_margin_celsius: int | None = None  # to the memory maximum


@dataclass
class Thresholds(GpuState):
    """The temperature thresholds that answered (static: label -> °C), until the next re-probe."""

    LIFETIME = Lifetime.PROBE
    celsius: dict[str, int] = field(default_factory=dict)


def _thresholds(dev: DeviceClient) -> dict[str, int]:
    """The thresholds in °C by label. Only answers are kept: a threshold NOT_SUPPORTED (cached by the
    client until a re-probe, so no call) stays absent, and one that failed transiently is asked again
    next sample instead of leaving its margin absent until the next re-probe."""
    static = dev.state_of(Thresholds)
    for name, kind in THRESHOLDS:
        if name not in static.celsius:
            value = dev.get(FEATURE, "nvmlDeviceGetTemperatureThreshold", kind)
            if value is not None:
                static.celsius[name] = int(value)
    return static.celsius


# Physical bounds: no board operates below -40 °C, and every GPU shuts down far below 150 °C (H200:
# slowdown and shutdown within 10 °C of its 87 °C limit). The deprecated unsigned call reads a
# negative value as about 4294967295.
CHECKS: tuple[Check, ...] = (
    Range("gpu_celsius", "memory_celsius", "thresholds_celsius", low=-40, high=150),
    # a margin is degrees below a threshold: a GPU shuts down within a few degrees past its slowdown
    # threshold, and no threshold sits 150 degrees above a working GPU
    Range("margin_celsius", "memory_margin_celsius", low=-40, high=150),
)


def read(dev: DeviceClient) -> Reading | None:
    """The GPU die temperature (°C, ``nvmlDeviceGetTemperatureV`` else ``nvmlDeviceGetTemperature``,
    sensor ``NVML_TEMPERATURE_GPU``), the memory's (°C, field ``NVML_FI_DEV_MEMORY_TEMP``), the
    thresholds (°C, ``nvmlDeviceGetTemperatureThreshold``; in the reading with the details feature) and
    the margins (degrees, ``nvmlDeviceGetMarginTemperature`` else computed: :func:`margins`).

    Returns:
        The reading; None where neither temperature answered. Any part that did not answer is None.
    Raises:
        DeviceLost: the GPU is gone.
        NvmlFatal: NVML is unusable.
    """
    gpu = dev.first(
        FEATURE,
        [
            ("nvmlDeviceGetTemperatureV", (NVML_TEMPERATURE_GPU,)),
            ("nvmlDeviceGetTemperature", (NVML_TEMPERATURE_GPU,)),
        ],
        call="temperature",
    )
    mem = dev.fields(FEATURE, [(NVML_FI_DEV_MEMORY_TEMP, 0)]).get((NVML_FI_DEV_MEMORY_TEMP, 0))
    if gpu is None and mem is None:
        return None
    gpu_c = int(gpu) if gpu is not None else None
    mem_c = int(mem) if mem is not None else None
    thresholds = _thresholds(dev)
    margin = dev.get(FEATURE, "nvmlDeviceGetMarginTemperature")
    gpu_margin, mem_margin = margins(gpu_c, mem_c, thresholds, None if margin is None else int(margin))
    return Reading(gpu_c, mem_c, dict(thresholds) if DETAILS in dev.enabled else {}, gpu_margin, mem_margin)


def margins(
    gpu: int | None, memory: int | None, thresholds: dict[str, int], margin: int | None
) -> tuple[int | None, int | None]:
    """(GPU margin to slowdown, memory margin to its maximum) in degrees; None where not known. The GPU's
    is NVML's margin where it answers, else the slowdown threshold minus the GPU temperature."""
    slowdown = thresholds.get("slowdown")
    if margin is None and slowdown is not None and gpu is not None:
        margin = slowdown - gpu
    memory_max = thresholds.get("memory_max")
    memory_margin = memory_max - memory if memory_max is not None and memory is not None else None
    return margin, memory_margin


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    gpu = GPU_TEMPERATURE.family()
    mem = MEMORY_TEMPERATURE.family()
    threshold = THRESHOLD.family()
    margin = MARGIN.family()
    memory_margin = MEMORY_MARGIN.family()
    for key, r in samples:
        gpu.add(key, r.gpu_celsius)
        mem.add(key, r.memory_celsius)
        for name, _ in THRESHOLDS:
            threshold.add(key, r.thresholds_celsius.get(name), name)
        margin.add(key, r.margin_celsius)
        memory_margin.add(key, r.memory_margin_celsius)
    for fam in (gpu, mem, threshold, margin, memory_margin):
        yield from fam.done()
