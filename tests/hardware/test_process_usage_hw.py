"""Per-process memory and SM utilization on one H200 against known allocations.

Two PyTorch processes share GPU ``NVGPU_HW_GPU`` (default 0):

- ``idle`` allocates 3 GiB and sleeps;
- ``busy`` allocates 7 GiB and runs a bf16 8192 x 8192 matmul loop.

Each child first starts CUDA and warms up (the busy one runs one matmul, loading cuBLAS and its
workspace), reads its own ``usedGpuMemory`` from NVML (its context: CUDA context, loaded kernels,
workspace), allocates, and reports. Expected memory of a process = that context + what PyTorch
reserved for the allocation. The exporter (real NVML, ``process_usage`` on, 1 s interval) then
has to report, for each child's pid:

- ``nvgpu_process_memory_used_bytes`` within 5 % of the expected memory;
- ``nvgpu_process_sm_utilization_ratio``: median at least 0.5 for the busy child, at most 0.05 for
  the idle one (the utilization is attributed to the busy one);
- no dropped records, and the process list answered by ``_v3``.

Run on a machine with an H200, PyTorch and this project installed (about one minute)::

    NVGPU_HW_OUT=$OUT/hw python3 -m pytest -q -p no:cacheprovider tests/hardware/test_process_usage_hw.py -rs

It writes ``$NVGPU_HW_OUT/process_usage.json`` (the children's reports, every scrape's per-process
readings, nvidia-smi's compute apps, the checks and their verdicts, versions) and
``$NVGPU_HW_OUT/process_usage_metrics.txt`` (the last exposition). Skips cleanly without a GPU
or without PyTorch.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from exporter_proc import Exporter, Scrape

GIB = 1 << 30
MEMORY_TOLERANCE = 0.05
BUSY_SM_MIN = 0.5
IDLE_SM_MAX = 0.05

CHILD = r"""
import json, os, sys, time
import pynvml, torch

kind, size, stop_file, gpu = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
dev = torch.device("cuda:0")  # CUDA_VISIBLE_DEVICES names the one GPU
if kind == "busy":
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    c = a @ b  # loads cuBLAS and its workspace before the context is measured
else:
    c = torch.zeros(1, device=dev)
torch.cuda.synchronize()
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)

def mine():
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if p.pid == os.getpid():
            return p.usedGpuMemory
    return None

time.sleep(0.5)
context = mine()
reserved_before = torch.cuda.memory_reserved()
block = torch.empty(size, dtype=torch.uint8, device=dev)
block.fill_(1)
torch.cuda.synchronize()
reserved_after = torch.cuda.memory_reserved()
time.sleep(0.5)
print(json.dumps({
    "kind": kind, "pid": os.getpid(), "allocated_bytes": size, "context_bytes": context,
    "reserved_before": reserved_before, "reserved_after": reserved_after, "nvml_after": mine(),
    "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
}), flush=True)
iterations = 0
started = time.monotonic()
while not os.path.exists(stop_file):
    if kind == "busy":
        for _ in range(20):
            c = a @ b
        torch.cuda.synchronize()
        iterations += 20
    else:
        time.sleep(0.2)
print(json.dumps({"kind": kind, "iterations": iterations, "seconds": time.monotonic() - started}), flush=True)
"""


# -- pure evaluation (checked without a GPU in tests/test_hw_process_usage_eval.py) -------------------


def expected_bytes(report: Mapping[str, Any]) -> int:
    """The child's context plus what PyTorch reserved for its allocation."""
    return int(report["context_bytes"]) + int(report["reserved_after"]) - int(report["reserved_before"])


def per_process(scrape: Scrape, gpu: str) -> dict[str, dict[str, float]]:
    """pid -> {memory, sm} from one scrape (the summed "other" series left out)."""
    out: dict[str, dict[str, float]] = {}
    for name, key in (("nvgpu_process_memory_used_bytes", "memory"), ("nvgpu_process_sm_utilization_ratio", "sm")):
        for s in scrape.find(name, gpu=gpu):
            if s.labels["pid"] != "other":
                out.setdefault(s.labels["pid"], {})[key] = s.value
    return out


