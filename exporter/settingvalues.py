"""The settings' values: :class:`Setting` (one option's variable, flag, default and parser),
:class:`ConfigError`, and the parsers that turn a setting's text into its value.

Each parser takes the name the user gave (the variable or the flag as typed) and the text, and
returns the value or raises a ``ValueError`` whose message starts with ``name='text':``; a parser of
a file with several problems raises :class:`ConfigError` with one line each. Durations are seconds,
written as a number (``5``, ``0.5``) or as a Go duration (``500ms``, ``1h30m``). The table of
settings is :data:`exporter.settings.SETTINGS`; :meth:`exporter.config.Config.from_env` runs it.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporter.common.durations import parse_go_duration

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


def parse_interval(name: str, text: str) -> float:
    value = parse_duration(name, text, MAX_INTERVAL_S, "an hour between samples")
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


def parse_duration(name: str, text: str, most: float = MAX_DURATION_S, why: str = "ten years") -> float:
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


def parse_duration_or_off(name: str, text: str) -> float:
    """A duration, or 0 (``0s``) to switch the behaviour off."""
    try:
        if seconds(text) == 0:
            return 0.0
    except ValueError:
        pass
    return parse_duration(name, text)


def integer(minimum: int, expected: str, maximum: int | None = None) -> Callable[[str, str], int]:
    def parse(name: str, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum or (maximum is not None and value > maximum):
            raise ValueError(f"{name}={text!r}: expected {expected}")
        return value

    return parse


parse_positive_int = integer(1, "a positive integer")
parse_non_negative_int = integer(0, "a non-negative integer (bytes)")


def parse_ratio(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected a ratio between 0 and 1") from None
    if not 0 < value <= 1:
        raise ValueError(f"{name}={text!r}: expected a ratio in (0, 1]")
    return value


def parse_bool(name: str, text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{name}={text!r}: expected true or false")


def one_of(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"{name}={text!r}: expected one of {', '.join(choices)}")
        return value

    return parse


def parse_log_level(name: str, text: str) -> str:
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


def parse_backend(name: str, text: str) -> str:
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


def parse_path(name: str, text: str) -> str:
    return text.strip()


# -- the HTTP edge: connection cap, header timeout, TLS and auth ------------------------------------

PROBE_PATHS = ("/healthz", "/readyz")
_URL_PATH = re.compile(r"(/[A-Za-z0-9._~!$&'()*+,;=:@-]+)+")


def parse_telemetry_path(name: str, text: str) -> str:
    path = text.strip()
    if not _URL_PATH.fullmatch(path):
        raise ValueError(
            f"{name}={text!r}: expected a URL path such as /metrics (starts with /, no empty segments, "
            "no query, no spaces or percent-escapes)"
        )
    if path in PROBE_PATHS:
        raise ValueError(f"{name}={text!r}: {path} is the exporter's probe path; pick another, e.g. /metrics")
    return path


def duration_between(low: float, high: float) -> Callable[[str, str], float]:
    def parse(name: str, text: str) -> float:
        value = parse_duration(name, text)
        if not low <= value <= high:
            raise ValueError(f"{name}={text!r}: expected between {low:g} and {high:g} seconds")
        return value

    return parse


def parse_web_config(name: str, text: str) -> str:
    path = text.strip()
    if not path:
        return ""
    from exporter.supervisor.http.webmodel import WebConfigError
    from exporter.supervisor.http.webtls import load_bounded  # reads the file and every file it names

    try:
        load_bounded(path)  # without blocking on a FIFO, within a deadline; any failure is a WebConfigError
    except WebConfigError as exc:  # one line per problem of the file, each naming the setting
        raise ConfigError([f"{name}={text!r}: {problem}" for problem in exc.problems]) from None
    return os.path.abspath(path)
