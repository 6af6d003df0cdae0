"""Property tests (Hypothesis) of the exporter's edges: every ``NVGPU_*`` value and HTTP request
lines and headers sent to a real server.

- Configuration: any text in any ``NVGPU_*`` variable gives a :class:`~exporter.config.Config` or
  a :class:`~exporter.settingvalues.ConfigError` whose one problem names the variable (a value that
  conflicts with another setting's default names both); nothing else.
- HTTP: any request line and headers, complete or not, sent over a raw socket to a real exporter
  get an HTTP answer or a closed connection; afterwards ``/healthz`` answers, the supervisor is
  alive, its connections drain, and its memory stays bounded.

The example budget is fixed (``derandomize=True``: the same examples every run) to keep CI short;
``NVGPU_FUZZ_EXAMPLES`` raises it for a longer run (docs/reliability.md records one).
"""

from __future__ import annotations

import os
import re
import socket
import string
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from exporter_proc import Exporter

from exporter.config import Config
from exporter.settings import SETTINGS
from exporter.settingvalues import ConfigError
from guards import features as gf
from guards import featuretable

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = int(os.environ.get("NVGPU_FUZZ_EXAMPLES", "0") or 0)


def budget(default: int) -> int:
    return EXAMPLES or default


# -- every NVGPU_* value -------------------------------------------------------------------------

# What an environment variable can hold: any text without NUL (the kernel refuses it).
ENV_TEXT = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=80)
NEAR_MISSES = st.sampled_from(
    ["", " ", "0", "-1", "1e309", "nan", "inf", "1e-9", "true", "TRUE", "yes", "on", "2", "5s", ":0", ":65536",
     "[::1]:1", "256.1.1.1:1", "fake:", "fake:h200x2", "fake:/etc/passwd", "/", "/metrics", "/healthz", "auto",
     "json", "DEBUG", "strict", "9" * 40, "0x10", "1_000"]
)  # fmt: skip
VALUES = st.one_of(ENV_TEXT, NEAR_MISSES)


@pytest.mark.parametrize("var", [s.env for s in SETTINGS] + [gf.env_var(f) for f in sorted(featuretable.FEATURES)])
def test_every_variable_gives_a_config_or_a_problem_naming_it(var: str) -> None:
    @settings(max_examples=budget(40), derandomize=True, deadline=None, database=None)
    @given(VALUES)
    def check(value: str) -> None:
        try:
            Config.from_env({var: value})
        except ConfigError as exc:
            assert len(exc.problems) == 1, exc.problems
            assert var in exc.problems[0], exc.problems[0]  # "NVGPU_X=..." or "..._MAX must be at least NVGPU_X"
        except Exception as exc:  # noqa: BLE001 - the property under test
            pytest.fail(f"{var}={value!r} raised {type(exc).__name__}: {exc}")

    check()


@settings(max_examples=budget(60), derandomize=True, deadline=None, database=None)
@given(st.dictionaries(st.sampled_from([s.env for s in SETTINGS]), VALUES, max_size=6))
def test_any_combination_reports_every_problem_with_its_variable(environ: dict[str, str]) -> None:
    try:
        Config.from_env(environ)
    except ConfigError as exc:
        for problem in exc.problems:
            assert any(var in problem for var in environ), problem


# -- HTTP request lines and headers through a real server --------------------------------------

METHOD = st.one_of(
    st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "CONNECT", "TRACE", "PRI", "get", ""]),
    st.text(string.ascii_letters + string.punctuation, min_size=1, max_size=12),
)
TARGET = st.one_of(
    st.sampled_from(["/", "/metrics", "/healthz", "/readyz", "*", "http://x/metrics", "/metrics?x=1", "//", "/%00"]),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=60),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
)
VERSION = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/0.9", "HTTP/1.1 ", "HTTPS/1.1", "", "HTTP/1.x"])
HEADER_NAME = st.one_of(
    st.sampled_from(["Host", "Accept", "Accept-Encoding", "Content-Length", "Transfer-Encoding", "Connection",
                     "Authorization", "Upgrade", "Expect", "X-A"]),
    st.text(string.ascii_letters + "-_:", min_size=0, max_size=20),
)  # fmt: skip
HEADER_VALUE = st.one_of(
    st.sampled_from(["gzip", "application/openmetrics-text; version=1.0.0", "chunked", "close", "keep-alive",
                     "-1", "99999999999999999999", "Basic !!!", "100-continue", "websocket"]),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.just("x" * 9000),  # over aiohttp's 8 KiB field limit
)  # fmt: skip
HEADERS = st.lists(st.tuples(HEADER_NAME, HEADER_VALUE), max_size=12)


def _request(method: str, target: str, version: str, headers: list[tuple[str, str]], crlf: bool) -> bytes:
    eol = "\r\n" if crlf else "\n"
    lines = [f"{method} {target} {version}".rstrip(" ")] + [f"{k}: {v}" for k, v in headers]
    return (eol.join(lines) + eol + eol).encode("latin-1")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exporter]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    env = {"NVGPU_WEB_HEADER_TIMEOUT_SECONDS": "1", "NVGPU_WEB_KEEPALIVE_TIMEOUT_SECONDS": "1"}
    with Exporter(None, tmp, env=env, args=["--nvml-backend", "fake:h200x1"]) as exp:
        exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, what="first sample")
        exp.rss_at_start = psutil.Process(exp.proc.pid).memory_info().rss  # type: ignore[attr-defined]
        yield exp


def _answer(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(raw)
        except (BrokenPipeError, ConnectionResetError):
            return b""
        s.settimeout(4)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return data


@settings(
    max_examples=budget(150),
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(METHOD, TARGET, VERSION, HEADERS, st.booleans())
def test_request_lines_and_headers_never_hurt_the_server(
    server: Exporter, method: str, target: str, version: str, headers: list[tuple[str, str]], crlf: bool
) -> None:
    answer = _answer(server.port, _request(method, target, version, headers, crlf))
    if answer:
        status_line = answer.split(b"\r\n", 1)[0]
        # aiohttp answers in the version the request named (an "HTTP/2.0" request line gets an
        # "HTTP/2.0 200" text response): odd, harmless, left to aiohttp
        assert re.match(rb"HTTP/\d\.\d \d{3} ", status_line), answer[:200]
        assert b"\r\nServer: nvgpu-exporter\r\n" in answer, answer[:400]
    assert server.proc.poll() is None, "the supervisor died"


def test_the_server_is_whole_after_the_fuzz(server: Exporter) -> None:
    """Runs after the property above (file order): still answering, connections drained, memory bounded."""
    assert server.get("/healthz")[0] == 200
    # header and keep-alive timeouts are 1 s: every fuzz connection is gone within a few seconds
    server.wait_for(
        lambda s: (s.value("nvgpu_http_connections") or 0) <= 2, timeout=5, what="the fuzz connections closed"
    )
    growth = psutil.Process(server.proc.pid).memory_info().rss - server.rss_at_start  # type: ignore[attr-defined]
    assert growth < 64 << 20, f"supervisor RSS grew by {growth >> 20} MiB"
