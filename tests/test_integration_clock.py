"""A wall-clock step of an hour, forwards then back, on the real exporter: no decision changes.

Both processes run with ``tests/clockstep/sitecustomize.py`` on their path: the test writes a number
of seconds to a file and from then on ``time.time()`` of the supervisor and of every worker is that
far off, while the monotonic clock runs on. The fake's scenario time runs on the monotonic clock
(docs/scenarios.md), so the scenario itself does not jump. What a step must not change, and did
before the durations moved to the monotonic clock: readings going stale (or looking fresh), a
quarantine expiring early (its TTL is 30 min: an hour forward is past it by the wall clock), the
stuck signature firing at once (it needs 120 s; an hour forward is past that by the wall clock),
worker restarts, readiness. What must change is only what is stamped: the last sample's timestamp.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from exporter_proc import ROOT, Exporter, Scrape, load_scenario, write_scenario

INTERVAL = 0.5


def decisions(s: Scrape) -> dict[str, object]:
    """What the step must not change."""
    return {
        "up": s.value("nvgpu_up"),
        "gpus up": [s.value("nvgpu_device_up", gpu=g) for g in "01"],
        "fresh readings": [bool(s.find("nvgpu_memory_used_bytes", gpu=g)) for g in "01"],
        "power quarantined": s.value("nvgpu_feature_enabled", feature="power", reason="quarantined") == 0.0,
        "stuck": s.value("nvgpu_stuck_context_suspected", gpu="0"),
    }


STEADY = {"up": 1.0, "gpus up": [1.0, 1.0], "fresh readings": [True, True], "power quarantined": True, "stuck": 0.0}


def steady(s: Scrape) -> bool:
    return decisions(s) == STEADY


def test_a_wall_clock_step_of_an_hour_either_way_changes_no_decision(tmp_path: Path) -> None:
    scenario = load_scenario("h200x2")
    g0 = scenario["gpus"][0]["values"]
    g0["nvmlDeviceGetUtilizationRates"] = {"gpu": 100, "memory": 0}  # busy with nothing on it:
    g0["nvmlDeviceGetMemoryInfo"] = {"total": 150754820096, "reserved": 644939776, "free": 150109880320, "used": 0}
    g0.update({f"nvmlGpmMetricsGet:{m}": 0.0 for m in (1, 2, 3, 5, 10)})  # the stuck-context signature
    for fn in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"):
        g0[fn] = []
    # a crash in power on both GPUs (two different GPUs: the feature, not one GPU, is at fault)
    # quarantines it for 30 minutes (the next workers do not call it)
    scenario["faults"] = [{"function": "nvmlDeviceGetPowerUsage", "action": "segfault"}]
    step = tmp_path / "clock-step"
    step.write_text("0")
    env = {
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "clockstep"), os.environ.get("PYTHONPATH", "")]),
        "CLOCK_STEP_FILE": str(step),
        "NVGPU_QUARANTINE_AFTER": "1",
        "NVGPU_QUARANTINE_TTL_SECONDS": "1800",
        "NVGPU_STUCK_AFTER_SECONDS": "120",
    }
    with Exporter(write_scenario(tmp_path, scenario), tmp_path, env=env, interval=INTERVAL) as exp:
        before = exp.wait_for(steady, timeout=30, what="power quarantined, both GPUs fresh, no stuck signature")
        ts0 = before.value("nvgpu_last_sample_timestamp_seconds")
        assert ts0 is not None and abs(ts0 - time.time()) < 60
        for offset, seen in ((3600.0, lambda ts: ts > ts0 + 3000), (-3600.0, lambda ts: ts < ts0 + 600)):
            step.write_text(repr(offset))
            stepped = exp.wait_for(
                lambda s, seen=seen: seen(s.value("nvgpu_last_sample_timestamp_seconds") or ts0 + 1800),
                timeout=10,
                what=f"a sample stamped {offset:+.0f} s off",
            )
            assert decisions(stepped) == STEADY
            end, scrapes = time.monotonic() + 6 * INTERVAL, 0
            while time.monotonic() < end:  # several samples after the step: nothing changes
                s = exp.scrape()
                assert decisions(s) == STEADY, offset
                assert exp.get("/readyz")[0] == 200
                scrapes += 1
                time.sleep(0.1)
            assert scrapes >= 10
        restarts = {x.labels["reason"]: x.value for x in s.find("nvgpu_worker_restarts_total") if x.value}
        assert restarts == {"crash": 2.0}, restarts  # the two crashes (one per GPU) that quarantined power
        assert not [r for r in exp.log_records() if "expired" in r.get("msg", "")]
        assert exp.terminate() == 0
