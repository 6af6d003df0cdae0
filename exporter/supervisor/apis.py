"""``nvgpu_nvml_api_info``: which NVML function and struct version answers each versioned call.

NVML grew newer variants of several calls, and a driver branch or an nvidia-ml-py release may lack
the newest: memory info v2 (``nvmlDeviceGetMemoryInfo_v2``, reserved memory apart) -> v1 (reserved
counted as used), ``nvmlDeviceGetTemperatureV`` (R570) -> ``nvmlDeviceGetTemperature``, fabric info
v3 (R580, health summary) -> v2 (R550) -> ``nvmlDeviceGetGpuFabricInfo`` v1 (R535), clock event
reasons -> the older throttle-reasons spelling, process lists ``_v3`` -> ``_v2``. The worker picks
the variant once per GPU and worker life (:class:`exporter.worker.nvml.client.ApiChoices`) and each
snapshot carries the choices (:attr:`exporter.common.snapshot.GpuSample.apis`); this family shows
them, one series per distinct choice over the node's GPUs (not per GPU: the binding and the driver
are the node's).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from exporter.common.metric import MetricDef

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric
    from exporter.common.snapshot import GpuSample

API_INFO = MetricDef(
    "nvgpu_nvml_api_info",
    "The NVML function (and struct version) that answers each versioned call on this node's GPUs; fallback says "
    "why not the newest variant (the newer one's NVML answer, e.g. function_not_found, or records_invalid); "
    "value is always 1",
    ("call", "function", "version", "fallback"),
    per_gpu=False,
)
METRICS = (API_INFO,)


def families(gpus: Iterable[GpuSample]) -> list[Metric]:
    """The family over ``gpus`` (the fresh, up GPUs of a snapshot)."""
    fam = API_INFO.family()
    for call, function, version, fallback in sorted({a for g in gpus for a in g.apis}):
        fam.add_labels([call, function, version, fallback], 1)
    return list(fam.done())
