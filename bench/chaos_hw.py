#!/usr/bin/env python3
"""NVLink chaos on the real H200 pair: counters stay monotonic while the worker is SIGSEGV'd every 30 s.

What one run does:

- starts the exporter (``python -m exporter``) on the REAL NVML backend (``--backend nvml``, the
  default) with ``NVGPU_FEATURE_NVLINK_THROUGHPUT=on``, a 1 s sample interval, the state file in the
  run's state directory, and ``NVGPU_QUARANTINE_AFTER=1000``: a SIGSEGV sent from outside is
  attributed to whatever NVML call is in flight at that moment, which on this box is often the
  NVLink throughput query itself (it is the longest call of a sample); with the default of 3, the
  feature under test would be quarantined after ~3 kills and the rest of the run would test nothing.
  Restart backoff is capped at 5 s (``NVGPU_RESTART_BACKOFF_MAX_SECONDS``) so a worker killed every
  30 s still spends most of the run sampling;
- runs a PyTorch data mover in a subprocess: a 1 GiB tensor copied cuda:0 -> cuda:1 and back in a
  loop for the whole run (no NCCL), logging cumulative bytes per direction with wall-clock times;
  ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and ``NVSHMEM_DISABLE_NVLS=1`` are
  set for every process of the run; ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` for the mover, and its GPUs are
  matched to NVML's by UUID;
- SIGSEGVs the worker (psutil: the exporter's child whose cmdline contains ``exporter.worker``)
  every 30 s from outside;
- scrapes /metrics every 1 s, recording the status code and, for each GPU and link,
  ``nvgpu_nvlink_transmit_bytes_total`` / ``nvgpu_nvlink_receive_bytes_total``.

Checks (exit status 1 if one fails): no scrape failed (every one answered 200); every NVLink counter
series never decreased, across every restart; the counters advanced by roughly what the mover moved
(ratio of counter delta to mover bytes, per direction and GPU, within 0.5..2; reported); restarts
counted by the exporter = kills sent; ``nvlink_throughput`` stayed enabled.

A device command may run 10 minutes at most, so a 10-minute run can be split::

    python bench/chaos_hw.py --duration 600 --background --state-dir /tmp/chaos-hw
    python bench/chaos_hw.py --collect /tmp/chaos-hw --wait 540 --out "$OUT/chaos_hw.json"   # exit 3: not done yet
    python bench/chaos_hw.py --collect /tmp/chaos-hw --out "$OUT/chaos_hw.json"               # later command

``--background`` starts the run detached (``setsid``) and returns; progress goes to
``<state dir>/progress.json``. Without a GPU: ``--backend fake:examples/scenarios/h200x2.json --no-torch``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
RATIO_RANGE = (0.5, 2.0)
EXIT_NOT_DONE = 3


def _chaos() -> ModuleType:
    """bench/chaos.py (exporter process, worker finder, versions), loaded by path."""
    name = "nvgpu_bench_chaos"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / "chaos.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _append(path: Path, record: Mapping[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill
    return out


# --------------------------------------------------------------------------------------------------
# the data mover (``_mover`` mode, a subprocess)


def mover_main(argv: list[str]) -> int:
    """Copy a tensor cuda:0 -> cuda:1 and back until the deadline or the stop file; log progress."""
    p = argparse.ArgumentParser(prog="chaos_hw.py _mover")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--until-wall", type=float, required=True)
    p.add_argument("--stop-file", type=Path, required=True)
    p.add_argument("--gib", type=float, default=1.0)
    a = p.parse_args(argv)
    import torch

    if torch.cuda.device_count() < 2:
        _append(a.out, {"event": "error", "error": f"need 2 CUDA devices, found {torch.cuda.device_count()}"})
        return 2
    devices = []
    for i in (0, 1):
        props = torch.cuda.get_device_properties(i)
        uuid = getattr(props, "uuid", None)
        devices.append(
            {
                "cuda": i,
                "name": props.name,
                "uuid": f"GPU-{uuid}" if uuid is not None else None,
                "pci_bus_id": getattr(props, "pci_bus_id", None),
            }
        )
    size = int(a.gib * (1 << 30))
    src = torch.empty(size, dtype=torch.uint8, device="cuda:0")
    src.fill_(0x5A)
    dst = torch.empty(size, dtype=torch.uint8, device="cuda:1")

    def sync() -> None:
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)

    dst.copy_(src)  # warm-up: enables peer access, not counted
    src.copy_(dst)
    sync()
    _append(
        a.out,
        {
            "event": "start",
            "wall": time.time(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "devices": devices,
            "bytes_per_copy": size,
            "peer_access_0_1": bool(torch.cuda.can_device_access_peer(0, 1)),
            "peer_access_1_0": bool(torch.cuda.can_device_access_peer(1, 0)),
            "env": {k: os.environ.get(k) for k in (*MULTICAST_OFF, "CUDA_DEVICE_ORDER")},
        },
    )
    b01 = b10 = copies = 0
    start = last_log = time.time()
    _append(a.out, {"event": "progress", "wall": start, "b01": 0, "b10": 0})
    while time.time() < a.until_wall and not a.stop_file.exists():
        dst.copy_(src)
        sync()
        b01 += size
        src.copy_(dst)
        sync()
        b10 += size
        copies += 2
        now = time.time()
        if now - last_log >= 0.5:
            _append(a.out, {"event": "progress", "wall": now, "b01": b01, "b10": b10})
            last_log = now
    now = time.time()
    _append(a.out, {"event": "progress", "wall": now, "b01": b01, "b10": b10})
    _append(
        a.out,
        {
            "event": "end",
            "wall": now,
            "b01": b01,
            "b10": b10,
            "copies": copies,
            "gbytes_per_s_each_way": round(b01 / max(1e-9, now - start) / 1e9, 1),
        },
    )
    return 0


# --------------------------------------------------------------------------------------------------
# the run (foreground, or ``_run`` mode detached)


def _parse(text: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    rec: dict[str, Any] = {"tx": {}, "rx": {}, "restarts": {}, "crashes": {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            lab = s.labels
            if s.name == "nvgpu_nvlink_transmit_bytes_total":
                rec["tx"][f"{lab['gpu']}|{lab['uuid']}|{lab['link']}"] = s.value
            elif s.name == "nvgpu_nvlink_receive_bytes_total":
                rec["rx"][f"{lab['gpu']}|{lab['uuid']}|{lab['link']}"] = s.value
            elif s.name == "nvgpu_worker_restarts_total":
                rec["restarts"][lab["reason"]] = s.value
            elif s.name == "nvgpu_worker_crashes_total":
                rec["crashes"][f"{lab['feature']}/{lab['function']}"] = s.value
            elif s.name == "nvgpu_feature_enabled" and lab.get("feature") == "nvlink_throughput":
                rec["nvlink_throughput"] = {"enabled": s.value, "reason": lab.get("reason")}
            elif s.name == "nvgpu_last_sample_timestamp_seconds":
                rec["sample_ts"] = s.value
            elif s.name == "nvgpu_up":
                rec["up"] = s.value
            elif s.name == "nvgpu_worker_start_time_seconds":
                rec["worker_start"] = s.value
            elif s.name == "nvgpu_gpu_info":
                rec.setdefault("gpus", {})[lab["gpu"]] = {
                    k: lab.get(k)
                    for k in ("uuid", "name", "pci_bus_id", "driver_version", "nvml_version", "cuda_driver_version")
                }
            elif s.name == "nvgpu_build_info":
                rec["build"] = dict(lab)
            elif s.name == "nvgpu_nvlink_up" and s.value == 1.0:
                rec.setdefault("links_up", {}).setdefault(lab["gpu"], 0)
                rec["links_up"][lab["gpu"]] += 1
    return rec


class Killer(threading.Thread):
    """SIGSEGV the live worker every ``every`` seconds (the first after ``every``)."""

    def __init__(self, sup_pid: int, t0: float, every: float, last_at: float, log: Path) -> None:
        super().__init__(name="killer", daemon=True)
        self.watch = _chaos().WorkerWatch(sup_pid)
        self.t0, self.every, self.last_at, self.log = t0, every, last_at, log
        self.stop = threading.Event()

    def run(self) -> None:
        at = self.t0
        while True:
            at += self.every
            if at > self.last_at or self.stop.wait(max(0.0, at - time.monotonic())):
                return
            victim = None
            give_up = time.monotonic() + 10.0  # during a restart backoff: wait for the next worker
            while victim is None and time.monotonic() < give_up and not self.stop.is_set():
                live = self.watch.live()
                if live:
                    victim = max(live, key=lambda p: p.create_time())
                else:
                    self.stop.wait(0.1)
            rec: dict[str, Any] = {"t": round(time.monotonic() - self.t0, 2), "wall": time.time(), "signal": "SIGSEGV"}
            if victim is None:
                rec["result"] = "no worker"
            else:
                rec["pid"] = victim.pid
                try:
                    victim.send_signal(signal.SIGSEGV)
                    rec["result"] = "sent"
                except Exception as exc:  # noqa: BLE001 - psutil.NoSuchProcess and friends
                    rec["result"] = f"failed: {exc!r}"
            _append(self.log, rec)


def run(cfg: Mapping[str, Any], state: Path) -> dict[str, Any]:
    """One hardware chaos run; every record goes to ``state``; returns (and writes) the summary."""
    chaos = _chaos()
    os.environ.update(MULTICAST_OFF)
    (state / "runner.pid").write_text(str(os.getpid()))
    duration = float(cfg["duration"])
    progress = {
        "phase": "starting",
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "duration_s": duration,
    }
    _write_json(state / "progress.json", progress)
    env = chaos.exporter_env(
        {
            "NVGPU_NVML_BACKEND": cfg["backend"],
            "NVGPU_FEATURE_NVLINK_THROUGHPUT": "on",
            "NVGPU_SAMPLE_INTERVAL_SECONDS": str(cfg["interval"]),
            "NVGPU_STATE_FILE": str(state / "state.json"),
            "NVGPU_QUARANTINE_AFTER": "1000",
            "NVGPU_RESTART_BACKOFF_MAX_SECONDS": "5",
            **MULTICAST_OFF,
        }
    )
    exp = chaos.ExporterProcess(state, env)
    mover: subprocess.Popen[bytes] | None = None
    killer: Killer | None = None
    stop_file = state / "mover.stop"
    scrapes_path, kills_path, mover_path = state / "scrapes.jsonl", state / "kills.jsonl", state / "mover.jsonl"
    exit_code: int | None = None
    try:
        exp.wait_ready(timeout=120)
        t0 = time.monotonic()
        t0_wall = time.time()
        end = t0 + duration
        if cfg["torch"]:
            mover_env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", **MULTICAST_OFF)
            with open(state / "mover.log", "wb") as log:
                mover = subprocess.Popen(
                    [
                        sys.executable,
                        str(Path(__file__).resolve()),
                        "_mover",
                        "--out",
                        str(mover_path),
                        "--until-wall",
                        repr(t0_wall + duration),
                        "--stop-file",
                        str(stop_file),
                        "--gib",
                        str(cfg["gib"]),
                    ],
                    env=mover_env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=str(state),
                )
        killer = Killer(exp.pid, t0, float(cfg["kill_every"]), end - 10.0, kills_path)
        killer.start()
        progress.update(phase="running", exporter_pid=exp.pid, t0_wall=t0_wall)
        n = failed = 0
        next_at = t0
        while time.monotonic() < end:
            rec = _scrape(exp, t0)
            n += 1
            failed += rec["status"] != 200
            _append(scrapes_path, rec)
            kills = len(_read_jsonl(kills_path))
            progress.update(
                elapsed_s=round(time.monotonic() - t0, 1),
                scrapes=n,
                failed_scrapes=failed,
                kills=kills,
                restarts=rec.get("restarts"),
                mover_running=mover is not None and mover.poll() is None,
            )
            _write_json(state / "progress.json", progress)
            next_at += float(cfg["scrape_every"])
            time.sleep(max(0.0, next_at - time.monotonic()))
        progress.update(phase="stopping")
        _write_json(state / "progress.json", progress)
        killer.stop.set()
        killer.join(15)
        stop_file.touch()
        if mover is not None:
            try:
                mover.wait(60)
            except subprocess.TimeoutExpired:
                mover.kill()
                mover.wait()
        time.sleep(2.5 * float(cfg["interval"]))  # one more sample after the last copy
        final = _scrape(exp, t0)
        final["final"] = True
        _append(scrapes_path, final)
    finally:
        if killer is not None:
            killer.stop.set()
        if mover is not None and mover.poll() is None:
            mover.kill()
            mover.wait()
        exit_code, stop_s = exp.stop()
        _write_json(state / "exporter_exit.json", {"exit_code": exit_code, "stop_s": round(stop_s, 2)})
    summary = analyze(state)
    _write_json(state / "summary.json", summary)
    progress.update(phase="done", ok=summary["ok"])
    _write_json(state / "progress.json", progress)
    return summary


def _scrape(exp: Any, t0: float) -> dict[str, Any]:
    start = time.monotonic()
    rec: dict[str, Any] = {"t": round(start - t0, 2), "wall": time.time()}
    try:
        status, body = exp.get("/metrics", timeout=5.0)
    except OSError as exc:
        rec.update(status=-1, error=repr(exc), latency_s=round(time.monotonic() - start, 4))
        return rec
    rec.update(status=status, latency_s=round(time.monotonic() - start, 4))
    if status == 200:
        try:
            rec.update(_parse(body.decode()))
        except ValueError as exc:
            rec["parse_error"] = repr(exc)
    return rec


# --------------------------------------------------------------------------------------------------
# analysis (also what --collect prints)


def _interp(progress: list[dict[str, Any]], wall: float, key: str) -> float | None:
    """Cumulative mover bytes at ``wall``, interpolated between progress records."""
    if not progress or wall < progress[0]["wall"] or wall > progress[-1]["wall"]:
        return None
    for a, b in zip(progress, progress[1:], strict=False):
        if a["wall"] <= wall <= b["wall"]:
            span = b["wall"] - a["wall"]
            return float(a[key] + ((b[key] - a[key]) * (wall - a["wall"]) / span if span > 0 else 0.0))
    return float(progress[-1][key])


def analyze(state: Path) -> dict[str, Any]:
    """Checks over the run's records in ``state``."""
    cfg = json.loads((state / "config.json").read_text())
    scrapes = _read_jsonl(state / "scrapes.jsonl")
    kills = _read_jsonl(state / "kills.jsonl")
    mover = _read_jsonl(state / "mover.jsonl")
    exit_path = state / "exporter_exit.json"
    exit_info = json.loads(exit_path.read_text()) if exit_path.exists() else {}
    ok_scrapes = [s for s in scrapes if s["status"] == 200 and "parse_error" not in s]
    failed = [{k: s.get(k) for k in ("t", "status", "error", "parse_error")} for s in scrapes if s not in ok_scrapes]

    # restarts between scrapes: a boundary is a scrape whose restart total is above the previous one's
    def restarts_total(s: Mapping[str, Any]) -> float:
        return float(sum(s.get("restarts", {}).values()))

    # monotonic: each series, consecutive present values, never lower
    decreases: list[dict[str, Any]] = []
    across_restart_pairs = 0
    restart_boundaries_covered: set[float] = set()
    series_seen: set[str] = set()
    for direction in ("tx", "rx"):
        last: dict[str, tuple[float, float, float]] = {}  # key -> (value, t, restarts total)
        for s in ok_scrapes:
            total = restarts_total(s)
            for key, value in s[direction].items():
                series_seen.add(f"{direction}|{key}")
                if key in last:
                    prev, prev_t, prev_total = last[key]
                    if value < prev:
                        decreases.append(
                            {
                                "series": f"{direction}|{key}",
                                "t_before": prev_t,
                                "before": prev,
                                "t_after": s["t"],
                                "after": value,
                                "restarts_between": total - prev_total,
                            }
                        )
                    if total > prev_total:
                        across_restart_pairs += 1
                        restart_boundaries_covered.add(total)
                last[key] = (value, s["t"], total)

    first_rest = restarts_total(ok_scrapes[0]) if ok_scrapes else 0.0
    last_rec = ok_scrapes[-1] if ok_scrapes else {}
    restarts_by_reason = {
        k: v - (ok_scrapes[0].get("restarts", {}).get(k, 0.0) if ok_scrapes else 0.0)
        for k, v in last_rec.get("restarts", {}).items()
    }
    restarts_counted = restarts_total(last_rec) - first_rest if ok_scrapes else 0.0
    kills_sent = sum(1 for k in kills if k.get("result") == "sent")

    nvlink_state = last_rec.get("nvlink_throughput", {})
    with_counters = [s for s in ok_scrapes if s["tx"] or s["rx"]]
    mover_check = _mover_ratio(mover, with_counters, cfg)

    checks = {
        "no_scrape_failed": {"ok": not failed and bool(scrapes), "value": f"{len(failed)} of {len(scrapes)} failed"},
        "counters_monotonic": {
            "ok": not decreases and bool(series_seen),
            "value": f"{len(decreases)} decreases over {len(series_seen)} series; "
            f"{len(restart_boundaries_covered)} restarts crossed by counter pairs "
            f"({across_restart_pairs} series-pairs)",
        },
        "restarts_equal_kills": {
            "ok": restarts_counted == kills_sent and kills_sent > 0,
            "value": f"restarts {restarts_counted:.0f} {restarts_by_reason}, kills sent {kills_sent}",
        },
        "nvlink_throughput_enabled": {
            "ok": nvlink_state.get("enabled") == 1.0,
            "value": nvlink_state or "no nvgpu_feature_enabled for nvlink_throughput",
        },
        "counters_match_mover": mover_check["check"],
    }
    first_info = next((s for s in ok_scrapes if s.get("gpus")), {})
    return {
        "benchmark": "chaos_hw",
        "state_dir": str(state),
        "config": cfg,
        "machine": _chaos().machine(),
        "versions": {**_chaos().versions(), "build_info": first_info.get("build")},
        "gpus": first_info.get("gpus"),
        "nvlink_links_up": first_info.get("links_up"),
        "scrapes": {
            "attempted": len(scrapes),
            "ok": len(ok_scrapes),
            "failed": failed[:20],
            "with_nvlink_counters": len(with_counters),
            "max_latency_s": max((s.get("latency_s", 0.0) for s in scrapes), default=None),
        },
        "kills": {"sent": kills_sent, "log": kills},
        "restarts": {
            "counted": restarts_counted,
            "by_reason": restarts_by_reason,
            "crashes_by_feature_function": last_rec.get("crashes", {}),
        },
        "monotonic": {
            "series": len(series_seen),
            "decreases": decreases[:50],
            "restarts_crossed": len(restart_boundaries_covered),
            "series_pairs_across_restarts": across_restart_pairs,
        },
        "mover": mover_check["detail"],
        "exporter": exit_info,
        "checks": checks,
        "ok": all(c["ok"] for c in checks.values() if c["ok"] is not None),
    }


