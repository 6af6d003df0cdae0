"""HTTP side (aiohttp): ``/metrics``, ``/healthz``, ``/readyz``, the status page ``/``, the verdicts
``/api/v1/verdicts`` (versioned JSON, docs/verdicts.md), the timeline ``/api/v1/timeline`` and the
incident records ``/api/v1/incidents/<gpu|node>`` (JSON, or Markdown with ``?format=markdown``;
docs/incidents.md).

Nothing here waits on NVML. ``/metrics`` (``--web.telemetry-path``) returns bytes rendered once
per change of state, and at least every :data:`REFRESH_S` on request (the ``process_*`` series
move on their own); ``/healthz`` says the supervisor is alive (never fails because NVML or a GPU
is in trouble: restarting the container does not cure those and a crash loop hides them);
``/readyz`` says a snapshot younger than the stale bound exists ("serving fresh GPU data").
Other paths answer 404, methods other than GET and HEAD 405 (aiohttp's router does both).

With a web config file (:mod:`exporter.supervisor.http.webconfig`) the :func:`edge_middleware` refuses, in this
order, requests over the rate limit (429), requests without a verified client certificate when
``client_auth_type`` is ``RequireAndVerifyClientCert`` (403) and requests without valid basic-auth
credentials (401; 429 while the client's wrong passwords are over their limit, which never delays
credentials verified before); ``/healthz`` and ``/readyz`` are exempt unless ``NVGPU_WEB_PROBES_WITHOUT_AUTH``
is false, so the kubelet can probe them. Every response names the server ``nvgpu-exporter``,
without versions, and carries the configured security headers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import aiohttp.web_response
from aiohttp import web

from exporter.settingvalues import PROBE_PATHS
from exporter.supervisor import exposition, statuspage
from exporter.supervisor.http.httpedge import HttpEdge
from exporter.supervisor.http.listener import Listener
from exporter.supervisor.http.webauth import BasicAuth, FailedLogins, RateLimiter
from exporter.supervisor.http.webtls import WebConfigWatcher
from exporter.supervisor.served import ServedState
from exporter.supervisor.supervisor import Supervisor

log = logging.getLogger(__name__)

SERVER_NAME = "nvgpu-exporter"
# aiohttp's default Server header names the Python and aiohttp versions (a gift to a scanner); responses
# aiohttp makes itself (400 for a request line it cannot parse) take this module default.
aiohttp.web_response.SERVER_SOFTWARE = SERVER_NAME  # type: ignore[attr-defined]
REFRESH_S = 5.0  # a rendering older than this is redone on request (process_* series age)
# At shutdown, requests in progress get this long to finish (aiohttp's default is 60 s); a request
# waiting for a bcrypt is not waited for longer, so SIGTERM is honoured within the shutdown timeout.
HTTP_SHUTDOWN_S = 1.0

SUPERVISOR: web.AppKey[Supervisor] = web.AppKey("supervisor", Supervisor)
RENDERER: web.AppKey[Renderer] = web.AppKey("renderer")
EDGE: web.AppKey[Edge] = web.AppKey("edge")


@dataclass
class Edge:
    """What the middleware needs from the HTTP edge.

    Attributes:
        stats: the counters (:class:`exporter.supervisor.http.httpedge.HttpEdge`).
        listener: the listening side, to pause its header timer while a request is served.
        watcher: the web config, None without a web config file.
        probes_without_auth: ``/healthz`` and ``/readyz`` skip auth, client certificates and rate limit.
    """

    stats: HttpEdge = field(default_factory=HttpEdge)
    listener: Listener | None = None
    watcher: WebConfigWatcher | None = None
    probes_without_auth: bool = True
    auth: BasicAuth = field(default_factory=BasicAuth)
    limiter: RateLimiter = field(default_factory=RateLimiter)
    logins: FailedLogins = field(default_factory=FailedLogins)


class Renderer:
    """Holds the current rendering; re-renders (coalesced) when the served state changes, which it
    follows from construction on (:meth:`ServedState.subscribe`)."""

    def __init__(self, state: ServedState) -> None:
        self.state = state
        self.cache = exposition.RenderCache()
        self.current = exposition.render(state, self.cache)
        self.rendered_mono = time.monotonic()
        self._pending = False
        self.renders = 0
        state.subscribe(self.changed)

    def fresh(self) -> exposition.Rendered:
        """The current rendering, redone first when it is older than :data:`REFRESH_S`."""
        if time.monotonic() - self.rendered_mono > REFRESH_S:
            self._render()
        return self.current

    def changed(self) -> None:
        """Schedule one render on the loop, however many changes arrive before it runs."""
        if self._pending:
            return
        self._pending = True
        try:
            asyncio.get_running_loop().call_soon(self._render)
        except RuntimeError:  # no loop (tests calling directly)
            self._render()

    def _render(self) -> None:
        self._pending = False
        self.rendered_mono = time.monotonic()  # a failing render is not retried on every request
        try:
            self.current = exposition.render(self.state, self.cache)
            self.renders += 1
            self.state.render_failed = None
        except Exception as exc:  # the previous rendering stays; /readyz says so until one works
            self.state.render_failed = f"{type(exc).__name__}: {exc}"
            self.state.count_error("render", "rendering the exposition")


def accepts_gzip(header: str) -> bool:
    """True when Accept-Encoding lists gzip with q > 0 (RFC 9110 §12.5.3; ``gzip;q=0`` refuses it)."""
    for part in header.lower().split(","):
        coding, *params = (p.strip() for p in part.split(";"))
        if coding not in ("gzip", "x-gzip"):
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        return q > 0
    return False


async def metrics(request: web.Request) -> web.Response:
    rendered = request.app[RENDERER].fresh()
    openmetrics = exposition.negotiate(request.headers.get("Accept"))
    gz = accepts_gzip(request.headers.get("Accept-Encoding", ""))
    body = rendered.body(openmetrics, gz)
    headers = {
        "Content-Type": exposition.OPENMETRICS_CONTENT_TYPE if openmetrics else exposition.TEXT_CONTENT_TYPE,
        "Vary": "Accept, Accept-Encoding",
    }
    if gz:
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=body, headers=headers)


async def healthz(request: web.Request) -> web.Response:
    died = request.app[SUPERVISOR].loop_error
    if died is not None:
        return web.Response(status=500, text=f"supervisor loop died: {died!r}\n")
    ok, why = request.app[SUPERVISOR].state.liveness()
    return web.Response(status=200 if ok else 503, text=f"{why}\n")


async def readyz(request: web.Request) -> web.Response:
    ok, why = request.app[SUPERVISOR].state.ready()
    return web.Response(status=200 if ok else 503, text=f"{why}\n")


async def verdicts_json(request: web.Request) -> web.Response:
    """Every GPU's verdict with its evidence (:func:`exporter.supervisor.verdictdoc.document`)."""
    from exporter.supervisor import verdictdoc

    state = request.app[SUPERVISOR].state
    return web.json_response(verdictdoc.document(state.verdicts, state), dumps=_dumps)


