"""The imports of exporter/ and guards/ tell the architecture: no loop, and nothing imports upward.

Every import counts: at module level, under ``TYPE_CHECKING`` and inside functions (a function-local
import is a dependency that waits; it still makes a loop). An import names the most specific module
of ours it reaches (``from exporter.common.collectors import mig`` is
``exporter.common.collectors.mig``); that Python also runs the packages above it is not counted, as
in every import-graph tool. The layers are declared below, top to bottom: a module may import its
own layer and any lower one; the two sides of the process boundary sit on one row and may not
import each other (test_lint.py holds the third party ones: pynvml behind exporter/worker/nvml,
aiohttp on the HTTP side). ``guards/`` imports only the standard library, so it works before any
dependency is trusted.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("exporter", "guards")

# Rows top to bottom; each row maps a layer's name to the module patterns (fnmatch) it holds. The
# folders say which process runs a module (exporter/supervisor/, exporter/worker/, exporter/common/:
# both); tests/test_process_modules.py checks that on the real processes.
_S = "exporter.supervisor."
_W = "exporter.worker."
_C = "exporter.common."
LAYERS: tuple[Mapping[str, tuple[str, ...]], ...] = (
    {"entry": ("exporter.__main__", "exporter.cli", "exporter.app", _W + "__main__", _W + "main")},
    {"npd check": ("exporter.npdcheck",), "diagnose": ("exporter.diagnose", "exporter.diagrun")},
    {
        "supervisor side": (
            *(
                _S + name
                for name in (
                    "supervisor",
                    "probes",
                    "workerproc",
                    "workerstderr",
                    "accounting",
                    "policy",
                    "deaths",
                    "quarantine",
                    "unavailable",
                    "served",
                    "gpuhealth",
                    "xids",
                    "extensions",
                    "stuck",
                    "verdicts",
                    "faulttable",
                    "classify",
                    "verdictdoc",
                    "timeline",
                    "timelineevents",
                    "timelinefile",
                    "recovery",
                    "recorder",
                    "gpudiff",
                    "incident",
                    "incidentmd",
                    "runbook",
                    "timelinedoc",
                    "kernel_xid",
                    "pods",
                    "exposition",
                    "textformat",
                    "selfmetrics",
                    "apis",
                    "procmetrics",
                    "statuspage",
                )
            ),
            _S + "http",
            _S + "http.*",  # web.py, the edge and the web config's parts
            "exporter.config",
            "exporter.settings",
            "exporter.settingvalues",
            "exporter.checks",
        ),
        "worker side": (_W + "sampler", _W + "gpuslot", _W + "enumeration", _W + "nvml_events"),
    },
    {
        "contract and collectors": (
            _C + "snapshot",
            _C + "snapshotdecode",
            _C + "selfcheck",
            _C + "collectors*",
            _W + "process_attribution",  # the processes collector's read() half (worker only)
            _W + "implausible",  # applies the collectors' checks; collectors count joins through it
        )
    },
    {"nvml": (_W + "nvml", _W + "nvml.*", _W + "fakenvml*", _C + "gpustate", _C + "plausibility")},
    {
        "worker data": (_W + "procfs", _W + "containerlogs", _W + "process_records"),
        "supervisor data": (_S + "xid", _S + "xid.*", _S + "podresources*"),
    },
    {
        "ground": (
            "exporter",
            "exporter.common",
            "exporter.supervisor",
            "exporter.worker",
            "exporter.buildinfo",
            _C + "durations",
            _C + "protocol",
            _C + "decode",
            _C + "workerconfig",
            _C + "gpuid",
            _C + "breadcrumb",
            _C + "logs",
            _C + "fileio",
            _C + "nativelib",
            _C + "metric",
            _C + "nvml",
            _C + "nvml.errors",
            _C + "scenarios*",
            "guards*",
        )
    },
)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages."""
    found = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _ours(name: str, known: Iterable[str]) -> str | None:
    """The most specific module of ours that ``name`` (a dotted import target) reaches."""
    names = set(known)
    while name and name not in names:
        name = name.rpartition(".")[0]
    return name or None


def imported(name: str, path: Path, known: Iterable[str]) -> dict[str, int]:
    """Module ``name`` (at ``path``) -> {module of ours it imports: first line}, and every top-level
    name it imports (third party and standard library included) under the key ``"<top>:<name>"``."""
    names = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
            tops = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])
            targets = [f"{base}.{a.name}" for a in node.names]  # a name is a submodule, or something in base
            tops = [node.module.split(".")[0]] if node.level == 0 and node.module else []
        else:
            continue
        for top in tops:
            out.setdefault(f"<top>:{top}", node.lineno)
        for target in targets:
            ours = _ours(target, names)
            if ours is not None and ours != name:
                out.setdefault(ours, node.lineno)
    return out