def _mover_ratio(
    mover: list[dict[str, Any]], with_counters: list[dict[str, Any]], cfg: Mapping[str, Any]
) -> dict[str, Any]:
    if not cfg.get("torch"):
        return {"check": {"ok": None, "value": "skipped (--no-torch)"}, "detail": None}
    start = next((m for m in mover if m.get("event") == "start"), None)
    end = next((m for m in mover if m.get("event") == "end"), None)
    errors = [m for m in mover if m.get("event") == "error"]
    progress = [m for m in mover if m.get("event") == "progress"]
    if start is None or len(progress) < 2:
        return {
            "check": {"ok": False, "value": f"mover did not run: {errors or 'no progress records'}"},
            "detail": {"errors": errors},
        }
    # CUDA device -> NVML GPU index, by UUID (fallback: PCI order = NVML order)
    nvml_by_uuid = {}
    for s in with_counters:
        for key in s["tx"]:
            gpu, uuid, _ = key.split("|")
            nvml_by_uuid[uuid] = gpu
    cuda_to_gpu = {}
    for d in start["devices"]:
        cuda_to_gpu[d["cuda"]] = nvml_by_uuid.get(d.get("uuid") or "", str(d["cuda"]))
    lo_wall, hi_wall = progress[0]["wall"], progress[-1]["wall"]
    window = [s for s in with_counters if s.get("sample_ts") and lo_wall <= s["sample_ts"] <= hi_wall]
    if len(window) < 2:
        return {
            "check": {"ok": False, "value": "fewer than 2 counter samples while the mover ran"},
            "detail": {"start": start, "end": end},
        }
    a, b = window[0], window[-1]

    def delta(direction: str, gpu: str) -> float:
        total = 0.0
        for key, value in b[direction].items():
            if key.split("|")[0] == gpu and key in a[direction]:
                total += value - a[direction][key]
        return total

    moved01 = (_interp(progress, b["sample_ts"], "b01") or 0.0) - (_interp(progress, a["sample_ts"], "b01") or 0.0)
    moved10 = (_interp(progress, b["sample_ts"], "b10") or 0.0) - (_interp(progress, a["sample_ts"], "b10") or 0.0)
    g0, g1 = cuda_to_gpu.get(0, "0"), cuda_to_gpu.get(1, "1")
    d = {
        "tx_gpu_src_0to1": delta("tx", g0),
        "rx_gpu_dst_0to1": delta("rx", g1),
        "tx_gpu_src_1to0": delta("tx", g1),
        "rx_gpu_dst_1to0": delta("rx", g0),
    }
    ratios = {
        f"gpu{g0}_tx / bytes 0->1": d["tx_gpu_src_0to1"] / moved01 if moved01 else None,
        f"gpu{g1}_rx / bytes 0->1": d["rx_gpu_dst_0to1"] / moved01 if moved01 else None,
        f"gpu{g1}_tx / bytes 1->0": d["tx_gpu_src_1to0"] / moved10 if moved10 else None,
        f"gpu{g0}_rx / bytes 1->0": d["rx_gpu_dst_1to0"] / moved10 if moved10 else None,
    }
    total_moved = moved01 + moved10
    overall = (d["tx_gpu_src_0to1"] + d["tx_gpu_src_1to0"]) / total_moved if total_moved else None
    ok = all(r is not None and RATIO_RANGE[0] <= r <= RATIO_RANGE[1] for r in ratios.values())
    detail = {
        "window_s": round(b["sample_ts"] - a["sample_ts"], 1),
        "bytes_moved_0to1": moved01,
        "bytes_moved_1to0": moved10,
        "counter_deltas_bytes": d,
        "ratios": {k: (round(v, 4) if v is not None else None) for k, v in ratios.items()},
        "overall_tx_ratio": round(overall, 4) if overall is not None else None,
        "cuda_to_nvml_gpu": cuda_to_gpu,
        "start": start,
        "end": end,
    }
    value = ", ".join(f"{k} = {v:.3f}" if v is not None else f"{k} = n/a" for k, v in ratios.items())
    return {"check": {"ok": ok, "value": f"{value} (goal {RATIO_RANGE[0]}..{RATIO_RANGE[1]})"}, "detail": detail}


