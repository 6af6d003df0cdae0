"""Command line: ``nvgpu-exporter`` (serve), ``selfcheck``, ``quarantine``; ``--check-config``.

Exit codes: 0 ok, 1 unexpected error, 2 bad configuration (every problem listed, nothing
started), 3 strict self-check refused to start.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from exporter import __version__, protocol
from exporter.config import SETTINGS, Config, ConfigError

log = logging.getLogger("exporter")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nvgpu-exporter",
        description="Prometheus exporter for NVIDIA GPUs with a supervised NVML worker. Every flag has an "
        "NVGPU_* environment variable; flags win. Features: NVGPU_FEATURE_<NAME>=auto|on|off.",
    )
    p.add_argument("--version", action="version", version=f"nvgpu-exporter {__version__}")
    p.add_argument(
        "--check-config", action="store_true", help="print every configuration problem and exit 2, or exit 0"
    )
    for s in SETTINGS:
        p.add_argument(s.flag, dest=s.attr, default=None, metavar="VALUE", help=f"{s.help} [{s.env}]")
    sub = p.add_subparsers(dest="command")
    sc = sub.add_parser("selfcheck", help="check the modules the supervisor and a real worker import")
    sc.add_argument("--json", action="store_true", help="print JSON")
    sc.add_argument("--strict", action="store_true", help="exit 3 on any problem")
    q = sub.add_parser("quarantine", help="list or clear crash quarantines in the state file")
    g = q.add_mutually_exclusive_group()
    g.add_argument("--clear", metavar="FEATURE", help="clear one feature's quarantine")
    g.add_argument("--clear-all", action="store_true", help="clear every quarantine")
    return p


def _config(args: argparse.Namespace) -> Config:
    flags = {s.attr: getattr(args, s.attr) for s in SETTINGS if getattr(args, s.attr, None) is not None}
    return Config.from_env(os.environ, flags)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script and ``python -m exporter``."""
    args = _parser().parse_args(argv)
    if args.command == "selfcheck":
        from exporter import selfcheck

        return selfcheck.command(args.json, args.strict)
    try:
        config = _config(args)
    except ConfigError as exc:
        print(f"nvgpu-exporter: {len(exc.problems)} configuration problem(s):", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return protocol.EXIT_CONFIG
    if args.check_config:
        print("configuration ok:")
        for line in config.describe():
            print(f"  {line}")
        return protocol.EXIT_OK
    if args.command == "quarantine":
        return _quarantine(config, args)
    from exporter import logs

    logs.setup(config.log_level, config.log_format)
    try:
        return _run(serve(config))
    except KeyboardInterrupt:
        return protocol.EXIT_OK


def _run(main: Coroutine[Any, Any, int]) -> int:
    """Run on uvloop when it is installed (the ``fast`` extra): about twice the requests per second
    under 1000 concurrent scrapes (docs/performance.md); asyncio's own loop otherwise."""
    try:
        import uvloop
    except ImportError:
        use_uvloop = False
    else:
        use_uvloop = True
    if not use_uvloop:  # outside the except block: later tracebacks must not chain to this
        return asyncio.run(main)
    return int(uvloop.run(main))


def _quarantine(config: Config, args: argparse.Namespace) -> int:
    from exporter.quarantine import QuarantineStore
    from guards.features import FEATURES

    if args.clear and args.clear not in FEATURES:
        import difflib

        close = difflib.get_close_matches(args.clear, list(FEATURES), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        print(
            f"nvgpu-exporter quarantine --clear {args.clear!r}: not a feature{hint} (features: {', '.join(FEATURES)})",
            file=sys.stderr,
        )
        return protocol.EXIT_CONFIG
    store = QuarantineStore(
        config.state_file, config.quarantine_after, config.quarantine_window_s, config.quarantine_ttl_s
    )
    if store.load_error is not None:
        print(
            f"nvgpu-exporter: state file {config.state_file} is unreadable ({store.load_error}); "
            "not touching it — move it away to start afresh",
            file=sys.stderr,
        )
        return protocol.EXIT_ERROR
    if args.clear or args.clear_all:
        cleared = store.clear(None if args.clear_all else args.clear)
        print(
            f"cleared: {', '.join(cleared) or 'nothing'} "
            f"(state file {config.state_file or '(none)'}); restart the exporter"
        )
        return protocol.EXIT_OK
    details = store.details()
    if not details:
        print("no feature is quarantined")
    for feature, detail in details.items():
        print(f"{feature}: {detail}")
    return protocol.EXIT_OK


async def serve(config: Config) -> int:
    """Run the supervisor and the HTTP server until SIGTERM/SIGINT; returns the exit code."""
    from aiohttp import web

    from exporter.supervisor import Supervisor
    from exporter.web import SUPERVISOR_TASK, Renderer, make_app

    supervisor = Supervisor(config)
    state = supervisor.state
    why = supervisor.quarantine.writable()
    if why:
        log.warning(
            "state file %s cannot be written (%s): a quarantine will not survive a restart; mount an emptyDir there "
            "or set NVGPU_STATE_FILE",
            config.state_file,
            why,
        )
    sup_check = state.selfchecks["supervisor"]
    for problem in sup_check.problems:
        log.warning("self-check (supervisor): %s", problem)
    if sup_check.problems and config.selfcheck == "strict":
        log.error("NVGPU_SELFCHECK=strict: refusing to start:\n  %s", "\n  ".join(sup_check.problems))
        supervisor.close()
        return protocol.EXIT_SELFCHECK
    if config.selfcheck == "off":
        state.selfchecks.clear()
    renderer = Renderer(state)
    state.on_change = renderer.changed
    extras = [
        supervisor.contained(f"extension:{ext.feature or type(ext).__name__}", ext.run) for ext in state.extensions
    ]
    app = make_app(supervisor, renderer)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    host, port = config.listen_address
    site = web.TCPSite(runner, host or None, port, backlog=4096, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", host or "*", port, exc)
        for coro in extras:
            coro.close()
        await runner.cleanup()
        supervisor.close()
        return protocol.EXIT_ERROR
    log.info(
        "nvgpu-exporter %s listening on %s:%d (NVML backend %s, sample interval %g s, stale after %g s)",
        __version__,
        host or "*",
        port,
        config.nvml_backend,
        config.interval_s,
        config.stale_s,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.ensure_future(supervisor.run())
    app[SUPERVISOR_TASK] = task
    extra_tasks = [asyncio.ensure_future(t) for t in extras]
    stop_wait = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    log.info("stopping: draining the worker (at most %g s)", config.shutdown_timeout_s)
    await supervisor.stop()
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout=config.shutdown_timeout_s)
    except asyncio.TimeoutError:
        log.error("the worker did not stop within %g s; killing it", config.shutdown_timeout_s)
        await supervisor.kill_now()
    except Exception:  # noqa: BLE001 - report and exit non-zero below
        log.exception("supervisor loop failed")
    for t in extra_tasks:
        t.cancel()
    stop_wait.cancel()
    await runner.cleanup()
    supervisor.close()
    if supervisor.fatal_exit is not None:
        return supervisor.fatal_exit
    if task.done() and not task.cancelled() and task.exception() is not None:
        return protocol.EXIT_ERROR
    return protocol.EXIT_OK
