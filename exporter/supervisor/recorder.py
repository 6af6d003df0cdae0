"""What goes on the timeline: the supervisor's inputs turned into events, and recovery checked.

The served state hands every input here (:class:`Recorder`), as it arrives:

- each snapshot (:meth:`Recorder.snapshot`): per GPU, by UUID, what changed since the last one the
  timeline saw (:mod:`exporter.supervisor.gpudiff`: state, ECC, row remapping, recovery action,
  fabric, MIG mode, pods, index; a GPU back from lost or hung is a ``reset``); the first snapshot of
  a boot is a ``boot`` event;
- the verdict engine's typed events (:meth:`Recorder.verdict_event`, a subscriber): each verdict
  transition with its cause and evidence, each fault raised or cleared (what the file already holds
  is not recorded again after a restart);
- Xids with their process and, once the worker maps the PID, its pod (:meth:`Recorder.xid`,
  :meth:`Recorder.xid_process`, :meth:`Recorder.pod`); other NVML events;
- the worker's ``hello`` and failed inits (driver, kernel module, NVML, binding versions; a change is
  a ``driver`` event), worker deaths with the NVML call in flight, quarantines;
- the exporter's own start (:meth:`Recorder.start`): a new boot id is a reboot, the same one an
  exporter restart (the runbook's pause for a reset).

Each of these that can cure a fault is told to the :class:`~exporter.supervisor.recovery.RecoveryTracker`,
and after each evaluation of the verdicts (:meth:`Recorder.evaluate`) the tracker sees every GPU's
verdict: recovery is verified, not assumed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from exporter.supervisor import xid as xid_catalog
from exporter.supervisor.deaths import ATTRIBUTED
from exporter.supervisor.gpudiff import GpuChanges
from exporter.supervisor.recovery import RecoveryTracker
from exporter.supervisor.timeline import NODE, Event, Timeline
from exporter.supervisor.timelineevents import Scalar
from exporter.supervisor.verdicts import FaultEvent, VerdictTransition

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.nativelib import NativeLibrary
    from exporter.common.snapshot import GpuSample, Snapshot
    from exporter.supervisor.gpuhealth import GpuHealth
    from exporter.supervisor.policy import Outcome
    from exporter.supervisor.quarantine import Quarantine
    from exporter.supervisor.verdicts import Event as VerdictEvent
    from exporter.supervisor.verdicts import VerdictEngine

E = TypeVar("E")


class ServedState(Protocol):
    """What the recorder reads of the served state (:class:`exporter.supervisor.served.ServedState`,
    which owns the recorder: a protocol here, so that this module does not import it)."""

    health: GpuHealth
    verdicts: VerdictEngine

    def fresh_gpus(self) -> list[GpuSample]: ...

    def extension(self, kind: type[E]) -> E | None: ...


ALIVE_EVERY_S = 60.0  # how often "last seen alive" is written (the away time after a restart)
PIDS_KEPT = 256  # Xid PIDs whose events wait for their pod
_ATTRIBUTE_WINDOW_S = 120.0  # an NVML event and the kernel record of the same Xid lie this close at most


def boot_id(path: str = "/proc/sys/kernel/random/boot_id") -> str:
    """This boot's id, "" when it cannot be read."""
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read(64).strip()
    except (OSError, UnicodeDecodeError):
        return ""


