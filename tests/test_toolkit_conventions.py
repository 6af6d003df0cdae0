"""The Prometheus toolkit's conventions, as an operator used to node_exporter types them.

- ``--log.level=warn`` (promslog's names) and ``warning``; ``--log.format=logfmt``, a real logfmt:
  every line decodes with a logfmt decoder written here from go-logfmt's decoding rules
  (github.com/go-logfmt/logfmt ``decode.go``: bare values end at a space, quoted values are JSON
  strings), whatever the message holds;
- Go durations wherever seconds are taken (tests/test_config.py holds every setting);
- ``--version`` as prometheus/common's ``version.Print`` shapes it;
- a repeated ``--web.listen-address`` listens on each address.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from exporter_proc import free_port
from hypothesis import given, settings
from hypothesis import strategies as st
from waiting import wait_until

from exporter import buildinfo
from exporter.common import logs

ROOT = Path(__file__).resolve().parent.parent


def decode_logfmt(line: str) -> dict[str, str | None]:
    """A logfmt line -> {key: value}; a bare ``null`` is None. Strict: raises ValueError where
    go-logfmt's decoder reports a syntax error (a quote or ``=`` in a key or a bare value, an
    unterminated or badly escaped quoted value, garbage after a quote)."""
    out: dict[str, str | None] = {}
    i, n = 0, len(line)
    while i < n:
        if line[i] == " ":
            i += 1
            continue
        start = i
        while i < n and line[i] not in ' ="':
            i += 1
        key = line[start:i]
        if not key or i >= n or line[i] != "=":
            raise ValueError(f"no key=value at {start}: {line[start:]!r}")
        i += 1
        if i < n and line[i] == '"':
            end = i + 1
            while end < n and line[end] != '"':
                end += 2 if line[end] == "\\" else 1
            if end >= n:
                raise ValueError(f"unterminated quoted value of {key}")
            value: str | None = json.loads(line[i : end + 1])
            i = end + 1
            if i < n and line[i] != " ":
                raise ValueError(f"garbage after the quoted value of {key}")
        else:
            start = i
            while i < n and line[i] != " ":
                if line[i] in '="':
                    raise ValueError(f"unquoted {line[i]!r} in the value of {key}")
                i += 1
            value = line[start:i]
            if value == "null":
                value = None
        out[key] = value
    return out


def capture(fmt: str, level: str = "INFO") -> io.StringIO:
    stream = io.StringIO()
    logs.setup(level, fmt, stream)
    return stream


@pytest.fixture(autouse=True)
def _restore_logging() -> Any:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def test_a_logfmt_record_is_one_line_of_pairs_in_promslogs_order() -> None:
    stream = capture("logfmt")
    logging.getLogger("exporter.supervisor.x").warning(
        "GPU %s lost", 1, extra={"uuid": "GPU-1", "reason": "fell off the bus", "count": 3, "ok": False}
    )
    (line,) = stream.getvalue().splitlines()
    assert list(decode_logfmt(line)) == ["time", "level", "logger", "msg", "uuid", "reason", "count", "ok"]
    rec = decode_logfmt(line)
    assert RFC3339.fullmatch(rec["time"] or "") and rec["level"] == "warn" and rec["msg"] == "GPU 1 lost"
    assert line.endswith('uuid=GPU-1 reason="fell off the bus" count=3 ok=false'), line


def test_a_traceback_is_the_quoted_value_of_exc() -> None:
    stream = capture("logfmt")
    try:
        raise RuntimeError('bad "thing"\nsecond line')
    except RuntimeError:
        logging.getLogger("exporter").exception("failed")
    (line,) = stream.getvalue().splitlines()
    rec = decode_logfmt(line)
    assert rec["level"] == "error" and rec["msg"] == "failed"
    assert (rec["exc"] or "").startswith("Traceback") and 'RuntimeError: bad "thing"\nsecond line' in (rec["exc"] or "")


def test_quoting_follows_go_logfmt() -> None:
    value = logs.logfmt_value
    assert [value(v) for v in ("plain", "", "a b", "k=v", 'say "hi"', "null", None, True, 2.5)] == [
        "plain",
        '""',
        '"a b"',
        '"k=v"',
        '"say \\"hi\\""',
        '"null"',
        "null",
        "true",
        "2.5",
    ]
    assert value("back\\slash") == "back\\slash"  # a backslash alone needs no quotes (go-logfmt, slog)
    assert value("tab\there\r\n\x00\x7f\u2028") == '"tab\\there\\r\\n\\u0000\\u007f\\u2028"'
    assert value("Gerät") == "Gerät"  # printable non-ASCII stays as it is


@settings(max_examples=300, deadline=None)
@given(
    msg=st.text(),
    key=st.text(min_size=1, max_size=12),
    field=st.one_of(st.text(), st.integers(), st.none(), st.booleans(), st.floats(allow_nan=False)),
)
def test_any_record_decodes_to_what_was_logged_on_one_line(msg: str, key: str, field: Any) -> None:
    stream = capture("logfmt", "DEBUG")
    name = "k" + key  # not one of LogRecord's own attributes
    logging.getLogger("exporter.fuzz").info("%s", msg, extra={name: field})
    text = stream.getvalue()
    assert text.count("\n") == 1 and len(text.splitlines()) == 1, text
    rec = decode_logfmt(text.rstrip("\n"))
    assert rec["msg"] == msg
    kept = "".join(c for c in name if c > " " and c not in '="\x7f' and c.isprintable())
    want = None if field is None else ("true" if field is True else "false" if field is False else str(field))
    assert rec[kept] == want


def test_version_prints_what_the_prometheus_exporters_print(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--version"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert re.fullmatch(r"nvgpu-exporter, version \S+ \(branch: \S+, revision: [0-9a-f]{40}\)", lines[0]), lines
    assert [line.split(":", 1)[0].strip() for line in lines[1:]] == [
        "build user",
        "build date",
        "python version",
        "platform",
        "package",
    ]


def test_build_info_baked_wins_then_git_then_unknown(tmp_path: Path) -> None:
    package = tmp_path / "checkout" / "exporter"
    package.mkdir(parents=True)
    git = tmp_path / "checkout" / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/release-1\n")
    (git / "packed-refs").write_text("# pack-refs with: peeled\n" + "a" * 40 + " refs/heads/release-1\n")
    assert (buildinfo.read(package).revision, buildinfo.read(package).branch) == ("a" * 40, "release-1")
    (git / "refs" / "heads" / "release-1").write_text("b" * 40 + "\n")
    assert buildinfo.read(package).revision == "b" * 40  # a loose ref is newer than packed-refs
    buildinfo.write("c" * 40, "2026-12-01T10:00:00Z", target=package / "build_info.json")
    baked = buildinfo.read(package)
    assert (baked.revision, baked.date, baked.branch) == ("c" * 40, "2026-12-01T10:00:00Z", "unknown")
    bare = tmp_path / "site-packages" / "exporter"
    bare.mkdir(parents=True)
    assert buildinfo.read(bare) == buildinfo.BuildInfo()
    text = buildinfo.version_text(baked)
    assert text.splitlines()[0] == f"nvgpu-exporter, version {baked.version} (branch: unknown, revision: {'c' * 40})"
    assert "  build date:       2026-12-01T10:00:00Z" in text.splitlines()


def test_a_worktree_checkout_reads_the_common_directory(tmp_path: Path) -> None:
    common = tmp_path / "main" / ".git"
    wt = common / "worktrees" / "feature"
    wt.mkdir(parents=True)
    (wt / "HEAD").write_text("ref: refs/heads/feature\n")
    (wt / "commondir").write_text("../..\n")
    (common / "refs" / "heads").mkdir(parents=True)
    (common / "refs" / "heads" / "feature").write_text("d" * 40 + "\n")
    checkout = tmp_path / "feature"
    (checkout / "exporter").mkdir(parents=True)
    (checkout / ".git").write_text(f"gitdir: {wt}\n")
    info = buildinfo.read(checkout / "exporter")
    assert (info.revision, info.branch) == ("d" * 40, "feature")


# -- the real exporter -------------------------------------------------------------------------


def test_the_exporter_logs_logfmt_and_listens_on_every_address(tmp_path: Path) -> None:
    ports = (free_port(), free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    env.update({"NVGPU_LOG_LEVEL": "error", "PYTHONUNBUFFERED": "1"})  # the flag below wins
    log_path = tmp_path / "exporter.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--nvml-backend", "fake:h200x2", "--state-file", "",
             "--log.level=info", "--log.format=logfmt", "--sample-interval=500ms",
             *(arg for port in ports for arg in ("--web.listen-address", f"127.0.0.1:{port}"))],
            env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
        try:
            for port in ports:
                body = wait_until(lambda port=port: _get(port, "/metrics"), 30, f"/metrics on port {port}")
                assert "nvgpu_up 1" in body or "nvgpu_up" in body
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    records = [decode_logfmt(line) for line in lines]
    assert records and all(list(rec)[:4] == ["time", "level", "logger", "msg"] for rec in records), lines
    listening = [rec["msg"] or "" for rec in records if "listening on" in (rec["msg"] or "")]
    assert listening and all(f"127.0.0.1:{port}" in listening[0] for port in ports), listening


def _get(port: int, path: str) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return str(resp.read().decode())
    except OSError:
        return None


def test_check_config_takes_the_toolkit_spellings(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--check-config", "--log.level=warn", "--log.format=logfmt",
         "--sample-interval=1s", "--restart-backoff=500ms", "--quarantine-ttl=1h30m", "--state-file", "",
         "--web.listen-address=127.0.0.1:19401", "--web.listen-address=127.0.0.1:19402"],
        env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for line in (
        "NVGPU_LOG_LEVEL=WARNING",
        "NVGPU_LOG_FORMAT=logfmt",
        "NVGPU_SAMPLE_INTERVAL_SECONDS=1.0",
        "NVGPU_RESTART_BACKOFF_SECONDS=0.5",
        "NVGPU_QUARANTINE_TTL_SECONDS=5400.0",
        "NVGPU_LISTEN_ADDRESS=127.0.0.1:19401,127.0.0.1:19402",
    ):
        assert f"  {line}\n" in proc.stdout, (line, proc.stdout)
