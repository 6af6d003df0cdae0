"""Command line: ``nvgpu-exporter`` (serve), ``selfcheck``, ``quarantine``, ``hash-password``, ``npd-check``,
``diagnose``; ``--check-config``.

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
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from exporter import __version__
from exporter.checks import environment_problems, state_file_problem
from exporter.common import protocol
from exporter.config import Config
from exporter.settings import SETTINGS
from exporter.settingvalues import DEFAULT_PORT, ConfigError, Setting

if TYPE_CHECKING:  # imported where used: the CLI's subcommands must not pay for aiohttp
    from exporter.app import Exporter
    from exporter.supervisor.http.listener import Listener
    from exporter.supervisor.http.webtls import WebConfigWatcher
    from exporter.supervisor.supervisor import Supervisor

log = logging.getLogger("exporter")


class _Flag(argparse.Action):
    """Stores the value and the spelling used (``--listen-address`` or ``--web.listen-address``);
    a repeated ``--web.listen-address`` keeps every address (comma-joined), later flags win elsewhere."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if self.dest == "listen_addresses" and getattr(namespace, self.dest, None) is not None:
            values = f"{getattr(namespace, self.dest)},{values}"  # repeated: listen on each (exporter-toolkit)
        setattr(namespace, self.dest, values)
        names = dict(getattr(namespace, "_flag_names", {}))
        names[self.dest] = option_string or self.option_strings[0]
        namespace._flag_names = names


