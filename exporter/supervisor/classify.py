"""Classification: every fault the exporter can see on one GPU (or the node), as rows of the fault table.

Reads the served state through :class:`ServedState` (a protocol: the served state owns the verdict
engine, so this module does not import it) and returns :class:`~exporter.supervisor.faulttable.Fault`
values of :data:`~exporter.supervisor.faulttable.CAUSES`; the engine
(:mod:`exporter.supervisor.verdicts`) decides the verdict from them. What a cause needs to have held
for a while (lost for a minute, a fabric not registered for five) is kept in the GPU's
:class:`Memory`, which the engine hands in.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from exporter.common.collectors import ecc, fabric, remapped_rows
from exporter.supervisor import xid as xid_catalog
from exporter.supervisor.faulttable import (
    APPLICATION_WINDOW_S,
    BUSY_EMPTY_HOLD_S,
    CLASS_DOMAIN,
    FABRIC_HOLD_S,
    LOST_ERRORS,
    LOST_HOLD_S,
    NVIDIA_ACTIONS,
    RECOVERY_ACTIONS,
    REPEAT_SLOT_S,
    REPEAT_SLOTS,
    SEVERITY_VERDICT,
    STUCK_XID43_BEFORE_S,
    XID_WINDOW_S,
    Fault,
    fault,
)

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.nativelib import NativeLibrary
    from exporter.common.snapshot import GpuSample, Snapshot
    from exporter.supervisor.gpuhealth import GpuHealth, GpuRecord
    from exporter.supervisor.xids import XidLedger

E = TypeVar("E")


class NvmlView(Protocol):
    """What the verdicts read of NVML's health (:class:`exporter.supervisor.served.NvmlStatus`)."""

    ever_worked: bool
    last_error: str
    broken_since: float | None
    kernel_module_version: str


class ServedState(Protocol):
    """What the verdicts read of the served state (:class:`exporter.supervisor.served.ServedState`,
    which owns the engine: a protocol here, so that this module does not import it)."""

    health: GpuHealth
    xids: XidLedger
    native: NativeLibrary | None
    nvml_up: bool

    @property
    def gpu_index(self) -> dict[str, str]: ...

    @property
    def nvml(self) -> NvmlView: ...

    @property
    def system(self) -> SystemInfo: ...

    @property
    def last(self) -> Snapshot | None: ...

    def fresh_snapshot(self) -> Snapshot | None: ...

    def extension(self, kind: type[E]) -> E | None: ...


@dataclass
class Memory:
    """What the engine remembers per GPU between evaluations."""

    lost_since: float | None = None  # monotonic
    fabric_since: float | None = None
    cleared: dict[str, float] = field(default_factory=dict)  # reset_gpu cause -> monotonic time it cleared
    was_reset_gpu: bool = False
    causes: dict[str, Fault] = field(default_factory=dict)


def order(text: str) -> int:
    """Sort key of a GPU index given as text (an index-less GPU sorts last)."""
    return int(text) if text.isdigit() else 1 << 30


def index_of(pair: tuple[GpuRecord | None, GpuSample | None]) -> int:
    """The NVML index of a (record, sample) pair of :func:`known_gpus`, for sorting."""
    rec, sample = pair
    return rec.index if rec is not None else sample.index if sample is not None else 1 << 30


def is_fresh(state: ServedState) -> bool:
    """A snapshot younger than the stale bound exists."""
    return state.fresh_snapshot() is not None


def known_gpus(state: ServedState) -> dict[str, tuple[GpuRecord | None, GpuSample | None]]:
    """UUID -> (the supervisor's record, the GPU in the last snapshot) for every GPU with a UUID."""
    out: dict[str, tuple[GpuRecord | None, GpuSample | None]] = {}
    for rec in state.health.gpus.values():
        if rec.uuid:
            out[rec.uuid] = (rec, None)
    snap = state.last
    for g in snap.gpus if snap is not None else ():
        if g.uuid and g.state != "removed":  # a GPU that left the node has no verdict
            out[g.uuid] = (out.get(g.uuid, (None, None))[0], g)
    # A GPU NVML counts but the pod may not open has no UUID: keyed by its index.
    for rec in state.health.gpus.values():
        if not rec.uuid and rec.state == "denied":
            out[f"index:{rec.index}"] = (rec, None)
    return out


