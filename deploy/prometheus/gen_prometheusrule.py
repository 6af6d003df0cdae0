#!/usr/bin/env python3
"""Generates deploy/prometheus/prometheusrule.yaml (Prometheus Operator CRD) from rules.yaml.

rules.yaml is the source: a plain Prometheus rule file that ``promtool check rules`` and
``promtool test rules`` read. The PrometheusRule carries the same ``groups`` under ``spec``.
``--set dcgm-compat`` does the same for deploy/prometheus/dcgm-compat/ (dcgm-exporter's names),
``--set nvidia-smi-compat`` for deploy/prometheus/nvidia-smi-compat/ (nvidia_gpu_exporter's names).
Each run also copies the rule file into the Helm chart (deploy/helm/nvgpu-exporter/files/), which
can read only its own files; ``--check`` checks that copy too.

Usage:
    python deploy/prometheus/gen_prometheusrule.py          # rewrite prometheusrule.yaml
    python deploy/prometheus/gen_prometheusrule.py --check  # exit 1 if it is out of date
    python deploy/prometheus/gen_prometheusrule.py --set dcgm-compat [--check]
    python deploy/prometheus/gen_prometheusrule.py --set nvidia-smi-compat [--check]

Needs PyYAML.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped,unused-ignore]

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules.yaml"
OUTPUT = HERE / "prometheusrule.yaml"
CHART_FILES = HERE.parent / "helm" / "nvgpu-exporter" / "files"
# name -> the chart's copy of the rule file (tests/test_helm.py checks it too)
CHART_COPIES = {
    "alerts": CHART_FILES / "rules.yaml",
    "dcgm-compat": CHART_FILES / "dcgm-compat-rules.yaml",
    "nvidia-smi-compat": CHART_FILES / "nvidia-smi-compat-rules.yaml",
}
# name -> (rule file, output, PrometheusRule name, app.kubernetes.io/component, the test that checks it)
SETS = {
    "alerts": (RULES, OUTPUT, "nvgpu-exporter", "alerting-rules", "tests/test_alert_rules.py"),
    "dcgm-compat": (
        HERE / "dcgm-compat" / "rules.yaml",
        HERE / "dcgm-compat" / "prometheusrule.yaml",
        "nvgpu-exporter-dcgm-compat",
        "recording-rules",
        "tests/test_dcgm_compat.py",
    ),
    "nvidia-smi-compat": (
        HERE / "nvidia-smi-compat" / "rules.yaml",
        HERE / "nvidia-smi-compat" / "prometheusrule.yaml",
        "nvgpu-exporter-nvidia-smi-compat",
        "recording-rules",
        "tests/test_dcgm_compat.py",
    ),
}

HEADER = """\
# Generated from deploy/prometheus/{source} by deploy/prometheus/gen_prometheusrule.py{flag}.
# Do not edit: change {rules} and run the script ({test} checks this file).
#
# The Prometheus Operator selects rules with its ruleSelector (and ruleNamespaceSelector): add the
# label your Prometheus expects, e.g. `release: <name>`, in your overlay.
"""


class _Dumper(yaml.SafeDumper):  # type: ignore[misc,unused-ignore]
    """Block style for multi-line strings (PromQL expressions), plain style otherwise."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def build(rules: dict[str, Any], name: str = "nvgpu-exporter", component: str = "alerting-rules") -> dict[str, Any]:
    """Wraps a rule file's content in a PrometheusRule object.

    Args:
        rules: the parsed rule file (``{"groups": [...]}``).
        name: the object's name.
        component: its ``app.kubernetes.io/component`` label.

    Returns:
        The PrometheusRule as a plain mapping.

    Raises:
        ValueError: the rule file has no ``groups`` list or other top-level keys.
    """
    if set(rules) != {"groups"} or not isinstance(rules["groups"], list):
        raise ValueError("rules.yaml must hold exactly one top-level key, groups (a list)")
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": name,
            "namespace": "nvgpu-exporter",
            "labels": {
                "app.kubernetes.io/name": "nvgpu-exporter",
                "app.kubernetes.io/component": component,
            },
        },
        "spec": {"groups": rules["groups"]},
    }


def render(rules_text: str, rule_set: str = "alerts") -> str:
    """Renders the PrometheusRule YAML for the given rule file text of ``rule_set`` (see :data:`SETS`)."""
    rules, _output, name, component, test = SETS[rule_set]
    body: str = yaml.dump(
        build(yaml.safe_load(rules_text), name, component),
        Dumper=_Dumper,
        sort_keys=False,
        width=4096,  # never fold long annotation strings
        allow_unicode=True,
        default_flow_style=False,
    )
    source = str(rules.relative_to(HERE))
    flag = "" if rule_set == "alerts" else f" --set {rule_set}"
    return HEADER.format(source=source, flag=flag, rules=Path(source).name, test=test) + body


def main(argv: list[str] | None = None) -> int:
    """Writes or checks prometheusrule.yaml; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the output is out of date")
    parser.add_argument("--set", dest="rule_set", choices=sorted(SETS), default="alerts", help="which rule file")
    args = parser.parse_args(argv)
    rules, output, *_ = SETS[args.rule_set]
    source = rules.read_text(encoding="utf-8")
    text = render(source, args.rule_set)
    chart_copy = CHART_COPIES[args.rule_set]
    if args.check:
        stale = [
            path
            for path, want in ((output, text), (chart_copy, source))
            if (path.read_text(encoding="utf-8") if path.exists() else "") != want
        ]
        for path in stale:
            print(f"{path} is out of date: run {Path(__file__).name} --set {args.rule_set}", file=sys.stderr)
        return 1 if stale else 0
    output.write_text(text, encoding="utf-8")
    chart_copy.write_text(source, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
