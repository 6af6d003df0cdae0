#!/usr/bin/env python3
"""Generates deploy/prometheus/prometheusrule.yaml (Prometheus Operator CRD) from rules.yaml.

rules.yaml is the source: a plain Prometheus rule file that ``promtool check rules`` and
``promtool test rules`` read. The PrometheusRule carries the same ``groups`` under ``spec``.

Usage:
    python deploy/prometheus/gen_prometheusrule.py          # rewrite prometheusrule.yaml
    python deploy/prometheus/gen_prometheusrule.py --check  # exit 1 if it is out of date

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

HEADER = """\
# Generated from deploy/prometheus/rules.yaml by deploy/prometheus/gen_prometheusrule.py.
# Do not edit: change rules.yaml and run the script (tests/test_alert_rules.py checks this file).
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


def build(rules: dict[str, Any]) -> dict[str, Any]:
    """Wraps a rule file's content in a PrometheusRule object.

    Args:
        rules: the parsed rule file (``{"groups": [...]}``).

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
            "name": "nvgpu-exporter",
            "namespace": "nvgpu-exporter",
            "labels": {
                "app.kubernetes.io/name": "nvgpu-exporter",
                "app.kubernetes.io/component": "alerting-rules",
            },
        },
        "spec": {"groups": rules["groups"]},
    }


def render(rules_text: str) -> str:
    """Renders the PrometheusRule YAML for the given rules.yaml text."""
    body: str = yaml.dump(
        build(yaml.safe_load(rules_text)),
        Dumper=_Dumper,
        sort_keys=False,
        width=4096,  # never fold long annotation strings
        allow_unicode=True,
        default_flow_style=False,
    )
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    """Writes or checks prometheusrule.yaml; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the output is out of date")
    args = parser.parse_args(argv)
    text = render(RULES.read_text(encoding="utf-8"))
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is out of date: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
