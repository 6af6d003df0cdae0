"""Shutdown: SIGTERM never leaves a worker behind, whatever the timeout settings.

The issue's case: ``NVGPU_SHUTDOWN_TIMEOUT_SECONDS`` below the kill escalation (SIGTERM, 2 s,
SIGKILL) and a worker hung in an NVML call that ignores SIGTERM; the exporter exited 0 and the
worker lived on with parent 1, still an NVML client. Here the worker hangs either in ``nvmlInit``
on its main thread (SIGTERM ignored process-wide: only SIGKILL ends it) or in one GPU's sampling
thread (SIGTERM blocked on that thread). The exporter must exit 0 within its timeout plus a small
margin, and no worker process may remain (a zombie awaiting its reaper is not a process that runs).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest
from exporter_proc import Exporter, load_scenario, write_scenario
from waiting import masks_signal, wait_until

HANGS = {
    "init": {"function": "nvmlInit", "action": "hang", "ignore_sigterm": True},
    "sample": {"function": "nvmlDeviceGetPowerUsage", "from_s": 5.0, "action": "hang", "ignore_sigterm": True},
}


def _workers(pid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if "exporter.worker" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("timeout_s", [1, 2, 5])
@pytest.mark.parametrize("hang", sorted(HANGS))
def test_sigterm_leaves_no_worker_whatever_the_timeout(tmp_path: Path, timeout_s: int, hang: str) -> None:
    scenario = load_scenario("h200x1")
    scenario["faults"] = [HANGS[hang]]
    env = {
        "NVGPU_SHUTDOWN_TIMEOUT_SECONDS": str(timeout_s),
        "NVGPU_INIT_DEADLINE_SECONDS": "120",  # the supervisor must not replace the hung worker itself
        "NVGPU_SAMPLE_DEADLINE_SECONDS": "120",
    }
    with Exporter(write_scenario(tmp_path, scenario), tmp_path, env=env) as exp:
        workers: list[psutil.Process] = exp.wait_until(lambda: _workers(exp.proc.pid), 20, "a worker")
        exp.wait_until(  # inside the hang (sampling hangs from 1 s of scenario time)
            lambda: any(masks_signal(p.pid, signal.SIGTERM) for p in workers), 20, "the worker hung ignoring SIGTERM"
        )
        if hang == "sample":
            scrape = exp.scrape()
            assert scrape.value("nvgpu_device_up", gpu="0") is not None  # the worker did sample
        assert all(_running(p) for p in workers)
        t0 = time.monotonic()
        code = exp.terminate(timeout=timeout_s + 15)
        took = time.monotonic() - t0
        assert code == 0, exp.logs()[-3000:]
        assert took < timeout_s + 5, took
        wait_until(  # a moment for the kernel to end them
            lambda: not [p for p in workers if _running(p)],
            2,
            lambda: (
                f"no worker running after the exporter exited; still running: {[p.pid for p in workers if _running(p)]}"
            ),
            lambda: exp.logs()[-3000:],
        )
        if hang == "init":  # the hung main thread ignores SIGTERM: either the worker's stdin thread
            # stopped it in order (nvmlInit in flight, so no nvmlShutdown) or the supervisor escalated
            logs = exp.logs()
            assert "killing it" in logs or "worker stopped (nvmlShutdown skipped)" in logs, logs[-3000:]
