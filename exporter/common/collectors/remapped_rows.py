"""Row remapping (Ampere+) and the driver's recommended recovery action.

Sources: nvmlDeviceGetRemappedRows -> (correctable rows, uncorrectable rows, pending, failure);
NOT_SUPPORTED while MIG has active instances. Pending means a GPU reset is needed to activate a
remap; failure means the RMA path. Field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230, 570+ drivers):
0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, 5 recover IMEX domain,
6 bus reset, 7 system reboot (``NVML_GPU_RECOVERY_ACTION_*`` in nvml.h; 6 and 7 from the 615 header).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import U32_MAX_VALUE, Check, Exempt, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "remapped_rows"
NEEDS: tuple[str, ...] = ()
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230

REMAPPED_ROWS = MetricDef("nvgpu_remapped_rows", "Rows remapped, by cause (nvmlDeviceGetRemappedRows)", ("cause",))
PENDING = MetricDef(
    "nvgpu_remapped_rows_pending", "1 if a row remap is pending and needs a GPU reset (nvmlDeviceGetRemappedRows)"
)
FAILURE = MetricDef("nvgpu_remapped_rows_failure", "1 if a row remap failed (nvmlDeviceGetRemappedRows)")
RECOVERY_ACTION = MetricDef(
    "nvgpu_recovery_action",
    "Driver-recommended recovery action: 0 none, 1 gpu_reset, 2 node_reboot, 3 drain_p2p, 4 drain_and_reset, "
    "5 recover_imex_domain, 6 bus_reset, 7 system_reboot (field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)",
)
METRICS = (
    REMAPPED_ROWS,
    PENDING,
    FAILURE,
    RECOVERY_ACTION,
)


@dataclass(frozen=True)
class Reading:
    correctable: int | None
    uncorrectable: int | None
    pending: bool | None
    failure: bool | None
    recovery_action: int | None


CHECKS: tuple[Check, ...] = (
    Range("correctable", "uncorrectable", "recovery_action", low=0, high=U32_MAX_VALUE),
    Exempt("pending", "failure", why="flags"),
)


def read(dev: DeviceClient) -> Reading | None:
    rows = dev.get(FEATURE, "nvmlDeviceGetRemappedRows")
    action = dev.fields(FEATURE, [(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0)]).get(
        (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0)
    )
    if rows is None and action is None:
        return None
    return Reading(
        correctable=int(rows[0]) if rows is not None else None,
        uncorrectable=int(rows[1]) if rows is not None else None,
        pending=bool(rows[2]) if rows is not None else None,
        failure=bool(rows[3]) if rows is not None else None,
        recovery_action=int(action) if action is not None else None,
    )


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    rows = REMAPPED_ROWS.family()
    pending = PENDING.family()
    failure = FAILURE.family()
    action = RECOVERY_ACTION.family()
    for key, r in samples:
        rows.add(key, r.correctable, "correctable")
        rows.add(key, r.uncorrectable, "uncorrectable")
        pending.add(key, None if r.pending is None else int(r.pending))
        failure.add(key, None if r.failure is None else int(r.failure))
        action.add(key, r.recovery_action)
    for fam in (rows, pending, failure, action):
        yield from fam.done()