async def timeline_json(request: web.Request) -> web.Response:
    """The timeline, filtered by GPU, time and kind (:mod:`exporter.supervisor.timelinedoc`)."""
    from exporter.supervisor import timelinedoc

    timeline = request.app[SUPERVISOR].state.recorder.timeline
    try:
        doc = timelinedoc.document(timeline, timelinedoc.parse_query(dict(request.query)))
    except timelinedoc.QueryError as exc:
        return web.Response(status=400, text=f"{exc}\n")
    except KeyError:
        return web.Response(status=404, text=f"no GPU {request.query.get('gpu')!r} on the timeline\n")
    return web.json_response(doc, dumps=_dumps)


async def incident(request: web.Request) -> web.Response:
    """One GPU's (UUID, index or PCI bus id) or the node's incident record (:mod:`exporter.supervisor.incident`)."""
    from exporter.supervisor import incident as records
    from exporter.supervisor.incidentmd import markdown

    state = request.app[SUPERVISOR].state
    target = request.match_info["target"]
    form = request.query.get("format", "json")
    if form not in ("json", "markdown"):
        return web.Response(status=400, text=f"format={form!r}: expected json or markdown\n")
    recorder = state.recorder
    try:
        rec = records.record(
            records.now_of(state), recorder.timeline, recorder.recovery, target, state.config.recurrence_window_s
        )
    except KeyError:
        return web.Response(status=404, text=f"no GPU {target!r}: give a UUID, an index, a PCI bus id or node\n")
    if form == "markdown":
        return web.Response(text=markdown(rec), content_type="text/markdown", charset="utf-8")
    return web.json_response(rec, dumps=_dumps)


def _dumps(obj: object) -> str:
    import json

    return json.dumps(obj, indent=1, sort_keys=True) + "\n"


async def index(request: web.Request) -> web.Response:
    html = statuspage.render(request.app[SUPERVISOR].state)
    return web.Response(text=html, content_type="text/html", charset="utf-8")


