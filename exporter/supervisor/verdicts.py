"""Fault domains and per-GPU verdicts: what to do with each GPU now, with the evidence.

One place classifies every fault the exporter can see into a domain, and derives from them one
verdict per GPU (the fault atlas: keep the evidence, narrow the fault domain, never restart a node
because an error code appeared; docs/design.md, "Fault domains and verdicts", holds the table):

- domains: ``exporter`` (the exporter's own pod: NVML library missing or not the host's, device
  node or cgroup access denied, device access lost), ``driver`` (kernel module and userspace library
  disagree because the host changed, driver not loaded, NVML crashing in one GPU's calls),
  ``gpu`` (lost, hung, fell off the bus, ECC, row remapping, NVIDIA's recovery action, a stuck
  context, repeated application Xids), ``link`` (NVLink, PCIe, fabric), ``node`` (every GPU lost at
  once, power), ``application`` (one job's own fault);
- verdicts (:data:`VERDICTS`): ``ok``; ``watch`` (record, keep scheduling); ``stop_scheduling``
  (a GPU-level anomaly: no new work on this GPU); ``reset_gpu`` (drain the GPU, reset it);
  ``reboot_node`` (drain the node, reboot it: only where the evidence supports it: the GPU fell off
  the bus or stays lost, NVIDIA's recovery action or Xid resolution says so, a reset did not cure
  it, the host driver changed under the loaded module); ``fix_exporter`` (the exporter's pod is
  wrong: fix it, the GPU may well be healthy); ``unknown`` (no fresh evidence).

A fault of the exporter's own environment takes precedence on the GPUs it hides (what else is seen
there is not trustworthy) and is never reported as a lost GPU, a driver reload or a node fault.
Otherwise a GPU's verdict is its most severe fault's. A ``reset_gpu`` fault that comes back within
:data:`RECUR_WINDOW_S` after it cleared (the reset did not cure it) asks for ``reboot_node``.

Every change of a GPU's verdict is logged once with its evidence, and every transition and every
fault raised or cleared is handed, typed (:class:`VerdictTransition`, :class:`FaultEvent`), to the
engine's subscribers (:meth:`VerdictEngine.subscribe`): the one place where they are produced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from exporter.common.collectors import ecc, fabric, identity, remapped_rows
from exporter.common.metric import GpuKey, MetricDef
from exporter.supervisor import xid as xid_catalog

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
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


log = logging.getLogger("exporter.supervisor.verdicts")

SCHEMA_VERSION = 1
VERDICTS = ("ok", "unknown", "watch", "stop_scheduling", "reset_gpu", "reboot_node", "fix_exporter")
"""Every verdict, in the order of :data:`RANK` (``fix_exporter`` and ``unknown`` stand apart)."""
RANK = {"ok": 0, "unknown": 0, "watch": 1, "stop_scheduling": 2, "reset_gpu": 3, "reboot_node": 4, "fix_exporter": 2}
"""How much a verdict asks; ``fix_exporter`` ranks with ``stop_scheduling`` for node-level consumers."""
DOMAINS = ("exporter", "driver", "gpu", "link", "node", "application", "none")

APPLICATION_WINDOW_S = 1800.0  # application Xids: repeats and distinct processes in 30 minutes
REPEAT_SLOT_S = 300.0  # a burst of one faulting kernel (13, 31, 43 within seconds) is one slot
REPEAT_SLOTS = 3  # application Xids in 3 distinct 5-minute slots: repeated
XID_WINDOW_S = 3600.0  # other Xids count for an hour after the last one
LOST_HOLD_S = 60.0  # lost this long (without Xid 79): it stays lost, reboot
STUCK_XID43_BEFORE_S = 600.0  # Xid 43 at most this long before the stuck signature began
BUSY_EMPTY_HOLD_S = 600.0  # the stuck signature without Xid 43 this long: stop scheduling
FABRIC_HOLD_S = 300.0  # fabric registration not completed this long (it takes up to a minute at boot)
RECUR_WINDOW_S = 3600.0  # a reset_gpu fault back within this after it cleared: the reset did not cure it
TRANSITIONS_KEPT = 100

VERDICT = MetricDef(
    "nvgpu_gpu_health_verdict",
    "1 for the GPU's current verdict: what to do with it now (ok, unknown, watch, stop_scheduling, reset_gpu, "
    "reboot_node, fix_exporter), the fault domain (exporter, driver, gpu, link, node, application; none for ok "
    "and unknown) and the cause (docs/design.md, fault domains)",
    ("verdict", "domain", "cause"),
)
METRICS = (VERDICT,)


@dataclass(frozen=True)
class Cause:
    """One row of the fault table: a cause, its domain, the verdict it asks for, who acts."""

    domain: str
    verdict: str
    owner: str
    action: str


# The fault table (docs/design.md mirrors it; tests/test_verdicts.py checks both ways).
CAUSES: dict[str, Cause] = {
    # exporter: the exporter's own pod
    "device_access_denied": Cause(
        "exporter",
        "fix_exporter",
        "exporter deployment",
        "give the exporter's pod the GPU's device node (NVIDIA_VISIBLE_DEVICES=all / the CDI spec, or the device "
        "cgroup); the GPU itself is not at fault",
    ),
    "device_access_lost": Cause(
        "exporter",
        "fix_exporter",
        "exporter deployment",
        "restart the exporter's pod (liveness does after NVGPU_UNHEALTHY_AFTER_SECONDS): its device cgroup was "
        "reset (a host systemctl daemon-reload with the systemd cgroup driver)",
    ),
    "nvml_library_not_hosts": Cause(
        "exporter",
        "fix_exporter",
        "exporter image",
        "fix the image: remove the bundled libnvidia-ml.so and run with the host's (NVIDIA container toolkit)",
    ),
    "nvml_library_missing": Cause(
        "exporter",
        "fix_exporter",
        "exporter deployment",
        "mount the host driver's libnvidia-ml.so into the pod (runtimeClassName nvidia, or a hostPath)",
    ),
    # driver
    "driver_library_mismatch": Cause(
        "driver",
        "reboot_node",
        "node administrator",
        "the host driver was upgraded under a loaded kernel module: drain the node, reload the NVIDIA driver or "
        "reboot; restarting the exporter does not help",
    ),
    "driver_not_loaded": Cause(
        "driver", "stop_scheduling", "node administrator", "load the NVIDIA kernel module (or the driver container)"
    ),
    "nvml_crashes_on_gpu": Cause(
        "driver",
        "watch",
        "exporter maintainers / NVIDIA",
        "NVML crashes in calls on this GPU; the exporter samples around it; report the call with the driver version",
    ),
    "driver_xid": Cause("driver", "watch", "node administrator", "read the kernel log around the Xid"),
    # gpu
    "gpu_lost": Cause(
        "gpu",
        "reboot_node",
        "node administrator",
        "the GPU stays lost: drain the node and reboot it; if it recurs, the GPU or its slot is a repair case",
    ),
    "fell_off_bus": Cause(
        "gpu",
        "reboot_node",
        "node administrator",
        "the GPU fell off the bus (Xid 79, NVIDIA: RESTART_BM): drain the node and reboot it; recurring, repair",
    ),
    "reset_required": Cause("gpu", "reset_gpu", "node administrator", "drain the GPU and reset it (nvidia-smi -r)"),
    "inforom_corrupted": Cause("gpu", "stop_scheduling", "hardware vendor", "the GPU's InfoROM is corrupt: repair"),
    "nvml_call_hung": Cause(
        "gpu",
        "reset_gpu",
        "node administrator",
        "the driver or GSP does not answer for this GPU (look for Xid 119/120): drain it and reset it; if the reset "
        "is refused or it hangs again, reboot the node",
    ),
    "ecc_uncorrectable": Cause(
        "gpu",
        "reset_gpu",
        "node administrator",
        "uncorrectable ECC errors since the driver loaded: drain the GPU, reset it, check remapped rows",
    ),
    "row_remap_pending": Cause(
        "gpu", "reset_gpu", "node administrator", "a row remap takes effect at the next reset: drain and reset the GPU"
    ),
    "row_remap_failed": Cause("gpu", "stop_scheduling", "hardware vendor", "row remapping failed: repair the GPU"),
    "recovery_action": Cause("gpu", "reset_gpu", "node administrator", "do what NVIDIA's recovery action says"),
    "stuck_context": Cause(
        "gpu",
        "reset_gpu",
        "node administrator",
        "Xid 43 and the GPU busy with nothing on it: the context is stuck: drain the GPU, reset it; reboot if the "
        "reset is refused",
    ),
    "busy_and_empty": Cause(
        "gpu", "stop_scheduling", "node administrator", "busy with nothing running for 10 minutes: check it"
    ),
    "application_xids_repeated": Cause(
        "gpu",
        "stop_scheduling",
        "node administrator",
        "application Xids keep recurring on this GPU: stop scheduling onto it, find out whether every job fails here",
    ),
    "application_xids_several_processes": Cause(
        "gpu",
        "stop_scheduling",
        "node administrator",
        "several different processes hit application Xids on this GPU: a GPU-level anomaly, stop scheduling onto it",
    ),
    "gpu_xid": Cause("gpu", "watch", "node administrator", "the Xid's catalog entry and NVIDIA resolution decide"),
    # link
    "fabric_not_registered": Cause(
        "link",
        "stop_scheduling",
        "node administrator",
        "the GPU is not registered with the NVLink fabric: CUDA jobs fail to start; check nvidia-fabricmanager",
    ),
    "link_xid": Cause("link", "stop_scheduling", "node administrator", "NVLink or PCIe errors: check the links"),
    # node
    "all_gpus_lost": Cause(
        "node",
        "reboot_node",
        "node administrator",
        "every GPU of the node is lost at once: PCIe, power or the driver, not one GPU: drain and reboot the node",
    ),
    "insufficient_power": Cause(
        "node", "stop_scheduling", "node administrator", "the GPU lacks power (cables, PSU): check the node's power"
    ),
    # application
    "application_xid": Cause(
        "application", "watch", "job owner", "one job's fault: record it with its process and pod, let the job restart"
    ),
    # no evidence
    "no_fresh_sample": Cause("none", "unknown", "", "the exporter has no fresh reading of this GPU"),
    "none": Cause("none", "ok", "", ""),
}

# NVIDIA's immediate resolution bucket (the Xid catalog's nvidia_action) -> the verdict it asks for.
NVIDIA_ACTIONS = {
    "IGNORE": "",
    "RESTART_APP": "watch",
    "CHECK_UVM": "watch",
    "UPDATE_SWFW": "watch",
    "RESET_GPU": "reset_gpu",
    "WORKFLOW_XID_48": "reset_gpu",
    "RESTART_BM": "reboot_node",
    "RESTART_VM": "reboot_node",
    "CONTACT_SUPPORT": "stop_scheduling",
    "CHECK_MECHANICALS": "stop_scheduling",
    "WORKFLOW_NVLINK_ERR": "stop_scheduling",
    "WORKFLOW_NVLINK5_ERR": "stop_scheduling",
    "WORKFLOW_XID_45": "watch",
    "XID_154": "",  # the recovery action field says what to do (recovery_action below)
}
_SEVERITY_VERDICT = {"critical": "stop_scheduling", "warning": "watch", "info": ""}
# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values (nvml.h nvmlDeviceGpuRecoveryAction_t, 570+; 6 and 7 from 615).
RECOVERY_ACTIONS = {
    1: ("gpu_reset", "reset_gpu", "gpu"),
    2: ("node_reboot", "reboot_node", "gpu"),
    3: ("drain_p2p", "stop_scheduling", "link"),
    4: ("drain_and_reset", "reset_gpu", "gpu"),
    5: ("recover_imex_domain", "stop_scheduling", "link"),
    6: ("bus_reset", "reset_gpu", "link"),
    7: ("system_reboot", "reboot_node", "gpu"),
}
_CLASS_DOMAIN = {"application": "application", "driver": "driver", "nvlink": "link", "bus": "link"}
_LOST_ERRORS = {"RESET_REQUIRED": "reset_required", "CORRUPTED_INFOROM": "inforom_corrupted"}


@dataclass(frozen=True)
class Fault:
    """One classified fault on one GPU (or the node).

    Attributes:
        cause: a key of :data:`CAUSES`.
        domain: its fault domain (usually the cause's; an Xid's follows its catalog class).
        verdict: what this fault alone asks for.
        evidence: the facts, each with its source (NVML code, Xid and time, field value).
        action: what to do, concretely (which device node, which library path …).
        owner: who acts.
    """

    cause: str
    domain: str
    verdict: str
    evidence: tuple[str, ...]
    action: str
    owner: str


def fault(cause: str, *evidence: str, verdict: str = "", domain: str = "", action: str = "") -> Fault:
    """A :class:`Fault` of a cause of :data:`CAUSES`, with its table row's defaults."""
    row = CAUSES[cause]
    return Fault(cause, domain or row.domain, verdict or row.verdict, tuple(evidence), action or row.action, row.owner)


