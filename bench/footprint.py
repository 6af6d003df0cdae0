#!/usr/bin/env python3
"""Where the exporter's memory goes: per process, per mapping, per import.

Three views, one JSON:

1. **running**: the real exporter (``python -m exporter``, 1 s interval) on a backend (``--backend
   nvml`` on a GPU machine, the fake by default), with pod attribution loaded as on Kubernetes (a
   fake kubelet socket that loads no gRPC library of its own, ``bench/kubelet.py``; ``--no-pods``
   without), idle after two samples and a few scrapes: RSS, USS and PSS of the
   supervisor, the worker and any probe, and each process's PSS and RSS grouped by mapping from
   ``/proc/<pid>/smaps`` (``[heap]`` and anonymous memory: Python objects and malloc arenas; the
   interpreter; each site-packages distribution's shared objects; libnvidia-ml; other libraries);
2. **imports**: a fresh interpreter importing what each process imports, step by step, with USS
   and PSS after each step (what one import costs, shared pages counted once per process);
3. **tracemalloc**: in a second fresh interpreter, the Python allocations each import step left
   behind (module objects, code, dicts), in MB (tracing costs memory itself, so not in view 2).

::

    python bench/footprint.py [--backend fake:examples/scenarios/h200x2.json] [--json out.json] [--markdown]

``--env MALLOC_ARENA_MAX=2`` and ``--trim-after 10`` measure two allocator options (fewer malloc
arenas for the worker's threads; memory freed after start returned to the system).

Goals (issue 30), printed as PASS/MISS: RSS and PSS of all processes, idle, at most
``--ratio`` (1.5) times nvitop-exporter's (``--peer-rss-mb`` / ``--peer-pss-mb``: 57.0 / 46.8 MB,
nvitop-exporter 1.7.2 on one H200; ``bench/peer.py`` measures both side by side in one run).

About 20 s. Not a test: numbers go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import kubelet  # noqa: E402
import load  # noqa: E402

import bench  # noqa: E402

PEER_RSS_MB = 57.0  # nvitop-exporter 1.7.2 on one H200, all processes, idle (issue 30)
PEER_PSS_MB = 46.8
GOAL_RATIO = 1.5

# What each process imports, in the order it does (exporter/cli.py serve; exporter/worker/main.py main).
SUPERVISOR_STEPS: list[tuple[str, list[str]]] = [
    ("asyncio", ["asyncio"]),
    ("uvloop", ["uvloop"]),
    ("aiohttp (web server)", ["aiohttp.web"]),
    (
        "exporter (supervisor side)",
        [
            "exporter.cli",
            "exporter.supervisor.supervisor",
            "exporter.supervisor.http.web",
            "exporter.supervisor.exposition",
            "exporter.supervisor.statuspage",
            "exporter.common.selfcheck",
        ],
    ),
    (
        "h2 + protobuf (pod attribution)",
        ["exporter.supervisor.podresources.transport", "exporter.supervisor.podresources.v1.api_pb2"],
    ),
    ("(for comparison, not loaded) grpcio", ["grpc"]),
    ("(for comparison, not loaded) prometheus_client", ["prometheus_client.core"]),
]
WORKER_STEPS: list[tuple[str, list[str]]] = [
    (
        "exporter (worker side)",
        ["exporter.worker", "exporter.worker.sampler", "exporter.common.collectors", "exporter.common.selfcheck"],
    ),
    ("pynvml", ["pynvml"]),
]

_PROBE = r"""
import importlib, json, sys
trace = sys.argv[2] == "trace"
if trace:
    import tracemalloc
    tracemalloc.start()
import psutil
p = psutil.Process()
def mem():
    if trace:
        return {"python_bytes": tracemalloc.get_traced_memory()[0]}
    m = p.memory_full_info()
    return {"rss": m.rss, "uss": m.uss, "pss": getattr(m, "pss", None)}