def human(summary: Mapping[str, Any]) -> str:
    s = summary
    lines = [
        f"chaos_hw {s['config'].get('started_at', '')}: {s['config']['duration']:.0f} s, "
        f"backend {s['config']['backend']}, "
        f"kill every {s['config']['kill_every']} s, state {s['state_dir']}",
        f"GPUs {s.get('gpus')}; NVLink links up {s.get('nvlink_links_up')}",
        f"scrapes {s['scrapes']['attempted']} ({s['scrapes']['ok']} ok, {len(s['scrapes']['failed'])} failed, "
        f"{s['scrapes']['with_nvlink_counters']} with NVLink counters), max latency {s['scrapes']['max_latency_s']} s",
        f"kills sent {s['kills']['sent']}; restarts counted {s['restarts']['counted']:.0f} "
        f"{s['restarts']['by_reason']}; "
        f"crashes {s['restarts']['crashes_by_feature_function']}",
        f"monotonic: {s['monotonic']['series']} series, {len(s['monotonic']['decreases'])} decreases, "
        f"{s['monotonic']['restarts_crossed']} restarts crossed",
    ]
    if s.get("mover"):
        m = s["mover"]
        lines.append(
            f"mover: {m.get('bytes_moved_0to1', 0) / 2**30:.0f} GiB 0->1, "
            f"{m.get('bytes_moved_1to0', 0) / 2**30:.0f} GiB 1->0 "
            f"in {m.get('window_s')} s; ratios {m.get('ratios')}; overall {m.get('overall_tx_ratio')}"
        )
    lines.append(f"exporter exit {s['exporter']}")
    for name, c in s["checks"].items():
        verdict = "skipped" if c["ok"] is None else ("ok" if c["ok"] else "FAILED")
        lines.append(f"check {name}: {verdict} ({c['value']})")
    lines.append("RESULT: " + ("all checks passed" if s["ok"] else "CHECK FAILED"))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# command line