@dataclass(frozen=True)
class Verdict:
    """One GPU's verdict.

    Attributes:
        gpu: NVML index as text.
        uuid: the GPU's UUID.
        verdict: one of :data:`VERDICTS`.
        domain: the deciding fault's domain (``none`` for ok and unknown).
        cause: the deciding fault's cause (``none`` for ok).
        faults: every fault on the GPU, the deciding one first.
        since_wall: Unix time the verdict began.
        since_mono: ``time.monotonic()`` when it began (ages are measured on it).
    """

    gpu: str
    uuid: str
    verdict: str
    domain: str
    cause: str
    faults: tuple[Fault, ...]
    since_wall: float
    since_mono: float

    @property
    def key(self) -> tuple[str, str, str]:
        """(verdict, domain, cause): a change of any is a transition."""
        return (self.verdict, self.domain, self.cause)

    @property
    def action(self) -> str:
        """The deciding fault's action, "" for ok."""
        return self.faults[0].action if self.faults else ""


@dataclass(frozen=True)
class VerdictTransition:
    """A GPU's verdict changed (the typed event a timeline records).

    Attributes:
        uuid: the GPU.
        gpu: its NVML index as text.
        before: (verdict, domain, cause) before; ("", "", "") for a GPU seen the first time.
        after: the new verdict.
        wall: Unix time of the transition.
        mono: ``time.monotonic()`` of the transition.
    """

    uuid: str
    gpu: str
    before: tuple[str, str, str]
    after: Verdict
    wall: float
    mono: float


