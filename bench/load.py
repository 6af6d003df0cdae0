"""Load generator and process-tree sampler for ``/metrics`` benchmarks (loopback only).

Reusable by ``bench/bench.py`` and ``bench/peer.py``, and runnable on its own
against any exporter already listening on 127.0.0.1::

    python bench/load.py --url http://127.0.0.1:19400/metrics --pid 1234 \
        --sequential 1000 --concurrency 1000 --rounds 3 --idle-seconds 30

Prints one JSON dict. Dependencies: the standard library, ``aiohttp`` (client) and ``psutil``.

What is measured
----------------
* **Sequential latency** (:func:`sequential`): N requests one after the other over one keep-alive
  connection (as a Prometheus server scrapes), after a few warm-up requests that are not counted.
  Latency is from sending the request to having read the whole body.
* **Concurrent latency** (:func:`concurrent`): C requests started together, each on its own TCP
  connection (``TCPConnector(limit=0, force_close=True)``), each with a total timeout (60 s by
  default). Reports successes (200), other statuses, timeouts, connection errors, and p50/p99/max
  over the requests that got an answer (any status). The client runs in this process's one event
  loop: on a small machine it competes with the server for CPU, which is part of what a 2-core
  node sees.
* **CPU and RSS of a process tree** (:class:`ProcTreeSampler`): the given PID and all its
  descendants (re-enumerated every tick, so a restarted worker is picked up), sampled in a thread.
  CPU is user+system seconds per wall second (1.0 = one core busy); RSS is summed over the tree per
  tick (shared pages count once per process, as ``ps`` shows them); USS/PSS are added where
  ``/proc/<pid>/smaps`` is readable.

Bodies are read but not decompressed (``auto_decompress=False``): the client measures the server,
not its own gunzip. By default requests ask for no compression (``Accept-Encoding: identity``) and
no Accept header (text format); ``--prometheus-headers`` sends what a Prometheus 3 server sends.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import math
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import psutil

DEFAULT_TIMEOUT_S = 60.0

# What a Prometheus 3 server sends when scraping (default scrape_protocols), plus gzip.
PROMETHEUS3_HEADERS = {
    "Accept": (
        "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
        "application/openmetrics-text;version=0.0.1;q=0.5,"
        "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
        "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
    ),
    "Accept-Encoding": "gzip",
    "User-Agent": "Prometheus/3.0.0",
}
PLAIN_HEADERS = {"Accept-Encoding": "identity", "User-Agent": "nvgpu-bench/1"}


# -- helpers ---------------------------------------------------------------------------------------


def check_loopback(url: str) -> None:
    """Refuse anything but a loopback target: this tool opens thousands of connections.

    Raises:
        ValueError: the URL's host is not 127.0.0.0/8, ::1 or localhost.
    """
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ValueError(f"{url}: only loopback targets (127.0.0.1, ::1) are allowed")


def raise_nofile(needed: int) -> dict[str, int]:
    """Raise RLIMIT_NOFILE so that ``needed`` descriptors fit; children inherit it.

    The soft limit goes up to ``needed`` (never down); the hard limit too when allowed (root).

    Returns:
        ``{"soft": …, "hard": …}`` after the change.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft, needed)
    if hard != resource.RLIM_INFINITY and want > hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            soft, hard = want, want
        except (ValueError, OSError):
            want = hard
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {"soft": int(soft), "hard": int(hard)}


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None if empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summarize_ms(latencies_s: Sequence[float]) -> dict[str, float | int | None]:
    """count, min, p50, p90, p99, max, mean of latencies, in milliseconds (3 decimals)."""
    values = sorted(v * 1000.0 for v in latencies_s)

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 3)

    return {
        "count": len(values),
        "min_ms": r(values[0] if values else None),
        "p50_ms": r(percentile(values, 50)),
        "p90_ms": r(percentile(values, 90)),
        "p99_ms": r(percentile(values, 99)),
        "max_ms": r(values[-1] if values else None),
        "mean_ms": r(sum(values) / len(values) if values else None),
    }


