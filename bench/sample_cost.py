"""Issue 30: CPU per sample of the supervisor and of the worker, and their memory, at equal cadence.

Starts ``python -m exporter`` on the fake scenario (default ``examples/scenarios/h200x8.json``: 8
H200s, 18 NVLinks each) with ``NVGPU_STATE_FILE=""`` and a sample interval of 1 s (then 5 s), waits
for ``/readyz`` 200 and a settling time, then measures ``--windows`` windows of ``--seconds`` each.
Per window and per process (supervisor = the exporter's PID, worker = its ``exporter.worker``
child):

* CPU seconds (``psutil`` user + system of the process, all its threads) over the window, divided
  by the samples the worker made in it. The samples are counted from the exporter's own
  ``nvgpu_last_sample_timestamp_seconds``, read by one ``/metrics`` GET at each end of the window
  (the worker samples on a fixed schedule, so the difference divided by the interval is the number
  of samples; the two GETs are part of what is measured, like a scrape every ``--seconds``);
* CPU as a fraction of one core (CPU seconds per wall second);
* RSS, USS and PSS at the end of the window (``memory_full_info``);
* machine-wide CPU used by other processes meanwhile (the machine is shared: CPU *time* of our two
  processes is what is compared, not wall time; a window where others kept the cores busy can still
  inflate CPU time through cache and frequency effects, so the summary gives the minimum and the
  median of the windows).

``--profile-seconds S`` adds, after the measured windows, one window of ``S`` seconds during which
``py-spy record --gil --function --format raw`` samples both processes (``--idle`` off). ``--gil``
keeps only samples of the thread holding the GIL: on this VM py-spy's own idle detection counted
threads blocked in epoll, ``queue.get`` and ``read`` as active (85 % of the supervisor's samples in
uvloop's run loop), while waiting releases the GIL and Python work holds it. The raw stacks are
aggregated here into phases (:data:`PHASES`) and the top functions by self and inclusive samples,
with percentages of all samples kept. py-spy must be on PATH (``pip install py-spy``: a benchmark
tool, not a dependency); without it the profile is skipped and says so.

Writes ``--out`` (default ``bench/results/sample-cost-<date>.json``) with the machine, versions,
every window and the summary; ``--markdown`` prints a table for docs/performance.md.

Run from the repository root: ``python bench/sample_cost.py`` (the defaults: 5 windows of 60 s at
1 s, then 5 of 120 s at 5 s, about 16 minutes; ``--seconds 60,120`` sets the window per interval).
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import load  # noqa: E402

import bench  # noqa: E402  (bench/bench.py: machine_info, start_exporter, role)

ROOT = Path(__file__).resolve().parent.parent
LAST_SAMPLE = "nvgpu_last_sample_timestamp_seconds"


def _procs(exp: load.ServerProcess) -> dict[str, psutil.Process]:
    """``{"supervisor": …, "worker": …}`` (the worker only once it is running)."""
    root = psutil.Process(exp.pid)
    out = {"supervisor": root}
    for child in root.children(recursive=True):
        if bench.role(child, exp.pid) == "worker":
            out["worker"] = child
    return out


def _cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def _cpu_us(p: psutil.Process) -> tuple[float, float]:
    t = p.cpu_times()
    return float(t.user), float(t.system)


def _mem(p: psutil.Process) -> dict[str, float]:
    full = p.memory_full_info()
    return {
        "rss_mb": round(full.rss / 1e6, 2),
        "uss_mb": round(full.uss / 1e6, 2),
        "pss_mb": round(getattr(full, "pss", 0) / 1e6, 2),
    }


def _machine_busy_s() -> float:
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0))


def last_sample_ts(exp: load.ServerProcess) -> float:
    """The exporter's ``nvgpu_last_sample_timestamp_seconds`` (raises when absent)."""
    status, body = exp.get("/metrics")
    m = re.search(rb"^" + re.escape(LAST_SAMPLE.encode()) + rb" (\S+)$", body, re.M)
    if status != 200 or m is None:
        raise RuntimeError(f"/metrics answered {status} without {LAST_SAMPLE}")
    return float(m.group(1))