steps = json.loads(sys.argv[1])
out = [{"step": "interpreter (+ psutil)", "modules": len(sys.modules), **mem()}]
for name, mods in steps:
    for m in mods:
        try:
            importlib.import_module(m)
        except Exception as exc:
            out.append({"step": name, "error": f"{m}: {exc!r}"})
    out.append({"step": name, "modules": len(sys.modules), **mem()})
print(json.dumps(out))
"""


def _probe(steps: list[tuple[str, list[str]]], mode: str) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cp = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(steps), mode], capture_output=True, text=True, env=env, timeout=120
    )
    if cp.returncode != 0:
        raise RuntimeError(cp.stderr[-2000:])
    rows: list[dict[str, Any]] = json.loads(cp.stdout.strip().splitlines()[-1])
    return rows


def imports(steps: list[tuple[str, list[str]]]) -> dict[str, Any]:
    """A fresh interpreter importing ``steps`` in order: USS/PSS after each (no tracing), and in a
    second interpreter the Python allocations each step left (tracemalloc)."""
    try:
        rows = _probe(steps, "memory")
        traced = _probe(steps, "trace")
    except RuntimeError as exc:
        return {"error": str(exc)}
    prev: dict[str, Any] | None = None
    prev_py: int | None = None
    for row, t in zip(rows, traced, strict=False):
        if "uss" in row:
            if prev is not None:
                row["uss_added"] = row["uss"] - prev["uss"]
                row["pss_added"] = (row["pss"] or 0) - (prev["pss"] or 0)
            prev = row
        if "python_bytes" in t:
            if prev_py is not None:
                row["python_added"] = t["python_bytes"] - prev_py
            prev_py = t["python_bytes"]
    return {"steps": rows}


_MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$")


def _category(path: str) -> str:
    if not path:
        return "anonymous (Python objects, malloc arenas)"
    if path == "[heap]":
        return "[heap] (Python objects, malloc)"
    if path.startswith("["):
        return path
    if "libnvidia-ml" in path:
        return "libnvidia-ml"
    m = re.search(r"(?:site-packages|dist-packages)/([^/]+)", path)
    if m:
        return "site-packages: " + re.split(r"[.-]", m.group(1))[0]
    if re.search(r"/(python3[.\d]*|libpython[^/]*)$", path) or "/lib/python3" in path:
        return "interpreter (python, libpython, stdlib .so)"
    if path.startswith("/memfd:") or "(deleted)" in path:
        return "shared memory (breadcrumbs)"
    return "other libraries (libc, libssl, ...)"


def smaps(pid: int) -> dict[str, dict[str, int]]:
    """Pss and Rss in bytes by mapping category (:func:`_category`)."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"pss": 0, "rss": 0})
    current = ""
    try:
        lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
    except OSError as exc:
        return {"error": {"unreadable": 0, "why": str(exc)}}  # type: ignore[dict-item]
    for line in lines:
        m = _MAPPING.match(line)
        if m:
            current = _category(m.group(1).strip())
            continue
        if line.startswith("Pss:"):
            out[current]["pss"] += int(line.split()[1]) * 1024
        elif line.startswith("Rss:"):
            out[current]["rss"] += int(line.split()[1]) * 1024
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["pss"]))


_TRIM = """
import ctypes, os, threading, time
def _trim():
    time.sleep(float(os.environ["FOOTPRINT_TRIM_AFTER_S"]))
    ctypes.CDLL("libc.so.6").malloc_trim(0)
threading.Thread(target=_trim, daemon=True).start()
"""


