"""`nvgpu-exporter quarantine --state-file F` works after the subcommand and
says which file it read; the no-GPU hint names a scenario every install has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "exporter", *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=60
    )


def quarantined_state(path: Path) -> None:
    now = time.time()
    q = {"feature": "nvlink_throughput", "function": "nvmlDeviceGetFieldValues", "since": now, "until": now + 3600}
    path.write_text(json.dumps({"version": 1, "history": [], "quarantine": {"nvlink_throughput": {**q, "crashes": 3}}}))


@pytest.mark.parametrize("where", ["after", "before", "env"])
def test_state_file_flag_after_the_subcommand_and_the_listing_names_it(tmp_path: Path, where: str) -> None:
    state = tmp_path / "state.json"
    quarantined_state(state)
    if where == "after":
        proc = run(["quarantine", "--state-file", str(state)], tmp_path)
    elif where == "before":
        proc = run(["--state-file", str(state), "quarantine"], tmp_path)
    else:
        proc = run(["quarantine"], tmp_path, NVGPU_STATE_FILE=str(state))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"state file {state}:"
    assert lines[1].startswith("  nvlink_throughput: 3 worker crashes/hangs in nvmlDeviceGetFieldValues")


def test_empty_listing_names_the_file_too(tmp_path: Path) -> None:
    proc = run(["quarantine", "--state-file", str(tmp_path / "none.json")], tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.strip() == (
        f"state file {tmp_path / 'none.json'} (not there yet: the exporter writes it at the first quarantine;"
        " is this the path it uses?): no feature is quarantined"
    )
    proc = run(["quarantine", "--state-file", ""], tmp_path)
    assert "no state file (NVGPU_STATE_FILE is empty)" in proc.stdout


def test_clear_after_the_subcommand(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    quarantined_state(state)
    proc = run(["quarantine", "--state-file", str(state), "--clear", "nvlink_throughput"], tmp_path)
    assert proc.returncode == 0 and "cleared: nvlink_throughput" in proc.stdout and str(state) in proc.stdout
    assert json.loads(state.read_text())["quarantine"] == {}


def test_a_bad_state_file_flag_is_named_as_typed(tmp_path: Path) -> None:
    proc = run(["quarantine", "--state-file", str(tmp_path), "--clear-all"], tmp_path)
    assert proc.returncode in (1, 2)
    assert str(tmp_path) in proc.stderr


def test_the_no_gpu_demo_hint_works_from_any_directory(tmp_path: Path) -> None:
    """`fake:h200x2`, the hint's scenario, resolves from a directory without the source tree."""
    proc = run(["--check-config", "--nvml-backend", "fake:h200x2"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert any(line.endswith("exporter/common/scenarios/h200x2.json") for line in proc.stdout.splitlines())


def test_an_unwritable_state_file_is_reported_at_start(tmp_path: Path) -> None:
    """Said at start (ERROR, naming the file), not after the first crash; it still serves."""
    from exporter_proc import Exporter

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    state = blocker / "state.json"
    with Exporter(None, tmp_path, env={"NVGPU_STATE_FILE": str(state)}, args=["--nvml-backend", "fake:h200x1"]) as exp:
        exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, what="first sample")
        errors = [r for r in exp.log_records() if r["level"] == "ERROR" and "state file" in r["msg"]]
        assert len(errors) == 1 and str(state) in errors[0]["msg"] and "is not a directory" in errors[0]["msg"]
        assert exp.terminate() == 0


def test_hash_password_reads_stdin_and_prints_a_bcrypt_hash(tmp_path: Path) -> None:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "hash-password", "--cost", "4"],
        input="s3cret\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=full,
    )
    assert proc.returncode == 0, proc.stderr
    import bcrypt

    hashed = proc.stdout.strip()
    assert hashed.startswith("$2b$04$") and bcrypt.checkpw(b"s3cret", hashed.encode())
    empty = subprocess.run(
        [sys.executable, "-m", "exporter", "hash-password"], input="\n", capture_output=True, text=True, timeout=60
    )
    assert empty.returncode == 2 and "empty password" in empty.stderr


def test_a_closed_stdout_is_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A friction point of the new-user trial: `nvgpu-exporter --check-config | head -2` printed a
    BrokenPipeError traceback. Here stdout is a pipe whose reader has gone, like head's."""
    from exporter import cli

    read_end, write_end = os.pipe()
    os.close(read_end)
    broken = os.fdopen(write_end, "w", buffering=1)  # line-buffered: the first line breaks the pipe
    monkeypatch.setattr(sys, "stdout", broken)
    for var in [k for k in os.environ if k.startswith("NVGPU_")]:
        monkeypatch.delenv(var)
    try:
        assert cli.main(["--check-config"]) == 0
    finally:
        monkeypatch.undo()
        broken.close()
