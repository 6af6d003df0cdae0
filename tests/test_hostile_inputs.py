"""On the real exporter: nothing an operator's file, a client or a signal does freezes,
starves or misleads it.

Real exporter processes (supervisor + worker on the fake backend). Files are made hostile the way
an operator or a node makes them: a FIFO or a device node where a file should be, a hung mount
(``tests/faultinject.py`` ``hung_mount``: ``open``/``stat`` under a directory block while a flag
file exists), a cost-31 bcrypt hash; clients hold the connection cap full or guess passwords; a
SIGTERM arrives while a bcrypt runs (``slow_bcrypt``).
"""

from __future__ import annotations

import base64
import http.client
import os
import shutil
import signal
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from exporter_proc import SCENARIOS, Exporter, Scrape, load_scenario, write_scenario
from fakeproc import Container, make_proc
from tls_material import PASSWORD, USER, Material, bcrypt_hash, make_material
from waiting import accept_queue, wait_until

COST_31 = "$2b$31$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy"
H200X1 = ["--nvml-backend", "fake:h200x1"]
HEAVY = "127.0.0.2"  # the client holding the cap full: another loopback address, as another pod's would be


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Material:
    return make_material(tmp_path_factory.mktemp("tls"))


def tls_web_config(tls: Material, directory: Path, users: str = "") -> Path:
    """A web config serving TLS from its own copies of the server certificate and key."""
    for name in ("server.crt", "server.key"):
        shutil.copy(tls.dir / name, directory / name)
    path = directory / "web-config.yml"
    path.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n" + users)
    return path


