"""ruff (lint and format) on the whole tree, mypy --strict on the packages; import boundaries.

The same commands as ``bash .ci/run lint`` (pyproject.toml holds their settings)."""

from __future__ import annotations

import ast
import re
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


NVML = ROOT / "exporter" / "worker" / "nvml"  # the real path
FAKE = ROOT / "exporter" / "worker" / "fakenvml"
# The fake's standard-library-only half: the scenario files, their check (Config runs it in the
# supervisor) and the value kinds and record layouts the fake evaluates.
SCENARIOS = ROOT / "exporter" / "common" / "scenarios"
ERRORS = "exporter.common.nvml.errors"  # the return-code table (standard library only)
FILEIO = "exporter.common.fileio"  # files opened without blocking, read with a deadline (standard library only)


def test_pynvml_only_behind_exporter_nvml() -> None:
    """pynvml is imported under exporter/worker/nvml/ (the real path) and exporter/worker/fakenvml/ (the
    fake raises pynvml's errors and fills its structs), nowhere else. The fake needs nothing of the
    product but its scenarios and the error table; the product reaches the fake only through the
    backend loader, lazily, so the real path never loads it; the scenario check imports only itself,
    the error table and fileio (its bounded file reader)."""
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "exporter").rglob("*.py")
        if "pynvml" in _imports(p) and NVML not in p.parents and FAKE not in p.parents
    ]
    assert offenders == []
    assert any("pynvml" in _imports(p) for p in NVML.glob("*.py")), "the check sees the real path's import"
    outside = [
        f"{p.relative_to(ROOT)}: {m}"
        for p in FAKE.glob("*.py")
        for m, _ in _exporter_imports(p)
        if not m.startswith(("exporter.worker.fakenvml", "exporter.common.scenarios", ERRORS))
    ]
    assert outside == [], "the fake imports only itself, the scenarios and exporter.common.nvml.errors"
    outside = [
        f"{p.relative_to(ROOT)}: {m}"
        for p in SCENARIOS.glob("*.py")
        for m, _ in _exporter_imports(p)
        if not m.startswith(("exporter.common.scenarios", ERRORS, FILEIO))
    ]
    assert outside == [], "the scenario check imports only itself, exporter.common.nvml.errors and fileio"
    stdlib = {*sys.stdlib_module_names, "__future__", "exporter"}
    third_party = [f"{p.relative_to(ROOT)}: {m}" for p in SCENARIOS.glob("*.py") for m in _imports(p) - stdlib]
    assert third_party == [], "the scenario check is standard library only"
    privates = [
        f"{p.name}: {m}"
        for p in [*FAKE.glob("*.py"), *SCENARIOS.glob("*.py")]
        for m, _ in _exporter_imports(p)
        if "._" in m
    ]
    assert privates == [], "no module of the fake imports another module's private names"
    users = {
        f"{p.relative_to(ROOT)}{'' if lazily else ' (at import)'}"
        for p in [*(ROOT / "exporter").rglob("*.py"), *(ROOT / "guards").rglob("*.py")]
        if FAKE not in p.parents
        for m, lazily in _exporter_imports(p)
        if m.startswith("exporter.worker.fakenvml")
    }
    assert users == {"exporter/worker/nvml/backend.py"}


def test_aiohttp_only_on_the_http_side() -> None:
    """aiohttp: the supervisor's HTTP side (exporter/supervisor/http/) and the entry (cli.py)."""
    http = ROOT / "exporter" / "supervisor" / "http"
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "exporter").rglob("*.py")
        if "aiohttp" in _imports(p) and http not in p.parents and p != ROOT / "exporter" / "cli.py"
    ]
    assert offenders == []