# -- HTTP load -------------------------------------------------------------------------------------


async def fetch(
    session: aiohttp.ClientSession,
    url: str,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> tuple[int, bytes]:
    """One GET; returns (status, body). Raises on timeouts and connection errors."""
    async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        body = await resp.read()
        return resp.status, body


async def sequential(
    url: str,
    n: int,
    headers: Mapping[str, str] | None = None,
    warmup: int = 10,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    keepalive: bool = True,
) -> dict[str, Any]:
    """``n`` requests one after another (after ``warmup`` uncounted ones).

    Args:
        url: loopback URL.
        n: counted requests.
        headers: request headers (default :data:`PLAIN_HEADERS`).
        warmup: requests sent first and not counted (connection set-up, first gzip, caches).
        timeout_s: per-request total timeout.
        keepalive: one reused connection (as Prometheus scrapes) or a new one per request.
    """
    check_loopback(url)
    headers = dict(PLAIN_HEADERS if headers is None else headers)
    connector = aiohttp.TCPConnector(limit=1, force_close=not keepalive)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    errors: dict[str, int] = {}
    size = 0
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        for i in range(warmup + n):
            t0 = time.perf_counter()
            try:
                status, body = await fetch(session, url, headers, timeout_s)
            except Exception as exc:  # noqa: BLE001 - counted by type
                if i >= warmup:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                continue
            dt = time.perf_counter() - t0
            if i < warmup:
                continue
            latencies.append(dt)
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            size = len(body)
    return {
        "requests": n,
        "warmup": warmup,
        "keepalive": keepalive,
        "headers": headers,
        "ok": statuses.get("200", 0),
        "statuses": statuses,
        "errors": errors,
        "body_bytes": size,
        "latency": summarize_ms(latencies),
    }


class _RawGet(asyncio.Protocol):
    """A bare HTTP/1.1 GET with ``Connection: close``: status line parsed, body bytes counted."""

    def __init__(self, request: bytes, done: asyncio.Future[tuple[int, int]]) -> None:
        self.request = request
        self.done = done
        self.head = b""
        self.status: int | None = None
        self.size = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.size += len(data)
        if self.status is None:
            self.head += data
            end = self.head.find(b"\r\n")
            if end >= 0:
                self.status = int(self.head[:end].split(b" ", 2)[1])
                self.head = b""

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done.done():
            return
        if self.status is None:
            self.done.set_exception(exc or ConnectionResetError("closed before a status line"))
        else:
            self.done.set_result((self.status, self.size))


async def _raw_fetch(host: str, port: int, request: bytes, timeout_s: float) -> tuple[int, int]:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[tuple[int, int]] = loop.create_future()
    transport, _ = await asyncio.wait_for(loop.create_connection(lambda: _RawGet(request, done), host, port), timeout_s)
    try:
        return await asyncio.wait_for(done, timeout_s)
    finally:
        transport.close()


async def _go_at(go: asyncio.Event, start_at: float | None) -> float:
    """Release every waiting request at wall-clock ``start_at`` (now if None or past); returns the
    lateness in seconds (a child process that started after ``start_at``)."""
    await asyncio.sleep(0)  # every task is now waiting on `go`
    late = 0.0
    if start_at is not None:
        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            late = -delay
    go.set()
    return late


async def concurrent(
    url: str,
    c: int,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    client: str = "aiohttp",
    start_at: float | None = None,
    keep_latencies: bool = False,
) -> dict[str, Any]:
    """``c`` requests at once, each on its own connection, each with a ``timeout_s`` total timeout.

    Args:
        client: ``aiohttp`` (``TCPConnector(limit=0, force_close=True)``; the reference) or ``raw``
            (an asyncio Protocol sending a fixed GET: about half the CPU per request, to tell the
            load generator's own CPU cost from the server's on a small machine). The raw client's
            timeout covers connect and response separately; ``body_bytes`` includes the headers.
        start_at: wall-clock time (``time.time()``) to fire at, so several processes fire together
            (:func:`concurrent_procs`).
        keep_latencies: also return every latency (``latencies_s``), for merging.

    Returns:
        requests, ok (200), non_200, timeouts, errors (by exception type), success_rate,
        latency summary over requests that got a response, wall_s (first start to last end),
        body_bytes (of a 200 response).
    """
    check_loopback(url)
    headers = dict(PLAIN_HEADERS if headers is None else headers)
    raise_nofile(c + 256)
    if client == "raw":
        return await _concurrent_raw(url, c, headers, timeout_s, start_at, keep_latencies)
    if client != "aiohttp":
        raise ValueError(f"client {client!r}: expected aiohttp or raw")
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    errors: dict[str, int] = {}
    timeouts = 0
    size = 0
    go = asyncio.Event()

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal timeouts, size
        await go.wait()
        t0 = time.perf_counter()
        try:
            status, body = await fetch(session, url, headers, timeout_s)
        except asyncio.TimeoutError:
            timeouts += 1
            return
        except Exception as exc:  # noqa: BLE001 - counted by type
            name = type(exc).__name__
            errors[name] = errors.get(name, 0) + 1
            return
        latencies.append(time.perf_counter() - t0)
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        if status == 200:
            size = len(body)

    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        tasks = [asyncio.ensure_future(one(session)) for _ in range(c)]
        late = await _go_at(go, start_at)
        t0 = time.perf_counter()
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    out = _concurrent_result("aiohttp", c, statuses, timeouts, errors, timeout_s, wall, size, latencies)
    out["late_start_s"] = round(late, 3)
    if keep_latencies:
        out["latencies_s"] = latencies
    return out


def _concurrent_result(
    client: str,
    c: int,
    statuses: dict[str, int],
    timeouts: int,
    errors: dict[str, int],
    timeout_s: float,
    wall: float,
    size: int,
    latencies: list[float],
) -> dict[str, Any]:
    ok = statuses.get("200", 0)
    return {
        "client": client,
        "requests": c,
        "ok": ok,
        "non_200": sum(v for k, v in statuses.items() if k != "200"),
        "statuses": statuses,
        "timeouts": timeouts,
        "errors": errors,
        "success_rate": round(ok / c, 4) if c else None,
        "timeout_s": timeout_s,
        "wall_s": round(wall, 3),
        "body_bytes": size,
        "latency": summarize_ms(latencies),
    }


async def concurrent_procs(
    url: str,
    c: int,
    procs: int,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    client: str = "aiohttp",
) -> dict[str, Any]:
    """:func:`concurrent` spread over ``procs`` client processes that fire at the same instant.

    Still ``c`` connections, each its own, each with one request; only the client's CPU is spread,
    so that on a machine with cores to spare the server, not the one-core Python client, is what is
    measured. ``procs <= 1`` is :func:`concurrent` in this process. The processes are started with
    this Python, fire at a common wall-clock time 2 s later (``late_start_s`` says if one missed it)
    and their latencies are merged; ``wall_s`` is the longest process's.
    """
    check_loopback(url)
    if procs <= 1:
        return await concurrent(url, c, headers, timeout_s, client)
    headers = dict(PLAIN_HEADERS if headers is None else headers)
    counts = [n for n in (c // procs + (1 if i < c % procs else 0) for i in range(procs)) if n]
    start_at = time.time() + 2.0 + 0.05 * len(counts)
    children = []
    for n in counts:
        spec = json.dumps(
            {"url": url, "c": n, "headers": headers, "timeout_s": timeout_s, "client": client, "start_at": start_at}
        )
        children.append(
            await asyncio.create_subprocess_exec(
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                spec,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        )
    outs = await asyncio.gather(*(ch.communicate() for ch in children))
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    errors: dict[str, int] = {}
    failures: list[str] = []
    timeouts = size = 0
    wall = late = 0.0
    for (stdout, stderr), n in zip(outs, counts, strict=True):
        try:
            r = json.loads(stdout)
        except ValueError:
            errors["ClientProcessFailed"] = errors.get("ClientProcessFailed", 0) + n
            failures.append(stderr.decode("utf-8", "replace")[-500:])
            continue
        latencies += r["latencies_s"]
        for k, v in r["statuses"].items():
            statuses[k] = statuses.get(k, 0) + v
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
        timeouts += r["timeouts"]
        size = r["body_bytes"] or size
        wall = max(wall, r["wall_s"])
        late = max(late, r.get("late_start_s", 0.0))
    out = _concurrent_result(client, c, statuses, timeouts, errors, timeout_s, wall, size, latencies)
    out["client_procs"] = len(counts)
    out["late_start_s"] = round(late, 3)
    if failures:
        out["client_failures"] = failures
    return out


async def _concurrent_raw(
    url: str,
    c: int,
    headers: Mapping[str, str],
    timeout_s: float,
    start_at: float | None = None,
    keep_latencies: bool = False,
) -> dict[str, Any]:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 80
    lines = [
        f"GET {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode()
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    errors: dict[str, int] = {}
    timeouts = 0
    size = 0
    go = asyncio.Event()

    async def one() -> None:
        nonlocal timeouts, size
        await go.wait()
        t0 = time.perf_counter()
        try:
            status, n = await _raw_fetch(host, port, request, timeout_s)
        except asyncio.TimeoutError:
            timeouts += 1
            return
        except Exception as exc:  # noqa: BLE001 - counted by type
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            return
        latencies.append(time.perf_counter() - t0)
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        if status == 200:
            size = n

    tasks = [asyncio.ensure_future(one()) for _ in range(c)]
    late = await _go_at(go, start_at)
    t0 = time.perf_counter()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    out = _concurrent_result("raw", c, statuses, timeouts, errors, timeout_s, wall, size, latencies)
    out["late_start_s"] = round(late, 3)
    if keep_latencies:
        out["latencies_s"] = latencies
    return out


# -- processes -------------------------------------------------------------------------------------


def default_role(proc: psutil.Process, root_pid: int) -> str:
    """``root`` for the given PID, ``child`` for its descendants."""
    return "root" if proc.pid == root_pid else "child"


class ProcTreeSampler:
    """Samples CPU time and RSS of a process and its descendants in a background thread.

    Args:
        pid: root of the tree.
        interval_s: tick length.
        role: names each process (e.g. ``supervisor`` / ``worker``); default :func:`default_role`.

    Use as a context manager or with :meth:`start` / :meth:`stop`; :meth:`stop` returns the summary.
    """

    def __init__(
        self, pid: int, interval_s: float = 0.5, role: Callable[[psutil.Process, int], str] = default_role
    ) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.role = role
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._procs: dict[tuple[int, float], dict[str, Any]] = {}  # (pid, create_time) -> record
        self._handles: dict[tuple[int, float], psutil.Process] = {}
        self._totals: list[int] = []
        self._role_totals: dict[str, list[int]] = {}
        self._t0 = 0.0
        self._t1 = 0.0
        self._wall0 = 0.0
        self._sys0: Any = None
        self._sys1: Any = None
        self._self0: Any = None
        self._self1: Any = None

    def _tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _tick(self) -> None:
        total = 0
        per_role: dict[str, int] = {}
        for p in self._tree():
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    cpu = p.cpu_times()
                    cpu_s = float(cpu.user + cpu.system)
                    rss = int(p.memory_info().rss)
                    rec = self._procs.get(key)
                    if rec is None:
                        existed = key[1] <= self._wall0
                        rec = {
                            "pid": p.pid,
                            "role": self.role(p, self.pid),
                            "cmd": " ".join(p.cmdline())[:200],
                            "cpu_base_s": cpu_s if existed else 0.0,
                            "cpu_last_s": cpu_s,
                            "rss_first": rss,
                            "rss_last": rss,
                            "rss_max": rss,
                            "threads": p.num_threads(),
                        }
                        self._procs[key] = rec
                        self._handles[key] = p
                    rec["cpu_last_s"] = cpu_s
                    rec["rss_last"] = rss
                    rec["rss_max"] = max(rec["rss_max"], rss)
                    rec["threads"] = max(rec["threads"], p.num_threads())
                    total += rss
                    per_role[rec["role"]] = per_role.get(rec["role"], 0) + rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        self._totals.append(total)
        for role, rss in per_role.items():
            self._role_totals.setdefault(role, []).append(rss)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._tick()

    def start(self) -> ProcTreeSampler:
        """Take the baseline and start ticking."""
        self._wall0 = time.time()
        self._t0 = time.monotonic()
        self._sys0 = psutil.cpu_times()
        self._self0 = psutil.Process().cpu_times()
        self._tick()
        self._thread = threading.Thread(target=self._run, name="proc-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        """Stop, take a last tick, and summarise the window."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._tick()
        self._t1 = time.monotonic()
        self._sys1 = psutil.cpu_times()
        self._self1 = psutil.Process().cpu_times()
        return self.summary()

    def __enter__(self) -> ProcTreeSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if not self._stop.is_set():
            self.stop()

    def summary(self) -> dict[str, Any]:
        window = max(self._t1 - self._t0, 1e-9)
        procs = []
        roles: dict[str, dict[str, Any]] = {}
        for key, rec in self._procs.items():
            cpu_s = rec["cpu_last_s"] - rec["cpu_base_s"]
            mem = _uss_pss(self._handles[key])
            out = {
                "pid": rec["pid"],
                "role": rec["role"],
                "cmd": rec["cmd"],
                "cpu_s": round(cpu_s, 3),
                "cpu_fraction": round(cpu_s / window, 5),
                "rss_first_bytes": rec["rss_first"],
                "rss_last_bytes": rec["rss_last"],
                "rss_max_bytes": rec["rss_max"],
                "threads_max": rec["threads"],
                **mem,
            }
            procs.append(out)
            r = roles.setdefault(rec["role"], {"cpu_s": 0.0, "pids": [], "_mem": []})
            r["cpu_s"] += cpu_s
            r["pids"].append(rec["pid"])
            r["_mem"].append(mem)
        for role, r in roles.items():
            mems = r.pop("_mem")
            for k in ("uss_bytes", "pss_bytes"):
                if mems and all(k in m for m in mems):
                    r[k] = sum(m[k] for m in mems)
            series = self._role_totals.get(role, [0])
            r["cpu_s"] = round(r["cpu_s"], 3)
            r["cpu_fraction"] = round(r["cpu_s"] / window, 5)
            r["rss_last_bytes"] = series[-1]
            r["rss_max_bytes"] = max(series)
        totals = self._totals or [0]
        cpu_total = sum(p["cpu_s"] for p in procs)
        return {
            "window_s": round(window, 3),
            "ticks": len(self._totals),
            "cpu_s": round(cpu_total, 3),
            "cpu_fraction": round(cpu_total / window, 5),
            "rss_last_bytes": totals[-1],
            "rss_max_bytes": max(totals),
            "rss_min_bytes": min(totals),
            "by_role": roles,
            "processes": procs,
            "system": self._system(window, cpu_total),
        }

    def _system(self, window: float, tree_cpu_s: float) -> dict[str, Any]:
        """Machine-wide CPU over the window: busy cores, this (client) process, everything else.

        ``other_cpu_fraction`` is CPU used by processes that are neither the measured tree nor the
        load generator: on a shared machine, a sign that the numbers are disturbed.
        """
        s0, s1 = self._sys0, self._sys1
        if s0 is None or s1 is None:
            return {}

        def delta(name: str) -> float:
            return float(getattr(s1, name, 0.0) - getattr(s0, name, 0.0))

        # guest time is already inside user/nice in /proc/stat; idle and iowait are not busy
        busy = sum(delta(n) for n in ("user", "nice", "system", "irq", "softirq", "steal"))
        kernel = delta("irq") + delta("softirq")  # network stack work not charged to a process

        def own(t: Any) -> float:  # this process and its reaped children (client processes)
            return float(t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0))

        me = own(self._self1) - own(self._self0)
        return {
            "ncpu": psutil.cpu_count(),
            "busy_cores": round(busy / window, 3),
            "client_cpu_fraction": round(me / window, 4),
            "irq_softirq_cpu_fraction": round(kernel / window, 4),
            "steal_cpu_fraction": round(delta("steal") / window, 4),
            "other_cpu_fraction": round(max(0.0, busy - kernel - delta("steal") - me - tree_cpu_s) / window, 4),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }


def _uss_pss(p: psutil.Process) -> dict[str, int]:
    try:
        full = p.memory_full_info()
    except (psutil.Error, OSError, NotImplementedError):
        return {}
    out = {}
    for name in ("uss", "pss"):
        v = getattr(full, name, None)
        if v is not None:
            out[f"{name}_bytes"] = int(v)
    return out


def tree_rss(pid: int) -> dict[str, int]:
    """RSS of each process of the tree right now: ``{pid: rss_bytes}``."""
    out: dict[str, int] = {}
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            try:
                out[str(p.pid)] = int(p.memory_info().rss)
            except psutil.Error:
                continue
    except psutil.NoSuchProcess:
        pass
    return out


def idle(
    pid: int, seconds: float, role: Callable[[psutil.Process, int], str] = default_role, interval_s: float = 0.5
) -> dict[str, Any]:
    """CPU and RSS of the tree over ``seconds`` with no requests sent."""
    sampler = ProcTreeSampler(pid, interval_s, role).start()
    time.sleep(seconds)
    return sampler.stop()


async def under_load(
    pid: int, coro: Any, role: Callable[[psutil.Process, int], str] = default_role, interval_s: float = 0.25
) -> tuple[Any, dict[str, Any]]:
    """Run ``coro`` (a load) while sampling the tree; returns (the load's result, process summary)."""
    sampler = ProcTreeSampler(pid, interval_s, role).start()
    try:
        result = await coro
    finally:
        procs = sampler.stop()
    return result, procs


# -- wrk (Debian package ``wrk``): a C load generator, for where the Python client is the bottleneck --

_WRK_SCRIPT = r"""
-- written by bench/load.py: optional Connection: close, then one JSON line with the summary
if os.getenv("NVGPU_WRK_CLOSE") == "1" then
  wrk.headers["Connection"] = "close"
end
wrk.headers["Accept-Encoding"] = "identity"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"min": %d, "mean": %.1f, "p50": %d, "p90": %d, "p99": %d, "p999": %d, "max": %d}}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max))
end
"""


def wrk_available() -> bool:
    """Whether Debian's ``wrk`` is on PATH (``apt-get install -y wrk``; benchmarks only, not CI)."""
    import shutil

    return shutil.which("wrk") is not None


def _run_wrk(
    url: str, connections: int, duration_s: float, threads: int, close: bool, timeout_s: float
) -> dict[str, Any]:
    check_loopback(url)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(_WRK_SCRIPT)
        script = fh.name
    cmd = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{duration_s:g}s",
        f"--timeout={timeout_s:g}s",
        "-s",
        script,
        url,
    ]
    env = {**os.environ, "NVGPU_WRK_CLOSE": "1" if close else "0"}
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
        assert proc.stdout is not None
        text = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        os.unlink(script)
    wall = time.monotonic() - t0
    line = next((ln for ln in text.splitlines() if ln.startswith("WRKJSON ")), None)
    out: dict[str, Any] = {
        "tool": "wrk",
        "command": cmd[:-3] + [url] + (["Connection: close"] if close else []),
        "connections": connections,
        "threads": threads,
        "keep_alive": not close,
        "exit_code": proc.returncode,
        "wall_s": round(wall, 3),
        "client_cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
    }
    if line is None:
        out["error"] = text[-2000:]
        return out
    data = json.loads(line[len("WRKJSON ") :])
    lat = {k: (round(v / 1000.0, 3) if v is not None else None) for k, v in data["latency_us"].items()}
    errors = data["errors"]
    out.update(
        requests=data["requests"],
        ok=data["requests"] - errors["status"],  # wrk counts answers outside 2xx/3xx as status errors
        non_2xx=errors["status"],
        errors=errors,
        duration_s=round(data["duration_us"] / 1e6, 3),
        requests_per_s=round(data["requests"] / (data["duration_us"] / 1e6), 1) if data["duration_us"] else None,
        bytes=data["bytes"],
        latency={f"{k}_ms": v for k, v in lat.items()},
        client_cpu_fraction=round((usage.ru_utime + usage.ru_stime) / wall, 3) if wall else None,
    )
    return out


async def wrk(
    url: str,
    connections: int,
    duration_s: float = 10.0,
    threads: int = 1,
    close: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """``connections`` connections from ``wrk`` for ``duration_s``, each sending requests back to back.

    Keep-alive (Prometheus-like scrapers, but without pause), or with ``close`` one request per
    connection (``Connection: close``: wrk reconnects after each answer). wrk's latency runs from
    writing the request to reading the whole answer, not the connect. Its CPU comes from the
    process's rusage: a C client on one thread costs a fraction of the aiohttp client's ~1 ms per
    connection, so on a 2-core machine the exporter, not the client, is what a wrk round measures.

    Returns:
        requests, ok (2xx/3xx), non_2xx, errors by kind (connect, read, write, status, timeout),
        requests_per_s, latency p50/p90/p99/p999/max in ms, client_cpu_s, wall_s; ``error`` with
        the output when wrk printed no summary.
    """
    return await asyncio.to_thread(_run_wrk, url, connections, duration_s, threads, close, timeout_s)


class ServerProcess:
    """A server under test: started in its own session, output to a log file, stopped by PID.

    Args:
        cmd: argv.
        env: the full environment.
        port: the loopback port it listens on.
        log_path: stdout and stderr go here.
        cwd: working directory.
    """

    def __init__(
        self, cmd: Sequence[str], env: Mapping[str, str], port: int, log_path: str, cwd: str | None = None
    ) -> None:
        self.cmd = list(cmd)
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.cmd, env=dict(env), cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """GET over loopback (urllib); HTTP errors are returned, connection errors raise OSError."""
        try:
            with urllib.request.urlopen(self.base + path, timeout=timeout) as resp:  # noqa: S310 - loopback
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()

    def wait_status(
        self,
        path: str,
        timeout: float,
        want: int = 200,
        body_check: Callable[[bytes], bool] | None = None,
        give_up: Callable[[int, bytes, float], str | None] | None = None,
    ) -> float:
        """Seconds until ``path`` answers ``want`` (and ``body_check`` holds).

        Args:
            give_up: called with (status, body, seconds waited) for other answers; a string it
                returns ends the wait with that reason (e.g. "NVML unavailable" for 10 s).

        Raises:
            RuntimeError: the process exited, ``give_up`` said so, or the time ran out (the log tail
                is in the message).
        """
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if not self.alive():
                raise RuntimeError(
                    f"exited with code {self.proc.returncode} before answering {path}; log tail:\n{self.log_tail()}"
                )
            try:
                status, body = self.get(path, timeout=2.0)
                if status == want and (body_check is None or body_check(body)):
                    return time.monotonic() - t0
                reason = give_up(status, body, time.monotonic() - t0) if give_up is not None else None
                if reason:
                    raise RuntimeError(f"{reason}; log tail:\n{self.log_tail()}")
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{path} did not answer {want} within {timeout:g} s; log tail:\n{self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                data = fh.read()
        except OSError:
            return ""
        return data[-n:].decode("utf-8", "replace")

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM the process, wait; SIGKILL its session if it does not stop. Returns the exit code."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(5)
        else:
            # the leader is gone; its session may still hold a child (a worker): end it too
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not self._log.closed:
            self._log.close()
        return self.proc.returncode


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_quiet(max_wait_s: float, threshold_cores: float = 0.15, probe_s: float = 3.0) -> dict[str, Any]:
    """Wait (at most ``max_wait_s``) until the machine's busy CPU is under ``threshold_cores``.

    For shared machines: returns ``{"quiet": bool, "busy_cores": last probe, "waited_s": …}``.
    """
    t0 = time.monotonic()
    ncpu = psutil.cpu_count() or 1
    while True:
        busy = psutil.cpu_percent(interval=probe_s) / 100.0 * ncpu
        waited = time.monotonic() - t0
        if busy < threshold_cores or waited >= max_wait_s:
            return {
                "quiet": busy < threshold_cores,
                "busy_cores": round(busy, 3),
                "waited_s": round(waited, 1),
                "threshold_cores": threshold_cores,
            }


def mb(n: float | None) -> float | None:
    """Bytes to MB (10^6), 1 decimal."""
    return None if n is None else round(n / 1e6, 1)


# -- command line ----------------------------------------------------------------------------------


async def _main_async(args: argparse.Namespace) -> dict[str, Any]:
    headers = PROMETHEUS3_HEADERS if args.prometheus_headers else PLAIN_HEADERS
    out: dict[str, Any] = {
        "url": args.url,
        "pid": args.pid,
        "headers": headers,
        "nofile": raise_nofile(args.concurrency + 256),
    }
    if args.pid and args.idle_seconds > 0:
        out["idle"] = await asyncio.to_thread(idle, args.pid, args.idle_seconds)
    if args.sequential > 0:
        out["sequential"] = await sequential(args.url, args.sequential, headers, timeout_s=args.timeout)
    rounds = []
    for _ in range(args.rounds if args.concurrency > 0 else 0):
        load = concurrent_procs(args.url, args.concurrency, args.client_procs, headers, args.timeout, args.client)
        if args.pid:
            res, procs = await under_load(args.pid, load)
            res["processes"] = procs
        else:
            res = await load
        rounds.append(res)
    if rounds:
        out["concurrent"] = rounds
    return out


def _child(spec_json: str) -> int:
    """One client process of :func:`concurrent_procs`: prints its result with every latency."""
    spec = json.loads(spec_json)
    result = asyncio.run(
        concurrent(
            spec["url"],
            int(spec["c"]),
            spec["headers"],
            float(spec["timeout_s"]),
            spec["client"],
            float(spec["start_at"]),
            keep_latencies=True,
        )
    )
    json.dump(result, sys.stdout)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return _child(argv[1])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--url", required=True, help="loopback /metrics URL")
    p.add_argument("--pid", type=int, default=0, help="exporter PID: sample it and its children")
    p.add_argument("--sequential", type=int, default=1000, help="sequential requests (0: skip)")
    p.add_argument("--concurrency", type=int, default=1000, help="concurrent connections (0: skip)")
    p.add_argument("--rounds", type=int, default=1, help="concurrent rounds")
    p.add_argument("--idle-seconds", type=float, default=0.0, help="idle CPU/RSS window first (needs --pid)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per-request timeout, seconds")
    p.add_argument(
        "--client-procs", type=int, default=1, help="spread the concurrent connections over this many client processes"
    )
    p.add_argument(
        "--client",
        choices=("aiohttp", "raw"),
        default="aiohttp",
        help="concurrent client: aiohttp (reference) or raw (cheaper per request)",
    )
    p.add_argument(
        "--prometheus-headers", action="store_true", help="send Prometheus 3's Accept header and Accept-Encoding: gzip"
    )
    args = p.parse_args(argv)
    try:
        check_loopback(args.url)
    except ValueError as exc:
        print(f"load.py: {exc}", file=sys.stderr)
        return 2
    result = asyncio.run(_main_async(args))
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "PLAIN_HEADERS",
    "PROMETHEUS3_HEADERS",
    "ProcTreeSampler",
    "ServerProcess",
    "check_loopback",
    "concurrent",
    "concurrent_procs",
    "free_port",
    "idle",
    "mb",
    "percentile",
    "raise_nofile",
    "sequential",
    "summarize_ms",
    "tree_rss",
    "under_load",
    "wait_quiet",
    "wrk",
    "wrk_available",
]