def running(
    backend: str,
    settle_s: float = 3.0,
    pods: bool = True,
    extra_env: dict[str, str] | None = None,
    trim_after_s: float = 0,
) -> dict[str, Any]:
    """The real exporter after two samples and a few scrapes: memory per process and mapping.

    ``extra_env`` (e.g. ``MALLOC_ARENA_MAX``) reaches both processes; ``trim_after_s`` > 0 makes
    each process call glibc's ``malloc_trim(0)`` that long after it starts (a ``sitecustomize`` on
    ``PYTHONPATH``: a measurement of what trimming would give, not something the exporter does).
    """
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="nvgpu-footprint-"))
        env = {"NVGPU_NVML_BACKEND": backend, "NVGPU_STATE_FILE": "", "NVGPU_SAMPLE_INTERVAL_SECONDS": "1"}
        env.update(extra_env or {})
        if trim_after_s > 0:
            (Path(tmp) / "sitecustomize.py").write_text(_TRIM)
            env["FOOTPRINT_TRIM_AFTER_S"] = f"{trim_after_s:g}"
            env["PYTHONPATH"] = os.pathsep.join(p for p in (tmp, os.environ.get("PYTHONPATH", "")) if p)
            settle_s = max(settle_s, trim_after_s + 2)
        if pods:
            env.update(kubelet.pod_env(stack.enter_context(kubelet.fake_kubelet(kubelet.uuids_of(backend)))))
        server = bench.start_exporter(env, load.free_port(), Path(tmp) / "exporter.log")
        try:
            server.wait_status("/readyz", 60.0)
            deadline = time.monotonic() + 30.0
            while pods and time.monotonic() < deadline:  # the client built and one List answered
                if re.search(rb"^nvgpu_pod_attribution_up 1", server.get("/metrics")[1], re.M):
                    break
                time.sleep(0.5)
            else:
                if pods:
                    raise RuntimeError("pod attribution did not come up (nvgpu_pod_attribution_up is not 1)")
            for _ in range(5):
                server.get("/metrics")
                time.sleep(0.5)
            time.sleep(settle_s)
            procs = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
            out = []
            for p in procs:
                role = bench.role(p, server.pid)
                m = p.memory_full_info()
                out.append(
                    {
                        "role": role,
                        "pid": p.pid,
                        "rss": m.rss,
                        "uss": m.uss,
                        "pss": getattr(m, "pss", None),
                        "threads": p.num_threads(),
                        "by_mapping": smaps(p.pid),
                    }
                )
            return {
                "backend": backend,
                "pod_attribution": pods,
                "env": extra_env or {},
                "trim_after_s": trim_after_s,
                "processes": out,
            }
        finally:
            server.stop()


def goals(result: dict[str, Any], peer_rss_mb: float, peer_pss_mb: float, ratio: float) -> list[dict[str, Any]]:
    """RSS and PSS of all processes against ``ratio`` times nvitop-exporter's: PASS or MISS (N/A on
    the fake backend, which has none of the NVML library's memory)."""
    run = result["running"]
    procs = run["processes"]
    rss = sum(p["rss"] for p in procs) / 1e6
    pss = sum(p["pss"] or 0 for p in procs) / 1e6
    fake = str(run["backend"]).startswith("fake:")
    pods = "pod attribution loaded" if run.get("pod_attribution") else "WITHOUT pod attribution"
    rows = []
    for what, ours, peer in (("RSS", rss, peer_rss_mb), ("PSS", pss, peer_pss_mb)):
        bound = ratio * peer
        value = f"{ours:.1f} MB vs {peer:.1f} MB ({ours / peer:.2f}x; bound {bound:.1f} MB)"
        if fake:
            value += "; fake NVML: the NVML library's own memory (about 34 MB RSS on an H200) is not in it"
        rows.append(
            {
                "goal": f"{what}, all processes, idle, {pods}: at most {ratio:g}x nvitop-exporter's",
                "value": value,
                "status": "N/A" if fake else "PASS" if ours <= bound else "MISS",
            }
        )
    return rows


