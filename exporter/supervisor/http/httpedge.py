"""The HTTP edge's counters and limits: how many connections the supervisor may hold, and what
became of the ones it closed or refused.

:class:`HttpEdge` is an extension that is always attached: it renders the open connections, the cap
in force, the connections closed (:data:`DROP_REASONS`) and the requests refused by the web config
(:data:`DENY_REASONS`), and watches the web config's files so a reload shows without a request.
:func:`connection_cap` lowers ``NVGPU_WEB_MAX_CONNECTIONS`` to the open-file limit minus
:data:`FD_HEADROOM`, and :func:`reserve` is the part of the cap kept free for new connections; the
accept loop that enforces both is :class:`exporter.supervisor.http.listener.Listener`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import resource
from collections.abc import Iterable
from typing import TYPE_CHECKING

from exporter.common.metric import MetricDef, single
from exporter.supervisor.extensions import Extension, Host

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric
    from exporter.supervisor.http.webtls import WebConfigWatcher

log = logging.getLogger(__name__)

# Descriptors kept free for everything that is not an HTTP connection: the worker's message pipe,
# stdin and stderr pipes (6 while spawning), the breadcrumb memory, the listening socket, the state
# file and its temporary file, the kernel log and its cursor, the kubelet's gRPC socket, /proc
# reads, Python's own (stdio, the event loop's selector and self-pipe) and a margin.
FD_HEADROOM = 64
MIN_CONNECTIONS = 8
WATCH_POLL_S = 0.25  # how often the web config watcher's finished looks at its files are taken
RESERVE_SHARE = 8  # an eighth of the cap is kept free for new connections
MIN_RESERVE = 2
DROP_REASONS = ("limit", "header_timeout", "tls_handshake", "client_certificate", "evicted")
DENY_REASONS = ("unauthorized", "client_certificate", "rate_limit", "failed_logins")


def _m(name: str, help: str, labels: tuple[str, ...] = ()) -> MetricDef:
    return MetricDef(name, help, labels, per_gpu=False)


HTTP_CONNECTIONS = _m("nvgpu_http_connections", "Open HTTP connections, TLS handshakes in progress included")
HTTP_CONNECTIONS_MAX = _m(
    "nvgpu_http_connections_max",
    "Open HTTP connections allowed (NVGPU_WEB_MAX_CONNECTIONS, lowered to the open-file limit minus the "
    "descriptors kept for the worker)",
)
HTTP_DROPPED = _m(
    "nvgpu_http_connections_dropped_total",
    "Connections closed by the exporter: limit (over the cap), header_timeout (no complete request head or "
    "TLS handshake in time), tls_handshake (failed handshake), client_certificate (SAN not allowed), evicted "
    "(closed to make room near the cap: the idle connection of the client holding the most, or idle longest)",
    ("reason",),
)
HTTP_DENIED = _m(
    "nvgpu_http_requests_denied_total",
    "Requests refused by the web config: unauthorized (401, basic auth), client_certificate (403, no verified "
    "client certificate), rate_limit (429), failed_logins (429: this client's wrong passwords are rate-limited)",
    ("reason",),
)
WEB_CONFIG_RELOAD_OK = _m(
    "nvgpu_web_config_last_reload_successful",
    "1 if the web config file (and the certificates it names) loaded at the last change; 0: the previous "
    "configuration is still in use",
)
WEB_CONFIG_RELOAD_TIME = _m(
    "nvgpu_web_config_last_reload_success_timestamp_seconds", "Unix time the web config was last loaded"
)
METRICS = (
    HTTP_CONNECTIONS,
    HTTP_CONNECTIONS_MAX,
    HTTP_DROPPED,
    HTTP_DENIED,
    WEB_CONFIG_RELOAD_OK,
    WEB_CONFIG_RELOAD_TIME,
)


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (Go does this at start since 1.19).

    Returns:
        (soft, hard) after the attempt.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # not fatal: the cap below follows the soft limit
            log.info("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return soft, hard


def reserve(cap: int) -> int:
    """Slots of ``cap`` kept free for new connections (idle ones are closed to keep them free)."""
    return max(MIN_RESERVE, cap // RESERVE_SHARE) if cap > MIN_RESERVE else 0


def connection_cap(configured: int, soft_limit: int) -> int:
    """``configured``, lowered so that :data:`FD_HEADROOM` descriptors stay free, at least
    :data:`MIN_CONNECTIONS`."""
    if soft_limit == resource.RLIM_INFINITY or soft_limit < 0:
        return configured
    return max(MIN_CONNECTIONS, min(configured, soft_limit - FD_HEADROOM))


class HttpEdge(Extension):
    """The edge's counters, rendered as self-metrics (an extension that is always attached).

    Attributes:
        open: connections holding a descriptor that the guard knows of.
        max_connections: the cap in force (0 until the server starts).
        dropped: reason -> connections closed by the guard.
        denied: reason -> requests refused by the web config.
        watcher: the web config watcher (its reload state is rendered), None without a web config file.
    """

    def __init__(self, watcher: WebConfigWatcher | None = None) -> None:
        self.open = 0
        self.max_connections = 0
        self.dropped: collections.Counter[str] = collections.Counter()
        self.denied: collections.Counter[str] = collections.Counter()
        self.watcher = watcher

    def self_families(self) -> Iterable[Metric]:
        dropped, denied = HTTP_DROPPED.family(), HTTP_DENIED.family()
        for reason in DROP_REASONS:
            dropped.add_labels([reason], self.dropped[reason])
        for reason in DENY_REASONS:
            denied.add_labels([reason], self.denied[reason])
        out = [
            single(HTTP_CONNECTIONS, self.open),
            single(HTTP_CONNECTIONS_MAX, self.max_connections or None),
            dropped.always(),
            denied.always(),
        ]
        w = self.watcher
        out.append(single(WEB_CONFIG_RELOAD_OK, None if w is None else int(w.last_reload_ok)))
        out.append(single(WEB_CONFIG_RELOAD_TIME, None if w is None else w.last_reload_time))
        return out

    async def run(self, host: Host) -> None:
        """Look at the web config's files even when no request comes (they are read on a thread of
        their own: :class:`~exporter.supervisor.http.webtls.WebConfigWatcher`), so a rotation, or a
        change that does not load, shows in ``nvgpu_web_config_last_reload_successful``."""
        watcher = self.watcher
        if watcher is None:
            return
        while True:
            before = (watcher.last_reload_ok, watcher.reloads)
            watcher.refresh()
            if (watcher.last_reload_ok, watcher.reloads) != before:
                host.changed()
            await asyncio.sleep(WATCH_POLL_S)
