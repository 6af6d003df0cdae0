"""Alert rules: promtool, the PrometheusRule copy, and consistency with catalog, metrics and runbook.

Runs `promtool check rules` and `promtool test rules` (deploy/prometheus/tests/) when promtool is
installed (Debian package `prometheus`; CI installs it), and checks without promtool that:
every Xid regex in the rules equals the catalog's codes, every metric a rule reads is documented
in docs/metrics.md (labels and label values included), every alert has a severity, a summary, a
description and a runbook_url whose anchor exists in docs/runbook.md, every alert has a unit test
where it fires and one where it does not, and the PrometheusRule holds exactly the same groups.
Needs PyYAML.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from exporter.supervisor.xid import SEVERITIES, classify, codes_of_class, load_catalog
from exporter.supervisor.xid.reader import KmsgReader

ROOT = Path(__file__).resolve().parents[1]
PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "rules.yaml"
CRD = PROM / "prometheusrule.yaml"
UNIT_TESTS = sorted((PROM / "tests").glob("*.yaml"))
METRICS_MD = ROOT / "docs" / "metrics.md"
RUNBOOK_MD = ROOT / "docs" / "runbook.md"
RUNBOOK_BASE = "https://github.com/nvgpu-exporter/nvgpu-exporter/blob/main/docs/runbook.md#"
STORY_FIXTURE = ROOT / "tests" / "fixtures" / "kmsg" / "boot_xid13_31_43.kmsg"

PROMQL_WORDS = {
    # functions and aggregations the rules use
    "time", "increase", "changes", "floor", "max", "min", "sum", "count", "avg", "min_over_time",
    "max_over_time", "absent", "label_replace", "vector", "scalar", "rate", "humanize", "abs", "timestamp",
    # keywords
    "and", "or", "unless", "offset", "bool", "without", "by", "ignoring", "on", "group_left",
    "group_right",
}  # fmt: skip
BUILTIN_METRICS = {"up"}  # set by Prometheus itself for every target


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def groups() -> list[dict[str, Any]]:
    data = load_yaml(RULES)
    assert set(data) == {"groups"}
    result: list[dict[str, Any]] = data["groups"]
    return result


def rules_of(groups: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for group in groups:
        yield from group["rules"]


def alerts_of(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rules_of(groups) if "alert" in r]


def xid_set(regex: str) -> set[int]:
    assert re.fullmatch(r"\d+(\|\d+)*", regex), f"not a plain list of codes: {regex!r}"
    return {int(code) for code in regex.split("|")}


# -- promtool ---------------------------------------------------------------------------------


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=300, check=False)


def test_promtool_check_rules() -> None:
    result = run_promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests() -> None:
    assert UNIT_TESTS, "no promtool unit tests found"
    result = run_promtool("test", "rules", *map(str, UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(UNIT_TESTS), result.stdout


def test_promtool_check_rules_of_the_prometheusrule(tmp_path: Path) -> None:
    spec = load_yaml(CRD)["spec"]
    extracted = tmp_path / "from-crd.yaml"
    extracted.write_text(yaml.safe_dump({"groups": spec["groups"]}), encoding="utf-8")
    result = run_promtool("check", "rules", str(extracted))
    assert result.returncode == 0, result.stdout + result.stderr


# -- the PrometheusRule -----------------------------------------------------------------------


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_prometheusrule", PROM / "gen_prometheusrule.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prometheusrule_holds_the_same_groups(groups: list[dict[str, Any]]) -> None:
    crd = load_yaml(CRD)
    assert (crd["apiVersion"], crd["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert crd["metadata"]["name"] == "nvgpu-exporter"
    assert crd["spec"]["groups"] == groups


def test_prometheusrule_is_generated_output() -> None:
    rendered = generator().render(RULES.read_text(encoding="utf-8"))
    assert rendered == CRD.read_text(encoding="utf-8"), (
        "deploy/prometheus/prometheusrule.yaml is stale: run deploy/prometheus/gen_prometheusrule.py"
    )


def test_generator_rejects_foreign_top_level_keys() -> None:
    with pytest.raises(ValueError, match="exactly one top-level key"):
        generator().build({"groups": [], "extra": 1})


# -- catalog <-> rules ------------------------------------------------------------------------


def test_xid_classification_rules_match_the_catalog(groups: list[dict[str, Any]]) -> None:
    catalog = load_catalog()
    expected: dict[tuple[str, str], set[int]] = {}
    for code, info in catalog.items():
        if info.xid_class != "unknown":
            expected.setdefault((info.xid_class, info.severity), set()).add(code)
    found: dict[tuple[str, str], set[int]] = {}
    negated: list[tuple[tuple[str, str], set[int]]] = []
    for rule in rules_of(groups):
        if rule.get("record") != "nvgpu:xid_errors:increase1h":
            continue
        key = (rule["labels"]["class"], rule["labels"]["xid_severity"])
        match = re.fullmatch(r'nvgpu:xid_errors_unclassified:increase1h\{xid(=~|!~)"([0-9|]+)"\}', rule["expr"].strip())
        assert match, rule["expr"]
        if match[1] == "=~":
            assert key not in found, f"two rules for {key}"
            found[key] = xid_set(match[2])
        else:
            negated.append((key, xid_set(match[2])))
    for key in expected.keys() | found.keys():
        want = "|".join(map(str, sorted(expected.get(key, ()))))
        assert found.get(key) == expected.get(key), f'class/severity {key}: rules.yaml should read xid=~"{want}"'
    everything_known = {c for c, i in catalog.items() if i.xid_class != "unknown"}
    assert negated == [(("unknown", "warning"), everything_known)], (
        "the catch-all rule must be xid!~ every catalog code outside class unknown, labelled "
        "class=unknown, xid_severity=warning"
    )
    unknown = classify(100_000)
    assert (unknown.xid_class, unknown.severity) == ("unknown", "warning")


def test_every_xid_selector_in_alerts_matches_the_catalog(groups: list[dict[str, Any]]) -> None:
    application = set(codes_of_class("application"))
    for alert in alerts_of(groups):
        for op, value in re.findall(r'xid\s*(=~|!~|=|!=)\s*"([^"]*)"', alert["expr"]):
            if op == "=~":
                assert xid_set(value) == application, (alert["alert"], value)
            else:
                # single codes the policy names on purpose: Xid 43 and the stuck context
                assert (op, value) == ("=", "43"), (alert["alert"], op, value)
                assert 43 in application


def test_policy_pins(groups: list[dict[str, Any]]) -> None:
    by_name = {a["alert"]: a for a in alerts_of(groups)}
    assert by_name["NvgpuXidApplicationError"]["labels"]["severity"] == "info"
    assert 'class="application"' in by_name["NvgpuXidApplicationError"]["expr"]
    assert by_name["NvgpuXidApplicationErrorsRepeated"]["labels"]["severity"] == "warning"
    assert by_name["NvgpuGpuContextStuck"]["labels"]["severity"] == "critical"
    assert "nvgpu_stuck_context_suspected == 1" in by_name["NvgpuGpuContextStuck"]["expr"]
    assert 'xid_severity="critical"' in by_name["NvgpuXidCritical"]["expr"]
    assert by_name["NvgpuXidCritical"]["labels"]["severity"] == "critical"


# -- metric names, labels and values ----------------------------------------------------------


def documented_metrics() -> dict[str, tuple[str, bool]]:
    """name -> (its table row, whether it is a per-GPU metric with implicit gpu/uuid)."""
    rows: dict[str, tuple[str, bool]] = {}
    per_gpu = False
    for line in METRICS_MD.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            per_gpu = "Per GPU" in line
        match = re.match(r"\|\s*`(nvgpu_[a-z0-9_]+)`", line)
        if match:
            rows[match[1]] = (line, per_gpu)
    return rows


def strip_promql(expr: str) -> str:
    """Removes strings, label matchers, ranges and grouping clauses, leaving names and numbers."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', " ", expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(without|by|ignoring|on|group_left|group_right)\s*\([^)]*\)", " ", expr)
    return re.sub(r"\b\d+(?:\.\d+)?(?:ms|[smhdwy])?\b", " ", expr)  # numbers and durations