class _Version(argparse.Action):
    """``--version``: :func:`exporter.buildinfo.version_text`, read only when asked."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        from exporter.buildinfo import version_text

        print(version_text())
        parser.exit()


def _metavar(s: Setting) -> str:
    if s.attr.endswith("_s"):
        return "DURATION"
    if s.attr == "listen_addresses":
        return "HOST:PORT"
    if s.default in ("true", "false"):
        return "BOOL"
    if s.default.isdigit():
        return "N"
    if s.attr.endswith("_file") or s.attr.endswith("_path") or s.attr.endswith("_socket"):
        return "PATH"
    return "VALUE"


def _help(s: Setting) -> str:
    if "(default:" in s.help:
        default = ""  # derived from other settings; the text says how
    elif s.default == "":
        default = "default: none; "
    else:
        default = f"default: {s.default}; "
    return f"{s.help} [{default}env {s.env}]".replace("%", "%%")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nvgpu-exporter",
        description="Prometheus exporter for NVIDIA GPUs with a supervised NVML worker. Every flag has an "
        "NVGPU_* environment variable (shown with its default); flags win. Features: "
        "NVGPU_FEATURE_<NAME>=auto|on|off. Exit codes: 0 ok, 1 error, 2 bad configuration, 3 strict self-check.",
        epilog="Without a GPU, try the demo: nvgpu-exporter --nvml-backend fake:h200x2",
    )
    p.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="print version, branch, revision, build date, Python and platform (as the Prometheus exporters do)",
    )
    p.add_argument(
        "--check-config",
        action="store_true",
        help="check the configuration and this machine (listen address, state file, web config file); "
        "print every problem and exit 2, or print the effective settings and exit 0",
    )
    for s in SETTINGS:
        p.add_argument(s.flag, *s.aliases, dest=s.attr, default=None, metavar=_metavar(s), action=_Flag, help=_help(s))
    sub = p.add_subparsers(dest="command")
    sc = sub.add_parser("selfcheck", help="check the modules the supervisor and a real worker import")
    sc.add_argument("--json", action="store_true", help="print JSON")
    sc.add_argument("--strict", action="store_true", help="exit 3 on any problem")
    hp = sub.add_parser(
        "hash-password",
        help="print a bcrypt hash for basic_auth_users in the web config file (reads the password from the "
        "terminal, or one line of standard input)",
    )
    from exporter.supervisor.http.webmodel import BCRYPT_MAX_COST, BCRYPT_MIN_COST

    hp.add_argument(
        "--cost",
        type=int,
        default=10,
        choices=range(BCRYPT_MIN_COST, BCRYPT_MAX_COST + 1),
        metavar=f"{BCRYPT_MIN_COST}-{BCRYPT_MAX_COST}",
        help="bcrypt cost [10]; the web config accepts no more (each wrong password costs a core for 2^cost rounds)",
    )
    npd = sub.add_parser(
        "npd-check",
        help="node-problem-detector custom plugin: ask the local exporter's /api/v1/verdicts; exit 0 ok, 1 a GPU "
        "needs action, 2 unknown (not reachable, or the exporter's own pod is wrong)",
    )
    npd.add_argument("--url", default=None, help="the verdicts URL [http://127.0.0.1:<listen port>/api/v1/verdicts]")
    npd.add_argument("--timeout", type=float, default=3.0, metavar="SECONDS", help="HTTP timeout [3]")
    npd.add_argument(
        "--min-verdict",
        default="stop_scheduling",
        choices=("watch", "stop_scheduling", "reset_gpu", "reboot_node"),
        help="the least verdict that is a problem [stop_scheduling]",
    )
    npd.add_argument("--max-output", type=int, default=80, help="cut the message to this length (NPD's) [80]")
    dg = sub.add_parser(
        "diagnose",
        help="write one archive (tar.gz) with the incident records, the timeline, the exporter's state and logs and "
        "the output of the runbook's read-only commands, each bounded in time; changes nothing",
    )
    dg.add_argument("--url", default=None, help="the exporter [http://127.0.0.1:<listen port>]")
    dg.add_argument("--output", default="", metavar="PATH", help="the archive [./nvgpu-diagnose-<node>-<time>.tar.gz]")
    dg.add_argument("--offline", action="store_true", help="do not ask the exporter: build the records from its files")
    dg.add_argument(
        "--state-file",
        dest="diagnose_state_file",
        metavar="PATH",
        default=None,
        help="the exporter's state file; its timeline lies beside it [env NVGPU_STATE_FILE]",
    )
    dg.add_argument(
        "--log-file",
        dest="log_files",
        action="append",
        default=[],
        metavar="PATH",
        help="a log file to include (repeatable)",
    )
    dg.add_argument("--budget", type=float, default=90.0, metavar="SECONDS", help="total time for everything [90]")
    dg.add_argument("--command-timeout", type=float, default=20.0, metavar="SECONDS", help="time for each command [20]")
    q = sub.add_parser("quarantine", help="list or clear crash quarantines in the state file")
    q.add_argument(
        "--state-file",
        dest="quarantine_state_file",
        metavar="PATH",
        default=None,
        help="the state file to read or change [default: /var/lib/nvgpu-exporter/state.json; env NVGPU_STATE_FILE]",
    )
    g = q.add_mutually_exclusive_group()
    g.add_argument("--clear", metavar="FEATURE", help="clear one feature's quarantine")
    g.add_argument("--clear-all", action="store_true", help="clear every quarantine")
    return p


def _config(args: argparse.Namespace) -> Config:
    flags = {s.attr: getattr(args, s.attr) for s in SETTINGS if getattr(args, s.attr, None) is not None}
    names = dict(getattr(args, "_flag_names", {}))
    if getattr(args, "quarantine_state_file", None) is not None:  # `quarantine --state-file F`
        flags["state_file"] = args.quarantine_state_file
        names["state_file"] = "--state-file"
    return Config.from_env(os.environ, flags, names)


def _print_problems(problems: list[str]) -> None:
    print(f"nvgpu-exporter: {len(problems)} configuration problem(s):", file=sys.stderr)
    for problem in problems:
        print(f"  - {problem}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script and ``python -m exporter``."""
    try:
        return _main(argv)
    except BrokenPipeError:  # `nvgpu-exporter --check-config | head`: the reader left, nothing to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return protocol.EXIT_OK


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "selfcheck":
        from exporter.common import selfcheck

        try:
            backend = _config(args).nvml_backend
        except ConfigError:
            backend = "nvml"  # the module check still runs; --check-config says what is wrong
        return selfcheck.command(args.json, args.strict, backend)
    if args.command == "hash-password":
        return _hash_password(args.cost)
    if args.command == "npd-check":
        return _npd_check(args)
    if args.command == "diagnose":
        return _diagnose(args)
    try:
        config = _config(args)
    except ConfigError as exc:
        _print_problems(exc.problems)
        return protocol.EXIT_CONFIG
    if args.check_config:
        problems = environment_problems(config)
        if problems:
            _print_problems(problems)
            return protocol.EXIT_CONFIG
        print("configuration ok:")
        for line in config.describe():
            print(f"  {line}")
        return protocol.EXIT_OK
    if args.command == "quarantine":
        return _quarantine(config, args)
    from exporter.common import logs

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


