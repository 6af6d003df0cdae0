"""Configuration: ``NVGPU_*`` environment variables and flags -> one frozen :class:`Config`.

:meth:`Config.from_env` is the one reader of the environment. Flags override variables. Parsing is
strict (``NVGPU_LOG_FORMAT=jsn`` is an error, not a default), durations are seconds with
``_SECONDS`` in the variable name, written as a number (``5``, ``0.5``) or as a Go duration the way
the Prometheus tools take them (``500ms``, ``1s``, ``2m``, ``1h30m``), and every problem is
reported together in one :class:`ConfigError` before anything starts. The spellings of
exporter-toolkit and ``prometheus/common/promslog`` work as they do there: ``--log.level=warn``,
``--log.format=logfmt``, ``--web.listen-address`` given more than once.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.common.durations import parse_go_duration
from exporter.common.workerconfig import ENV_VAR as WORKER_CONFIG_VAR
from guards import features as gf

DEFAULT_PORT = 19400
DEFAULT_LISTEN = f":{DEFAULT_PORT}"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# promslog's spellings (debug, info, warn, error) and Python's, any case -> Python's level name
_LOG_LEVEL_NAMES = {"debug": "DEBUG", "info": "INFO", "warn": "WARNING", "warning": "WARNING", "error": "ERROR"}
LOG_FORMATS = ("text", "logfmt", "json")


class ConfigError(ValueError):
    """Every configuration problem, one per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Setting:
    """One option: its variable, flag, default (as text) and parser.

    Attributes:
        flag: the flag ``--help`` shows (exporter-toolkit's spelling where it has one).
        aliases: older spellings of the flag that keep working.
    """

    attr: str
    env: str
    flag: str
    default: str
    parse: Callable[[str, str], Any]
    help: str
    aliases: tuple[str, ...] = ()


MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 3600.0
MAX_DURATION_S = 10 * 365 * 86400.0  # ten years: beyond it time arithmetic stops meaning anything


def _interval(name: str, text: str) -> float:
    value = _duration(name, text, MAX_INTERVAL_S, "an hour between samples")
    if value < MIN_INTERVAL_S:
        raise ValueError(
            f"{name}={text!r}: expected at least {MIN_INTERVAL_S} s (NVML's own sampling periods are 1/6 s to 1 s)"
        )
    return value


def seconds(text: str) -> float:
    """A duration in seconds: a number (``5``, ``0.5``) or a Go duration (``500ms``, ``1h30m``).

    Raises:
        ValueError: neither.
    """
    try:
        return float(text)
    except ValueError:
        pass
    return parse_go_duration(text)


