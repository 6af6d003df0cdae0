"""The developer loop's own rules: the two tiers of tests/conftest.py, no test module importing
another, sleeps that say why, and CI running README's test command."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import Any

import conftest
import pytest
from exporter_proc import Exporter

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


# -- the tiers -------------------------------------------------------------------------------------


def _starts_the_exporter(tmp_path: Path) -> None:
    with Exporter(None, tmp_path):
        pass


def _reaches_a_helper_that_starts_it(tmp_path: Path) -> None:
    _starts_the_exporter(tmp_path)


def _pure() -> int:
    return sum(range(3))


class _Holder:
    def helper(self, tmp_path: Path) -> None:
        _starts_the_exporter(tmp_path)


def _sample(name: str) -> Any:
    """A sample above by name: naming it in the test's code would make the test reach it, and be
    marked integration itself (which is what the marking is for)."""
    return globals()[name]


def test_the_tiers_are_chosen_by_what_a_test_starts(request: pytest.FixtureRequest) -> None:
    def reason(name: str) -> str | None:
        return conftest._spawning_name([_sample(name)], None)

    assert reason("_starts_the_exporter") == "Exporter"
    assert reason("_reaches_a_helper_that_starts_it") == "Exporter"  # through a helper
    assert reason("_Holder") == "Exporter"  # through a class's method
    assert reason("_pure") is None
    assert request.node.get_closest_marker("integration") is None  # this test starts nothing
    # ... and a fast-tier test that starts a process anyway is stopped before the process exists
    with pytest.raises(AssertionError, match="is in the fast tier but starts a process"):
        os.posix_spawn("/bin/true", ["true"], {})


def test_slow_hardware_and_end_to_end_files_are_in_the_integration_tier(request: pytest.FixtureRequest) -> None:
    """Over the items of this session (all of them in a full run; -m "not integration" leaves
    only fast ones, where this must hold as well)."""
    for item in request.session.items:
        mark = item.get_closest_marker("integration")
        if item.get_closest_marker("slow") or item.get_closest_marker("hardware"):
            assert mark is not None, item.nodeid
        if "test_integration_" in item.nodeid:
            assert mark is not None, item.nodeid


# -- test modules ---------------------------------------------------------------------------------


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "golden" not in p.parts)


def test_no_test_module_imports_another() -> None:
    """Shared fakes and parsers live in helper modules: importing a test module runs its module
    code at collection and makes a rename in one test file break a stranger."""
    offenders = []
    for path in _test_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if re.match(r"(tests\.)?test_", n)]
    assert offenders == []


def _bare_sleeps(path: Path) -> list[tuple[int, str]]:
    """``time.sleep`` / ``asyncio.sleep`` calls outside any loop (a loop's sleep is its polling)."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found = []

    def visit(node: ast.AST, in_loop: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_loop = False
        if isinstance(node, (ast.While, ast.For, ast.AsyncFor)):
            in_loop = True
        func: Any = getattr(node, "func", None)
        if (
            isinstance(node, ast.Call)
            and isinstance(func, ast.Attribute)
            and func.attr == "sleep"
            and isinstance(func.value, ast.Name)
            and func.value.id in ("time", "asyncio")
            and not in_loop
        ):
            found.append((node.lineno, lines[node.lineno - 1]))
        for child in ast.iter_child_nodes(node):
            visit(child, in_loop)

    visit(ast.parse(source), False)
    return found


def test_every_bare_sleep_says_why() -> None:
    """A test waits for a condition (tests/waiting.py, Exporter.wait_*). A sleep outside a polling
    loop stays only where letting time pass is the point, and its line says so in a comment.
    (tests/hardware/ is left out: there a sleep lets a real GPU run its load.)"""
    silent = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _test_files()
        if "hardware" not in path.parts
        for n, line in _bare_sleeps(path)
        if "#" not in line
    ]
    assert silent == [], "wait for a condition instead, or say in a comment why the time must pass"


# -- CI ---------------------------------------------------------------------------------------------


def test_ci_runs_readmes_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    said = re.search(r"then runs\s+`([^`]+)`", readme)
    assert said, "README no longer says which command `bash .ci/run` runs"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert f"# README's test command:\n  {said.group(1)}\n" in ci
    assert "```sh\nbash .ci/run\n```" in readme
