"""ruff (lint and format) on the whole tree, mypy --strict on the packages; import boundaries.

The same commands as ``bash .ci/run lint`` (pyproject.toml holds their settings)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["exporter", "guards"]


def _tool(name: str) -> list[str]:
    if shutil.which(name) is None:
        pytest.skip(f"{name} is not installed (CI installs it from requirements-ci.txt)")
    return [name]


def test_ruff_lint_and_format_the_whole_tree() -> None:
    """tests/, bench/, dashboards/, examples/ too: lint that only gates the packages rots elsewhere."""
    for args in (["check", "."], ["format", "--check", "."]):
        proc = subprocess.run([*_tool("ruff"), *args], cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict() -> None:
    _tool("mypy")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", *PACKAGES], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _exporter_imports(path: Path) -> list[tuple[str, bool]]:
    """``(module, lazily)`` for each import of an ``exporter`` module in ``path`` (``from a.b import c``
    gives ``a.b.c``); ``lazily``: inside a function body, so only run when the function is."""
    tree = ast.parse(path.read_text())
    lazy = {
        id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found += [(name, id(node) in lazy) for name in names if name.split(".")[0] == "exporter"]
    return found


# The fake's modules that the supervisor runs (Config checks a scenario before anything starts).
FAKE_STDLIB_ONLY = {"scenario.py", "spec.py", "records.py", "__init__.py"}


def test_pynvml_only_behind_exporter_nvml() -> None:
    """pynvml is imported under exporter/nvml/ (the real path) and exporter/fakenvml/ (the fake raises
    pynvml's errors and fills its structs), except in the fake's standard-library-only modules. The fake
    needs nothing of the product but the error table; the product reaches the fake only through the
    backend loader and Config's scenario check, and lazily, so the real path never loads it."""
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "exporter").rglob("*.py")
        if "pynvml" in _imports(p)
        and (p.parent.name not in ("nvml", "fakenvml") or (p.parent.name == "fakenvml" and p.name in FAKE_STDLIB_ONLY))
    ]
    assert offenders == []
    fake = ROOT / "exporter" / "fakenvml"
    stdlib_only = {f"exporter.fakenvml.{name[:-3]}" for name in FAKE_STDLIB_ONLY} | {"exporter.nvml.errors"}
    outside = []
    for p in fake.glob("*.py"):
        allowed = stdlib_only if p.name in FAKE_STDLIB_ONLY else {"exporter.fakenvml", "exporter.nvml.errors"}
        outside += [f"{p.name}: {m}" for m, _ in _exporter_imports(p) if not any(m.startswith(a) for a in allowed)]
    assert outside == [], "the fake imports only itself and exporter.nvml.errors"
    privates = [f"{p.name}: {m}" for p in fake.glob("*.py") for m, _ in _exporter_imports(p) if "._" in m]
    assert privates == [], "no module of the fake imports another module's private names"
    users = {
        f"{p.relative_to(ROOT)}{'' if lazily else ' (at import)'}"
        for p in [*(ROOT / "exporter").rglob("*.py"), *(ROOT / "guards").rglob("*.py")]
        if fake not in p.parents
        for m, lazily in _exporter_imports(p)
        if m.startswith("exporter.fakenvml")
    }
    assert users == {"exporter/nvml/backend.py", "exporter/config.py"}


def test_aiohttp_only_on_the_http_side() -> None:
    allowed = {"web.py", "cli.py"}
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "exporter").rglob("*.py")
        if "aiohttp" in _imports(p) and p.name not in allowed
    ]
    assert offenders == []


def test_worker_imports_neither_aiohttp_nor_prometheus_client() -> None:
    code = "import sys, exporter.worker; print(sorted(m for m in ('aiohttp', 'prometheus_client') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_class_over_300_lines() -> None:
    """Issue 11: every class in exporter/ and guards/ can be read in one sitting."""
    long = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "_pb2" in path.name:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and (node.end_lineno or 0) - node.lineno + 1 > 300:
                    long.append(f"{path.relative_to(ROOT)}:{node.name} ({(node.end_lineno or 0) - node.lineno + 1})")
    assert long == []
