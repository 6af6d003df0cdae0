"""The incident record of one GPU or of the node, in the runbook's fields, from the timeline and the state now.

The fault atlas's record fields are: fault signature, first seen, affected GPU / node / job,
firmware and driver versions, how to reproduce, diagnostic commands, temporary handling, recovery
check, repair conclusion, recurrence threshold; its evidence comes in a fixed order (identity and
time, Kubernetes events and scheduling, kubelet / runtime / device plugin, DCGM / nvidia-smi /
kernel log, NIC / RDMA / NCCL / fabric, and only then the decision). :func:`record` fills them:

- the *signature* is the verdict's cause (the fault table's row), while the GPU asks for action;
  once it is ok again, the last episode's, with how its recovery went;
- the *episode* runs from the first evidence after the GPU was last ok (an Xid, a fault, a state
  other than up, a worker death in one of its calls) to now; "first seen" is its first event;
- the *commands* are the runbook's own, with this GPU's index and PCI bus id filled in; what the
  exporter cannot see (Kubernetes events, kubelet and device-plugin logs, NCCL) is named with the
  command that shows it, never guessed.

It works on a :class:`Now` (what is true now), built either from the running exporter
(:func:`now_of`) or, when the exporter is down, from the timeline file alone (:func:`now_from_files`),
so ``nvgpu-exporter diagnose`` writes the same record either way. The Markdown form is
:mod:`exporter.supervisor.incidentmd`; the schema is docs/incidents.md.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exporter import __version__
from exporter.common.collectors import identity
from exporter.common.logs import rfc3339
from exporter.supervisor import runbook
from exporter.supervisor.faulttable import CAUSES, RANK
from exporter.supervisor.recovery import RecoveryTracker
from exporter.supervisor.timeline import NODE, Event, Lane, Timeline

if TYPE_CHECKING:
    from exporter.supervisor.served import ServedState

SCHEMA_VERSION = 1
EVENTS_IN_RECORD = 200  # the episode's events a record carries (the timeline has the rest)
# The evidence kinds of an episode, and those that open one.
EVIDENCE = ("xid", "fault", "state", "ecc", "row_remap", "recovery_action", "fabric", "worker_death", "reset")
STEP_KINDS: dict[int, tuple[str, ...]] = {
    1: ("identity", "pods", "boot", "exporter_start"),
    3: ("pods",),
    4: (
        "xid",
        "state",
        "ecc",
        "row_remap",
        "recovery_action",
        "worker_death",
        "quarantine",
        "reset",
        "mig",
        "nvml_event",
        "driver",
        "fault",
    ),
    5: ("fabric",),
    6: ("verdict", "recovery"),
}
LINK_CAUSES = ("fabric_not_registered", "link_xid")


@dataclass(frozen=True)
class GpuNow:
    """One GPU as it is now (or as last seen).

    Attributes:
        uuid: its UUID.
        index: NVML index as text.
        pci_bus_id: PCI bus id (NVML's form).
        serial: board serial.
        name: product name.
        vbios: VBIOS version (nvmlDeviceGetVbiosVersion).
        inforom: InfoROM image version (nvmlDeviceGetInforomImageVersion).
        state: up, unknown, lost, hung, crashed, denied.
        verdict: the verdict now (``unknown`` when none is known).
        domain: its fault domain.
        cause: its cause.
        evidence: the deciding fault's evidence.
        pods: ``namespace/pod/container`` the kubelet assigned the GPU to.
    """

    uuid: str
    index: str = ""
    pci_bus_id: str = ""
    serial: str = ""
    name: str = ""
    vbios: str = ""
    inforom: str = ""
    state: str = "unknown"
    verdict: str = "unknown"
    domain: str = "none"
    cause: str = "no_fresh_sample"
    evidence: tuple[str, ...] = ()
    pods: tuple[str, ...] = ()


@dataclass(frozen=True)
class Now:
    """What is true now, for a record.

    Attributes:
        source: ``live`` (the running exporter) or ``files`` (its timeline file; the exporter is down).
        node: the node's name (``NVGPU_NODE_NAME``, else the host name).
        boot_id: this boot's id.
        versions: driver, kernel module, NVML, its library path, nvidia-ml-py, CUDA driver, exporter.
        node_faults: (cause, evidence) of the node's or the exporter's pod's faults.
        gpus: every GPU known, by index.
        fresh: a fresh sample exists (live only).
    """

    source: str
    node: str
    boot_id: str
    versions: Mapping[str, str]
    node_faults: tuple[tuple[str, tuple[str, ...]], ...] = ()
    gpus: tuple[GpuNow, ...] = ()
    fresh: bool = False
    generated: float = field(default_factory=time.time)


def now_of(state: ServedState) -> Now:
    """:class:`Now` of the running exporter."""
    from exporter.supervisor.pods import PodAttribution

    pods = state.extension(PodAttribution)
    samples = {g.uuid: g for g in state.last.gpus} if state.last is not None else {}
    fresh = state.fresh_snapshot() is not None
    gpus = []
    for uuid, v in sorted(state.verdicts.current.items(), key=lambda kv: (_order(kv[1].gpu), kv[0])):
        rec = (  # no UUID (the device-cgroup case): known by its index, no lane of its own
            next((r for r in state.health.gpus.values() if not r.uuid and f"index:{r.index}" == uuid), None)
            if uuid.startswith("index:")
            else state.health.by_key(uuid)
        )
        uuid = "" if uuid.startswith("index:") else uuid
        g = samples.get(uuid) if uuid else None
        ident = g.reading(identity.Reading) if g is not None else None
        held = pods.assignments.get(uuid, ()) if pods is not None else ()
        gpus.append(
            GpuNow(
                uuid,
                v.gpu,
                (ident.pci_bus_id if ident else None) or (rec.bus_id if rec else ""),
                (ident.serial if ident else None) or "",
                (ident.name if ident else None) or "",
                (ident.vbios_version if ident else None) or "",
                (ident.inforom_version if ident else None) or "",
                state.health.state_of(rec, fresh) if rec is not None else "unknown",
                v.verdict,
                v.domain,
                v.cause,
                v.faults[0].evidence if v.faults else (),
                tuple(sorted(f"{r.namespace}/{r.pod}/{r.container}" for r in held)),
            )
        )
    native = state.native
    versions = {
        "driver": state.system.driver_version,
        "kernel_module": state.nvml.kernel_module_version,
        "nvml": state.system.nvml_version,
        "nvml_library_path": (native.realpath or native.path) if native is not None else "",
        "nvml_library_version": native.library_version if native is not None else "",
        "nvml_library_origin": native.origin if native is not None else "",
        "nvidia_ml_py": state.system.nvidia_ml_py_version,
        "cuda_driver": state.system.cuda_driver_version,
        "exporter": __version__,
    }
    faults = tuple((f.cause, f.evidence) for f in state.verdicts.node_faults)
    boot = state.recorder.timeline.boot_id
    return Now("live", state.config.node_name or socket.gethostname(), boot, versions, faults, tuple(gpus), fresh)


def now_from_files(timeline: Timeline, node: str = "") -> Now:
    """:class:`Now` from the timeline file alone: each GPU as last seen, its last verdict recorded."""
    gpus = []
    for lane in timeline.gpu_lanes():
        ident, last = lane.identity, lane.last
        verdict = last.get("verdict")
        v = [str(x) for x in verdict] if isinstance(verdict, list) and len(verdict) == 3 else ["unknown", "none", ""]
        pods = last.get("pods")
        gpus.append(
            dataclasses.replace(
                _from_identity(lane.key, ident),
                state=f"{last.get('state') or 'unknown'} (last seen)",
                verdict=v[0],
                domain=v[1],
                cause=v[2] or "no_fresh_sample",
                pods=tuple(str(p) for p in pods) if isinstance(pods, list) else (),
            )
        )
    meta = timeline.meta
    keys = {
        "driver": "driver_version",
        "kernel_module": "kernel_module_version",
        "nvml": "nvml_version",
        "nvml_library_path": "nvml_library",
        "nvml_library_version": "nvml_library_version",
        "nvml_library_origin": "nvml_library_origin",
        "nvidia_ml_py": "nvidia_ml_py_version",
        "cuda_driver": "cuda_driver_version",
    }
    versions = {k: str(meta.get(m) or "") for k, m in keys.items()}
    versions["exporter"] = __version__
    return Now("files", node or socket.gethostname(), str(meta.get("boot_id") or ""), versions, (), tuple(gpus))


# -- the record ------------------------------------------------------------------------------------


def find_gpu(now: Now, timeline: Timeline, target: str) -> tuple[GpuNow, Lane | None] | None:
    """The GPU a target names (UUID, index or PCI bus id), now or on the timeline; None when none."""
    for g in now.gpus:
        if target in (g.uuid, g.index) or (g.pci_bus_id and target.lower() == g.pci_bus_id.lower()):
            return g, timeline.lanes.get(g.uuid)
    lane = timeline.find_lane(target)
    if lane is None or lane.key == NODE:
        return None
    return dataclasses.replace(_from_identity(lane.key, lane.identity), state="absent"), lane


def _from_identity(uuid: str, ident: Mapping[str, Any]) -> GpuNow:
    """A GPU known only by its lane's identity (as last seen)."""
    i = {k: str(ident.get(k) or "") for k in ("index", "pci_bus_id", "serial", "name", "vbios", "inforom")}
    return GpuNow(uuid, i["index"], i["pci_bus_id"], i["serial"], i["name"], i["vbios"], i["inforom"])


def record(now: Now, timeline: Timeline, recovery: RecoveryTracker, target: str, window_s: float) -> dict[str, Any]:
    """The record of ``target`` (``node``, or a GPU's UUID, index or PCI bus id), JSON-ready
    (schema: docs/incidents.md).

    Raises:
        KeyError: no GPU matches ``target``.
    """
    if target == NODE:
        return _node_record(now, timeline, recovery, window_s)
    found = find_gpu(now, timeline, target)
    if found is None:
        raise KeyError(target)
    return _gpu_record(now, timeline, recovery, *found, window_s)


def _head(now: Now, kind: str) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": rfc3339(now.generated),
        "exporter_version": __version__,
        "source": now.source,
        "fresh": now.fresh,
        "record_of": kind,
    }


