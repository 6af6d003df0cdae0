"""Go-style durations (``500ms``, ``1s``, ``2m``, ``1h30m``), the spelling the Prometheus tools use.

Go's ``time.ParseDuration`` (pkg.go.dev/time#ParseDuration) reads a sequence of decimal numbers,
each with an optional fraction and a unit suffix (``ns``, ``us`` / ``µs``, ``ms``, ``s``, ``m``,
``h``), optionally signed; ``0`` alone needs no unit. exporter-toolkit's ``rate_limit.interval``,
Prometheus's ``scrape_interval`` and the toolkit exporters' ``--…timeout`` flags are written this
way. Standard library only: the supervisor's settings (:mod:`exporter.config`) and the web config
(:mod:`exporter.supervisor.http.webconfig`) both read it.
"""

from __future__ import annotations

import re

__all__ = ["UNITS", "parse_go_duration"]

# seconds per unit; "µs" is U+00B5 (micro sign), "μs" U+03BC (Greek mu): Go accepts both
UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_TERM = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> float:
    """Seconds of a Go duration string: ``"1h30m"`` -> 5400.0, ``"250ms"`` -> 0.25, ``"0"`` -> 0.0.

    A leading ``+`` or ``-`` is taken as Go takes it (the caller decides whether a negative
    duration makes sense).

    Raises:
        ValueError: not a Go duration (a bare number other than 0, an unknown unit, nothing).
    """
    body = text.strip()
    sign = -1.0 if body.startswith("-") else 1.0
    if body[:1] in "+-":
        body = body[1:]
    if body == "0":
        return 0.0
    if not body or _TERM.sub("", body) != "":
        raise ValueError(f"{text!r} is not a duration such as 500ms, 1s, 2m or 1h30m")
    return sign * sum(float(number) * UNITS[unit] for number, unit in _TERM.findall(body))
