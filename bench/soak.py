#!/usr/bin/env python3
"""Soak: two real exporters on fake h200x8 at 1 s, one GPU's call hung, the workers killed from outside.

The long run of "nothing a signal from outside can do misleads the exporter" (docs/reliability.md
records the 30-minute run). What it does, for ``--minutes`` (default 30):

- starts two exporters (``python -m exporter``, the real supervisor and worker) on a copy of
  ``examples/scenarios/h200x8.json`` in which only GPU 7's ``nvmlDeviceGetTemperatureV`` hangs
  forever, sampling every 1 s, with the shipped defaults otherwise (deadlines, probes after 30 s
  doubling to 600 s, quarantine after 3 within 10 minutes):

  * ``plain``: HTTP, no web config;
  * ``tls``: HTTPS and basic auth (an exporter-toolkit web config; bcrypt cost 10), its server
    certificate signed by a CA made for the run (the openssl command);

- scrapes each at ``--rate`` requests per second (default 10: keep-alive, ``Accept-Encoding:
  gzip``, like Prometheus; the ``tls`` one with the credentials, verifying the certificate against
  the run's CA) and asks ``/healthz`` once a second; every answer that is not 200, and every
  connection error, is counted;
- every 5 s parses one ``/metrics`` of each: the quarantines (``nvgpu_feature_enabled`` with reason
  ``quarantined``), and, per healthy GPU (0-6), the families it has: a family a healthy GPU had at
  the start of the run and lacks in two checks in a row (5 s) is a *feature lost on a healthy GPU*
  (recorded once, with when); a check that lacks some and the next that has them again is a *gap*
  (a restarted worker's first snapshot can come before its first pass on every GPU), counted and
  listed apart;
- rotates the ``tls`` exporter's certificate twice (at 1/3 and 2/3 of the run: a new key and
  certificate from the same CA, each file replaced atomically, as a Secret update does) and
  checks that the new certificate is served (the seconds it took) and the reload metric says 1;
- every 30-90 s (seeded RNG, ``--seed``) SIGKILLs the sampling worker of one exporter, the two in
  turn (never a probe: the worker whose configuration has no ``only`` GPU);
- at the end stops both with SIGTERM and reads their last scrape: restarts by reason, crashes by
  the call in flight, GPU 7's faults.

Goals (exit status 1 if one is missed): no non-200 answer and no connection error; no quarantine;
no feature lost on a healthy GPU; every kill counted as ``killed`` (none as ``crash``); each rotation
served; both exporters exit 0. It prints a summary and writes the JSON result (``--out``, default
``bench/results/soak-<date>.json``).

    nice -n 10 python bench/soak.py --minutes 30 --out bench/results/soak-2026-12-01.json
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import gzip
import http.client
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos import exporter_env, free_port, machine, versions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "examples" / "scenarios" / "h200x8.json"
HUNG_GPU, HUNG_FUNCTION = 7, "nvmlDeviceGetTemperatureV"
HEALTHY = [str(i) for i in range(8) if i != HUNG_GPU]
USER, PASSWORD = "prometheus", "soak-scrape"
CHECK_EVERY_S = 5.0
KILL_GAP_S = (30.0, 90.0)


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]}: {proc.stderr.strip()}")


def make_ca(directory: Path) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
        "-subj", "/CN=soak-ca", "-keyout", "ca.key", "-out", "ca.crt",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


def make_server_cert(directory: Path, name: str) -> tuple[Path, Path]:
    """A server key and certificate for 127.0.0.1 signed by the run's CA: ``name.key``, ``name.crt``."""
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=directory,
    )  # fmt: skip
    (directory / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=directory,
    )  # fmt: skip
    return directory / f"{name}.key", directory / f"{name}.crt"


def install(src: Path, dst: Path) -> None:
    """Replace ``dst`` by a copy of ``src`` atomically (a new file renamed over it)."""
    tmp = dst.with_name(f".{dst.name}.new")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


