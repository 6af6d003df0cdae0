"""Pod attribution client against a real gRPC server on a unix socket.

The server implements ``v1.PodResourcesLister`` from our own proto/podresources/v1/api.proto (the
generated servicer), the same wire contract the kubelet serves. Nothing about gRPC is mocked.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

from exporter.supervisor.podresources import (
    PodRef,
    PodResourcesClient,
    PodResourcesError,
    gpu_assignments,
    gpu_uuid_from_device_id,
)

REPO = Path(__file__).resolve().parents[1]

grpc = pytest.importorskip("grpc", reason="grpcio not installed (the fake kubelet: nvgpu-exporter[test])")
from fake_kubelet import FakeKubelet  # noqa: E402

from exporter.supervisor.podresources.v1 import api_pb2, api_pb2_grpc  # noqa: E402

GPU_A = "GPU-0b3c5d7e-1111-2222-3333-444455556666"
GPU_B = "GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff"  # time-sliced: two pods
GPU_C = "GPU-12345678-abcd-ef01-2345-6789abcdef01"  # time-sliced, renamed nvidia.com/gpu.shared
MIG_D = "MIG-5c1e2f3a-7b8c-5d9e-a0b1-c2d3e4f5a6b7"  # MIG "mixed" strategy


def _devices(resource: str, *ids: str, numa: int | None = None) -> Any:
    topology = None
    if numa is not None:
        topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=numa)])
    return api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids), topology=topology)


def _pod(namespace: str, name: str, **containers: list[Any]) -> Any:
    return api_pb2.PodResources(
        namespace=namespace,
        name=name,
        containers=[api_pb2.ContainerResources(name=cname, devices=devs) for cname, devs in containers.items()],
    )


# A node with: a whole GPU; a GPU time-sliced between two pods; a GPU time-sliced under the
# renamed resource with two replicas in one container; a MIG device; a pod with a sidecar and no
# GPU; a CPU-only pod; an NVIDIA network device (PCI address, not a GPU) and a foreign resource.
NODE_PODS = [
    _pod("ml", "trainer-0", main=[_devices("nvidia.com/gpu", GPU_A, numa=0)], sidecar=[]),
    _pod("ml", "notebook-1", jupyter=[_devices("nvidia.com/gpu", f"{GPU_B}::0")]),
    _pod("research", "notebook-2", jupyter=[_devices("nvidia.com/gpu", f"{GPU_B}::1")]),
    _pod("batch", "sweep-7", worker=[_devices("nvidia.com/gpu.shared", f"{GPU_C}::2", f"{GPU_C}::5")]),
    _pod("infer", "small-0", server=[_devices("nvidia.com/mig-1g.18gb", MIG_D, numa=1)]),
    _pod("kube-system", "coredns-abc", coredns=[]),
    _pod(
        "net",
        "sriov-0",
        app=[_devices("nvidia.com/hostdev", "0000:3b:00.2"), _devices("example.com/fpga", "fpga0")],
    ),
]

ALLOCATABLE = [
    _devices("nvidia.com/gpu", GPU_A, *(f"{GPU_B}::{i}" for i in range(4))),
    _devices("nvidia.com/gpu.shared", *(f"{GPU_C}::{i}" for i in range(8))),
    _devices("nvidia.com/mig-1g.18gb", MIG_D),
    _devices("example.com/fpga", "fpga0"),
]


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # Short path: a unix socket path is limited to 107 bytes, pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="podres-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Servers:
    """Real gRPC servers on unix sockets in one temporary directory, stopped at teardown."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.running: list[Any] = []

    def __call__(self, servicer: FakeKubelet, name: str = "kubelet.sock") -> str:
        path = str(self.directory / name)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
        assert server.add_insecure_port(f"unix://{path}") != 0
        server.start()
        self.running.append(server)
        return path

    def stop_all(self) -> None:
        while self.running:
            self.running.pop().stop(grace=None).wait(5)


@pytest.fixture
def serve(sock_dir: Path) -> Iterator[Servers]:
    servers = Servers(sock_dir)
    yield servers
    servers.stop_all()


