"""The local benchmark: our exporter on the 8-GPU fake scenario, measured against the goals.

Starts ``python -m exporter`` (supervisor + NVML worker) with
``NVGPU_NVML_BACKEND=fake:examples/scenarios/h200x8.json``, ``NVGPU_STATE_FILE=""``, a 5 s sample
interval and a free loopback port; waits for ``/readyz`` 200; then measures, in this order:

1. idle: CPU of supervisor and worker over 60 s with no scrapes, and their RSS;
2. sequential ``/metrics`` latency, 1000 requests on one keep-alive connection (plus 200 with
   Prometheus 3's headers and gzip, for information);
3. 1000 concurrent connections (aiohttp client, ``TCPConnector(limit=0, force_close=True)``, no
   compression), 3 rounds, with supervisor/worker CPU and RSS sampled meanwhile; then, for
   information only, one round with Prometheus 3's headers (gzip) and one with a bare asyncio
   client (to separate the load generator's CPU from the exporter's on a 2-core machine);
4. with Debian's ``wrk`` installed (``apt-get install -y wrk``; skipped otherwise, never needed by
   CI), two rounds of 1000 connections for 10 s from one wrk thread: keep-alive (each connection
   requests back to back) and ``Connection: close`` (one request per connection, then a new one).
   wrk costs a fraction of the aiohttp client's CPU per request, so these rounds measure the
   exporter at saturation: requests per second, its CPU per request, and from the close round how
   long 1000 one-shot scrapes take the exporter alone. The aiohttp rounds above are client-bound on
   2 cores (the client runs at about one core); the wrk rounds are not (see ``client_cpu_s``);
5. RSS again after the load has settled; the exporter's own ``nvgpu_sample_duration_seconds``.

Every window also records machine-wide CPU: the client's and that of unrelated processes
(``other_cpu_fraction``); a run disturbed by other processes is flagged. ``--wait-quiet 600``
waits for an idle machine first.

Writes ``bench/results/local-<date>.json`` (``--out`` to change) with the machine (nproc, CPU
model, memory, kernel), versions and every number, and prints PASS/MISS for each goal:

* all 1000 concurrent scrapes answered 200 with p99 < 1 s (every round);
* sequential p50 < 2 ms;
* supervisor + worker RSS < 120 MB (the peak over the whole run: idle and under load);
* worker CPU < 2 % of one core at a 5 s interval with 8 GPUs (idle window).

Run from the repository root: ``python bench/bench.py`` (about 1.5 minutes; ``--idle-seconds`` and
``--rounds`` shorten it). Exit status 0 when every goal passes, 1 otherwise, 2 on a setup failure.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import load  # noqa: E402  (bench/load.py, beside this file)

ROOT = Path(__file__).resolve().parent.parent
GOALS = {
    "concurrent_p99_ms": 1000.0,
    "sequential_p50_ms": 2.0,
    "rss_total_mb": 120.0,
    "worker_cpu_fraction": 0.02,
}


def role(proc: psutil.Process, root_pid: int) -> str:
    """``supervisor`` (the exporter's PID), ``worker`` (``python -m exporter.worker``), or ``child``."""
    if proc.pid == root_pid:
        return "supervisor"
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        cmd = ""
    return "worker" if "exporter.worker" in cmd else "child"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info() -> dict[str, Any]:
    """nproc, CPU model, memory, kernel, Python and library versions, git commit."""
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    sys.path.insert(0, str(ROOT))
    try:
        from exporter import __version__ as exporter_version
    except Exception:  # noqa: BLE001 - informational
        exporter_version = None
    status = _git("status", "--porcelain", "--untracked-files=no", "--", "exporter", "guards")
    return {
        "hostname": platform.node(),
        "nproc": affinity,
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "mem_total_bytes": psutil.virtual_memory().total,
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "versions": {
            "nvgpu-exporter": exporter_version,
            "aiohttp": _version("aiohttp"),
            "prometheus-client": _version("prometheus-client"),
            "psutil": _version("psutil"),
            "nvidia-ml-py": _version("nvidia-ml-py"),
            "uvloop": _version("uvloop"),
        },
        "git_commit": _git("rev-parse", "HEAD"),
        "git_exporter_dirty": bool(status) if status is not None else None,
    }


def hide_uvloop() -> str:
    """A directory whose ``uvloop`` cannot be imported: on PYTHONPATH, the exporter runs on asyncio's loop."""
    d = tempfile.mkdtemp(prefix="no-uvloop-")
    os.mkdir(os.path.join(d, "uvloop"))
    with open(os.path.join(d, "uvloop", "__init__.py"), "w") as fh:
        fh.write('raise ImportError("uvloop hidden by bench.py --no-uvloop")\n')
    return d


def start_exporter(
    env: dict[str, str], port: int, log_path: Path, cwd: Path = ROOT, no_uvloop: bool = False
) -> load.ServerProcess:
    """``python -m exporter`` on 127.0.0.1:``port`` with ``env`` (NVGPU_* from outside dropped)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    full.update(env)
    full["NVGPU_LISTEN_ADDRESS"] = f"127.0.0.1:{port}"
    paths = [hide_uvloop()] if no_uvloop else []
    full["PYTHONPATH"] = os.pathsep.join(p for p in (*paths, str(cwd), full.get("PYTHONPATH", "")) if p)
    server = load.ServerProcess([sys.executable, "-m", "exporter"], full, port, str(log_path), str(cwd))
    server.env = {k: v for k, v in full.items() if k.startswith("NVGPU_")}  # type: ignore[attr-defined]
    return server


def metric(server: load.ServerProcess, name: str) -> float | None:
    """One unlabelled sample from ``/metrics`` (text format)."""
    _, body = server.get("/metrics")
    m = re.search(rb"^" + re.escape(name.encode()) + rb" (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


def _fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} ms"


async def measure(exp: load.ServerProcess, args: argparse.Namespace) -> dict[str, Any]:
    url = exp.base + "/metrics"
    res: dict[str, Any] = {}
    # Let the first sample land and the start-up settle before the idle window.
    await asyncio.sleep(args.settle_seconds)
    print(f"idle window {args.idle_seconds:g} s …", flush=True)
    res["idle"] = await asyncio.to_thread(load.idle, exp.pid, args.idle_seconds, role)
    print("sequential …", flush=True)
    seq, seq_procs = await load.under_load(exp.pid, load.sequential(url, args.sequential, timeout_s=args.timeout), role)
    seq["processes"] = seq_procs
    res["sequential"] = seq
    res["sequential_prometheus_gzip"] = await load.sequential(
        url, 200, load.PROMETHEUS3_HEADERS, timeout_s=args.timeout
    )
    rounds = []
    for i in range(args.rounds):
        print(f"concurrent {args.concurrency}, round {i + 1}/{args.rounds} …", flush=True)
        r, procs = await load.under_load(
            exp.pid, load.concurrent_procs(url, args.concurrency, args.client_procs, timeout_s=args.timeout), role
        )
        r["processes"] = procs
        rounds.append(r)
        await asyncio.sleep(2.0)
    res["concurrent"] = rounds
    if args.gzip_round:
        # For information: what a Prometheus 3 server sends (OpenMetrics preferred, gzip).
        print(f"concurrent {args.concurrency}, Prometheus 3 headers + gzip (information) …", flush=True)
        r, procs = await load.under_load(
            exp.pid, load.concurrent(url, args.concurrency, load.PROMETHEUS3_HEADERS, timeout_s=args.timeout), role
        )
        r["processes"] = procs
        res["concurrent_prometheus_gzip"] = r
        await asyncio.sleep(2.0)
    if args.raw_round:
        # Diagnostic, not a goal: the same load from a bare asyncio client, a few times cheaper per
        # request than aiohttp's, to tell the load generator's CPU from the exporter's.
        print(f"concurrent {args.concurrency}, raw client (diagnostic) …", flush=True)
        r, procs = await load.under_load(
            exp.pid, load.concurrent(url, args.concurrency, timeout_s=args.timeout, client="raw"), role
        )
        r["processes"] = procs
        res["concurrent_raw_client"] = r
        await asyncio.sleep(2.0)
    if args.wrk and load.wrk_available():
        res["wrk"] = {}
        for mode, close in (("keep_alive", False), ("close", True)):
            print(f"wrk {args.concurrency} connections, {mode}, {args.wrk_seconds:g} s …", flush=True)
            r, procs = await load.under_load(
                exp.pid,
                load.wrk(url, args.concurrency, args.wrk_seconds, threads=1, close=close, timeout_s=args.timeout),
                role,
            )
            r["processes"] = procs
            if r.get("requests"):
                r["exporter_cpu_ms_per_request"] = round(1000 * procs["cpu_s"] / r["requests"], 4)
                # time for 1000 one-shot scrapes, the exporter alone, at the rate it served here
                r["seconds_per_1000_requests"] = round(1000 / r["requests_per_s"], 3)
            res["wrk"][mode] = r
            await asyncio.sleep(2.0)
    elif args.wrk:
        res["wrk"] = {"skipped": "wrk is not installed (apt-get install -y wrk)"}
    await asyncio.sleep(3.0)
    after = load.ProcTreeSampler(exp.pid, 0.5, role).start()
    await asyncio.sleep(2.0)
    res["after_load"] = after.stop()
    res["sample_duration_seconds"] = metric(exp, "nvgpu_sample_duration_seconds")
    return res


def evaluate(res: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per goal: name, value, goal, PASS/MISS."""
    rows = []
    rounds = res["concurrent"]
    worst_p99 = max((r["latency"]["p99_ms"] or float("inf")) for r in rounds) if rounds else None
    all_ok = bool(rounds) and all(r["ok"] == r["requests"] for r in rounds)
    rows.append(
        {
            "goal": f"{rounds[0]['requests'] if rounds else '?'} concurrent: all 200 and p99 < 1 s (every round)",
            "value": f"{sum(r['ok'] for r in rounds)}/{sum(r['requests'] for r in rounds)} OK, "
            f"worst p99 {_fmt_ms(worst_p99)}",
            "pass": all_ok and worst_p99 is not None and worst_p99 < GOALS["concurrent_p99_ms"],
        }
    )
    p50 = res["sequential"]["latency"]["p50_ms"]
    rows.append(
        {
            "goal": "sequential p50 < 2 ms",
            "value": _fmt_ms(p50),
            "pass": p50 is not None and p50 < GOALS["sequential_p50_ms"],
        }
    )
    peaks = [
        res["idle"]["rss_max_bytes"],
        res["sequential"]["processes"]["rss_max_bytes"],
        res["after_load"]["rss_max_bytes"],
        *(r["processes"]["rss_max_bytes"] for r in rounds),
    ]
    peak = max(peaks) / 1e6
    idle_rss = res["idle"]["rss_last_bytes"] / 1e6
    rows.append(
        {
            "goal": "supervisor + worker RSS < 120 MB (peak over the run)",
            "value": f"peak {peak:.1f} MB (idle {idle_rss:.1f} MB)",
            "pass": peak < GOALS["rss_total_mb"],
        }
    )
    worker = res["idle"]["by_role"].get("worker", {})
    wcpu = worker.get("cpu_fraction")
    rows.append(
        {
            "goal": "worker CPU < 2 % of a core (5 s interval, 8 GPUs, idle)",
            "value": "-" if wcpu is None else f"{wcpu * 100:.2f} %",
            "pass": wcpu is not None and wcpu < GOALS["worker_cpu_fraction"],
        }
    )
    return rows


def disturbance(res: dict[str, Any], limit: float = 0.1) -> str:
    """Windows in which processes other than the exporter and this client used > ``limit`` cores."""
    windows = [("idle", res["idle"]), ("sequential", res["sequential"]["processes"])]
    windows += [(f"round {i}", r["processes"]) for i, r in enumerate(res["concurrent"], 1)]
    out = []
    for name, w in windows:
        other = (w.get("system") or {}).get("other_cpu_fraction")
        if other is not None and other > limit:
            out.append(f"{name}: {other:.2f} cores")
    return ", ".join(out)


def print_summary(res: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    idle = res["idle"]["by_role"]
    print()
    print("role         idle CPU   idle RSS")
    for name in ("supervisor", "worker"):
        r = idle.get(name, {})
        print(f"{name:<12} {r.get('cpu_fraction', 0) * 100:6.2f} %  {load.mb(r.get('rss_last_bytes'))} MB")
    s = res["sequential"]["latency"]
    print(
        f"sequential {res['sequential']['requests']}: p50 {_fmt_ms(s['p50_ms'])}, p99 {_fmt_ms(s['p99_ms'])}, "
        f"max {_fmt_ms(s['max_ms'])}"
    )
    rounds = [(f"round {i}", r) for i, r in enumerate(res["concurrent"], 1)]
    if res.get("concurrent_prometheus_gzip"):
        rounds.append(("Prometheus+gzip", res["concurrent_prometheus_gzip"]))
    if res.get("concurrent_raw_client"):
        rounds.append(("raw client", res["concurrent_raw_client"]))
    for name, r in rounds:
        lat = r["latency"]
        procs = r["processes"]
        sup = procs["by_role"].get("supervisor", {})
        system = procs.get("system", {})
        print(
            f"concurrent {r['requests']} {name}: ok {r['ok']}, non-200 {r['non_200']}, timeouts {r['timeouts']}, "
            f"errors {sum(r['errors'].values())}; p50 {_fmt_ms(lat['p50_ms'])}, p99 {_fmt_ms(lat['p99_ms'])}, "
            f"max {_fmt_ms(lat['max_ms'])}; wall {r['wall_s']:.2f} s; CPU s: supervisor {sup.get('cpu_s', 0):.2f}, "
            f"client {system.get('client_cpu_fraction', 0) * procs['window_s']:.2f}, "
            f"irq/softirq {system.get('irq_softirq_cpu_fraction', 0) * procs['window_s']:.2f}, "
            f"other processes {system.get('other_cpu_fraction', 0) * procs['window_s']:.2f}"
        )
    for mode, r in (res.get("wrk") or {}).items():
        if not isinstance(r, dict) or not r.get("requests"):
            print(f"wrk {mode}: {r}")
            continue
        lat = r["latency"]
        print(
            f"wrk {r['connections']} connections {mode}: {r['requests']} requests ({r['ok']} ok, non-2xx "
            f"{r['non_2xx']}, socket errors {sum(v for k, v in r['errors'].items() if k != 'status')}), "
            f"{r['requests_per_s']} req/s; p50 {_fmt_ms(lat['p50_ms'])}, p99 {_fmt_ms(lat['p99_ms'])}; CPU s: "
            f"exporter {r['processes']['cpu_s']:.2f} ({r['exporter_cpu_ms_per_request']} ms per request), "
            f"wrk {r['client_cpu_s']:.2f}; 1000 requests take the exporter {r['seconds_per_1000_requests']} s"
        )
    disturbed = disturbance(res)
    if disturbed:
        print(f"WARNING: other processes used CPU during the measurement ({disturbed}); the machine is shared")
    print()
    for row in rows:
        print(f"{'PASS' if row['pass'] else 'MISS'}  {row['goal']}: {row['value']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="local benchmark on the 8-GPU fake scenario")
    p.add_argument(
        "--scenario", default="examples/scenarios/h200x8.json", help="fake scenario (relative to the repo root)"
    )
    p.add_argument("--interval", type=float, default=5.0, help="sample interval, seconds")
    p.add_argument("--idle-seconds", type=float, default=60.0, help="idle CPU window")
    p.add_argument("--settle-seconds", type=float, default=3.0, help="wait after ready before the idle window")
    p.add_argument("--sequential", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout, seconds")
    p.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="client processes for the goal rounds (1: one aiohttp client process, as recorded)",
    )
    p.add_argument(
        "--no-gzip-round",
        dest="gzip_round",
        action="store_false",
        help="skip the informational concurrent round with Prometheus 3's headers and gzip",
    )
    p.add_argument(
        "--no-raw-round",
        dest="raw_round",
        action="store_false",
        help="skip the diagnostic concurrent round with the bare asyncio client",
    )
    p.add_argument(
        "--no-wrk", dest="wrk", action="store_false", help="skip the wrk rounds (run only when wrk is installed)"
    )
    p.add_argument("--wrk-seconds", type=float, default=10.0, help="length of each wrk round")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to SECONDS for the machine to be idle (shared machines)",
    )
    p.add_argument(
        "--no-uvloop", action="store_true", help="run the exporter on asyncio's own loop even where uvloop is installed"
    )
    p.add_argument("--out", help="result JSON (default bench/results/local-<date>.json)")
    args = p.parse_args(argv)

    nofile = load.raise_nofile(args.concurrency * 2 + 512)  # the exporter inherits it
    quiet = load.wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else None
    if quiet is not None:
        print(
            f"machine {'quiet' if quiet['quiet'] else 'still busy'}: {quiet['busy_cores']} cores busy "
            f"after {quiet['waited_s']} s",
            flush=True,
        )
    scenario = (ROOT / args.scenario).resolve()
    if not scenario.is_file():
        print(f"bench.py: scenario {scenario} not found", file=sys.stderr)
        return 2
    started = dt.datetime.now(dt.timezone.utc)
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"local-{started:%Y-%m-%d}.json"
    log_path = Path(tempfile.mkdtemp(prefix="nvgpu-bench-")) / "exporter.log"
    env = {
        "NVGPU_NVML_BACKEND": f"fake:{scenario}",
        "NVGPU_STATE_FILE": "",
        "NVGPU_SAMPLE_INTERVAL_SECONDS": f"{args.interval:g}",
    }
    exp = start_exporter(env, load.free_port(), log_path, no_uvloop=args.no_uvloop)
    print(f"exporter pid {exp.pid} on {exp.base} (log {log_path})", flush=True)
    result: dict[str, Any] = {
        "benchmark": "local",
        "date": started.isoformat(timespec="seconds"),
        "machine": machine_info(),
        "nofile": nofile,
        "wait_quiet": quiet,
        "config": {
            "scenario": str(scenario.relative_to(ROOT)),
            "interval_s": args.interval,
            "idle_seconds": args.idle_seconds,
            "sequential": args.sequential,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "timeout_s": args.timeout,
            "client_procs": args.client_procs,
            "event_loop": ("asyncio" if args.no_uvloop or not _version("uvloop") else f"uvloop {_version('uvloop')}"),
            "env": exp.env,
        },
        "goals": GOALS,
    }
    try:
        result["ready_after_s"] = round(exp.wait_status("/readyz", 60.0), 3)
        result["results"] = asyncio.run(measure(exp, args))
    except (RuntimeError, OSError) as exc:
        print(f"bench.py: {exc}", file=sys.stderr)
        exp.stop()
        return 2
    finally:
        if exp.proc.poll() is None and "results" not in result:
            exp.stop()
    result["exit_code"] = exp.stop()
    rows = evaluate(result["results"])
    result["verdict"] = rows
    result["disturbed_by_other_processes"] = disturbance(result["results"]) or None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print_summary(result["results"], rows)
    print(f"\nexporter exit code {result['exit_code']}; wrote {out}")
    return 0 if all(r["pass"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
