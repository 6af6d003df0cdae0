"""The composition root: the supervisor process built whole, in order, through constructors.

:func:`build` makes every part of a running exporter and hands each part what it needs when it is
constructed; nothing is wired afterwards by overwriting an attribute. The order is the order of
their dependencies:

1. the web config watcher (``--web.config.file``), the open-file limit and the connection cap;
2. the counter of the supervisor's own failures (:class:`~exporter.supervisor.served.ComponentErrors`), the
   :class:`~exporter.supervisor.quarantine.QuarantineStore` whose failed saves go to it, and the timeline
   beside it (:class:`~exporter.supervisor.timeline.Timeline`, its
   :class:`~exporter.supervisor.recovery.RecoveryTracker` and :class:`~exporter.supervisor.recorder.Recorder`);
3. the extensions the provisional feature states allow (:func:`extensions`), the HTTP edge's
   counters with the watcher among them (:class:`~exporter.supervisor.http.httpedge.HttpEdge`);
4. the :class:`~exporter.supervisor.served.ServedState` over the quarantine and the extensions, and the
   :class:`~exporter.supervisor.supervisor.Supervisor` over it (:func:`build_supervisor`);
5. the :class:`~exporter.supervisor.http.web.Renderer`, which follows the served state;
6. the :class:`~exporter.supervisor.http.listener.Listener`, the middleware's
   :class:`~exporter.supervisor.http.web.Edge` (which holds it), and the aiohttp side
   (:class:`~exporter.supervisor.http.web.HttpServer`), whose protocol factory the listener is given
   when it starts.

:func:`exporter.cli.serve` builds, then runs.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter import __version__
from exporter.config import Config
from exporter.supervisor.extensions import Extension
from exporter.supervisor.http.httpedge import HttpEdge, connection_cap, raise_open_file_limit
from exporter.supervisor.http.listener import Listener
from exporter.supervisor.http.web import Edge, HttpServer, Renderer
from exporter.supervisor.http.webauth import peer_problem
from exporter.supervisor.http.webtls import WebConfigWatcher
from exporter.supervisor.kernel_xid import KernelXid
from exporter.supervisor.pods import PodAttribution
from exporter.supervisor.quarantine import QuarantineStore, log_reloaded
from exporter.supervisor.recorder import Recorder, boot_id
from exporter.supervisor.recovery import RecoveryTracker
from exporter.supervisor.served import ComponentErrors, ServedState, provisional_states
from exporter.supervisor.stuck import StuckDetector
from exporter.supervisor.supervisor import Supervisor
from exporter.supervisor.timeline import Timeline
from exporter.supervisor.timelinefile import path_beside
from exporter.supervisor.workerproc import proc_state
from guards.features import FeatureState

__all__ = ["Exporter", "build", "build_supervisor", "extensions", "recorder"]


def extensions(config: Config, states: Mapping[str, FeatureState], http: HttpEdge) -> list[Extension]:
    """The extensions of a running exporter, in rendering order: the stuck signature and the HTTP
    edge's counters always, the kernel log and pod attribution when ``states`` (the provisional
    view: the worker's decision may later turn them off, never on) has their features on."""
    out: list[Extension] = [
        StuckDetector(
            config.stuck_utilization, config.stuck_memory_bytes, config.stuck_after_s, config.stuck_sm_activity
        )
    ]
    if states["kernel_xid"].enabled:
        out.append(KernelXid(config))
    if states["pod_attribution"].enabled:
        out.append(PodAttribution(config))
    out.append(http)
    return out


def recorder(config: Config, errors: ComponentErrors) -> Recorder:
    """The timeline beside the state file (memory only without one), its recovery watches, and its
    recorder, which records the exporter's start (a new boot id since the last record: a reboot)."""
    timeline = Timeline(path_beside(config.state_file), boot_id(), on_error=errors.count)
    made = Recorder(timeline, RecoveryTracker(timeline, config.recurrence_window_s))
    made.start(__version__)
    return made


def build_supervisor(
    config: Config, http: HttpEdge | None = None, proc_state_fn: Callable[[int], str | None] = proc_state
) -> Supervisor:
    """Steps 2 to 4: the quarantine store, the timeline, the extensions, the served state and the supervisor.

    Args:
        config: parsed configuration.
        http: the HTTP edge's counters (a new one, without a web config, when None).
        proc_state_fn: reads a process state letter (tests inject ``D``).
    """
    errors = ComponentErrors()
    quarantine = QuarantineStore(
        config.state_file,
        config.quarantine_after,
        config.quarantine_window_s,
        config.quarantine_ttl_s,
        on_error=errors.count,  # a failed save is counted as component "state"
    )
    log_reloaded(quarantine)
    provisional = provisional_states(config.feature_modes, quarantine.details())
    chosen = extensions(config, provisional, http or HttpEdge())
    state = ServedState(config, quarantine, chosen, errors, recorder(config, errors))
    return Supervisor(config, state, proc_state_fn)


@dataclass(frozen=True)
class Exporter:
    """A built exporter, ready to run.

    Attributes:
        supervisor: the worker's supervisor (its ``state`` is what is served).
        renderer: the coalescing renderer of ``/metrics``.
        listener: the listening sockets and connection guard (started by the caller).
        server: the aiohttp application and runner (set up by the caller).
        watcher: the web config watcher, None without a web config file.
        cap: the connection cap in force (``NVGPU_WEB_MAX_CONNECTIONS`` lowered to the open-file limit).
        soft_limit: the soft open-file limit after raising it.
    """

    supervisor: Supervisor
    renderer: Renderer
    listener: Listener
    server: HttpServer
    watcher: WebConfigWatcher | None
    cap: int
    soft_limit: int


def _tls_context(watcher: WebConfigWatcher | None) -> Callable[[], ssl.SSLContext | None]:
    """The TLS context for a new connection: the web config's current one (reloaded when it changed)."""
    return lambda: watcher.refresh().context if watcher is not None else None


def _peer_refusal(watcher: WebConfigWatcher | None) -> Callable[[Any], str | None]:
    """Why a finished handshake's client certificate is refused (``client_allowed_sans``), or None."""

    def refused(ssl_object: Any) -> str | None:
        if watcher is None or watcher.current.tls is None or ssl_object is None:
            return None
        return peer_problem(watcher.current.tls, ssl_object.getpeercert())

    return refused


def build(config: Config) -> Exporter:
    """Every part of the supervisor process, in the order of the module docstring.

    Raises:
        WebConfigError: the web config file no longer loads (it loaded while the settings were
            parsed; it changed since).
    """
    watcher = None
    if config.web_config_file:
        watcher = WebConfigWatcher(config.web_config_file, require_client_cert=not config.web_probes_without_auth)
    soft_limit, _hard = raise_open_file_limit()
    cap = connection_cap(config.web_max_connections, soft_limit)
    http = HttpEdge(watcher)
    supervisor = build_supervisor(config, http)
    renderer = Renderer(supervisor.state)
    listener = Listener(http, cap, config.web_header_timeout_s, _tls_context(watcher), _peer_refusal(watcher))
    edge = Edge(stats=http, listener=listener, watcher=watcher, probes_without_auth=config.web_probes_without_auth)
    server = HttpServer(supervisor, renderer, edge, config.telemetry_path, config.web_keepalive_s)
    return Exporter(supervisor, renderer, listener, server, watcher, cap, soft_limit)
