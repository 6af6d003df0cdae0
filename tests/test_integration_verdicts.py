"""The verdicts on the real exporter, one input per fault domain (tests/verdict_scenarios.py).

Each test runs the real supervisor and worker on a fake scenario (and, where Xids matter, a kernel
log in a file), and reads the answer where an operator or a node-local consumer would: the
``nvgpu_gpu_health_verdict`` series, ``/api/v1/verdicts``, the log, and ``nvgpu-exporter
npd-check``'s exit status. The promtool tests of the alerts on the same series are
deploy/prometheus/tests/verdicts.yaml.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import verdict_scenarios as vs
from exporter_proc import Exporter, Scrape, write_scenario
from fakeproc import Container, make_container_logs, make_proc

UUID0 = "GPU-ef65bf38-0ae6-479b-9ebc-46c6463961e6"  # h200x2's GPUs
UUID1 = "GPU-094221fd-19f9-1561-7ef8-949bb0d57826"
INTERVAL = 0.5


def verdict(s: Scrape, gpu: str) -> tuple[str, str, str] | None:
    found = s.find("nvgpu_gpu_health_verdict", gpu=gpu)
    if len(found) != 1:
        return None
    labels = found[0].labels
    return labels["verdict"], labels["domain"], labels["cause"]


def document(exp: Exporter) -> dict[str, Any]:
    status, headers, body = exp.get("/api/v1/verdicts")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    doc: dict[str, Any] = json.loads(body)
    assert doc["schema_version"] == 1
    return doc


def npd_check(exp: Exporter, *args: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "npd-check", "--url", f"{exp.base}/api/v1/verdicts", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return proc.returncode, proc.stdout.strip()


def test_the_device_cgroup_case_is_the_exporters_fault_not_lost_gpus(tmp_path: Path) -> None:
    """NVML counts 4 GPUs, the handle lookup of 2 and 3 answers NO_PERMISSION: no lost GPU, no
    DeviceLost, a fix_exporter verdict naming each hidden GPU and its device node."""
    with Exporter(write_scenario(tmp_path, vs.device_cgroup()), tmp_path, interval=INTERVAL) as exp:
        s = exp.wait_for(
            lambda s: (
                verdict(s, "2") == ("fix_exporter", "exporter", "device_access_denied")
                and verdict(s, "3") == ("fix_exporter", "exporter", "device_access_denied")
                and verdict(s, "0") == ("ok", "none", "none")
            ),
            what="verdicts",
        )
        s = exp.wait_samples(3)
        for gpu in ("2", "3"):
            assert s.value("nvgpu_device_state", gpu=gpu, state="lost") == 0.0
            assert s.value("nvgpu_device_state", gpu=gpu, state="unknown") == 1.0
            assert not s.find("nvgpu_device_faults_total", gpu=gpu)
        assert verdict(s, "1") == ("ok", "none", "none")
        assert not [x for x in s.find("nvgpu_gpu_health_verdict") if x.labels["verdict"] == "reboot_node"]
        doc = document(exp)
        hidden = {g["gpu"]: g for g in doc["gpus"] if g["verdict"] == "fix_exporter"}
        assert set(hidden) == {"2", "3"}
        assert "/dev/nvidia2" in hidden["2"]["action"] and "NO_PERMISSION" in hidden["2"]["faults"][0]["evidence"][0]
        assert hidden["2"]["state"] == "denied" and hidden["2"]["owner"] == "exporter deployment"
        assert doc["node"]["verdict"] == "fix_exporter"
        code, line = npd_check(exp)
        assert code == 2 and "exporter cannot see GPU 2,3" in line and len(line) <= 80  # Unknown, never NonOK
        assert npd_check(exp, "--min-verdict", "reboot_node")[0] == 2
        status, _, page = exp.get("/")
        assert status == 200 and b"DENIED to the exporter" in page
        said = [r for r in exp.log_records() if "verdict" in r.get("msg", "") and r.get("gpu") == "2"]
        assert len(said) == 1 and "fix_exporter" in said[0]["msg"]  # logged once, with its evidence
        assert "NO_PERMISSION" in said[0]["msg"]
        assert exp.terminate() == 0


def test_a_host_driver_upgrade_under_a_running_worker_is_the_drivers_fault(tmp_path: Path) -> None:
    """At 3 s the host's library is replaced by a newer one under the running worker (the kernel
    module stays): the running worker sees its mapped file deleted and the new one beside it; at
    8 s the worker dies and the next one meets LIB_RM_VERSION_MISMATCH. Both say: the driver
    (reboot_node, domain driver), never the exporter."""
    scenario = write_scenario(tmp_path, vs.driver_upgrade(3.0, 8.0))
    env = {"NVGPU_REPROBE_SECONDS": "1", "NVGPU_UNHEALTHY_AFTER_SECONDS": "1"}
    with Exporter(scenario, tmp_path, env=env, interval=INTERVAL) as exp:
        s = exp.wait_for(lambda s: verdict(s, "0") == ("ok", "none", "none"), what="ok first")
        info = s.find("nvgpu_nvml_library_info")[0].labels
        assert (info["origin"], info["state"], info["library_version"]) == ("host", "ok", vs.OLD)
        s = exp.wait_for(
            lambda s: verdict(s, "0") == ("reboot_node", "driver", "driver_library_mismatch"),
            timeout=20,
            what="the running worker sees the upgrade",
        )
        assert s.value("nvgpu_worker_restarts_total", reason="exit") == 0.0  # before the restart
        assert s.find("nvgpu_nvml_library_info")[0].labels["state"] == "driver_upgraded"
        assert s.value("nvgpu_driver_reload_required") == 1.0
        s = exp.wait_for(
            lambda s: (s.value("nvgpu_nvml_init_failures_total", error="LIB_RM_VERSION_MISMATCH") or 0) >= 1,
            timeout=30,
            what="the next worker's init",
        )
        assert verdict(s, "0") == ("reboot_node", "driver", "driver_library_mismatch")
        info = s.find("nvgpu_nvml_library_info")[0].labels
        assert (info["library_version"], info["kernel_module_version"]) == (vs.NEW, vs.OLD)
        doc = document(exp)
        evidence = " ".join(doc["gpus"][0]["faults"][0]["evidence"])
        assert "LIB_RM_VERSION_MISMATCH" in evidence and vs.OLD in evidence
        said = [r for r in exp.log_records() if r.get("msg", "").startswith("native library:")]
        assert any("driver_upgraded" in r["msg"] and r["level"] == "ERROR" for r in said)
        assert exp.get("/healthz")[0] == 200  # a restart cannot cure it
        assert exp.terminate() == 0


def test_the_images_own_library_is_the_exporters_fault_and_strict_refuses_it(tmp_path: Path) -> None:
    scenario = vs.driver_upgrade(3.0, 8.0)
    scenario["native_library"] = {
        "path": "/usr/local/lib/python3.12/site-packages/nvidia/lib/libnvidia-ml.so.575.51.03",
        "origin": "image",
        "host_libraries": [vs.LIB + vs.OLD],
    }
    scenario["faults"] = []
    path = write_scenario(tmp_path, scenario)
    with Exporter(path, tmp_path, interval=INTERVAL) as exp:
        s = exp.wait_for(
            lambda s: verdict(s, "0") == ("fix_exporter", "exporter", "nvml_library_not_hosts"), what="verdict"
        )
        assert s.find("nvgpu_nvml_library_info")[0].labels["origin"] == "image"
        assert s.value("nvgpu_driver_reload_required") == 0.0
        assert exp.terminate() == 0
    strict = Exporter(path, tmp_path, env={"NVGPU_SELFCHECK": "strict"}, interval=INTERVAL)
    try:
        assert strict.proc.wait(timeout=30) == 3  # EXIT_SELFCHECK
        assert "site-packages/nvidia/lib/libnvidia-ml.so.575.51.03" in strict.logs()
    finally:
        strict.kill_group()


def test_a_gpu_that_fell_off_the_bus_asks_for_a_reboot(tmp_path: Path) -> None:
    kmsg = tmp_path / "kern.log"
    kmsg.write_text(vs.kernel_line(100, 1, 79, 0, "kernel", after_s=2.0, tail="GPU has fallen off the bus."))
    env = {"NVGPU_FEATURE_KERNEL_XID": "on", "NVGPU_KMSG_PATH": str(kmsg)}
    with Exporter(write_scenario(tmp_path, vs.fell_off_bus(2.0)), tmp_path, env=env, interval=INTERVAL) as exp:
        s = exp.wait_for(
            lambda s: verdict(s, "1") == ("reboot_node", "gpu", "fell_off_bus"), timeout=25, what="reboot verdict"
        )
        assert verdict(s, "0") == ("ok", "none", "none")  # the other GPU is not blamed
        assert s.value("nvgpu_device_state", gpu="1", state="lost") == 1.0
        assert npd_check(exp, "--min-verdict", "reboot_node") == (1, "GPU 1 reboot_node: fell_off_bus")
        assert exp.terminate() == 0


def test_two_processes_stop_scheduling_one_process_twice_is_watched(tmp_path: Path) -> None:
    """GPU 0: Xid 13 from an NVML event (t = 1 s) whose kernel-log record names process a (pid 100,
    in pod ml/train-0), then Xid 13 from process b (pid 200) a minute later: stop_scheduling.
    GPU 1: Xid 13 twice from process c, two minutes apart: watch."""
    train = Container("ml", "train-0", "trainer")
    proc_root = make_proc(tmp_path / "proc", {100: ("a", train), 200: ("b", None), 300: ("c", None)})
    logs = make_container_logs(tmp_path / "containers", [train])
    kmsg = tmp_path / "kern.log"
    kmsg.write_text(
        vs.kernel_line(100, 0, 13, 100, "a", after_s=1.0)
        + vs.kernel_line(101, 0, 13, 200, "b", after_s=60.0)
        + vs.kernel_line(102, 1, 13, 300, "c", after_s=-180.0)
        + vs.kernel_line(103, 1, 13, 300, "c", after_s=-60.0)
    )
    env = {
        "NVGPU_FEATURE_KERNEL_XID": "on",
        "NVGPU_KMSG_PATH": str(kmsg),
        "NVGPU_PROC_PATH": str(proc_root),
        "NVGPU_CONTAINER_LOG_DIR": str(logs),
    }
    with Exporter(write_scenario(tmp_path, vs.application_xids()), tmp_path, env=env, interval=INTERVAL) as exp:
        s = exp.wait_for(
            lambda s: (
                verdict(s, "0") == ("stop_scheduling", "gpu", "application_xids_several_processes")
                and verdict(s, "1") == ("watch", "application", "application_xid")
            ),
            timeout=25,
            what="verdicts",
        )
        assert s.value("nvgpu_xid_errors_total", gpu="0", uuid=UUID0, xid="13") == 2.0  # NVML + kernel: once
        assert s.value("nvgpu_xid_application_processes", gpu="0", uuid=UUID0) == 2.0
        assert s.value("nvgpu_xid_application_processes", gpu="1", uuid=UUID1) == 1.0
        s = exp.wait_for(
            lambda s: bool(s.find("nvgpu_xid_process_last_timestamp_seconds", gpu="0", pid="100", pod="train-0")),
            what="the pod of pid 100",
        )
        assert s.find("nvgpu_xid_process_last_timestamp_seconds", gpu="0", pid="100")[0].labels["namespace"] == "ml"
        doc = document(exp)
        gpu0 = next(g for g in doc["gpus"] if g["gpu"] == "0")
        assert {(x["pid"], x["process"]) for x in gpu0["recent_xids"]} == {(100, "a"), (200, "b")}
        assert next(x for x in gpu0["recent_xids"] if x["pid"] == 100)["source"] == "NVML event"  # attributed
        assert npd_check(exp) == (1, "GPU 0 stop_scheduling: application_xids_several_processes")
        status, _, page = exp.get("/")
        assert status == 200 and b"a (pid 100) in ml/train-0" in page
        assert exp.terminate() == 0


def test_the_stuck_gpu_asks_for_a_reset(tmp_path: Path) -> None:
    kmsg = tmp_path / "kern.log"
    kmsg.write_text(
        vs.kernel_line(100, 0, 13, 4242, "python3", tail="Graphics SM Warp Exception")
        + vs.kernel_line(101, 0, 31, 4242, "python3", tail="MMU Fault")
        + vs.kernel_line(102, 0, 43, 4242, "python3")
    )
    env = {"NVGPU_FEATURE_KERNEL_XID": "on", "NVGPU_KMSG_PATH": str(kmsg), "NVGPU_STUCK_AFTER_SECONDS": "2"}
    with Exporter(write_scenario(tmp_path, vs.stuck_gpu()), tmp_path, env=env, interval=INTERVAL) as exp:
        s = exp.wait_for(
            lambda s: verdict(s, "0") == ("reset_gpu", "gpu", "stuck_context"), timeout=25, what="reset verdict"
        )
        assert verdict(s, "1") == ("ok", "none", "none")
        doc = document(exp)
        gpu0 = next(g for g in doc["gpus"] if g["gpu"] == "0")
        assert gpu0["age_seconds"] >= 0 and gpu0["since"].endswith("Z")
        assert any("Xid 43" in e for e in gpu0["faults"][0]["evidence"])
        assert npd_check(exp) == (1, "GPU 0 reset_gpu: stuck_context")
        assert npd_check(exp, "--min-verdict", "reboot_node")[0] == 0
        assert exp.terminate() == 0
