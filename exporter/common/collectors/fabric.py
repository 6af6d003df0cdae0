"""The GPU's NVLink fabric registration: state and status.

On NVSwitch systems (HGX H100/H200 eight-GPU boards, GB200 NVL racks) every GPU can look healthy
while the NVLink fabric was never set up (Fabric Manager not running, or still in progress), and
CUDA jobs then fail to start. NVML reports, per GPU, how far the fabric probe got and how it ended.

Source: ``nvmlDeviceGetGpuFabricInfoV`` (driver 550+; the non-V call is deprecated in NVML 13), whose
pynvml wrapper takes a caller-allocated, versioned struct: the v3 struct
(``c_nvmlGpuFabricInfo_v3_t``: state, status, cliqueId, healthMask, healthSummary) first, then v2
for a driver that rejects v3 (ARGUMENT_VERSION_MISMATCH), once per worker life. ``state``:
``NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`` 0, ``NOT_STARTED`` 1, ``IN_PROGRESS`` 2, ``COMPLETED`` 3;
``status`` is the probe's NVML return code, meaningful once the state is completed (0 = success).
A GPU answering NOT_SUPPORTED, or state 0, has no fabric: no series (and the feature is switched
off when no GPU has one). Measured on the direct-NVLink H200 pair (no NVSwitch, driver 580.159.04):
v3 answers state 3, status 0, clique 0, health mask 0 (2026-11-30).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import U32_MAX_VALUE, Check, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "fabric"
NEEDS: tuple[str, ...] = ()
FUNCTION = "nvmlDeviceGetGpuFabricInfoV"
STRUCTS = ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t")  # newest first
STATE_NOT_SUPPORTED = 0
STATE_COMPLETED = 3

STATE = MetricDef(
    "nvgpu_fabric_state",
    "NVLink fabric registration of this GPU: 1 not started, 2 in progress, 3 completed; absent where the GPU "
    "has no fabric (nvmlDeviceGetGpuFabricInfoV state)",
)
STATUS = MetricDef(
    "nvgpu_fabric_status",
    "NVML return code of the fabric probe, meaningful once the state is completed: 0 success, else the "
    "error (nvmlDeviceGetGpuFabricInfoV status)",
)
METRICS = (STATE, STATUS)


@dataclass(frozen=True)
class Reading:
    state: int
    status: int


CHECKS: tuple[Check, ...] = (Range("state", "status", low=0, high=U32_MAX_VALUE),)


def read(dev: DeviceClient) -> Reading | None:
    from exporter.worker.nvml import structs

    if (FUNCTION,) in dev.unsupported:  # state NOT_SUPPORTED earlier: no fabric on this GPU
        return None
    info = structs.versioned(dev, FEATURE, FUNCTION, STRUCTS)
    if info is None:
        return None
    state = int(info.state)
    if state == STATE_NOT_SUPPORTED:
        dev.nothing_to_read(FEATURE, FUNCTION, "no NVLink fabric (state NOT_SUPPORTED)")
        return None
    return Reading(state, int(info.status))


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    state = STATE.family()
    status = STATUS.family()
    for key, r in samples:
        state.add(key, r.state)
        status.add(key, r.status)
    yield from state.done()
    yield from status.done()
