"""Issue 30 (d2): the worker forked from a pre-imported parent (a zygote) against spawn + exec.

Not product code. Two ways to start the real worker (``exporter.worker.main`` on the fake
scenario), each under the same stand-in supervisor, and the memory of every process after
``--seconds`` of sampling at ``--interval``:

``spawn``
    today: ``python -m exporter.worker`` as a fresh interpreter (``exporter/supervisor/workerproc.py``).
``zygote``
    the stand-in supervisor imports the modules both processes load (:data:`COMMON`: the typed
    snapshot and collectors, protocol, logs, self-check with ``importlib.metadata``, config,
    guards, psutil), calls ``gc.freeze()`` and forks a zygote **before** it imports aiohttp,
    uvloop or prometheus_client and before any thread exists. The zygote imports the worker's
    own modules (:data:`WORKER`, ``pynvml`` as a module only), checks that no NVML library is
    loaded (``pynvml.nvmlLib is None`` and no ``libnvidia-ml`` in ``/proc/self/maps``: importing
    nvidia-ml-py defines ctypes structures and a lock, it does not ``dlopen`` the library; that
    happens in ``nvmlInit``), calls ``gc.freeze()`` and waits. For each worker the supervisor sends
    the message-pipe and stdin descriptors over a unix socket (``SCM_RIGHTS``); the zygote forks a
    child that sets the worker's environment and runs ``exporter.worker.main.main()``, so
    ``nvmlInit`` happens only in the fresh child, never in a process that forks.

The stand-in supervisor is the real one without HTTP: it imports what ``exporter.cli.serve``
imports (aiohttp.web, uvloop, ``exporter.supervisor.http.web``), builds the supervisor
(``exporter.app.build_supervisor``) and ``exporter.supervisor.http.web.Renderer``, and feeds every
worker line through ``decode_message`` -> ``Supervisor.handle`` -> the coalesced render, on uvloop.

Reported per process: RSS, USS, PSS (``psutil.memory_full_info``) and, for all processes together,
the sums (RSS counts shared pages once per process; PSS splits them), plus the time from asking
for a worker to its ``hello``.

``python bench/proto_fork.py [--seconds 30] [--runs 2] [--json OUT]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

COMMON = (
    "json",
    "dataclasses",
    "importlib.metadata",
    "psutil",
    "guards",
    "guards.features",
    "guards.known_issues",
    "guards.versions",
    "exporter.common.protocol",
    "exporter.common.logs",
    "exporter.common.breadcrumb",
    "exporter.common.collectors",
    "exporter.common.snapshot",
    "exporter.common.selfcheck",
    "exporter.config",
    "exporter.common.nvml.errors",
    "exporter.common.scenarios.scenario",
)
WORKER = (
    "pynvml",
    "exporter.worker.main",
    "exporter.worker.sampler",
    "exporter.worker.gpuslot",
    "exporter.worker.nvml.backend",
    "exporter.worker.nvml.client",
    "exporter.worker.nvml.structs",
    "exporter.worker.fakenvml.binding",
    "exporter.worker.nvml_events",
)
SUPERVISOR = (
    "uvloop",
    "aiohttp.web",
    "prometheus_client",
    "exporter.supervisor.http.web",
    "exporter.supervisor.supervisor",
    "exporter.supervisor.http.httpedge",
)


def _mem(pid: int) -> dict[str, float]:
    import psutil

    full = psutil.Process(pid).memory_full_info()
    return {"rss_mb": round(full.rss / 1e6, 2), "uss_mb": round(full.uss / 1e6, 2), "pss_mb": round(full.pss / 1e6, 2)}


# -- the zygote ---------------------------------------------------------------------------------------


def _nvml_loaded() -> bool:
    with open("/proc/self/maps") as fh:
        maps = fh.read()
    pynvml = sys.modules.get("pynvml")
    return "libnvidia-ml" in maps or (pynvml is not None and getattr(pynvml, "nvmlLib", None) is not None)


def zygote_main(sock: socket.socket) -> None:
    """The zygote's loop: fork a worker per request; report exits (it is their parent)."""
    for name in WORKER:
        importlib.import_module(name)
    if _nvml_loaded():  # the rule the design rests on: nothing NVML in a process that forks
        raise SystemExit("zygote: NVML library loaded before fork")
    exits: dict[int, int] = {}

    def reap(*_: Any) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            exits[pid] = status

    signal.signal(signal.SIGCHLD, reap)
    gc.freeze()
    sock.sendall(b'{"ready": true}\n')
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, 65536, 4)
        except InterruptedError:
            continue
        if not data:
            os._exit(0)
        cmd = json.loads(data)
        if cmd["op"] == "exits":
            sock.sendall(json.dumps({str(k): v for k, v in exits.items()}).encode() + b"\n")
            continue
        msg_fd, stdin_fd, stderr_fd = fds
        pid = os.fork()
        if pid == 0:  # the worker: a fresh NVML client in a child that never forks
            sock.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.dup2(stdin_fd, 0)
            os.dup2(stderr_fd, 2)
            os.environ.update(cmd["env"], NVGPU_WORKER_FD=str(msg_fd))
            code = 70
            try:
                import exporter.worker.main

                code = exporter.worker.main.main()
            finally:
                sys.stderr.flush()
                os._exit(code)
        for fd in fds:
            os.close(fd)
        sock.sendall(json.dumps({"pid": pid}).encode() + b"\n")