def https(exp: Exporter, tls: Material, path: str = "/healthz", timeout: float = 5.0) -> int:
    conn = http.client.HTTPSConnection("127.0.0.1", exp.port, context=tls.client_context(cert=None), timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def basic(user: str = USER, password: str = PASSWORD) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def keep_answering(exp: Exporter, probe: object, seconds: float) -> list[int]:
    """Probe every 0.2 s for ``seconds`` (the point: a window in which nothing may freeze)."""
    statuses = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        statuses.append(probe())  # type: ignore[operator]
        time.sleep(0.2)  # the point: the exporter must answer all through this window
    return statuses


# -- files -----------------------------------------------------------------------------------------


def test_a_key_file_replaced_by_a_fifo_keeps_the_exporter_serving(tls: Material, tmp_path: Path) -> None:
    """The issue: the reload ran open() of the FIFO on the event loop, every probe failed, and it
    stayed frozen after the good key was back. Now the reload refuses the FIFO at once, the probes
    answer throughout, the reload metric says 0, and the good key loads again."""
    env = {"NVGPU_WEB_CONFIG_FILE": str(tls_web_config(tls, tmp_path))}
    with Exporter(None, tmp_path, env=env, args=H200X1, https=tls.client_context(cert=None)) as exp:
        assert https(exp, tls) == 200
        key = (tmp_path / "server.key").read_bytes()
        os.unlink(tmp_path / "server.key")
        os.mkfifo(tmp_path / "server.key")
        exp.wait_for(lambda s: s.value("nvgpu_web_config_last_reload_successful") == 0.0, what="the reload refused")
        assert set(keep_answering(exp, lambda: https(exp, tls), 3.0)) == {200}
        scrape = exp.scrape()
        assert scrape.value("nvgpu_file_read_failures_total", file="web_config", reason="not_regular") == 1.0
        os.unlink(tmp_path / "server.key")
        (tmp_path / "server.key").write_bytes(key)
        exp.wait_for(lambda s: s.value("nvgpu_web_config_last_reload_successful") == 1.0, what="the good key again")
        refused = [r for r in exp.log_records() if "does not load" in r.get("msg", "")]
        assert len(refused) == 1 and "is a FIFO, not a regular file" in refused[0]["msg"], refused
        assert exp.terminate() == 0


def test_a_key_file_on_a_hung_mount_keeps_the_exporter_serving(tls: Material, tmp_path: Path) -> None:
    """The certificate directory stops answering (stat and open sleep in the kernel): the look at
    the files is abandoned after its deadline, counted and logged once, the reload metric says 0,
    probes and scrapes answer throughout, SIGTERM works; when the mount answers, a rotation loads."""
    certs = tmp_path / "certs"
    certs.mkdir()
    flag = tmp_path / "hung"
    env = {
        "NVGPU_WEB_CONFIG_FILE": str(tls_web_config(tls, certs)),
        "FAULT_HUNG_DIR": str(certs),
        "FAULT_HUNG_FLAG": str(flag),
    }
    context = tls.client_context(cert=None)
    with Exporter(None, tmp_path, env=env, args=H200X1, https=context, fault="hung_mount") as exp:
        assert https(exp, tls) == 200
        flag.touch()  # the mount hangs
        exp.wait_for(
            lambda s: s.value("nvgpu_file_read_failures_total", file="web_config", reason="timeout") == 1.0,
            timeout=30,
            what="the look at the files abandoned",
        )
        assert exp.scrape().value("nvgpu_web_config_last_reload_successful") == 0.0
        assert set(keep_answering(exp, lambda: https(exp, tls), 2.0)) == {200}
        flag.unlink()  # the mount answers again: a rotation loads
        os.utime(certs / "server.key")
        exp.wait_for(lambda s: s.value("nvgpu_web_config_last_reload_successful") == 1.0, what="a reload again")
        stuck = [r for r in exp.log_records() if "did not finish within" in r.get("msg", "")]
        assert len(stuck) == 1, stuck
        assert exp.terminate() == 0


def test_a_cost_31_hash_in_a_rotation_is_refused_and_the_old_users_kept(tls: Material, tmp_path: Path) -> None:
    """A rotation to a $2b$31$ hash (one wrong password would hold a core for days): refused at
    load with the reason, the previous users keep logging in, the reload metric says 0."""
    path = tls_web_config(tls, tmp_path, f"basic_auth_users:\n  {USER}: {bcrypt_hash()}\n")
    env = {"NVGPU_WEB_CONFIG_FILE": str(path)}
    with Exporter(None, tmp_path, env=env, args=H200X1, https=tls.client_context(cert=None)) as exp:
        assert exp.get("/metrics", basic())[0] == 200
        text = path.read_text()
        path.write_text(text.replace(text.splitlines()[-1], f"  {USER}: {COST_31}"))
        wait_until(lambda: scrape_as_user(exp).value("nvgpu_web_config_last_reload_successful") == 0.0, 20, "refused")
        assert exp.get("/metrics", basic())[0] == 200, "the old users still log in"
        assert any("bcrypt cost 31 is above 14" in r.get("msg", "") for r in exp.log_records())
        assert exp.terminate() == 0


def scrape_as_user(exp: Exporter) -> Scrape:
    status, _, body = exp.get("/metrics", basic())
    assert status == 200, status
    return Scrape(body.decode())


def test_a_fifo_state_file_neither_hangs_the_start_nor_is_replaced(tmp_path: Path) -> None:
    """The issue: a FIFO state file hung the start. Now the start goes on with the quarantine in
    memory (a crash loop still quarantines the feature) and the FIFO is never replaced."""
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)
    with Exporter(SCENARIOS / "h200x2-nvlink-crash.json", tmp_path, env={"NVGPU_STATE_FILE": str(fifo)}) as exp:
        scrape = exp.wait_for(
            lambda s: s.value("nvgpu_feature_enabled", feature="nvlink_throughput", reason="quarantined") == 0.0,
            timeout=40,
            what="nvlink_throughput quarantined in memory",
        )
        assert scrape.value("nvgpu_file_read_failures_total", file="state_file", reason="not_regular") == 1.0
        assert exp.get("/healthz")[0] == 200
        assert exp.terminate() == 0
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and not list(tmp_path.glob(".state-*"))


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_a_device_node_state_file_is_never_replaced(tmp_path: Path) -> None:
    """NVGPU_STATE_FILE pointing at a null device (a node made here, 1:3 like /dev/null, so that
    a regression replaces this one and not the machine's): refused by --check-config (tested in
    tests/test_check_config_bounds.py), and at run time a crash loop is quarantined in memory while
    the node stays a device node."""
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    with Exporter(SCENARIOS / "h200x2-nvlink-crash.json", tmp_path, env={"NVGPU_STATE_FILE": str(node)}) as exp:
        exp.wait_for(
            lambda s: s.value("nvgpu_feature_enabled", feature="nvlink_throughput", reason="quarantined") == 0.0,
            timeout=40,
            what="nvlink_throughput quarantined in memory",
        )
        assert exp.terminate() == 0
    assert stat.S_ISCHR(os.lstat(node).st_mode)
    assert any("is a character device 1:3, not a regular file" in r.get("msg", "") for r in exp.log_records())