# -- classification ---------------------------------------------------------------------------------


def node_faults(state: ServedState) -> list[Fault]:
    """Faults of the whole node or of the exporter's pod, from NVML's init and the native library."""
    out: list[Fault] = []
    native, nvml = state.native, state.nvml
    error = nvml.last_error if not state.nvml_up else ""
    if native is not None and native.state == "image_library":
        out.append(fault("nvml_library_not_hosts", f"native library: {native.evidence}", action=native.message))
    elif native is not None and native.state == "library_missing":
        out.append(fault("nvml_library_missing", f"nvmlInit: {error or 'LIBRARY_NOT_FOUND'}", action=native.message))
    elif error == "LIBRARY_NOT_FOUND" and nvml.kernel_module_version:
        out.append(
            fault(
                "nvml_library_missing",
                f"nvmlInit: LIBRARY_NOT_FOUND with kernel module {nvml.kernel_module_version} loaded",
            )
        )
    if (
        native is not None
        and native.state == "driver_upgraded"
        or (error == "LIB_RM_VERSION_MISMATCH" and (native is None or native.origin != "image"))
    ):
        evidence = [f"nvmlInit: {error}"] if error else []
        if native is not None and native.state == "driver_upgraded":
            evidence.append(f"native library: {native.message}")
        elif nvml.kernel_module_version:
            evidence.append(f"kernel module {nvml.kernel_module_version}, NVML {state.system.nvml_version or '?'}")
        out.append(fault("driver_library_mismatch", *evidence))
    if error == "DRIVER_NOT_LOADED" and (nvml.ever_worked or state.health.gpus):
        out.append(fault("driver_not_loaded", "nvmlInit: DRIVER_NOT_LOADED on a node whose GPUs were seen"))
    if error == "NO_PERMISSION":
        out.append(
            fault(
                "device_access_denied",
                "nvmlInit: NO_PERMISSION",
                action="give the exporter's pod /dev/nvidiactl and the GPUs' device nodes (the NVIDIA container "
                "toolkit, or privileged/device mounts)",
            )
        )
    if nvml.broken_since is not None:
        out.append(fault("device_access_lost", "NVML answers UNKNOWN to every call and re-init after it worked"))
    return out


def gpu_faults(
    state: ServedState,
    uuid: str,
    rec: GpuRecord | None,
    sample: GpuSample | None,
    mem: Memory,
    now: float,
    wall: float,
    every_gpu_lost: bool,
) -> list[Fault]:
    """Every fault on one GPU, classified (see the module docstring and :data:`CAUSES`)."""
    out: list[Fault] = []
    out += _state_faults(state, uuid, rec, mem, now, wall, every_gpu_lost)
    fresh = sample is not None and sample.up and is_fresh(state)
    if fresh and sample is not None:
        out += _reading_faults(sample, mem, now)
    else:
        mem.fabric_since = None
    out += _stuck_faults(state, uuid, now)
    out += _xid_faults(state, uuid, now, {f.cause for f in out}, answers=fresh)
    return out