class Zygote:
    """The supervisor's side: fork the zygote now, ask it for workers later."""

    def __init__(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            parent.close()
            try:
                zygote_main(child)
            finally:
                os._exit(1)
        child.close()
        self.pid = pid
        self.sock = parent
        self.file = parent.makefile("rb")
        assert json.loads(self.file.readline())["ready"]

    def spawn(self, env: dict[str, str], msg_fd: int, stdin_fd: int, stderr_fd: int) -> int:
        socket.send_fds(self.sock, [json.dumps({"op": "spawn", "env": env}).encode()], [msg_fd, stdin_fd, stderr_fd])
        return int(json.loads(self.file.readline())["pid"])

    def close(self) -> None:
        self.sock.close()
        try:
            os.kill(self.pid, signal.SIGTERM)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


# -- the stand-in supervisor ------------------------------------------------------------------------


def run(mode: str, seconds: float, interval: float, scenario: str) -> dict[str, Any]:
    import capture

    for name in COMMON:
        importlib.import_module(name)
    zygote = Zygote() if mode == "zygote" else None
    for name in SUPERVISOR:
        importlib.import_module(name)
    import uvloop

    from exporter.app import build_supervisor
    from exporter.common import protocol
    from exporter.common.snapshot import Hello
    from exporter.common.snapshotdecode import decode_message
    from exporter.config import Config
    from exporter.supervisor.http.web import Renderer

    config = Config.from_env({"NVGPU_STATE_FILE": "", "NVGPU_SAMPLE_INTERVAL_SECONDS": f"{interval:g}"})
    out: dict[str, Any] = {"mode": mode}

    async def main() -> None:
        sup = build_supervisor(config)
        Renderer(sup.state)  # follows the state from construction on
        read_fd, write_fd = os.pipe()
        stdin_r, stdin_w = os.pipe()
        err = tempfile.TemporaryFile()
        env = {
            "NVGPU_WORKER_CONFIG": json.dumps(capture.worker_config(scenario, interval, 0) | {"samples": None}),
            "NVGPU_FAKE_EPOCH": repr(time.monotonic()),
        }
        t0 = time.monotonic()
        if zygote is not None:
            pid = zygote.spawn(env, write_fd, stdin_r, err.fileno())
            proc = None
        else:
            full = dict(os.environ, **env, NVGPU_WORKER_FD=str(write_fd))
            full["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), full.get("PYTHONPATH", "")) if p)
            proc = subprocess.Popen(
                [sys.executable, "-m", "exporter.worker"], stdin=stdin_r, stderr=err, pass_fds=(write_fd,), env=full
            )
            pid = proc.pid
        os.close(write_fd)
        os.close(stdin_r)
        reader = asyncio.StreamReader(limit=64 << 20)
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0))
        end = None
        snapshots = 0
        while True:
            line = await reader.readline()
            if not line:
                break
            msg = decode_message(protocol.decode(line))
            sup.handle(msg)
            if isinstance(msg, Hello) and "hello_after_s" not in out:
                out["hello_after_s"] = round(time.monotonic() - t0, 3)
                end = time.monotonic() + seconds
            if type(msg).__name__ == "Snapshot":
                snapshots += 1
            if end is not None and time.monotonic() >= end:
                break
        await asyncio.sleep(0.2)
        out["snapshots"] = snapshots
        procs = {"supervisor": os.getpid(), "worker": pid}
        if zygote is not None:
            procs["zygote"] = zygote.pid
        out["processes"] = {r: _mem(p) for r, p in procs.items()}
        out["total"] = {
            k: round(sum(m[k] for m in out["processes"].values()), 2) for k in ("rss_mb", "uss_mb", "pss_mb")
        }
        os.close(stdin_w)  # EOF on its stdin: the worker stops
        if proc is not None:
            proc.wait(10)
        else:
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                await asyncio.sleep(0.1)

    try:
        uvloop.run(main())
    finally:
        if zygote is not None:
            zygote.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="issue 30 (d2): worker forked from a zygote vs spawn+exec")
    p.add_argument("--mode", choices=("spawn", "zygote"), help="(one run, in this process)")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--scenario", default="examples/scenarios/h200x8.json")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.mode:
        print(json.dumps(run(args.mode, args.seconds, args.interval, args.scenario)))
        return 0
    me = str(Path(__file__).resolve())
    results: dict[str, Any] = {"seconds": args.seconds, "interval_s": args.interval, "runs": {}}
    for i in range(args.runs):
        for mode in ("spawn", "zygote"):
            cmd = [sys.executable, me, "--mode", mode, "--seconds", str(args.seconds), "--interval", str(args.interval)]
            proc = subprocess.run([*cmd, "--scenario", args.scenario], capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                print(f"{mode}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
                return 2
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            results["runs"].setdefault(mode, []).append(r)
            procs = ", ".join(f"{k} {v['pss_mb']}" for k, v in r["processes"].items())
            print(
                f"run {i + 1} {mode:>6}: total RSS {r['total']['rss_mb']} / USS {r['total']['uss_mb']} / "
                f"PSS {r['total']['pss_mb']} MB (PSS: {procs}); hello after {r['hello_after_s']} s",
                flush=True,
            )
    results["median"] = {
        mode: {k: statistics.median(r["total"][k] for r in runs) for k in ("rss_mb", "uss_mb", "pss_mb")}
        | {"hello_after_s": statistics.median(r["hello_after_s"] for r in runs)}
        for mode, runs in results["runs"].items()
    }
    print(json.dumps(results["median"]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
