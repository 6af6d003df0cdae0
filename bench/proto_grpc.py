"""Issue 30 (d1): the kubelet's PodResources ``List`` call from three clients: memory, import, CPU.

Not product code. A fake kubelet (gRPC over HTTP/2 with ``h2``, in its own process, answering bytes made
with our ``proto/podresources/v1/api.proto`` stubs; it loads neither grpcio nor protobuf, so no
shared object of a client is also mapped by the server) serves a node of ``--gpu-pods`` pods holding one GPU
each and ``--other-pods`` pods without devices on a unix socket. Each client then runs in a fresh
interpreter and reports its import time, RSS/USS/PSS after the imports, after the first call and
after ``--calls`` calls, its threads, the CPU time per call, and the GPU -> pod map it got (which
must be the same for all):

``grpcio``
    the product's client (``exporter.supervisor.podresources.client.PodResourcesClient``: grpcio + protobuf,
    a blocking call; the supervisor runs it in a thread).
``grpclib``
    grpclib (pure-Python gRPC on asyncio, over ``h2``) with the same protobuf messages.
``h2``
    ``h2`` (pure-Python HTTP/2) on an asyncio unix connection, and the response decoded by
    :func:`decode_list_response` here (about 40 lines: varints and length-delimited fields), so
    neither grpcio nor protobuf is imported.

``--base supervisor`` first imports what the supervisor has loaded anyway (asyncio, uvloop,
``aiohttp.web``, ``prometheus_client``), so the figures are what the client adds to a running
supervisor; ``--base none`` measures from a bare interpreter.

``python bench/proto_grpc.py [--calls 200] [--json OUT]`` (about 30 s). grpclib and h2 are not
dependencies of the exporter: ``pip install grpclib`` (it brings h2) to run the two prototypes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("grpcio", "grpclib", "h2")
LIST_PATH = "/v1.PodResourcesLister/List"


# -- the fake kubelet -------------------------------------------------------------------------------


def response_bytes(gpu_pods: int, other_pods: int) -> bytes:
    """The serialized ``ListPodResourcesResponse`` of the fake node (protobuf, our generated stubs)."""
    sys.path.insert(0, str(ROOT))
    from exporter.supervisor.podresources.v1 import api_pb2

    pods = []
    for i in range(gpu_pods):
        dev = api_pb2.ContainerDevices(
            resource_name="nvidia.com/gpu",
            device_ids=[f"GPU-{i:08x}-0000-0000-0000-{i:012x}"],
            topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=i // 4)]),
        )
        containers = [
            api_pb2.ContainerResources(name="main", devices=[dev]),
            api_pb2.ContainerResources(name="sidecar"),
        ]
        pods.append(api_pb2.PodResources(name=f"trainer-{i}", namespace="ml", containers=containers))
    for i in range(other_pods):
        containers = [api_pb2.ContainerResources(name="app")]
        pods.append(api_pb2.PodResources(name=f"service-{i}-abcde", namespace="default", containers=containers))
    return bytes(api_pb2.ListPodResourcesResponse(pod_resources=pods).SerializeToString())


def kubelet(sock: str, payload_path: str) -> int:
    """Serve ``List`` on ``sock`` until killed: gRPC over HTTP/2 with ``h2``, the response bytes
    made beforehand. The server loads neither grpcio nor protobuf, so no shared object of the
    client's is also mapped here (as with the real kubelet, a Go program) and each client's
    libraries count fully in its own RSS/USS."""
    import h2.config
    import h2.connection
    import h2.events

    payload = Path(payload_path).read_bytes()
    message = b"\x00" + len(payload).to_bytes(4, "big") + payload

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        pending: dict[int, memoryview] = {}

        def flush() -> None:
            for sid in list(pending):
                view = pending[sid]
                while view:
                    n = min(len(view), conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                    if n <= 0:
                        break
                    conn.send_data(sid, bytes(view[:n]))
                    view = view[n:]
                pending[sid] = view
                if not view:
                    del pending[sid]
                    conn.send_headers(sid, [("grpc-status", "0")], end_stream=True)

        while True:
            data = await reader.read(65536)
            if not data:
                break
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.RequestReceived):
                    path = dict(ev.headers).get(":path")
                    if path != LIST_PATH:
                        conn.send_headers(ev.stream_id, [(":status", "200"), ("grpc-status", "12")], end_stream=True)
                        continue
                    conn.send_headers(ev.stream_id, [(":status", "200"), ("content-type", "application/grpc")])
                    pending[ev.stream_id] = memoryview(message)
                elif isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            flush()
            writer.write(conn.data_to_send())
            await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_unix_server(handle, sock)
        print(f"serving {len(payload)} bytes", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())
    return 0


# -- hand decoding of ListPodResourcesResponse (proto/podresources/v1/api.proto) --------------------


class _Msg:
    """Attributes as the generated message has them (what exporter.supervisor.podresources.client reads)."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes) -> Any:
    """(field number, value) of one message: ints for varints, bytes for length-delimited; 64- and
    32-bit fields are skipped (none in this API)."""
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            yield field, value
        elif wire == 2:
            size, i = _varint(buf, i)
            if i + size > n:
                raise ValueError("truncated field")
            yield field, buf[i : i + size]
            i += size
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"wire type {wire} not supported")


