"""Confidential computing (CC): the system's CC mode and whether its GPUs accept work.

Sources (system-wide calls, "for Ampere or newer fully supported devices", every header from 12.2):
``nvmlSystemGetConfComputeState`` (``environment`` 0 unavailable, 1 simulation, 2 production;
``ccFeature`` 0 disabled, 1 enabled; ``devToolsMode`` 0 off, 1 on) and, while CC is on,
``nvmlSystemGetConfComputeGpusReadyState`` (``NVML_CC_ACCEPTING_CLIENT_REQUESTS_FALSE`` 0 / ``_TRUE``
1: set for all GPUs of the system by the attestation flow, ``nvmlSystemSetConfComputeGpusReadyState``;
there is no per-GPU ready state in any header from 12.2 to 13.3); per GPU, while CC is on and with
the ``details`` feature, ``nvmlDeviceGetConfComputeProtectedMemoryUsage`` (the protected memory,
total and used). A system that is not CC-capable answers NOT_SUPPORTED: the feature is unsupported
there, said once.

"Not ready" is a state, not an error: GPUs in CC mode accept no CUDA work until attestation sets the
ready state, and NVML's other queries still answer, so the exporter exports the state (0) every
sample and counts nothing. The system calls are made on each GPU's thread (they are cheap queries);
the node-level families take the first GPU's answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import U64_MAX_VALUE, Check, Exempt, PartsAtMost, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "confidential_computing"
NEEDS: tuple[str, ...] = ()
ENVIRONMENTS = {0: "unavailable", 1: "simulation", 2: "production"}  # NVML_CC_SYSTEM_ENVIRONMENT_*
ENABLED = 1  # NVML_CC_SYSTEM_FEATURE_ENABLED, NVML_CC_SYSTEM_DEVTOOLS_MODE_ON
DETAILS = "details"  # the protected memory per GPU

INFO = MetricDef(
    "nvgpu_confidential_computing_info",
    "The system's confidential computing state (nvmlSystemGetConfComputeState): environment (unavailable, "
    "simulation, production), mode (on, off), devtools_mode (on, off); value is always 1",
    ("environment", "mode", "devtools_mode"),
    per_gpu=False,
)
GPUS_READY = MetricDef(
    "nvgpu_confidential_computing_gpus_ready",
    "1 when the system's GPUs accept work in CC mode (attestation done), 0 while they do not; present only "
    "with CC on (nvmlSystemGetConfComputeGpusReadyState)",
    per_gpu=False,
)
PROTECTED_TOTAL = MetricDef(
    "nvgpu_confidential_computing_protected_memory_total_bytes",
    "Protected (CC) memory of the GPU, with CC on and the details feature "
    "(nvmlDeviceGetConfComputeProtectedMemoryUsage total)",
)
PROTECTED_USED = MetricDef(
    "nvgpu_confidential_computing_protected_memory_used_bytes",
    "Protected (CC) memory in use on the GPU, with CC on and the details feature "
    "(nvmlDeviceGetConfComputeProtectedMemoryUsage used)",
)
METRICS = (INFO, GPUS_READY, PROTECTED_TOTAL, PROTECTED_USED)


@dataclass(frozen=True)
class Reading:
    """The system's confidential-computing state as one GPU's thread read it (system-wide calls).

    Attributes:
        environment: ``nvmlSystemGetConfComputeState().environment``: 0 unavailable, 1 simulation,
            2 production (``NVML_CC_SYSTEM_ENVIRONMENT_*``).
        enabled: ``ccFeature`` is 1 (``NVML_CC_SYSTEM_FEATURE_ENABLED``).
        devtools: ``devToolsMode`` is 1 (``NVML_CC_SYSTEM_DEVTOOLS_MODE_ON``).
        gpus_ready: ``nvmlSystemGetConfComputeGpusReadyState``, 0 not accepting work, 1 accepting;
            None with CC off or where the call did not answer.
        protected_total_bytes: ``nvmlDeviceGetConfComputeProtectedMemoryUsage().total`` in bytes, this
            GPU's; only with CC on and the details feature, else None.
        protected_used_bytes: ``.used`` of the same call, in bytes.
    """

    environment: int
    enabled: bool
    devtools: bool
    gpus_ready: int | None = None  # with CC on
    protected_total_bytes: int | None = None  # with CC on
    protected_used_bytes: int | None = None


CHECKS: tuple[Check, ...] = (
    Range("environment", low=0, high=2),  # NVML_CC_SYSTEM_ENVIRONMENT_* (0-2)
    Range("gpus_ready", low=0, high=1),  # NVML_CC_ACCEPTING_CLIENT_REQUESTS_FALSE/TRUE
    Range("protected_total_bytes", "protected_used_bytes", low=0, high=U64_MAX_VALUE),
    PartsAtMost("protected_used_bytes", total="protected_total_bytes"),
    Exempt("enabled", "devtools", why="flags: the CC feature and devtools modes"),
)


def _system(dev: DeviceClient, function: str) -> Any:
    return dev.call(FEATURE, function, key=(function,), handle=False)


def read(dev: DeviceClient) -> Reading | None:
    """The CC state (``nvmlSystemGetConfComputeState``), with CC on the ready state
    (``nvmlSystemGetConfComputeGpusReadyState``) and, with the details feature, this GPU's protected
    memory (``nvmlDeviceGetConfComputeProtectedMemoryUsage``).

    Returns:
        The reading; None where the state call did not answer (NOT_SUPPORTED on a system that is not
        CC-capable: cached until a re-probe).
    Raises:
        DeviceLost: the GPU is gone.
        NvmlFatal: NVML is unusable.
    """
    state = _system(dev, "nvmlSystemGetConfComputeState")
    if state is None:
        return None
    enabled = int(getattr(state, "ccFeature", 0)) == ENABLED
    ready = total = used = None
    if enabled:
        answer = _system(dev, "nvmlSystemGetConfComputeGpusReadyState")
        ready = None if answer is None else int(answer)
        mem = dev.get(FEATURE, "nvmlDeviceGetConfComputeProtectedMemoryUsage") if DETAILS in dev.enabled else None
        if mem is not None:
            total, used = int(mem.total), int(mem.used)
    return Reading(
        int(getattr(state, "environment", 0)),
        enabled,
        int(getattr(state, "devToolsMode", 0)) == ENABLED,
        ready,
        total,
        used,
    )


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    info = INFO.family()
    ready = GPUS_READY.family()
    total = PROTECTED_TOTAL.family()
    used = PROTECTED_USED.family()
    if samples:
        first = samples[0][1]  # system-wide: every GPU reads the same
        environment = ENVIRONMENTS.get(first.environment, str(first.environment))
        info.add_labels([environment, "on" if first.enabled else "off", "on" if first.devtools else "off"], 1)
        ready.add_labels([], first.gpus_ready)
    for key, r in samples:
        total.add(key, r.protected_total_bytes)
        used.add(key, r.protected_used_bytes)
    for fam in (info, ready, total, used):
        yield from fam.done()