def markdown(result: dict[str, Any]) -> str:
    def mb(v: float | None) -> str:
        return "-" if v is None else f"{v / 1e6:.1f}"

    lines = ["| process | RSS MB | USS MB | PSS MB | threads |", "|---|---|---|---|---|"]
    procs = result["running"]["processes"]
    for p in procs:
        lines.append(f"| {p['role']} | {mb(p['rss'])} | {mb(p['uss'])} | {mb(p['pss'])} | {p['threads']} |")
    lines.append(
        f"| **all** | {mb(sum(p['rss'] for p in procs))} | {mb(sum(p['uss'] for p in procs))} | "
        f"{mb(sum(p['pss'] or 0 for p in procs))} | |"
    )
    cats = sorted(
        {c for p in procs for c in p["by_mapping"]},
        key=lambda c: -sum(p["by_mapping"].get(c, {}).get("pss", 0) for p in procs),
    )
    roles = [p["role"] for p in procs]
    lines += ["", "| PSS by mapping, MB | " + " | ".join(roles) + " |", "|---|" + "---|" * len(roles)]
    for c in cats:
        lines.append(f"| {c} | " + " | ".join(mb(p["by_mapping"].get(c, {}).get("pss")) for p in procs) + " |")
    for name in ("supervisor", "worker"):
        data = result["imports"][name]
        if "steps" not in data:
            continue
        lines += [
            "",
            f"| {name}: import step | USS MB after | USS added | PSS added | of which Python objects | modules |",
            "|---|---|---|---|---|---|",
        ]
        for row in data["steps"]:
            if "error" in row:
                lines.append(f"| {row['step']} | error: {row['error'][:80]} | | | | |")
                continue
            lines.append(
                f"| {row['step']} | {mb(row['uss'])} | {mb(row.get('uss_added'))} | {mb(row.get('pss_added'))} | "
                f"{mb(row.get('python_added'))} | {row['modules']} |"
            )
    return "\n".join(lines)


def bytecode() -> dict[str, Any]:
    """Whether imports read bytecode: a module compiled from source at import leaves more memory held
    (h2 + hpack: about 4 MB more USS in the supervisor, 2026-12-01), so a footprint is only comparable
    with the package's ``.pyc`` files present, as after ``pip install`` (``python -m compileall``)."""
    import importlib.util

    missing = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "exporter").rglob("*.py"))
        if not Path(importlib.util.cache_from_source(str(path))).exists()
    ]
    return {
        "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
        "exporter_modules_without_pyc": len(missing),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default=f"fake:{ROOT / 'examples' / 'scenarios' / 'h200x2.json'}")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--no-pods", dest="pods", action="store_false", help="without pod attribution (no kubelet)")
    ap.add_argument("--peer-rss-mb", type=float, default=PEER_RSS_MB, help="nvitop-exporter's RSS, all processes")
    ap.add_argument("--peer-pss-mb", type=float, default=PEER_PSS_MB, help="nvitop-exporter's PSS, all processes")
    ap.add_argument("--ratio", type=float, default=GOAL_RATIO)
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="e.g. MALLOC_ARENA_MAX=2")
    ap.add_argument("--trim-after", type=float, default=0.0, help="malloc_trim(0) in each process after S s")
    args = ap.parse_args(argv)
    extra = dict(kv.split("=", 1) for kv in args.env)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": sys.version.split()[0],
        "machine": bench.machine_info(),
        "bytecode": bytecode(),
        "running": running(args.backend, pods=args.pods, extra_env=extra, trim_after_s=args.trim_after),
        "imports": {"supervisor": imports(SUPERVISOR_STEPS), "worker": imports(WORKER_STEPS)},
    }
    result["goals"] = goals(result, args.peer_rss_mb, args.peer_pss_mb, args.ratio)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result) if args.markdown else json.dumps(result, indent=1))
    for row in result["goals"]:
        print(f"{row['status']:4}  {row['goal']}: {row['value']}")
    if result["bytecode"]["exporter_modules_without_pyc"]:
        print(
            f"note: {result['bytecode']['exporter_modules_without_pyc']} exporter modules have no .pyc "
            "(run python -m compileall exporter first: imports compiled from source hold more memory)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