def test_worker_imports_neither_aiohttp_nor_prometheus_client() -> None:
    code = (
        "import sys, exporter.worker.main; "
        "print(sorted(m for m in ('aiohttp', 'prometheus_client') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_class_over_300_lines() -> None:
    """Every class in exporter/ and guards/ can be read in one sitting."""
    long = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "_pb2" in path.name:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and (node.end_lineno or 0) - node.lineno + 1 > 300:
                    long.append(f"{path.relative_to(ROOT)}:{node.name} ({(node.end_lineno or 0) - node.lineno + 1})")
    assert long == []


MAX_MODULE_LINES = 550
# The modules allowed over MAX_MODULE_LINES, each with its reason (a folder: every module in it).
LONG_MODULES = {
    "exporter/supervisor/podresources/v1/": "generated by grpc_tools.protoc (podresources/regenerate.py)",
    "exporter/settings.py": "the settings table: data, one row per option, that grows with every setting",
}


def long_modules(root: Path = ROOT, exceptions: dict[str, str] = LONG_MODULES) -> list[str]:
    """``path (lines)`` of every module under exporter/ and guards/ over :data:`MAX_MODULE_LINES`
    lines, the exceptions left out."""
    long = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            if any(name == e or (e.endswith("/") and name.startswith(e)) for e in exceptions):
                continue
            lines = len(path.read_text().splitlines())
            if lines > MAX_MODULE_LINES:
                long.append(f"{name} ({lines})")
    return long


def test_no_module_over_550_lines() -> None:
    """Every hand-written module does one job: split a long one by job (docs/layout.md says where
    each goes), not at a line count."""
    assert long_modules() == []


def test_every_exception_to_the_module_size_exists() -> None:
    assert [e for e in LONG_MODULES if not (ROOT / e).exists()] == []


def test_the_module_size_check_sees_a_551_line_module(tmp_path: Path) -> None:
    def module(name: str, lines: int) -> None:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n" * lines)

    module("exporter/ok.py", 550)
    module("exporter/deep/long.py", 551)
    module("guards/long.py", 600)
    module("exporter/settings.py", 900)
    module("exporter/supervisor/podresources/v1/api_pb2.py", 900)
    assert long_modules(tmp_path) == ["exporter/deep/long.py (551)", "guards/long.py (600)"]
    assert long_modules(tmp_path, {}) == [
        "exporter/deep/long.py (551)",
        "exporter/settings.py (900)",
        "exporter/supervisor/podresources/v1/api_pb2.py (900)",
        "guards/long.py (600)",
    ]


# What the code and the docs a user reads may not cite: files outside the repository (the design
# notes and NVML notes the project started from) and issue numbers of no public tracker. A public
# issue names its repository ("NVIDIA/go-nvml#75", a github.com URL) and passes.
_OUTSIDE = re.compile(r"\.\./shared|nvml-notes|\bDESIGN\.md\b|\bSTYLE\.md\b")
_ISSUE = re.compile(r"\b[Ii]ssues? #?\d+")
_TRACKER = re.compile(r"[\w.-]+/[\w.-]+\s+$")  # owner/repo right before it


def citations(text: str) -> list[tuple[int, str]]:
    """(line, what) for each citation of a file outside the repository or of a bare issue number."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [(number, m.group()) for m in _OUTSIDE.finditer(line)]
        found += [(number, m.group()) for m in _ISSUE.finditer(line) if not _TRACKER.search(line[: m.start()])]
    return found


def _read_by_users() -> list[Path]:
    """exporter/ and guards/ (code and data), README, CONTRIBUTING, docs/, the deploy manifests and
    rules, and the dashboards."""
    paths = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    for base, suffixes in [
        ("exporter", (".py", ".json")),
        ("guards", (".py", ".json")),
        ("docs", (".md", ".py", ".json")),
        ("deploy", (".yaml", ".yml", ".md", ".py", ".tpl")),
        ("dashboards", (".json", ".py", ".md")),
    ]:
        paths += [p for p in sorted((ROOT / base).rglob("*")) if p.is_file() and p.suffix in suffixes]
    return paths


def test_no_citation_of_a_file_outside_the_repository_or_a_bare_issue_number() -> None:
    """State the fact, or cite its public source (nvml.h in NVIDIA/go-nvml, NVIDIA's docs, a public
    issue with its repository): a reader has neither ../shared nor the project's issue tracker."""
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in _read_by_users()
        if "_pb2" not in path.name
        for line, what in citations(path.read_text(errors="replace"))
    ]
    assert found == []


def test_the_citation_check_sees_what_it_should() -> None:
    assert citations("see ../shared/reference/h200/misc.json") == [(1, "../shared")]
    assert citations("a\n(nvml-notes §4.2) and DESIGN.md, STYLE.md") == [
        (2, "nvml-notes"),
        (2, "DESIGN.md"),
        (2, "STYLE.md"),
    ]
    assert citations("the budget (issue 17); Issue 12 found it; issues 13 and 14") == [
        (1, "issue 17"),
        (1, "Issue 12"),
        (1, "issues 13"),
    ]
    assert citations("NVIDIA/go-nvml#75, NVIDIA/go-nvml issue 75, docs/design.md, github.com/a/b/issues/3") == []
