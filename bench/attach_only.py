#!/usr/bin/env python3
"""What a worker that attaches only some GPUs does on the
real driver.

Runs the real worker module (``python -m exporter.worker``) three ways on this machine and reports,
for each, the time to finish ``nvmlInit``, the time to its first snapshot, which GPUs the snapshot
holds (and their state), the NVML calls it made, and its peak RSS (VmHWM):

1. ``all``: the ordinary worker, every GPU;
2. ``only``: a probe-style worker given one GPU (the last one) by PCI bus id (``only``, as the
   supervisor's probes run): it must report that GPU alone, never calling the others;
3. ``hidden`` (root only): the same ordinary worker in a private mount namespace where every other
   GPU's device node is covered by /dev/null: does NVML then enumerate (and attach) only the
   visible GPU? This tells whether a new NVML client *can* avoid touching a wedged GPU at init.

Writes one JSON document (``--out``). Never changes a GPU's settings.

    python3 bench/attach_only.py --out $OUT/attach_only.json
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def gpus(backend: str) -> list[dict[str, Any]]:
    if backend.startswith("fake:"):  # a dry run without a GPU
        data = json.loads(Path(backend[5:]).read_text())
        return [
            {"index": i, "uuid": g["uuid"], "bus_id": g.get("pci_bus_id", ""), "minor": i}
            for i, g in enumerate(data["gpus"])
        ]
    import pynvml

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            out.append(
                {
                    "index": i,
                    "uuid": str(pynvml.nvmlDeviceGetUUID(h)),
                    "bus_id": bus.decode() if isinstance(bus, bytes) else str(bus),
                    "minor": int(pynvml.nvmlDeviceGetMinorNumber(h)),
                }
            )
        return out
    finally:
        pynvml.nvmlShutdown()


def worker_config(extra: dict[str, Any], backend: str = "nvml") -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from exporter.config import Config
    from exporter.supervisor.workerproc import worker_config as build
    from guards import features as gf
    from guards import featuretable

    cfg = Config(
        nvml_backend=backend,
        interval_s=1.0,
        feature_modes=dict.fromkeys(featuretable.FEATURES, gf.Mode.AUTO),
        log_level="WARNING",
    )
    data = build(cfg, {}).to_wire()  # the worker decodes it as exporter.common.workerconfig.WorkerConfig
    data.update(extra)
    return data


def run_worker(config: dict[str, Any], samples: int, wrap: list[str] | None = None) -> dict[str, Any]:
    read_fd, write_fd = os.pipe()
    env = dict(os.environ)
    env.update(NVGPU_WORKER_CONFIG=json.dumps({**config, "samples": samples}), NVGPU_WORKER_FD=str(write_fd))
    cmd = [sys.executable, "-m", "exporter.worker"]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [*(wrap or []), *cmd], env=env, pass_fds=(write_fd,), stdin=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
    )
    os.close(write_fd)
    out: dict[str, Any] = {"steps": [], "snapshots": []}
    buf = b""
    peak_kb = 0
    deadline = t0 + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([read_fd], [], [], 0.05)
        peak_kb = max(peak_kb, _hwm_kb(proc.pid))
        if not ready:
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(read_fd, 1 << 20)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            msg = json.loads(line)
            at = round(time.monotonic() - t0, 4)
            if msg["type"] == "progress":
                out["steps"].append({"at_s": at, "step": msg["step"]})
            elif msg["type"] == "hello":
                out["hello_at_s"] = at
                out["hello_gpus"] = msg["gpus"]
            elif msg["type"] == "snapshot":
                out["snapshots"].append(
                    {
                        "at_s": at,
                        "calls": msg["calls"],
                        "duration_s": msg["duration_s"],
                        "gpus": [{"index": g["index"], "uuid": g["uuid"], "state": g["state"]} for g in msg["gpus"]],
                    }
                )
            elif msg["type"] == "init_failed":
                out["init_failed"] = msg
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    os.close(read_fd)
    out["returncode"] = proc.returncode
    out["peak_rss_mb"] = round(peak_kb / 1024, 1)
    out["wall_s"] = round(time.monotonic() - t0, 3)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    out["stderr_tail"] = err[-1500:]
    return out


def _hwm_kb(pid: int) -> int:
    """Peak RSS of ``pid`` (VmHWM), or of its first child when it is a wrapper (unshare)."""
    for p in (pid, *_children(pid)):
        try:
            text = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        if "python" not in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace"):
            continue
        for line in text.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--backend", default="nvml", help="nvml, or fake:<scenario> for a dry run")
    args = p.parse_args()
    found = gpus(args.backend)
    report: dict[str, Any] = {"gpus": found, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    target = found[-1]
    report["all"] = run_worker(worker_config({}, args.backend), args.samples)
    report["only"] = run_worker(
        worker_config(
            {"only": [{"index": target["index"], "uuid": target["uuid"], "bus_id": target["bus_id"]}]}, args.backend
        ),
        args.samples,
    )
    others = [g for g in found if g is not target]
    if os.geteuid() == 0 and shutil.which("unshare") and others and args.backend == "nvml":
        covers = " && ".join(f"mount --bind /dev/null /dev/nvidia{g['minor']}" for g in others)
        script = f'{covers} && exec "$@"'
        report["hidden"] = run_worker(
            worker_config({}, args.backend), args.samples, ["unshare", "--mount", "sh", "-c", script, "sh"]
        )
        report["hidden"]["covered"] = [f"/dev/nvidia{g['minor']}" for g in others]
    else:
        report["hidden"] = {"skipped": "needs root, unshare and more than one GPU"}
    args.out.write_text(json.dumps(report, indent=1))
    only_gpus = {g["index"] for s in report["only"]["snapshots"] for g in s["gpus"]}
    print(json.dumps({"only_sees": sorted(only_gpus), "target": target["index"]}))
    return 0 if only_gpus == {target["index"]} else 1


if __name__ == "__main__":
    sys.exit(main())
