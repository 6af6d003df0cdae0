"""The shipped scenarios of each GPU generation and driver branch behave as docs/capabilities.json says.

Reads the capability table (the data of record) and each generation's golden exposition
(``tests/golden/<scenario>.prom``: the real worker on the shipped scenario, rendered by a real
supervisor; tests/test_golden.py keeps it current) and checks, per scenario:

- every collector feature: supported or partial in the table -> on (``nvgpu_feature_enabled``
  reason ``default``) and its series there; unsupported -> off with reason ``unsupported`` and none of
  its series (an explained absence, never a silent one); unknown -> whatever the scenario picked (its
  description says so);
- the fallbacks the table names for the branch, in ``nvgpu_nvml_api_info``;
- the capabilities issue 27 added inside features (NVLink5 counters, fabric health, temperature
  thresholds, module power);
- every dashboard panel: a family it reads that the golden lacks belongs to a feature off there, a
  switch off by default, or a family that exists only on some hardware or in a fault;
- the alert rules: promtool evaluates them over the golden's series held for 30 minutes, and exactly
  the alerts this scenario is built to raise fire.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from goldens import GOLDENS, Family

from exporter.common import collectors
from guards.featuretable import FEATURES

ROOT = Path(__file__).resolve().parent.parent
TABLE = json.loads((ROOT / "docs" / "capabilities.json").read_text(encoding="utf-8"))
sys.path.insert(0, str(ROOT))
from dashboards.queries import panel_queries  # noqa: E402

# scenario -> (generation, branch) of docs/capabilities.json
SCENARIOS = {
    "a100x2-r535": ("ampere_ga100", "R535"),
    "l40sx2-r550": ("ada", "R550"),
    "h100x2-r550": ("hopper", "R550"),
    "gh200x1-r570": ("hopper_gh200", "R570"),
    "b200x2-r570": ("blackwell", "R570"),
    "gb200x2-r580": ("blackwell_gb200", "R580"),
    "h200x2": ("hopper", "R580"),  # the measured column
}
# Where a scenario is a board variant the generation's cell does not describe, with the reason.
BOARD_VARIANT: dict[tuple[str, str], str] = {
    ("gh200x1-r570", "nvlink"): "a single-node GH200 board: no NVLink (the generation has NVL32 systems with it)",
    ("gh200x1-r570", "nvlink_throughput"): "a single-node GH200 board: no NVLink",
    ("gh200x1-r570", "fabric"): "a single-node GH200 board: no NVLink fabric",
    ("h200x2", "c2c"): "measured: the H200 has no NVLink-C2C (the table's unsupported cell)",
}
# Families a feature emits only in some states (not every supported GPU has them by default).
CONDITIONAL = {
    "mig": "series only on GPUs with MIG on or pending",
    "fan": "no scenario has a readable fan",
}


FEATURE_FAMILIES = {f: {m.name for m in c.METRICS} for f, c in collectors.COLLECTORS.items()}


def state(golden: dict[str, Family], feature: str) -> tuple[str, float] | None:
    fam = golden.get("nvgpu_feature_enabled")
    assert fam is not None
    for _, labels, value in fam.samples:
        if labels["feature"] == feature:
            return labels["reason"], value
    return None


def cell(scenario: str, feature: str, section: str = "features") -> dict[str, Any]:
    gen, branch = SCENARIOS[scenario]
    found: dict[str, Any] = TABLE[section][feature]["cells"][gen][branch]
    return found


def has_series(golden: dict[str, Family], feature: str) -> bool:
    return any(golden.get(name) and golden[name].samples for name in FEATURE_FAMILIES[feature])


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("feature", sorted(collectors.COLLECTORS))
def test_each_feature_is_what_the_table_says(scenario: str, feature: str) -> None:
    if (scenario, feature) in BOARD_VARIANT:
        pytest.skip(BOARD_VARIANT[(scenario, feature)])
    if not FEATURES[feature].default:
        pytest.skip("off by default: the goldens run the defaults")
    status = cell(scenario, feature)["status"]
    golden = GOLDENS[scenario]
    got = state(golden, feature)
    assert got is not None, f"{scenario}: no nvgpu_feature_enabled for {feature}"
    if status in ("supported", "partial"):
        assert got == ("default", 1.0), f"{scenario}: {feature} is {status} in the table but {got}"
        if feature not in CONDITIONAL:
            assert has_series(golden, feature), f"{scenario}: {feature} is {status} in the table and has no series"
    elif status == "unsupported":
        assert got == ("unsupported", 0.0), f"{scenario}: {feature} is unsupported in the table but {got}"
        assert not has_series(golden, feature), f"{scenario}: {feature} is unsupported and has series"
    else:
        assert status == "unknown", status  # the scenario's pick, named in its description


def api(golden: dict[str, Family], call: str) -> tuple[str, str, str] | None:
    fam = golden.get("nvgpu_nvml_api_info")
    for _, labels, _ in fam.samples if fam else []:
        if labels["call"] == call:
            return labels["function"], labels["version"], labels["fallback"]
    return None


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_fallbacks_the_table_names_are_taken(scenario: str) -> None:
    golden = GOLDENS[scenario]
    temperature = cell(scenario, "temperature")["answers"]
    if temperature.get("nvmlDeviceGetTemperatureV") == "FUNCTION_NOT_FOUND":
        assert api(golden, "temperature") == ("nvmlDeviceGetTemperature", "", "function_not_found")
    else:
        assert api(golden, "temperature") == ("nvmlDeviceGetTemperatureV", "", "")
    assert api(golden, "memory") == ("nvmlDeviceGetMemoryInfo_v2", "2", "")  # v2 in every header from 12.2
    fabric = cell(scenario, "fabric")
    if fabric["status"] == "supported" and (scenario, "fabric") not in BOARD_VARIANT:
        answers = fabric["answers"]
        if answers.get("nvmlDeviceGetGpuFabricInfoV") == "FUNCTION_NOT_FOUND":
            want = ("nvmlDeviceGetGpuFabricInfo", "1", "function_not_found")
        elif answers.get("nvmlDeviceGetGpuFabricInfoV v3") == "ARGUMENT_VERSION_MISMATCH":
            want = ("nvmlDeviceGetGpuFabricInfoV", "2", "argument_version_mismatch")
        else:
            want = ("nvmlDeviceGetGpuFabricInfoV", "3", "")
        assert api(golden, "fabric") == want
    assert api(golden, "compute_processes") == ("nvmlDeviceGetComputeRunningProcesses_v3", "", "")


def values(golden: dict[str, Family], name: str, **labels: str) -> list[float]:
    fam = golden.get(name)
    return [v for _, lab, v in (fam.samples if fam else []) if all(lab.get(k) == w for k, w in labels.items())]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_capabilities_inside_features(scenario: str) -> None:
    golden = GOLDENS[scenario]
    nvlink5 = cell(scenario, "nvlink5_counters", "capabilities")["status"]
    recovery_failed = values(golden, "nvgpu_nvlink_errors_total", error_type="recovery_failed")
    assert bool(recovery_failed) == (nvlink5 == "supported"), (scenario, nvlink5)
    if nvlink5 == "supported":  # NVLink5: no replay / CRC types, which have no NVLink5 field
        assert not values(golden, "nvgpu_nvlink_errors_total", error_type="replay")
    health = cell(scenario, "fabric_health", "capabilities")["status"]
    if (scenario, "fabric") not in BOARD_VARIANT and scenario != "h200x2":  # H200 pair: mask and summary 0
        assert bool(values(golden, "nvgpu_fabric_health")) == (health == "supported"), (scenario, health)
        assert bool(values(golden, "nvgpu_fabric_health_condition")) == (health == "partial"), (scenario, health)
    assert values(golden, "nvgpu_temperature_margin_celsius"), "every generation has a margin"
    module = cell(scenario, "module_power", "capabilities")["status"]
    assert bool(values(golden, "nvgpu_module_power_usage_watts")) == (module == "supported")
    assert bool(values(golden, "nvgpu_module_power_limit_watts")) == (module == "supported")
    # the energy counter in the family of its scope, never both
    gpu_energy = values(golden, "nvgpu_energy_consumption_joules_total")
    module_energy = values(golden, "nvgpu_module_energy_consumption_joules_total")
    assert bool(module_energy) == (module == "supported") and bool(gpu_energy) != bool(module_energy)


# -- dashboards -------------------------------------------------------------------------------------

# Families only some hardware, or a fault, or a switch has, with why a panel reading them may be empty.
ONLY_SOMETIMES = {
    "nvgpu_module_power_usage_watts": "Grace modules",
    "nvgpu_module_power_limit_watts": "Grace modules",
    "nvgpu_module_energy_consumption_joules_total": "Grace modules",
    "nvgpu_energy_consumption_joules_total": "not on Grace modules (the module's family there)",
    "nvgpu_memory_power_usage_watts": "where NVML has the memory scope",
    "nvgpu_memory_temperature_margin_celsius": "HBM boards",
    "nvgpu_memory_temperature_celsius": "HBM boards",
    "nvgpu_recovery_action": "R570+ (field 230)",
    "nvgpu_fabric_info": "NVLink domains",
}


def _families_in(expr: str) -> set[str]:
    names = set(re.findall(r"\b(nvgpu_[a-z0-9_]+|DCGM_[A-Z0-9_]+)\b", expr))
    return {n for n in names if n.startswith("nvgpu_")}


def _owner(family: str) -> str | None:
    for feature, names in FEATURE_FAMILIES.items():
        if family in names:
            return feature
    return None


@pytest.mark.parametrize("scenario", sorted(s for s in SCENARIOS if s != "h200x2"))
def test_every_dashboard_panel_has_data_or_an_explained_absence(scenario: str) -> None:
    """A family a panel reads that the scenario lacks is explained: its feature is off there, or it is
    absent from the H200's default golden too (a switch or a state: the other goldens show it), or
    it exists only on some hardware (:data:`ONLY_SOMETIMES`). What is left would be a panel that
    works on the H200 and breaks on this generation."""
    golden = GOLDENS[scenario]
    h200 = GOLDENS["h200x2"]
    emitted_anywhere = {name for fams in GOLDENS.values() for name in fams}
    unexplained = []
    for q in panel_queries():
        for family in _families_in(q.expr):
            if family in golden or family in ONLY_SOMETIMES:
                continue
            if family not in emitted_anywhere:
                unexplained.append(f"{q.dashboard} / {q.panel}: {family} is in no golden")
                continue
            owner = _owner(family)
            on = state(golden, owner) if owner else None
            if on is not None and on[1] == 0.0:
                continue  # the feature is off there: nvgpu_feature_enabled says why
            if family not in h200:
                continue  # behind a switch or a state on every GPU (the detailed, faults, MIG goldens show it)
            unexplained.append(f"{q.dashboard} / {q.panel}: {family} ({owner or 'supervisor'}) missing on {scenario}")
    assert not unexplained, "\n".join(sorted(set(unexplained)))


# -- alert rules --------------------------------------------------------------------------------------

# The alerts each scenario is built to raise over its golden's series (held constant), with why.
EXPECTED_ALERTS: dict[str, set[str]] = {
    "a100x2-r535": set(),
    "l40sx2-r550": set(),
    "h100x2-r550": {"NvgpuConfidentialComputingNotReady"},  # CC on, ready only from t = 30 s: 0 at t = 0
    "gh200x1-r570": set(),
    "b200x2-r570": set(),
    "gb200x2-r580": {"NvgpuFabricDegraded"},  # GPU 1: degraded bandwidth, summary limited capacity
    "h200x2": set(),
}
IGNORED = {
    "NvgpuExporterTargetDown",  # reads Prometheus's own `up`, which a golden does not hold
    "NvgpuSelfCheckFailing",  # the goldens keep the self-check of the machine that captured them
}


def _series_lines(golden: dict[str, Family]) -> list[str]:
    lines = []
    for fam in golden.values():
        for sample_name, labels, value in fam.samples:
            if sample_name.endswith(("_created",)):
                continue
            labels = {**labels, "job": "nvgpu-exporter", "instance": "10.0.0.1:19400"}
            body = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            # the node's clock agrees with promtool's (which starts at 0), as a healthy node's does
            values = "0+60x30" if sample_name == "nvgpu_last_sample_timestamp_seconds" else f"{value:g}x30"
            lines.append(f"      - series: '{sample_name}{{{body}}}'\n        values: '{values}'")
    return lines


def _promtool(path: Path, series: list[str], checks: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """promtool test rules over ``series`` held for 30 minutes; ``checks``: alert -> "[]" (silent)."""
    tests = [
        f"      - eval_time: 30m\n        alertname: {a}\n        exp_alerts: {want}" for a, want in checks.items()
    ]
    path.write_text(
        f"rule_files:\n  - {ROOT / 'deploy' / 'prometheus' / 'rules.yaml'}\nevaluation_interval: 1m\ntests:\n"
        "  - interval: 1m\n    input_series:\n" + "\n".join(series) + "\n"
        "    alert_rule_test:\n" + "\n".join(tests) + "\n"
    )
    return subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_alert_rules_on_each_scenario(scenario: str, tmp_path: Path) -> None:
    rules = (ROOT / "deploy" / "prometheus" / "rules.yaml").read_text()
    alerts = sorted(set(re.findall(r"^\s*- alert: (\w+)", rules, re.M)) - IGNORED)
    series = _series_lines(GOLDENS[scenario])
    silent = {a: "[]" for a in alerts if a not in EXPECTED_ALERTS[scenario]}
    done = _promtool(tmp_path / "silent.yaml", series, silent)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    for alert in sorted(EXPECTED_ALERTS[scenario]):  # and the expected ones do fire: "none" fails
        fired = _promtool(tmp_path / f"{alert}.yaml", series, {alert: "[]"})
        said = fired.stdout + fired.stderr
        assert fired.returncode != 0 and f"alertname: {alert}" in said, f"{alert} does not fire on {scenario}"


# -- DCGM-compat rules without GPM ---------------------------------------------------------------------

# GPUs per scenario and whether GPM answers there (docs/migrating-from-dcgm.md, "Profiling"): without
# GPM (Ampere, Ada) the DCGM_FI_PROF_* names have no series and the device names still do.
PROFILING = {"a100x2-r535": (2, False), "l40sx2-r550": (2, False), "h100x2-r550": (2, True)}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
@pytest.mark.parametrize("scenario", sorted(PROFILING))
def test_the_dcgm_compat_profiling_names_fall_back_without_gpm(scenario: str, tmp_path: Path) -> None:
    gpus, gpm = PROFILING[scenario]
    on = state(GOLDENS[scenario], "gpm")
    assert on == (("default", 1.0) if gpm else ("unsupported", 0.0)), on  # the reason is served
    checks = {
        "count(DCGM_FI_DEV_GPU_UTIL)": gpus,
        "count(DCGM_FI_PROF_SM_ACTIVE) or vector(0)": gpus if gpm else 0,
        "count(DCGM_FI_PROF_GR_ENGINE_ACTIVE) or vector(0)": gpus if gpm else 0,
        "count(DCGM_FI_PROF_DRAM_ACTIVE) or vector(0)": gpus if gpm else 0,
    }
    tests = "\n".join(
        f"      - expr: '{expr}'\n        eval_time: 5m\n        exp_samples:\n          - labels: '{{}}'\n"
        f"            value: {want}"
        for expr, want in checks.items()
    )
    path = tmp_path / "dcgm.yaml"
    path.write_text(
        f"rule_files:\n  - {ROOT / 'deploy' / 'prometheus' / 'dcgm-compat' / 'rules.yaml'}\nevaluation_interval: 1m\n"
        "tests:\n  - interval: 1m\n    input_series:\n" + "\n".join(_series_lines(GOLDENS[scenario])) + "\n"
        "    promql_expr_test:\n" + tests + "\n"
    )
    done = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
