"""The PromQL in docs/rollout.md is tested by promtool against series the
exporter really emits.

deploy/prometheus/tests/rollout_queries.yaml evaluates every query of the page on a stable node, a
canary node whose worker crashed into a quarantine, and a node of another model. This test keeps
page and test file together (a query edited on the page and not in the test fails here) and keeps
the test's input honest: each series it feeds is, by name and label names, a series of a golden
exposition, with label values the metric reference allows.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from goldens import DOCS, GOLDENS
from promql_docs import promql_blocks

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
ROLLOUT = ROOT / "docs" / "rollout.md"
TESTS = ROOT / "deploy" / "prometheus" / "tests" / "rollout_queries.yaml"
TARGET_LABELS = {"job", "instance", "node", "track", "exporter_pod"}
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds"}  # made by Prometheus, not the exporter
NOT_OURS = ("kube_", "container_")  # kube-state-metrics and cAdvisor series: not the exporter's


def _normal(expr: str) -> str:
    return re.sub(r"\s+", " ", expr).strip()


def _data() -> dict:  # type: ignore[type-arg]
    return dict(yaml.safe_load(TESTS.read_text()))


def test_every_query_on_the_page_is_tested() -> None:
    tested = {_normal(case["expr"]) for t in _data()["tests"] for case in t["promql_expr_test"]}
    page = [_normal(e) for e in promql_blocks(ROLLOUT)]
    ours = [e for e in page if not any(re.search(rf"\b{p}\w+", e) for p in NOT_OURS)]
    assert len(ours) >= 20
    assert [e for e in ours if e not in tested] == []
    assert tested <= set(page), "the test file holds queries the page no longer has"


def _series(text: str) -> tuple[str, dict[str, str]]:
    m = re.fullmatch(r"(\w+)\{(.*)\}", text.strip())
    assert m, text
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
    return m.group(1), labels


def _golden_label_sets() -> dict[str, set[frozenset[str]]]:
    out: dict[str, set[frozenset[str]]] = {}
    for families in GOLDENS.values():
        for fam in families.values():
            for sample, labels, _value in fam.samples:
                out.setdefault(sample, set()).add(frozenset(labels))
    return out


def test_input_series_are_series_the_exporter_emits() -> None:
    emitted = _golden_label_sets()
    for t in _data()["tests"]:
        for entry in t["input_series"]:
            name, labels = _series(entry["series"])
            assert TARGET_LABELS & set(labels) == {"job", "instance", "node", "track", "exporter_pod"}, entry
            if name in PROMETHEUS_SERIES:
                continue
            own = frozenset(set(labels) - TARGET_LABELS)
            assert name in emitted, f"{name} is in no golden exposition"
            assert own in emitted[name], f"{name}{sorted(own)}: the exporter emits {sorted(map(sorted, emitted[name]))}"
            doc = DOCS.get(name)
            assert doc is not None, name
            for label, allowed in doc.values.items():
                if label in labels:
                    assert labels[label] in allowed, f"{name}{{{label}={labels[label]!r}}} not in {sorted(allowed)}"


def test_promtool_runs_the_queries() -> None:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    proc = subprocess.run([exe, "test", "rules", str(TESTS)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("wrong", ['nvgpu_feature_enabled{track="canary", reason="quarantined"} == 1'])
def test_the_old_quarantine_query_would_find_nothing(wrong: str) -> None:
    """The page's old query compared the quarantine series with 1; its value is 0."""
    values = [
        float(s[2])
        for fams in GOLDENS.values()
        for fam in fams.values()
        for s in fam.samples
        if s[0] == "nvgpu_feature_enabled" and s[1].get("reason") == "quarantined"
    ]
    assert values and set(values) == {0.0}
    assert _normal(wrong) not in {_normal(e) for e in promql_blocks(ROLLOUT)}
