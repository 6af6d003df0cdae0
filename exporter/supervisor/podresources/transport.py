"""One unary gRPC call over HTTP/2 on a unix socket, blocking, with h2 (pure Python, sans-I/O).

What the kubelet's PodResources API needs of gRPC is small: a unary call on a local unix socket,
plaintext HTTP/2 with prior knowledge (no TLS, no ALPN, no proxy), one length-prefixed request and
one response message, and the call's status in the trailers. This module does exactly that with
``h2`` over a standard blocking socket, so the client costs a few MB and no thread of its own,
where grpcio's C core costs about 16 MB and six threads in the supervisor (docs/performance.md).
The messages are protobuf's, encoded and parsed by the protobuf runtime from the generated
``api_pb2`` classes, so the caller gets the same message objects as from grpcio.

Wire format (the gRPC over HTTP/2 protocol, grpc/grpc ``doc/PROTOCOL-HTTP2.md``): a ``POST`` to
``/<package>.<Service>/<Method>`` with ``content-type: application/grpc`` and ``te: trailers``; each
message is a 1-byte compressed flag (0 here), a 4-byte big-endian length and the bytes; the status
is ``grpc-status`` (a number, :data:`STATUS_NAMES`) and ``grpc-message`` (percent-encoded) in the
trailers, or in the headers of a response without a body ("trailers-only").

Imported only when a client is built (``exporter.supervisor.podresources.client``): it imports h2.
"""

from __future__ import annotations

import socket
import time
import urllib.parse
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions

__all__ = ["STATUS_NAMES", "CallFailed", "unary_call"]

STATUS_NAMES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
"""gRPC status codes by number (grpc/grpc ``doc/statuscodes.md``)."""

_READ = 65536


class CallFailed(Exception):
    """The call did not succeed.

    Attributes:
        code: the gRPC status name (:data:`STATUS_NAMES`): ``DEADLINE_EXCEEDED`` when the deadline
            passed, ``UNAVAILABLE`` when the socket refused, reset or closed the connection.
        details: the server's ``grpc-message``, or what went wrong on our side.
    """

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


def _status(headers: dict[str, str]) -> tuple[str, str]:
    raw = headers.get("grpc-status")
    if raw is None:
        return "UNKNOWN", "the response carries no grpc-status"
    try:
        code = STATUS_NAMES[int(raw)]
    except (ValueError, IndexError):
        code = "UNKNOWN"
    return code, urllib.parse.unquote(headers.get("grpc-message", ""))


def unary_call(
    socket_path: str, path: str, request: bytes, timeout_s: float, max_response_bytes: int, authority: str = "localhost"
) -> bytes:
    """Call ``path`` (``/v1.PodResourcesLister/List``) with the serialized ``request``; returns the
    serialized response message.

    Args:
        socket_path: the server's unix socket.
        path: the method's HTTP/2 path.
        request: the request message, serialized.
        timeout_s: deadline of the whole call, connection included (also sent as ``grpc-timeout``).
        max_response_bytes: a longer response message fails with ``RESOURCE_EXHAUSTED``.
        authority: the ``:authority`` header (a unix socket has no host).

    Raises:
        CallFailed: the status was not OK, the deadline passed, the connection failed, or the
            response is not one uncompressed gRPC message.
    """
    deadline = time.monotonic() + timeout_s
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        try:
            sock.connect(socket_path)
        except TimeoutError:
            raise CallFailed("DEADLINE_EXCEEDED", "connecting took too long") from None
        except OSError as exc:
            raise CallFailed("UNAVAILABLE", f"cannot connect: {exc.strerror or exc}") from None
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        stream = conn.get_next_available_stream_id()
        conn.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", authority),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("grpc-timeout", f"{max(1, int(timeout_s * 1000))}m"),
            ],
        )
        conn.send_data(stream, b"\x00" + len(request).to_bytes(4, "big") + request, end_stream=True)
        headers: dict[str, str] = {}
        body = bytearray()
        ended = False
        try:
            while True:
                out = conn.data_to_send()
                if out:
                    sock.sendall(out)
                if ended:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CallFailed("DEADLINE_EXCEEDED", f"no complete answer within {timeout_s:g} s")
                sock.settimeout(left)
                data = sock.recv(_READ)
                if not data:
                    raise CallFailed("UNAVAILABLE", "the server closed the connection before the call ended")
                for event in conn.receive_data(data):
                    ended = _on_event(event, stream, conn, headers, body, max_response_bytes) or ended
        except TimeoutError:
            raise CallFailed("DEADLINE_EXCEEDED", f"no complete answer within {timeout_s:g} s") from None
        except (OSError, h2.exceptions.ProtocolError) as exc:
            raise CallFailed("UNAVAILABLE", f"the connection failed: {exc}") from None
    finally:
        sock.close()
    code, details = _status(headers)
    if code != "OK":
        raise CallFailed(code, details)
    if len(body) < 5 or body[0] != 0:
        raise CallFailed("INTERNAL", "the response is not one uncompressed gRPC message")
    size = int.from_bytes(body[1:5], "big")
    if len(body) != 5 + size:
        raise CallFailed("INTERNAL", f"the response message says {size} bytes and has {len(body) - 5}")
    return bytes(body[5:])


def _on_event(
    event: Any, stream: int, conn: Any, headers: dict[str, str], body: bytearray, max_response_bytes: int
) -> bool:
    """Apply one h2 event of our stream; True once the stream has ended."""
    if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
        headers.update((str(k), str(v)) for k, v in event.headers)
        if isinstance(event, h2.events.ResponseReceived) and headers.get(":status") != "200":
            raise CallFailed("UNAVAILABLE", f"the server answered HTTP status {headers.get(':status')}")
    elif isinstance(event, h2.events.DataReceived):
        body += event.data
        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        if len(body) > 5 + max_response_bytes:
            raise CallFailed("RESOURCE_EXHAUSTED", f"the response is longer than {max_response_bytes} bytes")
    elif isinstance(event, h2.events.StreamReset) and event.stream_id == stream:
        raise CallFailed("UNAVAILABLE", f"the server reset the call (HTTP/2 error {event.error_code})")
    elif isinstance(event, h2.events.ConnectionTerminated):
        raise CallFailed("UNAVAILABLE", f"the server ended the connection (HTTP/2 error {event.error_code})")
    return isinstance(event, h2.events.StreamEnded) and event.stream_id == stream
