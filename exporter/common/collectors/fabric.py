"""The GPU's NVLink fabric: registration state and status, health, and the NVLink domain it joined.

On NVSwitch systems (HGX H100/H200 eight-GPU boards, GB200 NVL racks) every GPU can look healthy
while the NVLink fabric was never set up (Fabric Manager not running, or still in progress), and
CUDA jobs then fail to start; once set up, the fabric can run degraded (a link or switch lost:
bandwidth degraded, routes recovering or unhealthy). NVML reports, per GPU, how far the fabric
probe got, how it ended, its health and the domain it belongs to.

Sources (``exporter.worker.nvml.structs.fabric_info``; nvml.h of CUDA 12.2 to 13.1):

- ``nvmlDeviceGetGpuFabricInfoV`` with the v3 struct (13.0 header, R580: state, status, cliqueId,
  clusterUuid, healthMask, healthSummary), then the v2 struct (12.4 header, R550: no healthSummary)
  for a driver that answers ARGUMENT_VERSION_MISMATCH, then ``nvmlDeviceGetGpuFabricInfo`` (v1: no
  health; the only call on R535, deprecated in the 13.0 header) where the V call is missing
  (FUNCTION_NOT_FOUND: an R535 driver, or nvidia-ml-py 12.535 without the wrapper). Struct layouts are
  our own: nvidia-ml-py's v1 (up to 13.610) and 12.550/12.560 v2 are laid out wrong. The variant is
  chosen once per worker and shown in ``nvgpu_nvml_api_info{call="fabric"}``.
- ``state``: ``NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`` 0, ``NOT_STARTED`` 1, ``IN_PROGRESS`` 2,
  ``COMPLETED`` 3; ``status`` is the probe's NVML return code, meaningful once completed (0 = success).
  A GPU answering NOT_SUPPORTED, or state 0, has no fabric: no series (the feature is switched off
  when no GPU has one).
- ``healthMask`` (v2+): fields of two bits each, ``(mask >> shift) & 0x3``, 0 not supported, 1 true,
  2 false: degraded bandwidth (shift 0), route recovery in progress (2), route unhealthy (4),
  access-timeout recovery in progress (6, from the 12.8 header); incorrect configuration at shift 8,
  four bits (0 not supported, 1 none, 2 incorrect SysGUID, 3 incorrect chassis serial, 4 no
  partition, 5 insufficient NVLinks, 6 incompatible GPU firmware, 7 invalid location). The width is
  decoded as the 12.8+ headers define it: ``NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_*`` is ``0x11`` in the
  12.4 header and in nvidia-ml-py up to 13.580.82, ``0x3`` from the 12.8 header and nvidia-ml-py
  13.580.126, so the binding's constant is not used.
- ``healthSummary`` (v3): 0 not supported, 1 healthy, 2 unhealthy, 3 limited capacity (H100 80GB
  HBM3 answers not supported: leptonai/gpud ``fabric_state.go``). Where the driver gives a summary
  (R580+), it is the default series and the four conditions come with the ``details`` feature;
  where it gives only the mask (R550-R575), the conditions are the default.
- ``cliqueId`` and ``clusterUuid`` (16 raw bytes) name the NVLink domain the GPU registered into (on
  GB200 NVL72 the rack's domain, IMEX): exported once the registration completed, where they name
  one (clique 0 with an all-zero cluster UUID, as on the directly joined H200 pair, names none).

Measured on the direct-NVLink H200 pair (no NVSwitch, driver 580.159.04, 2026-11-30): v3 answers
state 3, status 0, clique 0, health mask 0, summary 0 (nothing to report: no health series).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import U32_MAX_VALUE, Check, Exempt, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "fabric"
NEEDS: tuple[str, ...] = ()
FUNCTION = "nvmlDeviceGetGpuFabricInfoV"  # the unsupported-cache key of "state NOT_SUPPORTED"
DETAILS = "details"  # the health conditions where a v3 summary sums them up
STATE_NOT_SUPPORTED = 0
STATE_COMPLETED = 3
# healthMask fields of two bits (nvml.h 12.8+ NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_*): label -> shift
CONDITIONS = (
    ("degraded_bandwidth", 0),  # ..._DEGRADED_BW
    ("route_recovery", 2),  # ..._ROUTE_RECOVERY
    ("route_unhealthy", 4),  # ..._ROUTE_UNHEALTHY
    ("access_timeout_recovery", 6),  # ..._ACCESS_TIMEOUT_RECOVERY
)
FIELD_MASK = 0x3  # two bits per field (not the binding's NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_*)
TRUE, FALSE = 1, 2  # NVML_GPU_FABRIC_HEALTH_MASK_*_TRUE / _FALSE
CONFIGURATION_SHIFT, CONFIGURATION_MASK = 8, 0xF  # ..._INCORRECT_CONFIGURATION
SUMMARY_NOT_SUPPORTED = 0
NO_DOMAIN = "00000000-0000-0000-0000-000000000000"  # clique 0 and this: no NVLink domain (direct NVLink)

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
INFO = MetricDef(
    "nvgpu_fabric_info",
    "The NVLink domain this GPU registered into, once the fabric registration completed and where NVML names "
    "one: clique id and cluster UUID (nvmlDeviceGetGpuFabricInfoV cliqueId, clusterUuid); value is always 1",
    ("clique_id", "cluster_uuid"),
)
HEALTH = MetricDef(
    "nvgpu_fabric_health",
    "Fabric health as the driver sums it up: 1 healthy, 2 unhealthy, 3 limited capacity; absent where not "
    "reported (nvmlDeviceGetGpuFabricInfoV v3 healthSummary, R580+)",
)
HEALTH_CONDITION = MetricDef(
    "nvgpu_fabric_health_condition",
    "1 while the fabric health condition holds, 0 when it does not; absent where the driver does not report "
    "it (nvmlDeviceGetGpuFabricInfoV healthMask: degraded bandwidth, route recovery, route unhealthy, "
    "access-timeout recovery); next to a v3 health summary with the details feature",
    ("condition",),
)
INCORRECT_CONFIGURATION = MetricDef(
    "nvgpu_fabric_incorrect_configuration",
    "Fabric configuration check: 1 none (correct), 2 incorrect SysGUID, 3 incorrect chassis serial number, "
    "4 no partition, 5 insufficient NVLinks, 6 incompatible GPU firmware, 7 invalid location; absent where "
    "not reported (nvmlDeviceGetGpuFabricInfoV healthMask, incorrect configuration)",
)
METRICS = (STATE, STATUS, INFO, HEALTH, HEALTH_CONDITION, INCORRECT_CONFIGURATION)


@dataclass(frozen=True)
class Reading:
    """One GPU's fabric info (the struct version says which fields NVML filled).

    Attributes:
        state: registration state (1-3; a GPU with state 0 gives no reading).
        status: the probe's NVML return code.
        version: the fabric info struct version that answered (3, 2 or 1).
        clique_id: ``cliqueId``.
        cluster_uuid: ``clusterUuid`` as a canonical UUID string.
        health_mask: ``healthMask`` (v2 and v3); None with v1.
        health_summary: ``healthSummary`` (v3); None with v1 and v2.
        details: the ``details`` feature is on (the conditions are shown next to a summary).
    """

    state: int
    status: int
    version: int = 0
    clique_id: int | None = None
    cluster_uuid: str = ""
    health_mask: int | None = None
    health_summary: int | None = None
    details: bool = False  # the details feature: the conditions next to a v3 summary


def uuid_text(raw: Sequence[int]) -> str:
    """16 raw bytes as ``xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    h = bytes(raw).hex()
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