@dataclass(frozen=True)
class FaultEvent:
    """A classified fault appeared (``raised``) or went away (``cleared``) on a GPU."""

    kind: str
    uuid: str
    gpu: str
    fault: Fault
    wall: float
    mono: float


Event = VerdictTransition | FaultEvent


@dataclass
class _Memory:
    """What the engine remembers per GPU between evaluations."""

    lost_since: float | None = None  # monotonic
    fabric_since: float | None = None
    cleared: dict[str, float] = field(default_factory=dict)  # reset_gpu cause -> monotonic time it cleared
    was_reset_gpu: bool = False
    causes: dict[str, Fault] = field(default_factory=dict)


class VerdictEngine:
    """Derives every GPU's verdict from the served state; keeps the current ones and their history.

    Args:
        clock: ``time.monotonic`` (tests inject).
        wall: ``time.time`` (tests inject).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.wall = wall
        self.current: dict[str, Verdict] = {}
        self.node_faults: tuple[Fault, ...] = ()
        self.transitions: list[VerdictTransition] = []
        self._memory: dict[str, _Memory] = {}
        self._subscribers: list[Callable[[Event], None]] = []

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        """Hand every :class:`VerdictTransition` and :class:`FaultEvent` to ``callback``."""
        self._subscribers.append(callback)

    # -- evaluation -------------------------------------------------------------------------------

    def update(self, state: ServedState) -> list[VerdictTransition]:
        """Evaluate every known GPU from ``state``; returns (and logs, and hands on) the transitions."""
        now, wall = self.clock(), self.wall()
        node = node_faults(state)
        self.node_faults = tuple(node)
        gpus = _known_gpus(state)
        lost = [u for u, (rec, _g) in gpus.items() if rec is not None and rec.state == "lost"]
        every_gpu_lost = len(gpus) >= 2 and len(lost) == len(gpus)
        out = []
        for uuid, (rec, sample) in sorted(gpus.items(), key=lambda kv: _index(kv[1])):
            mem = self._memory.setdefault(uuid, _Memory())
            found = [*node, *gpu_faults(state, uuid, rec, sample, mem, now, wall, every_gpu_lost)]
            found = self._escalate(uuid, found, mem, now)
            verdict = self._decide(state, uuid, rec, sample, found, now, wall)
            self._fault_events(uuid, verdict.gpu, found, mem, now, wall)
            before = self.current.get(uuid)
            if before is not None and before.key == verdict.key:
                verdict = Verdict(verdict.gpu, uuid, *verdict.key, verdict.faults, before.since_wall, before.since_mono)
            self.current[uuid] = verdict
            if before is None or before.key != verdict.key:
                t = VerdictTransition(uuid, verdict.gpu, before.key if before else ("", "", ""), verdict, wall, now)
                out.append(t)
                self._transition(t)
        for uuid in [u for u in self.current if u not in gpus]:
            del self.current[uuid]
        return out

    def _decide(
        self,
        state: ServedState,
        uuid: str,
        rec: GpuRecord | None,
        sample: GpuSample | None,
        found: list[Fault],
        now: float,
        wall: float,
    ) -> Verdict:
        gpu = str(rec.index) if rec is not None else state.gpu_index.get(uuid, "")
        exporter = [f for f in found if f.domain == "exporter"]
        ranked = sorted(found, key=lambda f: -RANK[f.verdict])
        if exporter:
            first = exporter[0]
            ordered = (first, *[f for f in ranked if f is not first])
        elif ranked and RANK[ranked[0].verdict] > 0:
            ordered = tuple(ranked)
        elif sample is None or not _fresh(state):
            ordered = (fault("no_fresh_sample", "no fresh NVML reading of this GPU"), *ranked)
        else:
            ordered = (fault("none"), *ranked) if ranked else (fault("none"),)
        head = ordered[0]
        return Verdict(gpu, uuid, head.verdict, head.domain, head.cause, ordered, wall, now)

    def _escalate(self, uuid: str, found: list[Fault], mem: _Memory, now: float) -> list[Fault]:
        """A reset_gpu fault back within RECUR_WINDOW_S after it cleared, or a GPU lost after a
        reset_gpu verdict: the reset did not cure it, reboot."""
        out = []
        for f in found:
            cleared = mem.cleared.get(f.cause)
            if f.verdict == "reset_gpu" and cleared is not None and now - cleared <= RECUR_WINDOW_S:
                f = Fault(
                    f.cause,
                    f.domain,
                    "reboot_node",
                    (*f.evidence, f"it came back {now - cleared:.0f} s after it had cleared: a reset did not cure it"),
                    "drain the node and reboot it: " + f.action,
                    f.owner,
                )
            elif f.cause == "gpu_lost" and mem.was_reset_gpu and f.verdict != "reboot_node":
                f = Fault(
                    f.cause,
                    f.domain,
                    "reboot_node",
                    (*f.evidence, "lost after a reset_gpu verdict: the reset was refused or did not bring it back"),
                    f.action,
                    f.owner,
                )
            out.append(f)
        return out

    def _fault_events(self, uuid: str, gpu: str, found: list[Fault], mem: _Memory, now: float, wall: float) -> None:
        causes = {f.cause: f for f in found}
        for cause, f in causes.items():
            if cause not in mem.causes:
                self._emit(FaultEvent("raised", uuid, gpu, f, wall, now))
        for cause, f in mem.causes.items():
            if cause not in causes:
                if f.verdict == "reset_gpu" or CAUSES[cause].verdict == "reset_gpu":
                    mem.cleared[cause] = now
                self._emit(FaultEvent("cleared", uuid, gpu, f, wall, now))
        mem.causes = causes
        mem.was_reset_gpu = mem.was_reset_gpu or any(f.verdict == "reset_gpu" for f in found)
        if not found:
            mem.was_reset_gpu = False

    def _transition(self, t: VerdictTransition) -> None:
        v = t.after
        level = logging.INFO
        if v.verdict in ("stop_scheduling", "reset_gpu", "fix_exporter"):
            level = logging.WARNING
        elif v.verdict == "reboot_node":
            level = logging.ERROR
        evidence = "; ".join(e for f in v.faults[:3] for e in f.evidence) or "-"
        log.log(
            level,
            "GPU %s (%s) verdict %s -> %s (%s: %s); evidence: %s%s",
            v.gpu or "?",
            t.uuid,
            t.before[0] or "new",
            v.verdict,
            v.domain or "-",
            v.cause,
            evidence,
            f"; action: {v.action}" if v.action else "",
            extra={
                "gpu": v.gpu,
                "uuid": t.uuid,
                "verdict": v.verdict,
                "domain": v.domain,
                "cause": v.cause,
                "previous_verdict": t.before[0],
            },
        )
        self.transitions = [*self.transitions[-(TRANSITIONS_KEPT - 1) :], t]
        self._emit(t)

    def _emit(self, event: Event) -> None:
        for callback in self._subscribers:
            try:
                callback(event)
            except Exception:  # noqa: BLE001 - a subscriber's bug must not cost the verdicts
                log.exception("a verdict subscriber failed on %s", type(event).__name__)

    # -- reads ------------------------------------------------------------------------------------

    def node_verdict(self) -> Verdict | None:
        """The node's summary: the most demanding GPU verdict (``fix_exporter`` when any GPU asks
        for it and none asks for more than stop_scheduling), None before any GPU is known."""
        if not self.current:
            return None
        return max(self.current.values(), key=lambda v: (RANK[v.verdict], v.verdict == "fix_exporter"))

    def families(self) -> list[Metric]:
        """``nvgpu_gpu_health_verdict`` for every known GPU (since when: the JSON document; in
        Prometheus, the series' own start)."""
        fam = VERDICT.family()
        for v in sorted(self.current.values(), key=lambda v: (_int(v.gpu), v.uuid)):
            fam.add(GpuKey(v.gpu, "" if v.uuid.startswith("index:") else v.uuid), 1, v.verdict, v.domain, v.cause)
        return [fam.always()]


def _int(text: str) -> int:
    return int(text) if text.isdigit() else 1 << 30


def _index(pair: tuple[GpuRecord | None, GpuSample | None]) -> int:
    rec, sample = pair
    return rec.index if rec is not None else sample.index if sample is not None else 1 << 30


def _fresh(state: ServedState) -> bool:
    return state.fresh_snapshot() is not None


def _known_gpus(state: ServedState) -> dict[str, tuple[GpuRecord | None, GpuSample | None]]:
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
    mem: _Memory,
    now: float,
    wall: float,
    every_gpu_lost: bool,
) -> list[Fault]:
    """Every fault on one GPU, classified (see the module docstring and :data:`CAUSES`)."""
    out: list[Fault] = []
    out += _state_faults(state, uuid, rec, mem, now, wall, every_gpu_lost)
    fresh = sample is not None and sample.up and _fresh(state)
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
    mem: _Memory,
    now: float,
    wall: float,
    every_gpu_lost: bool,
) -> list[Fault]:
    if rec is None:
        return []
    current = state.health.state_of(rec, _fresh(state))
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
    if rec.error in _LOST_ERRORS:
        return [fault(_LOST_ERRORS[rec.error], why)]
    if rec.error == "INSUFFICIENT_POWER":
        return [fault("insufficient_power", why)]
    if every_gpu_lost:
        return [fault("all_gpus_lost", why, "every GPU of the node is lost")]
    xid79 = _last_xid(state, uuid, 79)
    xid79_mono = _last_xid(state, uuid, 79, mono=True)
    if xid79 is not None and xid79_mono is not None and now - xid79_mono <= XID_WINDOW_S:
        return [fault("fell_off_bus", why, f"Xid 79 at {_utc(xid79)}")]
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