class Exporter:
    """One ``python -m exporter`` in its own session, logging JSON to ``workdir/<name>.log``."""

    def __init__(self, name: str, workdir: Path, scenario: Path, tls: bool) -> None:
        self.name, self.tls = name, tls
        self.port = free_port()
        self.log_path = workdir / f"{name}.log"
        env = exporter_env(
            {
                "NVGPU_NVML_BACKEND": f"fake:{scenario}",
                "NVGPU_SAMPLE_INTERVAL_SECONDS": "1",
                "NVGPU_LISTEN_ADDRESS": f"127.0.0.1:{self.port}",
                "NVGPU_STATE_FILE": str(workdir / f"{name}-state.json"),
            }
        )
        if tls:
            env["NVGPU_WEB_CONFIG_FILE"] = str(workdir / "web.yml")
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "exporter"],
            env=env,
            cwd=str(ROOT),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def connect(self, ctx: ssl.SSLContext | None, timeout: float = 10.0) -> http.client.HTTPConnection:
        if self.tls:
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=ctx)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def sampling_worker(self) -> psutil.Process | None:
        """The exporter's sampling worker (a probe's configuration names its one GPU in ``only``)."""
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return None
        for p in children:
            try:
                if '"only": []' in p.environ().get("NVGPU_WORKER_CONFIG", "") and p.status() != psutil.STATUS_ZOMBIE:
                    return p
            except psutil.Error:
                continue
        return None

    def stop(self, timeout: float = 30.0) -> int | None:
        code: int | None = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                code = None
        else:
            code = self.proc.returncode
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._log.close()
        return code


class Client(threading.Thread):
    """Scrapes one exporter at ``rate`` per second on a kept-alive connection, ``/healthz`` once a
    second, and every :data:`CHECK_EVERY_S` parses one ``/metrics`` (quarantines, families per GPU)."""

    def __init__(self, exp: Exporter, ctx: ssl.SSLContext | None, rate: float, t0: float) -> None:
        super().__init__(name=f"client-{exp.name}", daemon=True)
        self.exp, self.ctx, self.rate, self.t0 = exp, ctx, rate, t0
        self.headers = {"Accept-Encoding": "gzip"}
        if exp.tls:
            token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"
        self.stop_event = threading.Event()
        self.statuses: Counter[str] = Counter()  # "path status"
        self.errors: Counter[str] = Counter()
        self.non_200: list[dict[str, Any]] = []
        self.baseline: dict[str, set[str]] = {}  # healthy GPU -> families at the start
        self.lost: dict[str, float] = {}  # "family on GPU n" -> first seen missing (s into the run)
        self.quarantines: dict[str, float] = {}  # feature -> first seen (s)
        self.gaps: list[dict[str, Any]] = []  # checks in which a healthy GPU lacked a family it had
        self._missing_before: set[str] = set()
        self.checks = 0
        self.last_text = ""

    def _get(self, conn: http.client.HTTPConnection, path: str) -> tuple[int, bytes]:
        conn.request("GET", path, headers=self.headers)
        resp = conn.getresponse()
        body = resp.read()
        if resp.getheader("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return resp.status, body

    def run(self) -> None:
        conn: http.client.HTTPConnection | None = None
        next_health = next_check = time.monotonic()
        period = 1.0 / self.rate
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            now = time.monotonic()
            path = "/metrics"
            if now >= next_health:
                path, next_health = "/healthz", now + 1.0
            try:
                if conn is None:
                    conn = self.exp.connect(self.ctx)
                status, body = self._get(conn, path)
                self.statuses[f"{path} {status}"] += 1
                if status != 200:
                    self.non_200.append({"t": round(now - self.t0, 2), "path": path, "status": status})
                elif path == "/metrics" and now >= next_check:
                    next_check = now + CHECK_EVERY_S
                    self.check(body.decode(), now - self.t0)
            except (OSError, http.client.HTTPException) as exc:
                self.errors[type(exc).__name__] += 1
                self.non_200.append({"t": round(now - self.t0, 2), "path": path, "error": repr(exc)[:200]})
                if conn is not None:
                    conn.close()
                conn = None
            next_at += period
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))
        if conn is not None:
            conn.close()

    def check(self, text: str, t: float) -> None:
        self.checks += 1
        self.last_text = text
        per_gpu: dict[str, set[str]] = {g: set() for g in HEALTHY}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                gpu = sample.labels.get("gpu")
                if gpu in per_gpu and "uuid" in sample.labels:
                    per_gpu[gpu].add(sample.name)
                if sample.name == "nvgpu_feature_enabled" and sample.labels.get("reason") == "quarantined":
                    self.quarantines.setdefault(sample.labels["feature"], round(t, 1))
        if not self.baseline:
            self.baseline = per_gpu
            return
        missing = {f"{name} on GPU {gpu}" for gpu in HEALTHY for name in self.baseline[gpu] - per_gpu[gpu]}
        if missing:
            self.gaps.append({"t": round(t, 1), "series_families_missing": len(missing)})
        for key in missing & self._missing_before:  # missing in two checks in a row: lost, not a restart's gap
            self.lost.setdefault(key, round(t, 1))
        self._missing_before = missing

    def finish(self) -> None:
        self.stop_event.set()
        self.join(15)


