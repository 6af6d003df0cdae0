"""Pipe-level GPM activity: the tensor pipes by kind (HMMA, IMMA, DMMA, DFMA) and the non-tensor
FP64, FP32 and FP16 pipes. Off by default (``NVGPU_FEATURE_GPM_PIPES=on``): seven more series per
GPU on top of the ``gpm`` feature's nine.

Same mechanism as :mod:`exporter.common.collectors.gpm` (two GPM sample buffers per GPU, alternated; each
reading covers the previous sample interval), with buffers of its own so either feature can be
switched off or quarantined alone. Sources: nvmlGpmSampleGet and nvmlGpmMetricsGet with
``NVML_GPM_METRIC_{HMMA,IMMA,DMMA,DFMA}_TENSOR_UTIL`` (7, 9, 8, 6) and
``NVML_GPM_METRIC_FP{64,32,16}_UTIL`` (11, 12, 13), percent of time (dcgm-exporter
``DCGM_FI_PROF_PIPE_TENSOR_{HMMA,IMMA,DFMA}_ACTIVE``, ``DCGM_FI_PROF_PIPE_FP{64,32,16}_ACTIVE``).
Measured on H200 under a bf16 matmul: HMMA 0.83 (equal to any-tensor), FP32 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.collectors import mig
from exporter.common.collectors.base import percent_to_ratio
from exporter.common.collectors.gpm import take
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import Check, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "gpm_pipes"
NEEDS: tuple[str, ...] = (mig.FEATURE,)  # gpm.take reads mig.layout
# pipe label value -> NVML_GPM_METRIC_* id (nvml.h)
PIPES: tuple[tuple[str, int], ...] = (
    ("hmma", 7),  # HMMA_TENSOR_UTIL: half-precision (FP16/BF16) tensor
    ("imma", 9),  # IMMA_TENSOR_UTIL: integer tensor
    ("dmma", 8),  # DMMA_TENSOR_UTIL: FP64 tensor
    ("dfma", 6),  # DFMA_TENSOR_UTIL
    ("fp64", 11),  # FP64_UTIL: non-tensor
    ("fp32", 12),  # FP32_UTIL
    ("fp16", 13),  # FP16_UTIL
)
METRIC_IDS = tuple(m for _, m in PIPES)

PIPE_ACTIVITY = MetricDef(
    "nvgpu_gpm_pipe_activity_ratio",
    "Fraction of the last sample interval the SMs' pipe of this kind was active; pipes run at the same time, "
    "do not sum them (GPM NVML_GPM_METRIC_{HMMA,IMMA,DMMA,DFMA}_TENSOR_UTIL, NVML_GPM_METRIC_FP{64,32,16}_UTIL)",
    ("pipe",),
)
METRICS = (PIPE_ACTIVITY,)


@dataclass(frozen=True)
class Reading:
    activity_percent: dict[int, float]  # GPM metric id -> percent over the last window


CHECKS: tuple[Check, ...] = (Range("activity_percent", low=0, high=101),)  # as gpm.CHECKS


def read(dev: DeviceClient) -> Reading | None:
    got = take(dev, FEATURE, FEATURE, METRIC_IDS)
    if got is None:
        return None
    _, values, _ = got
    return Reading({m: v for m, v in values.items() if v >= 0})


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    fam = PIPE_ACTIVITY.family()
    for key, r in samples:
        for pipe, metric_id in PIPES:
            percent = r.activity_percent.get(metric_id)
            fam.add(key, None if percent is None else percent_to_ratio(percent), pipe)
    yield from fam.done()
