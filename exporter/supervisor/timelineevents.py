"""The timeline's events and lanes: what one entry holds, and the bounds every entry keeps.

The store is :mod:`exporter.supervisor.timeline`, its file :mod:`exporter.supervisor.timelinefile`.
"""

from __future__ import annotations

import collections
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from exporter.common.logs import rfc3339

SCHEMA_VERSION = 1  # the /api/v1/timeline document (docs/incidents.md)
NODE = "node"
KINDS: dict[str, str] = {
    "xid": "an Xid: code, time, PID, process, pod when known, source (NVML event or kernel log)",
    "state": "the GPU's state changed (up, lost, hung, crashed, denied)",
    "verdict": "the GPU's verdict changed, with its cause and evidence",
    "fault": "a classified fault was raised or cleared",
    "ecc": "ECC error counts changed (volatile since the driver loaded, and aggregate)",
    "row_remap": "row remapping changed (pending, failure, remapped rows)",
    "recovery_action": "NVIDIA's recovery action field changed",
    "fabric": "the NVLink fabric registration changed (state, status)",
    "mig": "MIG mode (current, pending) changed, or NVML reported a MIG configuration change",
    "nvml_event": "an NVML event other than an Xid (ECC, GPU unavailable, recovery action, power source)",
    "reset": "a reset seen: the GPU went away and came back, NVML announced it, or its volatile ECC counts fell",
    "pods": "the pods the kubelet assigned the GPU to changed",
    "identity": "the GPU's index or PCI bus id changed",
    "worker_death": "an NVML worker died: reason, signal or exit code, the NVML call in flight",
    "quarantine": "a feature was quarantined after crashes",
    "driver": "the driver, kernel module or NVML version changed, or nvmlInit failed",
    "boot": "the first sample after a boot (a new boot id)",
    "exporter_start": "the exporter started (version, pid, how long it was away)",
    "recovery": "recovery verification: an action seen, the GPU back, recovered or recurred",
}
EVENTS_PER_LANE = 512
LANES_MAX = 65  # 64 GPUs and the node
COALESCE_S = 60.0
COALESCE_LOOKBACK = 8  # the last events of a lane a repeat may join
TEXT_MAX = 240
LIST_MAX = 16
DATA_KEYS_MAX = 32
EVENT_MAX_BYTES = 4096
FILE_MAX_BYTES = 4 << 20
SAVE_DELAY_S = 2.0

Scalar = str | int | float | bool | None
Value = Scalar | list[Scalar]


def finite(value: Any) -> TypeGuard[int | float]:
    """A number that is not NaN or infinite (nor a bool, nor an integer beyond any float)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond any float
        return False


def cut(value: Any, limit: int = TEXT_MAX) -> str:
    """``value`` as text of at most ``limit`` characters (an ellipsis marks the cut)."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _scalar(value: Any) -> Scalar:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -(1 << 63) <= value < 1 << 64 else cut(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return cut(value)


def clean_data(data: Mapping[str, Any]) -> dict[str, Value]:
    """``data`` bounded: at most :data:`DATA_KEYS_MAX` keys, scalars and lists of scalars only, strings
    cut to :data:`TEXT_MAX`, lists to :data:`LIST_MAX` (anything else becomes its text)."""
    out: dict[str, Value] = {}
    for key, value in list(data.items())[:DATA_KEYS_MAX]:
        if isinstance(value, (list, tuple)):
            out[cut(key, 64)] = [_scalar(v) for v in list(value)[:LIST_MAX]]
        else:
            out[cut(key, 64)] = _scalar(value)
    return out


@dataclass
class Event:
    """One thing that happened.

    Attributes:
        seq: its place in the order (one counter for the whole timeline, never reused).
        ts: Unix time it happened (display only: ordering is by ``seq``).
        kind: one of :data:`KINDS`.
        lane: the GPU's UUID, or :data:`NODE`.
        gpu: the GPU's NVML index at the time, as text ("" for the node).
        summary: one line for people.
        data: the facts, by name (scalars and short lists).
        boot_id: the boot it happened in ("" when unknown).
        count: how many times it happened (repeats within :data:`COALESCE_S` are counted here).
        last_ts: Unix time of the last repeat, None without repeats.
        key: what a repeat must match to be counted on this event (not kept in the file).
    """

    seq: int
    ts: float
    kind: str
    lane: str
    gpu: str
    summary: str
    data: dict[str, Value] = field(default_factory=dict)
    boot_id: str = ""
    count: int = 1
    last_ts: float | None = None
    key: tuple[Any, ...] | None = None
    size: int = 0

    def to_file(self) -> dict[str, Any]:
        """The event as the file keeps it."""
        out: dict[str, Any] = {
            "seq": self.seq,
            "ts": self.ts,
            "kind": self.kind,
            "gpu": self.gpu,
            "summary": self.summary,
            "data": self.data,
            "boot_id": self.boot_id,
        }
        if self.count > 1:
            out["count"] = self.count
            out["last_ts"] = self.last_ts
        return out

    def to_json(self) -> dict[str, Any]:
        """The event as ``/api/v1/timeline`` shows it (schema: docs/incidents.md)."""
        return {
            "seq": self.seq,
            "time": rfc3339(self.ts),
            "timestamp_seconds": self.ts,
            "kind": self.kind,
            "gpu": self.gpu,
            "uuid": "" if self.lane == NODE else self.lane,
            "summary": self.summary,
            "data": self.data,
            "boot_id": self.boot_id,
            "count": self.count,
            "last_time": rfc3339(self.last_ts) if self.last_ts is not None else None,
        }

    def measure(self) -> int:
        """Its size in the file, bytes (cut to :data:`EVENT_MAX_BYTES` first: the data goes)."""
        self.size = len(json.dumps(self.to_file(), separators=(",", ":")))
        if self.size > EVENT_MAX_BYTES:
            self.data = {"truncated": True}
            self.summary = cut(self.summary, 512)
            self.size = len(json.dumps(self.to_file(), separators=(",", ":")))
        return self.size


@dataclass
class Lane:
    """One GPU's events (or the node's) and what the recorder last saw of it.

    Attributes:
        key: the GPU's UUID or :data:`NODE`.
        events: oldest first (by ``seq``).
        identity: the GPU's index, PCI bus id, serial, name, VBIOS and InfoROM versions, as last seen.
        last: the last value of each thing the recorder watches for changes (its diff base).
        evicted: events dropped to keep the lane within its bounds.
        evicted_until: Unix time of the newest event dropped, None when none was.
    """

    key: str
    events: list[Event] = field(default_factory=list)
    identity: dict[str, Scalar] = field(default_factory=dict)
    last: dict[str, Value] = field(default_factory=dict)
    evicted: int = 0
    evicted_until: float | None = None
    kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    size: int = 0

    @property
    def newest(self) -> float:
        """Unix time of its newest event (0 when empty)."""
        return self.events[-1].ts if self.events else 0.0
