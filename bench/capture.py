"""Real worker messages for in-process benchmarks (issue 30): run ``python -m exporter.worker``.

:func:`capture` starts the worker as the supervisor does (``NVGPU_WORKER_CONFIG`` from
:func:`exporter.supervisor.workerproc.worker_config`, the message pipe as ``NVGPU_WORKER_FD``, stdin kept
open) with ``samples: N`` so that it stops by itself, and returns every JSON line it wrote: the
``selfcheck``/``hello`` lines and one ``snapshot`` line per sample, byte for byte as the
supervisor's ``exporter/supervisor/workerproc.py`` reads them. The fake backend's values move with wall time,
so consecutive snapshots at a 1 s interval differ as they do in a running exporter.

``python bench/capture.py --samples 20 --out /tmp/h200x8.jsonl`` writes them to a file; the
prototypes (``bench/proto_decode.py``, ``bench/proto_render.py``) take ``--lines FILE`` to reuse
one capture, or capture themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SCENARIO = "examples/scenarios/h200x8.json"


def worker_config(scenario: str, interval_s: float, samples: int) -> dict[str, Any]:
    """The worker's configuration for a fake scenario, as the supervisor would send it."""
    sys.path.insert(0, str(ROOT))
    from exporter.config import Config
    from exporter.supervisor.workerproc import worker_config as make_config

    env = {
        "NVGPU_NVML_BACKEND": f"fake:{(ROOT / scenario).resolve()}",
        "NVGPU_STATE_FILE": "",
        "NVGPU_SAMPLE_INTERVAL_SECONDS": f"{interval_s:g}",
    }
    return make_config(Config.from_env(env), {}, samples=samples).to_wire()


def capture(
    scenario: str = DEFAULT_SCENARIO, samples: int = 20, interval_s: float = 1.0, timeout_s: float = 120.0
) -> list[bytes]:
    """Every line the worker writes for ``samples`` samples (raises RuntimeError on a failure)."""
    read_fd, write_fd = os.pipe()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    env["NVGPU_WORKER_CONFIG"] = json.dumps(worker_config(scenario, interval_s, samples))
    env["NVGPU_FAKE_EPOCH"] = repr(time.monotonic())  # scenario time 0, on the monotonic clock
    env["NVGPU_WORKER_FD"] = str(write_fd)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter.worker"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(write_fd,),
        env=env,
        cwd=ROOT,
    )
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        lines = pipe.read().splitlines()  # EOF when the worker exits
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise RuntimeError("worker did not exit") from None
    snaps = [ln for ln in lines if b'"type": "snapshot"' in ln or b'"type":"snapshot"' in ln]
    if proc.returncode != 0 or len(snaps) < samples:
        raise RuntimeError(f"worker exit {proc.returncode}, {len(snaps)} snapshots; stderr:\n{err.decode()[-3000:]}")
    return lines


def load_or_capture(path: str | None, samples: int, scenario: str = DEFAULT_SCENARIO) -> list[bytes]:
    """Lines from ``path`` (a previous ``--out``), else a fresh capture."""
    if path:
        return Path(path).read_bytes().splitlines()
    return capture(scenario, samples)


def snapshots(lines: list[bytes]) -> list[bytes]:
    """The ``snapshot`` lines only."""
    return [ln for ln in lines if json.loads(ln).get("type") == "snapshot"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="capture real worker messages on a fake scenario")
    p.add_argument("--scenario", default=DEFAULT_SCENARIO)
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    lines = capture(args.scenario, args.samples, args.interval)
    Path(args.out).write_bytes(b"".join(ln + b"\n" for ln in lines))
    sizes = [len(ln) for ln in snapshots(lines)]
    print(f"{len(lines)} lines, {len(sizes)} snapshots of {min(sizes)}-{max(sizes)} bytes -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
