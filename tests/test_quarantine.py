"""Quarantine store: window, threshold, TTL expiry, persistence, corrupt files."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from exporter.supervisor import quarantine
from exporter.supervisor.quarantine import QuarantineStore


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def test_threshold_within_window(tmp_path: Path) -> None:
    clock = Clock()
    store = QuarantineStore(str(tmp_path / "s.json"), threshold=3, window_s=600, ttl_s=86400, clock=clock)
    assert store.record("nvlink_throughput", "nvmlDeviceGetFieldValues") is None
    clock.t += 601  # the first crash falls out of the window
    assert store.record("nvlink_throughput", "nvmlDeviceGetFieldValues") is None
    assert store.record("nvlink_throughput", "nvmlDeviceGetFieldValues") is None
    assert store.record("temperature", "nvmlDeviceGetTemperatureV") is None  # other features do not count
    q = store.record("nvlink_throughput", "nvmlDeviceGetFieldValues")
    assert q is not None and q.crashes == 3 and q.until == clock.t + 86400
    assert list(store.details()) == ["nvlink_throughput"]


def test_persisted_and_expires(tmp_path: Path) -> None:
    clock = Clock()
    path = str(tmp_path / "state.json")
    store = QuarantineStore(path, threshold=1, window_s=600, ttl_s=3600, clock=clock)
    store.record("processes", "nvmlDeviceGetComputeRunningProcesses_v3")
    reloaded = QuarantineStore(path, threshold=1, window_s=600, ttl_s=3600, clock=clock)
    assert "processes" in reloaded.details()
    clock.t += 3601
    assert reloaded.details() == {}
    assert reloaded.clear() == []


def test_clear_one(tmp_path: Path) -> None:
    store = QuarantineStore(str(tmp_path / "s.json"), threshold=1, window_s=600, ttl_s=3600)
    store.record("fan", "nvmlDeviceGetFanSpeed_v2")
    store.record("ecc", "nvmlDeviceGetTotalEccErrors")
    assert store.clear("fan") == ["fan"]
    assert list(QuarantineStore(str(tmp_path / "s.json"), 1, 600, 3600).details()) == ["ecc"]


def test_corrupt_or_foreign_file_means_empty(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text("{not json")
    assert QuarantineStore(str(path), 1, 600, 3600).details() == {}
    path.write_text(json.dumps({"version": 99}))
    assert QuarantineStore(str(path), 1, 600, 3600).details() == {}


# -- a wall-clock step changes no decision ----------------------------------------------------


class Clocks:
    """The monotonic clock and a wall clock that runs with it, offset by the steps so far."""

    def __init__(self) -> None:
        self.mono = 5_000.0
        self.offset = 1_800_000_000.0 - 5_000.0

    def wall(self) -> float:
        return self.mono + self.offset


def _pair(tmp_path: Path, ttl_s: float = 3600.0) -> tuple[Clocks, QuarantineStore]:
    clocks = Clocks()
    store = QuarantineStore(
        str(tmp_path / "s.json"), 2, 600.0, ttl_s, clock=clocks.wall, mono=lambda: clocks.mono, boot_id="boot-a"
    )
    return clocks, store


@pytest.mark.parametrize("step_s", [3600.0, -3600.0])
def test_a_wall_clock_step_neither_ends_nor_extends_a_quarantine(tmp_path: Path, step_s: float) -> None:
    """Quarantined (TTL 1 h), then the wall clock steps by an hour: still quarantined 59 minutes
    later, released at 61 minutes, whichever way it stepped; after a container restart (same boot)
    the file's monotonic instants decide the same."""
    clocks, store = _pair(tmp_path)
    store.record("fan", "nvmlDeviceGetFanSpeed_v2")
    assert store.record("fan", "nvmlDeviceGetFanSpeed_v2") is not None
    clocks.offset += step_s
    clocks.mono += 59 * 60
    assert list(store.details()) == ["fan"]
    restarted = QuarantineStore(
        store.path, 2, 600.0, 3600.0, clock=clocks.wall, mono=lambda: clocks.mono, boot_id="boot-a"
    )
    assert list(restarted.details()) == ["fan"]
    clocks.mono += 2 * 60
    assert store.details() == {} and restarted.details() == {}


