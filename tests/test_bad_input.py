"""Bad input found by a fresh-user trial: each gets a clear error and nothing half-starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from exporter_proc import SCENARIOS
from exporter_proc import load_scenario as shipped

from exporter.common.scenarios.scenario import ScenarioError, load_scenario
from exporter.supervisor.http.web import accepts_gzip


def _run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "exporter", *args], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"gpus": [{"uuid": "GPU-1", "values": {"nvmlDeviceGetPowerUsage": NaN}}]}', "NaN is not a number"),
        (b'{"gpus": [{"uuid": "GPU-1", "values": {"nvmlDeviceGetPowerUsage": {"cycl": [1, 2]}}}]}', "'cycle'"),
        (
            b'{"gpus": [{"uuid": "GPU-1", "values": '
            b'{"nvmlDeviceGetPowerUsage": {"cycle": [1], "step_s": 5, "x": 1}}}]}',
            "unknown keys ['x']",
        ),
        (
            b'{"gpus": [{"uuid": "GPU-1", "values": {"nvmlDeviceGetPowerUsage": {"error": "NOT_SUPORTED"}}}]}',
            "NVML error name",
        ),
        (b'{"gpus": [{"uuid": 7}]}', "gpus[0].uuid"),
        (b'{"gpus": [{"uuid": "GPU-1"}, {"uuid": "GPU-1"}]}', "not already used"),
        (b'{"gpus": [{"uuid": "GPU-1", "fields": {"abc:def": 1}}]}', "fieldId"),
        (b'{"gpus": [{"uuid": "GPU-1", "nvlink_link_count": -5}]}', "non-negative integer"),
        (b"[1, 2]", "a JSON object"),
    ],
)
def test_bad_scenario_is_refused_before_anything_starts(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ScenarioError, match="scenario .*bad.json"):
        load_scenario(str(path))
    proc = _run(["--check-config", "--nvml-backend", f"fake:{path}"], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "bad.json" in proc.stderr


@pytest.mark.parametrize("name", ["h200x1", "h200x2", "h200x8", "h200x2-nvlink-crash", "h200x2-xid79"])
def test_every_shipped_scenario_is_valid(name: str) -> None:
    """Named, so an empty or moved folder fails instead of passing vacuously."""
    shipped_files = {p.stem for p in SCENARIOS.glob("*.json")}
    assert name in shipped_files, f"{name}.json is not in {SCENARIOS}"
    assert load_scenario(str(SCENARIOS / f"{name}.json"))["gpus"]


def test_tiny_interval_is_refused(tmp_path: Path) -> None:
    proc = _run(["--check-config", "--sample-interval", "1e-9"], tmp_path)
    assert proc.returncode == 2 and "at least 0.1 s" in proc.stderr


def test_quarantine_clear_unknown_feature(tmp_path: Path) -> None:
    proc = _run(["--state-file", str(tmp_path / "s.json"), "quarantine", "--clear", "nvlink_thruput"], tmp_path)
    assert proc.returncode == 2 and "did you mean nvlink_throughput" in proc.stderr
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("content", ["{corrupt", "[1, 2]"])
def test_quarantine_clear_never_overwrites_an_unreadable_state_file(tmp_path: Path, content: str) -> None:
    state = tmp_path / "s.json"
    state.write_text(content)
    proc = _run(["--state-file", str(state), "quarantine", "--clear", "nvlink_throughput"], tmp_path)
    assert proc.returncode == 1 and "unreadable" in proc.stderr
    assert state.read_text() == content


def test_quarantine_clear_with_nothing_to_clear_writes_nothing(tmp_path: Path) -> None:
    state = tmp_path / "dir" / "s.json"
    proc = _run(["--state-file", str(state), "quarantine", "--clear", "fan"], tmp_path)
    assert proc.returncode == 0 and "cleared: nothing" in proc.stdout
    assert not state.parent.exists()


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("gzip", True),
        ("gzip;q=0", False),
        ("gzip; q=0.5, br", True),
        ("br, deflate", False),
        ("", False),
        ("GZIP", True),
        ("x-gzip", True),
        ("gzip;q=bad", False),
    ],
)
def test_accept_encoding(header: str, expected: bool) -> None:
    assert accepts_gzip(header) is expected


def test_odd_gpu_name_keeps_the_exposition_valid(tmp_path: Path) -> None:
    from exporter_proc import Exporter, write_scenario

    data = shipped("h200x1")
    data["gpus"][0]["name"] = 'NVIDIA "H200"\\ ünïcode'
    with Exporter(write_scenario(tmp_path, data), tmp_path) as exp:
        scrape = exp.wait_for(lambda s: s.find("nvgpu_gpu_info"))
        assert scrape.find("nvgpu_gpu_info")[0].labels["name"] == 'NVIDIA "H200"\\ ünïcode'
        assert exp.terminate() == 0
