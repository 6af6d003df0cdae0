"""The folders tell the truth: the supervisor loads nothing under exporter/worker/, the worker nothing
under exporter/supervisor/, on the real exporter.

The exporter runs on two fake H200s with every supervisor extension doing its work (pod attribution
against a kubelet answering on a socket, the kernel log with an Xid in it, a GPU process in a pod)
and is scraped on every endpoint. Each process of it writes its ``sys.modules`` to a file every
0.2 s: a ``sitecustomize`` on ``PYTHONPATH`` (Python's own start-up hook) starts that thread, so no
test hook lives in the product and the worker is started exactly as in production.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import pytest
from exporter_proc import Exporter, load_scenario, write_scenario
from fakeproc import Container, make_container_logs, make_proc

grpc = pytest.importorskip("grpc", reason="grpcio not installed (the fake kubelet: nvgpu-exporter[test])")
from fake_kubelet import FakeKubelet  # noqa: E402

from exporter.supervisor.podresources.v1 import api_pb2, api_pb2_grpc  # noqa: E402

NOT_MIG = 0xFFFFFFFF
POD = Container("ml", "train-0", "trainer")
SITECUSTOMIZE = """
import json, os, sys, threading, time

def _dump(path):
    while True:
        names = sorted(n for n in list(sys.modules) if n.split(".")[0] in
                       ("exporter", "guards", "pynvml", "aiohttp", "prometheus_client", "grpc"))
        with open(path + ".tmp", "w") as f:
            json.dump({"argv": sys.argv, "modules": names}, f)
        os.replace(path + ".tmp", path)
        time.sleep(0.2)

threading.Thread(target=_dump, args=(os.path.join(os.environ["DUMP_MODULES_DIR"], str(os.getpid())),),
                 daemon=True).start()
"""


@pytest.fixture
def kubelet() -> Iterator[str]:
    """A kubelet PodResources socket that names the pod of GPU 0 (short path: unix sockets take 107 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="podres-", dir="/tmp"))
    uuid = load_scenario("h200x2")["gpus"][0]["uuid"]
    devices = [api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[uuid])]
    pod = api_pb2.PodResources(
        namespace=POD.namespace,
        name=POD.pod,
        containers=[api_pb2.ContainerResources(name=POD.container, devices=devices)],
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(FakeKubelet([pod]), server)
    path = str(directory / "kubelet.sock")
    assert server.add_insecure_port(f"unix://{path}") != 0
    server.start()
    yield path
    server.stop(grace=None).wait(5)
    shutil.rmtree(directory, ignore_errors=True)


def _modules(dump: Path, pid: int, after: float) -> list[str] | None:
    """The modules process ``pid`` had loaded, from a dump written after ``after`` (time.time());
    None when it wrote none within 10 s (it is gone)."""
    path = dump / str(pid)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_mtime > after:
            return list(json.loads(path.read_text())["modules"])
        time.sleep(0.1)
    return None


def _worker_modules(exp: Exporter, dump: Path, after: float) -> list[str]:
    """The modules of the sampling worker (``python -m exporter.worker``; the self-check's short-lived
    worker interpreter runs ``python -c`` and is not it)."""
    for _ in range(3):
        for proc in exp.workers():
            if proc.cmdline()[-2:] == ["-m", "exporter.worker"] and (found := _modules(dump, proc.pid, after)):
                return found
        time.sleep(0.5)
    raise AssertionError(f"no fresh module dump from a worker in {dump}:\n{exp.logs()[-3000:]}")


def test_each_process_loads_only_its_own_folder_and_common(tmp_path: Path, kubelet: str) -> None:
    site, dump = tmp_path / "site", tmp_path / "modules"
    site.mkdir()
    dump.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    scenario = load_scenario("h200x2")
    scenario["gpus"][0]["values"]["nvmlDeviceGetComputeRunningProcesses_v3"] = [
        {"pid": 101, "usedGpuMemory": 1 << 30, "gpuInstanceId": NOT_MIG, "computeInstanceId": NOT_MIG}
    ]
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("[ 12.5] NVRM: Xid (PCI:0000:00:06): 13, pid=7, name=python3, Graphics SM Warp Exception\n")
    env = {
        "PYTHONPATH": str(site),
        "DUMP_MODULES_DIR": str(dump),
        "NVGPU_FEATURE_POD_ATTRIBUTION": "on",
        "NVGPU_POD_RESOURCES_SOCKET": kubelet,
        "NVGPU_POD_REFRESH_SECONDS": "1",
        "NVGPU_FEATURE_KERNEL_XID": "on",
        "NVGPU_KMSG_PATH": str(kernel_log),
        "NVGPU_KMSG_CURSOR_FILE": str(tmp_path / "cursor.json"),
        "NVGPU_PROC_PATH": str(make_proc(tmp_path / "proc", {101: ("python3", POD)})),
        "NVGPU_CONTAINER_LOG_DIR": str(make_container_logs(tmp_path / "containers", [POD])),
    }
    with Exporter(write_scenario(tmp_path, scenario), tmp_path, env=env) as exp:
        exp.wait_for(
            lambda s: (
                s.find("nvgpu_gpu_pod_info", pod=POD.pod)
                and s.value("nvgpu_xid_errors_total", gpu="0", xid="13") == 1.0
                and s.value("nvgpu_compute_processes", gpu="0") == 1
            ),
            what="pods attributed, the kernel log's Xid counted and the GPU process sampled",
        )
        for path, headers in [
            ("/", {}),
            ("/healthz", {}),
            ("/readyz", {}),
            ("/metrics", {"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"}),
        ]:
            status, _, _ = exp.get(path, headers=headers)
            assert status == 200, path
        after = time.time()
        supervisor = _modules(dump, exp.proc.pid, after)
        assert supervisor is not None, f"no fresh module dump from the supervisor in {dump}"
        worker = _worker_modules(exp, dump, after)
        assert exp.terminate() == 0

    def under(modules: list[str], package: str) -> list[str]:
        return [m for m in modules if m == package or m.startswith(package + ".")]

    # the checks see what they are meant to: each process loaded its own side and the common code
    assert {"exporter.supervisor.pods", "exporter.supervisor.kernel_xid", "exporter.supervisor.http.web"} <= set(
        supervisor
    )
    assert {"exporter.worker.sampler", "exporter.worker.process_attribution"} <= set(worker)
    assert {"exporter.common.collectors.processes", "exporter.common.snapshot"} <= set(supervisor) & set(worker)
    assert under(supervisor, "exporter.worker") == [], "the supervisor loaded worker code"
    assert under(worker, "exporter.supervisor") == [], "the worker loaded supervisor code"
    assert "pynvml" not in supervisor
    assert not under(supervisor, "grpc"), "pod attribution loaded grpcio (h2 and protobuf do: docs/performance.md)"
    assert not under(supervisor, "prometheus_client"), "the exposition is written by exporter.supervisor.textformat"
    assert not {"aiohttp", "prometheus_client", "grpc"} & set(worker)
