"""Quarantine store: window, threshold, TTL expiry, persistence, corrupt files."""

from __future__ import annotations

import json
from pathlib import Path

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
