"""Issues 8 and 17's side-by-side: nvitop-exporter and our exporter on the same GPUs, plus the raw NVML floor.

In one run, one after the other (never both at once), on 127.0.0.1:

1. **floor**: ``bench/floor.py`` in a subprocess: a plain pynvml loop making our worker's default
   NVML calls, the per-call NVLink counters in every ``30 s / --our-interval``-th sample as our
   worker reads them (the same counters at the same cadence); median and mean time per sample;
2. **ours**: ``python -m exporter`` with ``NVGPU_NVML_BACKEND=nvml`` (``--our-backend`` to change),
   ``NVGPU_STATE_FILE=""``, sampling every ``--our-interval`` (1 s: nvitop-exporter's default, so
   both sample as often; our own default is 5 s), with pod attribution loaded as on Kubernetes (a
   fake kubelet socket that maps no gRPC library, ``bench/kubelet.py``; ``--no-pods`` without),
   default settings otherwise; ready when ``/readyz`` is 200 (and, with pods, once
   ``nvgpu_pod_attribution_up`` is 1);
3. **nvitop-exporter**: ``python -m nvitop_exporter --bind-address 127.0.0.1 --port P`` with this
   same Python and environment (so ``PYTHONPATH=/tmp/site`` carrying the wheels reaches it), its
   default settings otherwise (1 s interval); ready when ``/metrics`` is 200.

For each exporter: CPU (fraction of one core) and RSS of all its processes over an idle window
(60 s; ``--idle-seconds``, ``--quick`` = 20 s), sequential ``/metrics`` latency (200 requests, one
keep-alive connection), 100 and 1000 concurrent connections (one request each, own connection,
60 s timeout: success rate, p50, p99, max) with CPU and RSS sampled meanwhile, and RSS after the
load. For ours also ``nvgpu_sample_duration_seconds`` read from ``/metrics`` once a second after
the idle window until ``--our-samples`` distinct samples were seen (median), and the per-feature
durations, compared with the floor.

With ``--gpu-load`` the whole run happens under GPU load: ``bench/gpuload.py`` (a bf16
matmul loop on every GPU and, with two peer GPUs, a cuda:0 -> cuda:1 copy that keeps NVLink busy)
starts first and stops last; what it did is in the JSON under ``gpu_load``. The "idle" window is
then the window without scrapes.

An exporter that cannot start (nvitop-exporter without NVML exits 1 silently; a missing wheel) is
reported in the JSON with its log tail and the run continues. The JSON (``--out``) is rewritten
after every phase, so a run cut short still leaves what it measured.

Goals, printed as PASS/MISS/N/A: ours answers all 1000 concurrent with p99 <
250 ms; our sequential p50 at least 20 times lower than nvitop-exporter's; our time per sample
within 20 % of the floor; and issue 30's: our idle CPU (all processes) at most nvitop-exporter's
when both sample every second (N/A at other intervals), our RSS and PSS (all processes, idle, pod
attribution loaded) at most 1.5 times its.

Device run (one H200; see docs/performance.md): ``bash bench/hw_eff.sh`` runs it with ``--gpu-load``
after the footprint, the wheels installed and compiled, ``exporter/`` byte-compiled; by hand::

    python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
    python3 -m compileall -q exporter
    PYTHONUNBUFFERED=1 python3 bench/peer.py --out $OUT/peer-h200x1.json

Dry run without a GPU (the floor and nvitop-exporter fail cleanly; ours runs on the fake)::

    python bench/peer.py --quick --our-backend fake:examples/scenarios/h200x2.json --out /tmp/peer-dry.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kubelet  # noqa: E402  (bench/kubelet.py)
import load  # noqa: E402  (bench/load.py)

ROOT = Path(__file__).resolve().parent.parent
FLOOR = ROOT / "bench" / "floor.py"
GOAL_CONCURRENT_P99_MS = 250.0
GOAL_SEQ_RATIO = 20.0  # sequential scrapes: at least 20x the peer's rate
GOAL_FLOOR_RATIO = 1.2
GOAL_RSS_RATIO = 1.5  # RSS and PSS (all processes, idle) at most 1.5 x nvitop-exporter's (issue 30)
GOAL_PSS_RATIO = 1.5
GOAL_CPU_RATIO = 1.0  # idle CPU at equal cadence (both every 1 s): at most nvitop-exporter's
GPU_LOAD = ROOT / "bench" / "gpuload.py"
SLOW_EVERY_S = 30.0  # the worker's per-call NVLink counters (exporter/common/collectors/nvlink.py SLOW_EVERY_S)


# -- environment -----------------------------------------------------------------------------------


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _run(cmd: list[str], timeout: float = 30.0) -> tuple[int | None, str]:
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, str(exc)
    return cp.returncode, (cp.stdout + cp.stderr).strip()


GPU_INFO_SNIPPET = r"""
import json, pynvml
out = {}
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as exc:
    print(json.dumps({"error": f"nvmlInit failed: {exc}"})); raise SystemExit(0)
