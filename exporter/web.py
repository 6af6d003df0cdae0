"""HTTP side (aiohttp): ``/metrics``, ``/healthz``, ``/readyz`` and the status page ``/``.

Nothing here waits on NVML. ``/metrics`` returns bytes rendered once per change of state;
``/healthz`` says the supervisor is alive (never fails because NVML or a GPU is in trouble:
restarting the container does not cure those and a crash loop hides them); ``/readyz`` says a
snapshot younger than the stale bound exists ("serving fresh GPU data"). Other paths answer 404,
methods other than GET and HEAD 405 (aiohttp's router does both).
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from exporter import exposition, statuspage
from exporter.served import ServedState
from exporter.supervisor import Supervisor

log = logging.getLogger(__name__)

SUPERVISOR: web.AppKey[Supervisor] = web.AppKey("supervisor", Supervisor)
RENDERER: web.AppKey[Renderer] = web.AppKey("renderer")
SUPERVISOR_TASK: web.AppKey[asyncio.Task[None]] = web.AppKey("supervisor_task")


class Renderer:
    """Holds the current rendering; re-renders (coalesced) when the served state changes."""

    def __init__(self, state: ServedState) -> None:
        self.state = state
        self.current = exposition.render(state)
        self._pending = False
        self.renders = 0

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
        try:
            self.current = exposition.render(self.state)
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
    rendered = request.app[RENDERER].current
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
    task = request.app.get(SUPERVISOR_TASK)
    if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
        return web.Response(status=500, text=f"supervisor loop died: {task.exception()!r}\n")
    ok, why = request.app[SUPERVISOR].state.liveness()
    return web.Response(status=200 if ok else 503, text=f"{why}\n")


async def readyz(request: web.Request) -> web.Response:
    ok, why = request.app[SUPERVISOR].state.ready()
    return web.Response(status=200 if ok else 503, text=f"{why}\n")


async def index(request: web.Request) -> web.Response:
    html = statuspage.render(request.app[SUPERVISOR].state)
    return web.Response(text=html, content_type="text/html", charset="utf-8")


def make_app(supervisor: Supervisor, renderer: Renderer) -> web.Application:
    """The aiohttp application; the caller owns the supervisor's lifecycle."""
    app = web.Application()
    app[SUPERVISOR] = supervisor
    app[RENDERER] = renderer
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", index)
    return app
