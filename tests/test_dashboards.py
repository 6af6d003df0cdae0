"""The Grafana dashboards are import-ready, generated, and use only documented metrics.

tests/test_prometheus_e2e.py sends every query to a real Prometheus; this file checks what can be
checked without one: the committed JSON is what dashboards/generate.py builds, its structure is
what Grafana imports into any instance (a `datasource` variable, no data source UIDs), every
metric name is in docs/metrics.md, and the panels operators asked for exist. The event
panels say "none" while the exporter is scraped and nothing happened, and "No data" once it is not
(promtool evaluates their queries on a quiet exporter before and after a failed scrape).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dashboards import queries as dq  # noqa: E402
from exporter.supervisor.xid import CLASSES, UNKNOWN_CLASS, codes_of_class, promql_regex  # noqa: E402

FLEET = "gpu-fleet.json"
HEALTH = "exporter-health.json"
METRIC_RE = re.compile(r"\bnvgpu_[a-z0-9_]+\b")


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict[str, Any]]:
    return dq.load()


def documented_metrics() -> set[str]:
    text = (ROOT / "docs" / "metrics.md").read_text()
    return {m.group(1) for m in re.finditer(r"^\|\s*`(nvgpu_[a-z0-9_]+)`", text, re.M)}


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


def _exprs(dash: dict[str, Any]) -> list[str]:
    out = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    out += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return out


def test_committed_json_is_a_fresh_generation() -> None:
    pytest.importorskip(
        "grafana_foundation_sdk",
        reason="grafana-foundation-sdk (dashboards/requirements.txt, Python >= 3.11) "
        "is not installed: cannot regenerate the dashboards",
    )
    from dashboards import generate

    for name, build in generate.DASHBOARDS.items():
        committed = (ROOT / "dashboards" / name).read_text()
        assert committed == generate.render(build), f"dashboards/{name} is stale: run `python dashboards/generate.py`"


def test_generator_pins_the_sdk_it_was_written_for() -> None:
    pins = [
        line
        for line in (ROOT / "dashboards" / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert pins and all("==" in line for line in pins), pins


@pytest.mark.parametrize("name", [FLEET, HEALTH])
def test_import_ready_for_any_grafana(dashboards: dict[str, dict[str, Any]], name: str) -> None:
    dash = dashboards[name]
    assert dash["schemaVersion"] >= 41 and dash["uid"] and dash["title"]
    assert dash.get("id") is None, "an exported dashboard id would clash on import"
    assert "__inputs" not in dash and "__requires" not in dash
    ds_vars = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert [(v["name"], v["query"]) for v in ds_vars] == [("datasource", "prometheus")]
    refs = [(p, n) for p, n in _walk(dash) if p.endswith(".datasource") and isinstance(n, dict)]
    assert refs, "no data source references at all"
    wrong = [(p, n) for p, n in refs if n != {"type": "prometheus", "uid": "${datasource}"}]
    assert not wrong, f"hard-coded or foreign data sources: {wrong[:5]}"
    assert "DS_" not in json.dumps(dash), "an exported ${DS_...} input would make the file depend on an import dialog"


@pytest.mark.parametrize("name", [FLEET, HEALTH])
def test_panels_are_complete_and_do_not_overlap(dashboards: dict[str, dict[str, Any]], name: str) -> None:
    panels = dashboards[name]["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]
        if p["type"] == "row":
            assert not p.get("targets")
            continue
        assert p.get("description"), f"{p['title']!r} has no description"
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)) and all(t["expr"].strip() for t in p["targets"]), p["title"]
    titles = [p["title"] for p in panels if p["type"] != "row"]
    assert len(titles) == len(set(titles)), "panel titles identify panels in tests and must be unique"


@pytest.mark.parametrize("name", [FLEET, HEALTH])
def test_only_documented_metric_names(dashboards: dict[str, dict[str, Any]], name: str) -> None:
    documented = documented_metrics()
    assert len(documented) > 50, "docs/metrics.md parse failed"
    used = {m for expr in _exprs(dashboards[name]) for m in METRIC_RE.findall(expr)}
    assert used, "no metric names found"
    assert used <= documented, f"not in docs/metrics.md: {sorted(used - documented)}"


def test_the_fleet_dashboard_covers_the_issue(dashboards: dict[str, dict[str, Any]]) -> None:
    exprs = "\n".join(_exprs(dashboards[FLEET]))
    for needle in [
        "nvgpu_gpu_utilization_ratio",
        "nvgpu_memory_used_bytes",
        "nvgpu_memory_total_bytes",
        "nvgpu_power_usage_watts",
        "rate(nvgpu_energy_consumption_joules_total",
        "nvgpu_gpu_temperature_celsius",
        "nvgpu_memory_temperature_celsius",
        "nvgpu_clock_hertz",
        "rate(nvgpu_clock_event_reason_seconds_total",  # the exact counters, not the point flags
        "nvgpu_nvlink_links_up",  # per-GPU NVLink totals, and the links with errors
        "nvgpu_nvlink_errors_total",
        "nvgpu_nvlink_link_errors_total",
        "cluster:nvgpu_device_up:count",  # the Fleet row reads recording rules
        "cluster:nvgpu_gpu_utilization_ratio:avg",
        "instance:nvgpu_device_up:count",
        "nvgpu_ecc_volatile_errors_total",
        "nvgpu_ecc_aggregate_errors_total",
        "nvgpu_remapped_rows",
        "nvgpu_xid_errors_total",
        "label_replace(",
        "rate(nvgpu_nvlink_transmit_bytes_total",
        "rate(nvgpu_nvlink_receive_bytes_total",
        "nvgpu_gpu_pod_info",
        "nvgpu_stuck_context_suspected",
        # Profiling, throttle time, power scope, fabric
        "nvgpu_gpm_sm_activity_ratio",
        "nvgpu_gpm_tensor_activity_ratio",
        "nvgpu_gpm_sm_occupancy_ratio",
        "nvgpu_gpm_dram_bandwidth_ratio",
        "nvgpu_gpm_pipe_activity_ratio",
        "rate(nvgpu_gpm_nvlink_transmit_bytes_total",
        "rate(nvgpu_gpm_pcie_receive_bytes_total",
        "rate(nvgpu_clock_event_reason_seconds_total",
        "nvgpu_memory_power_usage_watts",
        "nvgpu_module_power_usage_watts",
        "nvgpu_fabric_state",
        "nvgpu_pod_memory_used_bytes",  # per-pod usage on shared GPUs
        "nvgpu_pod_sm_utilization_ratio",
        # MIG instances under their GPU
        "nvgpu_mig_mode",
        "nvgpu_mig_mode_pending",
        "nvgpu_mig_instance_info",
        "nvgpu_mig_memory_used_bytes",
        "nvgpu_mig_gpm_sm_activity_ratio",
    ]:
        assert needle in exprs, needle
    variables = {v["name"]: v for v in dashboards[FLEET]["templating"]["list"]}
    assert list(variables) == ["datasource", "cluster", "node", "instance", "gpu"]
    assert variables["cluster"]["query"] == "label_values(nvgpu_up, cluster)"
    assert "label_values(nvgpu_gpu_info" in variables["gpu"]["query"] and variables["gpu"]["query"].endswith(", uuid)")
    for name in ("cluster", "node", "instance", "gpu"):  # `.*` also matches series without the label
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*", name
    for p in dashboards[FLEET]["panels"]:  # every GPU panel follows the drill-down
        for t in p.get("targets", []):
            if "cluster:nvgpu_" in t["expr"] and "instance:" not in t["expr"]:  # per-cluster series
                assert 'cluster=~"$cluster"' in t["expr"], (p["title"], t["expr"])
                continue
            if "uuid" in t["expr"] or "nvgpu_gpu_" in t["expr"]:
                assert all(
                    f'{lbl}=~"${var}"' in t["expr"]
                    for lbl, var in [("cluster", "cluster"), ("node", "node"), ("instance", "instance")]
                ), (p["title"], t["expr"])


def test_the_health_dashboard_covers_the_issue(dashboards: dict[str, dict[str, Any]]) -> None:
    exprs = "\n".join(_exprs(dashboards[HEALTH]))
    for needle in [
        'up{job=~"$job"',
        "nvgpu_last_sample_age_seconds",  # the exporter's own age: no node-vs-Prometheus clock skew
        "sum by (reason) (increase(nvgpu_worker_restarts_total",
        "nvgpu_worker_crashes_total",
        'reason="quarantined"',
        "nvgpu_feature_success",
        "nvgpu_feature_duration_seconds",
        "nvgpu_selfcheck_failures",
        "nvgpu_build_info",
        "nvgpu_module_info",
        "increase(nvgpu_process_records_dropped_total",
        "nvgpu_process_api_info",
        "nvgpu_pod_attribution_source_up",
    ]:
        assert needle in exprs, needle
    job = next(v for v in dashboards[HEALTH]["templating"]["list"] if v["name"] == "job")
    # `up` exists for every target of every job: "All" must list the jobs, not match everything.
    assert job["includeAll"] and "allValue" not in job


def test_xid_classes_follow_the_catalog(dashboards: dict[str, dict[str, Any]]) -> None:
    classified = [e for e in _exprs(dashboards[FLEET]) if "nvgpu_xid_" in e]
    assert len(classified) >= 3
    for expr in classified:
        found = dict(re.findall(r'"class", "(\w+)", "xid", "([^"]*)"', expr))
        assert found.pop(UNKNOWN_CLASS) == ".*", "every code first gets class unknown"
        expected = {c: promql_regex(codes_of_class(c)) for c in CLASSES if c != UNKNOWN_CLASS and codes_of_class(c)}
        assert found == expected
        # The unknown default is the innermost label_replace (evaluated first), so the catalog classes override it.
        assert expr.index(f'"{UNKNOWN_CLASS}"') < min(expr.index(f'"{c}"') for c in expected)


def test_substitution_leaves_valid_promql_text() -> None:
    assert (
        dq.substitute('rate(x{a=~"$cluster", b=~"${gpu}", c=~"${node:regex}", d=~"[[instance]]"}[$__rate_interval])')
        == 'rate(x{a=~".*", b=~".*", c=~".*", d=~".*"}[1m])'
    )
    assert dq.substitute("increase(x[$__range])") == "increase(x[5m])"
    assert dq.substitute('label_replace(x, "y", "$1", "z", "(.*)")') == 'label_replace(x, "y", "$1", "z", "(.*)")'
    assert dq.substitute('x{a=~"$job"}', {"job": "nvgpu"}) == 'x{a=~"nvgpu"}'
    all_queries = list(dq.queries())
    assert len(all_queries) >= 40
    for dashboard, panel, expr in all_queries:
        assert not re.search(r"\$[A-Za-z_{]|\[\[", expr), (dashboard, panel, expr)


def test_variable_queries_become_promql() -> None:
    got = {(v.dashboard, v.variable): v for v in dq.variable_queries()}
    assert len(got) == 8
    v = got[("NVIDIA GPU fleet (nvgpu-exporter)", "gpu")]
    assert v.label == "uuid" and v.expr == 'group by (uuid) (nvgpu_gpu_info{cluster=~".*", node=~".*", instance=~".*"})'


def test_the_per_pod_usage_panel_shows_memory_and_sm_per_pod(dashboards: dict[str, dict[str, Any]]) -> None:
    """One table with both columns per (GPU, namespace, pod), drill-down filters kept."""
    panel = next(p for p in dashboards[FLEET]["panels"] if p["title"] == "Per-pod GPU usage")
    exprs = [t["expr"] for t in panel["targets"]]
    assert [e.split("(")[0] for e in exprs] == ["sum by ", "sum by "]
    assert "nvgpu_pod_memory_used_bytes" in exprs[0] and "nvgpu_pod_sm_utilization_ratio" in exprs[1]
    assert all("namespace, pod)" in e and 'uuid=~"$gpu"' in e for e in exprs)


def test_the_fleet_row_reads_only_recording_rules_that_exist(dashboards: dict[str, dict[str, Any]]) -> None:
    """The Fleet row stays cheap over thousands of GPUs: no raw per-GPU series, and every
    recorded series it names is a rule of deploy/prometheus/rules.yaml."""
    yaml = pytest.importorskip("yaml")
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yaml").read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    panels = dashboards[FLEET]["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Fleet")
    end = next(i for i, p in enumerate(panels) if i > start and p["type"] == "row")
    exprs = [t["expr"] for p in panels[start + 1 : end] for t in p["targets"]]
    assert len(exprs) >= 8
    for expr in exprs:
        names = set(re.findall(r"[a-z_]+:[a-z0-9_]+:[a-z0-9]+", expr))
        assert names and names <= recorded, (expr, names - recorded)
        assert not re.search(r"(?<![:\w])nvgpu_\w+", expr), f"raw per-GPU series in the Fleet row: {expr}"


# Event panels (Xids, restarts, crashes, quarantines, faults, error counters) say "none"
# while the exporter is scraped and nothing happened, and keep Grafana's "No data" while it is not
# scraped; measurements and inventory are untouched. dashboards/generate.py (quiet_zero) says why.
EVENT_PANELS = {
    (FLEET, "GPUs not up"),
    (FLEET, "GPUs busy with nothing on them"),
    (FLEET, "Nodes without fresh GPU data"),
    (FLEET, "GPUs lost, hung or crashed"),
    (FLEET, "GPUs with the stuck signature"),
    (FLEET, "Exporters without fresh data"),
    (FLEET, "MIG mode changes pending"),
    (FLEET, "GPUs held down per clock event reason"),
    (FLEET, "ECC error counters"),
    (FLEET, "ECC errors (volatile counter increase)"),
    (FLEET, "Xid errors by class"),
    (FLEET, "Xid errors by GPU and code"),
    (FLEET, "NVLink links with errors"),
    (HEALTH, "Exporters without fresh GPU data"),
    (HEALTH, "Quarantined features (count)"),
    (HEALTH, "Self-check failures"),
    (HEALTH, "Worker restarts by reason"),
    (HEALTH, "Worker crashes by feature"),
    (HEALTH, "Quarantined features"),
    (HEALTH, "NVML errors by feature"),
    (HEALTH, "Process records dropped"),
}


def _says_none(panel: dict[str, Any]) -> bool:
    for mapping in panel.get("fieldConfig", {}).get("defaults", {}).get("mappings", []):
        if mapping.get("type") == "value" and mapping["options"].get("0", {}).get("text") == "none":
            return True
    return False


def test_event_panels_say_none_and_no_other_panel_does(dashboards: dict[str, dict[str, Any]]) -> None:
    mapped = {(name, p["title"]) for name, d in dashboards.items() for p in d["panels"] if _says_none(p)}
    quarantined_table = (HEALTH, "Quarantined features")  # its value column is hidden: the feature says none
    assert mapped | {quarantined_table} == EVENT_PANELS, (mapped ^ EVENT_PANELS) - {quarantined_table}
    for name, d in dashboards.items():
        for p in d["panels"]:
            if (name, p["title"]) in EVENT_PANELS:
                assert p["description"].endswith('"none": scraped, nothing happened; No data: not scraped.'), p["title"]
            for t in p.get("targets", []):
                # a constant answers while nothing is scraped: the very ambiguity the event panels remove
                assert "vector(0)" not in t["expr"], (name, p["title"], t["expr"])


# Input series of one exporter, scraped every 15 s for 10 minutes, healthy and quiet (no Xid, restart,
# crash, quarantine, error or drop: those families have no series), then a failed scrape (stale
# markers) and nothing. The Fleet row's recording rules as their series.
_TARGET = 'job="nvgpu-exporter", cluster="c1", node="n1", instance="10.0.0.5:19400"'
_GPU = _TARGET + ', gpu="0", uuid="GPU-a"'
QUIET_SERIES = [
    (f"nvgpu_up{{{_TARGET}}}", 1),
    (f"nvgpu_device_up{{{_GPU}}}", 1),
    *[(f'nvgpu_device_state{{{_GPU}, state="{s}"}}', int(s == "up")) for s in ("up", "unknown", "lost", "hung")],
    (f'nvgpu_device_state{{{_GPU}, state="crashed"}}', 0),
    (f"nvgpu_stuck_context_suspected{{{_GPU}}}", 0),
    (f'nvgpu_ecc_volatile_errors_total{{{_GPU}, error_type="corrected"}}', 0),
    (f'nvgpu_ecc_volatile_errors_total{{{_GPU}, error_type="uncorrected"}}', 0),
    (f"nvgpu_nvlink_links_up{{{_GPU}}}", 18),
    (f'nvgpu_clock_event_reason_seconds_total{{{_GPU}, reason="sw_power_cap"}}', 0),
    (f'nvgpu_feature_enabled{{{_TARGET}, feature="pcie", reason="default"}}', 1),
    (f'nvgpu_selfcheck_failures{{{_TARGET}, process="supervisor"}}', 0),
    *[(f'{name}{{cluster="c1"}}', v) for name, v in (
        ("cluster:nvgpu_device_up:count", 1), ("cluster:nvgpu_device_up:sum", 1),
        ("cluster:nvgpu_stuck_context_suspected:sum", 0), ("cluster:nvgpu_up:count", 1), ("cluster:nvgpu_up:sum", 1),
    )],
]  # fmt: skip


def test_event_panels_answer_none_while_scraped_and_no_data_while_not(tmp_path: Path) -> None:
    """promtool evaluates every event panel query on a quiet exporter: refId A has a sample, and
    every sample is 0 ("none"); after a failed scrape no query has a sample ("No data")."""
    yaml = pytest.importorskip("yaml")
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    titles = {d["title"]: name for name, d in dq.load().items()}
    event = [q for q in dq.panel_queries() if (titles[q.dashboard], q.panel) in EVENT_PANELS]
    assert {(titles[q.dashboard], q.panel) for q in event} == EVENT_PANELS
    tests = []
    for q in event:
        if q.ref_id == "A":
            tests.append(
                {
                    "expr": f"clamp_max(count({q.expr}), 1)",
                    "eval_time": "5m",
                    "exp_samples": [{"labels": "{}", "value": 1}],
                }
            )
        tests.append({"expr": f"count(({q.expr}) != 0)", "eval_time": "5m", "exp_samples": []})
        tests.append({"expr": f"count({q.expr})", "eval_time": "11m", "exp_samples": []})
    series = [{"series": s, "values": f"{v}x40 stale"} for s, v in QUIET_SERIES]
    spec = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": series, "promql_expr_test": tests}],
    }
    (tmp_path / "quiet.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = subprocess.run(
        [promtool, "test", "rules", str(tmp_path / "quiet.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