def episode(lane: Lane | None) -> list[Event]:
    """The GPU's current (or last) episode: the events from the first evidence after its last
    stretch of ``ok`` to now."""
    if lane is None:
        return []
    events = lane.events
    verdicts = [i for i, e in enumerate(events) if e.kind == "verdict"]
    bad = [i for i in verdicts if events[i].data.get("to") not in ("ok", "unknown")]
    if not bad:
        return []
    last_bad = bad[-1]
    start = 0
    for i in reversed([i for i in verdicts if i < last_bad]):
        if events[i].data.get("to") == "ok":
            start = i + 1
            break
    first = next((i for i in range(start, len(events)) if events[i].kind in EVIDENCE), last_bad)
    return events[min(first, last_bad) :]


def _signature(g: GpuNow, events: list[Event]) -> dict[str, Any]:
    verdict, domain, cause, evidence = g.verdict, g.domain, g.cause, list(g.evidence)
    if RANK.get(verdict, 0) == 0 and events:  # ok now: the last episode's worst verdict
        worst = max((e for e in events if e.kind == "verdict"), key=lambda e: RANK.get(str(e.data.get("to")), 0))
        verdict, domain, cause = (str(worst.data.get(k) or "") for k in ("to", "domain", "cause"))
        raw = worst.data.get("evidence")
        evidence = [str(x) for x in raw] if isinstance(raw, list) else []
    row = CAUSES.get(cause)
    return {
        "verdict": verdict,
        "domain": domain,
        "cause": cause,
        "action": row.action if row else "",
        "owner": row.owner if row else "",
        "evidence": evidence,
        "current": g.verdict == verdict,
    }


