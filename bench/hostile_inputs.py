"""Attacks from outside on a real exporter, measured before and after (not a test: CI does not run it).

For an exporter tree (``--tree``: this checkout, or an exported older commit), each attack starts
``python -m exporter`` from that tree on the fake backend and reports what a client sees:

- ``cap``: one client (127.0.0.2) keeps ``--want`` connections open at ``NVGPU_WEB_MAX_CONNECTIONS``
  (``--cap``), re-opening every one the server closes, half kept alive after a request, half
  silent; the kubelet's probe and Prometheus (127.0.0.1) ask ``/healthz`` and ``/metrics`` once a
  second for ``--seconds``: how many answered 200;
- ``check_fifo_key``: ``--check-config`` with a web config whose ``key_file`` is a FIFO: exit code
  and seconds (killed after ``--limit`` seconds: a hang);
- ``fifo_key_reload``: a TLS exporter whose key file is replaced by a FIFO while it runs: how many
  ``/healthz`` answered (over HTTPS, 1 s timeout) in the ``--seconds`` after, and whether it still
  answers once the good key is back;
- ``sigterm_bcrypt``: SIGTERM while a bcrypt is in progress (``tests/faultinject.py slow_bcrypt``
  makes the password ``slow`` take an hour; with an older tree the fault stands for a cost-31 hash):
  seconds to exit, or killed after ``--limit``.

Usage::

    python bench/hostile_inputs.py --tree . --out bench/results/hostile-<date>-after.json
    git archive <commit> | tar -x -C /tmp/before && \\
        python bench/hostile_inputs.py --tree /tmp/before --out bench/results/hostile-<date>-before.json
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from tls_material import USER, bcrypt_hash, make_material  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(
    tree: Path, tmp: Path, env: dict[str, str], entry: list[str] | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    full.update(
        {
            "NVGPU_LISTEN_ADDRESS": f"127.0.0.1:{port}",
            "NVGPU_NVML_BACKEND": "fake:h200x1",
            "NVGPU_STATE_FILE": str(tmp / "state.json"),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": str(tree),
            **env,
        }
    )
    log = open(tmp / f"exporter-{port}.log", "wb")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(
        [sys.executable, *(entry or ["-m", "exporter"])], env=full, cwd=tree, stdout=log, stderr=log
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"exporter did not listen: {(tmp / f'exporter-{port}.log').read_text()[-2000:]}")


def _stop(proc: subprocess.Popen[bytes], limit: float = 20.0) -> tuple[int | None, float]:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=limit), time.monotonic() - t0
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None, time.monotonic() - t0


def _status(url: str, context: ssl.SSLContext | None = None, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def attack_cap(tree: Path, tmp: Path, seconds: float, cap: int, want: int) -> dict[str, Any]:
    env = {"NVGPU_WEB_MAX_CONNECTIONS": str(cap), "NVGPU_WEB_KEEPALIVE_TIMEOUT_SECONDS": "120"}
    proc, port = _start(tree, tmp, env)
    stop = threading.Event()
    opened = [0]

    def hold() -> None:
        held: list[socket.socket] = []
        while not stop.is_set():
            alive = []
            for s in held:
                try:
                    if s.recv(4096) == b"":
                        s.close()
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    s.close()
                    continue
                alive.append(s)
            held = alive
            while len(held) < want and not stop.is_set():
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=2, source_address=("127.0.0.2", 0))
                    if len(held) % 2 == 0:
                        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                        s.recv(4096)
                    s.setblocking(False)
                except OSError:
                    break
                opened[0] += 1
                held.append(s)
            time.sleep(0.01)
        for s in held:
            s.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    time.sleep(2.0)  # the cap fills
    probes: dict[str, list[int]] = {"healthz": [], "metrics": []}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tick = time.monotonic()
        probes["healthz"].append(_status(f"http://127.0.0.1:{port}/healthz", timeout=1.0))
        probes["metrics"].append(_status(f"http://127.0.0.1:{port}/metrics", timeout=10.0))
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    stop.set()
    thread.join(10)
    code, took = _stop(proc)
    return {
        "cap": cap,
        "client_connections_wanted": want,
        "client_connections_opened": opened[0],
        "seconds": seconds,
        **{f"{k}_ok": sum(1 for s in v if s == 200) for k, v in probes.items()},
        **{f"{k}_asked": len(v) for k, v in probes.items()},
        **{f"{k}_statuses": sorted(set(v)) for k, v in probes.items()},
        "exit": code,
        "exit_seconds": round(took, 2),
    }


def check_fifo_key(tree: Path, tmp: Path, limit: float) -> dict[str, Any]:
    tls = make_material(tmp / "tls")
    os.mkfifo(tmp / "fifo.key")
    web = tmp / "web.yml"
    web.write_text(f"tls_server_config: {{cert_file: {tls.path('server.crt')}, key_file: {tmp / 'fifo.key'}}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    env.update(NVGPU_WEB_CONFIG_FILE=str(web), PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "exporter", "--check-config"],
            env=env,
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=limit,
        )
    except subprocess.TimeoutExpired:
        return {"exit": None, "seconds": limit, "hung": True}
    return {
        "exit": proc.returncode,
        "seconds": round(time.monotonic() - t0, 2),
        "hung": False,
        "traceback": "Traceback" in proc.stderr,
        "says": [line.strip() for line in proc.stderr.splitlines() if "FIFO" in line][:1],
    }


def fifo_key_reload(tree: Path, tmp: Path, seconds: float) -> dict[str, Any]:
    tls = make_material(tmp / "tls")
    for name in ("server.crt", "server.key"):
        shutil.copy(tls.dir / name, tmp / name)
    web = tmp / "web.yml"
    web.write_text("tls_server_config: {cert_file: server.crt, key_file: server.key}\n")
    proc, port = _start(tree, tmp, {"NVGPU_WEB_CONFIG_FILE": str(web)})
    context = tls.client_context(cert=None)
    url = f"https://127.0.0.1:{port}/healthz"
    before = _status(url, context)
    key = (tmp / "server.key").read_bytes()
    os.unlink(tmp / "server.key")
    os.mkfifo(tmp / "server.key")
    time.sleep(2.0)  # the next look at the files (once a second)
    answered = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        answered.append(_status(url, context, timeout=1.0))
        time.sleep(0.5)
    os.unlink(tmp / "server.key")
    (tmp / "server.key").write_bytes(key)
    time.sleep(3.0)  # the good key is back
    after = _status(url, context, timeout=2.0)
    code, took = _stop(proc)
    return {
        "before": before,
        "probes_ok_with_fifo_key": sum(1 for s in answered if s == 200),
        "probes_asked": len(answered),
        "after_good_key_is_back": after,
        "exit": code,
        "exit_seconds": round(took, 2),
    }


def sigterm_bcrypt(tree: Path, tmp: Path, limit: float) -> dict[str, Any]:
    web = tmp / "web.yml"
    web.write_text(f"basic_auth_users:\n  {USER}: {bcrypt_hash()}\n")
    env = {"NVGPU_WEB_CONFIG_FILE": str(web), "NVGPU_SHUTDOWN_TIMEOUT_SECONDS": "10"}
    entry = [str(HERE.parent / "tests" / "faultinject.py"), "slow_bcrypt"]
    proc, port = _start(tree, tmp, env, entry)
    conn = socket.create_connection(("127.0.0.1", port), timeout=5)
    auth = base64.b64encode(f"{USER}:slow".encode())
    conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic " + auth + b"\r\n\r\n")
    time.sleep(1.0)  # the bcrypt is running
    code, took = _stop(proc, limit)
    conn.close()
    return {"exit": code, "seconds_to_exit": round(took, 2), "killed_after_limit": code is None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tree", type=Path, default=HERE.parent, help="the exporter source tree to run [this checkout]")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--cap", type=int, default=16)
    p.add_argument("--want", type=int, default=40)
    p.add_argument("--limit", type=float, default=60.0, help="seconds before a hang is declared")
    p.add_argument("--only", default="cap,check_fifo_key,fifo_key_reload,sigterm_bcrypt")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    tree = args.tree.resolve()
    result: dict[str, Any] = {"tree": str(tree), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for name in args.only.split(","):
        tmp = Path(tempfile.mkdtemp(prefix=f"hostile-{name}-"))
        try:
            if name == "cap":
                result[name] = attack_cap(tree, tmp, args.seconds, args.cap, args.want)
            elif name == "check_fifo_key":
                result[name] = check_fifo_key(tree, tmp, args.limit)
            elif name == "fifo_key_reload":
                result[name] = fifo_key_reload(tree, tmp, min(args.seconds, 20.0))
            elif name == "sigterm_bcrypt":
                result[name] = sigterm_bcrypt(tree, tmp, args.limit)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(name, json.dumps(result[name]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