def _emit(summary: Mapping[str, Any], out: Path | None) -> int:
    text = json.dumps(summary, indent=2)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    else:
        print(text)
    print(human(summary), file=sys.stderr)
    return 0 if summary["ok"] else 1


def collect(state: Path, wait: float, out: Path | None) -> int:
    """Wait (at most ``wait`` s) for a background run to finish; print its summary."""
    deadline = time.monotonic() + wait
    last_note = 0.0
    while True:
        if (state / "summary.json").exists():
            return _emit(json.loads((state / "summary.json").read_text()), out)
        pid_file = state / "runner.pid"
        alive = False
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), 0)
                alive = True
            except (OSError, ValueError):
                alive = False
        if not alive and not (state / "summary.json").exists():
            time.sleep(1.0)  # it may have finished between the two looks
            if (state / "summary.json").exists():
                continue
            tail = (state / "runner.log").read_text(errors="replace")[-3000:] if (state / "runner.log").exists() else ""
            print(f"the run in {state} is not running and left no summary; runner.log tail:\n{tail}", file=sys.stderr)
            return 2
        now = time.monotonic()
        if now - last_note >= 30:
            try:
                prog = json.dumps(json.loads((state / "progress.json").read_text()))
            except (OSError, ValueError):
                prog = "{}"
            print(f"[collect] waiting; progress: {prog}", file=sys.stderr, flush=True)
            last_note = now
        if now >= deadline:
            print(
                f"[collect] not done after {wait:.0f} s; run `{Path(sys.argv[0]).name} --collect {state}` again",
                file=sys.stderr,
            )
            return EXIT_NOT_DONE
        time.sleep(2.0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_mover"]:
        return mover_main(argv[1:])
    if argv[:1] == ["_run"]:
        state = Path(argv[argv.index("--state-dir") + 1])
        run(json.loads((state / "config.json").read_text()), state)
        return 0
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The module docstring and docs/reliability.md show the split 10-minute run.",
    )
    p.add_argument("--duration", type=float, default=600.0, help="seconds of movement, kills and scrapes (default 600)")
    p.add_argument("--out", type=Path, help="write the JSON summary here (default: stdout)")
    p.add_argument("--backend", default="nvml", help="'nvml' (default) or fake:<scenario.json> for a dry run")
    p.add_argument("--no-torch", dest="torch", action="store_false", help="no data mover (no GPU / no PyTorch)")
    p.add_argument("--kill-every", type=float, default=30.0, help="seconds between SIGSEGVs (default 30)")
    p.add_argument("--scrape-every", type=float, default=1.0)
    p.add_argument("--interval", type=float, default=1.0, help="NVGPU_SAMPLE_INTERVAL_SECONDS (default 1)")
    p.add_argument("--gib", type=float, default=1.0, help="tensor size the mover copies (default 1 GiB)")
    p.add_argument("--state-dir", type=Path, help="where the run keeps its records (default: a new temp dir)")
    p.add_argument("--background", action="store_true", help="start detached (setsid) and return at once")
    p.add_argument(
        "--collect", type=Path, metavar="STATE_DIR", help="wait for a background run, then print its summary"
    )
    p.add_argument("--wait", type=float, default=570.0, help="with --collect: give up after this many seconds (exit 3)")
    a = p.parse_args(argv)
    if a.collect:
        return collect(a.collect, a.wait, a.out)
    state = a.state_dir or Path(tempfile.mkdtemp(prefix="nvgpu-chaos-hw-"))
    state.mkdir(parents=True, exist_ok=True)
    if (state / "config.json").exists():
        p.error(f"{state} already holds a run; pick a new --state-dir")
    backend = a.backend
    if backend.startswith("fake:"):
        backend = "fake:" + str(Path(backend[5:]).resolve())
    cfg = {
        "duration": a.duration,
        "backend": backend,
        "torch": a.torch,
        "kill_every": a.kill_every,
        "scrape_every": a.scrape_every,
        "interval": a.interval,
        "gib": a.gib,
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/chaos_hw.py", *argv]),
    }
    _write_json(state / "config.json", cfg)
    if a.background:
        with open(state / "runner.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "_run", "--state-dir", str(state)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(ROOT),
                start_new_session=True,
                env=dict(os.environ, **MULTICAST_OFF),
            )
        print(
            f"started run {proc.pid} in {state} (detached); collect with:\n"
            f"  python bench/chaos_hw.py --collect {state} [--out FILE]"
        )
        return 0
    return _emit(run(cfg, state), a.out)


if __name__ == "__main__":
    sys.exit(main())
