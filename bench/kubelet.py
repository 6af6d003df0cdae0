"""A kubelet PodResources socket for footprint numbers: pod attribution loaded as on Kubernetes.

Not product code. :func:`fake_kubelet` serves ``v1.PodResourcesLister/List`` on a unix socket from
its own process (``bench/proto_grpc.py --kubelet``: HTTP/2 with ``h2``, the response bytes made
beforehand with our generated messages), so the server maps neither grpcio nor protobuf: as with
the real kubelet (a Go program), no shared object of the exporter's client is mapped twice and the
client's libraries count fully in the exporter's RSS and PSS. The node it describes has one pod
per GPU UUID given (a ``main`` container holding the GPU and a sidecar without devices) and
``other_pods`` pods without devices.

``uuids_of(backend)`` gives the GPUs to name: a fake scenario's UUIDs, or ``nvidia-smi``'s on a GPU
machine (none if it is missing: the pods then hold unknown GPUs, which the exporter counts in
``nvgpu_pod_attribution_unmapped_devices``; the code and libraries loaded are the same).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def response_bytes(uuids: list[str], other_pods: int = 40) -> bytes:
    """The serialized ``ListPodResourcesResponse`` of the node (our generated messages)."""
    sys.path.insert(0, str(ROOT))
    from exporter.supervisor.podresources.v1 import api_pb2

    pods = []
    for i, uuid in enumerate(uuids):
        dev = api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[uuid])
        containers = [
            api_pb2.ContainerResources(name="main", devices=[dev]),
            api_pb2.ContainerResources(name="sidecar"),
        ]
        pods.append(api_pb2.PodResources(name=f"trainer-{i}", namespace="ml", containers=containers))
    for i in range(other_pods):
        containers = [api_pb2.ContainerResources(name="app")]
        pods.append(api_pb2.PodResources(name=f"service-{i}-abcde", namespace="default", containers=containers))
    return bytes(api_pb2.ListPodResourcesResponse(pod_resources=pods).SerializeToString())


def uuids_of(backend: str) -> list[str]:
    """GPU UUIDs of a ``fake:<scenario>`` backend, or of this machine's GPUs (``nvidia-smi``)."""
    if backend.startswith("fake:"):
        name = backend[len("fake:") :]
        path = Path(name) if name.endswith(".json") else ROOT / "exporter" / "common" / "scenarios" / f"{name}.json"
        return [g["uuid"] for g in json.loads(path.read_text())["gpus"]]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    out = subprocess.run([smi, "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    return [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("GPU-")]


@contextlib.contextmanager
def fake_kubelet(uuids: list[str], other_pods: int = 40) -> Iterator[str]:
    """Serve the node on a fresh unix socket; yields its path (short: unix socket paths take 107 bytes)."""
    tmp = tempfile.mkdtemp(prefix="kubelet-", dir="/tmp")
    sock, payload = os.path.join(tmp, "kubelet.sock"), os.path.join(tmp, "list.bin")
    Path(payload).write_bytes(response_bytes(uuids, other_pods))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "proto_grpc.py"), "--kubelet", sock, "--payload", payload],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        line = server.stdout.readline() if server.stdout else ""
        if not line.startswith("serving"):
            raise RuntimeError(f"the fake kubelet did not start: {line!r}")
        yield sock
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def pod_env(sock: str) -> dict[str, str]:
    """The exporter's settings for pod attribution on ``sock`` (as the Kubernetes manifests set it)."""
    return {"NVGPU_FEATURE_POD_ATTRIBUTION": "on", "NVGPU_POD_RESOURCES_SOCKET": sock}