def test_a_proc_file_that_would_block_never_marks_the_gpu_hung(tmp_path: Path) -> None:
    """The worker resolves GPU processes in /proc on the GPU's sampling thread: a /proc/<pid>/comm
    that would block a plain open() (a FIFO in the tree) used to hang the GPU until its deadline.
    Now that pid goes unnamed, the other process is named, and the GPU keeps fresh samples."""
    gib = 1 << 30
    scenario = load_scenario("h200x1")
    values = scenario["gpus"][0]["values"]
    values["nvmlDeviceGetComputeRunningProcesses_v3"] = [
        {"pid": pid, "usedGpuMemory": gib, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF}
        for pid in (101, 202)
    ]
    values["nvmlDeviceGetProcessUtilization"] = {"per_process": {"smUtil": 50}}
    proc = make_proc(tmp_path / "proc", {101: ("python3", Container("ml", "a", "main")), 202: ("stuck", None)})
    (proc / "202" / "comm").unlink()
    os.mkfifo(proc / "202" / "comm")
    env = {
        "NVGPU_PROC_PATH": str(proc),
        "NVGPU_CONTAINER_LOG_DIR": str(tmp_path / "no-containers"),
        "NVGPU_POD_RESOURCES_SOCKET": str(tmp_path / "no-kubelet.sock"),
        "NVGPU_FEATURE_PROCESS_USAGE": "on",
    }
    with Exporter(write_scenario(tmp_path, scenario), tmp_path, env=env) as exp:
        scrape = exp.wait_samples(6)
        names = {s.labels["pid"]: s.labels["process"] for s in scrape.find("nvgpu_process_memory_used_bytes", gpu="0")}
        assert names == {"101": "python3", "202": ""}, names
        assert scrape.value("nvgpu_device_up", gpu="0") == 1.0 and scrape.value("nvgpu_up") == 1.0
        assert not [r for r in exp.log_records() if "hung" in r.get("msg", "").lower()]
        assert exp.terminate() == 0


# -- clients ---------------------------------------------------------------------------------------


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Exporter]:
    env = {
        "NVGPU_WEB_MAX_CONNECTIONS": "16",
        "NVGPU_WEB_HEADER_TIMEOUT_SECONDS": "10",
        "NVGPU_WEB_KEEPALIVE_TIMEOUT_SECONDS": "120",
    }
    with Exporter(None, tmp_path, env=env, args=H200X1) as exp:
        yield exp


class CapHolder:
    """One client (its own address, as another pod is) that keeps far more connections than the
    cap open, re-opening every one the server closes (a 503 included) as fast as it can: half
    kept alive after one request, half never sending a byte."""

    def __init__(self, port: int, want: int) -> None:
        self.port, self.want = port, want
        self.stop = threading.Event()
        self.opened = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, keep_alive: bool) -> socket.socket | None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=2, source_address=(HEAVY, 0))
            if keep_alive:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                s.recv(4096)
            s.setblocking(False)
            self.opened += 1
            return s
        except OSError:
            return None

    def _run(self) -> None:
        held: list[socket.socket] = []
        while not self.stop.is_set():
            alive = []
            for s in held:  # a socket the server closed reads EOF (or is reset)
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
            while len(held) < self.want and not self.stop.is_set():
                s = self._open(keep_alive=len(held) % 2 == 0)
                if s is None:
                    break
                held.append(s)
            time.sleep(0.01)  # the point: re-open as fast as the server closes
        for s in held:
            s.close()


def test_one_client_holding_the_cap_full_cannot_starve_probes_and_scrapes(capped: Exporter) -> None:
    """The issue: one client re-opening idle connections kept the cap full and /healthz answered
    503 for 59 of 60 seconds. Now that client's own idle connections are closed to keep a share of
    the cap free: every probe and scrape (from another address, as the kubelet's and Prometheus's
    are) answers 200 for 10 s while the client tries to hold 40 connections at a cap of 16."""
    capped.wait_for(lambda s: s.value("nvgpu_up") == 1.0, what="first sample")
    holder = CapHolder(capped.port, want=40)
    holder.thread.start()
    try:
        wait_until(lambda: holder.opened >= 40, 20, "the client to fill the cap")
        statuses = keep_answering(capped, lambda: (capped.get("/healthz")[0], capped.get("/metrics")[0]), 10.0)
    finally:
        holder.stop.set()
        holder.thread.join(10)
    assert statuses and set(statuses) == {(200, 200)}, statuses
    scrape = capped.scrape()
    assert (scrape.value("nvgpu_http_connections_dropped_total", reason="evicted") or 0) >= 40 - 16
    assert holder.opened > 40, "the client kept re-opening what was closed"
    assert capped.terminate() == 0


def test_near_the_cap_the_connection_idle_longest_is_closed_first(capped: Exporter) -> None:
    """Cap 16, 2 kept free: one client (127.0.0.2) opens 16 connections that send nothing, then
    another (127.0.0.1) sends a request. It is answered 200: the first client's oldest connections
    were closed to make room (counted evicted), its newest is still open."""
    capped.wait_for(lambda s: s.value("nvgpu_up") == 1.0, what="first sample")
    held = [
        socket.create_connection(("127.0.0.1", capped.port), timeout=5, source_address=(HEAVY, 0)) for _ in range(16)
    ]
    try:
        wait_until(lambda: accept_queue(capped.port) == 0, 5, "the 16 connections accepted")
        with socket.create_connection(("127.0.0.1", capped.port), timeout=5) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            extra.settimeout(5)
            assert extra.recv(4096).startswith(b"HTTP/1.1 200")
        held[0].settimeout(5)
        try:
            assert held[0].recv(1) == b"", "the oldest idle connection is closed (EOF)"
        except ConnectionResetError:
            pass  # closed with a reset: as good
        held[-1].setblocking(False)
        with pytest.raises(BlockingIOError):
            held[-1].recv(1)  # still open: nothing to read, no EOF
    finally:
        for s in held:
            s.close()
    wait_until(
        lambda: (capped.scrape().value("nvgpu_http_connections_dropped_total", reason="evicted") or 0) >= 1,
        10,
        "the eviction counted",
    )
    assert capped.terminate() == 0


