"""Every PromQL expression of the committed dashboards, ready to send to Prometheus.

Reads the JSON files (not the generator), so it needs only the standard library: what is tested is
what users import. Grafana's template variables are replaced by values that select everything:
dashboard variables (``$cluster``, ``${gpu}``, ``[[node]]``) by ``.*``, interval variables by
durations (``$__rate_interval`` -> ``1m``, ``$__range`` -> ``5m``), so the expressions are valid
PromQL that a Prometheus with a few minutes of data can answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
DASHBOARD_FILES = ("gpu-fleet.json", "exporter-health.json")

BUILTINS: Mapping[str, str] = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "5m",
    "__range_s": "300",
    "__range_ms": "300000",
    "__interval_ms": "15000",
}
"""Grafana's built-in variables and what they stand for in tests."""

_VAR = re.compile(r"\$\{([A-Za-z_]\w*)(?::[^}]*)?\}|\[\[([A-Za-z_]\w*)(?::[^\]]*)?\]\]|\$([A-Za-z_]\w*)")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<selector>.+?)\s*,\s*)?(?P<label>[a-zA-Z_]\w*)\s*\)\s*$", re.S)


class Query(NamedTuple):
    """One panel target.

    Attributes:
        dashboard: the dashboard's title.
        panel: the panel's title.
        ref_id: the target's refId (``A``, ``B`` ...).
        expr: the expression with variables substituted.
        raw: the expression as stored in the dashboard.
    """

    dashboard: str
    panel: str
    ref_id: str
    expr: str
    raw: str


class VariableQuery(NamedTuple):
    """A ``label_values()`` variable, rewritten as the PromQL that lists the same values."""

    dashboard: str
    variable: str
    label: str
    expr: str
    raw: str


def substitute(expr: str, values: Mapping[str, str] | None = None) -> str:
    """Replace every Grafana variable reference in ``expr``.

    Args:
        expr: a target expression as stored in a dashboard.
        values: overrides per variable name; built-ins default to `BUILTINS`, others to ``.*``.

    Returns:
        The expression with no ``$`` variable references left.
    """

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if values and name in values:
            return values[name]
        return BUILTINS.get(name, ".*")

    return _VAR.sub(repl, expr)


def load(directory: Path = HERE) -> dict[str, dict[str, Any]]:
    """The committed dashboards by file name."""
    return {name: json.loads((directory / name).read_text()) for name in DASHBOARD_FILES}


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # collapsed rows keep their panels inside


def panel_queries(directory: Path = HERE, values: Mapping[str, str] | None = None) -> Iterator[Query]:
    """Yields every target expression of every panel, variables substituted (see `substitute`)."""
    for dash in load(directory).values():
        for panel in _panels(dash.get("panels", [])):
            for target in panel.get("targets", []):
                raw = target.get("expr")
                if raw:
                    yield Query(
                        dash["title"], panel.get("title", ""), target.get("refId", ""), substitute(raw, values), raw
                    )


def queries(directory: Path = HERE) -> Iterator[tuple[str, str, str]]:
    """(dashboard title, panel title, expr) for every panel target, variables substituted."""
    for q in panel_queries(directory):
        yield q.dashboard, q.panel, q.expr


def variable_queries(directory: Path = HERE) -> Iterator[VariableQuery]:
    """Yields each ``label_values(selector, label)`` variable as ``group by (label) (selector)``."""
    for dash in load(directory).values():
        for var in dash.get("templating", {}).get("list", []):
            if var.get("type") != "query":
                continue
            raw = var["query"]["query"] if isinstance(var.get("query"), dict) else var.get("query", "")
            m = _LABEL_VALUES.match(raw)
            if m is None:
                raise ValueError(f"{dash['title']}: variable {var['name']}: not a label_values() query: {raw!r}")
            label = m.group("label")
            selector = substitute(m.group("selector") or f'{{{label}!=""}}')
            yield VariableQuery(dash["title"], var["name"], label, f"group by ({label}) ({selector})", raw)


if __name__ == "__main__":
    for dashboard, panel, expr in queries():
        print(f"# {dashboard} / {panel}\n{expr}\n")
