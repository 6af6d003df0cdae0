"""GPUs allocated through DRA ResourceClaims are attributed, or counted and logged with their claim.

The kubelet reports them under ``dynamic_resources`` of PodResources v1 ``List``
(tests/fake_kubelet.py speaks those messages): NVIDIA's DRA driver names a GPU
``gpu.nvidia.com/<node>/gpu-0`` and its CDI names carry no UUID, so the UUID comes from the
driver's ResourceSlice (opt-in, read from the API server: a local HTTPS server stands in for it
here) or from CDI names that carry one (``nvidia.com/gpu=GPU-…``). A GPU neither names is
``nvgpu_pod_attribution_unmapped_devices{reason="dra_unresolved"}`` and one WARNING naming the
claim; nothing is dropped silently.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import ssl
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from exporter_proc import SCENARIOS, Exporter, load_scenario  # noqa: E402
from fake_kubelet import FakeKubelet, dra_pod  # noqa: E402
from tls_material import make_material  # noqa: E402

from exporter.config import Config  # noqa: E402
from exporter.settingvalues import ConfigError  # noqa: E402
from exporter.supervisor.podresources import DraDevice, PodRef, assignments, dra_devices, uuid_from_cdi_devices  # noqa: E402
from exporter.supervisor.podresources.resourceslices import ResourceSliceError, ResourceSliceReader, device_uuids  # noqa: E402
from exporter.supervisor.podresources.v1 import api_pb2, api_pb2_grpc  # noqa: E402

UUIDS = [gpu["uuid"] for gpu in load_scenario("h200x2")["gpus"]]
NODE = "gpu-node-7"
DRIVER = "gpu.nvidia.com"

# NVIDIA's driver: device gpu-<n>, CDI k8s.gpu.nvidia.com/device=<claim uid>-gpu-<n>: no UUID.
NVIDIA_DRA = dra_pod(
    "ml", "train-0", "trainer", "train-gpu", (DRIVER, NODE, "gpu-0", ["k8s.gpu.nvidia.com/device=7d1c-gpu-0"])
)
# A CDI spec generated with the UUID device-name strategy: the UUID is in the CDI name.
CDI_UUID = dra_pod(
    "ml", "infer-1", "server", "infer-gpu", ("gpu.example.com", "pool-a", "dev-1", [f"nvidia.com/gpu={UUIDS[1]}"])
)
# Another driver's device (a NIC): neither a GPU nor counted.
NIC = dra_pod("net", "sriov-0", "app", "nic", ("sriov.example.com", NODE, "vf-3", ["example.com/net=vf-3"]))


def slice_of(devices: list[dict[str, Any]], version: str = "v1") -> dict[str, Any]:
    if version == "v1beta1":
        devices = [{"name": d["name"], "basic": {"attributes": d["attributes"]}} for d in devices]
    return {"spec": {"driver": DRIVER, "pool": {"name": NODE, "generation": 1}, "nodeName": NODE, "devices": devices}}


SLICE_DEVICES = [
    {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": UUIDS[0]}, "index": {"int": 0}}},
    {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}, "gpu.nvidia.com/uuid": {"string": UUIDS[1]}}},
    {"name": "weird", "attributes": {"type": {"string": "gpu"}}},
]


# -- the mapping (parsed messages in, no transport) -------------------------------------------


def test_dra_devices_carry_driver_pool_device_claim_and_cdi_names() -> None:
    response = api_pb2.ListPodResourcesResponse(pod_resources=[NVIDIA_DRA])
    ((dev, refs),) = dra_devices(response).items()
    assert dev == DraDevice(DRIVER, NODE, "gpu-0", "ml", "train-gpu", ("k8s.gpu.nvidia.com/device=7d1c-gpu-0",))
    assert refs == (PodRef("ml", "train-0", "trainer"),)
    assert dev.describe() == f"{DRIVER}/{NODE}/gpu-0 of claim ml/train-gpu"


def test_cdi_names_carry_a_uuid_only_when_they_name_one() -> None:
    assert uuid_from_cdi_devices([f"nvidia.com/gpu={UUIDS[0]}"]) == UUIDS[0]
    assert uuid_from_cdi_devices(["nvidia.com/gpu=MIG-5c1e2f3a-7b8c-5d9e-a0b1-c2d3e4f5a6b7"]).startswith("MIG-")
    assert (
        uuid_from_cdi_devices(["k8s.gpu.nvidia.com/device=7d1c-gpu-0", "nvidia.com/gpu=0", "nvidia.com/gpu=all"])
        is None
    )


def test_unresolved_gpus_are_returned_and_other_drivers_are_not_gpus() -> None:
    response = api_pb2.ListPodResourcesResponse(pod_resources=[NVIDIA_DRA, CDI_UUID, NIC])
    found = assignments(response)
    assert found.gpus == {UUIDS[1]: (PodRef("ml", "infer-1", "server"),)}
    assert [d.key for d in found.dra_unresolved] == [(DRIVER, NODE, "gpu-0")]
    resolved = assignments(response, {(DRIVER, NODE, "gpu-0"): UUIDS[0]})
    assert resolved.gpus[UUIDS[0]] == (PodRef("ml", "train-0", "trainer"),) and not resolved.dra_unresolved


def test_a_device_plugin_gpu_and_a_claim_on_the_same_gpu_list_both_holders() -> None:
    plugin = api_pb2.PodResources(
        namespace="ml", name="old", containers=[api_pb2.ContainerResources(
            name="c", devices=[api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[UUIDS[1]])])],
    )  # fmt: skip
    found = assignments(api_pb2.ListPodResourcesResponse(pod_resources=[plugin, CDI_UUID]))
    assert found.gpus[UUIDS[1]] == (PodRef("ml", "infer-1", "server"), PodRef("ml", "old", "c"))


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_resourceslice_devices_to_uuids(version: str) -> None:
    assert device_uuids([slice_of(SLICE_DEVICES, version), {"spec": "junk"}, {}]) == {
        (DRIVER, NODE, "gpu-0"): UUIDS[0],
        (DRIVER, NODE, "gpu-1"): UUIDS[1],
    }


def test_dra_resourceslices_needs_the_node_name() -> None:
    with pytest.raises(ConfigError, match="NVGPU_NODE_NAME"):
        Config.from_env({"NVGPU_DRA_RESOURCESLICES": "true"})
    assert Config.from_env({"NVGPU_DRA_RESOURCESLICES": "true", "NVGPU_NODE_NAME": NODE}).dra_resourceslices


# -- the API server (a local HTTPS server with a service-account token) -----------------------


class ApiServer:
    """``GET /apis/resource.k8s.io/<version>/resourceslices`` over HTTPS; answers only the bearer token."""

    def __init__(self, directory: Path, served: str = "v1", status: int = 200) -> None:
        tls = make_material(directory)
        self.account = directory / "sa"
        self.account.mkdir()
        (self.account / "token").write_text("sa-token\n")
        shutil.copyfile(tls.path("ca.crt"), self.account / "ca.crt")
        self.requests: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.requests.append(self.path)
                ok = self.headers.get("Authorization") == "Bearer sa-token"
                if not ok or status != 200:
                    self.send_error(403 if not ok else status)
                    return
                if not self.path.startswith(f"/apis/resource.k8s.io/{served}/resourceslices?"):
                    self.send_error(404)
                    return
                body = json.dumps({"kind": "ResourceSliceList", "items": [slice_of(SLICE_DEVICES, served)]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tls.path("server.crt"), tls.path("server.key"))
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_the_reader_finds_the_served_version_and_sends_the_token(tmp_path: Path) -> None:
    api = ApiServer(tmp_path, served="v1beta1")
    try:
        reader = ResourceSliceReader(NODE, server=api.url, account_dir=str(api.account))
        assert reader.list() == {(DRIVER, NODE, "gpu-0"): UUIDS[0], (DRIVER, NODE, "gpu-1"): UUIDS[1]}
        assert [p.split("?")[0].split("/")[3] for p in api.requests] == ["v1", "v1beta2", "v1beta1"]
        assert all(p.endswith("?fieldSelector=spec.nodeName%3Dgpu-node-7") for p in api.requests)
        reader.list()  # the version found is kept
        assert api.requests[-1].startswith("/apis/resource.k8s.io/v1beta1/")
    finally:
        api.close()


def test_the_reader_says_what_to_fix(tmp_path: Path) -> None:
    api = ApiServer(tmp_path, status=403)
    try:
        with pytest.raises(ResourceSliceError, match="forbidden: bind the ClusterRole"):
            ResourceSliceReader(NODE, server=api.url, account_dir=str(api.account)).list()
        with pytest.raises(ResourceSliceError, match="no service-account token"):
            ResourceSliceReader(NODE, server=api.url, account_dir=str(tmp_path / "none")).list()
        with pytest.raises(ResourceSliceError, match="KUBERNETES_SERVICE_HOST"):
            ResourceSliceReader(NODE, environ={}).list()
    finally:
        api.close()


def test_a_fifo_or_a_missing_ca_in_the_account_dir_is_a_problem_not_a_wait(tmp_path: Path) -> None:
    """The token and ca.crt are opened without blocking: a FIFO there (no writer) is refused at once,
    and a missing ca.crt is the reader's error naming it, not an OSError out of ssl."""
    account = tmp_path / "account"
    account.mkdir()
    os.mkfifo(account / "token")
    with pytest.raises(ResourceSliceError, match="no service-account token .*FIFO"):
        ResourceSliceReader(NODE, server="https://127.0.0.1:1", account_dir=str(account)).list()
    (account / "token").unlink()
    (account / "token").write_text("sa-token\n")
    with pytest.raises(ResourceSliceError, match="no service-account ca.crt"):
        ResourceSliceReader(NODE, server="https://127.0.0.1:1", account_dir=str(account)).list()


