"""The hardware check (tests/hardware/test_process_usage_hw.py) judges what it measures
with pure functions; these run here, without a GPU, so a mistake in them does not cost a GPU run."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from exporter_proc import Scrape

GIB = 1 << 30
HW = Path(__file__).resolve().parent / "hardware" / "test_process_usage_hw.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hw_process_usage", HW)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hw = _module()
REPORTS = {
    "idle": {"pid": 101, "allocated_bytes": 3 * GIB, "context_bytes": 520 << 20, "reserved_before": 2 << 20,
             "reserved_after": (2 << 20) + 3 * GIB},
    "busy": {"pid": 202, "allocated_bytes": 7 * GIB, "context_bytes": 1100 << 20, "reserved_before": 400 << 20,
             "reserved_after": (400 << 20) + 7 * GIB},
}  # fmt: skip


def _scrape(idle_mem: int, busy_mem: int, idle_sm: float, busy_sm: float) -> Scrape:
    lines = ["# TYPE nvgpu_process_memory_used_bytes gauge", "# TYPE nvgpu_process_sm_utilization_ratio gauge"]
    for pid, mem, sm in ((101, idle_mem, idle_sm), (202, busy_mem, busy_sm), ("other", 5, 0.9)):
        labels = f'gpu="0",uuid="GPU-x",pid="{pid}",process="python3",namespace="",pod="",container=""'
        lines.append(f"nvgpu_process_memory_used_bytes{{{labels}}} {mem}")
        lines.append(f"nvgpu_process_sm_utilization_ratio{{{labels}}} {sm}")
    return Scrape("\n".join(lines) + "\n")


def test_expected_memory_is_context_plus_reserved() -> None:
    assert hw.expected_bytes(REPORTS["idle"]) == (520 << 20) + 3 * GIB


def test_a_right_run_passes_and_reads_per_pid() -> None:
    exp_idle, exp_busy = hw.expected_bytes(REPORTS["idle"]), hw.expected_bytes(REPORTS["busy"])
    readings = [hw.per_process(_scrape(exp_idle, exp_busy + (4 << 20), 0.0, 0.97), "0") for _ in range(5)]
    assert set(readings[0]) == {"101", "202"}  # "other" is not a process
    verdict = hw.evaluate(REPORTS, readings)
    assert verdict["failures"] == []
    assert verdict["busy"]["sm_median"] == 0.97 and abs(verdict["busy"]["memory_error"]) < 0.001


def test_wrong_runs_fail_with_the_reason() -> None:
    exp_idle, exp_busy = hw.expected_bytes(REPORTS["idle"]), hw.expected_bytes(REPORTS["busy"])
    off = [hw.per_process(_scrape(int(exp_idle * 1.2), exp_busy, 0.3, 0.2), "0")]
    failures = hw.evaluate(REPORTS, off)["failures"]
    assert any(f.startswith("idle: exported") for f in failures)
    assert any(f.startswith("busy: median SM") for f in failures)
    assert any(f.startswith("idle: SM utilization up to") for f in failures)
    assert hw.evaluate(REPORTS, [{}])["failures"] == [
        "idle (pid 101): no per-process series",
        "busy (pid 202): no per-process series",
    ]