class Recorder:
    """Puts the supervisor's inputs on the timeline (see the module docstring).

    Args:
        timeline: the store.
        recovery: the recovery watches (kept in the same file).
        clock: monotonic clock (tests inject).
    """

    def __init__(
        self, timeline: Timeline, recovery: RecoveryTracker, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.timeline = timeline
        self.recovery = recovery
        self.changes = GpuChanges(timeline, recovery)
        self.clock = clock
        self._by_pid: dict[int, list[Event]] = {}
        self._reconciled: set[str] = set()
        self._alive_mono: float | None = None

    @classmethod
    def in_memory(cls) -> Recorder:
        """A recorder whose timeline lives in memory only."""
        timeline = Timeline("")
        return cls(timeline, RecoveryTracker(timeline))

    @property
    def meta(self) -> dict[str, Any]:
        """The node facts kept in the file (versions, boot ids)."""
        return self.timeline.meta

    # -- the exporter ----------------------------------------------------------------------------

    def start(self, version: str) -> None:
        """The exporter starts: record it; a new boot id is a reboot, the same one a restart."""
        tl, meta = self.timeline, self.timeline.meta
        before, now = meta.get("boot_id"), tl.boot_id
        alive = meta.get("alive_at")
        away = tl.wall() - alive if isinstance(alive, (int, float)) else None
        rebooted = bool(before) and bool(now) and before != now
        tl.add(
            "exporter_start",
            NODE,
            f"nvgpu-exporter {version} started (pid {os.getpid()})"
            + (f", away {away:.0f} s" if away is not None else ", no earlier record")
            + (f"; the node rebooted since (boot id {before} -> {now})" if rebooted else ""),
            {"version": version, "pid": os.getpid(), "away_s": away, "previous_boot_id": before, "boot_id": now},
        )
        if rebooted:
            self.recovery.action("reboot", f"the node rebooted (boot id {before} -> {now})")
        elif before:
            self.recovery.action(
                "exporter_restart",
                f"the exporter was stopped for {away or 0:.0f} s and started again (the pause for a reset?)",
            )
        meta["boot_id"] = now
        self._alive()

    def close(self) -> None:
        """Write what is pending (the exporter stops)."""
        self._alive(force=True)
        self.timeline.flush()

    def _alive(self, force: bool = False) -> None:
        now = self.clock()
        if force or self._alive_mono is None or now - self._alive_mono >= ALIVE_EVERY_S:
            self._alive_mono = now
            self.timeline.meta["alive_at"] = self.timeline.wall()
            self.timeline.changed()

    # -- the worker ------------------------------------------------------------------------------

    def hello(self, system: SystemInfo, kernel_module: str, native: NativeLibrary | None) -> None:
        """A worker initialised NVML: changed versions are a ``driver`` event; a changed driver or kernel
        module, or NVML working again after LIB_RM_VERSION_MISMATCH, is a driver reload."""
        meta = self.timeline.meta
        now = {
            "driver_version": system.driver_version,
            "kernel_module_version": kernel_module,
            "nvml_version": system.nvml_version,
            "nvidia_ml_py_version": system.nvidia_ml_py_version,
            "cuda_driver_version": system.cuda_driver_version,
            "nvml_library": (native.realpath or native.path) if native is not None else "",
            "nvml_library_version": native.library_version if native is not None else "",
            "nvml_library_origin": native.origin if native is not None else "",
        }
        changed = {k: (meta.get(k), v) for k, v in now.items() if v and meta.get(k) and meta.get(k) != v}
        if changed:
            text = ", ".join(
                f"{k.removesuffix('_version').replace('_', ' ')} {a} -> {b}" for k, (a, b) in changed.items()
            )
            self.timeline.add("driver", NODE, text, {k: b for k, (_a, b) in changed.items()})
        mismatch = meta.get("init_error") == "LIB_RM_VERSION_MISMATCH"
        if mismatch:
            self.timeline.add("driver", NODE, "nvmlInit works again after LIB_RM_VERSION_MISMATCH", {"error": ""})
        if changed.keys() & {"driver_version", "kernel_module_version"} or mismatch:
            self.recovery.action("driver_reload", "the NVIDIA driver was reloaded (" + ", ".join(changed) + ")")
        meta.update({k: v for k, v in now.items() if v})
        meta["init_error"] = ""
        self.timeline.changed()

    def init_failed(self, error: str, message: str) -> None:
        """nvmlInit failed with ``error``: a ``driver`` event when it is a new error."""
        if self.timeline.meta.get("init_error") != error:
            self.timeline.add("driver", NODE, f"nvmlInit failed: {error}", {"error": error, "message": message})
            self.timeline.meta["init_error"] = error

    def worker_death(self, out: Outcome) -> None:
        """A worker died (a crash loop: one event): the node's lane; the GPU's when its call is to blame."""
        if out.reason == "stopped":
            return
        rec = out.record()
        crumb = out.crumb
        where = f" in {crumb.feature}/{crumb.function}" if crumb is not None else ""
        how = rec["signal"] or (f"exit code {rec['exit_code']}" if rec["exit_code"] is not None else "")
        text = f"worker died: {out.reason}{f' ({how})' if how else ''}{where} after {out.lifetime_s:.1f} s"
        key = (out.reason, rec["signal"], rec["feature"], rec["function"], rec["uuid"])
        self.timeline.add("worker_death", NODE, text, rec, key=key)
        if crumb is not None and crumb.uuid and out.reason in ATTRIBUTED:
            self.timeline.add("worker_death", crumb.uuid, text, rec, gpu=self._index(crumb.uuid), key=key)

    def quarantine(self, q: Quarantine) -> None:
        """A feature was quarantined."""
        self.timeline.add(
            "quarantine",
            NODE,
            f"feature {q.feature} quarantined: {q.detail()}",
            {"feature": q.feature, "function": q.function, "crashes": q.crashes, "until": q.until},
        )

    def nvml_event(self, gpu: str, uuid: str, event_type: str) -> None:
        """An NVML event other than an Xid (a MIG configuration change is a ``mig`` event)."""
        kind = "mig" if event_type == "mig_config_change" else "nvml_event"
        self.timeline.add(
            kind, uuid or NODE, f"NVML event {event_type}", {"event_type": event_type}, gpu=gpu, key=(event_type,)
        )

    # -- Xids ------------------------------------------------------------------------------------

    def xid(self, gpu: str, uuid: str, xid: int, ts: float, source: str, pid: int | None, process: str) -> None:
        """One Xid (counted once; the kernel log's ``pid=``/``name=`` when it names them)."""
        info = xid_catalog.classify(xid)
        who = f" by {process or '?'} (pid {pid})" if pid is not None else ""
        event = self.timeline.add(
            "xid",
            uuid or NODE,
            f"Xid {xid} ({info.mnemonic}, {info.xid_class}/{info.severity}) from {source}{who}",
            {
                "xid": xid,
                "mnemonic": info.mnemonic,
                "class": info.xid_class,
                "severity": info.severity,
                "source": source,
                "pid": pid,
                "process": process,
            },
            gpu=gpu,
            ts=ts,
            key=(xid, pid, process, source),
        )
        if pid is not None:
            self._wait_for_pod(pid, event)
        if uuid:
            self.recovery.xid(uuid, gpu, xid, ts)

    def xid_process(self, uuid: str, xid: int, ts: float, pid: int | None, process: str) -> None:
        """The kernel log names the process of an Xid counted from an NVML event."""
        lane = self.timeline.lanes.get(uuid)
        found = [
            e
            for e in (lane.events[-32:] if lane else [])
            if e.kind == "xid"
            and e.data.get("xid") == xid
            and e.data.get("pid") is None
            and abs(e.ts - ts) <= _ATTRIBUTE_WINDOW_S
        ]
        if not found or (pid is None and not process):
            return
        event = min(found, key=lambda e: abs(e.ts - ts))
        self.timeline.amend(event, {"pid": pid, "process": process}, f"{event.summary} by {process or '?'} (pid {pid})")
        if pid is not None:
            self._wait_for_pod(pid, event)

    def pod(self, pid: int, pod_uid: str, namespace: str, pod: str, container: str) -> None:
        """The worker mapped an Xid's PID to its pod: its events get the pod."""
        for event in self._by_pid.pop(pid, []):
            if not event.data.get("pod_uid") and (pod_uid or pod):
                data = {"pod_uid": pod_uid, "namespace": namespace, "pod": pod, "container": container}
                self.timeline.amend(event, data, f"{event.summary} in {namespace}/{pod}" if pod else None)

    def _wait_for_pod(self, pid: int, event: Event) -> None:
        self._by_pid.setdefault(pid, [])
        if event not in self._by_pid[pid]:
            self._by_pid[pid] = [*self._by_pid[pid][-7:], event]
        while len(self._by_pid) > PIDS_KEPT:
            del self._by_pid[next(iter(self._by_pid))]

    # -- verdicts --------------------------------------------------------------------------------

    def verdict_event(self, ev: VerdictEvent) -> None:
        """The verdict engine's hook: a verdict transition, or a fault raised or cleared."""
        if ev.uuid.startswith("index:"):
            return  # a GPU the exporter's pod may not open: no UUID, its verdict names the node's fault
        lane = self.timeline.lane(ev.uuid)
        if isinstance(ev, VerdictTransition):
            v = ev.after
            now: list[Scalar] = [v.verdict, v.domain, v.cause]
            if lane.last.get("verdict") == now or (v.verdict == "unknown" and not ev.before[0]):
                return  # the file has it (a restart), or the start-up's "no sample yet"
            before = lane.last.get("verdict")
            was = before[0] if isinstance(before, list) and before else "new"
            evidence = [e for f in v.faults[:3] for e in f.evidence][:6]
            self.timeline.add(
                "verdict",
                ev.uuid,
                f"verdict {was} -> {v.verdict} ({v.domain}: {v.cause})",
                {
                    "from": was,
                    "to": v.verdict,
                    "domain": v.domain,
                    "cause": v.cause,
                    "evidence": evidence,
                    "action": v.action,
                },
                gpu=ev.gpu,
                ts=ev.wall,
            )
            lane.last["verdict"] = now
        elif isinstance(ev, FaultEvent):
            self._fault(lane.last, ev)

    def _fault(self, last: dict[str, Any], ev: FaultEvent) -> None:
        held = list(last.get("faults") or [])
        f = ev.fault
        if (ev.kind == "raised") == (f.cause in held):
            return  # the file has it (a restart)
        held = [*held, f.cause] if ev.kind == "raised" else [c for c in held if c != f.cause]
        last["faults"] = held
        self.timeline.add(
            "fault",
            ev.uuid,
            f"fault {ev.kind}: {f.cause} ({f.domain}, asks for {f.verdict})",
            {
                "change": ev.kind,
                "cause": f.cause,
                "domain": f.domain,
                "verdict": f.verdict,
                "evidence": list(f.evidence)[:6],
            },
            gpu=ev.gpu,
            ts=ev.wall,
        )
        if ev.kind == "raised":
            self.recovery.fault_raised(ev.uuid, ev.gpu, f.cause, f.verdict)

    def evaluate(self, state: ServedState) -> None:
        """After each evaluation: the recovery watches see every GPU's verdict (and what cleared meanwhile)."""
        fresh = {g.uuid for g in state.fresh_gpus() if g.up}
        for uuid, v in state.verdicts.current.items():
            if uuid.startswith("index:") or v.verdict == "unknown":
                continue
            if uuid not in self._reconciled:  # its first verdict since the start: faults gone meanwhile cleared
                self._reconciled.add(uuid)
                self._away_cleared(uuid, v.gpu, {f.cause for f in v.faults})
            self.recovery.sample(uuid, v.gpu, uuid in fresh, v.verdict, v.cause)
        self._alive()

    def _away_cleared(self, uuid: str, gpu: str, causes: set[str]) -> None:
        lane = self.timeline.lane(uuid)
        held = lane.last.get("faults")
        gone = [c for c in held if c not in causes] if isinstance(held, list) else []
        for cause in gone:
            self.timeline.add(
                "fault",
                uuid,
                f"fault cleared: {cause} (while the exporter was away)",
                {"change": "cleared", "cause": cause},
                gpu=gpu,
            )
        if gone and isinstance(held, list):
            lane.last["faults"] = [c for c in held if c in causes]

    # -- snapshots -------------------------------------------------------------------------------

    def snapshot(self, snap: Snapshot, state: ServedState) -> None:
        """What changed on each GPU since the last snapshot the timeline saw; the first of a boot."""
        meta, tl = self.timeline.meta, self.timeline
        if meta.get("sampled_boot") != tl.boot_id and snap.gpus:
            tl.add(
                "boot", NODE, f"first sample after boot {tl.boot_id or '(unknown boot id)'}", {"boot_id": tl.boot_id}
            )
            meta["sampled_boot"] = tl.boot_id
        for g in snap.gpus:
            if g.uuid:
                self.changes.gpu(g, state)

    def _index(self, uuid: str) -> str:
        lane = self.timeline.lanes.get(uuid)
        index = lane.identity.get("index") if lane else None
        return str(index) if index is not None else ""