CHECKS: tuple[Check, ...] = (
    Range("state", "status", "clique_id", "health_mask", low=0, high=U32_MAX_VALUE),
    Range("version", low=1, high=3),
    Range("health_summary", low=0, high=3),  # NVML_GPU_FABRIC_HEALTH_SUMMARY_* (0-3)
    Exempt("cluster_uuid", why="an identifier: the UUID text of 16 raw bytes"),
    Exempt("details", why="a flag: the details switch"),
)


def read(dev: DeviceClient) -> Reading | None:
    """The GPU's fabric info: ``nvmlDeviceGetGpuFabricInfoV`` (v3 struct, then v2), else
    ``nvmlDeviceGetGpuFabricInfo`` (v1), the variant chosen once per worker.

    Returns:
        The reading; None where the GPU has no fabric (the call NOT_SUPPORTED, cached; or state
        ``NVML_GPU_FABRIC_STATE_NOT_SUPPORTED``) or the call failed this time.
    Raises:
        DeviceLost: the GPU is gone.
        NvmlFatal: NVML is unusable.
    """
    from exporter.worker.nvml import structs

    if (FUNCTION,) in dev.unsupported:  # state NOT_SUPPORTED earlier: no fabric on this GPU
        return None
    got = structs.fabric_info(dev, FEATURE)
    if got is None:
        return None
    info, version = got
    state = int(info.state)
    if state == STATE_NOT_SUPPORTED:
        dev.nothing_to_read(FEATURE, FUNCTION, "no NVLink fabric (state NOT_SUPPORTED)")
        return None
    raw: Any = info.clusterUuid
    return Reading(
        state,
        int(info.status),
        version,
        int(info.cliqueId),
        uuid_text(list(raw)),
        int(info.healthMask) if version >= 2 else None,
        int(info.healthSummary) if version >= 3 else None,
        DETAILS in dev.enabled,
    )


def conditions(mask: int) -> dict[str, int]:
    """healthMask -> condition -> 1 (true) or 0 (false); a field the driver does not report is left out."""
    out = {}
    for name, shift in CONDITIONS:
        value = (mask >> shift) & FIELD_MASK
        if value in (TRUE, FALSE):
            out[name] = 1 if value == TRUE else 0
    return out


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    state = STATE.family()
    status = STATUS.family()
    info = INFO.family()
    summary = HEALTH.family()
    condition = HEALTH_CONDITION.family()
    configuration = INCORRECT_CONFIGURATION.family()
    for key, r in samples:
        state.add(key, r.state)
        status.add(key, r.status)
        if r.state == STATE_COMPLETED and r.clique_id is not None and (r.clique_id or r.cluster_uuid != NO_DOMAIN):
            info.add(key, 1, str(r.clique_id), r.cluster_uuid)
        if r.health_summary is not None and r.health_summary != SUMMARY_NOT_SUPPORTED:
            summary.add(key, r.health_summary)
        if r.health_mask is not None:
            if r.health_summary is None or r.details:
                for name, value in conditions(r.health_mask).items():
                    condition.add(key, value, name)
            config = (r.health_mask >> CONFIGURATION_SHIFT) & CONFIGURATION_MASK
            configuration.add(key, config or None)
    for fam in (state, status, info, summary, condition, configuration):
        yield from fam.done()