def served_cert(port: int) -> bytes:
    """The DER certificate the TLS exporter serves now."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5)) as s:
        return s.getpeercert(binary_form=True) or b""


def der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def _values(text: str, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[s.labels.get(label, "")] = s.value
    return out


def final_counts(text: str) -> dict[str, Any]:
    crashes: dict[str, float] = {}
    faults7: dict[str, float] = {}
    reload_ok = None
    gpu7_state = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "nvgpu_worker_crashes_total":
                crashes[f"{s.labels['feature']}/{s.labels['function']}"] = s.value
            elif s.name == "nvgpu_device_faults_total" and s.labels.get("gpu") == str(HUNG_GPU):
                faults7[s.labels["fault"]] = s.value
            elif s.name == "nvgpu_device_state" and s.labels.get("gpu") == str(HUNG_GPU) and s.value == 1:
                gpu7_state = s.labels["state"]
            elif s.name == "nvgpu_web_config_last_reload_successful":
                reload_ok = s.value
    return {
        "restarts_by_reason": _values(text, "nvgpu_worker_restarts_total", "reason"),
        "crashes_by_call_in_flight": crashes,
        "gpu7_faults": faults7,
        "gpu7_state": gpu7_state,
        "web_config_last_reload_successful": reload_ok,
    }


def run(minutes: float, seed: int, rate: float, workdir: Path) -> dict[str, Any]:
    started = dt.datetime.now(dt.timezone.utc)
    scenario = json.loads(SCENARIO.read_text())
    scenario["faults"] = [{"function": HUNG_FUNCTION, "gpu": HUNG_GPU, "action": "hang"}]
    scenario_path = workdir / "h200x8-gpu7-temperature-hangs.json"
    scenario_path.write_text(json.dumps(scenario, indent=1))
    tls_dir = workdir / "tls"
    tls_dir.mkdir()
    make_ca(tls_dir)
    key, crt = make_server_cert(tls_dir, "server0")
    install(key, tls_dir / "server.key")
    install(crt, tls_dir / "server.crt")
    import bcrypt

    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    (workdir / "web.yml").write_text(
        f"tls_server_config:\n  cert_file: {tls_dir / 'server.crt'}\n  key_file: {tls_dir / 'server.key'}\n"
        f"basic_auth_users:\n  {USER}: '{hashed}'\n"
    )
    ctx = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
    exporters = [Exporter("plain", workdir, scenario_path, tls=False), Exporter("tls", workdir, scenario_path, True)]
    duration = minutes * 60.0
    rng = random.Random(seed)
    kills: list[dict[str, Any]] = []
    rotations: list[dict[str, Any]] = []
    clients: list[Client] = []
    codes: dict[str, int | None] = {}
    finals: dict[str, dict[str, Any]] = {}
    try:
        for exp in exporters:  # ready: a first sample served
            deadline = time.monotonic() + 90
            while True:
                try:
                    conn = exp.connect(ctx, timeout=2)
                    conn.request("GET", "/readyz")
                    if conn.getresponse().status == 200:
                        conn.close()
                        break
                    conn.close()
                except (OSError, http.client.HTTPException):
                    pass
                if time.monotonic() > deadline or exp.proc.poll() is not None:
                    raise RuntimeError(f"{exp.name} not ready; see {exp.log_path}")
                time.sleep(0.2)
        t0 = time.monotonic()
        clients = [Client(exp, ctx if exp.tls else None, rate, t0) for exp in exporters]
        for c in clients:
            c.start()
        rotate_at = [duration / 3, 2 * duration / 3]
        next_kill = t0 + rng.uniform(*KILL_GAP_S)
        turn = 0
        end = t0 + duration
        while time.monotonic() < end:
            now = time.monotonic()
            if rotate_at and now - t0 >= rotate_at[0]:
                rotate_at.pop(0)
                rotations.append(rotate(exporters[1], tls_dir, len(rotations) + 1, now - t0))
            if now >= next_kill:
                exp = exporters[turn % 2]
                turn += 1
                worker = exp.sampling_worker()
                record: dict[str, Any] = {"t": round(now - t0, 1), "exporter": exp.name}
                if worker is None:
                    record["result"] = "no worker"
                else:
                    try:
                        worker.send_signal(signal.SIGKILL)
                        record.update(pid=worker.pid, result="sent")
                    except psutil.NoSuchProcess:
                        record["result"] = "gone"
                kills.append(record)
                next_kill = now + rng.uniform(*KILL_GAP_S)
            time.sleep(0.2)
        elapsed = time.monotonic() - t0
        for c in clients:
            c.finish()
        for c in clients:
            finals[c.exp.name] = final_counts(c.last_text)
    finally:
        for c in clients:
            c.stop_event.set()
        for exp in exporters:
            codes[exp.name] = exp.stop()
    return report(started, minutes, seed, rate, workdir, elapsed, clients, kills, rotations, finals, codes)


def rotate(exp: Exporter, tls_dir: Path, n: int, t: float) -> dict[str, Any]:
    """A new key and certificate from the run's CA, each file replaced atomically; waits (at most
    60 s) until the exporter serves it."""
    key, crt = make_server_cert(tls_dir, f"server{n}")
    install(key, tls_dir / "server.key")
    install(crt, tls_dir / "server.crt")
    want, t_start = der(crt), time.monotonic()
    served_after = None
    while time.monotonic() - t_start < 60:
        try:
            if served_cert(exp.port) == want:
                served_after = round(time.monotonic() - t_start, 2)
                break
        except OSError:
            pass
        time.sleep(0.5)
    return {"n": n, "t": round(t, 1), "served_after_s": served_after}


def report(
    started: dt.datetime,
    minutes: float,
    seed: int,
    rate: float,
    workdir: Path,
    elapsed: float,
    clients: list[Client],
    kills: list[dict[str, Any]],
    rotations: list[dict[str, Any]],
    finals: dict[str, dict[str, Any]],
    codes: dict[str, int | None],
) -> dict[str, Any]:
    per: dict[str, Any] = {}
    goals: dict[str, dict[str, Any]] = {}

    def goal(name: str, value: Any, target: str, ok: bool) -> None:
        goals[name] = {"value": value, "goal": target, "ok": bool(ok)}

    for c in clients:
        name = c.exp.name
        sent = sum(1 for k in kills if k["exporter"] == name and k["result"] == "sent")
        final = finals.get(name, {})
        restarts = final.get("restarts_by_reason", {})
        non_200 = len(c.non_200)
        per[name] = {
            "requests": sum(c.statuses.values()) + sum(c.errors.values()),
            "answers": dict(c.statuses),
            "non_200_or_error": non_200,
            "connection_errors": dict(c.errors),
            "failures": c.non_200[:50],
            "checks": c.checks,
            "quarantines": c.quarantines,
            "features_lost_on_healthy_gpus": c.lost,
            "checks_with_a_gap": c.gaps,
            "kills_sent": sent,
            **final,
            "exit_code": codes.get(name),
            "log": str(c.exp.log_path),
        }
        goal(f"{name}_non_200", non_200, "0", non_200 == 0)
        goal(f"{name}_quarantines", sorted(c.quarantines), "[]", not c.quarantines)
        goal(f"{name}_features_lost_on_healthy_gpus", sorted(c.lost), "[]", not c.lost and c.checks > 1)
        goal(f"{name}_kills_counted_killed", [restarts.get("killed"), sent], "equal", restarts.get("killed") == sent)
        goal(f"{name}_crash_restarts", restarts.get("crash"), "0", restarts.get("crash") == 0)
        goal(f"{name}_exit_code", codes.get(name), "0", codes.get(name) == 0)
    served = [r["served_after_s"] for r in rotations]
    goal("rotations_served", served, "2 served", len(served) == 2 and all(s is not None for s in served))
    return {
        "benchmark": "soak",
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/soak.py", *sys.argv[1:]]),
        "machine": machine(),
        "versions": versions(),
        "config": {
            "minutes": minutes,
            "seed": seed,
            "rate_per_exporter": rate,
            "scenario": f"h200x8, GPU {HUNG_GPU} {HUNG_FUNCTION} hangs forever",
            "interval_s": 1,
            "kill_gap_s": list(KILL_GAP_S),
            "workdir": str(workdir),
        },
        "duration_s": round(elapsed, 1),
        "requests": sum(p["requests"] for p in per.values()),
        "non_200_or_error": sum(p["non_200_or_error"] for p in per.values()),
        "kills_sent": sum(1 for k in kills if k["result"] == "sent"),
        "exporters": per,
        "rotations": rotations,
        "kills": kills,
        "goals": goals,
        "ok": all(g["ok"] for g in goals.values()),
    }


def summary(r: dict[str, Any]) -> str:
    lines = [
        f"soak {r['date']}: {r['duration_s']:.0f} s, {r['requests']} requests, {r['non_200_or_error']} non-200 or "
        f"errors, {r['kills_sent']} outside SIGKILLs, "
        f"rotations served after {[x['served_after_s'] for x in r['rotations']]} s"
    ]
    for name, p in r["exporters"].items():
        lines.append(
            f"  {name}: {p['requests']} requests {p['answers']}, non-200/errors {p['non_200_or_error']}, "
            f"restarts by reason {p.get('restarts_by_reason')}, kills sent {p['kills_sent']}, "
            f"quarantines {p['quarantines'] or 'none'}, "
            f"features lost on healthy GPUs {sorted(p['features_lost_on_healthy_gpus']) or 'none'}, "
            f"checks with a gap (one check only: a restart) {len(p['checks_with_a_gap'])} of {p['checks']} "
            f"{[g['t'] for g in p['checks_with_a_gap']]}, "
            f"crashes by call {p.get('crashes_by_call_in_flight') or 'none'}, GPU 7 faults {p.get('gpu7_faults')}, "
            f"exit {p['exit_code']}"
        )
    lines.append(
        "goals: " + ", ".join(f"{k} {'ok' if g['ok'] else 'MISSED'} ({g['value']})" for k, g in r["goals"].items())
    )
    lines.append("RESULT: " + ("all goals met" if r["ok"] else "GOAL MISSED"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--minutes", type=float, default=30.0, help="minutes of load, kills and rotations (default 30)")
    p.add_argument("--seed", type=int, default=26, help="seed of the kill schedule (default 26)")
    p.add_argument("--rate", type=float, default=10.0, help="requests per second to each exporter (default 10)")
    p.add_argument("--out", type=Path, help="the JSON result (default bench/results/soak-<date>.json)")
    p.add_argument("--workdir", type=Path, help="scenario, certificates, state files, logs (default: a new temp dir)")
    args = p.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="nvgpu-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    result = run(args.minutes, args.seed, args.rate, workdir)
    out = args.out or ROOT / "bench" / "results" / f"soak-{result['date'][:10]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(summary(result))
    print(f"result: {out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
