"""Every metric family is findable in one hop: declared once, under its exported name, in the
module docs/metrics.md names; nothing emitted or declared that the page does not list."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
from pathlib import Path

import pytest
from goldens import GOLDENS

import exporter
from exporter.common import collectors
from exporter.common.metric import MetricDef

ROOT = Path(__file__).resolve().parent.parent
NAMESPACES = ("nvgpu_", "process_")  # ours, and the standard process collector's names
METRICS_MD = ROOT / "docs" / "metrics.md"


def declared() -> dict[str, list[tuple[str, MetricDef]]]:
    """Exported name -> [(defining module, definition)] over every module of the exporter package.

    A module defines a family when it holds the MetricDef and its source spells the name (a module
    that imports another's definition holds it without spelling it)."""
    out: dict[str, list[tuple[str, MetricDef]]] = {}
    for info in pkgutil.walk_packages(exporter.__path__, "exporter."):
        if info.name.endswith("__main__") or "_pb2" in info.name:
            continue
        module = importlib.import_module(info.name)
        source = Path(str(module.__file__)).read_text()
        for value in vars(module).values():
            if isinstance(value, MetricDef) and f'"{value.name}"' in source:
                out.setdefault(value.name, []).append((info.name, value))
    return out


def documented() -> dict[str, str]:
    """Name -> module path from the last column of docs/metrics.md."""
    out = {}
    for line in METRICS_MD.read_text().splitlines():
        if line.startswith(("| `nvgpu_", "| `process_")):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            out[cells[0].strip("`")] = cells[-1].strip("`")
    return out


DECLARED = declared()
DOCUMENTED = documented()


def test_each_family_is_declared_once() -> None:
    twice = {name: [m for m, _ in entries] for name, entries in DECLARED.items() if len(entries) != 1}
    assert not twice, f"declared in more than one place: {twice}"


def test_docs_list_exactly_the_declared_families() -> None:
    assert set(DOCUMENTED) - set(DECLARED) == set(), "listed in docs/metrics.md but nothing declares it"
    assert set(DECLARED) - set(DOCUMENTED) == set(), "declared but not listed in docs/metrics.md"


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_docs_name_the_declaring_module(name: str) -> None:
    (module, _), *_ = DECLARED[name]
    assert DOCUMENTED.get(name) == module.replace(".", "/") + ".py"


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_grep_of_the_exported_name_finds_the_definition(name: str) -> None:
    """`grep -rn <name> exporter/` (the newcomer's one hop) lands on the MetricDef."""
    out = subprocess.run(
        ["grep", "-rn", "--include=*.py", f'"{name}"', "exporter"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    (module, _), *_ = DECLARED[name]
    assert module.replace(".", "/") + ".py:" in out, out


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_counters_and_only_counters_end_in_total(name: str) -> None:
    (_, spec), *_ = DECLARED[name]
    assert spec.counter == name.endswith("_total")
    assert spec.help.strip() and name.startswith(NAMESPACES)


def test_every_emitted_family_is_declared() -> None:
    emitted = {name for fams in GOLDENS.values() for name in fams}
    assert emitted - set(DECLARED) == set()


@pytest.mark.parametrize("feature", sorted(collectors.COLLECTORS))
def test_collector_metrics_are_its_declarations(feature: str) -> None:
    """A collector's METRICS lists exactly the families declared in its module."""
    collector = collectors.COLLECTORS[feature]
    module = f"exporter.common.collectors.{feature}"
    own = {name for name, entries in DECLARED.items() if entries[0][0] == module}
    assert {m.name for m in collector.METRICS} == own
