"""The fault-domain scenarios of the verdict tests (tests/test_integration_verdicts.py), each a
scenario file the real exporter runs on, built from a shipped scenario, plus the kernel-log lines
that go with it. ``python tests/verdict_scenarios.py DIR`` writes them to DIR (for demos:
``nvgpu-exporter --nvml-backend fake:DIR/device-cgroup.json``).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

from exporter_proc import load_scenario

BUS = {0: "0000:00:06", 1: "0000:00:07"}  # the kernel log's form of h200x2's GPUs
OLD = "580.159.04"  # the shipped scenarios' driver and kernel module
NEW = "580.170.01"
LIB = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so."


def device_cgroup() -> dict[str, Any]:
    """Four GPUs counted by NVML; the container's device cgroup hides GPUs 2 and 3: their handle
    lookup answers NO_PERMISSION (every sample, as the worker retries it)."""
    data = load_scenario("h200x8")
    data["gpus"] = data["gpus"][:4]
    data["description"] = "4 GPUs, the pod's device cgroup hides GPUs 2 and 3 (handle lookup NO_PERMISSION)"
    data["faults"] = [
        {"function": "nvmlDeviceGetHandleByIndex", "gpu": i, "action": "error", "error": "NO_PERMISSION"}
        for i in (2, 3)
    ]
    data["events"] = []
    return data


def driver_upgrade(upgraded_at_s: float, restart_at_s: float) -> dict[str, Any]:
    """A host driver upgrade under a running worker: at ``upgraded_at_s`` the host's library file is
    replaced by 580.170.01 (the worker still maps the old one, now deleted) while the kernel module
    stays 580.159.04; at ``restart_at_s`` the worker dies, and the next one loads the new library:
    nvmlInit answers LIB_RM_VERSION_MISMATCH."""
    data = load_scenario("h200x1")
    data["description"] = "host driver upgraded under a running worker"
    data["kernel_module_version"] = OLD
    data["native_library"] = {
        "sequence": [
            {"until_s": upgraded_at_s, "value": {"path": LIB + OLD}},
            {"until_s": restart_at_s, "value": {"path": LIB + OLD, "deleted": True, "host_libraries": [LIB + NEW]}},
            {"value": {"path": LIB + NEW, "host_libraries": [LIB + NEW]}},
        ]
    }
    data["faults"] = [
        {
            "function": "nvmlDeviceGetPowerUsage",
            "from_s": restart_at_s,
            "calls": list(range(1, 1000)),  # whatever the worker's own count is by then
            "action": "exit",
        },
        {"function": "nvmlInit", "from_s": restart_at_s, "action": "error", "error": "LIB_RM_VERSION_MISMATCH"},
    ]
    return data


def fell_off_bus(at_s: float) -> dict[str, Any]:
    """GPU 1 of two falls off the bus at ``at_s``: every call on it answers GPU_IS_LOST (the kernel
    log's Xid 79 goes with it, :func:`kernel_line`)."""
    data = load_scenario("h200x2")
    data["description"] = "GPU 1 fell off the bus"
    data["faults"] = [{"function": "*", "gpu": 1, "from_s": at_s, "action": "error", "error": "GPU_IS_LOST"}]
    data["events"] = []
    return data


def application_xids() -> dict[str, Any]:
    """Two healthy GPUs; the Xids come from the kernel log (:func:`kernel_line`) and one NVML event
    (Xid 13 on GPU 0 at 1 s, whose kernel-log record names its process)."""
    data = load_scenario("h200x2")
    data["description"] = "application Xids from several processes on GPU 0, one process twice on GPU 1"
    data["events"] = [{"at_s": 1.0, "gpu": 0, "event_type": "XidCriticalError", "data": 13}]
    data["faults"] = []
    return data


def stuck_gpu() -> dict[str, Any]:
    """The design's stuck GPU: GPU 0 100 % busy, no memory, no compute process, no SM activity
    (GPM); the kernel log has Xid 13, 31 and 43 of one process (:func:`kernel_line`)."""
    data = load_scenario("h200x2")
    data["description"] = "GPU 0 stuck after Xid 13/31/43: busy and empty"
    gpu0 = data["gpus"][0]["values"]
    gpu0["nvmlDeviceGetUtilizationRates"] = {"gpu": 100, "memory": 0}
    gpu0["nvmlDeviceGetMemoryInfo"] = {"total": 150754820096, "reserved": 644939776, "free": 150109880320, "used": 0}
    gpu0["nvmlDeviceGetComputeRunningProcesses_v3"] = []
    gpu0.update({f"nvmlGpmMetricsGet:{m}": 0.0 for m in (2, 3, 5, 10)})
    gpu0["nvmlGpmMetricsGet:1"] = 100.0
    data["events"] = []
    return data


def uptime_us() -> int:
    """Microseconds since this machine booted: a kmsg line stamped with it reads as "now"."""
    return int(float(Path("/proc/uptime").read_text().split()[0]) * 1e6)


def kernel_line(seq: int, gpu: int, xid: int, pid: int, name: str, after_s: float = 0.0, tail: str = "") -> str:
    """One /dev/kmsg record (as a text line) of an Xid on h200x2's GPU ``gpu``, ``after_s`` from now."""
    us = uptime_us() + int(after_s * 1e6)
    return f"4,{seq},{us},-;NVRM: Xid (PCI:{BUS[gpu]}): {xid}, pid={pid}, name={name}, {tail or 'Ch 00000008'}\n"


SCENARIOS = {
    "device-cgroup": device_cgroup,
    "driver-upgrade": lambda: driver_upgraded_default(),
    "fell-off-bus": lambda: fell_off_bus(2.0),
    "application-xids": application_xids,
    "stuck-gpu": stuck_gpu,
}


def driver_upgraded_default() -> dict[str, Any]:
    return driver_upgrade(20.0, 40.0)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, build in SCENARIOS.items():
        (out / f"{name}.json").write_text(json.dumps(copy.deepcopy(build()), indent=1) + "\n")
        print(out / f"{name}.json")