def t(v): return v.decode() if isinstance(v, bytes) else str(v)
out["driver_version"] = t(pynvml.nvmlSystemGetDriverVersion())
out["nvml_version"] = t(pynvml.nvmlSystemGetNVMLVersion())
out["cuda_driver_version"] = pynvml.nvmlSystemGetCudaDriverVersion()
out["gpus"] = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    g = {"index": i, "name": t(pynvml.nvmlDeviceGetName(h)), "uuid": t(pynvml.nvmlDeviceGetUUID(h)),
         "pci_bus_id": t(pynvml.nvmlDeviceGetPciInfo(h).busId),
         "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total)}
    links = 0
    for link in range(36):
        try:
            pynvml.nvmlDeviceGetNvLinkState(h, link); links += 1
        except pynvml.NVMLError:
            break
    g["nvlink_links"] = links
    out["gpus"].append(g)
pynvml.nvmlShutdown()
print(json.dumps(out))
"""


def environment() -> dict[str, Any]:
    """Machine, GPUs (from a short-lived pynvml subprocess), driver, package versions."""
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    rc, text = _run([sys.executable, "-c", GPU_INFO_SNIPPET])
    try:
        gpu = json.loads(text.splitlines()[-1]) if text else {"error": f"no output (rc {rc})"}
    except ValueError:
        gpu = {"error": text[-2000:]}
    smi = shutil.which("nvidia-smi")
    topo = _run([smi, "topo", "-m"])[1][-4000:] if smi else None
    try:
        sys.path.insert(0, str(ROOT))
        from exporter import __version__ as ours
    except Exception:  # noqa: BLE001 - informational
        ours = None
    return {
        "hostname": platform.node(),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "mem_total_bytes": psutil.virtual_memory().total,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "versions": {
            "nvgpu-exporter": ours,
            "nvidia-ml-py": _version("nvidia-ml-py"),
            "nvitop": _version("nvitop"),
            "nvitop-exporter": _version("nvitop-exporter"),
            "prometheus-client": _version("prometheus-client"),
            "aiohttp": _version("aiohttp"),
            "psutil": _version("psutil"),
            "uvloop": _version("uvloop"),
        },
        "nvml": gpu,
        "nvidia_smi_topo": topo,
        "git_commit": _run(["git", "-C", str(ROOT), "rev-parse", "HEAD"])[1] or None,
    }


# -- the floor -------------------------------------------------------------------------------------


def run_floor(samples: int, spacing_s: float, fake: str | None, slow_every: int = 6) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(FLOOR),
        "--json",
        "--samples",
        str(samples),
        "--spacing",
        f"{spacing_s:g}",
        "--slow-every",
        str(slow_every),
    ]
    if fake:
        cmd += ["--fake", fake]
    t0 = time.monotonic()
    rc, text = _run(cmd, timeout=120)
    try:
        start = text.index("{")
        result = json.loads(text[start : text.rindex("}") + 1])
    except ValueError:
        result = {"error": f"floor.py exited {rc}: {text[-2000:]}"}
    result["exit_code"] = rc
    result["wall_s"] = round(time.monotonic() - t0, 2)
    return result


# -- GPU load ---------------------------------------------------------------------------


class GpuLoad:
    """``bench/gpuload.py`` in a subprocess for the whole run; ``start`` waits for its "ready"."""

    def __init__(self) -> None:
        self.stats_path = Path(tempfile.mkdtemp(prefix="peer-gpuload-")) / "stats.json"
        self.proc: subprocess.Popen[str] | None = None
        self.result: dict[str, Any] = {}

    def start(self, timeout_s: float = 180.0) -> dict[str, Any]:
        cmd = [sys.executable, str(GPU_LOAD), "--out", str(self.stats_path)]
        self.result = {"command": cmd}
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        while time.monotonic() - t0 < timeout_s:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.strip() == "ready":
                self.result["ready_after_s"] = round(time.monotonic() - t0, 1)
                threading.Thread(target=self._drain, daemon=True).start()
                return self.result
            if line.startswith("{"):
                self.result["error"] = line.strip()
                break
        self.stop()
        self.result.setdefault("error", f"no 'ready' from gpuload.py within {timeout_s:g} s")
        return self.result

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for _ in self.proc.stdout:
            pass

    def stop(self) -> dict[str, Any]:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None:
            self.result["exit_code"] = self.proc.returncode
        try:
            self.result["stats"] = json.loads(self.stats_path.read_text())
        except (OSError, ValueError):
            pass
        return self.result


# -- exporters -------------------------------------------------------------------------------------


def role_ours(proc: psutil.Process, root_pid: int) -> str:
    if proc.pid == root_pid:
        return "supervisor"
    try:
        return "worker" if "exporter.worker" in " ".join(proc.cmdline()) else "child"
    except psutil.Error:
        return "child"


class SamplePoller(threading.Thread):
    """Reads our ``/metrics`` once a second; keeps one record per distinct sample timestamp."""

    def __init__(self, server: load.ServerProcess, period_s: float = 1.0) -> None:
        super().__init__(name="sample-poller", daemon=True)
        self.server = server
        self.period_s = period_s
        self.samples: dict[float, dict[str, Any]] = {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                status, body = self.server.get("/metrics", timeout=10.0)
                if status == 200:
                    self._parse(body.decode("utf-8", "replace"))
            except OSError:
                pass
            self.stop_event.wait(self.period_s)

    def _parse(self, text: str) -> None:
        ts = _metric(text, "nvgpu_last_sample_timestamp_seconds")
        dur = _metric(text, "nvgpu_sample_duration_seconds")
        if ts is None or dur is None or ts in self.samples:
            return
        features = {
            m.group(1): float(m.group(2))
            for m in re.finditer(r'^nvgpu_feature_duration_seconds\{feature="([^"]+)"\} (\S+)$', text, re.M)
        }
        self.samples[ts] = {
            "ts": ts,
            "duration_s": dur,
            "features": features,
            "nvml_calls_total": _metric(text, "nvgpu_nvml_calls_total"),
        }

    def summary(self) -> dict[str, Any]:
        recs = [self.samples[k] for k in sorted(self.samples)]
        if not recs:
            return {"count": 0}
        durs = [r["duration_s"] for r in recs]
        feats: dict[str, list[float]] = {}
        for r in recs:
            for k, v in r["features"].items():
                feats.setdefault(k, []).append(v)
        per_sample_calls = []
        for a, b in zip(recs, recs[1:], strict=False):  # between consecutive samples seen
            if a["nvml_calls_total"] is not None and b["nvml_calls_total"] is not None:
                per_sample_calls.append(b["nvml_calls_total"] - a["nvml_calls_total"])
        return {
            "count": len(recs),
            "median_s": round(statistics.median(durs), 6),
            "mean_s": round(statistics.fmean(durs), 6),
            "min_s": round(min(durs), 6),
            "max_s": round(max(durs), 6),
            "all_s": [round(d, 6) for d in durs],
            "feature_median_s": {k: round(statistics.median(v), 6) for k, v in feats.items()},
            "nvml_calls_between_seen_samples": per_sample_calls,
        }


def _metric(text: str, name: str) -> float | None:
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


async def measure(
    server: load.ServerProcess, args: argparse.Namespace, role: Any, poller: SamplePoller | None, checkpoint: Any
) -> dict[str, Any]:
    """Idle window, sequential, each concurrency, after-load RSS; ``checkpoint(res)`` after each."""
    url = server.base + "/metrics"
    res: dict[str, Any] = {}
    await asyncio.sleep(args.settle_seconds)
    print(f"  idle {args.idle_seconds:g} s …", flush=True)
    res["idle"] = await asyncio.to_thread(load.idle, server.pid, args.idle_seconds, role)
    checkpoint(res)
    if poller is not None:
        poller.start()
    print(f"  sequential {args.sequential} …", flush=True)
    seq, procs = await load.under_load(
        server.pid, load.sequential(url, args.sequential, args.headers, timeout_s=args.timeout), role
    )
    seq["processes"] = procs
    res["sequential"] = seq
    checkpoint(res)
    res["concurrent"] = {}
    for c in args.concurrency:
        if not server.alive():
            res["died"] = f"exited with code {server.proc.returncode} before the {c}-connection round"
            break
        print(f"  concurrent {c} …", flush=True)
        r, procs = await load.under_load(
            server.pid, load.concurrent_procs(url, c, args.client_procs, args.headers, args.timeout), role
        )
        r["processes"] = procs
        res["concurrent"][str(c)] = r
        lat = r["latency"]
        print(
            f"    ok {r['ok']}/{c}, timeouts {r['timeouts']}, p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms, "
            f"max {lat['max_ms']} ms, wall {r['wall_s']} s",
            flush=True,
        )
        checkpoint(res)
        await asyncio.sleep(2.0)
    if server.alive():
        await asyncio.sleep(3.0)
        res["after_load"] = await asyncio.to_thread(load.idle, server.pid, 2.0, role)
    if poller is not None:
        deadline = time.monotonic() + args.sample_wait_max
        while len(poller.samples) < args.our_samples and time.monotonic() < deadline and server.alive():
            await asyncio.sleep(0.5)
        poller.stop_event.set()
        res["sample_duration"] = poller.summary()
    res["alive_at_end"] = server.alive()
    return res


def _wait_pods(server: load.ServerProcess, timeout_s: float) -> bool:
    """Until ``nvgpu_pod_attribution_up`` is 1 (the client built, one ``List`` answered)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, body = server.get("/metrics")
        if status == 200 and re.search(rb"^nvgpu_pod_attribution_up 1", body, re.M):
            return True
        time.sleep(0.5)
    return False


def nvml_unavailable(status: int, body: bytes, waited: float) -> str | None:
    """Stop waiting for our /readyz once it has said "NVML unavailable" for 15 s (no driver)."""
    if status == 503 and b"NVML unavailable" in body and waited > 15.0:
        return f"/readyz still 503 after {waited:.0f} s: {body.decode('utf-8', 'replace').strip()}"
    return None


def run_exporter(
    name: str,
    cmd: list[str],
    env: dict[str, str],
    ready_path: str,
    args: argparse.Namespace,
    role: Any,
    poll: bool,
    checkpoint: Any,
    body_check: Any = None,
    give_up: Any = None,
    pods: bool = False,
) -> dict[str, Any]:
    port = load.free_port()
    log_path = Path(tempfile.mkdtemp(prefix=f"peer-{name}-")) / "server.log"
    cmd = [c.replace("{port}", str(port)) for c in cmd]
    env = {k: v.replace("{port}", str(port)) for k, v in env.items()}
    out: dict[str, Any] = {
        "command": cmd,
        "env": {k: v for k, v in env.items() if k.startswith("NVGPU_")},
        "port": port,
        "log": str(log_path),
    }
    print(f"{name}: {' '.join(cmd)}", flush=True)
    server = load.ServerProcess(cmd, env, port, str(log_path), str(ROOT))
    out["pid"] = server.pid
    try:
        out["ready_after_s"] = round(
            server.wait_status(ready_path, args.ready_timeout, body_check=body_check, give_up=give_up), 3
        )
        print(f"  ready after {out['ready_after_s']} s (pid {server.pid})", flush=True)
        if pods:
            out["pod_attribution_up"] = _wait_pods(server, 30.0)
            print(f"  pod attribution {'up' if out['pod_attribution_up'] else 'NOT up after 30 s'}", flush=True)

        def cp(res: dict[str, Any]) -> None:
            out["results"] = res
            checkpoint()

        poller = SamplePoller(server) if poll else None
        out["results"] = asyncio.run(measure(server, args, role, poller, cp))
    except RuntimeError as exc:
        out["error"] = str(exc)
        print(f"  {name} failed: {str(exc)[:600]}", flush=True)
    except Exception as exc:  # noqa: BLE001 - a bug in a phase must not lose the other exporter's run
        import traceback

        out["error"] = f"benchmark error: {exc!r}\n{traceback.format_exc()}"
        print(f"  {name}: benchmark error {exc!r}", flush=True)
    finally:
        out["exit_code"] = server.stop()
        out["log_tail"] = server.log_tail(4000)
        checkpoint()
    return out


# -- verdict and tables ----------------------------------------------------------------------------


def _get(d: Any, *path: Any) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def _peak_rss(res: dict[str, Any] | None) -> int | None:
    if not res:
        return None
    peaks = [
        _get(res, "idle", "rss_max_bytes"),
        _get(res, "sequential", "processes", "rss_max_bytes"),
        _get(res, "after_load", "rss_max_bytes"),
    ]
    peaks += [_get(r, "processes", "rss_max_bytes") for r in (res.get("concurrent") or {}).values()]
    vals = [p for p in peaks if p is not None]
    return max(vals) if vals else None


def _pss(res: dict[str, Any] | None) -> int | None:
    procs = _get(res, "idle", "processes") or []
    if not procs or any("pss_bytes" not in p for p in procs):
        return None
    return int(sum(p["pss_bytes"] for p in procs))


def verdict(report: dict[str, Any]) -> list[dict[str, Any]]:
    ours = _get(report, "ours", "results")
    peer = _get(report, "nvitop_exporter", "results")
    floor = report.get("floor") or {}
    rows = []

    c1000 = _get(ours, "concurrent", "1000")
    if c1000:
        p99 = c1000["latency"]["p99_ms"]
        ok = c1000["ok"] == c1000["requests"] and p99 is not None and p99 < GOAL_CONCURRENT_P99_MS
        rows.append(
            {
                "goal": "ours: 1000 concurrent all 200, p99 < 250 ms",
                "value": f"{c1000['ok']}/{c1000['requests']}, p99 {p99} ms",
                "status": "PASS" if ok else "MISS",
            }
        )
    else:
        rows.append({"goal": "ours: 1000 concurrent all 200, p99 < 250 ms", "value": "not measured", "status": "N/A"})

    a, b = _get(ours, "sequential", "latency", "p50_ms"), _get(peer, "sequential", "latency", "p50_ms")
    if a and b:
        rows.append(
            {
                "goal": f"sequential p50 >= {GOAL_SEQ_RATIO:g}x lower than nvitop-exporter's",
                "value": f"{a} ms vs {b} ms ({b / a:.1f}x)",
                "status": "PASS" if b / a >= GOAL_SEQ_RATIO else "MISS",
            }
        )
    else:
        rows.append(
            {
                "goal": f"sequential p50 >= {GOAL_SEQ_RATIO:g}x lower than nvitop-exporter's",
                "value": f"ours {a}, nvitop {b}",
                "status": "N/A",
            }
        )

    oi, pi = _get(ours, "idle", "rss_last_bytes"), _get(peer, "idle", "rss_last_bytes")
    op, pp = _peak_rss(ours), _peak_rss(peer)
    rss_goal = f"RSS (all processes, idle) at most {GOAL_RSS_RATIO:g}x nvitop-exporter's"
    if oi and pi:
        peak = f"; peak {load.mb(op)} vs {load.mb(pp)} MB ({op / pp:.2f}x)" if op and pp else ""
        rows.append(
            {
                "goal": rss_goal,
                "value": f"idle {load.mb(oi)} vs {load.mb(pi)} MB ({oi / pi:.2f}x){peak}",
                "status": "PASS" if oi <= GOAL_RSS_RATIO * pi else "MISS",
            }
        )
    else:
        rows.append(
            {"goal": rss_goal, "value": f"ours idle {load.mb(oi)} MB, nvitop idle {load.mb(pi)} MB", "status": "N/A"}
        )
    ops, pps = _pss(ours), _pss(peer)
    pss_goal = f"PSS (all processes, idle) at most {GOAL_PSS_RATIO:g}x nvitop-exporter's"
    if ops and pps:
        rows.append(
            {
                "goal": pss_goal,
                "value": f"{load.mb(ops)} vs {load.mb(pps)} MB ({ops / pps:.2f}x)",
                "status": "PASS" if ops <= GOAL_PSS_RATIO * pps else "MISS",
            }
        )
    else:
        rows.append({"goal": pss_goal, "value": f"ours {load.mb(ops)}, nvitop {load.mb(pps)}", "status": "N/A"})
    if report["config"].get("pod_attribution"):
        note = "; pod attribution " + ("loaded" if _get(report, "ours", "pod_attribution_up") else "NOT up")
        for row in rows[-2:]:
            row["value"] += note

    oc, pc = _get(ours, "idle", "cpu_fraction"), _get(peer, "idle", "cpu_fraction")
    cpu_goal = "idle CPU (all processes) at most nvitop-exporter's, both sampling every 1 s"
    ours_every = report["config"].get("our_interval_s")
    peer_every = report["config"].get("nvitop_interval_s")
    equal = ours_every == 1.0 and peer_every in (1.0, "default (1.0)")
    if oc is not None and pc and equal:
        rows.append(
            {
                "goal": cpu_goal,
                "value": f"{oc * 100:.2f} % vs {pc * 100:.2f} % of a core ({oc / pc:.2f}x)",
                "status": "PASS" if oc <= GOAL_CPU_RATIO * pc else "MISS",
            }
        )
    else:
        why = "" if equal else f" (ours every {ours_every} s, nvitop-exporter every {peer_every}: not equal cadence)"
        rows.append({"goal": cpu_goal, "value": f"ours {oc}, nvitop {pc}{why}", "status": "N/A"})

    ours_s = _get(ours, "sample_duration", "median_s")
    floor_s = _get(floor, "sample_s", "median")
    ours_mean, floor_mean = _get(ours, "sample_duration", "mean_s"), _get(floor, "sample_s", "mean")
    if ours_s and floor_s:
        ratio = ours_s / floor_s
        mean = (
            f"; mean {ours_mean * 1e3:.2f} vs {floor_mean * 1e3:.2f} ms ({ours_mean / floor_mean:.2f}x)"
            if ours_mean and floor_mean
            else ""
        )
        rows.append(
            {
                "goal": "time per sample within 20 % of the raw NVML floor",
                "value": f"median {ours_s * 1e3:.2f} ms vs floor {floor_s * 1e3:.2f} ms ({ratio:.2f}x){mean}",
                "status": "PASS" if ratio <= GOAL_FLOOR_RATIO else "MISS",
            }
        )
    else:
        rows.append(
            {
                "goal": "time per sample within 20 % of the raw NVML floor",
                "value": f"ours {ours_s}, floor {floor_s}",
                "status": "N/A",
            }
        )
    return rows


def _cell_conc(res: dict[str, Any] | None, c: str) -> str:
    r = _get(res, "concurrent", c)
    if not r:
        return "-"
    lat = r["latency"]
    return (
        f"{r['ok']}/{r['requests']} ok ({r['timeouts']} t/o); p50 {lat['p50_ms']}, p99 {lat['p99_ms']}, "
        f"max {lat['max_ms']} ms"
    )


def _load_line(gpu_load: dict[str, Any] | None) -> str:
    if not gpu_load:
        return "GPUs idle (no --gpu-load)."
    if gpu_load.get("error"):
        return f"GPU load requested but not running: {str(gpu_load['error'])[:300]}"
    st = gpu_load.get("stats") or {}
    gpus = ", ".join(f"GPU {k} {v.get('tflops')} TFLOP/s" for k, v in (st.get("gpus") or {}).items())
    copy = st.get("copy") or {}
    nvlink = f"; cuda:0 -> cuda:1 copy {copy.get('gb_per_s')} GB/s" if copy else "; no NVLink copy"
    return f"Under GPU load for the whole run (bench/gpuload.py: bf16 {st.get('size')}^2 matmul loop: {gpus}{nvlink})."


def markdown(report: dict[str, Any], concurrency: list[int]) -> str:
    """The results as Markdown tables (for docs/performance.md)."""
    env = report["environment"]
    nvml = env.get("nvml") or {}
    gpus = ", ".join(g["name"] for g in nvml.get("gpus", [])) or "?"
    v = env["versions"]
    lines = [
        f"Run {report['date']} on {env['hostname']} ({env['nproc']} CPUs, {env['cpu_model']}): {gpus}; "
        f"driver {nvml.get('driver_version', '?')}; nvidia-ml-py {v.get('nvidia-ml-py')}; "
        f"nvitop {v.get('nvitop')} / nvitop-exporter {v.get('nvitop-exporter')}; Python {env['python']}; "
        f"our backend `{report['config']['our_backend']}` on "
        f"{'uvloop ' + v['uvloop'] if v.get('uvloop') else 'the asyncio loop'}; load client: aiohttp in "
        f"{report['config']['client_procs']} process(es), one connection per request, "
        f"{'Prometheus 3 headers + gzip' if report['config']['headers'].get('Accept') else 'no compression'}.",
        _load_line(report.get("gpu_load")),
        "",
        "| | nvitop-exporter | nvgpu-exporter (ours) |",
        "|---|---|---|",
    ]
    ours = _get(report, "ours", "results")
    peer = _get(report, "nvitop_exporter", "results")

    def both(label: str, fn: Any) -> str:
        return f"| {label} | {fn(peer) if peer else '-'} | {fn(ours) if ours else '-'} |"

    def seq(res: Any) -> str:
        lat = _get(res, "sequential", "latency")
        return "-" if not lat else f"p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms"

    def idle_cpu(res: Any) -> str:
        i = _get(res, "idle")
        return "-" if not i else f"{i['cpu_fraction'] * 100:.2f} %"

    def idle_rss(res: Any) -> str:
        i = _get(res, "idle")
        return "-" if not i else f"{load.mb(i['rss_last_bytes'])} MB"

    def idle_pss(res: Any) -> str:
        procs = _get(res, "idle", "processes") or []
        if not procs or any("pss_bytes" not in p for p in procs):
            return "-"
        return f"{load.mb(sum(p['pss_bytes'] for p in procs))} MB"

    def load_cpu(res: Any) -> str:
        rounds = (res or {}).get("concurrent") or {}
        return " / ".join(f"{c}: {r['processes']['cpu_s']:.2f} s" for c, r in rounds.items()) or "-"

    def peak(res: Any) -> str:
        p = _peak_rss(res)
        return "-" if p is None else f"{load.mb(p)} MB"

    n_seq = report["config"]["sequential"]
    lines.append(both(f"sequential ({n_seq}, keep-alive)", seq))
    lines.append(both(f"idle CPU over {report['config']['idle_seconds']:g} s (1 core = 100 %)", idle_cpu))
    lines.append(both("idle RSS, all processes", idle_rss))
    lines.append(both("idle PSS, all processes (shared pages split)", idle_pss))
    for c in concurrency:
        lines.append(both(f"{c} concurrent", lambda r, c=c: _cell_conc(r, str(c))))
    lines.append(both("exporter CPU time per concurrent round (all its processes)", load_cpu))
    lines.append(both("peak RSS (idle + load)", peak))
    for name in ("nvitop_exporter", "ours"):
        err = _get(report, name, "error")
        if err:
            tail = [ln.strip() for ln in (_get(report, name, "log_tail") or "").splitlines() if ln.strip()]
            worst = [ln for ln in tail if any(k in ln for k in ("FATAL", "ERROR", "NVML unavailable"))]
            first = (worst or tail[-1:] or [""])[0]
            lines.append(f"\n{name} did not run: {err.splitlines()[0]} {first[:300]}")
    floor = report.get("floor") or {}
    sd = _get(ours, "sample_duration")
    lines += ["", "| time per sample | median | samples | NVML calls per sample |", "|---|---|---|---|"]
    if floor.get("sample_s"):
        lines.append(
            f"| raw NVML floor (`bench/floor.py`) | {floor['sample_s']['median'] * 1e3:.2f} ms | "
            f"{floor['samples']} | {', '.join(map(str, floor.get('calls_per_sample_seen') or []))} |"
        )
    else:
        lines.append(f"| raw NVML floor | {floor.get('error', '-')} | - | - |")
    if sd and sd.get("count"):
        calls = sorted(set(sd.get("nvml_calls_between_seen_samples") or []))
        lines.append(
            f"| ours (`nvgpu_sample_duration_seconds`) | {sd['median_s'] * 1e3:.2f} ms | {sd['count']} | "
            f"{', '.join(f'{c:g}' for c in calls) or '-'} (`nvgpu_nvml_calls_total` between samples) |"
        )
    feats = (sd or {}).get("feature_median_s") or {}
    ffeats = floor.get("feature_median_s") or {}
    if feats and ffeats:
        lines += ["", "| feature | floor median | ours median (`nvgpu_feature_duration_seconds`) |", "|---|---|---|"]
        for k in sorted(set(feats) | set(ffeats), key=lambda k: -(feats.get(k) or 0)):
            fv, ov = ffeats.get(k), feats.get(k)
            lines.append(
                f"| {k} | {'-' if fv is None else f'{fv * 1e3:.3f} ms'} | "
                f"{'-' if ov is None else f'{ov * 1e3:.3f} ms'} |"
            )
    lines += ["", "| goal | measured | |", "|---|---|---|"]
    for row in report.get("verdict", []):
        lines.append(f"| {row['goal']} | {row['value']} | {row['status']} |")
    return "\n".join(lines) + "\n"


# -- main ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="nvitop-exporter vs nvgpu-exporter vs the raw NVML floor")
    p.add_argument("--out", required=True, help="result JSON path (e.g. $OUT/peer-h200x1.json)")
    p.add_argument("--idle-seconds", type=float, default=60.0, help="idle CPU/RSS window per exporter")
    p.add_argument("--quick", action="store_true", help="idle 20 s, 6 of our samples, floor spacing 0.25 s")
    p.add_argument("--sequential", type=int, default=200)
    p.add_argument("--concurrency", default="100,1000", help="comma-separated concurrent rounds")
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout, seconds")
    p.add_argument(
        "--client-procs",
        type=int,
        default=0,
        help="client processes for the concurrent rounds (0 = auto: 1 below 8 CPUs, else CPUs/4, at most 8)",
    )
    p.add_argument(
        "--prometheus-headers",
        action="store_true",
        help="send Prometheus 3's Accept and Accept-Encoding: gzip (default: identity, no Accept)",
    )
    p.add_argument("--our-backend", default="nvml", help="nvml, or fake:<scenario> for a dry run without a GPU")
    p.add_argument(
        "--our-interval",
        type=float,
        default=1.0,
        help="our sample interval (default 1 s: nvitop-exporter's default, equal cadence; ours is 5 s)",
    )
    p.add_argument("--no-pods", dest="pods", action="store_false", help="ours without pod attribution (no kubelet)")
    p.add_argument("--our-samples", type=int, default=12, help="distinct samples of ours to read (median)")
    p.add_argument("--sample-wait-max", type=float, default=75.0, help="longest wait for those samples, seconds")
    p.add_argument("--nvitop-interval", type=float, help="nvitop-exporter --interval (default: its own, 1 s)")
    p.add_argument("--floor-samples", type=int, default=24)
    p.add_argument(
        "--gpu-load",
        action="store_true",
        help="run everything under GPU load (bench/gpuload.py: matmul on every GPU, NVLink copy)",
    )
    p.add_argument(
        "--floor-spacing",
        type=float,
        default=1.0,
        help="seconds between floor samples (ours samples every 5 s: not back to back)",
    )
    p.add_argument("--settle-seconds", type=float, default=3.0, help="after ready, before the idle window")
    p.add_argument("--ready-timeout", type=float, default=60.0)
    p.add_argument(
        "--skip", action="append", default=[], choices=("floor", "ours", "nvitop"), help="skip a phase (repeatable)"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.idle_seconds = min(args.idle_seconds, 20.0)
        args.our_samples = min(args.our_samples, 6)
        args.sample_wait_max = min(args.sample_wait_max, 40.0)
        args.floor_spacing = min(args.floor_spacing, 0.25)
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if args.client_procs <= 0:
        ncpu = len(os.sched_getaffinity(0))
        args.client_procs = 1 if ncpu < 8 else min(8, ncpu // 4)
    args.headers = load.PROMETHEUS3_HEADERS if args.prometheus_headers else load.PLAIN_HEADERS
    nofile = load.raise_nofile(2 * max(args.concurrency or [0]) + 512)  # servers inherit it
    fake = args.our_backend[len("fake:") :] if args.our_backend.startswith("fake:") else None
    if fake:
        fake = str((ROOT / fake).resolve()) if not os.path.isabs(fake) else fake

    t_start = time.monotonic()
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "benchmark": "peer",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": {
            "idle_seconds": args.idle_seconds,
            "sequential": args.sequential,
            "concurrency": args.concurrency,
            "timeout_s": args.timeout,
            "headers": args.headers,
            "our_backend": args.our_backend,
            "our_interval_s": args.our_interval,
            "our_samples": args.our_samples,
            "nvitop_interval_s": args.nvitop_interval or "default (1.0)",
            "floor_samples": args.floor_samples,
            "floor_spacing_s": args.floor_spacing,
            "floor_slow_every": max(1, round(SLOW_EVERY_S / args.our_interval)),
            "gpu_load": args.gpu_load,
            "pod_attribution": args.pods,
            "quick": args.quick,
            "nofile": nofile,
            "client_procs": args.client_procs,
        },
    }

    def checkpoint() -> None:
        report["elapsed_s"] = round(time.monotonic() - t_start, 1)
        tmp = out_path.with_suffix(out_path.suffix + ".tmp")
        tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
        tmp.replace(out_path)

    print("environment …", flush=True)
    report["environment"] = env_info = environment()
    nvml = env_info.get("nvml") or {}
    print(
        f"  GPUs: {[g['name'] for g in nvml.get('gpus', [])] or nvml.get('error')}; driver "
        f"{nvml.get('driver_version')}; versions {env_info['versions']}",
        flush=True,
    )
    checkpoint()

    gpu_load = None
    if args.gpu_load:
        print("GPU load (bench/gpuload.py) …", flush=True)
        gpu_load = GpuLoad()
        report["gpu_load"] = gpu_load.start()
        print(f"  {report['gpu_load'].get('error') or 'running'}", flush=True)
        checkpoint()
    try:
        _phases(args, report, fake, checkpoint)
    finally:
        if gpu_load is not None:
            report["gpu_load"] = gpu_load.stop()
    report["verdict"] = verdict(report)
    report["markdown"] = markdown(report, args.concurrency)
    checkpoint()
    print()
    print(report["markdown"])
    print(f"wrote {out_path} after {report['elapsed_s']} s")
    return 0


def _phases(args: argparse.Namespace, report: dict[str, Any], fake: str | None, checkpoint: Any) -> None:
    """The floor, ours, nvitop-exporter, one after the other."""
    if "floor" not in args.skip:
        print(f"floor ({args.floor_samples} samples{', fake ' + fake if fake else ''}) …", flush=True)
        slow_every = max(1, round(SLOW_EVERY_S / args.our_interval))
        report["floor"] = run_floor(args.floor_samples, args.floor_spacing, fake, slow_every)
        f = report["floor"]
        summary = f.get("error") or (
            f"median {f['sample_s']['median'] * 1e3:.3f} ms, {f.get('calls_per_sample_seen')} calls"
        )
        print(f"  {summary}", flush=True)
        checkpoint()

    base_env = dict(os.environ)
    base_env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), base_env.get("PYTHONPATH", "")) if x)
    base_env["PYTHONUNBUFFERED"] = "1"

    if "ours" not in args.skip:
        env = {k: v for k, v in base_env.items() if not k.startswith("NVGPU_")}
        backend = f"fake:{fake}" if fake else args.our_backend
        env.update(
            NVGPU_NVML_BACKEND=backend,
            NVGPU_STATE_FILE="",
            NVGPU_LISTEN_ADDRESS="127.0.0.1:{port}",
            NVGPU_SAMPLE_INTERVAL_SECONDS=f"{args.our_interval:g}",
        )
        cmd = [sys.executable, "-m", "exporter", "--listen-address", "127.0.0.1:{port}"]
        with contextlib.ExitStack() as stack:
            if args.pods:
                try:
                    sock = stack.enter_context(kubelet.fake_kubelet(kubelet.uuids_of(backend)))
                    env.update(kubelet.pod_env(sock))
                except (RuntimeError, OSError, ImportError) as exc:
                    report["pods_error"] = f"the fake kubelet did not start: {exc}"
                    print(f"  {report['pods_error']}; ours runs without pod attribution", flush=True)
            report["ours"] = run_exporter(
                "ours",
                cmd,
                env,
                "/readyz",
                args,
                role_ours,
                True,
                checkpoint,
                give_up=nvml_unavailable,
                pods=args.pods and "pods_error" not in report,
            )

    if "nvitop" not in args.skip:
        if importlib.util.find_spec("nvitop_exporter") is None:
            report["nvitop_exporter"] = {
                "error": "nvitop_exporter is not importable with this Python and PYTHONPATH "
                f"({os.environ.get('PYTHONPATH', '')!r}); install the wheels: "
                "pip install --no-index --no-deps --target /tmp/site .whl/*.whl "
                "and export PYTHONPATH=/tmp/site"
            }
            print(f"nvitop-exporter: {report['nvitop_exporter']['error']}", flush=True)
        else:
            cmd = [sys.executable, "-m", "nvitop_exporter", "--bind-address", "127.0.0.1", "--port", "{port}"]
            if args.nvitop_interval:
                cmd += ["--interval", f"{args.nvitop_interval:g}"]
            report["nvitop_exporter"] = run_exporter(
                "nvitop-exporter",
                cmd,
                base_env,
                "/metrics",
                args,
                load.default_role,
                False,
                checkpoint,
                body_check=lambda b: b"nvitop_info" in b,
            )
            r = report["nvitop_exporter"]
            if r.get("error") and r.get("exit_code") == 1 and not r.get("log_tail", "").strip():
                r["hint"] = (
                    "nvitop-exporter exits 1 without a message when the NVML library is not found "
                    "(no GPU driver on this machine)"
                )


if __name__ == "__main__":
    raise SystemExit(main())
