"""Self-check: which copies of the critical modules this process (and a real worker) imported.

The incident: an upgrade that ``pip show`` reported as done did not run, because the image's
working directory held an old copy that Python imported first. Only ``__file__`` and
``__version__`` of the *running* process tell the truth, and the worker's answer matters most: it
is the process that imports ``pynvml``. The checks live in :mod:`guards.versions` (standard
library only); this module runs them, turns results into JSON for the protocol and the
``selfcheck`` command, and prints the table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from guards import versions

MODES = ("warn", "strict", "off")


def run_in_process(process: str, driver_version: str | None = None) -> versions.SelfCheckResult:
    """Run the checks here (:func:`guards.versions.run_checks`)."""
    return versions.run_checks(process, driver_version=driver_version)


def to_dict(result: versions.SelfCheckResult) -> dict[str, Any]:
    """A result as JSON: ``{process, modules: [...], problems, notes}`` (the protocol's shape)."""
    from exporter.common.snapshot import selfcheck_to_wire

    return selfcheck_to_wire(result)


def run_worker_check(timeout_s: float = 60.0, backend: str = "nvml") -> dict[str, Any]:
    """Start a real worker-side interpreter (same executable, same working directory, same
    environment) and run the checks after importing what the worker imports; then load the NVML
    ``backend`` as the worker does and check the native library it maps (``native`` in the result,
    :mod:`exporter.common.nativelib`).

    Returns:
        The worker's result dict; on failure a dict whose ``problems`` say what went wrong.
    """
    code = (
        "import json, exporter.worker.main, exporter.worker.nvml.backend, exporter.worker.nvml.client\n"
        "try:\n    import pynvml\nexcept Exception as e:\n    pass\n"
        "from exporter.common import selfcheck\n"
        "result = selfcheck.to_dict(selfcheck.run_in_process('worker'))\n"
        f"print(json.dumps(exporter.worker.main.selfcheck_with_native(result, {backend!r})))\n"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, cwd=os.getcwd()
        )
    except subprocess.TimeoutExpired:
        return {
            "process": "worker",
            "modules": [],
            "problems": [f"worker self-check timed out after {timeout_s} s"],
            "notes": [],
        }
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-5:]
        return {
            "process": "worker",
            "modules": [],
            "problems": ["worker self-check failed to run: " + " | ".join(tail)],
            "notes": [],
        }
    try:
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {
            "process": "worker",
            "modules": [],
            "problems": [f"worker self-check printed no result: {proc.stdout[-200:]!r}"],
            "notes": [],
        }
    return result


def format_table(results: list[dict[str, Any]]) -> str:
    """Human table of module reports and problems."""
    rows = [("process", "module", "version", "distribution", "dist version", "in dist", "path")]
    for res in results:
        for m in res["modules"]:
            rows.append(
                (
                    res["process"],
                    m["module"],
                    m["version"] or "-",
                    m["distribution"],
                    m["distribution_version"] or "MISSING",
                    {True: "yes", False: "NO", None: "?"}[m["file_in_distribution"]],
                    m["path"] or "-",
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
    problems = [(res["process"], p) for res in results for p in res["problems"]]
    notes = [(res["process"], p) for res in results for p in res.get("notes", [])]
    lines.append("")
    for res in results:
        lib = res.get("native")
        if lib:
            lines.append(
                f"native  [{res['process']}] libnvidia-ml {lib['realpath'] or lib['path'] or 'none'} "
                f"(origin {lib['origin']}), kernel module {lib['kernel_module_version'] or 'none'}, "
                f"NVML {lib['nvml_version'] or '?'}: {lib['state']}"
            )
    lines.extend(f"PROBLEM [{proc}] {p}" for proc, p in problems)
    lines.extend(f"note    [{proc}] {p}" for proc, p in notes)
    lines.append("self-check: " + ("FAILED" if problems else "ok") + f" ({len(problems)} problem(s))")
    return "\n".join(lines)


def command(as_json: bool, strict: bool, backend: str = "nvml") -> int:
    """``nvgpu-exporter selfcheck``: supervisor and worker checks (the worker's with the native library
    of the NVML ``backend``); exit 3 on problems with --strict."""
    from exporter.common import protocol

    results = [to_dict(run_in_process("supervisor")), run_worker_check(backend=backend)]
    print(json.dumps(results, indent=2) if as_json else format_table(results))
    failed = any(r["problems"] for r in results)
    return protocol.EXIT_SELFCHECK if failed and strict else protocol.EXIT_OK