def _pods(g: GpuNow, events: Iterable[Event]) -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for held in g.pods:
        ns, _, rest = held.partition("/")
        pod, _, container = rest.partition("/")
        out[held] = {"namespace": ns, "pod": pod, "container": container, "pod_uid": "", "source": "kubelet (now)"}
    for e in events:
        d = e.data
        if e.kind == "xid" and d.get("pod"):
            key = f"{d.get('namespace')}/{d.get('pod')}/{d.get('container')}"
            source = f"Xid {d.get('xid')} (pid {d.get('pid')})"
            out.setdefault(
                key, {k: d.get(k) for k in ("namespace", "pod", "container", "pod_uid")} | {"source": source}
            )
    return list(out.values())


def _lines(events: Iterable[Event], kinds: tuple[str, ...]) -> list[str]:
    return [
        f"{rfc3339(e.ts)} {e.summary}" + (f" (x{e.count})" if e.count > 1 else "") for e in events if e.kind in kinds
    ]


def _gpu_record(
    now: Now, timeline: Timeline, recovery: RecoveryTracker, g: GpuNow, lane: Lane | None, window_s: float
) -> dict[str, Any]:
    events = episode(lane)
    sig = _signature(g, events)
    watch = recovery.latest(g.uuid)
    first = events[0] if events else None
    pods = _pods(g, events)
    commands = runbook.gpu_commands(g.index, g.pci_bus_id, now.boot_id)
    gpu_id = {"index": g.index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id, "serial": g.serial, "name": g.name}
    found = {step: _lines(events, kinds) for step, kinds in STEP_KINDS.items()}
    found[1] = [
        f"GPU {g.index} {g.uuid} at PCI {g.pci_bus_id or '?'} (serial {g.serial or '?'}) on node {now.node}, "
        f"state {g.state}",
        *(f"pod {p['namespace']}/{p['pod']} ({p['source']})" for p in pods),
        *([f"first seen {rfc3339(first.ts)}: {first.summary}"] if first else []),
    ]
    found[5] = [*found[5], *(f"{c}: {e}" for e in sig["evidence"] for c in [sig["cause"]] if c in LINK_CAUSES)]
    found[6] = [*found[6], f"verdict {sig['verdict']} ({sig['domain']}: {sig['cause']}): {sig['action']}"]
    out = _head(now, "gpu")
    out.update(
        signature=sig,
        status=watch.state if watch is not None else ("open" if RANK.get(g.verdict, 0) >= 1 else "none"),
        first_seen=rfc3339(first.ts) if first else "",
        first_seen_timestamp_seconds=first.ts if first else None,
        affected={"gpu": gpu_id, "node": {"name": now.node, "boot_id": now.boot_id}, "pods": pods},
        versions={**now.versions, "vbios": g.vbios, "inforom": g.inforom},
        evidence=runbook.evidence_steps(found, runbook.step_commands(g.index, g.pci_bus_id, now.node, pods)),
        reproduction=runbook.REPRODUCTION,
        diagnostic_commands=commands,
        temporary_handling=runbook.handling(sig["verdict"], g.index, g.pci_bus_id, now.node),
        recovery_check={
            "summary": watch.summary() if watch is not None else "no recovery to check: nothing was acted on",
            "watch": _watch_json(watch),
            "steps": runbook.recovery_steps(g.index, g.pci_bus_id),
        },
        conclusion=runbook.conclusion(sig["domain"], sig["cause"]),
        recurrence_threshold=runbook.recurrence(sig["cause"], window_s),
        timeline=[e.to_json() for e in events[-EVENTS_IN_RECORD:]],
        timeline_truncated=len(events) > EVENTS_IN_RECORD,
        evicted=lane.evicted if lane else 0,
    )
    return out