def test_list_maps_each_gpu_uuid_to_its_containers(serve: Servers) -> None:
    path = serve(FakeKubelet(NODE_PODS))
    with PodResourcesClient(path, timeout_s=5) as client:
        got = client.list_gpu_assignments()
    assert got == {
        GPU_A: (PodRef("ml", "trainer-0", "main"),),
        GPU_B: (PodRef("ml", "notebook-1", "jupyter"), PodRef("research", "notebook-2", "jupyter")),
        GPU_C: (PodRef("batch", "sweep-7", "worker"),),
        MIG_D: (PodRef("infer", "small-0", "server"),),
    }
    assert list(got) == sorted(got)


def test_gpu_ids_that_are_not_uuids_are_reported_not_dropped(serve: Servers) -> None:
    """The device plugin's deviceIDStrategy=index ("0", "0:1" for a MIG device) gives ids
    of GPU resources that NVML's UUIDs cannot join: they come back with their holders, to be counted.
    A network device of another nvidia.com/ resource is not a GPU and is not among them."""
    pods = [
        *NODE_PODS,
        _pod("legacy", "index-0", app=[_devices("nvidia.com/gpu", "0")]),
        _pod("legacy", "index-mig", app=[_devices("nvidia.com/mig-1g.18gb", "0:1")]),
    ]
    path = serve(FakeKubelet(pods))
    with PodResourcesClient(path, timeout_s=5) as client:
        found = client.list_assignments()
        gpus, unmapped = found.gpus, found.not_a_uuid
    assert gpus == client.list_gpu_assignments()
    assert unmapped == {
        "0": (PodRef("legacy", "index-0", "app"),),
        "0:1": (PodRef("legacy", "index-mig", "app"),),
    }


def test_list_on_an_idle_node_is_empty(serve: Servers) -> None:
    path = serve(FakeKubelet([_pod("kube-system", "coredns-abc", coredns=[])]))
    with PodResourcesClient(path, timeout_s=5) as client:
        assert client.list_gpu_assignments() == {}


def test_allocatable_counts_replicas_per_uuid(serve: Servers) -> None:
    path = serve(FakeKubelet(NODE_PODS, allocatable=ALLOCATABLE))
    with PodResourcesClient(path, timeout_s=5) as client:
        assert client.allocatable_gpus() == {GPU_A: 1, GPU_B: 4, GPU_C: 8, MIG_D: 1}


def test_allocatable_unimplemented_is_none(serve: Servers) -> None:
    path = serve(FakeKubelet(NODE_PODS, allocatable=None))
    with PodResourcesClient(path, timeout_s=5) as client:
        assert client.allocatable_gpus() is None
        # List still works on the same channel.
        assert GPU_A in client.list_gpu_assignments()


def test_allocatable_disabled_by_feature_gate_is_none(serve: Servers) -> None:
    # Kubernetes 1.21-1.27 with KubeletPodResourcesGetAllocatable=false.
    error = (grpc.StatusCode.UNKNOWN, "Pod Resources API GetAllocatableResources disabled")
    path = serve(FakeKubelet(NODE_PODS, allocatable_error=error))
    with PodResourcesClient(path, timeout_s=5) as client:
        assert client.allocatable_gpus() is None


def test_allocatable_other_errors_raise(serve: Servers) -> None:
    error = (grpc.StatusCode.INTERNAL, "boom")
    path = serve(FakeKubelet(NODE_PODS, allocatable_error=error))
    with PodResourcesClient(path, timeout_s=5) as client, pytest.raises(PodResourcesError) as err:
        client.allocatable_gpus()
    assert err.value.reason == "rpc_error"
    assert "INTERNAL" in str(err.value) and "boom" in str(err.value)


def test_missing_socket_is_one_clear_error(sock_dir: Path) -> None:
    path = str(sock_dir / "kubelet.sock")
    with PodResourcesClient(path, timeout_s=1) as client, pytest.raises(PodResourcesError) as err:
        client.list_gpu_assignments()
    assert err.value.reason == "socket_missing"
    assert err.value.socket_path == path
    message = str(err.value)
    assert path in message and "does not exist" in message
    assert "/var/lib/kubelet/pod-resources" in message  # says what to mount


def test_regular_file_is_not_a_socket(sock_dir: Path) -> None:
    path = sock_dir / "kubelet.sock"
    path.write_text("")
    with (
        PodResourcesClient(str(path), timeout_s=1) as client,
        pytest.raises(PodResourcesError) as e,
    ):
        client.list_gpu_assignments()
    assert e.value.reason == "not_a_socket"