@functools.cache
def graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """Module -> {module of ours it imports: line}."""
    found = modules(root)
    return {
        name: {k: v for k, v in imported(name, path, found).items() if not k.startswith("<top>:")}
        for name, path in found.items()
    }


def loops(edges: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges)))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def layer_of(module: str) -> tuple[int, str] | None:
    """(row, layer name) of ``module``; None when no layer declares it."""
    hits = [
        (row, layer)
        for row, layers in enumerate(LAYERS)
        for layer, patterns in layers.items()
        if any(fnmatch.fnmatchcase(module, p) for p in patterns)
    ]
    assert len(hits) <= 1, f"{module} is declared in more than one layer: {hits}"
    return hits[0] if hits else None


def against_the_layers(edges: Mapping[str, Mapping[str, int]]) -> list[str]:
    """Imports from a lower layer to a higher one, or between the two sides of one row."""
    wrong = []
    for module, targets in sorted(edges.items()):
        here = layer_of(module)
        for target, line in sorted(targets.items()):
            there = layer_of(target)
            if here is None or there is None:
                continue  # reported by test_every_module_has_a_layer
            if there[0] < here[0] or (there[0] == here[0] and there[1] != here[1]):
                wrong.append(f"{module}:{line} ({here[1]}) imports {target} ({there[1]})")
    return wrong


def test_every_module_has_a_layer() -> None:
    undeclared = sorted(m for m in modules() if layer_of(m) is None)
    assert undeclared == [], f"declare the layer of {undeclared} in LAYERS (tests/test_imports.py)"


def test_no_import_loop() -> None:
    found = loops(graph())
    assert found == [], "import loops (runtime, TYPE_CHECKING or function-local imports):\n" + "\n".join(
        " -> ".join(loop) for loop in found
    )


def test_no_import_runs_up_the_layers() -> None:
    wrong = against_the_layers(graph())
    assert wrong == [], "imports against the layers:\n" + "\n".join(wrong)


def test_the_extension_interface_imports_no_extension() -> None:
    """extensions.py is the interface (dcgm-exporter keeps its Transform interface and the factory
    apart); the composition root (app.py) picks the extensions."""
    edges = graph()
    implementations = [m for m, targets in edges.items() if "exporter.supervisor.extensions" in targets]
    assert implementations and not set(edges["exporter.supervisor.extensions"]) & set(implementations)


def test_guards_imports_only_the_standard_library() -> None:
    found = modules()
    outside = []
    for name, path in sorted(found.items()):
        if not name.startswith("guards"):
            continue
        for key, line in imported(name, path, found).items():
            top = key.removeprefix("<top>:")
            if key.startswith("<top>:") and top not in sys.stdlib_module_names and top not in ("guards", "__future__"):
                outside.append(f"{path.relative_to(ROOT)}:{line} imports {top}")
    assert outside == []


def test_the_checks_see_what_they_are_meant_to() -> None:
    """The parser finds a function-local import, a TYPE_CHECKING one and a relative one, and the loop
    and layer checks flag what they should (so the tests above cannot pass by seeing nothing)."""
    edges = graph()
    assert "exporter.supervisor.xid.kmsg" in edges["exporter.supervisor.kernel_xid"] or any(
        t.startswith("exporter.supervisor.xid.") for t in edges["exporter.supervisor.kernel_xid"]
    )  # imported inside KernelXid.__init__
    assert "exporter.worker.nvml.client" in edges["exporter.common.collectors.power"]  # under TYPE_CHECKING
    assert loops({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert against_the_layers({"exporter.common.metric": {"exporter.supervisor.http.web": 3}}) == [
        "exporter.common.metric:3 (ground) imports exporter.supervisor.http.web (supervisor side)"
    ]
    assert against_the_layers({"exporter.worker.sampler": {"exporter.supervisor.served": 7}}) == [
        "exporter.worker.sampler:7 (worker side) imports exporter.supervisor.served (supervisor side)"
    ]
    assert against_the_layers({"exporter.worker.procfs": {"exporter.supervisor.xid": 2}}) == [
        "exporter.worker.procfs:2 (worker data) imports exporter.supervisor.xid (supervisor data)"
    ]