def selectors(expr: str) -> Iterator[tuple[str, str]]:
    """Yields (metric name, matcher text) for every selector with matchers."""
    for match in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}", expr):
        yield match[1], match[2]


def test_every_metric_in_the_rules_is_documented(groups: list[dict[str, Any]]) -> None:
    documented = documented_metrics()
    recorded = {r["record"] for r in rules_of(groups) if "record" in r}
    for rule in rules_of(groups):
        names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", strip_promql(rule["expr"])))
        names -= PROMQL_WORDS
        for name in names:
            assert name in documented or name in recorded or name in BUILTIN_METRICS, (
                f"{rule.get('alert') or rule.get('record')}: {name} is not in docs/metrics.md"
            )


def test_label_names_and_values_in_matchers_are_documented(groups: list[dict[str, Any]]) -> None:
    documented = documented_metrics()
    for rule in rules_of(groups):
        for name, matchers in selectors(rule["expr"]):
            if name not in documented:
                continue
            row, per_gpu = documented[name]
            for label, op, value in re.findall(r'(\w+)\s*(=~|!~|=|!=)\s*"([^"]*)"', matchers):
                if label in ("gpu", "uuid"):
                    assert per_gpu, (name, label)
                    continue
                assert f"`{label}`" in row, f"{name} has no label {label} in docs/metrics.md"
                if label != "xid" and op == "=":
                    assert re.search(rf"\b{re.escape(value)}\b", row), (
                        f'{name}{{{label}="{value}"}}: value not documented'
                    )


