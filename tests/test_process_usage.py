"""On the real exporter (supervisor + worker subprocess, fake backend).

- Records that cannot be true are not exported: the R535 struct mismatch (32-byte ``_v3``
  records read as 24 bytes) and pid/memory swapped, with the drop counter, the API info, the
  self-check and one log line with the versions.
- Per-process series: off by default; on, at most the cap per GPU plus one summing the rest
  while 1,000 processes churn; a process that exited is gone from the next snapshot.
- Per-pod usage from a fake /proc, a fake /var/log/containers and a real gRPC kubelet serving
  time-sliced and MPS pods.
"""

from __future__ import annotations

import json
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest
from exporter_proc import Exporter, Scrape, load_scenario, write_scenario
from fakeproc import Container, make_container_logs, make_proc

NOT_MIG = 0xFFFFFFFF
GIB = 1 << 30
V3 = "nvmlDeviceGetComputeRunningProcesses_v3"
V2 = "nvmlDeviceGetComputeRunningProcesses_v2"
MPS_V3 = "nvmlDeviceGetMPSComputeRunningProcesses_v3"
UTIL = "nvmlDeviceGetProcessUtilization"
UUID0 = "GPU-ef65bf38-0ae6-479b-9ebc-46c6463961e6"
UUID1 = "GPU-094221fd-19f9-1561-7ef8-949bb0d57826"


def rec(pid: int, mem: int | None) -> dict[str, Any]:
    return {"pid": pid, "usedGpuMemory": mem, "gpuInstanceId": NOT_MIG, "computeInstanceId": NOT_MIG}


def util(pid: int, sm: int, mem: int = 0) -> dict[str, Any]:
    return {"pid": pid, "smUtil": sm, "memUtil": mem, "encUtil": 0, "decUtil": 0}


