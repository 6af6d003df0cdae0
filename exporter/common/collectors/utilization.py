"""Utilization of the GPU, memory controller, encoder and decoder, as 0..1 ratios.

Sources: nvmlDeviceGetUtilizationRates (percent of time over the driver's sample period, 1/6 s to
1 s by product), nvmlDeviceGetEncoderUtilization / nvmlDeviceGetDecoderUtilization (percent,
sampling period). All answer NOT_SUPPORTED with MIG enabled (NVML API reference,
nvmlDeviceGetUtilizationRates: "On MIG-enabled GPUs, querying device utilization rates is not
currently supported"): on a GPU the ``mig`` feature found in MIG mode they are not asked at all
and the feature is unsupported on that GPU until MIG goes off (a re-probe), so the series are
absent, never 0, and ``nvgpu_gpu_feature_unsupported{feature="utilization"}`` with
``nvgpu_mig_mode`` 1 says why. Per GPU instance, GPM activity stands in for it
(``nvgpu_mig_gpm_*``, :mod:`exporter.common.collectors.gpm`).

``.memory`` is the share of the sample period during which device memory was being read or
written (the memory controller's busy time), not memory used / total: it is exported as
``nvgpu_memory_copy_utilization_ratio``, dcgm-exporter's "memory copy utilization"
(``DCGM_FI_DEV_MEM_COPY_UTIL``). Until 2026-11-30 it was called ``nvgpu_memory_utilization_ratio``,
a name that read as "used / total" (CHANGELOG.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.collectors import mig
from exporter.common.collectors.base import percent_to_ratio
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import Check, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "utilization"
NEEDS: tuple[str, ...] = (mig.FEATURE,)  # mig.layout: absent on a MIG-enabled GPU
DETAILS = "details"  # encoder and decoder utilization: outside the default budget of 60 series per GPU

GPU_UTILIZATION = MetricDef(
    "nvgpu_gpu_utilization_ratio", "Fraction of time one or more kernels ran (nvmlDeviceGetUtilizationRates.gpu)"
)
MEMORY_COPY_UTILIZATION = MetricDef(
    "nvgpu_memory_copy_utilization_ratio",
    "Fraction of the sample period the memory controller was reading or writing device memory, "
    "not memory used / total (nvmlDeviceGetUtilizationRates.memory; dcgm-exporter DCGM_FI_DEV_MEM_COPY_UTIL)",
)
ENCODER_UTILIZATION = MetricDef(
    "nvgpu_encoder_utilization_ratio", "Video encoder utilization (nvmlDeviceGetEncoderUtilization)"
)
DECODER_UTILIZATION = MetricDef(
    "nvgpu_decoder_utilization_ratio", "Video decoder utilization (nvmlDeviceGetDecoderUtilization)"
)
METRICS = (
    GPU_UTILIZATION,
    MEMORY_COPY_UTILIZATION,
    ENCODER_UTILIZATION,
    DECODER_UTILIZATION,
)


@dataclass(frozen=True)
class Reading:
    gpu_percent: int | None
    memory_busy_percent: int | None
    encoder_percent: int | None
    decoder_percent: int | None


CHECKS: tuple[Check, ...] = (
    Range("gpu_percent", "memory_busy_percent", "encoder_percent", "decoder_percent", low=0, high=100),
)


def read(dev: DeviceClient) -> Reading | None:
    state = mig.layout(dev)
    if state is not None and state.enabled:
        if ("nvmlDeviceGetUtilizationRates",) not in dev.unsupported:
            dev.nothing_to_read(
                FEATURE, "nvmlDeviceGetUtilizationRates", "MIG enabled: device-wide utilization is absent"
            )
        return None
    util = dev.get(FEATURE, "nvmlDeviceGetUtilizationRates")
    enc = dec = None
    if DETAILS in dev.enabled:  # H100/H200 have no NVENC: encoder reads 0 (measured [0, 100000])
        enc = dev.get(FEATURE, "nvmlDeviceGetEncoderUtilization")
        dec = dev.get(FEATURE, "nvmlDeviceGetDecoderUtilization")
    r = Reading(
        gpu_percent=int(util.gpu) if util is not None else None,
        memory_busy_percent=int(util.memory) if util is not None else None,
        encoder_percent=int(enc[0]) if enc is not None else None,
        decoder_percent=int(dec[0]) if dec is not None else None,
    )
    return None if r == Reading(None, None, None, None) else r


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    gpu = GPU_UTILIZATION.family()
    mem = MEMORY_COPY_UTILIZATION.family()
    enc = ENCODER_UTILIZATION.family()
    dec = DECODER_UTILIZATION.family()
    for key, r in samples:
        gpu.add(key, None if r.gpu_percent is None else percent_to_ratio(r.gpu_percent))
        mem.add(key, None if r.memory_busy_percent is None else percent_to_ratio(r.memory_busy_percent))
        enc.add(key, None if r.encoder_percent is None else percent_to_ratio(r.encoder_percent))
        dec.add(key, None if r.decoder_percent is None else percent_to_ratio(r.decoder_percent))
    for fam in (gpu, mem, enc, dec):
        yield from fam.done()