# -- alerts: labels, annotations, runbook, unit tests -----------------------------------------


def github_anchors(markdown: str) -> set[str]:
    anchors = set()
    for line in markdown.splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match:
            text = re.sub(r"[^\w\- ]", "", match[1].strip().lower())
            anchors.add(text.replace(" ", "-"))
    anchors |= set(re.findall(r'<a (?:id|name)="([^"]+)"', markdown))
    return anchors


def test_every_alert_has_severity_annotations_and_a_runbook_anchor(
    groups: list[dict[str, Any]],
) -> None:
    anchors = github_anchors(RUNBOOK_MD.read_text(encoding="utf-8"))
    names = [a["alert"] for a in alerts_of(groups)]
    assert len(names) == len(set(names)), "duplicate alert names"
    for alert in alerts_of(groups):
        assert alert["labels"]["severity"] in SEVERITIES, alert["alert"]
        annotations = alert["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, alert["alert"]
        url = annotations["runbook_url"]
        assert url.startswith(RUNBOOK_BASE), url
        anchor = url[len(RUNBOOK_BASE) :]
        assert anchor == alert["alert"].lower(), url
        assert anchor in anchors, f"docs/runbook.md has no heading for #{anchor}"


def test_every_alert_has_a_firing_and_a_silent_unit_test(groups: list[dict[str, Any]]) -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for path in UNIT_TESTS:
        data = load_yaml(path)
        assert data["rule_files"] == ["../rules.yaml"], path
        for test in data["tests"]:
            for case in test.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else silent).add(case["alertname"])
    names = {a["alert"] for a in alerts_of(groups)}
    assert names - fires == set(), "alerts never seen firing in a unit test"
    assert names - silent == set(), "alerts never seen staying silent in a unit test"
    assert (fires | silent) - names == set(), "unit tests name alerts that do not exist"


def test_story_test_uses_the_kernel_log_fixture_xids() -> None:
    """The rule story replays what the kernel-log fixture holds: one process, Xid 13, 31, 43."""
    with KmsgReader(STORY_FIXTURE, None) as reader:
        events = reader.poll()
    assert len({e.pid for e in events}) == 1
    kernel_counts: dict[str, int] = {}
    for event in events:
        kernel_counts[str(event.xid)] = kernel_counts.get(str(event.xid), 0) + 1
    story = load_yaml(PROM / "tests" / "xid_story.yaml")["tests"][0]
    story_counts = {}
    for series in story["input_series"]:
        match = re.match(r'nvgpu_xid_errors_total\{.*xid="(\d+)"', series["series"])
        if match:
            story_counts[match[1]] = int(float(series["values"].split()[-1].split("x")[0]))
    assert story_counts == kernel_counts == {"13": 2, "31": 1, "43": 1}


def test_fleet_rules_aggregate_every_gpu_series_without_its_gpu_labels(groups: list[dict[str, Any]]) -> None:
    """Per-target rules keep the target labels (node, cluster), drop only gpu and uuid; the
    cluster rules read the per-target ones (or the raw series for means), by cluster alone."""
    fleet = next(g for g in groups if g["name"] == "nvgpu-fleet")
    records = {r["record"]: " ".join(r["expr"].split()) for r in fleet["rules"]}
    instance = {k: v for k, v in records.items() if k.startswith("instance:")}
    cluster = {k: v for k, v in records.items() if k.startswith("cluster:")}
    assert set(records) == set(instance) | set(cluster) and len(instance) >= 8 and len(cluster) >= 8
    for name, expr in instance.items():
        assert "without (gpu, uuid)" in expr, (name, expr)
        assert name.split(":")[1] in expr, f"{name} should be named after the metric it aggregates: {expr}"
    for name, expr in cluster.items():
        assert expr.split("(", 1)[0].strip() in ("sum by", "avg by", "count by"), (name, expr)
        assert "by (cluster" in expr and "without" not in expr, (name, expr)