def evaluate(
    reports: Mapping[str, Mapping[str, Any]], readings: Sequence[Mapping[str, Mapping[str, float]]]
) -> dict[str, Any]:
    """Verdicts for the busy and idle children from per-scrape readings (``per_process`` output).

    Returns:
        ``{kind: {...numbers...}, "failures": [...]}``; no failures means the point holds.
    """
    result: dict[str, Any] = {"failures": []}
    for kind, report in reports.items():
        pid = str(report["pid"])
        memories = [r[pid]["memory"] for r in readings if pid in r and "memory" in r[pid]]
        sms = [r[pid]["sm"] for r in readings if pid in r and "sm" in r[pid]]
        expected = expected_bytes(report)
        entry: dict[str, Any] = {
            "pid": int(report["pid"]),
            "allocated_bytes": int(report["allocated_bytes"]),
            "context_bytes": int(report["context_bytes"]),
            "expected_bytes": expected,
            "samples": len(memories),
        }
        result[kind] = entry
        if not memories or not sms:
            result["failures"].append(f"{kind} (pid {pid}): no per-process series")
            continue
        exported = statistics.median(memories)
        entry.update(
            exported_bytes=exported,
            memory_error=(exported - expected) / expected,
            sm_median=statistics.median(sms),
            sm_max=max(sms),
        )
        if abs(entry["memory_error"]) > MEMORY_TOLERANCE:
            result["failures"].append(
                f"{kind}: exported {exported:.0f} B vs expected {expected} B ({entry['memory_error']:+.1%})"
            )
        if kind == "busy" and entry["sm_median"] < BUSY_SM_MIN:
            result["failures"].append(f"busy: median SM utilization {entry['sm_median']:.2f} < {BUSY_SM_MIN}")
        if kind == "idle" and entry["sm_max"] > IDLE_SM_MAX:
            result["failures"].append(f"idle: SM utilization up to {entry['sm_max']:.2f} > {IDLE_SM_MAX}")
    return result


# -- the run ------------------------------------------------------------------------------------------


def _child(kind: str, size: int, stop_file: Path, gpu: int) -> subprocess.Popen[str]:
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(gpu)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, str(size), str(stop_file), str(gpu)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _line(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        line = proc.stdout.readline() if ready else ""
        if line.strip():
            return dict(json.loads(line))
        if proc.poll() is not None:  # exited with nothing more to say
            raise AssertionError(f"child exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
    raise AssertionError(f"no report from child within {timeout} s")


def _smi_apps() -> list[dict[str, str]]:
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):  # informational only
        return []
    keys = ("gpu_uuid", "pid", "process_name", "used_memory_mib")
    return [dict(zip(keys, (c.strip() for c in line.split(",")), strict=False)) for line in out.strip().splitlines()]


def test_per_process_memory_and_sm_attribution(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="PyTorch is needed to allocate known amounts and load the GPU")
    gpu = int(os.environ.get("NVGPU_HW_GPU", "0"))
    stop = tmp_path / "stop"
    children = {"idle": _child("idle", 3 * GIB, stop, gpu), "busy": _child("busy", 7 * GIB, stop, gpu)}
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "gpu": gpu}
    try:
        reports = {kind: _line(proc, 180) for kind, proc in children.items()}
        result["children"] = reports
        env = {
            "NVGPU_NVML_BACKEND": "nvml",
            "NVGPU_FEATURE_PROCESS_USAGE": "on",
            "NVGPU_FEATURE_POD_ATTRIBUTION": "off",
        }
        with Exporter(None, tmp_path, env=env, interval=1.0) as exp:
            pids = [str(r["pid"]) for r in reports.values()]
            exp.wait_for(
                lambda s: all(s.find("nvgpu_process_memory_used_bytes", pid=p) for p in pids),
                timeout=60,
                what="per-process series of both children",
            )
            time.sleep(3.0)  # a few samples of the busy loop
            readings, scrape = [], exp.scrape()
            for _ in range(12):
                scrape = exp.scrape()
                readings.append(per_process(scrape, str(gpu)))
                time.sleep(1.0)
            result["readings"] = readings
            result["nvidia_smi_compute_apps"] = _smi_apps()
            result["exporter"] = {
                "build_info": [s.labels for s in scrape.find("nvgpu_build_info")],
                "process_api": [s.labels for s in scrape.find("nvgpu_nvml_api_info")],
                "dropped": [(s.labels, s.value) for s in scrape.find("nvgpu_process_records_dropped_total")],
            }
            out = os.environ.get("NVGPU_HW_OUT")
            if out:
                Path(out).mkdir(parents=True, exist_ok=True)
                Path(out, "process_usage_metrics.txt").write_text(scrape.text)
        verdict = evaluate(reports, readings)
        result["verdict"] = verdict
        assert not result["exporter"]["dropped"], result["exporter"]["dropped"]
        assert any(a["call"] == "compute_processes" for a in result["exporter"]["process_api"])
        assert not verdict["failures"], verdict["failures"]
    finally:
        stop.write_text("stop")
        for kind, proc in children.items():
            try:
                tail = _line(proc, 30)  # iterations run and seconds, also from a child that already exited
            except (AssertionError, ValueError):
                tail = {}
            result.setdefault("children_end", {})[kind] = tail
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
        out = os.environ.get("NVGPU_HW_OUT")
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            Path(out, "process_usage.json").write_text(json.dumps(result, indent=1, default=str))
