"""The incident record as Markdown, in the runbook's field order (docs/runbook.md, "What every
incident record holds"), to paste into a ticket.

Renders the JSON record of :func:`exporter.supervisor.incident.record` (nothing is looked up here),
so the live API, ``nvgpu-exporter diagnose`` and its offline mode print the same text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _code(text: object) -> str:
    body = str(text).replace("`", "'")
    return f"`{body}`" if body else "-"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ") or "-"


def _list(items: Sequence[object], indent: str = "") -> list[str]:
    return [f"{indent}- {item}" for item in items] or [f"{indent}- (none)"]


def markdown(rec: Mapping[str, Any]) -> str:
    """The record as Markdown."""
    sig = rec.get("signature", {})
    affected = rec.get("affected", {})
    node = affected.get("node", {})
    gpu = affected.get("gpu")
    title = f"GPU {gpu.get('index')} ({gpu.get('uuid')})" if gpu else f"node {node.get('name')}"
    out = [
        f"# Incident record: {title}",
        "",
        f"Generated {rec.get('generated_at')} by nvgpu-exporter {rec.get('exporter_version')} "
        f"from {'the running exporter' if rec.get('source') == 'live' else 'its files (the exporter was down)'}; "
        f"status **{rec.get('status')}**.",
        "",
        "## Signature",
        "",
        f"Verdict **{sig.get('verdict')}**, domain **{sig.get('domain')}**, cause {_code(sig.get('cause'))}"
        + ("" if sig.get("current", True) else " (the last episode's; the GPU is ok now)"),
        "",
        *_list([_code(e) for e in sig.get("evidence", [])]),
        "",
        "## First seen",
        "",
        rec.get("first_seen") or "no episode on the timeline",
        "",
        "## Affected",
        "",
    ]
    if gpu:
        out.append(
            f"- GPU index {gpu.get('index')}, UUID {_code(gpu.get('uuid'))}, "
            f"PCI bus id {_code(gpu.get('pci_bus_id'))}, serial {_code(gpu.get('serial'))}, "
            f"{gpu.get('name') or 'model unknown'}"
        )
    out.append(f"- node {_code(node.get('name'))}, boot id {_code(node.get('boot_id'))}")
    for g in affected.get("gpus", []):
        out.append(
            f"- GPU {g.get('index')} {_code(g.get('uuid'))} ({g.get('pci_bus_id')}): {g.get('verdict')} "
            f"({g.get('domain')}: {g.get('cause')}), state {g.get('state')}"
            + (f"; {g.get('recovery')}" if g.get("recovery") else "")
        )
    for p in affected.get("pods", []):
        out.append(f"- pod {p.get('namespace')}/{p.get('pod')} container {p.get('container')} ({p.get('source')})")
    out += ["", "## Versions", "", "| component | version |", "|---|---|"]
    out += [f"| {_cell(k)} | {_cell(v)} |" for k, v in rec.get("versions", {}).items()]
    out += ["", "## Reproduction", "", str(rec.get("reproduction", "")), "", "## Evidence, in the atlas's order", ""]
    for step in rec.get("evidence", []):
        out += [f"### {step.get('step')}. {step.get('name')}", ""]
        found = step.get("found") or []
        if found:
            out += _list([_cell(f) for f in found])
        elif step.get("not_seen_by_the_exporter"):
            out.append("- not seen by the exporter")
        else:
            out.append("- nothing recorded")
        if step.get("next"):
            out += ["", "Next:", "", *_list([_code(c) for c in step["next"]])]
        out.append("")
    out += ["## Diagnostic commands", "", "```sh"]
    out += [f"{c.get('shell')}   # {c.get('why')}" for c in rec.get("diagnostic_commands", [])]
    out += ["```", "", "## Temporary handling", "", str(rec.get("temporary_handling", "")), "", "## Recovery check", ""]
    check = rec.get("recovery_check", {})
    out += [f"**{check.get('summary')}**" if check.get("summary") else "nothing to check", ""]
    out += [f"{n}. {s}" for n, s in enumerate(check.get("steps", []), start=1)]
    out += ["", "## Repair conclusion", "", str(rec.get("conclusion", "")), ""]
    out += ["## Recurrence threshold", "", str(rec.get("recurrence_threshold", "")), "", "## Timeline", ""]
    events = rec.get("timeline", [])
    if events:
        out += ["| seq | time | GPU | kind | what |", "|---|---|---|---|---|"]
        for e in events:
            count = f" (x{e.get('count')})" if (e.get("count") or 1) > 1 else ""
            out.append(
                f"| {e.get('seq')} | {e.get('time')} | {_cell(e.get('gpu'))} | {e.get('kind')} | "
                f"{_cell(e.get('summary'))}{count} |"
            )
        if rec.get("timeline_truncated"):
            out += ["", "(earlier events of the episode: /api/v1/timeline)"]
    else:
        out.append("no events")
    return "\n".join(out) + "\n"