VERDICTS_PATH = "/api/v1/verdicts"
TIMELINE_PATH = "/api/v1/timeline"
INCIDENTS_PATH = "/api/v1/incidents"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Rate limit, client certificate and basic auth from the web config (see the module docstring)."""
    edge = request.app[EDGE]
    transport = request.transport
    if edge.listener is not None:
        edge.listener.request_started(transport)
    try:
        watcher = edge.watcher
        if watcher is not None and not (edge.probes_without_auth and request.path in PROBE_PATHS):
            cfg = watcher.refresh()
            if cfg.rate_interval_s and not edge.limiter.allow(cfg.rate_interval_s, cfg.rate_burst):
                edge.stats.denied["rate_limit"] += 1
                return web.Response(status=429, text="too many requests\n", headers={"Retry-After": "1"})
            if cfg.tls is not None and cfg.tls.requires_client_cert:
                peercert = transport.get_extra_info("peercert") if transport is not None else None
                if not peercert:
                    edge.stats.denied["client_certificate"] += 1
                    return web.Response(status=403, text="a verified client certificate is required\n")
            if cfg.users:
                refused = await _basic_auth(edge, cfg.users, request)
                if refused is not None:
                    return refused
        return await handler(request)
    finally:
        if edge.listener is not None:
            edge.listener.request_finished(transport)


async def _basic_auth(edge: Edge, users: Mapping[str, bytes], request: web.Request) -> web.Response | None:
    """None when the request's credentials are good; else the refusal: 401, or 429 when this
    client's wrong passwords are over :class:`~exporter.supervisor.http.webauth.FailedLogins`'s
    limit (credentials verified before are let through at once, whatever the limit says)."""
    header = request.headers.get("Authorization")
    known = edge.auth.cached(users, header)
    if known is True:
        return None
    client = request.remote or ""
    if known is None:  # a bcrypt would run
        wait = edge.logins.retry_after(client)
        if wait > 0:
            edge.stats.denied["failed_logins"] += 1
            return web.Response(
                status=429, text="too many wrong passwords\n", headers={"Retry-After": str(math.ceil(wait))}
            )
        if await edge.auth.check(users, header) is not None:
            return None
        edge.logins.failed(client)
    edge.stats.denied["unauthorized"] += 1
    return web.Response(
        status=401,
        text="401 Unauthorized\n",
        headers={"WWW-Authenticate": 'Basic realm="nvgpu-exporter", charset="UTF-8"'},
    )


async def _response_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = SERVER_NAME
    edge = request.app.get(EDGE)
    if edge is not None and edge.watcher is not None:
        for name, value in edge.watcher.current.headers.items():
            response.headers[name] = value


def make_app(
    supervisor: Supervisor, renderer: Renderer, telemetry_path: str = "/metrics", edge: Edge | None = None
) -> web.Application:
    """The aiohttp application; the caller owns the supervisor's lifecycle.

    Args:
        supervisor: the supervisor whose state is served.
        renderer: the coalescing renderer.
        telemetry_path: where the exposition is served.
        edge: the HTTP edge (web config, connection guard); None: no auth, no guard.
    """
    app = web.Application(middlewares=[edge_middleware])
    app[SUPERVISOR] = supervisor
    app[RENDERER] = renderer
    app[EDGE] = edge or Edge()
    app.on_response_prepare.append(_response_headers)
    app.router.add_get(telemetry_path, metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", index)
    app.router.add_get(VERDICTS_PATH, verdicts_json)
    app.router.add_get(TIMELINE_PATH, timeline_json)
    app.router.add_get(INCIDENTS_PATH + "/{target}", incident)
    return app


class HttpServer:
    """The aiohttp application and its runner: the part of the HTTP side that is aiohttp's.

    Args:
        supervisor: the supervisor whose state is served.
        renderer: the coalescing renderer.
        edge: the HTTP edge (web config, connection guard).
        telemetry_path: where the exposition is served.
        keepalive_s: idle keep-alive connections are closed after this (aiohttp's ``keepalive_timeout``).
    """

    def __init__(
        self, supervisor: Supervisor, renderer: Renderer, edge: Edge, telemetry_path: str, keepalive_s: float
    ) -> None:
        self.app = make_app(supervisor, renderer, telemetry_path, edge)
        self.runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=keepalive_s,
            shutdown_timeout=HTTP_SHUTDOWN_S,
        )

    async def setup(self) -> Callable[[], asyncio.Protocol]:
        """Prepare the runner; returns the protocol factory a :class:`~exporter.supervisor.http.listener.Listener`
        hands its connections to."""
        await self.runner.setup()
        assert self.runner.server is not None
        return self.runner.server

    async def cleanup(self) -> None:
        """Close what the runner holds (connections included)."""
        await self.runner.cleanup()
