"""Xid and NVML event counters, owned by the supervisor so they survive worker restarts.

Xids arrive from the worker's NVML event thread (:mod:`exporter.worker.nvml_events`) and from the kernel
log (:mod:`exporter.supervisor.kernel_xid`); both call :meth:`XidLedger.record_xid`. Other NVML event types
(ECC, power source, MIG config change, …) are counted by type. The families here are per GPU.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.metric import GpuKey, MetricDef
from exporter.supervisor import xid as xid_catalog

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric

log = logging.getLogger("exporter.supervisor")
_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.ERROR}  # catalog severity

XID_ERRORS = MetricDef("nvgpu_xid_errors_total", "Xid errors reported by NVML events or the kernel log", ("xid",))
XID_LAST = MetricDef("nvgpu_xid_last_timestamp_seconds", "Unix time of the last Xid of this code", ("xid",))
XID_LAST_CODE = MetricDef(
    "nvgpu_xid_last_code",
    "The Xid code of the GPU's most recent Xid since the exporter started (dcgm-exporter's "
    "DCGM_FI_DEV_XID_ERRORS); absent before the first",
)
EVENTS = MetricDef("nvgpu_events_total", "NVML events other than Xid, by type", ("event_type",))
EVENTS_ENABLED = MetricDef("nvgpu_events_enabled", "1 if NVML event registration succeeded for this GPU")
METRICS = (XID_ERRORS, XID_LAST, XID_LAST_CODE, EVENTS, EVENTS_ENABLED)


@dataclass
class XidCount:
    """How often one Xid code was seen on one GPU, and when last (Unix time)."""

    count: int = 0
    last_ts: float = 0.0


class XidLedger:
    """Counts per (gpu index, uuid, Xid) and per (gpu index, uuid, event type)."""

    def __init__(self) -> None:
        self.xids: dict[tuple[str, str, int], XidCount] = {}
        self.events: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.events_enabled: dict[str, bool] = {}  # uuid -> registration succeeded

    def record_xid(self, gpu: str, uuid: str, xid: int, ts: float, source: str) -> None:
        """Count one Xid (NVML event or kernel log) and log it with the catalog's meaning.

        The log level follows the catalog's severity (info -> INFO, warning -> WARNING, critical ->
        ERROR); the line and its fields carry the mnemonic, class, meaning and action bucket
        (:mod:`exporter.supervisor.xid`), so an operator reading the log needs no lookup.

        Args:
            gpu: NVML index as text ("" if unknown).
            uuid: GPU UUID.
            xid: the Xid number.
            ts: Unix time of the event.
            source: "NVML event" or "kernel log", for the log line.
        """
        entry = self.xids.setdefault((gpu, uuid, xid), XidCount())
        entry.count += 1
        entry.last_ts = max(entry.last_ts, ts)
        info = xid_catalog.classify(xid)
        nvidia = f", NVIDIA: {info.nvidia_action}" if info.nvidia_action else ""
        log.log(
            _LEVELS.get(info.severity, logging.WARNING),
            "Xid %d on GPU %s (%s) from %s: %s (%s, %s) %s Action: %s%s; see docs/runbook.md",
            xid,
            gpu or "?",
            uuid,
            source,
            info.mnemonic,
            info.xid_class,
            info.severity,
            info.meaning.rstrip(".") + ".",
            info.action,
            nvidia,
            extra={
                "xid": xid,
                "gpu": gpu,
                "uuid": uuid,
                "source": source,
                "mnemonic": info.mnemonic,
                "xid_class": info.xid_class,
                "severity": info.severity,
                "action": info.action,
            },
        )

    def record_event(self, gpu: str, uuid: str, event_type: str) -> None:
        """Count one NVML event that is not an Xid."""
        self.events[(gpu, uuid, event_type)] += 1

    def latest(self, uuid: str) -> tuple[int, XidCount, int] | None:
        """(Xid, its count, all Xids of the GPU) for the most recent Xid on ``uuid``, or None."""
        mine = [(xid, c) for (_g, u, xid), c in self.xids.items() if u == uuid]
        if not mine:
            return None
        xid, count = max(mine, key=lambda item: item[1].last_ts)
        return xid, count, sum(c.count for _x, c in mine)

    def families(self, live: Iterable[str], index: dict[str, str]) -> list[Metric]:
        """The Xid and event families; ``events_enabled`` only for GPUs in ``live`` (up in the snapshot).

        Args:
            live: UUIDs of the GPUs that answered in the snapshot.
            index: UUID -> NVML index, remembered across workers.
        """
        total, last, code = XID_ERRORS.family(), XID_LAST.family(), XID_LAST_CODE.family()
        latest: dict[tuple[str, str], tuple[float, int]] = {}
        for (gpu, uuid, xid), c in sorted(self.xids.items()):
            total.add(GpuKey(gpu, uuid), c.count, str(xid))
            last.add(GpuKey(gpu, uuid), c.last_ts, str(xid))
            if (gpu, uuid) not in latest or c.last_ts >= latest[(gpu, uuid)][0]:
                latest[(gpu, uuid)] = (c.last_ts, xid)
        for (gpu, uuid), (_ts, xid) in sorted(latest.items()):
            code.add(GpuKey(gpu, uuid), xid)
        events = EVENTS.family()
        for (gpu, uuid, etype), n in sorted(self.events.items()):
            events.add(GpuKey(gpu, uuid), n, etype)
        enabled = EVENTS_ENABLED.family()
        alive = set(live)
        for uuid, ok in sorted(self.events_enabled.items()):
            if uuid in alive:
                enabled.add(GpuKey(index.get(uuid, ""), uuid), 1 if ok else 0)
        return [total.always(), last.always(), code.always(), events.always(), enabled.always()]