def _hash_password(cost: int) -> int:
    import getpass

    from exporter.supervisor.http.webauth import hash_password

    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            print("nvgpu-exporter hash-password: the two passwords differ", file=sys.stderr)
            return protocol.EXIT_CONFIG
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    try:
        print(hash_password(password, cost))
    except ValueError as exc:
        print(f"nvgpu-exporter hash-password: {exc}", file=sys.stderr)
        return protocol.EXIT_CONFIG
    return protocol.EXIT_OK


def _npd_check(args: argparse.Namespace) -> int:
    from exporter import npdcheck

    url = args.url
    if url is None:
        try:
            port = _config(args).listen_address[1]
        except ConfigError:
            port = DEFAULT_PORT
        url = f"http://127.0.0.1:{port}/api/v1/verdicts"
    return npdcheck.run(url, args.timeout, args.min_verdict, args.max_output)


def _diagnose(args: argparse.Namespace) -> int:
    """``diagnose``: the settings come from the environment as for serving; a bad one is said, not fatal
    (the archive is wanted most when something is wrong)."""
    from exporter import diagnose

    if args.budget <= 0 or args.command_timeout <= 0:
        print("nvgpu-exporter diagnose: --budget and --command-timeout must be positive", file=sys.stderr)
        return protocol.EXIT_CONFIG
    try:
        config = _config(args)
        settings = config.describe()
    except ConfigError as exc:
        default = next(s.default for s in SETTINGS if s.attr == "state_file")
        config, settings = Config(state_file=default), [f"# configuration problem: {p}" for p in exc.problems]
    state_file = args.diagnose_state_file if args.diagnose_state_file is not None else config.state_file
    url = args.url or f"http://127.0.0.1:{config.listen_address[1]}"
    opts = diagnose.Options(
        url,
        args.output,
        state_file,
        list(args.log_files),
        args.offline,
        args.budget,
        args.command_timeout,
        config.node_name,
        settings,
        config.recurrence_window_s,
    )
    try:
        path, manifest = diagnose.diagnose(opts)
    except OSError as exc:
        print(f"nvgpu-exporter diagnose: cannot write the archive: {exc}", file=sys.stderr)
        return protocol.EXIT_ERROR
    missing = manifest["not_collected"]
    print(f"{path}: {len(manifest['items']) - len(missing)} items collected, {len(missing)} not (see MANIFEST.md)")
    for line in missing:
        print(f"  - {line}")
    return protocol.EXIT_OK


def _quarantine(config: Config, args: argparse.Namespace) -> int:
    from exporter.supervisor.quarantine import QuarantineStore
    from guards.featuretable import FEATURES

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
        state = f"state file {config.state_file or '(none)'}"
        if cleared:
            print(f"cleared: {', '.join(cleared)} ({state}); restart the exporter")
        else:
            print(f"cleared: nothing, {args.clear or 'no feature'} was not quarantined ({state})")
        return protocol.EXIT_OK
    details = store.details()
    where = f"state file {config.state_file}" if config.state_file else "no state file (NVGPU_STATE_FILE is empty)"
    if config.state_file and not os.path.exists(config.state_file):
        where += " (not there yet: the exporter writes it at the first quarantine; is this the path it uses?)"
    if not details:
        print(f"{where}: no feature is quarantined")
    else:
        print(f"{where}:")
    for feature, detail in details.items():
        print(f"  {feature}: {detail}")
    return protocol.EXIT_OK


async def serve(config: Config) -> int:
    """Build the exporter (:func:`exporter.app.build`), then run it until SIGTERM/SIGINT; returns
    the exit code."""
    from exporter import app
    from exporter.supervisor.http.webmodel import WebConfigError

    try:
        built = app.build(config)
    except WebConfigError as exc:  # it loaded during parsing; it changed since
        log.error("NVGPU_WEB_CONFIG_FILE=%s: %s", config.web_config_file, exc)
        return protocol.EXIT_CONFIG
    refused = _startup_checks(config, built.supervisor)
    if refused is not None:
        return refused
    return await _run_built(config, built)