def _duration(name: str, text: str, most: float = MAX_DURATION_S, why: str = "ten years") -> float:
    try:
        value = seconds(text)
    except ValueError:
        raise ValueError(
            f"{name}={text!r}: expected a duration: seconds as a number (5, 0.5) or with a unit (500ms, 5s, 2m, 1h30m)"
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={text!r}: expected a positive, finite duration")
    if value > most:
        raise ValueError(f"{name}={text!r}: expected at most {most:g} s ({why})")
    return value


def _duration_or_off(name: str, text: str) -> float:
    """A duration, or 0 (``0s``) to switch the behaviour off."""
    try:
        if seconds(text) == 0:
            return 0.0
    except ValueError:
        pass
    return _duration(name, text)


def _integer(minimum: int, expected: str, maximum: int | None = None) -> Callable[[str, str], int]:
    def parse(name: str, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum or (maximum is not None and value > maximum):
            raise ValueError(f"{name}={text!r}: expected {expected}")
        return value

    return parse


_positive_int = _integer(1, "a positive integer")
_non_negative_int = _integer(0, "a non-negative integer (bytes)")


def _ratio(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected a ratio between 0 and 1") from None
    if not 0 < value <= 1:
        raise ValueError(f"{name}={text!r}: expected a ratio in (0, 1]")
    return value


def _bool(name: str, text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{name}={text!r}: expected true or false")


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"{name}={text!r}: expected one of {', '.join(choices)}")
        return value

    return parse


def _log_level(name: str, text: str) -> str:
    level = _LOG_LEVEL_NAMES.get(text.strip().lower())
    if level is None:
        raise ValueError(f"{name}={text!r}: expected one of debug, info, warn (or warning), error")
    return level


def parse_listen_addresses(name: str, text: str) -> tuple[tuple[str, int], ...]:
    """One or more listen addresses, comma-separated (a flag given several times is joined so):
    each as :func:`parse_listen_address` reads it; the exporter listens on every one, as the
    exporter-toolkit exporters do with a repeated ``--web.listen-address``.

    Raises:
        ValueError: an address is malformed, or one is given twice.
    """
    parts = text.split(",")
    if len(parts) == 1:
        return (parse_listen_address(name, text),)
    found: list[tuple[str, int]] = []
    for part in parts:
        try:
            address = parse_listen_address(name, part)
        except ValueError as exc:  # name the whole value, then the part
            why = str(exc).removeprefix(f"{name}={part.strip()!r}: ")
            raise ValueError(f"{name}={text!r}: {part.strip() or 'an empty address'}: {why}") from None
        if address in found:
            raise ValueError(f"{name}={text!r}: {part.strip()} is given twice")
        found.append(address)
    return tuple(found)


def format_address(address: tuple[str, int]) -> str:
    """``host:port`` as given to :func:`parse_listen_address` (``[v6]:port``, ``:port``)."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_listen_address(name: str, text: str) -> tuple[str, int]:
    """``host:port``, ``:port`` (all interfaces) or ``[v6]:port`` -> (host, port).

    The host is an IP literal (``127.0.0.1``, ``[::1]``, ``[fe80::1%eth0]``) or empty: a name would be
    resolved at bind time, may resolve to addresses that are not on this machine or to several, and
    a Kubernetes pod listens on every interface anyway. ``--check-config`` also checks that the
    address belongs to this machine (:func:`exporter.checks.environment_problems`).
    """
    text = text.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ValueError(f"{name}={text!r}: expected host:port, e.g. :{DEFAULT_PORT} or 127.0.0.1:{DEFAULT_PORT}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{name}={text!r}: {host!r} is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"{name}={text!r}: write IPv6 addresses in brackets, e.g. [::1]:{DEFAULT_PORT}")
    elif host:
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(
                f"{name}={text!r}: {host!r} is not an IP address; the host must be an IP literal "
                f"(e.g. 127.0.0.1:{DEFAULT_PORT}, [::1]:{DEFAULT_PORT}) or empty for every interface "
                f"(:{DEFAULT_PORT}); host names are not resolved"
            ) from None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{name}={text!r}: port must be 1-65535")
    return host, int(port_text)


def _backend(name: str, text: str) -> str:
    text = text.strip()
    if text == "nvml":
        return text
    if text.startswith("fake:"):
        from exporter.common import scenarios  # stdlib only
        from exporter.common.scenarios.scenario import ScenarioError, load_scenario  # stdlib only: no pynvml here

        path = text[len("fake:") :]
        if not path:
            raise ValueError(
                f"{name}={text!r}: expected fake:<scenario name or file> (shipped: {', '.join(scenarios.names())})"
            )
        if scenarios.is_name(path) and not os.path.isfile(path):
            try:
                path = str(scenarios.path(path))
            except KeyError as exc:
                raise ValueError(f"{name}={text!r}: {exc.args[0]}; or give a file path") from None
        elif not os.path.lexists(path):  # a FIFO or a directory: load_scenario says what it is
            raise ValueError(
                f"{name}={text!r}: scenario file {path!r} does not exist "
                f"(shipped scenarios by name: {', '.join(scenarios.names())})"
            )
        try:
            load_scenario(path)
        except ScenarioError as exc:
            raise ValueError(f"{name}: {exc}") from None
        return "fake:" + os.path.abspath(path)
    raise ValueError(f"{name}={text!r}: expected 'nvml' or 'fake:<scenario name or file>', e.g. fake:h200x2")


def _path(name: str, text: str) -> str:
    return text.strip()


# -- the HTTP edge: connection cap, header timeout, TLS and auth ------------------------------------

PROBE_PATHS = ("/healthz", "/readyz")
_URL_PATH = re.compile(r"(/[A-Za-z0-9._~!$&'()*+,;=:@-]+)+")


def _telemetry_path(name: str, text: str) -> str:
    path = text.strip()
    if not _URL_PATH.fullmatch(path):
        raise ValueError(
            f"{name}={text!r}: expected a URL path such as /metrics (starts with /, no empty segments, "
            "no query, no spaces or percent-escapes)"
        )
    if path in PROBE_PATHS:
        raise ValueError(f"{name}={text!r}: {path} is the exporter's probe path; pick another, e.g. /metrics")
    return path


def _duration_between(low: float, high: float) -> Callable[[str, str], float]:
    def parse(name: str, text: str) -> float:
        value = _duration(name, text)
        if not low <= value <= high:
            raise ValueError(f"{name}={text!r}: expected between {low:g} and {high:g} seconds")
        return value

    return parse


def _web_config(name: str, text: str) -> str:
    path = text.strip()
    if not path:
        return ""
    from exporter.supervisor.http.webconfig import WebConfigError
    from exporter.supervisor.http.webtls import load_bounded  # reads the file and every file it names

    try:
        load_bounded(path)  # without blocking on a FIFO, within a deadline; any failure is a WebConfigError
    except WebConfigError as exc:  # one line per problem of the file, each naming the setting
        raise ConfigError([f"{name}={text!r}: {problem}" for problem in exc.problems]) from None
    return os.path.abspath(path)


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "listen_addresses",
        "NVGPU_LISTEN_ADDRESS",
        "--web.listen-address",
        DEFAULT_LISTEN,
        parse_listen_addresses,
        "host:port to serve on; the host is an IP literal, ':19400' is every interface; repeat the flag "
        "(or separate with commas) to listen on several",
        ("--listen-address",),
    ),
    Setting(
        "interval_s",
        "NVGPU_SAMPLE_INTERVAL_SECONDS",
        "--sample-interval",
        "5",
        _interval,
        "time between NVML samples (5, 5s, 500ms)",
    ),
    Setting(
        "stale_s",
        "NVGPU_STALE_AFTER_SECONDS",
        "--stale-after",
        "",
        _duration,
        "drop GPU series older than this (default: 3 sample intervals)",
    ),
    Setting(
        "sample_deadline_s",
        "NVGPU_SAMPLE_DEADLINE_SECONDS",
        "--sample-deadline",
        "",
        _duration,
        "a sample not finished after this many seconds means the worker hung (default: 2 intervals, at least 10)",
    ),
    Setting(
        "init_deadline_s",
        "NVGPU_INIT_DEADLINE_SECONDS",
        "--init-deadline",
        "60",
        _duration,
        "time nvmlInit and enumeration may take before the worker counts as hung",
    ),
    Setting(
        "log_level",
        "NVGPU_LOG_LEVEL",
        "--log.level",
        "INFO",
        _log_level,
        "log level: debug, info, warn (or warning), error; any case",
        ("--log-level",),
    ),
    Setting(
        "log_format",
        "NVGPU_LOG_FORMAT",
        "--log.format",
        "text",
        _choice(*LOG_FORMATS),
        "text; logfmt: key=value per line as Prometheus's exporters write it (time, level, logger, msg, fields); "
        "json: one JSON object per line (the worker's output included)",
        ("--log-format",),
    ),
    Setting(
        "nvml_backend",
        "NVGPU_NVML_BACKEND",
        "--nvml-backend",
        "nvml",
        _backend,
        "'nvml' (the real library) or 'fake:<scenario>': a shipped name (h200x1, h200x2, h200x8, h200x2-mig, "
        "h200x2-nvlink-crash, h200x2-xid79) or a scenario file",
    ),
    Setting(
        "state_file",
        "NVGPU_STATE_FILE",
        "--state-file",
        "/var/lib/nvgpu-exporter/state.json",
        _path,
        "quarantine state that survives restarts; empty disables",
    ),
    Setting(
        "quarantine_after",
        "NVGPU_QUARANTINE_AFTER",
        "--quarantine-after",
        "3",
        _positive_int,
        "crashes or hangs in one feature within the window that quarantine it",
    ),
    Setting(
        "quarantine_window_s",
        "NVGPU_QUARANTINE_WINDOW_SECONDS",
        "--quarantine-window",
        "600",
        _duration,
        "window for counting crashes of a feature",
    ),
    Setting(
        "quarantine_ttl_s",
        "NVGPU_QUARANTINE_TTL_SECONDS",
        "--quarantine-ttl",
        "86400",
        _duration,
        "a quarantine expires after this, so a fixed driver is retried",
    ),
    Setting(
        "backoff_initial_s",
        "NVGPU_RESTART_BACKOFF_SECONDS",
        "--restart-backoff",
        "1",
        _duration,
        "first delay before restarting a dead worker; doubles each time",
    ),
    Setting(
        "backoff_max_s",
        "NVGPU_RESTART_BACKOFF_MAX_SECONDS",
        "--restart-backoff-max",
        "60",
        _duration,
        "longest delay between worker restarts",
    ),
    Setting(
        "shutdown_timeout_s",
        "NVGPU_SHUTDOWN_TIMEOUT_SECONDS",
        "--shutdown-timeout",
        "10",
        _duration,
        "on SIGTERM, how long the worker may take to drain before it is killed",
    ),
    Setting(
        "selfcheck",
        "NVGPU_SELFCHECK",
        "--selfcheck",
        "warn",
        _choice("warn", "strict", "off"),
        "warn: log and export; strict: refuse to start on a problem; off",
    ),
    Setting("kmsg_path", "NVGPU_KMSG_PATH", "--kmsg-path", "/dev/kmsg", _path, "kernel log for the kernel_xid feature"),
    Setting(
        "kmsg_cursor_file",
        "NVGPU_KMSG_CURSOR_FILE",
        "--kmsg-cursor-file",
        "",
        _path,
        "cursor for the kernel log (default: next to the state file)",
    ),
    Setting(
        "pod_resources_socket",
        "NVGPU_POD_RESOURCES_SOCKET",
        "--pod-resources-socket",
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        _path,
        "kubelet PodResources v1 socket",
    ),
    Setting(
        "pod_labels",
        "NVGPU_POD_LABELS",
        "--pod-labels",
        "false",
        _bool,
        "add namespace/pod/container labels to per-GPU series",
    ),
    Setting(
        "pod_refresh_s",
        "NVGPU_POD_REFRESH_SECONDS",
        "--pod-refresh",
        "15",
        _duration,
        "how often to ask the kubelet for pod assignments",
    ),
    Setting(
        "dra_resourceslices",
        "NVGPU_DRA_RESOURCESLICES",
        "--dra-resourceslices",
        "false",
        _bool,
        "attribute GPUs of DRA ResourceClaims by reading this node's ResourceSlices from the API server (list "
        "on resourceslices.resource.k8s.io; deploy/kubernetes/components/dra-resourceslices); needs NVGPU_NODE_NAME",
    ),
    Setting(
        "node_name",
        "NVGPU_NODE_NAME",
        "--node-name",
        "",
        _path,
        "this node's name (the downward API's spec.nodeName): the ResourceSlices NVGPU_DRA_RESOURCESLICES reads",
    ),
    Setting(
        "gpu_retry_s",
        "NVGPU_GPU_RETRY_SECONDS",
        "--gpu-retry",
        "30",
        _duration,
        "first delay before a probe retries a hung or crashed GPU; doubles each time",
    ),
    Setting(
        "gpu_retry_max_s",
        "NVGPU_GPU_RETRY_MAX_SECONDS",
        "--gpu-retry-max",
        "600",
        _duration,
        "longest delay between probes of a hung or crashed GPU",
    ),
    Setting(
        "reprobe_s",
        "NVGPU_REPROBE_SECONDS",
        "--reprobe",
        "300",
        _duration,
        "how often features a GPU did not support are asked again (also at once after MIG changes and resets)",
    ),
    Setting(
        "enumerate_s",
        "NVGPU_REENUMERATE_SECONDS",
        "--reenumerate",
        "60",
        _duration_between(1.0, 86400.0),
        "how often the worker reads every GPU's UUID per NVML index again (also at once when the GPU count "
        "changes, a GPU is lost, reset or falls off the bus): GPUs that left or arrived are seen",
    ),
    Setting(
        "expected_gpus",
        "NVGPU_EXPECTED_GPUS",
        "--expected-gpus",
        "",
        _integer(0, "an integer from 0 to 1024 (GPUs NVML should enumerate on this node), or empty", maximum=1024),
        'GPUs this node should have (nvgpu_gpus{view="expected"}; NvgpuGpuCountDropped fires below it); empty: unknown',
    ),
    Setting(
        "unhealthy_after_s",
        "NVGPU_UNHEALTHY_AFTER_SECONDS",
        "--unhealthy-after",
        "600",
        _duration_or_off,
        "NVML worked, then UNKNOWN on every call and re-init this long: /healthz fails (0: never)",
    ),
    Setting(
        "proc_path",
        "NVGPU_PROC_PATH",
        "--proc-path",
        "/proc",
        _path,
        "proc file system to resolve GPU processes in (pid_max, names, cgroups -> pods; needs hostPID); "
        "empty: none; with a fake backend none unless set (its pids are not this machine's)",
    ),
    Setting(
        "container_log_dir",
        "NVGPU_CONTAINER_LOG_DIR",
        "--container-log-dir",
        "/var/log/containers",
        _path,
        "the kubelet's container log symlinks: container id -> namespace/pod/container (names only); "
        "empty: none; with a fake backend none unless set",
    ),
    Setting(
        "process_series_per_gpu",
        "NVGPU_PROCESS_SERIES_PER_GPU",
        "--process-series-per-gpu",
        "16",
        _integer(1, "an integer from 1 to 1000", maximum=1000),
        'process_usage: processes with their own series per GPU; the rest are summed under pid="other"',
    ),
    Setting(
        "stuck_utilization",
        "NVGPU_STUCK_UTILIZATION_RATIO",
        "--stuck-utilization",
        "0.99",
        _ratio,
        "stuck-context signature: utilization at or above this",
    ),
    Setting(
        "stuck_memory_bytes",
        "NVGPU_STUCK_MEMORY_BYTES",
        "--stuck-memory-bytes",
        "67108864",
        _non_negative_int,
        "stuck-context signature: memory used at or below this",
    ),
    Setting(
        "stuck_sm_activity",
        "NVGPU_STUCK_SM_ACTIVITY_RATIO",
        "--stuck-sm-activity",
        "0.01",
        _ratio,
        "stuck-context signature where GPM reads: SM activity at or below this (replaces the memory test)",
    ),
    Setting(
        "stuck_after_s",
        "NVGPU_STUCK_AFTER_SECONDS",
        "--stuck-after",
        "60",
        _duration,
        "stuck-context signature: how long the conditions must hold",
    ),
    # -- the HTTP edge (connections, TLS, auth); keep these rows together ---------------------------
    Setting(
        "web_config_file",
        "NVGPU_WEB_CONFIG_FILE",
        "--web.config.file",
        "",
        _web_config,
        "exporter-toolkit web config file: TLS (tls_server_config), basic auth (basic_auth_users, bcrypt); "
        "re-read when it or a file it names changes. Empty: plain HTTP, no auth (docs/security.md)",
    ),
    Setting(
        "telemetry_path",
        "NVGPU_WEB_TELEMETRY_PATH",
        "--web.telemetry-path",
        "/metrics",
        _telemetry_path,
        "path of the metrics endpoint",
    ),
    Setting(
        "web_probes_without_auth",
        "NVGPU_WEB_PROBES_WITHOUT_AUTH",
        "--web.probes-without-auth",
        "true",
        _bool,
        "with a web config: /healthz and /readyz answer without basic auth or a client certificate, so the "
        "kubelet can probe them (over HTTPS when TLS is on); false: probes need the same credentials",
    ),
    Setting(
        "web_max_connections",
        "NVGPU_WEB_MAX_CONNECTIONS",
        "--web.max-connections",
        "1024",
        _positive_int,
        "open HTTP connections at most (further ones get 503 and are closed); lowered to fit the open-file "
        "limit minus what the supervisor keeps for the worker",
    ),
    Setting(
        "web_keepalive_s",
        "NVGPU_WEB_KEEPALIVE_TIMEOUT_SECONDS",
        "--web.keepalive-timeout",
        "120",
        _duration_between(1, 86400),
        "an idle keep-alive connection is closed after this",
    ),
    Setting(
        "web_header_timeout_s",
        "NVGPU_WEB_HEADER_TIMEOUT_SECONDS",
        "--web.header-timeout",
        "10",
        _duration_between(0.1, 3600),
        "a client must send a complete request head (and finish the TLS handshake) within this",
    ),
)


@dataclass(frozen=True)
class Config:
    """Everything the exporter needs, parsed and checked. See :data:`SETTINGS` for meanings."""

    listen_addresses: tuple[tuple[str, int], ...] = (("", DEFAULT_PORT),)
    interval_s: float = 5.0
    stale_s: float = 15.0
    sample_deadline_s: float = 10.0
    init_deadline_s: float = 60.0
    log_level: str = "INFO"
    log_format: str = "text"
    nvml_backend: str = "nvml"
    state_file: str = ""
    quarantine_after: int = 3
    quarantine_window_s: float = 600.0
    quarantine_ttl_s: float = 86400.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    shutdown_timeout_s: float = 10.0
    selfcheck: str = "warn"
    kmsg_path: str = "/dev/kmsg"
    kmsg_cursor_file: str = ""
    pod_resources_socket: str = ""
    pod_labels: bool = False
    pod_refresh_s: float = 15.0
    dra_resourceslices: bool = False
    node_name: str = ""
    gpu_retry_s: float = 30.0
    gpu_retry_max_s: float = 600.0
    reprobe_s: float = 300.0
    enumerate_s: float = 60.0
    expected_gpus: int | None = None
    unhealthy_after_s: float = 600.0
    proc_path: str = "/proc"
    container_log_dir: str = "/var/log/containers"
    process_series_per_gpu: int = 16
    stuck_utilization: float = 0.99
    stuck_memory_bytes: int = 64 << 20
    stuck_sm_activity: float = 0.01
    stuck_after_s: float = 60.0
    web_config_file: str = ""
    telemetry_path: str = "/metrics"
    web_probes_without_auth: bool = True
    web_max_connections: int = 1024
    web_keepalive_s: float = 120.0
    web_header_timeout_s: float = 10.0
    feature_modes: Mapping[str, gf.Mode] = field(default_factory=dict)

    @property
    def listen_address(self) -> tuple[str, int]:
        """The first of :attr:`listen_addresses` (host, port)."""
        return self.listen_addresses[0]

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        flags: Mapping[str, str] | None = None,
        flag_names: Mapping[str, str] | None = None,
    ) -> Config:
        """Build the configuration.

        Args:
            environ: the process environment (only ``NVGPU_*`` keys are read).
            flags: command-line values by attribute name; they override the environment.
            flag_names: the spelling of each flag as given (an alias such as ``--listen-address``),
                so a problem names what the user typed; defaults to :attr:`Setting.flag`.

        Raises:
            ConfigError: with every problem found (unknown ``NVGPU_*`` variables included).
        """
        flags = flags or {}
        names = flag_names or {}
        problems: list[str] = []
        values: dict[str, Any] = {}
        for s in SETTINGS:
            source = names.get(s.attr, s.flag) if s.attr in flags else s.env
            text = flags.get(s.attr, environ.get(s.env, s.default))
            if text == "" and s.default == "":
                continue  # derived below
            try:
                values[s.attr] = s.parse(source, text)
            except ConfigError as exc:  # a setting that names a file with several problems
                problems.extend(exc.problems)
            except ValueError as exc:
                problems.append(str(exc))
        modes, feature_problems = gf.parse_feature_env(environ)
        problems.extend(feature_problems)
        known = {s.env for s in SETTINGS} | {
            "NVGPU_FAKE_EPOCH",
            WORKER_CONFIG_VAR,
            "NVGPU_WORKER_FD",
            "NVGPU_BREADCRUMB_FD",
        }
        for key in sorted(environ):
            if key.startswith("NVGPU_") and not key.upper().startswith(gf.ENV_PREFIX.rstrip("_")) and key not in known:
                import difflib

                close = difflib.get_close_matches(key, sorted(known - {"NVGPU_FAKE_EPOCH"}), n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                problems.append(f"{key}: unknown variable{hint}")
        if str(values.get("nvml_backend", "")).startswith("fake:"):
            # A fake GPU's pids are not this machine's: resolving them in its /proc would name and
            # attribute unrelated processes. Tests and demos point these at fake trees explicitly.
            for s in SETTINGS:
                if s.attr in ("proc_path", "container_log_dir") and s.env not in environ and s.attr not in flags:
                    values[s.attr] = ""
        interval = values.get("interval_s", 5.0)
        values.setdefault("stale_s", 3 * interval)
        values.setdefault("sample_deadline_s", max(10.0, 2 * interval))
        if "stale_s" in values and values["stale_s"] < interval:
            problems.append(
                f"NVGPU_STALE_AFTER_SECONDS={values['stale_s']}: must be at least the sample interval ({interval})"
            )
        if values.get("backoff_max_s", 60.0) < values.get("backoff_initial_s", 1.0):
            problems.append("NVGPU_RESTART_BACKOFF_MAX_SECONDS must be at least NVGPU_RESTART_BACKOFF_SECONDS")
        if values.get("dra_resourceslices") and not values.get("node_name"):
            problems.append(
                "NVGPU_DRA_RESOURCESLICES=true needs NVGPU_NODE_NAME (set it from the downward API: "
                "fieldRef spec.nodeName)"
            )
        if values.get("gpu_retry_max_s", 600.0) < values.get("gpu_retry_s", 30.0):
            problems.append("NVGPU_GPU_RETRY_MAX_SECONDS must be at least NVGPU_GPU_RETRY_SECONDS")
        if problems:
            raise ConfigError(problems)
        return cls(feature_modes=modes, **values)

    def describe(self) -> list[str]:
        """Effective settings, one ``VAR=value`` line each."""
        lines = []
        for s in SETTINGS:
            value = getattr(self, s.attr)
            if s.attr == "listen_addresses":
                value = ",".join(format_address(a) for a in value)
            elif isinstance(value, bool):
                value = str(value).lower()
            elif value is None:  # unset (NVGPU_EXPECTED_GPUS: unknown)
                value = ""
            lines.append(f"{s.env}={value}")
        lines.extend(f"{gf.env_var(k)}={v.value}" for k, v in self.feature_modes.items())
        return lines
