"""Check what runs: ``--check-config`` refuses what would fail at run time, exit 2,
naming the variable (or flag) and what was expected. Listen-address syntax is tested with the web
side (helper A's part of the issue)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _check(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "exporter", "--check-config", *args],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        # the 1e23: the worker died after every sample (time arithmetic overflowed)
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "1e23", "at most 3600 s (an hour between samples)"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "3601", "at most 3600 s"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "0.01", "at least 0.1 s"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "inf", "positive, finite"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "nan", "positive, finite"),
        # the 1e17: gmtime overflow at the third crash, and every start after it
        ("NVGPU_QUARANTINE_TTL_SECONDS", "1e17", "at most 3.1536e+08 s (ten years)"),
        ("NVGPU_QUARANTINE_WINDOW_SECONDS", "1e300", "ten years"),
        ("NVGPU_RESTART_BACKOFF_SECONDS", "1e400", "positive, finite"),
        ("NVGPU_RESTART_BACKOFF_MAX_SECONDS", "4e8", "ten years"),
        ("NVGPU_SHUTDOWN_TIMEOUT_SECONDS", "-1", "positive, finite"),
        ("NVGPU_STALE_AFTER_SECONDS", "4e8", "ten years"),
        ("NVGPU_SAMPLE_DEADLINE_SECONDS", "1e20", "ten years"),
        ("NVGPU_INIT_DEADLINE_SECONDS", "1e20", "ten years"),
    ],
)
def test_out_of_range_durations_exit_2_naming_the_variable(
    tmp_path: Path, variable: str, value: str, expected: str
) -> None:
    proc = _check(tmp_path, **{variable: value})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{variable}={value!r}" in proc.stderr and expected in proc.stderr, proc.stderr


def test_flag_is_named_when_the_flag_is_wrong(tmp_path: Path) -> None:
    proc = _check(tmp_path, "--sample-interval", "1e23")
    assert proc.returncode == 2 and "--sample-interval='1e23'" in proc.stderr, proc.stderr


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    proc = _check(tmp_path, NVGPU_SAMPLE_INTERVAL_SECONDS="1e23", NVGPU_QUARANTINE_TTL_SECONDS="1e17")
    assert proc.returncode == 2 and "2 configuration problem(s)" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        # past the JSON decoder's recursion limit: a RecursionError traceback and exit 1 before
        ('{"gpus": ' + "[" * 100_000, "nested too deeply (expected at most 32 levels)"),
        # within it, but deeper than any scenario needs
        ('{"gpus": ' + "[" * 40 + "]" * 40 + "}", "nested more than 32 levels deep; expected at most 32"),
    ],
    ids=["past-recursion-limit", "past-depth-bound"],
)
def test_deep_scenario_exits_2_naming_the_backend(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "deep.json"
    path.write_text(content)
    for proc, name in (
        (_check(tmp_path, NVGPU_NVML_BACKEND=f"fake:{path}"), "NVGPU_NVML_BACKEND"),
        (_check(tmp_path, "--nvml-backend", f"fake:{path}"), "--nvml-backend"),
    ):
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert name in proc.stderr and expected in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_values_at_the_bounds_are_accepted(tmp_path: Path) -> None:
    proc = _check(
        tmp_path,
        NVGPU_SAMPLE_INTERVAL_SECONDS="3600",
        NVGPU_QUARANTINE_TTL_SECONDS="315360000",
        NVGPU_SHUTDOWN_TIMEOUT_SECONDS="1",
    )
    assert proc.returncode == 0, proc.stderr


# -- every file a setting names is refused by name, at once, never with a traceback ----------------

COST_31 = "$2b$31$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy"


def _inputs(tmp_path: Path, case: str) -> tuple[dict[str, str], str]:
    """(environment, what the one problem line must say) for one bad input."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    web = tmp_path / "web.yml"
    if case == "state-fifo":
        return {"NVGPU_STATE_FILE": str(fifo)}, f"NVGPU_STATE_FILE={fifo}: is a FIFO, not a regular file"
    if case == "state-dev-null":
        return {"NVGPU_STATE_FILE": "/dev/null"}, "NVGPU_STATE_FILE=/dev/null: is a character device 1:3, not a regular"
    if case == "web-config-fifo":
        return {"NVGPU_WEB_CONFIG_FILE": str(fifo)}, f"cannot read '{fifo}': is a FIFO, not a regular file"
    if case == "key-fifo":
        web.write_text(f"tls_server_config: {{cert_file: {fifo}, key_file: {fifo}}}\n")
        return {"NVGPU_WEB_CONFIG_FILE": str(web)}, f"tls_server_config.key_file {fifo} is a FIFO"
    if case == "cost-31":
        web.write_text(f"basic_auth_users:\n  prometheus: {COST_31}\n")
        return {"NVGPU_WEB_CONFIG_FILE": str(web)}, "basic_auth_users.prometheus: bcrypt cost 31 is above 14"
    if case == "web-config-nested":
        web.write_text("a: " + "[" * 20000)
        return {"NVGPU_WEB_CONFIG_FILE": str(web)}, f"{web}: nested too deeply"
    if case == "scenario-fifo":
        return {"NVGPU_NVML_BACKEND": f"fake:{fifo}"}, f"scenario {fifo}: cannot read: is a FIFO"
    if case == "kmsg-cursor-fifo":
        env = {"NVGPU_FEATURE_KERNEL_XID": "on", "NVGPU_KMSG_PATH": str(tmp_path / "kern.log")}
        return {**env, "NVGPU_KMSG_CURSOR_FILE": str(fifo)}, f"NVGPU_KMSG_CURSOR_FILE {fifo}: is a FIFO"
    if case == "kmsg-fifo":
        return {"NVGPU_FEATURE_KERNEL_XID": "on", "NVGPU_KMSG_PATH": str(fifo)}, f"NVGPU_KMSG_PATH={fifo}: is a FIFO"
    assert case == "kmsg-dev-zero"
    env = {"NVGPU_FEATURE_KERNEL_XID": "on", "NVGPU_KMSG_PATH": "/dev/zero"}
    return env, "NVGPU_KMSG_PATH=/dev/zero: is a character device 1:5, not a regular file"


@pytest.mark.parametrize(
    "case",
    [
        "state-fifo",
        "state-dev-null",
        "web-config-fifo",
        "key-fifo",
        "cost-31",
        "web-config-nested",
        "scenario-fifo",
        "kmsg-cursor-fifo",
        "kmsg-fifo",
        "kmsg-dev-zero",
    ],
)
def test_each_bad_input_file_is_refused_by_name_and_never_hangs(tmp_path: Path, case: str) -> None:
    """A FIFO where a file should be (a plain open() waits for a writer: the check used to hang),
    a device node as the state file (/dev/null passed and was later replaced by a JSON file), a
    cost-31 bcrypt hash, YAML nested 20,000 deep: exit 2, one problem naming the input."""
    env, says = _inputs(tmp_path, case)
    env.setdefault("NVGPU_STATE_FILE", str(tmp_path / "state" / "state.json"))
    proc = _check(tmp_path, **env)  # a hang fails here (subprocess timeout)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
