"""The HTTP edge: idle and half-sent connections are closed, open connections are capped
with file descriptors kept for the worker, and the Server header names no versions.

Real exporter processes on the fake backend, raw sockets as the clients. The fd test is the
attack from the issue: under a small open-file limit, far more idle connections than descriptors,
then a worker crash: the supervisor must still create the new worker's pipes.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from exporter_proc import Exporter
from waiting import accept_queue, wait_until

from exporter.supervisor.http import httpedge

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def read_all(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes (or ``timeout``)."""
    sock.settimeout(timeout)
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def closed_within(sock: socket.socket, timeout: float) -> bool:
    """True when the server closes the connection within ``timeout`` (EOF or reset)."""
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exporter]:
    tmp = tmp_path_factory.mktemp("edge")
    env = {
        "NVGPU_WEB_HEADER_TIMEOUT_SECONDS": "1",
        "NVGPU_WEB_KEEPALIVE_TIMEOUT_SECONDS": "2",
        "NVGPU_WEB_MAX_CONNECTIONS": "8",
    }
    with Exporter(None, tmp, env=env, args=["--nvml-backend", "fake:h200x1"]) as exp:
        yield exp


def connect(exp: Exporter) -> socket.socket:
    return socket.create_connection(("127.0.0.1", exp.port), timeout=5)


def test_a_connection_that_sends_nothing_is_closed(edge: Exporter) -> None:
    with connect(edge) as s:
        assert closed_within(s, 6)


def test_half_a_header_is_closed_after_the_header_timeout(edge: Exporter) -> None:
    with connect(edge) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        t0 = time.monotonic()
        assert closed_within(s, 6)
        assert time.monotonic() - t0 < 4


def test_slow_bytes_do_not_extend_the_header_timeout(edge: Exporter) -> None:
    """A slowloris that sends one byte every 0.3 s is still cut at the header timeout."""
    with connect(edge) as s:
        t0 = time.monotonic()
        closed = False
        for byte in b"GET /metrics HTTP/1.1\r\nHost: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx":
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.3)
            if time.monotonic() - t0 > 6:
                break
        assert closed or closed_within(s, 3)
        assert time.monotonic() - t0 < 6


def test_an_idle_keep_alive_connection_is_closed_after_the_keepalive_timeout(edge: Exporter) -> None:
    with connect(edge) as s:
        s.sendall(REQUEST)
        s.settimeout(5)
        first = s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        s.sendall(REQUEST)  # still open: a second request works
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        assert closed_within(s, 8)
        assert time.monotonic() - t0 >= 1.5  # the keep-alive timeout (2 s), not the header timeout


def test_a_request_being_served_is_not_cut_by_the_header_timer(edge: Exporter) -> None:
    """Many requests back to back on one connection for longer than the header timeout."""
    with connect(edge) as s:
        s.settimeout(5)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.5:
            s.sendall(REQUEST)
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(0.2)


def test_server_header_names_no_version(edge: Exporter) -> None:
    for raw in (
        REQUEST,
        b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n",
        b"BREW / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x00\x01\r\n\r\n",
    ):
        with connect(edge) as s:
            s.sendall(raw)
            head = read_all(s, 3).split(b"\r\n\r\n", 1)[0].decode("latin-1")
        assert head.startswith("HTTP/1."), (raw, head)
        server = [line for line in head.split("\r\n") if line.lower().startswith("server:")]
        assert server == ["Server: nvgpu-exporter"], (raw, head)
        assert "Python" not in head and "aiohttp" not in head


def test_connections_over_the_cap_get_an_answer_and_the_cap_frees_up(edge: Exporter) -> None:
    """Cap 8 (2 kept free), 8 connections that send nothing, then a request on a ninth: it is
    answered, 503 while the 8 are younger than the eviction grace, else 200 after the one idle
    longest is closed (tests/test_hostile_inputs.py holds each case apart); then the cap frees up."""
    held = [connect(edge) for _ in range(8)]
    try:
        wait_until(lambda: accept_queue(edge.port) == 0, 5, "the 8 connections accepted")
        with connect(edge) as extra:
            extra.sendall(REQUEST)
            answer = read_all(extra, 3)
        assert answer.startswith((b"HTTP/1.1 503", b"HTTP/1.1 200")), answer
        assert b"Server: nvgpu-exporter" in answer
        if answer.startswith(b"HTTP/1.1 503"):
            assert b"too many open connections" in answer
    finally:
        for s in held:
            s.close()
    edge.wait_until(lambda: edge.get("/healthz")[0] == 200, 5, "the cap to free up")
    assert edge.proc.poll() is None


def test_idle_connections_cannot_starve_the_worker_of_descriptors(tmp_path: Path) -> None:
    """The attack: 250 idle connections under a 200-fd limit, then a worker crash."""
    env = {"NVGPU_WEB_HEADER_TIMEOUT_SECONDS": "60", "NVGPU_WEB_KEEPALIVE_TIMEOUT_SECONDS": "60"}
    prefix = ["prlimit", "--nofile=200:200"]
    with Exporter(None, tmp_path, env=env, args=["--nvml-backend", "fake:h200x1"], command_prefix=prefix) as exp:
        exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, what="first sample")
        supervisor = psutil.Process(exp.proc.pid)
        if supervisor.name().startswith("prlimit"):  # prlimit execs, normally
            supervisor = supervisor.children()[0]
        assert supervisor.rlimit(psutil.RLIMIT_NOFILE)[0] == 200
        held = []
        try:
            for _ in range(250):
                try:
                    held.append(connect(exp))
                except OSError:
                    break
            wait_until(lambda: accept_queue(exp.port) == 0, 10, "every connection accepted or refused")
            cap = 200 - httpedge.FD_HEADROOM
            assert supervisor.num_fds() <= cap + 40, supervisor.num_fds()
            workers = [p for p in supervisor.children() if "exporter.worker" in " ".join(p.cmdline())]
            assert workers
            os.kill(workers[0].pid, signal.SIGKILL)
            wait_until(
                lambda: [
                    p
                    for p in supervisor.children()
                    if p.pid != workers[0].pid and "exporter.worker" in " ".join(p.cmdline())
                ],
                10,
                "a new worker while the connections are held",
                exp.logs,
                retry_on=(OSError, psutil.Error),
            )
            for s in held:  # free the connections so the scrape below gets through
                s.close()
            held = []
            scrape = exp.wait_for(
                lambda s: s.value("nvgpu_worker_restarts_total", reason="killed") == 1.0 and s.value("nvgpu_up") == 1.0,
                timeout=30,
                what="a new worker after the crash",
            )
            assert scrape.value("nvgpu_http_connections_max") == cap
            # the connections past the cap: the ones idle longest closed to make room (none was serving)
            assert (scrape.value("nvgpu_http_connections_dropped_total", reason="evicted") or 0) >= 250 - cap
            assert exp.proc.poll() is None
        finally:
            for s in held:
                s.close()
        assert exp.terminate() == 0


def test_connection_cap_keeps_the_headroom() -> None:
    assert httpedge.connection_cap(1024, 1_048_576) == 1024
    assert httpedge.connection_cap(1024, 200) == 200 - httpedge.FD_HEADROOM
    assert httpedge.connection_cap(1024, 10) == httpedge.MIN_CONNECTIONS
