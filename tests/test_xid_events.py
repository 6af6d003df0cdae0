"""NVML Xid events survive worker restarts; kernel-log Xids are counted once; stuck signature."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
from exporter_proc import SCENARIOS, Exporter, load_scenario, write_scenario

UUID0 = "GPU-ef65bf38-0ae6-479b-9ebc-46c6463961e6"
UUID1 = "GPU-094221fd-19f9-1561-7ef8-949bb0d57826"


def _worker_pid(exp: Exporter) -> int:
    kids = [p for p in psutil.Process(exp.proc.pid).children() if "exporter.worker" in " ".join(p.cmdline())]
    assert len(kids) == 1
    return kids[0].pid


def test_xid79_counted_once_and_survives_worker_restart(tmp_path: Path) -> None:
    with Exporter(SCENARIOS / "h200x2-xid79.json", tmp_path) as exp:
        s = exp.wait_for(lambda s: s.value("nvgpu_events_enabled", gpu="1", uuid=UUID1) == 0.0, what="events state")
        assert s.value("nvgpu_events_enabled", gpu="0", uuid=UUID0) == 1.0
        s = exp.wait_for(
            lambda s: s.value("nvgpu_xid_errors_total", gpu="0", uuid=UUID0, xid="79") == 1.0,
            timeout=35,
            what="Xid 79 on GPU 0",
        )
        last = s.value("nvgpu_xid_last_timestamp_seconds", gpu="0", uuid=UUID0, xid="79")
        assert last is not None and abs(last - time.time()) < 30
        assert not s.find("nvgpu_xid_errors_total", gpu="1")
        assert not [x for x in s.find("nvgpu_nvml_errors_total") if x.labels["feature"] == "events"]
        os.kill(_worker_pid(exp), signal.SIGKILL)
        s = exp.wait_for(
            lambda s: (
                (s.value("nvgpu_worker_restarts_total", reason="killed") or 0) >= 1 and s.value("nvgpu_up") == 1.0
            ),
            what="restart",
        )
        s = exp.wait_samples(3)  # three samples of the new worker: the Xid is not counted again
        assert s.value("nvgpu_xid_errors_total", gpu="0", uuid=UUID0, xid="79") == 1.0
        assert exp.terminate() == 0


def test_stuck_signature_and_kernel_log_xids(tmp_path: Path) -> None:
    data = load_scenario("h200x2")
    gpu0 = data["gpus"][0]["values"]
    gpu0["nvmlDeviceGetUtilizationRates"] = {"gpu": 100, "memory": 0}
    gpu0["nvmlDeviceGetMemoryInfo"] = {"total": 150754820096, "reserved": 644939776, "free": 150109880320, "used": 0}
    gpu0["nvmlDeviceGetComputeRunningProcesses_v3"] = []
    gpu0.update({f"nvmlGpmMetricsGet:{m}": 0.0 for m in (2, 3, 5, 10)})  # GPM: no SM works
    gpu0["nvmlGpmMetricsGet:1"] = 100.0
    kmsg = tmp_path / "kern.log"
    kmsg.write_text(
        "6,100,5000000,-;NVRM: Xid (PCI:0000:00:06): 13, pid=4242, name=python3, "
        "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)\n"
        "6,101,5000100,-;NVRM: Xid (PCI:0000:00:06): 31, pid=4242, name=python3, "
        "Ch 00000008, intr 00000000. MMU Fault\n"
        "6,102,6000000,-;NVRM: Xid (PCI:0000:00:06): 43, pid=4242, name=python3, Ch 00000008\n"
    )
    env = {"NVGPU_FEATURE_KERNEL_XID": "on", "NVGPU_KMSG_PATH": str(kmsg), "NVGPU_STUCK_AFTER_SECONDS": "2"}
    with Exporter(write_scenario(tmp_path, data), tmp_path, env=env) as exp:
        s = exp.wait_for(
            lambda s: s.value("nvgpu_xid_errors_total", gpu="0", uuid=UUID0, xid="43") == 1.0,
            timeout=20,
            what="kernel-log Xid 43",
        )
        assert s.value("nvgpu_xid_errors_total", gpu="0", uuid=UUID0, xid="13") == 1.0
        assert s.value("nvgpu_xid_errors_total", gpu="0", uuid=UUID0, xid="31") == 1.0
        assert s.value("nvgpu_kernel_log_up") == 1.0
        assert s.value("nvgpu_stuck_context_suspected", gpu="1", uuid=UUID1) == 0.0
        s = exp.wait_for(
            lambda s: s.value("nvgpu_stuck_context_suspected", gpu="0", uuid=UUID0) == 1.0,
            timeout=15,
            what="stuck signature",
        )
        since = s.value("nvgpu_stuck_context_since_timestamp_seconds", gpu="0", uuid=UUID0)
        assert since is not None and time.time() - since >= 2
        assert exp.terminate() == 0
    # a restart with the same cursor does not count the history again
    with Exporter(write_scenario(tmp_path, data), tmp_path, env=env) as exp:
        exp.wait_for(lambda s: s.value("nvgpu_kernel_log_up") == 1.0 and s.value("nvgpu_up") == 1.0)
        time.sleep(2.5)  # the point: a kernel-log poll (every 2 s) passes and the history is not counted again
        s = exp.scrape()
        assert s.value("nvgpu_xid_errors_total", gpu="0", uuid=UUID0, xid="43") is None
        assert exp.terminate() == 0


def test_unreadable_kernel_log_is_unsupported_only(tmp_path: Path) -> None:
    env = {"NVGPU_FEATURE_KERNEL_XID": "on", "NVGPU_KMSG_PATH": str(tmp_path / "missing")}
    with Exporter(SCENARIOS / "h200x2.json", tmp_path, env=env) as exp:
        s = exp.wait_for(lambda s: s.value("nvgpu_kernel_log_up") == 0.0 and s.value("nvgpu_up") == 1.0)
        assert s.value("nvgpu_feature_enabled", feature="kernel_xid", reason="unsupported") == 0.0
        assert s.gpus() == {"0", "1"}
        lines = [r for r in exp.log_records() if "kernel_xid" in r.get("msg", "")]
        assert len(lines) == 1
        assert exp.terminate() == 0
