#!/usr/bin/env python3
"""Isolation benchmark: one sick GPU of eight must cost only its own series.

The real exporter (supervisor + worker) on the fake backend with the eight-GPU H200 scenario and
the fault: from t = 15 s every NVML call that takes GPU 1 (its handle lookup included)
blocks 45 s, then fails with UNKNOWN, for good; a new NVML client's ``nvmlInit`` blocks 45 s while
the GPU is wedged (a fresh client attaches every GPU); an Xid 119 (GSP RPC timeout) for GPU 1
arrives at t = 16 s. Default settings otherwise (5 s interval, 15 s stale bound, probes from 30 s
doubling to 600 s).

A client scrapes ``/metrics`` once a second for the whole run (default 10 minutes) and records,
per scrape: which GPUs have fresh readings (``nvgpu_device_up`` 1 and a power reading), GPU 1's
state, whether GPU 1's Xid 119 counter is present, restarts and probe failures. A sampler records
the RSS of the supervisor, the worker and any probe.

Goals (exit 1 if one is missed): every healthy GPU has fresh readings in >= 99 % of the scrapes
after the first sample; once counted, the Xid series is in every scrape; no worker restart; at most
one worker and one probe alive at once.

    python bench/isolation.py [--duration 600] [--out bench/results/isolation-<date>.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
SICK = 1


def scenario() -> dict[str, Any]:
    data = json.loads((ROOT / "examples" / "scenarios" / "h200x8.json").read_text())
    wedge = {"from_s": 15.0, "gpu": SICK}
    data["faults"] = [
        {
            "comment": "GSP timeout on GPU 1: every call blocks 45 s",
            "function": "*",
            **wedge,
            "action": "delay",
            "seconds": 45,
        },
        {"comment": "... then fails", "function": "*", **wedge, "action": "error", "error": "UNKNOWN"},
        {
            "comment": "a new client attaches the wedged GPU at init",
            "function": "nvmlInit",
            "from_s": 15.0,
            "action": "delay",
            "seconds": 45,
        },
    ]
    data["events"] = [{"at_s": 16.0, "gpu": SICK, "event_type": "XidCriticalError", "data": 119}]
    return data


def scrape(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    up: set[str] = set()
    readings: set[str] = set()
    out: dict[str, Any] = {"restarts": 0.0, "probe_failed": 0.0, "xid": False, "state": ""}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            gpu = s.labels.get("gpu", "")
            if s.name == "nvgpu_device_up" and s.value == 1.0:
                up.add(gpu)
            elif s.name == "nvgpu_power_usage_watts":
                readings.add(gpu)
            elif s.name == "nvgpu_worker_restarts_total":
                out["restarts"] += s.value
            elif s.name == "nvgpu_device_faults_total" and s.labels.get("fault") == "probe_failed":
                out["probe_failed"] += s.value
            elif s.name == "nvgpu_xid_errors_total" and gpu == str(SICK) and s.labels.get("xid") == "119":
                out["xid"] = True
            elif s.name == "nvgpu_device_state" and gpu == str(SICK) and s.value == 1.0:
                out["state"] = s.labels["state"]
    out["fresh"] = sorted(up & readings)
    return out


def rss_tree(pid: int) -> dict[str, float]:
    """RSS in MB of the supervisor, the workers and probes (told apart by their config)."""
    out = {"supervisor": 0.0, "workers": 0.0, "processes": 0}
    try:
        root = psutil.Process(pid)
        out["supervisor"] = root.memory_info().rss / 1e6
        for child in root.children():
            out["workers"] += child.memory_info().rss / 1e6
            out["processes"] += 1
    except psutil.Error:
        pass
    return out


def run(duration: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="nvgpu-isolation-"))
    path = work / "scenario.json"
    path.write_text(json.dumps(scenario()))
    port = 19000 + os.getpid() % 1000
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    env.update(
        NVGPU_NVML_BACKEND=f"fake:{path}",
        NVGPU_LISTEN_ADDRESS=f"127.0.0.1:{port}",
        NVGPU_STATE_FILE=str(work / "state.json"),
        NVGPU_LOG_FORMAT="json",
        NVGPU_FEATURE_POD_ATTRIBUTION="off",
    )
    log = open(work / "exporter.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "exporter"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    url = f"http://127.0.0.1:{port}/metrics"
    scrapes: list[dict[str, Any]] = []
    rss: list[dict[str, float]] = []
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < duration:
            time.sleep(1.0)
            try:
                s = scrape(url)
            except OSError:
                continue
            s["t"] = round(time.monotonic() - t0, 1)
            scrapes.append(s)
            rss.append(rss_tree(proc.pid))
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    started = next((i for i, s in enumerate(scrapes) if len(s["fresh"]) == 8), len(scrapes))
    after = scrapes[started:]
    healthy = [str(g) for g in range(8) if g != SICK]
    share = {g: round(sum(g in s["fresh"] for s in after) / max(1, len(after)), 4) for g in healthy}
    first_xid = next((i for i, s in enumerate(after) if s["xid"]), None)
    xid_every = first_xid is not None and all(s["xid"] for s in after[first_xid:])
    last = after[-1] if after else {}
    goals = {
        "healthy_fresh_share": {"value": min(share.values()) if share else 0.0, "goal": ">= 0.99"},
        "xid_in_every_scrape": {"value": xid_every, "goal": "true"},
        "restarts": {"value": last.get("restarts", -1), "goal": "0"},
        "processes_at_once": {"value": max((r["processes"] for r in rss), default=0), "goal": "<= 2"},
    }
    goals["healthy_fresh_share"]["ok"] = goals["healthy_fresh_share"]["value"] >= 0.99
    goals["xid_in_every_scrape"]["ok"] = bool(xid_every)
    goals["restarts"]["ok"] = last.get("restarts", -1) == 0
    goals["processes_at_once"]["ok"] = goals["processes_at_once"]["value"] <= 2
    return {
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "duration_s": duration,
        "scrapes": len(scrapes),
        "scrapes_after_first_sample": len(after),
        "fresh_share_by_gpu": share,
        "sick_gpu_states": sorted({s["state"] for s in after}),
        "sick_gpu_probe_failures": last.get("probe_failed"),
        "rss_mb": {
            "supervisor_max": round(max((r["supervisor"] for r in rss), default=0.0), 1),
            "workers_and_probes_max": round(max((r["workers"] for r in rss), default=0.0), 1),
            "total_max": round(max((r["supervisor"] + r["workers"] for r in rss), default=0.0), 1),
        },
        "goals": goals,
        "ok": all(g["ok"] for g in goals.values()),
        "log": str(work / "exporter.log"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    report = run(args.duration)
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