def _devices(buf: bytes) -> _Msg:
    name, ids = "", []
    for f, v in _fields(buf):
        if f == 1:
            name = v.decode()
        elif f == 2:
            ids.append(v.decode())
    return _Msg(resource_name=name, device_ids=ids)


def _container(buf: bytes) -> _Msg:
    name, devices = "", []
    for f, v in _fields(buf):
        if f == 1:
            name = v.decode()
        elif f == 2:
            devices.append(_devices(v))
    return _Msg(name=name, devices=devices)


def _pod(buf: bytes) -> _Msg:
    name = namespace = ""
    containers = []
    for f, v in _fields(buf):
        if f == 1:
            name = v.decode()
        elif f == 2:
            namespace = v.decode()
        elif f == 3:
            containers.append(_container(v))
    return _Msg(name=name, namespace=namespace, containers=containers)


def decode_list_response(buf: bytes) -> _Msg:
    """``v1.ListPodResourcesResponse`` from its wire bytes: pods, containers, devices (topology and
    unknown fields skipped, as protobuf does)."""
    return _Msg(pod_resources=[_pod(v) for f, v in _fields(buf) if f == 1])


async def h2_list(sock: str, timeout_s: float = 5.0) -> _Msg:
    """One unary ``List`` call over HTTP/2 (h2) on a unix socket; raises RuntimeError on a gRPC error."""
    import h2.config
    import h2.connection
    import h2.events

    reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(sock), timeout_s)
    try:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", LIST_PATH),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        conn.send_headers(sid, headers)
        conn.send_data(sid, b"\x00\x00\x00\x00\x00", end_stream=True)  # empty ListPodResourcesRequest
        writer.write(conn.data_to_send())
        body = bytearray()
        status: dict[str, str] = {}
        done = False
        deadline = time.monotonic() + timeout_s
        while not done:
            data = await asyncio.wait_for(reader.read(65536), max(0.0, deadline - time.monotonic()))
            if not data:
                raise RuntimeError("connection closed before the response ended")
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.DataReceived):
                    body += ev.data
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    status.update({str(k): str(v) for k, v in ev.headers})
                elif isinstance(ev, h2.events.StreamEnded):
                    done = True
                elif isinstance(ev, h2.events.StreamReset):
                    raise RuntimeError(f"stream reset: {ev.error_code}")
            writer.write(conn.data_to_send())
        if status.get("grpc-status", "0") != "0":
            raise RuntimeError(f"gRPC status {status.get('grpc-status')}: {status.get('grpc-message', '')}")
        if len(body) < 5 or body[0] != 0:
            raise RuntimeError("no uncompressed gRPC message in the response")
        size = int.from_bytes(body[1:5], "big")
        return decode_list_response(bytes(body[5 : 5 + size]))
    finally:
        writer.close()


# -- one client, in its own interpreter ---------------------------------------------------------------


def _mem() -> dict[str, float]:
    import psutil

    full = psutil.Process().memory_full_info()
    return {"rss_mb": round(full.rss / 1e6, 2), "uss_mb": round(full.uss / 1e6, 2), "pss_mb": round(full.pss / 1e6, 2)}