def _state_faults(
    state: ServedState,
    uuid: str,
    rec: GpuRecord | None,
    mem: Memory,
    now: float,
    wall: float,
    every_gpu_lost: bool,
) -> list[Fault]:
    if rec is None:
        return []
    current = state.health.state_of(rec, is_fresh(state))
    if current != "lost":
        mem.lost_since = None
    if current == "denied":
        return [
            fault(
                "device_access_denied",
                f"NVML counts GPU {rec.index} but its handle lookup answers {rec.error or 'NO_PERMISSION'} "
                f"({rec.detail or 'no detail'})",
                action=f"give the exporter's pod access to GPU {rec.index}'s device node (usually /dev/nvidia"
                f"{rec.index}; NVIDIA_VISIBLE_DEVICES=all, the CDI spec or the device cgroup): the GPU is hidden from "
                "the exporter, not lost",
            )
        ]
    if current == "hung":
        feature, function = rec.hung_in
        return [fault("nvml_call_hung", f"{function or 'an NVML call'} ({feature or '?'}) outlasted the deadline")]
    if current == "crashed":
        return [fault("nvml_crashes_on_gpu", rec.detail or "a worker died natively in a call on this GPU")]
    if current != "lost":
        return []
    if mem.lost_since is None:
        mem.lost_since = now
    why = f"{rec.error or 'lost'}: {rec.detail or 'no handle'}"
    if rec.error in LOST_ERRORS:
        return [fault(LOST_ERRORS[rec.error], why)]
    if rec.error == "INSUFFICIENT_POWER":
        return [fault("insufficient_power", why)]
    if every_gpu_lost:
        return [fault("all_gpus_lost", why, "every GPU of the node is lost")]
    xid79 = _last_xid(state, uuid, 79)
    xid79_mono = _last_xid(state, uuid, 79, mono=True)
    if xid79 is not None and xid79_mono is not None and now - xid79_mono <= XID_WINDOW_S:
        return [fault("fell_off_bus", why, f"Xid 79 at {utc(xid79)}")]
    held = now - mem.lost_since
    if held >= LOST_HOLD_S:
        return [fault("gpu_lost", why, f"lost for {held:.0f} s")]
    return [
        fault(
            "gpu_lost",
            why,
            f"lost for {held:.0f} s (under {LOST_HOLD_S:.0f} s: not yet a reboot)",
            verdict="stop_scheduling",
            action="stop scheduling onto the GPU; if it stays lost, reboot the node",
        )
    ]


def _reading_faults(g: GpuSample, mem: Memory, now: float) -> list[Fault]:
    out: list[Fault] = []
    rows = g.reading(remapped_rows.Reading)
    if rows is not None:
        if rows.failure:
            out.append(fault("row_remap_failed", "nvmlDeviceGetRemappedRows: failure occurred"))
        elif rows.pending:
            out.append(fault("row_remap_pending", "nvmlDeviceGetRemappedRows: remap pending"))
        action = RECOVERY_ACTIONS.get(rows.recovery_action or 0)
        if action is not None:
            name, verdict, domain = action
            out.append(
                fault(
                    "recovery_action",
                    f"NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = {rows.recovery_action} ({name})",
                    verdict=verdict,
                    domain=domain,
                    action=f"NVIDIA's recovery action: {name.replace('_', ' ')}",
                )
            )
    errors = g.reading(ecc.Reading)
    uncorrected = errors.volatile.get("uncorrected", 0) if errors is not None else 0
    if uncorrected > 0:
        out.append(fault("ecc_uncorrectable", f"{uncorrected} uncorrectable ECC error(s) since the driver loaded"))
    link = g.reading(fabric.Reading)
    bad = link is not None and (link.state != fabric.STATE_COMPLETED or link.status != 0)
    if not bad:
        mem.fabric_since = None
    elif link is not None:
        mem.fabric_since = now if mem.fabric_since is None else mem.fabric_since
        if now - mem.fabric_since >= FABRIC_HOLD_S:
            out.append(
                fault(
                    "fabric_not_registered",
                    f"fabric state {link.state}, status {link.status} for {now - mem.fabric_since:.0f} s",
                )
            )
    return out


def _stuck_faults(state: ServedState, uuid: str, now: float) -> list[Fault]:
    """``now`` on the monotonic clock: the signature's hold and the Xid 43 before it are measured on it."""
    from exporter.supervisor.stuck import StuckDetector

    ext = state.extension(StuckDetector)
    if ext is None or not ext.suspected(uuid):
        return []
    since, since_mono = ext.since(uuid), ext.since_mono(uuid)
    xid43, xid43_mono = _last_xid(state, uuid, 43), _last_xid(state, uuid, 43, mono=True)
    signature = "busy with no compute process and nothing running (the stuck-context signature)"
    if since_mono is not None and xid43_mono is not None and xid43_mono >= since_mono - STUCK_XID43_BEFORE_S:
        return [fault("stuck_context", f"Xid 43 at {utc(xid43 or 0.0)}", f"{signature} since {utc(since or 0.0)}")]
    if since_mono is not None and now - since_mono >= BUSY_EMPTY_HOLD_S:
        return [fault("busy_and_empty", f"{signature} since {utc(since or 0.0)}, no Xid 43")]
    return [
        fault(
            "busy_and_empty",
            f"{signature} since {utc(since) if since else '?'}",
            verdict="watch",
            action="watch: not yet 10 minutes, no Xid 43",
        )
    ]