@pytest.mark.parametrize("step_s", [3600.0, -3600.0])
def test_a_wall_clock_step_moves_no_crash_in_or_out_of_the_window(tmp_path: Path, step_s: float) -> None:
    """One crash, a step of an hour, a second crash 5 minutes later: the two are within the 10-minute
    window (threshold 2) and quarantine the feature, whichever way the clock stepped."""
    clocks, store = _pair(tmp_path)
    store.record("power", "nvmlDeviceGetPowerUsage")
    clocks.offset += step_s
    clocks.mono += 300
    assert store.record("power", "nvmlDeviceGetPowerUsage") is not None


def test_after_a_reboot_a_quarantine_lasts_at_most_its_ttl_from_the_load(tmp_path: Path) -> None:
    """Another boot: the file's monotonic instants mean nothing, only wall times are left. A wall
    clock set an hour back cannot keep the quarantine past its TTL from the moment it is loaded."""
    clocks, store = _pair(tmp_path)
    store.record("ecc", "nvmlDeviceGetTotalEccErrors")
    store.record("ecc", "nvmlDeviceGetTotalEccErrors")
    clocks.offset -= 3600.0  # the new boot's clock is an hour behind
    later = QuarantineStore(store.path, 2, 600.0, 3600.0, clock=clocks.wall, mono=lambda: clocks.mono, boot_id="b")
    assert list(later.details()) == ["ecc"]
    clocks.mono += 3601
    assert later.details() == {}


# -- the state file never blocks, and a node that is not a regular file is never replaced ----------


def store_at(path: Path | str, threshold: int = 1) -> QuarantineStore:
    return QuarantineStore(str(path), threshold=threshold, window_s=600, ttl_s=3600, clock=Clock())


def test_a_fifo_state_file_is_refused_at_once_and_never_replaced(tmp_path: Path) -> None:
    """A plain open() of a FIFO waits for a writer: the start (and `quarantine`) would hang. It is
    refused at once, the quarantine holds in memory, and the FIFO is left as it is."""
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)
    store = store_at(fifo)
    assert store.load_error == "is a FIFO, not a regular file" and store.refused is not None
    assert store.record("fan", "nvmlDeviceGetFanSpeed_v2") is not None, "the quarantine holds in memory"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and not list(tmp_path.glob(".state-*"))


def test_a_node_that_appears_later_is_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    store = store_at(path)
    os.mkfifo(path)  # after the start: found by the write, not by the load
    store.record("fan", "nvmlDeviceGetFanSpeed_v2")
    assert stat.S_ISFIFO(os.lstat(path).st_mode) and store.refused == "is a FIFO, not a regular file"


def test_dev_null_is_refused_never_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVGPU_STATE_FILE=/dev/null: refused (memory only is NVGPU_STATE_FILE=''). os.replace is
    watched, not run: were the refusal broken, a test running as root would replace /dev/null."""
    replaced: list[tuple[str, str]] = []
    monkeypatch.setattr(quarantine.os, "replace", lambda src, dst: replaced.append((src, dst)))
    store = store_at("/dev/null")
    assert store.load_error == "is a character device 1:3, not a regular file"
    store.record("fan", "nvmlDeviceGetFanSpeed_v2")
    store.clear()
    assert replaced == [] and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_saves_on_the_event_loop_never_wait_for_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write stuck on a hung mount: record() on the event loop returns at once; when the stuck
    write comes back after a newer save reached the file, it does not overwrite it."""
    path = tmp_path / "state.json"
    store = store_at(path, threshold=100)
    hung = threading.Event()
    real_dump = quarantine.json.dump
    calls = [0]

    def dump(data: Any, fh: Any) -> None:
        calls[0] += 1
        if calls[0] == 1:
            hung.wait()  # the first write sits on a hung mount
        real_dump(data, fh)

    monkeypatch.setattr(quarantine.json, "dump", dump)

    async def crash_twice() -> None:
        store.record("fan", "nvmlDeviceGetFanSpeed_v2")  # the write that hangs
        store.record("fan", "nvmlDeviceGetFanSpeed_v2")

    asyncio.run(crash_twice())  # returns: the loop was never held by the hung write
    wait_until(lambda: calls[0] == 1, 10, "the first write to start (and hang)")
    assert not path.exists()
    hung.set()
    wait_until(lambda: path.exists() and len(json.loads(path.read_text())["history"]) == 2, 10, "both saves")
    assert len(json.loads(path.read_text())["history"]) == 2


def test_the_quarantine_command_does_not_hang_on_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "quarantine", "--state-file", str(fifo)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 1, proc.stderr
    assert f"state file {fifo} is unreadable (is a FIFO, not a regular file)" in proc.stderr
    assert "Traceback" not in proc.stderr and stat.S_ISFIFO(os.lstat(fifo).st_mode)