def _watch_json(watch: Any) -> dict[str, Any] | None:
    if watch is None:
        return None
    return {
        "signature": watch.signature,
        "verdict": watch.verdict,
        "state": watch.state,
        "opened": rfc3339(watch.opened),
        "action": watch.action,
        "action_at": rfc3339(watch.action_at) if watch.action_at else None,
        "detail": watch.detail,
        "back_at": rfc3339(watch.back_at) if watch.back_at else None,
        "signature_cleared": watch.cleared,
        "watch_until": rfc3339(watch.until) if watch.until else None,
        "ended_at": rfc3339(watch.ended_at) if watch.ended_at else None,
        "recurred_by": watch.recurred_by,
    }


def _node_record(now: Now, timeline: Timeline, recovery: RecoveryTracker, window_s: float) -> dict[str, Any]:
    worst = max(now.gpus, key=lambda g: (RANK.get(g.verdict, 0), g.verdict == "fix_exporter"), default=None)
    node_lane = timeline.lanes.get(NODE)
    gpu_events = [e for lane in timeline.gpu_lanes() for e in lane.events if e.kind in ("verdict", "recovery")]
    events = sorted([*(node_lane.events if node_lane else []), *gpu_events], key=lambda e: e.seq)
    bad = [g for g in now.gpus if RANK.get(g.verdict, 0) >= 1 or g.verdict == "fix_exporter"]
    sig: dict[str, Any] = {
        "verdict": "ok",
        "domain": "none",
        "cause": "none",
        "action": "",
        "owner": "",
        "evidence": [],
    }
    if worst is not None and worst.verdict != "ok":
        row = CAUSES.get(worst.cause)
        sig = {
            "verdict": worst.verdict,
            "domain": worst.domain,
            "cause": worst.cause,
            "gpu": worst.index,
            "action": row.action if row else "",
            "owner": row.owner if row else "",
            "evidence": list(worst.evidence),
        }
    for cause, evidence in now.node_faults:
        sig["evidence"] = [*sig["evidence"], *(f"{cause}: {e}" for e in evidence)]
    gpus = [
        {
            "index": g.index,
            "uuid": g.uuid,
            "pci_bus_id": g.pci_bus_id,
            "serial": g.serial,
            "state": g.state,
            "verdict": g.verdict,
            "domain": g.domain,
            "cause": g.cause,
            "vbios": g.vbios,
            "inforom": g.inforom,
            "recovery": (w.summary() if (w := recovery.latest(g.uuid)) else ""),
        }
        for g in now.gpus
    ]
    firsts = [e for g in bad for e in episode(timeline.lanes.get(g.uuid))[:1]]
    first = min(firsts, key=lambda e: e.seq) if firsts else None
    pods = [p for g in bad for p in _pods(g, episode(timeline.lanes.get(g.uuid)))]
    found = {step: _lines(events, kinds) for step, kinds in STEP_KINDS.items()}
    found[1] = [f"node {now.node}, boot {now.boot_id or '?'}; {len(now.gpus)} GPU(s), {len(bad)} not ok", *found[1]]
    out = _head(now, "node")
    out.update(
        signature=sig,
        status="open" if bad else "none",
        first_seen=rfc3339(first.ts) if first else "",
        first_seen_timestamp_seconds=first.ts if first else None,
        affected={"node": {"name": now.node, "boot_id": now.boot_id}, "gpus": gpus, "pods": pods},
        versions=dict(now.versions),
        evidence=runbook.evidence_steps(found, runbook.step_commands("", "", now.node, pods)),
        reproduction=runbook.REPRODUCTION,
        diagnostic_commands=runbook.node_commands(now.boot_id),
        temporary_handling=runbook.handling(sig["verdict"], worst.index if worst else "", "", now.node),
        recovery_check={
            "summary": "; ".join(f"GPU {g['index']}: {g['recovery']}" for g in gpus if g["recovery"]),
            "steps": runbook.recovery_steps("", ""),
        },
        conclusion=runbook.conclusion(sig["domain"], sig["cause"]),
        recurrence_threshold=runbook.recurrence(sig["cause"], window_s),
        timeline=[e.to_json() for e in events[-EVENTS_IN_RECORD:]],
        timeline_truncated=len(events) > EVENTS_IN_RECORD,
        evicted=node_lane.evicted if node_lane else 0,
    )
    return out


def _order(text: str) -> int:
    return int(text) if text.isdigit() else 1 << 30