def window(exp: load.ServerProcess, seconds: float, interval_s: float) -> dict[str, Any]:
    """One measured window (see the module docstring)."""
    procs = _procs(exp)
    if "worker" not in procs:
        raise RuntimeError("no worker process")
    me = psutil.Process()
    ts0 = last_sample_ts(exp)
    cpu0 = {r: _cpu_us(p) for r, p in procs.items()}
    busy0, me0, wall0 = _machine_busy_s(), _cpu_s(me), time.monotonic()
    time.sleep(seconds)
    cpu1 = {r: _cpu_us(p) for r, p in procs.items()}
    busy1, me1, wall1 = _machine_busy_s(), _cpu_s(me), time.monotonic()
    ts1 = last_sample_ts(exp)
    samples = round((ts1 - ts0) / interval_s)
    wall = wall1 - wall0
    out: dict[str, Any] = {"wall_s": round(wall, 3), "samples": samples, "processes": {}}
    ours = 0.0
    for r, p in procs.items():
        user, system = cpu1[r][0] - cpu0[r][0], cpu1[r][1] - cpu0[r][1]
        cpu = user + system
        ours += cpu
        out["processes"][r] = {
            "pid": p.pid,
            "cpu_s": round(cpu, 4),
            "cpu_user_s": round(user, 4),
            "cpu_system_s": round(system, 4),
            "cpu_ms_per_sample": round(1000 * cpu / samples, 3) if samples else None,
            "cpu_fraction": round(cpu / wall, 5),
            **_mem(p),
        }
    out["other_cpu_cores"] = round(max(0.0, (busy1 - busy0) - ours - (me1 - me0)) / wall, 3)
    return out