def isolated(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Environment that keeps the exporter away from this machine's /proc and kubelet."""
    return {
        "NVGPU_PROC_PATH": str(tmp_path / "no-proc"),
        "NVGPU_CONTAINER_LOG_DIR": str(tmp_path / "no-containers"),
        "NVGPU_POD_RESOURCES_SOCKET": str(tmp_path / "no-kubelet.sock"),
        **extra,
    }


def values(scrape: Scrape, name: str, **labels: str) -> dict[str, float]:
    return {json.dumps(s.labels, sort_keys=True): s.value for s in scrape.find(name, **labels)}


# -- 1. records that cannot be true ---------------------------------------------------------------

TRUTH = [rec(1184, 3 * GIB), rec(16040, 7 * GIB), rec(16041, GIB + 0x1234), rec(16042, 512 << 20)]


def test_misread_and_swapped_records_are_dropped_counted_named_and_logged_once(tmp_path: Path) -> None:
    scenario = load_scenario("h200x2")
    scenario["driver_version"] = "535.86.10"  # an affected driver: the self-check names the mismatch
    g0, g1 = (g["values"] for g in scenario["gpus"])
    g0[V3] = {"struct": "r535_v3", "records": TRUTH}
    g0[V2] = TRUTH
    swapped = {"struct": "swapped", "records": [rec(9980, 6_498_025_472)]}
    g1[V3] = g1[V2] = swapped
    with Exporter(write_scenario(tmp_path, scenario), tmp_path, env=isolated(tmp_path)) as exp:
        s = exp.wait_for(
            lambda s: (s.value("nvgpu_process_records_dropped_total", gpu="1", reason="pid_above_max") or 0) >= 3,
            what="three samples of the swapped GPU",
        )
        # GPU 0: _v2 reads the list clean and is used; the misread _v3 records were counted once
        assert s.value("nvgpu_compute_processes", gpu="0") == 4
        assert s.value("nvgpu_compute_processes_memory_used_bytes", gpu="0") == sum(r["usedGpuMemory"] for r in TRUTH)
        dropped0 = values(s, "nvgpu_process_records_dropped_total", gpu="0")
        assert dropped0 and all(
            json.loads(k)["reason"] in ("pid_zero", "pid_not_available", "pid_above_max", "malformed") for k in dropped0
        )
        # GPU 1: nothing plausible, nothing exported as a process
        assert s.value("nvgpu_compute_processes", gpu="1") == 0
        assert s.value("nvgpu_compute_processes_memory_used_bytes", gpu="1") == 0
        api = "nvgpu_nvml_api_info"
        assert s.value(api, call="compute_processes", function=V2, fallback="records_invalid") == 1
        assert s.value(api, call="compute_processes", function=V3, fallback="") == 1
        assert (s.value("nvgpu_selfcheck_failures", process="worker") or 0) >= 1
        exp.wait_samples(3)  # more samples of the same records: still one warning per GPU
        records = list(exp.log_records())
        warnings = [r for r in records if "failed validation" in r.get("msg", "")]
        assert len(warnings) == 2, [r["msg"] for r in warnings]  # once per GPU, not per sample
        for w in warnings:
            assert w["level"] == "WARNING" and w["driver_version"] == "535.86.10" and w["nvidia_ml_py_version"]
            assert "535.43-535.86" in w["msg"]
        assert any("process struct mismatch: driver 535.86.10" in json.dumps(r) for r in records)
        assert not [r for r in records if r.get("level") == "ERROR"]
        assert exp.terminate() == 0


# -- 2. per-process series ------------------------------------------------------------------------


def test_per_process_series_are_off_by_default(tmp_path: Path) -> None:
    scenario = load_scenario("h200x1")
    scenario["gpus"][0]["values"][V3] = TRUTH
    scenario["gpus"][0]["values"][UTIL] = {"per_process": {"smUtil": 50}}
    with Exporter(write_scenario(tmp_path, scenario), tmp_path, env=isolated(tmp_path)) as exp:
        s = exp.wait_for(lambda s: s.value("nvgpu_compute_processes", gpu="0") == 4)
        assert not [x for x in s.samples if x.name.startswith("nvgpu_process_") and "api_info" not in x.name]
        assert s.value("nvgpu_feature_enabled", feature="process_usage", reason="default") == 0
        # nothing asked for utilization: no per-process series, no pod could be found
        assert not s.find("nvgpu_nvml_api_info", call="process_utilization")
        assert exp.terminate() == 0


def test_churning_processes_stay_within_the_cap_and_exited_ones_disappear(tmp_path: Path) -> None:
    """1,000 processes start at 100/s and live 2 s each (about 200 at any time); the cap is 4."""
    scenario = load_scenario("h200x1")
    v = scenario["gpus"][0]["values"]
    churn = {"churn": {"first_pid": 20000, "per_s": 100, "lifetime_s": 2, "used_bytes": 64 << 20, "count": 1000}}
    v[V3] = {
        "sequence": [
            {"until_s": 3, "value": [rec(777, 8 * GIB)]},  # a big process that exits at t = 3 s
            {"value": churn},
        ]
    }
    v[UTIL] = {"per_process": {"smUtil": 3, "memUtil": 1}}
    env = isolated(tmp_path, NVGPU_FEATURE_PROCESS_USAGE="on", NVGPU_PROCESS_SERIES_PER_GPU="4")
    with Exporter(write_scenario(tmp_path, scenario), tmp_path, env=env) as exp:
        listening = time.time()  # scenario time 0 (the supervisor's start) is before this
        exp.wait_for(lambda s: s.find("nvgpu_process_memory_used_bytes", pid="777"), what="pid 777")
        pids_seen: set[str] = set()
        sizes = []
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            s = exp.scrape()
            ts = s.value("nvgpu_last_sample_timestamp_seconds") or 0
            mem = s.find("nvgpu_process_memory_used_bytes", gpu="0")
            if ts >= listening + 3:  # sampled at scenario time >= 3 s: 777 has exited
                assert not s.find("nvgpu_process_memory_used_bytes", pid="777"), "an exited process is still exported"
            for family in ("memory_used_bytes", "sm_utilization_ratio", "memory_utilization_ratio"):
                assert len(s.find(f"nvgpu_process_{family}", gpu="0")) <= 5
            count = s.value("nvgpu_compute_processes", gpu="0") or 0
            if count > 4:
                other = s.value("nvgpu_process_memory_used_bytes", gpu="0", pid="other")
                assert other == (count - 4) * (64 << 20)
                # the utilization samples are taken a moment after the list: a process or two of
                # the 100/s churn may start or exit in between (as on a real GPU)
                other_sm = s.value("nvgpu_process_sm_utilization_ratio", gpu="0", pid="other")
                assert other_sm == pytest.approx((count - 4) * 0.03, abs=0.1)
            pids_seen.update(x.labels["pid"] for x in mem)
            sizes.append(len(s.text))
            time.sleep(0.25)
        assert len(pids_seen - {"777", "other"}) > 8, pids_seen  # the series really churned
        assert max(sizes) < 2 * min(sizes[len(sizes) // 2 :]) + 20000  # no growth with churn
        assert exp.terminate() == 0


# -- 3. per-pod usage with a real gRPC kubelet ------------------------------------------------------

A = Container("ml", "notebook-1", "jupyter")  # time-sliced on GPU 0
B = Container("research", "notebook-2", "jupyter")
C = Container("batch", "infer-0", "server")  # MPS clients on GPU 1
D = Container("batch", "infer-1", "server")
DAEMON = Container("gpu-operator", "nvidia-device-plugin-mps-control-daemon-x7k2p", "mps-control-daemon")


def _kubelet(directory: Path) -> tuple[Any, str]:
    """A real gRPC PodResourcesLister: two pods time-slice GPU 0, two share GPU 1 through MPS
    (replica ids ``<uuid>::<n>``, as NVIDIA's device plugin advertises both)."""
    grpc = pytest.importorskip("grpc", reason="grpcio not installed (nvgpu-exporter[kubernetes])")
    from fake_kubelet import FakeKubelet

    from exporter.supervisor.podresources.v1 import api_pb2, api_pb2_grpc

    def pod(c: Container, *device_ids: str) -> Any:
        devices = api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=list(device_ids))
        return api_pb2.PodResources(
            namespace=c.namespace,
            name=c.pod,
            containers=[api_pb2.ContainerResources(name=c.container, devices=[devices])],
        )

    pods = [pod(A, f"{UUID0}::0"), pod(B, f"{UUID0}::1"), pod(C, f"{UUID1}::0"), pod(D, f"{UUID1}::1", f"{UUID1}::2")]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(FakeKubelet(pods), server)
    path = str(directory / "kubelet.sock")
    assert server.add_insecure_port(f"unix://{path}") != 0
    server.start()
    return server, path


def test_per_pod_usage_on_time_sliced_and_mps_gpus(tmp_path: Path) -> None:
    import shutil
    import tempfile

    scenario = load_scenario("h200x2")
    g0, g1 = (g["values"] for g in scenario["gpus"])
    g0[V3] = [rec(101, 3 * GIB), rec(201, 7 * GIB)]
    g0[UTIL] = [util(101, 10, 2), util(201, 80, 30)]
    g1[V3] = [rec(500, 512 << 20)]  # the MPS server, in the control daemon's pod
    g1[MPS_V3] = [rec(301, 2 * GIB), rec(401, 4 * GIB)]
    g1[UTIL] = [util(301, 30), util(401, 40)]
    proc = make_proc(
        tmp_path / "proc",
        {
            101: ("python3", A),
            201: ("python", B),
            301: ("tritonserver", C),
            401: ("tritonserver", D),
            500: ("nvidia-cuda-mps", DAEMON),
        },
    )
    logs = make_container_logs(tmp_path / "containers", [A, B, C, D, DAEMON])
    sock_dir = Path(tempfile.mkdtemp(prefix="c18-kubelet-", dir="/tmp"))
    server, sock = _kubelet(sock_dir)
    env = {
        "NVGPU_PROC_PATH": str(proc),
        "NVGPU_CONTAINER_LOG_DIR": str(logs),
        "NVGPU_POD_RESOURCES_SOCKET": sock,
        "NVGPU_POD_REFRESH_SECONDS": "1",
    }
    try:
        with Exporter(write_scenario(tmp_path, scenario), tmp_path, env=env) as exp:
            s = exp.wait_for(
                lambda s: len(s.find("nvgpu_pod_memory_used_bytes")) == 5 and s.find("nvgpu_gpu_pod_info"),
                what="five pods' usage and the kubelet's holders",
            )
            mem = {
                (x.labels["gpu"], x.labels["namespace"], x.labels["pod"]): x.value
                for x in s.find("nvgpu_pod_memory_used_bytes")
            }
            assert mem == {
                ("0", "ml", "notebook-1"): 3 * GIB,
                ("0", "research", "notebook-2"): 7 * GIB,
                ("1", "batch", "infer-0"): 2 * GIB,
                ("1", "batch", "infer-1"): 4 * GIB,
                ("1", "gpu-operator", DAEMON.pod): 512 << 20,  # uses the GPU without holding it
            }
            sm = {(x.labels["gpu"], x.labels["pod"]): x.value for x in s.find("nvgpu_pod_sm_utilization_ratio")}
            assert sm == {
                ("0", "notebook-1"): 0.1,
                ("0", "notebook-2"): 0.8,
                ("1", "infer-0"): 0.3,
                ("1", "infer-1"): 0.4,
                ("1", DAEMON.pod): 0.0,
            }
            assert s.value("nvgpu_pod_attribution_source_up", source="proc") == 1
            assert s.value("nvgpu_pod_attribution_source_up", source="container_logs") == 1
            assert len(s.find("nvgpu_gpu_pod_info", gpu="0")) == 2 and len(s.find("nvgpu_gpu_pod_info", gpu="1")) == 2
            exp.wait_log(lambda r: "per-pod GPU usage" in r.get("msg", ""), what="the per-pod usage log line")
            exp.wait_samples(2)  # more samples, no change: no new line
            said = [r for r in exp.log_records() if "per-pod GPU usage" in r.get("msg", "")]
            assert said and all("kubelet PodResources" in r["msg"] for r in said)
            assert len({r["msg"] for r in said}) == len(said) <= 2  # once per change (kubelet: not yet -> yes)
            assert exp.terminate() == 0
    finally:
        server.stop(grace=None).wait(5)
        shutil.rmtree(sock_dir, ignore_errors=True)
