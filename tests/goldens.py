"""What the goldens (tests/golden/*.prom) and docs/metrics.md say, parsed once for every test
that reads them (test_golden.py, test_metric_defs.py, test_rollout_queries.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
METRICS_MD = ROOT / "docs" / "metrics.md"


@dataclass
class Family:
    name: str
    type: str
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)


def parse_golden(path: Path) -> dict[str, Family]:
    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        out[name] = Family(
            name, fam.type, fam.documentation, [(s.name, dict(s.labels), float(s.value)) for s in fam.samples]
        )
    return out


GOLDENS = {p.stem: parse_golden(p) for p in sorted(GOLDEN.glob("*.prom"))}


@dataclass
class Doc:
    name: str
    type: str  # counter or gauge
    per_gpu: bool
    labels: set[str]
    values: dict[str, set[str]]  # closed enumerations of label values


def parse_docs() -> dict[str, Doc]:
    docs: dict[str, Doc] = {}
    per_gpu = None
    for line in METRICS_MD.read_text().splitlines():
        if line.startswith("## "):
            per_gpu = line.startswith("## Per GPU")
            continue
        if not line.startswith(("| `nvgpu_", "| `process_")):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = cells[0].strip("`")
        labels = set(re.findall(r"`(\w+)`", cells[2]))
        values = {}
        enumerations = re.sub(r"\s*\([^)]*\)", "", cells[2])  # "crash (killed by a signal)" -> "crash"
        for m in re.finditer(r"`(\w+)`\s*=\s*([^;`]+)", enumerations):
            items = [v.strip() for v in m.group(2).split(",")]
            if not any("…" in v or "..." in v for v in items):
                values[m.group(1)] = set(items)
        assert per_gpu is not None, line
        docs[name] = Doc(
            name,
            "counter" if cells[1].startswith("counter") else "gauge",
            per_gpu,
            labels | ({"gpu", "uuid"} if per_gpu else set()),
            values,
        )
    return docs


DOCS = parse_docs()