async def _run_built(config: Config, built: Exporter) -> int:
    """Listen, run the supervisor until a signal (or its loop ends), drain, clean up."""
    supervisor, listener, server = built.supervisor, built.listener, built.server
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before the port opens: a signal from then on is a clean stop
        loop.add_signal_handler(sig, stop.set)
    factory = await server.setup()
    if not await _listen(config, listener, factory):
        await server.cleanup()
        supervisor.close()
        return protocol.EXIT_ERROR
    _log_listening(config, built.watcher, built.cap, built.soft_limit)
    task = asyncio.ensure_future(supervisor.run())
    stop_wait = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    await _drain(config, supervisor, task)
    stop_wait.cancel()
    listener.close()
    await server.cleanup()
    supervisor.close()
    if supervisor.fatal_exit is not None:
        return supervisor.fatal_exit
    if task.done() and not task.cancelled() and task.exception() is not None:
        return protocol.EXIT_ERROR
    return protocol.EXIT_OK


async def _listen(config: Config, listener: Listener, factory: Callable[[], asyncio.Protocol]) -> bool:
    """Listen on every ``--web.listen-address``; False (logged, every socket closed) when one fails."""
    for host, port in config.listen_addresses:
        try:
            await listener.start(factory, host, port, backlog=4096)
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", host or "*", port, exc)
            listener.close()
            return False
    return True


def _startup_checks(config: Config, supervisor: Supervisor) -> int | None:
    """Say what would go wrong later (an unwritable state file) and apply the supervisor's
    self-check; returns the exit code when ``NVGPU_SELFCHECK=strict`` refuses to start."""
    why = state_file_problem(config.state_file)
    if why:
        log.error(
            "state file %s cannot be written (%s): a quarantine will not survive a restart; mount a writable volume "
            "(an emptyDir) there, or set NVGPU_STATE_FILE='' to keep quarantines in memory",
            config.state_file,
            why,
        )
    sup_check = supervisor.selfcheck
    for problem in sup_check.problems:
        log.warning("self-check (supervisor): %s", problem)
    if sup_check.problems and config.selfcheck == "strict":
        log.error("NVGPU_SELFCHECK=strict: refusing to start:\n  %s", "\n  ".join(sup_check.problems))
        supervisor.close()
        return protocol.EXIT_SELFCHECK
    return None


def _log_listening(config: Config, watcher: WebConfigWatcher | None, cap: int, soft_limit: int) -> None:
    """The one start-up line an operator reads, and the warnings that go with it."""
    log.info(
        "nvgpu-exporter %s listening on %s, metrics at %s (%s; NVML backend %s, sample interval %g s, "
        "stale after %g s)",
        __version__,
        ", ".join(f"{host or '*'}:{port}" for host, port in config.listen_addresses),
        config.telemetry_path,
        watcher.current.describe() if watcher is not None else "plain HTTP, no auth",
        config.nvml_backend,
        config.interval_s,
        config.stale_s,
    )
    if watcher is not None:
        from exporter.supervisor.http.webtls import log_cautions

        log_cautions(watcher.current)
    if watcher is not None and watcher.current.users and watcher.current.tls is None:
        log.warning("basic auth without TLS: passwords cross the network in clear text; add tls_server_config")
    if cap < config.web_max_connections:
        log.info(
            "HTTP connections capped at %d: open-file limit %d minus %d kept for the worker",
            cap,
            soft_limit,
            soft_limit - cap,
        )


async def _drain(config: Config, supervisor: Supervisor, task: asyncio.Future[Any]) -> None:
    """Stop the supervisor: drain the worker for at most ``NVGPU_SHUTDOWN_TIMEOUT_SECONDS``, then
    kill it (no worker is ever left behind)."""
    log.info("stopping: draining the worker (at most %g s)", config.shutdown_timeout_s)
    await supervisor.stop()
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout=config.shutdown_timeout_s)
    except asyncio.TimeoutError:
        log.error("the worker did not stop within %g s; killing it", config.shutdown_timeout_s)
        await supervisor.kill_now()
    except Exception:  # noqa: BLE001 - report and exit non-zero below
        log.exception("supervisor loop failed")