def _reading_faults(g: GpuSample, mem: _Memory, now: float) -> list[Fault]:
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
        return [fault("stuck_context", f"Xid 43 at {_utc(xid43 or 0.0)}", f"{signature} since {_utc(since or 0.0)}")]
    if since_mono is not None and now - since_mono >= BUSY_EMPTY_HOLD_S:
        return [fault("busy_and_empty", f"{signature} since {_utc(since or 0.0)}, no Xid 43")]
    return [
        fault(
            "busy_and_empty",
            f"{signature} since {_utc(since) if since else '?'}",
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
        told = [f"Xid {r.xid} at {_utc(r.ts)}" + (f" by {r.who}" if r.who else "") for r in apps[-5:]]
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
                        f"Xid 79 at {_utc(last)} (NVIDIA: RESTART_BM)",
                        "but the GPU still answers NVML",
                        verdict="stop_scheduling",
                        action="stop scheduling onto the GPU and read the kernel log; reboot the node if it goes lost",
                    )
                )
            else:
                out.append(fault("fell_off_bus", f"Xid 79 at {_utc(last)} (NVIDIA: RESTART_BM)"))
            continue
        verdict = NVIDIA_ACTIONS.get(info.nvidia_action or "", None)
        if verdict is None:
            verdict = _SEVERITY_VERDICT.get(info.severity, "watch")
        if not verdict:
            continue
        domain = _CLASS_DOMAIN.get(info.xid_class, "gpu")
        cause = {"driver": "driver_xid", "link": "link_xid"}.get(domain, "gpu_xid")
        nvidia = f", NVIDIA: {info.nvidia_action}" if info.nvidia_action else ""
        out.append(
            fault(
                cause,
                f"Xid {xid} ({info.mnemonic}, {info.xid_class}/{info.severity}{nvidia}) x{count}, last at {_utc(last)}",
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


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


# -- the JSON document (/api/v1/verdicts, docs/verdicts.md) ---------------------------------------


def _fault_json(f: Fault) -> dict[str, object]:
    return {
        "cause": f.cause,
        "domain": f.domain,
        "verdict": f.verdict,
        "evidence": list(f.evidence),
        "action": f.action,
        "owner": f.owner,
    }


def document(engine: VerdictEngine, state: ServedState) -> dict[str, object]:
    """The versioned JSON document of every GPU's verdict (schema: docs/verdicts.md)."""
    from exporter import __version__

    now, wall = engine.clock(), engine.wall()
    node = engine.node_verdict()
    gpus = []
    for v in sorted(engine.current.values(), key=lambda v: (_int(v.gpu), v.uuid)):
        rec = (
            next((r for r in state.health.gpus.values() if not r.uuid and f"index:{r.index}" == v.uuid), None)
            if v.uuid.startswith("index:")
            else state.health.by_key(v.uuid)
        )
        sample = next((g for g in state.last.gpus if g.uuid == v.uuid), None) if state.last else None
        ident = sample.reading(identity.Reading) if sample is not None else None
        gpus.append(
            {
                "gpu": v.gpu,
                "uuid": "" if v.uuid.startswith("index:") else v.uuid,
                "pci_bus_id": (ident.pci_bus_id if ident else None) or (rec.bus_id if rec else ""),
                "state": state.health.state_of(rec, _fresh(state)) if rec is not None else "unknown",
                "verdict": v.verdict,
                "domain": v.domain,
                "cause": v.cause,
                "action": v.action,
                "owner": v.faults[0].owner if v.faults else "",
                "since": _utc(v.since_wall),
                "since_timestamp_seconds": v.since_wall,
                "age_seconds": round(max(0.0, now - v.since_mono), 3),
                "faults": [_fault_json(f) for f in v.faults if f.cause != "none"],
                "recent_xids": [
                    {
                        "xid": r.xid,
                        "time": _utc(r.ts),
                        "source": r.source,
                        "pid": r.pid,
                        "process": r.process,
                        "namespace": r.namespace,
                        "pod": r.pod,
                        "container": r.container,
                    }
                    for r in state.xids.recent(v.uuid)
                ],
            }
        )
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": _utc(wall),
        "exporter_version": __version__,
        "fresh": _fresh(state),
        "node": {
            "verdict": node.verdict if node else "unknown",
            "domain": node.domain if node else "none",
            "cause": node.cause if node else "no_fresh_sample",
            "gpu": node.gpu if node else "",
            "uuid": node.uuid if node else "",
            "faults": [_fault_json(f) for f in engine.node_faults],
        },
        "gpus": gpus,
        "transitions": [
            {
                "uuid": t.uuid,
                "gpu": t.gpu,
                "from": t.before[0],
                "to": t.after.verdict,
                "domain": t.after.domain,
                "cause": t.after.cause,
                "time": _utc(t.wall),
            }
            for t in engine.transitions[-20:]
        ],
    }


def summary(doc: Mapping[str, object]) -> str:
    """One line for the node: the GPUs that are not ok (for the NPD check and logs)."""
    gpus = doc.get("gpus")
    bad = [g for g in gpus if isinstance(g, dict) and g.get("verdict") not in ("ok",)] if isinstance(gpus, list) else []
    if not bad:
        return "all GPUs ok"
    return "; ".join(f"GPU {g.get('gpu')} {g.get('verdict')} ({g.get('domain')}: {g.get('cause')})" for g in bad)