def client(kind: str, sock: str, calls: int, base: str) -> int:
    sys.path.insert(0, str(ROOT))
    import psutil

    out: dict[str, Any] = {"kind": kind, "base": base}
    if base == "supervisor":
        import aiohttp.web  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvloop  # noqa: F401
    out["before_import"] = _mem()
    t0 = time.perf_counter()
    if kind == "grpcio":
        from exporter.supervisor.podresources.client import PodResourcesClient

        pc = PodResourcesClient(sock)  # imports grpc and the generated modules

        def one() -> Any:
            return pc.list_device_assignments()[0]

    else:
        from exporter.supervisor.podresources.client import gpu_assignments

        if kind == "grpclib":
            import grpclib.client
            import grpclib.const

            from exporter.supervisor.podresources.v1 import api_pb2

            loop = asyncio.new_event_loop()

            async def make() -> Any:
                return grpclib.client.Channel(path=sock)

            channel = loop.run_until_complete(make())
            method = grpclib.client.UnaryUnaryMethod(
                channel, LIST_PATH, api_pb2.ListPodResourcesRequest, api_pb2.ListPodResourcesResponse
            )

            def one() -> Any:
                reply = loop.run_until_complete(method(api_pb2.ListPodResourcesRequest(), timeout=5.0))
                return gpu_assignments(reply)

        else:
            import h2.connection  # noqa: F401

            loop = asyncio.new_event_loop()

            def one() -> Any:
                return gpu_assignments(loop.run_until_complete(h2_list(sock)))

    out["import_s"] = round(time.perf_counter() - t0, 4)
    out["after_import"] = _mem()
    first = one()
    out["after_first_call"] = _mem()
    c0 = time.process_time()
    for _ in range(calls):
        result = one()
    out["cpu_ms_per_call"] = round(1000 * (time.process_time() - c0) / calls, 4)
    out["after_calls"] = _mem()
    out["threads"] = psutil.Process().num_threads()
    out["assignments"] = {
        u: [list(r.__dict__.values()) if hasattr(r, "__dict__") else list(r) for r in refs] for u, refs in first.items()
    }
    out["same_every_call"] = result == first
    out["modules"] = len(sys.modules)
    print(json.dumps(out))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="issue 30 (d1): kubelet PodResources List from three clients")
    p.add_argument("--kubelet", metavar="SOCK", help="(server side) serve the fake kubelet here")
    p.add_argument("--client", choices=KINDS, help="(client side) run one client")
    p.add_argument("--socket")
    p.add_argument("--payload", help="(server side) the response bytes")
    p.add_argument("--gpu-pods", type=int, default=8)
    p.add_argument("--other-pods", type=int, default=40)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--base", default="supervisor", choices=("supervisor", "none"))
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.kubelet:
        return kubelet(args.kubelet, args.payload)
    if args.client:
        return client(args.client, args.socket, args.calls, args.base)

    tmp = tempfile.mkdtemp(prefix="podres-", dir="/tmp")
    sock = os.path.join(tmp, "kubelet.sock")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    me = str(Path(__file__).resolve())
    payload = os.path.join(tmp, "list.bin")
    Path(payload).write_bytes(response_bytes(args.gpu_pods, args.other_pods))
    server = subprocess.Popen(
        [sys.executable, me, "--kubelet", sock, "--payload", payload],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        served = server.stdout.readline().strip() if server.stdout else ""
        results: dict[str, Any] = {"kubelet": served, "gpu_pods": args.gpu_pods, "other_pods": args.other_pods}
        for base in ("supervisor", "none"):
            for kind in args.kinds.split(","):
                cmd = [sys.executable, me, "--client", kind, "--socket", sock, "--calls", str(args.calls)]
                proc = subprocess.run([*cmd, "--base", base], capture_output=True, text=True, env=env, timeout=300)
                if proc.returncode != 0:
                    results[f"{kind}/{base}"] = {"error": proc.stderr[-2000:]}
                    continue
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                r["added_uss_mb"] = round(r["after_calls"]["uss_mb"] - r["before_import"]["uss_mb"], 2)
                r["added_rss_mb"] = round(r["after_calls"]["rss_mb"] - r["before_import"]["rss_mb"], 2)
                r["added_pss_mb"] = round(r["after_calls"]["pss_mb"] - r["before_import"]["pss_mb"], 2)
                results[f"{kind}/{base}"] = r
                print(
                    f"{kind:>8} (base {base}): import {r['import_s'] * 1000:.0f} ms, +{r['added_uss_mb']} MB USS "
                    f"(+{r['added_rss_mb']} RSS, +{r['added_pss_mb']} PSS), {r['cpu_ms_per_call']} ms CPU/call, "
                    f"{r['threads']} threads",
                    flush=True,
                )
        maps = {k: v["assignments"] for k, v in results.items() if isinstance(v, dict) and "assignments" in v}
        results["same_assignments"] = len({json.dumps(m, sort_keys=True) for m in maps.values()}) == 1
        print(f"same GPU -> pod map from every client: {results['same_assignments']}")
    finally:
        server.kill()
        server.wait()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