# -- the real exporter with a kubelet that reports ResourceClaims ---------------------------


@pytest.fixture
def kubelet() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="podres-", dir="/tmp")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    # The device plugin offers GPU 0 time-sliced (two replicas) and GPU 1 whole: two GPUs.
    offered = [
        api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[f"{UUIDS[0]}::0", f"{UUIDS[0]}::1"]),
        api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[UUIDS[1]]),
    ]
    servicer = FakeKubelet([NVIDIA_DRA, CDI_UUID, NIC], allocatable=offered)
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    path = f"{directory}/kubelet.sock"
    assert server.add_insecure_port(f"unix://{path}") != 0
    server.start()
    yield path
    server.stop(grace=None).wait(5)
    shutil.rmtree(directory, ignore_errors=True)


def test_claims_are_attributed_and_what_cannot_be_is_counted_and_logged_once(tmp_path: Path, kubelet: str) -> None:
    env = {"NVGPU_POD_RESOURCES_SOCKET": kubelet, "NVGPU_POD_REFRESH_SECONDS": "0.5"}
    with Exporter(SCENARIOS / "h200x2.json", tmp_path, env=env) as exp:
        scrape = exp.wait_for(
            lambda s: (
                s.value("nvgpu_gpu_pod_info", uuid=UUIDS[1], pod="infer-1") == 1.0
                and s.value("nvgpu_pod_attribution_unmapped_devices", reason="dra_unresolved") == 1.0
            ),
            what="the CDI-named claim attributed, the NVIDIA-named one counted",
        )
        assert scrape.value("nvgpu_gpu_pod_info", uuid=UUIDS[0], pod="train-0") is None
        # the device plugin's view of the GPU count, beside NVML's
        scrape = exp.wait_for(lambda s: s.value("nvgpu_gpus", view="device_plugin") == 2.0, what="device_plugin 2")
        assert scrape.value("nvgpu_gpus", view="device_plugin_unmapped") == 0.0
        assert scrape.value("nvgpu_gpus", view="present") == 2.0
        exp.wait_samples(3)
        warnings = [r for r in exp.log_records() if r.get("reason") == "dra_unresolved"]
        assert len(warnings) == 1, warnings
        assert f"{DRIVER}/{NODE}/gpu-0 of claim ml/train-gpu" in warnings[0]["msg"]
        assert "ml/train-0/trainer" in warnings[0]["msg"] and "NVGPU_DRA_RESOURCESLICES" in warnings[0]["msg"]
        assert exp.terminate() == 0
