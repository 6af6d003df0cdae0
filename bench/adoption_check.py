#!/usr/bin/env python3
"""On a GPU machine: what the image's Python packages and the real NVML do with it.

1. Pod attribution's gRPC stubs load on the grpcio/protobuf installed there (the H200 image has
   grpcio 1.84, which the previous stubs refused): ``unsupported_reason()`` is None.
2. The exporter runs on the real NVML behind TLS with a client certificate and basic auth (a
   throw-away CA and certificates made with openssl), and an HTTPS scrape with the client
   certificate and password gets the GPUs.
3. ``process_*``: the supervisor's and the worker's resident memory as the exporter reports it,
   next to what psutil reads for the same PIDs (the worker holds NVML: most of the pod's memory).
4. Over plain HTTP and over TLS, 200 sequential scrapes on one kept-alive connection: latency
   p50/p99 (the cost of TLS and basic auth once the password is cached).

Writes ``$OUT/adoption.json`` (or ``--out``) and prints a summary; about 40 s. Without a GPU it
still runs items 1, 2 and 4 (``nvgpu_up 0``) and says so.

    python3 bench/adoption_check.py --out "$OUT/adoption.json"
"""

from __future__ import annotations

import argparse
import base64
import http.client
import importlib.util
import json
import os
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PASSWORD = "adoption-check"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(d: Path) -> None:
    openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=adoption-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
        cwd=d,
    )
    for name, san, usage in (("server", "IP:127.0.0.1", "serverAuth"), ("client", "DNS:prometheus", "clientAuth")):
        openssl(
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            cwd=d,
        )
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "1", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=d)  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(env_extra: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    env.update({"NVGPU_LISTEN_ADDRESS": f"127.0.0.1:{port}", "NVGPU_STATE_FILE": "", "NVGPU_LOG_FORMAT": "json"})
    env.update(env_extra)
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter"], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, port
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the exporter did not listen:\n{log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def scrape_series(conn: http.client.HTTPConnection, headers: dict[str, str]) -> dict[str, float]:
    conn.request("GET", "/metrics", headers=headers)
    resp = conn.getresponse()
    body = resp.read().decode()
    if resp.status != 200:
        raise SystemExit(f"scrape answered {resp.status}: {body[:300]}")
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def latencies(conn: http.client.HTTPConnection, headers: dict[str, str], n: int = 200) -> dict[str, float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("GET", "/metrics", headers=headers)
        conn.getresponse().read()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {"p50_ms": round(statistics.median(times), 3), "p99_ms": round(times[int(0.99 * (n - 1))], 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "adoption.json"))
    args = parser.parse_args()
    result: dict[str, Any] = {"python": sys.version.split()[0]}

    # 1. the stubs against this machine's grpcio/protobuf
    try:
        import google.protobuf
        import grpc

        result["grpcio"], result["protobuf"] = grpc.__version__, google.protobuf.__version__
    except ImportError as exc:
        result["grpcio"] = result["protobuf"] = f"not installed ({exc})"
    from exporter.supervisor.podresources import unsupported_reason

    result["pod_attribution_unsupported_reason"] = unsupported_reason()

    if shutil.which("openssl") is None:
        raise SystemExit("openssl is needed for the throw-away certificates")
    # The web config needs PyYAML, basic auth bcrypt (new dependencies; a machine where
    # the project was installed with --no-deps may lack them: then say so and check what can be).
    missing = [m for m in ("yaml", "bcrypt") if importlib.util.find_spec(m) is None]
    result["missing_modules"] = missing
    if "yaml" in missing:
        raise SystemExit(f"PyYAML is not installed: no web config can load here ({json.dumps(result)})")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        make_certs(d)
        users = ""
        auth: dict[str, str] = {}
        if "bcrypt" not in missing:
            from exporter.supervisor.http.webauth import hash_password

            users = f"basic_auth_users:\n  prometheus: {hash_password(PASSWORD)}\n"
            auth = {"Authorization": "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()}
        (d / "web.yml").write_text(
            f"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
            f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n{users}"
        )
        ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
        ctx.load_cert_chain(str(d / "client.crt"), str(d / "client.key"))

        # 2 + 3: TLS, client certificate, basic auth, real NVML
        proc, port = start({"NVGPU_WEB_CONFIG_FILE": str(d / "web.yml")}, d / "tls.log")
        try:
            time.sleep(8)  # nvmlInit and a few samples
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
            series = scrape_series(conn, auth)
            result["tls_scrape"] = {
                "nvgpu_up": series.get("nvgpu_up"),
                "gpus": sum(1 for k in series if k.startswith("nvgpu_gpu_info{")),
                "web_config_reload_ok": series.get("nvgpu_web_config_last_reload_successful"),
            }
            import psutil

            sup = psutil.Process(proc.pid)
            workers = [c for c in sup.children() if "exporter.worker" in " ".join(c.cmdline())]
            result["process_metrics"] = {
                "supervisor_rss_reported": series.get("process_resident_memory_bytes"),
                "supervisor_rss_psutil": sup.memory_info().rss,
                "worker_rss_reported": series.get('process_resident_memory_bytes{process="worker"}'),
                "worker_rss_psutil": workers[0].memory_info().rss if workers else None,
                "worker_open_fds": series.get('process_open_fds{process="worker"}'),
                "supervisor_max_fds": series.get("process_max_fds"),
            }
            result["latency_tls_basic_auth" if auth else "latency_tls_no_basic_auth"] = latencies(conn, auth)
            conn.close()
        finally:
            stop(proc)
        # 4: the same without a web config
        proc, port = start({}, d / "plain.log")
        try:
            time.sleep(8)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            result["latency_plain"] = latencies(conn, {})
            conn.close()
        finally:
            stop(proc)
        result["log_lines_not_json"] = sum(
            1
            for log in ("tls.log", "plain.log")
            for line in (d / log).read_text(errors="replace").splitlines()
            if line.strip() and not line.startswith("{")
        )
    if not result["tls_scrape"]["nvgpu_up"]:
        result["note"] = "nvgpu_up 0: no GPU reached (TLS, auth and the stubs were still checked)"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