def _xid_faults(state: ServedState, uuid: str, now: float, seen: set[str], answers: bool) -> list[Fault]:
    """The Xid faults of one GPU (``now`` on the monotonic clock: the windows are measured on it);
    ``answers``: it answers NVML in the fresh snapshot (an Xid 79 then asks for no reboot yet: the
    GPU is still on the bus)."""
    out: list[Fault] = []
    apps = state.xids.application_records(uuid, now, APPLICATION_WINDOW_S)
    if apps:
        processes = state.xids.application_processes(uuid, now, APPLICATION_WINDOW_S)
        slots = len({int(r.ts // REPEAT_SLOT_S) for r in apps})
        told = [f"Xid {r.xid} at {utc(r.ts)}" + (f" by {r.who}" if r.who else "") for r in apps[-5:]]
        if "stuck_context" in seen:
            pass  # the stuck context explains them
        elif processes >= 2:
            out.append(
                fault(
                    "application_xids_several_processes",
                    f"{processes} different processes raised application Xids in {APPLICATION_WINDOW_S / 60:.0f} min",
                    *told,
                )
            )
        elif slots >= REPEAT_SLOTS:
            out.append(
                fault(
                    "application_xids_repeated",
                    f"application Xids in {slots} separate {REPEAT_SLOT_S / 60:.0f}-minute slots within "
                    f"{APPLICATION_WINDOW_S / 60:.0f} min",
                    *told,
                )
            )
        else:
            out.append(fault("application_xid", *told))
    for xid, last, count in _xids_in_window(state, uuid, now):
        info = xid_catalog.classify(xid)
        if info.xid_class == "application":
            continue
        if xid == 79:
            if "fell_off_bus" in seen:
                continue
            if answers:
                out.append(
                    fault(
                        "fell_off_bus",
                        f"Xid 79 at {utc(last)} (NVIDIA: RESTART_BM)",
                        "but the GPU still answers NVML",
                        verdict="stop_scheduling",
                        action="stop scheduling onto the GPU and read the kernel log; reboot the node if it goes lost",
                    )
                )
            else:
                out.append(fault("fell_off_bus", f"Xid 79 at {utc(last)} (NVIDIA: RESTART_BM)"))
            continue
        verdict = NVIDIA_ACTIONS.get(info.nvidia_action or "", None)
        if verdict is None:
            verdict = SEVERITY_VERDICT.get(info.severity, "watch")
        if not verdict:
            continue
        domain = CLASS_DOMAIN.get(info.xid_class, "gpu")
        cause = {"driver": "driver_xid", "link": "link_xid"}.get(domain, "gpu_xid")
        nvidia = f", NVIDIA: {info.nvidia_action}" if info.nvidia_action else ""
        out.append(
            fault(
                cause,
                f"Xid {xid} ({info.mnemonic}, {info.xid_class}/{info.severity}{nvidia}) x{count}, last at {utc(last)}",
                verdict=verdict,
                domain=domain,
                action=f"Xid {xid}: {info.action.replace('_', ' ')}"
                + (f" (NVIDIA: {info.nvidia_action})" if info.nvidia_action else ""),
            )
        )
    return out


def _xids_in_window(state: ServedState, uuid: str, now: float) -> Iterable[tuple[int, float, int]]:
    """(Xid, last time (Unix), count among the recent records) of the GPU's Xids within XID_WINDOW_S
    (``now`` and the window on the monotonic clock)."""
    recent = state.xids.recent(uuid)
    for (u, xid), c in sorted(state.xids.xids.items()):
        if u == uuid and now - c.last_mono <= XID_WINDOW_S:
            yield xid, c.last_ts, max(1, sum(1 for r in recent if r.xid == xid and now - r.mono <= XID_WINDOW_S))


def _last_xid(state: ServedState, uuid: str, xid: int, mono: bool = False) -> float | None:
    """The GPU's last Xid ``xid``: its Unix time, or (``mono``) its time on the monotonic clock."""
    times = [c.last_mono if mono else c.last_ts for (u, x), c in state.xids.xids.items() if u == uuid and x == xid]
    return max(times) if times else None


def utc(ts: float) -> str:
    """Unix time as RFC 3339 UTC to the second (``2026-12-01T10:00:00Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
