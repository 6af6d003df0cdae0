"""The HTTP edge below aiohttp: listening sockets, connection cap, header timeout, TLS per connection.

:class:`Listener` binds the listening sockets and accepts connections itself (``loop.sock_accept``)
instead of letting ``loop.create_server`` do it, because the decisions below must be made before a
connection costs anything:

- **Cap.** Open connections (TLS handshakes in progress included) are counted from ``accept()``; one
  over :attr:`Listener.max_connections` is answered ``503`` and closed at once (plain HTTP) or
  closed before any handshake (TLS). An idle-connection flood therefore cannot take the supervisor's
  file descriptors: the cap is lowered to the open-file limit minus
  :data:`~exporter.supervisor.http.httpedge.FD_HEADROOM`, which stays free for the worker's pipes,
  the state file and the kernel log (without it, 250 idle connections under a 200-fd limit made the
  next worker respawn fail and the process exit 1).
- **Reserve; the heaviest client's idle connections go first.** The last
  :func:`~exporter.supervisor.http.httpedge.reserve` slots of the cap (an eighth, at least 2) are
  kept for new connections: a connection accepted while fewer are free closes another to make room
  (counted ``evicted``): the one idle longest of the client (address) holding the most connections,
  however new, else anyone's idle at least :data:`EVICT_IDLE_S`; kept-alive connections before ones
  without a complete request yet, never one serving a request. So one client that keeps the cap
  full, re-opening every connection it loses as fast as it can, pays with its own connections: the
  kubelet's probes and Prometheus, one connection each from their own addresses, are accepted and
  served. Only when no connection can be closed (all serving a request, or new and spread over many
  clients) does a new one get the 503. (Prometheus's kept-alive connection may be the one closed
  between two scrapes, when Prometheus holds the most connections; its client dials again.)
- **TLS per connection.** Each accepted socket becomes a transport through
  ``loop.connect_accepted_socket`` with the TLS context current at that moment (``tls()``), so a
  rotated certificate applies to the next connection without a restart; a verified client
  certificate whose SANs are not allowed (``client_allowed_sans``) closes the connection, as in
  exporter-toolkit. (``loop.start_tls`` on an accepted plain transport would race: uvloop, and
  asyncio before 3.11, start reading before ``pause_reading()`` from ``connection_made`` takes effect,
  and the ClientHello is lost.)
- **Header timeout.** ``header_timeout_s`` bounds the TLS handshake, and then the time from the
  connection (or from the first byte of each later request on a kept-alive connection) to a
  complete request head; otherwise the connection is closed (slowloris). Idle keep-alive
  connections are closed by aiohttp's ``keepalive_timeout``.

aiohttp's middleware reports the start and end of each request (:meth:`Listener.request_started`,
:meth:`Listener.request_finished`) so the header timer never runs while a request is served.
Nothing here imports aiohttp: the factory it wraps is any protocol factory.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from exporter.common.logs import log_once
from exporter.supervisor.http.httpedge import HttpEdge, reserve

# The edge's log lines keep the logger name they have always had (operators filter on it).
log = logging.getLogger("exporter.supervisor.http.httpedge")

EVICT_IDLE_S = 0.5  # a connection idle less than this is not evicted (its request may not be read yet)
BUSY_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\nServer: nvgpu-exporter\r\nConnection: close\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: 41\r\n\r\n"
    b"too many open connections; retry shortly\n"
)
PLAIN_HTTP_400 = (
    b"HTTP/1.1 400 Bad Request\r\nServer: nvgpu-exporter\r\nConnection: close\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: 55\r\n\r\n"
    b"this port speaks HTTPS (web config file): use https://\n"
)


class Listener:
    """Listening sockets and the accept loop (see the module docstring).

    Args:
        edge: where the counters go.
        max_connections: the cap (already lowered by :func:`~exporter.supervisor.http.httpedge.connection_cap`).
        header_timeout_s: time for the TLS handshake, and for a complete request head.
        tls: returns the TLS context for a new connection, None for plain HTTP.
        peer_problem: given the TLS object of a finished handshake, why its client certificate is
            refused, or None.
    """

    def __init__(
        self,
        edge: HttpEdge,
        max_connections: int,
        header_timeout_s: float,
        tls: Callable[[], ssl.SSLContext | None] = lambda: None,
        peer_problem: Callable[[Any], str | None] = lambda _obj: None,
    ) -> None:
        self.factory: Callable[[], asyncio.Protocol] | None = None  # given to start()
        self.edge = edge
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.tls = tls
        self.peer_problem = peer_problem
        self.sockets: list[socket.socket] = []
        self.reserve = reserve(max_connections)
        self._by_transport: dict[int, _Guarded] = {}
        self._tasks: set[asyncio.Future[Any]] = set()
        # Open connections, least recently active first (a finished request moves one to the end).
        self._lru: dict[_Guarded, None] = {}
        self._by_peer: collections.Counter[str] = collections.Counter()  # client address -> open connections
        self._evicting = 0  # evicted, not yet released
        edge.max_connections = max_connections

    # -- sockets ------------------------------------------------------------------------------

    async def start(self, factory: Callable[[], asyncio.Protocol], host: str, port: int, backlog: int = 4096) -> None:
        """Bind ``host:port`` ("" = every interface, IPv4 and IPv6 where available) and accept,
        handing each connection to a protocol from ``factory`` (aiohttp's ``AppRunner.server``,
        which exists once the runner is set up: after the application that holds this listener).

        Raises:
            OSError: no address could be bound (the caller exits: a failed listen socket is one
                of the two things that end the process).
        """
        self.factory = factory
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE | socket.AI_NUMERICHOST
        )
        errors = []
        seen = set()
        for family, kind, proto, _name, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # the IPv4 socket takes v4
                sock.bind(address)
                sock.listen(backlog)
                sock.setblocking(False)
            except OSError as exc:
                sock.close()
                if exc.errno == errno.EAFNOSUPPORT or (host == "" and family == socket.AF_INET6):
                    continue  # no IPv6 in this network namespace: IPv4 alone will do
                errors.append(exc)
                continue
            self.sockets.append(sock)
        if errors or not self.sockets:
            self.close()
            raise errors[0] if errors else OSError(errno.EADDRNOTAVAIL, f"no address to listen on for {host}:{port}")
        for sock in self.sockets:
            self._spawn(self._accept_loop(sock))

    def close(self) -> None:
        """Stop accepting; connections already handed to aiohttp are its to close."""
        for task in list(self._tasks):
            task.cancel()
        for sock in self.sockets:
            sock.close()
        self.sockets = []

    def _spawn(self, coro: Any) -> asyncio.Future[Any]:
        task: asyncio.Future[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _accept_loop(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, addr = await loop.sock_accept(listening)
                self._accepted(sock, _peer(addr))
                for _ in range(64):  # drain the backlog without a round trip through the loop each
                    try:
                        sock, addr = listening.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    self._accepted(sock, _peer(addr))
            except asyncio.CancelledError:
                raise
            except OSError as exc:  # EMFILE/ENFILE/ENOBUFS: wait for descriptors to come back
                log_once(log, logging.ERROR, ("accept", str(exc.errno)), "accept() failed: %s; retrying", exc)
                await asyncio.sleep(0.5)
            except Exception:  # noqa: BLE001 - the accept loop must outlive any one connection
                log_once(log, logging.ERROR, ("accept-bug",), "accepting a connection failed", exc_info=True)
                await asyncio.sleep(0.5)

    def _accepted(self, sock: socket.socket, peer: str = "") -> None:
        sock.setblocking(False)
        edge = self.edge
        if edge.open - self._evicting >= self.max_connections - self.reserve:
            victim = self._victim(peer)
            if victim is not None:
                self._evict(victim)
        if edge.open - self._evicting >= self.max_connections:
            self.drop("limit")
            try:
                if self._tls_context_or_none() is None:
                    sock.recv(65536)  # what already arrived, so the close is a FIN, not a reset that loses the 503
            except OSError:
                pass
            try:
                if self._tls_context_or_none() is None:
                    sock.send(BUSY_503)
            except OSError:
                pass
            sock.close()
            return
        edge.open += 1
        conn = _Guarded(self, peer)
        self._lru[conn] = None
        self._by_peer[peer] += 1
        conn.task = self._spawn(conn.attach(sock))
        conn.task.add_done_callback(lambda task: conn.attach_done(task, sock))

    def _victim(self, peer: str) -> _Guarded | None:
        """The connection to close so that one from ``peer`` can be accepted near the cap.

        The client (address) holding the most connections pays first, whoever asks: its
        connection idle longest goes, however new (it holds more than its share). Otherwise the
        connection idle longest of anyone, if idle at least :data:`EVICT_IDLE_S` (its request may
        still be in the socket, unread: a burst of new connections is accepted before any of them
        is read). Kept-alive connections go before ones without a complete request yet; a
        connection serving a request is never closed.
        """
        if self._by_peer:
            heavy, most = max(self._by_peer.items(), key=lambda item: item[1])
            if most > 1 and (peer == heavy or self._by_peer[peer] + 1 < most):
                victim = self._idle_longest(lambda conn: conn.peer == heavy, 0.0)
                if victim is not None:
                    return victim
        return self._idle_longest(lambda conn: True, min(EVICT_IDLE_S, self.header_timeout_s / 2))

    def _idle_longest(self, which: Callable[[_Guarded], bool], idle_s: float) -> _Guarded | None:
        waiting = None
        newest = time.monotonic() - idle_s
        for conn in self._lru:
            if conn.busy or conn.evicted or conn.idle_since > newest or not which(conn):
                continue
            if conn.requests:
                return conn
            if waiting is None:
                waiting = conn
        return waiting

    def _evict(self, conn: _Guarded) -> None:
        conn.evicted = True
        self._evicting += 1
        self.edge.dropped["evicted"] += 1
        log_once(
            log,
            logging.WARNING,
            ("http-evict",),
            "%d of %d HTTP connections open: closing the ones idle longest to keep %d free for new ones "
            "(probes, Prometheus); raise NVGPU_WEB_MAX_CONNECTIONS if this is expected load",
            self.edge.open,
            self.max_connections,
            self.reserve,
        )
        conn.close()

    def _tls_context_or_none(self) -> ssl.SSLContext | None:
        try:
            return self.tls()
        except Exception:  # noqa: BLE001 - logged where the connection needs it
            return None

    # -- requests -----------------------------------------------------------------------------

    def request_started(self, transport: asyncio.BaseTransport | None) -> None:
        """A complete request head arrived on ``transport``: no header timer while it is served."""
        conn = self._by_transport.get(id(transport)) if transport is not None else None
        if conn is not None:
            conn.busy = True
            conn.disarm()

    def request_finished(self, transport: asyncio.BaseTransport | None) -> None:
        """The response to the request on ``transport`` was handed over."""
        conn = self._by_transport.get(id(transport)) if transport is not None else None
        if conn is not None:
            conn.busy = False
            conn.requests += 1
            conn.idle_since = time.monotonic()
            if conn in self._lru:  # the most recently active now
                del self._lru[conn]
                self._lru[conn] = None

    def drop(self, reason: str, detail: str = "") -> None:
        """Count a connection closed for ``reason`` (one of :data:`~exporter.supervisor.http.httpedge.DROP_REASONS`)."""
        self.edge.dropped[reason] += 1
        if reason == "limit":
            log_once(
                log,
                logging.WARNING,
                ("http-limit",),
                "%d HTTP connections open: refusing more (503) until some close; "
                "raise NVGPU_WEB_MAX_CONNECTIONS or the open-file limit if this is expected load",
                self.max_connections,
            )
        elif detail:
            log.debug("connection closed (%s): %s", reason, detail)


class _Guarded(asyncio.Protocol):
    """One accepted connection: counted, timed, made TLS, then handed to aiohttp's protocol."""

    def __init__(self, listener: Listener, peer: str = "") -> None:
        self.listener = listener
        self.peer = peer  # the client's address
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.BaseTransport | None = None
        self.busy = False
        self.requests = 0  # answered on this connection
        self.evicted = False
        self.task: asyncio.Future[Any] | None = None  # attach(): until the transport exists
        self.accepted_mono = time.monotonic()
        self.idle_since = self.accepted_mono  # accepted, or the last response handed over
        self._timer: asyncio.TimerHandle | None = None
        self._released = False

    def attach_done(self, task: asyncio.Future[Any], sock: socket.socket) -> None:
        """:meth:`attach` ended: when it was cancelled before it could run (evicted in the same
        accept batch), the socket is still ours to close."""
        if task.cancelled() and self.transport is None and not self._released:
            sock.close()
            self._release()

    def close(self) -> None:
        """Close the connection now: abort its transport, or cancel the handshake or the wait for
        the first byte when there is no transport yet."""
        if self.transport is not None:
            _abort(self.transport)
        elif self.task is not None and not self.task.done():
            self.task.cancel()
        else:
            self._release()

    async def attach(self, sock: socket.socket) -> None:
        """Make the socket a transport (TLS handshake included) with this protocol on it."""
        listener = self.listener
        loop = asyncio.get_running_loop()
        try:
            context = listener.tls()
        except Exception:  # noqa: BLE001 - a broken context must not cost the process
            log_once(log, logging.ERROR, ("tls-context",), "no TLS context for a new connection", exc_info=True)
            sock.close()
            self._release()
            return
        if context is not None:
            try:
                speaks_tls = await self._speaks_tls(sock)
            except asyncio.CancelledError:  # evicted while waiting for the first byte
                sock.close()
                self._release()
                raise
            if not speaks_tls:
                return
        try:
            if context is None:
                await loop.connect_accepted_socket(lambda: self, sock)
            else:
                await loop.connect_accepted_socket(
                    lambda: self, sock, ssl=context, ssl_handshake_timeout=listener.header_timeout_s
                )
        except asyncio.CancelledError:
            self._release()
            raise
        except Exception as exc:  # noqa: BLE001 - handshake failures, timeouts, resets: one connection
            # The loop owns the socket from the call on and closes it with the transport.
            if context is not None and not self._released:
                listener.drop("tls_handshake", f"{type(exc).__name__}: {exc}")
            self._release()

    async def _speaks_tls(self, sock: socket.socket) -> bool:
        """Wait for the client's first byte: a TLS handshake record goes on; plain HTTP gets a 400
        that says to use https (what Go's server answers), anything else or nothing is closed."""
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        fd = sock.fileno()

        def readable() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await asyncio.wait_for(ready, self.listener.header_timeout_s)
            first = sock.recv(1, socket.MSG_PEEK)
        except asyncio.TimeoutError:
            self.listener.drop("header_timeout", "no TLS handshake in time")
            first = None
        except OSError:
            first = b""
        finally:
            loop.remove_reader(fd)
        if first == b"\x16":  # TLS record type 22: handshake
            return True
        if first and first.isalpha():
            self.listener.drop("tls_handshake", "plain HTTP on the TLS port")
            try:
                sock.send(PLAIN_HTTP_400)
            except OSError:
                pass
        elif first is not None:
            self.listener.drop("tls_handshake", "not a TLS handshake")
        sock.close()
        self._release()
        return False

    # -- bookkeeping --------------------------------------------------------------------------

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        self.disarm()
        self.listener.edge.open -= 1
        self.listener._lru.pop(self, None)
        by_peer = self.listener._by_peer
        by_peer[self.peer] -= 1
        if by_peer[self.peer] <= 0:
            del by_peer[self.peer]
        if self.evicted:
            self.listener._evicting -= 1
        if self.transport is not None:
            self.listener._by_transport.pop(id(self.transport), None)

    def arm(self, delay: float | None = None) -> None:
        """Close the connection unless a request head arrives in time."""
        if self._timer is not None or self._released or self.transport is None:
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(
            self.listener.header_timeout_s if delay is None else max(0.0, delay), self._timeout
        )

    def disarm(self) -> None:
        """Cancel the header timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timeout(self) -> None:
        self._timer = None
        if self.busy or self._released or self.transport is None:
            return
        self.listener.drop("header_timeout", f"no complete request within {self.listener.header_timeout_s:g} s")
        _abort(self.transport)

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        listener = self.listener
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            why = listener.peer_problem(ssl_object)
            if why is not None:
                listener.drop("client_certificate", why)
                _abort(transport)
                return
        listener._by_transport[id(transport)] = self
        # The handshake had its own bound; the request head gets what is left of the header timeout.
        self.arm(listener.header_timeout_s - (time.monotonic() - self.accepted_mono))
        assert listener.factory is not None  # start() sets it before the first accept
        self.inner = listener.factory()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        if not self.busy:
            self.arm()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self.inner is None:
            return None
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        inner = self.inner
        self._release()
        if inner is not None:
            inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()


def _peer(addr: Any) -> str:
    """The client's address (without the port) from ``accept()``."""
    return str(addr[0]) if isinstance(addr, tuple) and addr else str(addr)


def _abort(transport: asyncio.BaseTransport) -> None:
    try:
        if isinstance(transport, asyncio.WriteTransport):
            transport.abort()
        else:
            transport.close()
    except Exception:  # noqa: BLE001 - already closing
        pass
