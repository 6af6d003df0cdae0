#!/usr/bin/env python3
"""Write a pip constraints file pinning every declared dependency to its floor.

    python3 .ci/floors.py [EXTRA ...] > constraints.txt

Reads pyproject.toml (``[project] dependencies`` and the named optional extras, default ``test``
and ``kubernetes``) and writes ``name==<floor>`` for each, the floor being the requirement's ``>=``
bound. A requirement without one is an error: an unbounded dependency has no floor to test, and
``bash .ci/run floors`` exists to install exactly the oldest versions the package admits.
Standard library only (tomllib on Python 3.11+, a minimal reader of the two arrays otherwise).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*?)\s*(?:;.*)?$")


def _pyproject() -> dict[str, object]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib
    except ImportError:  # Python 3.10: only the arrays we need
        project: dict[str, object] = {}
        deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S)
        project["dependencies"] = re.findall(r'"([^"]+)"', deps.group(1) if deps else "")
        extras = re.search(r"^\[project\.optional-dependencies\](.*?)^\[", text, re.M | re.S)
        optional = {}
        for name, body in re.findall(r"^(\w+) = \[(.*?)\]", extras.group(1) if extras else "", re.M | re.S):
            optional[name] = re.findall(r'"([^"]+)"', body)
        project["optional-dependencies"] = optional
        return {"project": project}
    return dict(tomllib.loads(text))


def floors(extras: list[str]) -> list[str]:
    """``name==floor`` for the dependencies and ``extras``.

    Raises:
        SystemExit: a requirement has no ``>=`` floor, or an extra does not exist.
    """
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    optional = project.get("optional-dependencies", {})
    reqs = list(project.get("dependencies", []))
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"floors: no extra {extra!r} in pyproject.toml")
        reqs += optional[extra]
    out = {}
    for req in reqs:
        m = _REQ.match(req)
        if not m:
            raise SystemExit(f"floors: cannot read the requirement {req!r}")
        name, spec = m.group(1), m.group(2)
        low = re.search(r">=\s*([0-9][^,\s]*)", spec)
        if not low:
            raise SystemExit(f"floors: {req!r} has no >= floor")
        out[name.lower()] = f"{name}=={low.group(1)}"
    return [out[k] for k in sorted(out)]


if __name__ == "__main__":
    print("\n".join(floors(sys.argv[1:] or ["test", "kubernetes"])))