def test_a_cap_full_of_requests_being_served_still_gets_503(tls: Material, tmp_path: Path) -> None:
    """Only connections that serve a request are never closed: when every slot of the cap is
    one (eight clients, each with a request waiting for a slow bcrypt), a new connection gets the 503."""
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  {USER}: {bcrypt_hash()}\n")
    env = {"NVGPU_WEB_CONFIG_FILE": str(path), "NVGPU_WEB_MAX_CONNECTIONS": "8"}
    with Exporter(None, tmp_path, env=env, args=H200X1, fault="slow_bcrypt") as exp:
        busy = []
        for i in range(8):
            s = socket.create_connection(("127.0.0.1", exp.port), timeout=5, source_address=(f"127.0.1.{i + 1}", 0))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + _auth_line(USER, "slow") + b"\r\n")
            busy.append(s)
        try:  # once all eight are being served, nothing can be closed to make room
            wait_until(lambda: _healthz(exp.port) == b"HTTP/1.1 503", 20, "a 503 with eight requests in progress")
        finally:
            for s in busy:
                s.close()
        assert exp.terminate() == 0, "SIGTERM with eight requests waiting for bcrypt"


def _auth_line(user: str, password: str) -> bytes:
    return b"Authorization: Basic " + base64.b64encode(f"{user}:{password}".encode()) + b"\r\n"


def _healthz(port: int) -> bytes:
    """The status line of /healthz on a fresh raw connection (urllib would retry or raise)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        s.settimeout(5)
        return s.recv(4096)[:12]


def test_wrong_passwords_are_limited_per_client_and_good_ones_never_wait(tmp_path: Path) -> None:
    """A guesser gets 401 five times, then 429 with Retry-After, without a bcrypt; credentials
    verified before (Prometheus's, from the same address) are answered 200 all along."""
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  {USER}: {bcrypt_hash()}\n")
    with Exporter(None, tmp_path, env={"NVGPU_WEB_CONFIG_FILE": str(path)}, args=H200X1) as exp:
        assert exp.get("/metrics", basic())[0] == 200  # verified once: cached
        answers = []
        for i in range(8):
            status, headers, _ = exp.get("/metrics", basic(password=f"guess-{i}"))
            answers.append(status)
            assert exp.get("/metrics", basic())[0] == 200, "good credentials are never limited"
        assert answers[:5] == [401] * 5 and set(answers[5:]) == {429}, answers
        assert int(headers["Retry-After"]) >= 1
        wait_until(  # counters show at the next rendering (at most 5 s)
            lambda: (scrape_as_user(exp).value("nvgpu_http_requests_denied_total", reason="failed_logins") or 0) >= 3,
            10,
            "the refusals counted",
        )
        assert exp.terminate() == 0


def test_sigterm_is_honoured_while_a_bcrypt_runs(tmp_path: Path) -> None:
    """The issue: with a cost-31 hash, SIGTERM no longer ended the process (the bcrypt ran on the
    loop's default executor, which asyncio.run joins). A bcrypt that takes an hour is in progress:
    SIGTERM ends the exporter with 0 within the shutdown timeout, and no worker is left."""
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  {USER}: {bcrypt_hash()}\n")
    started = tmp_path / "bcrypt-started"
    env = {
        "NVGPU_WEB_CONFIG_FILE": str(path),
        "NVGPU_SHUTDOWN_TIMEOUT_SECONDS": "5",
        "FAULT_BCRYPT_STARTED": str(started),
    }
    with Exporter(None, tmp_path, env=env, args=H200X1, fault="slow_bcrypt") as exp:
        exp.wait_worker()
        s = socket.create_connection(("127.0.0.1", exp.port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + _auth_line(USER, "slow") + b"\r\n")
        exp.wait_until(lambda: started.exists(), 10, "the bcrypt to start")
        t0 = time.monotonic()
        exp.proc.send_signal(signal.SIGTERM)
        assert exp.proc.wait(timeout=30) == 0
        took = time.monotonic() - t0
        s.close()
    assert took < 5 + 3, f"exit {took:.1f} s after SIGTERM"
