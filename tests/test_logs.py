"""Logs an operator can ship.

- JSON format: every line the exporter writes on stderr is one JSON object with an RFC 3339
  ``time``, the worker's output included; a worker crash is one record carrying one traceback.
- Text format: one line per record; a driver string with a line break cannot forge a record;
  the crash traceback appears once.
- The worker's stderr is read in bounded chunks: a 70 KB line is cut and marked, never fatal,
  and what follows it is not lost.
- Expected conditions (no fan on an H200, NVLink on a single GPU, no kubelet outside Kubernetes)
  are INFO and said once per exporter, not once per worker.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from exporter_proc import SCENARIOS, Exporter, load_scenario, write_scenario

from exporter.common import logs
from exporter.supervisor.workerproc import MAX_LINE, WorkerProcess
from exporter.supervisor.workerstderr import LineSplitter

RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def capture(fmt: str) -> io.StringIO:
    stream = io.StringIO()
    logs.setup("INFO", fmt, stream)
    return stream


@pytest.fixture(autouse=True)
def _restore_logging() -> Any:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_record_has_rfc3339_time_and_fields() -> None:
    stream = capture("json")
    logging.getLogger("exporter.test").warning("hello %s", "there", extra={"gpu": 0, "uuid": "GPU-1"})
    (line,) = stream.getvalue().splitlines()
    rec = json.loads(line)
    assert list(rec)[:4] == ["time", "level", "logger", "msg"]
    assert RFC3339.fullmatch(rec["time"]) and rec["level"] == "WARNING" and rec["msg"] == "hello there"
    assert rec["gpu"] == 0 and rec["uuid"] == "GPU-1"
    assert abs(logs.parse_rfc3339(rec["time"]) - __import__("time").time()) < 60


def test_text_lines_cannot_be_forged_by_a_line_break() -> None:
    stream = capture("text")
    name = "NVIDIA H200\n2026-01-01T00:00:00.000Z ERROR   exporter: forged"
    logging.getLogger("exporter.test").info("GPU name %s", name, extra={"detail": "a\nb"})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert "\\n2026-01-01" in lines[0] and "detail=a\\nb" in lines[0]


def test_text_keeps_a_traceback_on_its_own_lines() -> None:
    stream = capture("text")
    logging.getLogger("exporter.test").error("worker died", extra={"stack": "Fatal Python error: x\n  File y"})
    assert stream.getvalue().splitlines()[1:] == ["Fatal Python error: x", "  File y"]


# -- the worker's stderr ---------------------------------------------------------------------------


def test_line_splitter_bounds_lines_and_keeps_going() -> None:
    split = LineSplitter(max_line=10)
    assert split.feed(b"short\nlong-line-") == ["short"]
    assert split.feed(b"x" * 70_000) == []
    assert split._buf == b"long-line-", "the buffer never holds more than one line's worth"
    cut, following = split.feed(b"tail\nnext\n")
    assert cut.startswith("long-line-") and "70004 more bytes dropped" in cut and following == "next"
    assert split.close() == []
    assert split.feed(b"no newline at the end") == []
    (last,) = split.close()
    assert last.startswith("no newline [") and "11 more bytes dropped" in last


def test_line_splitter_unit() -> None:
    split = LineSplitter(max_line=8)
    assert split.feed(b"a\r\nb\n") == ["a", "b"]
    assert split.feed(b"\xff\xfe\n") == ["\ufffd\ufffd"]
    assert split.feed(b"rest") == [] and split.close() == ["rest"]


async def _drain(chunks: list[bytes]) -> WorkerProcess:
    wp = WorkerProcess({}, None, lambda m: None, (1.0, 1.0))  # type: ignore[arg-type]
    reader = asyncio.StreamReader()
    for c in chunks:
        reader.feed_data(c)
    reader.feed_eof()
    await wp._read_stderr(reader)
    return wp


def test_a_70kb_stderr_line_is_cut_marked_and_what_follows_is_kept() -> None:
    stream = capture("json")
    worker_record = {
        "time": "2026-11-30T05:00:00.000Z",
        "level": "WARNING",
        "logger": "exporter.worker",
        "msg": "after",
    }
    asyncio.run(_drain([b"A" * 70_000 + b"\n", json.dumps(worker_record).encode() + b"\n"]))
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [r["msg"][:40] for r in records] == ["worker None wrote to stderr: " + "A" * 11, "after"]
    assert len(records[0]["msg"]) < MAX_LINE + 200
    assert f"{70_000 - MAX_LINE} more bytes dropped" in records[0]["msg"]
    assert records[1]["time"] == "2026-11-30T05:00:00.000Z"


def test_a_long_json_record_is_not_lost_either() -> None:
    stream = capture("json")
    long = json.dumps({"time": "2026-11-30T05:00:00.000Z", "level": "INFO", "logger": "x", "msg": "d" * 90_000})
    asyncio.run(_drain([long.encode()[:30_000], long.encode()[30_000:] + b"\n"]))
    (rec,) = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert "more bytes dropped" in rec["msg"] and rec["level"] == "WARNING"


def test_fatal_error_is_kept_for_the_death_record_not_written() -> None:
    stream = capture("json")
    fatal = b'Fatal Python error: Segmentation fault\n\nThread 0x1 (most recent call first):\n  File "x.py", line 1\n'
    wp = asyncio.run(_drain([fatal]))
    assert stream.getvalue() == ""
    assert wp.dead_stack().startswith("Fatal Python error: Segmentation fault") and "x.py" in wp.dead_stack()


def test_a_traceback_is_one_record() -> None:
    stream = capture("json")
    tb = b'Traceback (most recent call last):\n  File "w.py", line 3, in main\nRuntimeError: boom\n'
    asyncio.run(_drain([tb]))
    (rec,) = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert rec["level"] == "ERROR" and rec["msg"].endswith("RuntimeError: boom") and "w.py" in rec["stack"]


def test_ctrl_c_in_the_worker_is_one_info_line() -> None:
    stream = capture("json")
    tb = b'Traceback (most recent call last):\n  File "w.py", line 3, in main\nKeyboardInterrupt\n'
    asyncio.run(_drain([tb]))
    (rec,) = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert rec["level"] == "INFO" and "SIGINT" in rec["msg"] and "stack" not in rec


def test_relay_keeps_info_once_across_workers_and_faults_every_time() -> None:
    stream = capture("json")
    relay = logs.WorkerLogRelay()
    info = {
        "time": "2026-11-30T05:00:00.000Z",
        "level": "INFO",
        "logger": "exporter.worker",
        "msg": "fan",
        "once": True,
    }
    fault = {**info, "level": "WARNING", "msg": "GPU 1 lost"}
    assert relay.relay(info, 11) and relay.relay(fault, 11)
    assert not relay.relay(info, 12), "the second worker's identical INFO is dropped"
    assert relay.relay(fault, 12), "a fault that outlives a restart says so again"
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(r["msg"], r["worker_pid"]) for r in records] == [("fan", 11), ("GPU 1 lost", 11), ("GPU 1 lost", 12)]


def test_relay_survives_odd_records() -> None:
    capture("json")
    relay = logs.WorkerLogRelay()
    assert relay.relay({"msg": 5, "level": "NOPE", "time": "yesterday", "levelname": "x", "args": [1]}, None)


# -- end to end: the crash scenario with JSON logs -----------------------------------------------


def test_crash_run_with_json_logs_is_json_on_every_line(tmp_path: Path) -> None:
    scenario = SCENARIOS / "h200x2-nvlink-crash.json"
    with Exporter(scenario, tmp_path) as exp:  # the harness sets NVGPU_LOG_FORMAT=json
        exp.wait_for(
            lambda s: s.value("nvgpu_feature_enabled", feature="nvlink_throughput", reason="quarantined") == 0.0,
            timeout=40,
            what="nvlink_throughput quarantined",
        )
        exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, timeout=20, what="fresh sample after quarantine")
        assert exp.terminate() == 0
    lines = [line for line in exp.logs().splitlines() if line.strip()]
    records = []
    for line in lines:
        rec = json.loads(line)  # every line, no exception
        assert isinstance(rec, dict) and RFC3339.fullmatch(rec["time"]), line
        records.append(rec)
    deaths = [r for r in records if r["msg"].startswith("worker died")]
    assert len(deaths) == 2  # a crash on each GPU: the second GPU's quarantines the feature
    for r in deaths:
        assert r["stack"].startswith("Fatal Python error: Segmentation fault") and "nvlink_throughput.py" in r["stack"]
    # one traceback per crash: the fatal report appears only inside the death records
    assert sum("Fatal Python error" in line for line in lines) == len(deaths)
    worker_records = [r for r in records if "worker_pid" in r]
    assert worker_records, "the worker's own log lines are relayed"
    once = [r for r in records if r["msg"].startswith("feature fan is unsupported on every GPU")]
    assert len(once) == 1 and once[0]["level"] == "INFO", "said once for 3 workers, at INFO"
    assert not [r for r in records if r["level"] == "WARNING" and "unsupported on every GPU" in r["msg"]]


def test_crash_run_in_text_shows_the_traceback_once(tmp_path: Path) -> None:
    data = load_scenario("h200x2-nvlink-crash")
    with Exporter(write_scenario(tmp_path, data), tmp_path, env={"NVGPU_LOG_FORMAT": "text"}) as exp:
        exp.wait_for(
            lambda s: (s.value("nvgpu_worker_restarts_total", reason="crash") or 0) >= 1,
            timeout=40,
            what="a crash",
        )
        assert exp.terminate() == 0
    text = exp.logs()
    crashes = text.count("worker died: crash")
    assert crashes >= 1
    assert text.count("Fatal Python error: Segmentation fault") == crashes
    assert not any(line.startswith("{") for line in text.splitlines()), "no JSON in text mode"


@pytest.mark.parametrize(("xid", "level"), [(13, "INFO"), (79, "ERROR")])
def test_xid_log_line_carries_the_catalogs_meaning_severity_and_action(xid: int, level: str) -> None:
    """ "Xid 79 on GPU 0 ... from NVML event" said nothing the catalog knows."""
    from exporter.supervisor.xid import classify
    from exporter.supervisor.xids import XidLedger

    stream = capture("json")
    XidLedger().record_xid("0", "GPU-a", xid, 1_700_000_000.0, "NVML event")
    (rec,) = [json.loads(line) for line in stream.getvalue().splitlines()]
    info = classify(xid)
    assert info.known and rec["level"] == level  # catalog severity: info -> INFO, critical -> ERROR
    assert (rec["xid"], rec["mnemonic"], rec["severity"], rec["action"]) == (
        xid,
        info.mnemonic,
        info.severity,
        info.action,
    )
    assert (
        info.mnemonic in rec["msg"]
        and info.meaning.rstrip(".") in rec["msg"]
        and f"Action: {info.action}" in rec["msg"]
    )
