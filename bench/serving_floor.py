"""Issue 30 (c): a floor for serving ``/metrics``, and what our edge adds to each request.

Serves the exporter's own exposition bytes (fetched once from a real exporter on the fake
scenario) from a ladder of servers, each one step closer to the exporter, on the same event loop
(uvloop when installed, as ``exporter/cli.py`` runs), each in its own process:

``bare``
    aiohttp ``AppRunner`` + ``TCPSite`` (``loop.create_server``), one route, a handler returning a
    ``web.Response`` of the cached bytes with our Content-Type. The floor.
``handler``
    the same server with our ``/metrics`` handler (``exporter.supervisor.http.web.metrics``: the renderer's age
    check, Accept negotiation, Accept-Encoding parsing, the ``Vary`` header) on a stand-in renderer
    holding the same bytes.
``app``
    our whole application (``exporter.supervisor.http.web.make_app``): the edge middleware (rate limit, client
    certificate, basic auth when a web config is set; the header-timer hooks), the ``Server``
    header hook, the four routes.
``edge``
    ``app`` behind our own accept loop (``exporter.supervisor.http.httpedge.Listener``: connection cap, header
    timeout, ``connect_accepted_socket`` per connection) as ``exporter.cli.serve`` builds it.
``exporter``
    the exporter itself (``python -m exporter`` on the fake scenario; it samples and renders in the
    background, every ``--interval`` seconds).
``auth``
    the exporter with a web config file (``--web.config.file``) of one basic-auth user (bcrypt) and a
    rate limit that never refuses (``interval: 1ms``, ``burst: 1000000``), every request carrying
    that user's ``Authorization`` header: the per-request cost of auth (header parse, the verified
    credentials' cache; bcrypt only once, for the first request) and of the limiter.

For each, in ``--passes`` passes over the levels (every other pass in reverse order, so that
drift on a shared machine evens out): ``--seq-runs`` x ``--sequential`` requests on one
keep-alive connection (``bench/load.py: sequential``, p50/p99) with the server's CPU time per
request (user + system of the server process over the run, ``psutil``: on a shared 2-core machine
CPU per request is the steadier figure; latency includes the load client's own time on the same
cores), then ``--rounds`` rounds of ``--concurrency`` connections at once (``load.concurrent``).
``--profile`` adds py-spy (``--gil``) of the ``bare`` and ``exporter`` servers during a
sequential run in the first pass, aggregated as in ``bench/sample_cost.py`` by the layer whose code
was running, so the per-request work in the difference has names.

``python bench/serving_floor.py [--sequential 3000] [--passes 2] [--concurrency 1000] [--profile]
[--json OUT]`` (about 6 minutes). ``--serve LEVEL --port P --body FILE`` is the server side (used
by the benchmark itself).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import load  # noqa: E402
import sample_cost  # noqa: E402

import bench  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LEVELS = ("bare", "handler", "app", "edge", "exporter", "auth")
AUTH_USER, AUTH_PASSWORD = "bench", "serving-floor"
HEADERS: dict[str, dict[str, str]] = {}  # request headers by URL (the auth level's Authorization)
TEXT = "text/plain; version=0.0.4; charset=utf-8"


# -- the server side --------------------------------------------------------------------------------


class _Body:
    """Stand-in for ``exposition.Rendered``: the same bytes for every format (gzip kept once)."""

    def __init__(self, body: bytes) -> None:
        import gzip

        self.text = body
        self._gz = gzip.compress(body, compresslevel=6, mtime=0)

    def body(self, openmetrics: bool, gzipped: bool) -> bytes:
        return self._gz if gzipped else self.text


class _Renderer:
    """Stand-in for ``exporter.supervisor.http.web.Renderer``: ``fresh()`` with the same age check."""

    def __init__(self, body: bytes) -> None:
        self.current = _Body(body)
        self.rendered_mono = time.monotonic()

    def fresh(self) -> _Body:
        if time.monotonic() - self.rendered_mono > 5.0:  # exporter.supervisor.http.web.REFRESH_S
            self.rendered_mono = time.monotonic()
        return self.current


async def _serve(level: str, port: int, body: bytes) -> None:
    sys.path.insert(0, str(ROOT))
    from aiohttp import web

    if level == "bare":

        async def handler(_request: web.Request) -> web.Response:
            return web.Response(body=body, headers={"Content-Type": TEXT})

        app = web.Application()
        app.router.add_get("/metrics", handler)
    elif level == "handler":
        from exporter.supervisor.http import web as our_web

        app = web.Application()
        app[our_web.RENDERER] = _Renderer(body)  # type: ignore[assignment]
        app.router.add_get("/metrics", our_web.metrics)
    else:
        from exporter.supervisor.http import web as our_web

        supervisor = SimpleNamespace(state=SimpleNamespace(liveness=lambda: (True, "ok"), ready=lambda: (True, "ok")))
        edge = our_web.Edge()
        app = our_web.make_app(supervisor, _Renderer(body), "/metrics", edge)  # type: ignore[arg-type]
    runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=75.0)
    await runner.setup()
    if level == "edge":
        from exporter.supervisor.http.httpedge import HttpEdge, Listener

        assert runner.server is not None
        listener = Listener(HttpEdge(), 4096, 10.0)
        app[our_web.EDGE].listener = listener
        await listener.start(runner.server, "127.0.0.1", port, backlog=4096)
    else:
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
    print("serving", flush=True)
    await asyncio.Event().wait()


def serve(level: str, port: int, body_path: str) -> int:
    body = Path(body_path).read_bytes()
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve(level, port, body))
    else:
        uvloop.run(_serve(level, port, body))
    return 0


# -- the benchmark side -----------------------------------------------------------------------------


def start(level: str, body_path: Path, tmp: Path, interval: float, scenario: Path) -> load.ServerProcess:
    port = load.free_port()
    log_path = tmp / f"{level}.log"
    if level in ("exporter", "auth"):
        env = {
            "NVGPU_NVML_BACKEND": f"fake:{scenario}",
            "NVGPU_STATE_FILE": "",
            "NVGPU_SAMPLE_INTERVAL_SECONDS": f"{interval:g}",
        }
        if level == "auth":
            env["NVGPU_WEB_CONFIG_FILE"] = str(_web_config(tmp))
        server = bench.start_exporter(env, port, log_path)
        server.wait_status("/readyz", 60.0)  # probes skip auth by default
        return server
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", level, "--port", str(port)]
    cmd += ["--body", str(body_path)]
    server = load.ServerProcess(cmd, env, port, str(log_path), str(ROOT))
    server.wait_status("/metrics", 30.0)
    return server


def _web_config(tmp: Path) -> Path:
    """The ``auth`` level's web config: one bcrypt user (cost 4) and a limiter that never refuses."""
    import bcrypt

    hashed = bcrypt.hashpw(AUTH_PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    path = tmp / "web-config.yml"
    path.write_text(f"basic_auth_users:\n  {AUTH_USER}: '{hashed}'\nrate_limit:\n  interval: 1ms\n  burst: 1000000\n")
    return path


def _cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


async def measure(server: load.ServerProcess, args: argparse.Namespace, profile_dir: Path | None) -> dict[str, Any]:
    url = server.base + "/metrics"
    headers = HEADERS.get(url)
    out: dict[str, Any] = {}
    seq_runs = []
    for _ in range(args.seq_runs):
        c0 = _cpu(server.pid)
        seq = await load.sequential(url, args.sequential, headers=headers)
        cpu = _cpu(server.pid) - c0
        seq["server_cpu_ms_per_request"] = round(1000 * cpu / (args.sequential + seq["warmup"]), 4)
        seq_runs.append(seq)
        await asyncio.sleep(1.0)
    out["sequential_runs"] = [
        {
            "p50_ms": s["latency"]["p50_ms"],
            "p99_ms": s["latency"]["p99_ms"],
            "ok": s["ok"],
            "server_cpu_ms_per_request": s["server_cpu_ms_per_request"],
        }
        for s in seq_runs
    ]
    out["sequential"] = {
        "p50_ms_min": min(s["latency"]["p50_ms"] for s in seq_runs),
        "p50_ms_median": statistics.median(s["latency"]["p50_ms"] for s in seq_runs),
        "p99_ms_median": statistics.median(s["latency"]["p99_ms"] for s in seq_runs),
        "server_cpu_ms_per_request_min": min(s["server_cpu_ms_per_request"] for s in seq_runs),
        "server_cpu_ms_per_request_median": statistics.median(s["server_cpu_ms_per_request"] for s in seq_runs),
        "body_bytes": seq_runs[0]["body_bytes"],
    }
    rounds = []
    for _ in range(args.rounds):
        c0 = _cpu(server.pid)
        r = await load.concurrent(url, args.concurrency, headers=headers)
        r["server_cpu_s"] = round(_cpu(server.pid) - c0, 3)
        rounds.append({k: r.get(k) for k in ("ok", "timeouts", "errors", "latency", "wall_s", "server_cpu_s")})
        await asyncio.sleep(1.5)
    out["concurrent"] = rounds
    if profile_dir is not None:
        rec_task = asyncio.to_thread(
            sample_cost.pyspy_record, {"server": server.pid}, args.profile_seconds, 1000, profile_dir
        )
        load_task = asyncio.ensure_future(_keep_loading(url, args.profile_seconds, headers))
        rec = await rec_task
        await load_task
        out["profile"] = (
            sample_cost.aggregate(Path(rec["server"]["raw"]), 25, PHASES, leaf=True)
            if "raw" in rec.get("server", {})
            else rec
        )
    return out


async def _keep_loading(url: str, seconds: float, headers: dict[str, str] | None) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds + 1:
        await load.sequential(url, 500, headers=headers, warmup=0)


# Per-request work, by the layer whose code was running (the matching frame nearest the leaf).
PHASES: list[tuple[str, tuple[str, ...]]] = [
    (
        "our handler (negotiate, Accept-Encoding, headers)",
        (
            "metrics (exporter/supervisor/http/web.py",
            "negotiate (exporter/",
            "accepts_gzip",
            "Renderer.fresh",
            "Rendered.body",
        ),
    ),
    (
        "auth and rate limit (auth level only)",
        (
            "exporter/supervisor/http/webauth.py",
            "exporter/supervisor/http/webtls.py",
            "exporter/supervisor/http/webconfig.py",
        ),
    ),
    ("our middleware (edge, header timer)", ("edge_middleware",)),
    ("Server header hook (on_response_prepare)", ("_response_headers",)),
    ("our accept loop and connection guard (httpedge)", ("exporter/supervisor/http/httpedge.py",)),
    (
        "sampling side: decode, apply, render (exporter only)",
        (
            "exporter/common/",
            "exporter/supervisor/",
            "prometheus_client/",
            "exporter/",
        ),
    ),
    ("aiohttp: response (headers, write)", ("web_response.py", "http_writer.py", "helpers.py")),
    ("aiohttp: request handling (protocol, routing, app)", ("aiohttp/",)),
    ("event loop (uvloop / asyncio)", ("uvloop", "asyncio/")),
]


def combine(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """One level's passes: every sequential run and concurrent round together, min and median."""
    seq = [r for p in passes for r in p["sequential_runs"]]
    out: dict[str, Any] = {
        "sequential_runs": seq,
        "sequential": {
            "p50_ms_min": min(r["p50_ms"] for r in seq),
            "p50_ms_median": statistics.median(r["p50_ms"] for r in seq),
            "p99_ms_median": statistics.median(r["p99_ms"] for r in seq),
            "server_cpu_ms_per_request_min": min(r["server_cpu_ms_per_request"] for r in seq),
            "server_cpu_ms_per_request_median": statistics.median(r["server_cpu_ms_per_request"] for r in seq),
            "body_bytes": passes[0]["sequential"]["body_bytes"],
        },
        "concurrent": [c for p in passes for c in p["concurrent"]],
    }
    for p in passes:
        if "profile" in p:
            out["profile"] = p["profile"]
    return out


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "| server | sequential p50 min / median, p99 median (ms) | server CPU ms per request (min / median) "
        "| 1000 concurrent: answered 200, p99 ms, per round |",
        "|---|---|---|---|",
    ]
    for level in res["levels"]:
        r = res["results"][level]
        s = r["sequential"]
        conc = "; ".join(f"{c['ok']}, {round(c['latency']['p99_ms'])}" for c in r["concurrent"])
        lines.append(
            f"| {level} | {s['p50_ms_min']:.3f} / {s['p50_ms_median']:.3f} / {s['p99_ms_median']:.3f} | "
            f"{s['server_cpu_ms_per_request_min']:.4f} / {s['server_cpu_ms_per_request_median']:.4f} | {conc} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="issue 30 (c): serving floor vs our /metrics")
    p.add_argument("--serve", choices=LEVELS[:-2], help="(server side) serve at this level")
    p.add_argument("--port", type=int)
    p.add_argument("--body")
    p.add_argument("--levels", default=",".join(LEVELS))
    p.add_argument("--scenario", default="examples/scenarios/h200x8.json")
    p.add_argument("--interval", type=float, default=5.0, help="the exporter's sample interval")
    p.add_argument("--sequential", type=int, default=3000)
    p.add_argument("--seq-runs", type=int, default=3, help="sequential runs per pass")
    p.add_argument("--passes", type=int, default=2, help="passes over the levels (every other one reversed)")
    p.add_argument("--concurrency", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=2, help="concurrent rounds per pass")
    p.add_argument("--profile", action="store_true", help="py-spy of the bare server and of the exporter")
    p.add_argument("--profile-seconds", type=float, default=20.0)
    p.add_argument("--json", help="result JSON (default bench/results/serving-floor-<date>.json)")
    args = p.parse_args(argv)
    if args.serve:
        return serve(args.serve, args.port, args.body)

    load.raise_nofile(args.concurrency * 2 + 512)
    scenario = (ROOT / args.scenario).resolve()
    tmp = Path(tempfile.mkdtemp(prefix="nvgpu-floor-"))
    started = dt.datetime.now(dt.timezone.utc)
    out = Path(args.json) if args.json else ROOT / "bench" / "results" / f"serving-floor-{started:%Y-%m-%d}.json"
    # the bytes: one exposition of the real exporter on the scenario
    exp = start("exporter", tmp / "unused", tmp, args.interval, scenario)
    try:
        time.sleep(2.0)
        status, body = exp.get("/metrics")
    finally:
        exp.stop()
    if status != 200:
        print(f"serving_floor.py: the exporter answered {status}", file=sys.stderr)
        return 2
    body_path = tmp / "body.txt"
    body_path.write_bytes(body)
    levels = args.levels.split(",")
    res: dict[str, Any] = {
        "benchmark": "issue-30 serving floor",
        "date": started.isoformat(timespec="seconds"),
        "machine": bench.machine_info(),
        "config": {
            k: getattr(args, k)
            for k in ("scenario", "interval", "sequential", "seq_runs", "passes", "concurrency", "rounds")
        },
        "body_bytes": len(body),
        "levels": levels,
        "results": {},
        "note": "server CPU = user+system of the server process; client on the same (shared) 2 cores",
    }
    passes: dict[str, list[dict[str, Any]]] = {level: [] for level in levels}
    for n in range(args.passes):  # levels in turn, every other pass reversed: drift on a shared machine evens out
        for level in levels if n % 2 == 0 else list(reversed(levels)):
            print(f"pass {n + 1}: {level} …", flush=True)
            server = start(level, body_path, tmp, args.interval, scenario)
            if level == "auth":
                token = base64.b64encode(f"{AUTH_USER}:{AUTH_PASSWORD}".encode()).decode()
                HEADERS[server.base + "/metrics"] = {"Authorization": f"Basic {token}"}
            try:
                pdir = None
                if n == 0 and args.profile and level in ("bare", "exporter", "auth") and shutil.which("py-spy"):
                    pdir = tmp / f"pyspy-{level}"
                    pdir.mkdir()
                passes[level].append(asyncio.run(measure(server, args, pdir)))
            finally:
                server.stop()
            s = passes[level][-1]["sequential"]
            print(
                f"  p50 {s['p50_ms_median']} ms, server CPU {s['server_cpu_ms_per_request_median']} ms/request",
                flush=True,
            )
    res["results"] = {level: combine(runs) for level, runs in passes.items()}
    res["markdown"] = markdown(res)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(res["markdown"])
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