def test_stale_socket_without_listener_is_unavailable(sock_dir: Path) -> None:
    # A kubelet that died leaves its socket file behind; connect() is refused.
    path = str(sock_dir / "kubelet.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()
    with PodResourcesClient(path, timeout_s=2) as client, pytest.raises(PodResourcesError) as err:
        client.list_gpu_assignments()
    assert err.value.reason == "unavailable"
    assert "kubelet not reachable" in str(err.value)


def test_slow_kubelet_times_out(serve: Servers) -> None:
    release = threading.Event()
    path = serve(FakeKubelet(NODE_PODS, list_hook=lambda: release.wait(10)))
    try:
        with PodResourcesClient(path, timeout_s=0.3) as client:
            with pytest.raises(PodResourcesError) as err:
                client.list_gpu_assignments()
    finally:
        release.set()
    assert err.value.reason == "timeout"
    assert "did not answer within 0.3 s" in str(err.value)


def test_restarted_kubelet_is_reached_again(serve: Servers) -> None:
    path = serve(FakeKubelet(NODE_PODS[:1]))
    client = PodResourcesClient(path, timeout_s=2)
    try:
        assert list(client.list_gpu_assignments()) == [GPU_A]
        # The kubelet stops: its socket goes away (or is left behind, refusing connections).
        serve.stop_all()
        if os.path.exists(path):
            with pytest.raises(PodResourcesError) as err:
                client.list_gpu_assignments()
            assert err.value.reason == "unavailable"
            os.unlink(path)
        with pytest.raises(PodResourcesError) as err:
            client.list_gpu_assignments()
        assert err.value.reason == "socket_missing"
        # A new kubelet binds the same path: the very next call reaches it, with no reconnect
        # backoff inherited from the dead connection.
        serve(FakeKubelet(NODE_PODS[4:5]))
        assert list(client.list_gpu_assignments()) == [MIG_D]
    finally:
        client.close()


# Runs in a child process: builds the client (imports grpc), then, when started as root, drops
# to uid/gid 65534 the way a non-root container runs, and calls List.
_PERMISSION_PROBE = """
import os, sys
from exporter.supervisor.podresources import PodResourcesClient, PodResourcesError
client = PodResourcesClient(sys.argv[1], timeout_s=2)
if os.geteuid() == 0:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
try:
    client.list_gpu_assignments()
except PodResourcesError as exc:
    print(exc.reason)
    print(exc)
else:
    print("connected")
import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("kernel: EACCES")
else:
    print("kernel: connected")
"""


def test_socket_not_writable_by_this_uid_is_permission_denied(serve: Servers) -> None:
    """The kubelet's socket is root-owned; a non-root exporter cannot connect() to it."""
    path = serve(FakeKubelet(NODE_PODS))
    # As root: a root-owned socket, mode 0755, and a client that becomes uid 65534 (the cluster's
    # situation). As another user: our own socket with no permissions at all.
    os.chmod(path, 0o755 if os.geteuid() == 0 else 0o000)
    proc = subprocess.run(
        [sys.executable, "-c", _PERMISSION_PROBE, path],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    reason, message, kernel = proc.stdout.splitlines()[:3]
    assert reason == "permission_denied", proc.stdout
    assert "uid" in message and "root-owned" in message
    # The premise of the check: the kernel itself refuses connect() to this socket.
    assert kernel == "kernel: EACCES"


def test_without_h2_the_package_imports_and_reports_unsupported() -> None:
    code = """
import sys
sys.modules["h2"] = None  # as if h2 were not installed
import exporter.supervisor.podresources as pr
reason = pr.unsupported_reason()
assert reason is not None and "nvgpu-exporter[kubernetes]" in reason, reason
try:
    pr.PodResourcesClient("/nonexistent.sock", 1)
except pr.PodResourcesUnsupported as exc:
    print("unsupported:", exc)
else:
    raise SystemExit("client built without h2")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("unsupported: pod attribution needs h2 and protobuf")


def test_importing_the_package_imports_neither_h2_nor_protobuf() -> None:
    code = (
        "import sys, exporter.supervisor.podresources; "
        "print(sorted({'h2', 'google.protobuf', 'grpc'} & set(sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stderr


_NO_GRPC_PROBE = """
import sys
from exporter.supervisor.podresources import PodResourcesClient
print(sorted(PodResourcesClient(sys.argv[1], timeout_s=5).list_gpu_assignments()))
print("grpc" in sys.modules, "h2" in sys.modules)
"""


def test_the_client_calls_a_grpc_server_without_grpcio(serve: Servers) -> None:
    """The real gRPC server (grpcio, in this process) answers a client process that loads h2 and
    protobuf only: grpcio costs the supervisor 16 MB and six threads (docs/performance.md)."""
    path = serve(FakeKubelet(NODE_PODS))
    proc = subprocess.run(
        [sys.executable, "-c", _NO_GRPC_PROBE, path], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    uuids, loaded = proc.stdout.splitlines()
    assert uuids == repr(sorted(gpu_assignments(api_pb2.ListPodResourcesResponse(pod_resources=NODE_PODS))))
    assert loaded == "False True"


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        (GPU_A, GPU_A),
        (f"{GPU_B}::0", GPU_B),
        (f"{GPU_B}::17", GPU_B),
        (MIG_D, MIG_D),
        (f"{MIG_D}::1", MIG_D),  # time-sliced MIG device
        (
            "MIG-GPU-0b3c5d7e-1111-2222-3333-444455556666/1/0",
            "MIG-GPU-0b3c5d7e-1111-2222-3333-444455556666/1/0",
        ),
        ("0", None),  # deviceIDStrategy=index
        ("0:1", None),  # index strategy, MIG
        ("0000:3b:00.2", None),  # a PCI address (network device)
        (f"{GPU_A}::x", f"{GPU_A}::x"),  # not a replica number: left alone
    ],
)
def test_device_id_to_uuid(device_id: str, expected: str | None) -> None:
    assert gpu_uuid_from_device_id(device_id) == expected


def test_client_rejects_non_positive_timeout() -> None:
    with pytest.raises(ValueError):
        PodResourcesClient("/x.sock", timeout_s=0)


# -- the generated modules and the extra that must load them -----------------------------------


def _extra_requirements(name: str = "kubernetes") -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib", reason="Python < 3.11")
    requirements = pytest.importorskip("packaging.requirements")
    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    extra = data["project"]["optional-dependencies"][name]
    reqs = [requirements.Requirement(r) for r in extra]
    return {r.name.lower(): r for r in reqs}


def _stub_texts() -> tuple[str, str]:
    base = REPO / "exporter/supervisor/podresources/v1"
    return (base / "api_pb2.py").read_text(encoding="utf-8"), (base / "api_pb2_grpc.py").read_text(encoding="utf-8")


def test_the_stubs_carry_no_version_guard() -> None:
    """Stubs from grpcio-tools >= 1.63 refuse an older grpcio (the H200 image's 1.84 was
    refused by 1.85.1 stubs) and protobuf gencode >= 5.26 refuses an older protobuf runtime."""
    pb2, pb2_grpc = _stub_texts()
    assert "ValidateProtobufRuntimeVersion" not in pb2
    assert "GRPC_GENERATED_VERSION" not in pb2_grpc and "first_version_is_lower" not in pb2_grpc
    assert "_registered_method" not in pb2_grpc, "a keyword grpcio < 1.62 does not take"


def test_kubernetes_extra_admits_what_the_stubs_need_and_was_tested() -> None:
    reqs = _extra_requirements()
    assert {"h2", "protobuf"} <= set(reqs) and "grpcio" not in reqs, reqs
    tests = _extra_requirements("test")
    pb2, pb2_grpc = _stub_texts()
    gencode = re.search(r"# Protobuf Python Version: (\d+)\.(\d+)\.(\d+)", pb2)
    assert gencode, "api_pb2.py names no protobuf gencode version"
    tools = re.search(r"with grpcio-tools ([\d.]+)\.", pb2_grpc)
    assert tools

    def lowest(req: Any) -> tuple[int, ...]:
        bounds = [s.version for s in req.specifier if s.operator in (">=", "==", "~=")]
        assert bounds, f"{req} has no lower bound"
        return max(tuple(int(p) for p in b.split(".")) for b in bounds)

    # the runtime must not be older than the gencode (protobuf's own rule), ...
    assert lowest(reqs["protobuf"]) >= tuple(int(x) for x in gencode.groups())
    # ... and the bounds are the oldest combination tests/grpc_matrix.sh runs
    matrix = (REPO / "tests" / "grpc_matrix.sh").read_text()
    oldest = re.search(r'"grpcio==([\d.]+) protobuf==([\d.]+) h2==([\d.]+)"\s+# the extra\'s lower bounds', matrix)
    assert oldest, "tests/grpc_matrix.sh does not run the lower bounds"
    assert lowest(tests["grpcio"]) == tuple(int(p) for p in oldest.group(1).split("."))
    assert reqs["protobuf"].specifier.contains(oldest.group(2))
    assert lowest(reqs["h2"]) == tuple(int(p) for p in oldest.group(3).split("."))
    assert "8.0.0" not in reqs["protobuf"].specifier, "protobuf 8 is untested"


def test_installed_runtimes_load_the_generated_modules() -> None:
    reqs = _extra_requirements()
    import google.protobuf

    assert reqs["protobuf"].specifier.contains(google.protobuf.__version__), (
        f"installed protobuf {google.protobuf.__version__} is outside the extra's {reqs['protobuf'].specifier}"
    )
    assert _extra_requirements("test")["grpcio"].specifier.contains(grpc.__version__)
    from importlib.metadata import version

    assert reqs["h2"].specifier.contains(version("h2"))
    assert api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"].full_name == ("v1.PodResourcesLister")


def test_generated_modules_match_the_proto() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools not installed")
    from importlib.metadata import version

    from exporter.supervisor.podresources.regenerate import GRPCIO_TOOLS

    if version("grpcio-tools") != GRPCIO_TOOLS:
        pytest.skip(
            f"grpcio-tools {version('grpcio-tools')} installed, the stubs are made with {GRPCIO_TOOLS} "
            "(requirements-ci.txt pins it)"
        )
    proc = subprocess.run(
        [sys.executable, "-m", "exporter.supervisor.podresources.regenerate", "--check"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_wire_contract_matches_the_kubelet_api() -> None:
    """Names and field numbers the kubelet sends: a typo here silently yields empty messages."""
    d = api_pb2.DESCRIPTOR
    service = d.services_by_name["PodResourcesLister"]
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources"]
    assert d.package == "v1"

    def fields(message: str) -> dict[str, int]:
        return {f.name: f.number for f in d.message_types_by_name[message].fields}

    assert fields("ListPodResourcesResponse") == {"pod_resources": 1}
    assert fields("PodResources") == {"name": 1, "namespace": 2, "containers": 3}
    assert fields("ContainerResources") == {"name": 1, "devices": 2, "dynamic_resources": 5}
    assert fields("DynamicResource") == {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4}
    assert fields("ClaimResource") == {"cdi_devices": 1, "driver_name": 2, "pool_name": 3, "device_name": 4}
    assert fields("CDIDevice") == {"name": 1}
    assert fields("ContainerDevices") == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert fields("TopologyInfo") == {"nodes": 1}
    assert fields("NUMANode") == {"ID": 1}
    assert fields("AllocatableResourcesResponse") == {"devices": 1}


def test_no_grpc_import_while_the_kubelet_socket_is_missing(tmp_path: Path) -> None:
    """Grpcio and protobuf cost the supervisor about 10 MB; on a node without the kubelet's
    socket the pod-attribution loop reports the missing socket and never imports them."""
    code = f"""
import asyncio, sys
from types import SimpleNamespace
from exporter.config import Config
from exporter.supervisor.pods import PodAttribution

class Host:
    snapshot = None
    def __init__(self): self.changes = 0
    def changed(self): self.changes += 1
    def record_xid(self, *a): pass
    def set_feature_state(self, state): raise SystemExit(f"unexpected feature state {{state}}")

ext = PodAttribution(Config(pod_resources_socket={str(tmp_path / "kubelet.sock")!r}, pod_refresh_s=0.05))
host = Host()
async def main():
    task = asyncio.ensure_future(ext.run(host))
    await asyncio.sleep(0.4)
    task.cancel()
asyncio.run(main())
print(ext.up, host.changes, "grpc" in sys.modules, "google.protobuf" in sys.modules)
"""
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": "10.0.0.1"}  # in a pod: said at WARNING, on stderr
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["False", "1", "False", "False"], proc.stdout
    assert proc.stderr.count("socket_missing") + proc.stderr.count("does not exist") >= 1, proc.stderr


@pytest.mark.parametrize(("in_kubernetes", "level"), [(False, logging.INFO), (True, logging.WARNING)])
async def test_a_missing_socket_is_a_warning_only_in_kubernetes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, in_kubernetes: bool, level: int
) -> None:
    """On a workstation (no KUBERNETES_SERVICE_HOST) a missing kubelet socket is expected and said
    at INFO, so the first line a new user reads is not a warning about Kubernetes; in a pod it is a
    deployment fault (a missing hostPath mount) and said at WARNING. Once either way."""
    from exporter.config import Config
    from exporter.supervisor.pods import PodAttribution

    if in_kubernetes:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    else:
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    class Host:
        changes = 0

        def changed(self) -> None:
            self.changes += 1

    ext = PodAttribution(Config(pod_resources_socket=str(tmp_path / "kubelet.sock"), pod_refresh_s=0.02))
    caplog.set_level(logging.INFO, logger="exporter.supervisor.pods")
    task = asyncio.ensure_future(ext.run(Host()))  # type: ignore[arg-type]
    await asyncio.sleep(0.2)  # the point: ten refreshes (every 0.02 s) pass, and the socket is named once
    task.cancel()
    said = [r for r in caplog.records if "kubelet.sock" in r.getMessage()]
    assert [r.levelno for r in said] == [level], said
    assert ext.up is False


# -- the device plugin's GPU count: GetAllocatableResources through the pod extension ----------

MIG_E = "MIG-5c1e2f3a-7b8c-5d9e-a0b1-c2d3e4f5a6b8"  # a MIG device of GPU_E, in its layout
GPU_E = "GPU-eeeeeeee-1111-2222-3333-444455556666"  # MIG mode: offered only as MIG devices
GPU_F = "GPU-ffffffff-1111-2222-3333-444455556666"  # named only through a legacy MIG id


def _mig_snapshot() -> Any:
    from exporter.common.collectors import mig
    from exporter.common.snapshot import GpuSample, Snapshot, SystemInfo

    layout = mig.Reading(1, 1, (mig.GpuInstance(2, 9, "3g.71gb"),), (mig.MigDevice(0, 2, 0, MIG_E),))
    gpus = (GpuSample(0, GPU_A, "up", {}, 1.0), GpuSample(1, GPU_E, "up", {"mig": layout}, 1.0))
    return Snapshot(1.0, 0.0, SystemInfo(), gpus, {}, {}, {}, 0, {})


class _Host:
    changes = 0

    def changed(self) -> None:
        self.changes += 1


async def _until(condition: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _run_until_lists(ext: Any, kubelet: FakeKubelet, lists: int) -> None:
    """Run the extension until the kubelet has answered ``lists`` List calls (refreshes pass)."""
    task = asyncio.ensure_future(ext.run(_Host()))
    try:
        await _until(lambda: kubelet.list_calls >= lists, f"{lists} List calls")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _count_text(ext: Any) -> str:
    """The nvgpu_gpus family as GpuHealth serves it with the extension's views."""
    from exporter.supervisor import textformat
    from exporter.supervisor.gpuhealth import GpuHealth

    families = [f for f in GpuHealth(30, 300).families(True, ext.gpu_count_views()) if f.name == "nvgpu_gpus"]
    return textformat.encode(families).decode()


DEVICE_PLUGIN_NODE = [
    _devices("nvidia.com/gpu", GPU_A),  # a whole GPU
    _devices("nvidia.com/gpu.shared", *(f"{GPU_B}::{i}" for i in range(4))),  # time-sliced: one GPU
    _devices("nvidia.com/mig-3g.71gb", MIG_E, f"{MIG_E}::1"),  # a MIG device (and a replica of it) of GPU_E
    _devices("nvidia.com/mig-1g.18gb", f"MIG-{GPU_F}/7/0", f"MIG-{GPU_F}/8/0"),  # legacy ids: parent GPU_F
    _devices("nvidia.com/mig-1g.18gb", MIG_D),  # in no GPU's layout: unmapped
    _devices("nvidia.com/gpu", "3"),  # deviceIDStrategy=index: unmapped
    _devices("nvidia.com/hostdev", "0000:3b:00.2"),  # not a GPU: not counted at all
]


def test_allocatable_unparsed_lists_gpu_ids_that_are_not_uuids() -> None:
    from exporter.supervisor.podresources import allocatable_unparsed

    response = api_pb2.AllocatableResourcesResponse(devices=DEVICE_PLUGIN_NODE)
    assert allocatable_unparsed(response) == ("3",)


async def test_the_device_plugin_view_counts_parent_gpus_once_and_unmapped_devices(
    serve: Servers, caplog: pytest.LogCaptureFixture
) -> None:
    from exporter.config import Config
    from exporter.supervisor.pods import PodAttribution

    kubelet = FakeKubelet([], allocatable=DEVICE_PLUGIN_NODE)
    ext = PodAttribution(Config(pod_resources_socket=serve(kubelet), pod_refresh_s=0.02))
    ext.on_snapshot(_mig_snapshot())
    caplog.set_level(logging.INFO, logger="exporter.supervisor.pods")
    await _run_until_lists(ext, kubelet, 8)
    # GPU_A, GPU_B (4 replicas), GPU_E (through its MIG device in the layout), GPU_F (legacy ids)
    assert ext.gpu_count_views() == {"device_plugin": 4, "device_plugin_unmapped": 2}
    assert kubelet.allocatable_calls == 1  # eight refreshes, one GetAllocatableResources: at most every 60 s
    ext.gpu_count_views()  # rendered again: the unmapped MIG device is not said again
    text = _count_text(ext)
    assert 'nvgpu_gpus{view="device_plugin"} 4' in text and 'nvgpu_gpus{view="device_plugin_unmapped"} 2' in text
    said = [r for r in caplog.records if MIG_D in r.getMessage()]
    assert len(said) == 1 and "device_plugin_unmapped" in said[0].getMessage()


async def test_the_device_plugin_view_is_asked_again_after_a_kubelet_reconnect(serve: Servers) -> None:
    from exporter.config import Config
    from exporter.supervisor.pods import PodAttribution

    failing = threading.Event()

    def hook() -> None:
        if failing.is_set():
            raise RuntimeError("kubelet restarting")

    kubelet = FakeKubelet([], allocatable=[_devices("nvidia.com/gpu", GPU_A, GPU_B)], list_hook=hook)
    ext = PodAttribution(Config(pod_resources_socket=serve(kubelet), pod_refresh_s=0.02))
    task = asyncio.ensure_future(ext.run(_Host()))
    try:
        await _until(lambda: ext.gpu_count_views().get("device_plugin") == 2, "device_plugin 2")
        failing.set()
        await _until(lambda: ext.up is False, "the kubelet down")
        assert ext.gpu_count_views() == {}  # absent while the kubelet does not answer
        kubelet.allocatable = [_devices("nvidia.com/gpu", GPU_A)]  # a GPU left the device plugin meanwhile
        failing.clear()
        await _until(lambda: ext.gpu_count_views().get("device_plugin") == 1, "device_plugin 1, asked again")
        assert kubelet.allocatable_calls == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("error", [None, (grpc.StatusCode.INTERNAL, "boom")], ids=["unimplemented", "rpc_error"])
async def test_the_device_plugin_view_is_absent_when_the_call_fails_and_said_once(
    serve: Servers, caplog: pytest.LogCaptureFixture, error: Any
) -> None:
    from exporter.config import Config
    from exporter.supervisor.pods import ALLOCATABLE_EVERY_S, PodAttribution

    kubelet = FakeKubelet([], allocatable=None, allocatable_error=error)
    ext = PodAttribution(Config(pod_resources_socket=serve(kubelet), pod_refresh_s=0.02))
    caplog.set_level(logging.INFO, logger="exporter.supervisor.pods")
    await _run_until_lists(ext, kubelet, 6)
    assert ext.up is True and ext.gpu_count_views() == {}
    assert ALLOCATABLE_EVERY_S == 60.0 and kubelet.allocatable_calls == 1
    said = [r for r in caplog.records if "GetAllocatableResources" in r.getMessage()]
    assert len(said) == 1, said
    assert 'view="device_plugin' not in _count_text(ext)