def summarize(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Min and median over the windows, per process and for both together."""
    out: dict[str, Any] = {}
    for r in ("supervisor", "worker"):
        rows = [w["processes"][r] for w in windows]
        out[r] = {
            key: {
                "min": min(row[key] for row in rows),
                "median": round(statistics.median(row[key] for row in rows), 5),
            }
            for key in ("cpu_ms_per_sample", "cpu_fraction", "rss_mb", "uss_mb", "pss_mb")
        }
    both = [w["processes"]["supervisor"]["cpu_s"] + w["processes"]["worker"]["cpu_s"] for w in windows]
    per = [1000 * c / w["samples"] for c, w in zip(both, windows, strict=True)]
    out["both_cpu_ms_per_sample"] = {"min": round(min(per), 3), "median": round(statistics.median(per), 3)}
    out["other_cpu_cores"] = {
        "min": min(w["other_cpu_cores"] for w in windows),
        "median": statistics.median(w["other_cpu_cores"] for w in windows),
        "max": max(w["other_cpu_cores"] for w in windows),
    }
    return out


# -- py-spy --------------------------------------------------------------------------------------


def pyspy_record(
    pids: dict[str, int], seconds: float, rate: int, outdir: Path, nonblocking: bool = False, gil: bool = True
) -> dict[str, Any]:
    """Run one ``py-spy record`` per process at once; returns ``{role: raw file or error}``."""
    exe = shutil.which("py-spy")
    if exe is None:
        return {"skipped": "py-spy not on PATH (pip install py-spy)"}
    runs = {}
    for r, pid in pids.items():
        raw = outdir / f"{r}.txt"
        cmd = [exe, "record", "--pid", str(pid), "--rate", str(rate), "--duration", str(int(seconds))]
        cmd += ["--nonblocking"] if nonblocking else []
        cmd += ["--gil"] if gil else []
        cmd += ["--function", "--format", "raw", "--output", str(raw)]
        runs[r] = (raw, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    out: dict[str, Any] = {}
    for r, (raw, proc) in runs.items():
        text, _ = proc.communicate(timeout=seconds + 60)
        if proc.returncode != 0 or not raw.exists():
            out[r] = {"error": text.decode("utf-8", "replace")[-2000:]}
        else:
            out[r] = {"raw": str(raw)}
    return out


_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*)\)$")


def _short(frame: str) -> str:
    """``func (path)`` with the path cut to what follows site-packages / the repository root."""
    m = _FRAME.match(frame)
    if not m:
        return frame
    path = m.group("file")
    for marker in ("site-packages/", f"{ROOT}/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{m.group('func')} ({path})"


# Where a stack's time goes: the first rule (in this order) one of whose substrings is in one of
# the stack's frames names the phase. Ordered from the innermost layer out, so that, e.g., the
# fake NVML's time is not counted as the collector's that called it.
PHASES: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "supervisor": [
        ("decode: JSON text (protocol.decode, json.loads)", ("decode (exporter/common/protocol.py",)),
        (
            "decode: typed (snapshot.decode_message)",
            (
                "decode_message (exporter/common/snapshotdecode.py",
                "exporter/common/snapshotdecode.py",
                "exporter/common/decode.py",
                "proto_decode.py",
            ),
        ),
        (
            "render: encode (text lines)",
            (
                "_encode (exporter/supervisor/exposition.py",
                "exporter/supervisor/textformat.py",
                "encode_direct (",
                "encode_samples (",
                "encode_text (",
                "_body (",
            ),
        ),
        (
            "render: per-GPU families (collectors, health, Xids, extensions)",
            (
                "gpu_families (exporter/",
                "families (exporter/common/collectors/",
                "GpuHealth.families",
                "XidLedger.families",
            ),
        ),
        (
            "render: self-metrics (selfmetrics, process_* via psutil)",
            ("families (exporter/supervisor/selfmetrics.py", "exporter/supervisor/procmetrics.py"),
        ),
        (
            "render: the rest (extensions' self families, render errors, assembly)",
            ("render (exporter/supervisor/exposition.py", "CachedRenderer", "Renderer._render"),
        ),
        ("apply the snapshot (served state, GPU health, extensions)", ("Supervisor.handle",)),
        (
            "HTTP (aiohttp, the edge)",
            ("aiohttp/", "metrics (exporter/supervisor/http/web.py", "edge_middleware", "exporter/supervisor/http/"),
        ),
        ("the worker's process (wait, deadline, stderr)", ("exporter/supervisor/workerproc.py",)),
        ("probes, kernel log, pods (background loops)", ("Prober.loop", "KernelXid.run", "PodAttribution.run")),
    ],
    "worker": [
        ("fake NVML (the scenario backend)", ("exporter/worker/fakenvml/", "exporter/common/scenarios/")),
        ("JSON encode and write (Channel.send)", ("Channel.send",)),
        ("snapshot to wire (to_wire, collectors.to_json)", ("Snapshot.to_wire",)),
        (
            "NVML client (breadcrumbs, counting, error handling, structs)",
            (
                "exporter/worker/nvml/",
                "exporter/common/breadcrumb.py",
                "exporter/common/nvml/errors.py",
            ),
        ),
        ("collectors' read()", ("exporter/common/collectors/",)),
        ("event thread", ("nvml_events.py",)),
        ("sampler and GPU slots (threads, merging, feature states)", ("sampler.py", "gpuslot.py")),
    ],
}


def _phase(frames: list[str], phases: list[tuple[str, tuple[str, ...]]], leaf: bool) -> str:
    if leaf:
        for f in reversed(frames):
            for label, needles in phases:
                if any(needle in f for needle in needles):
                    return label
        return "other"
    for label, needles in phases:
        if any(needle in f for f in frames for needle in needles):
            return label
    return "other"


def aggregate(
    raw_path: Path, top: int = 25, phases: list[tuple[str, tuple[str, ...]]] | None = None, leaf: bool = False
) -> dict[str, Any]:
    """Top functions of a py-spy raw (collapsed) profile by self and by inclusive samples, and the
    samples per phase (:data:`PHASES`): a stack goes to the first rule that one of its frames
    matches, or with ``leaf`` to the rule matched by the frame nearest the leaf (the layer whose
    own code was running, e.g. aiohttp's response writer called from our handler counts as aiohttp)."""
    self_n: collections.Counter[str] = collections.Counter()
    incl_n: collections.Counter[str] = collections.Counter()
    phase_n: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw_path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_short(f) for f in stack.split(";")]
        if frames and frames[0].startswith(("process ", "thread ")):
            frames = frames[1:]
        if not frames:
            continue
        total += n
        self_n[frames[-1]] += n
        for f in set(frames):
            incl_n[f] += n
        phase_n[_phase(frames, phases or [], leaf)] += n

    def rows(c: collections.Counter[str]) -> list[dict[str, Any]]:
        return [{"function": f, "samples": n, "percent": round(100 * n / total, 1)} for f, n in c.most_common(top)]

    return {
        "samples": total,
        "phases": rows(phase_n) if phases else [],
        "self": rows(self_n),
        "inclusive": rows(incl_n),
    }


# -- one interval --------------------------------------------------------------------------------


def run_interval(
    args: argparse.Namespace, interval_s: float, seconds: float, scenario: Path, tmp: Path
) -> dict[str, Any]:
    env = {
        "NVGPU_NVML_BACKEND": f"fake:{scenario}",
        "NVGPU_STATE_FILE": "",
        "NVGPU_SAMPLE_INTERVAL_SECONDS": f"{interval_s:g}",
    }
    log_path = tmp / f"exporter-{interval_s:g}s.log"
    if args.launcher:  # the environment bench.start_exporter gives, another entry point
        port = load.free_port()
        full = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
        full.update(env, NVGPU_LISTEN_ADDRESS=f"127.0.0.1:{port}")
        full["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), full.get("PYTHONPATH", "")) if p)
        cmd = [sys.executable, str((ROOT / args.launcher).resolve())]
        exp = load.ServerProcess(cmd, full, port, str(log_path), str(ROOT))
        exp.env = {k: v for k, v in full.items() if k.startswith(("NVGPU_", "BENCH_"))}  # type: ignore[attr-defined]
    else:
        exp = bench.start_exporter(env, load.free_port(), log_path)
    res: dict[str, Any] = {
        "interval_s": interval_s,
        "window_s": seconds,
        "env": exp.env,  # type: ignore[attr-defined]
        "launcher": args.launcher or "python -m exporter",
    }
    try:
        res["ready_after_s"] = round(exp.wait_status("/readyz", 60.0), 3)
        time.sleep(args.settle)
        windows = []
        for i in range(args.windows):
            w = window(exp, seconds, interval_s)
            sup, wrk = w["processes"]["supervisor"], w["processes"]["worker"]
            print(
                f"  {interval_s:g} s interval, window {i + 1}/{args.windows}: {w['samples']} samples; "
                f"supervisor {sup['cpu_ms_per_sample']} ms/sample ({100 * sup['cpu_fraction']:.2f} %), "
                f"worker {wrk['cpu_ms_per_sample']} ms/sample ({100 * wrk['cpu_fraction']:.2f} %); "
                f"others {w['other_cpu_cores']} cores",
                flush=True,
            )
            windows.append(w)
        res["windows"] = windows
        res["summary"] = summarize(windows)
        res["sample_duration_seconds"] = bench.metric(exp, "nvgpu_sample_duration_seconds")
        if args.profile_seconds > 0:
            pids = {r: p.pid for r, p in _procs(exp).items()}
            pdir = tmp / f"pyspy-{interval_s:g}s"
            pdir.mkdir(exist_ok=True)
            print(f"  py-spy, {args.profile_seconds:g} s at {args.profile_rate} Hz …", flush=True)
            rec = pyspy_record(pids, args.profile_seconds, args.profile_rate, pdir, args.nonblocking, args.gil)
            prof: dict[str, Any] = {
                "seconds": args.profile_seconds,
                "rate_hz": args.profile_rate,
                "nonblocking": args.nonblocking,
                "gil_only": args.gil,
            }
            for r, v in rec.items():
                if not (isinstance(v, dict) and "raw" in v):
                    prof[r] = v
                    continue
                prof[r] = aggregate(Path(v["raw"]), args.top, PHASES.get(r))
                if args.keep_raw:
                    dest = Path(args.keep_raw) / f"pyspy-{r}-{interval_s:g}s.txt"
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(v["raw"], dest)
            res["profile"] = prof
    finally:
        res["exit_code"] = exp.stop()
    return res


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| interval | process | CPU ms per sample (min / median) | % of a core (min / median) "
        "| RSS / USS / PSS MB (median) |",
        "|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        s = run["summary"]
        for r in ("supervisor", "worker"):
            x = s[r]
            lines.append(
                f"| {run['interval_s']:g} s | {r} | {x['cpu_ms_per_sample']['min']:.2f} / "
                f"{x['cpu_ms_per_sample']['median']:.2f} | {100 * x['cpu_fraction']['min']:.2f} / "
                f"{100 * x['cpu_fraction']['median']:.2f} | {x['rss_mb']['median']:.1f} / "
                f"{x['uss_mb']['median']:.1f} / {x['pss_mb']['median']:.1f} |"
            )
        b = s["both_cpu_ms_per_sample"]
        o = s["other_cpu_cores"]
        lines.append(
            f"| {run['interval_s']:g} s | both | {b['min']:.2f} / {b['median']:.2f} | | "
            f"(others on the machine: {o['min']}-{o['max']} cores) |"
        )
    return "\n".join(lines)


def combine(paths: list[str]) -> dict[str, Any]:
    """Several result files as one: every window of each interval together, summarized again."""
    runs: dict[float, dict[str, Any]] = {}
    for path in paths:
        for run in json.loads(Path(path).read_text())["runs"]:
            have = runs.setdefault(run["interval_s"], {"interval_s": run["interval_s"], "windows": []})
            have["windows"] += run["windows"]
    for run in runs.values():
        run["summary"] = summarize(run["windows"])
    return {"files": paths, "runs": [runs[k] for k in sorted(runs)]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Issue 30: CPU per sample of supervisor and worker")
    p.add_argument("--scenario", default="examples/scenarios/h200x8.json")
    p.add_argument("--intervals", default="1,5", help="comma-separated sample intervals, seconds")
    p.add_argument("--seconds", default="60,120", help="length of each measured window, per interval (comma-separated)")
    p.add_argument("--windows", type=int, default=5, help="measured windows per interval")
    p.add_argument("--settle", type=float, default=8.0, help="seconds after ready before the first window")
    p.add_argument("--profile-seconds", type=float, default=0.0, help="py-spy window after the measured ones")
    p.add_argument("--profile-rate", type=int, default=1000, help="py-spy samples per second")
    p.add_argument(
        "--nonblocking", action="store_true", help="py-spy without pausing the processes (stacks can be torn)"
    )
    p.add_argument(
        "--no-gil",
        dest="gil",
        action="store_false",
        help="py-spy samples every thread py-spy thinks active, not only the one holding the GIL",
    )
    p.add_argument("--top", type=int, default=25, help="functions kept per profile table")
    p.add_argument("--keep-raw", help="directory to copy py-spy's raw stacks to")
    p.add_argument(
        "--launcher", help="start this script instead of python -m exporter (e.g. bench/patched_exporter.py)"
    )
    p.add_argument("--out", help="result JSON (default bench/results/sample-cost-<date>.json)")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--combine", nargs="+", metavar="JSON", help="print one table for these result files and exit")
    args = p.parse_args(argv)
    if args.combine:
        print(markdown(combine(args.combine)))
        return 0

    scenario = (ROOT / args.scenario).resolve()
    started = dt.datetime.now(dt.timezone.utc)
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"sample-cost-{started:%Y-%m-%d}.json"
    tmp = Path(tempfile.mkdtemp(prefix="nvgpu-sample-cost-"))
    result: dict[str, Any] = {
        "benchmark": "issue-30 sample cost",
        "date": started.isoformat(timespec="seconds"),
        "machine": bench.machine_info(),
        "note": (
            "CPU time (user+system) per sample of each process, min and median over windows; the machine is "
            "shared with other sessions (other_cpu_cores), so wall time is not used"
        ),
        "config": {
            "scenario": str(scenario.relative_to(ROOT)),
            "window_seconds": args.seconds,
            "windows": args.windows,
            "settle_s": args.settle,
            "launcher": args.launcher or "python -m exporter",
            "prototypes": os.environ.get("BENCH_PROTOTYPES", "a,b") if args.launcher else None,
        },
        "runs": [],
    }
    try:
        intervals = [float(x) for x in args.intervals.split(",")]
        seconds = [float(x) for x in args.seconds.split(",")]
        for i, interval in enumerate(intervals):
            length = seconds[min(i, len(seconds) - 1)]
            print(f"interval {interval:g} s, windows of {length:g} s (log in {tmp})", flush=True)
            result["runs"].append(run_interval(args, interval, length, scenario, tmp))
    except (RuntimeError, OSError, psutil.Error) as exc:
        print(f"sample_cost.py: {exc}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    md = markdown(result)
    result["markdown"] = md
    out.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        print(md)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
