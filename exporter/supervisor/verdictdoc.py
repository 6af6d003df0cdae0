"""The ``/api/v1/verdicts`` document (versioned JSON, schema in docs/verdicts.md) and its one-line summary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from exporter.common.collectors import identity
from exporter.supervisor.classify import ServedState, is_fresh, order, utc
from exporter.supervisor.faulttable import Fault

if TYPE_CHECKING:
    from exporter.supervisor.verdicts import VerdictEngine

SCHEMA_VERSION = 1


def fault_json(f: Fault) -> dict[str, object]:
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
    for v in sorted(engine.current.values(), key=lambda v: (order(v.gpu), v.uuid)):
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
                "state": state.health.state_of(rec, is_fresh(state)) if rec is not None else "unknown",
                "verdict": v.verdict,
                "domain": v.domain,
                "cause": v.cause,
                "action": v.action,
                "owner": v.faults[0].owner if v.faults else "",
                "since": utc(v.since_wall),
                "since_timestamp_seconds": v.since_wall,
                "age_seconds": round(max(0.0, now - v.since_mono), 3),
                "faults": [fault_json(f) for f in v.faults if f.cause != "none"],
                "recent_xids": [
                    {
                        "xid": r.xid,
                        "time": utc(r.ts),
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
        "generated_at": utc(wall),
        "exporter_version": __version__,
        "fresh": is_fresh(state),
        "node": {
            "verdict": node.verdict if node else "unknown",
            "domain": node.domain if node else "none",
            "cause": node.cause if node else "no_fresh_sample",
            "gpu": node.gpu if node else "",
            "uuid": node.uuid if node else "",
            "faults": [fault_json(f) for f in engine.node_faults],
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
                "time": utc(t.wall),
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
