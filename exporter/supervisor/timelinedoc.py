"""The ``/api/v1/timeline`` document (versioned JSON, schema in docs/incidents.md) and its query.

``GET /api/v1/timeline?gpu=<uuid|index|PCI bus id|node>&since=<time>&until=<time>&kind=<k1,k2>&limit=<n>``:
every parameter is optional; a time is RFC 3339 (``2026-12-01T10:00:00Z``), Unix seconds, or a Go
duration meaning "that long ago" (``2h``). Events come in sequence order (the order they happened in
for the exporter; wall clocks step), the last ``limit`` (default :data:`LIMIT`) of those that match.
A bad parameter is a :class:`QueryError` naming it (HTTP 400).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter import __version__
from exporter.common.durations import parse_go_duration
from exporter.common.logs import parse_rfc3339, rfc3339
from exporter.supervisor.timeline import NODE, Timeline
from exporter.supervisor.timelineevents import KINDS, SCHEMA_VERSION

LIMIT = 1000
LIMIT_MAX = 20000


class QueryError(ValueError):
    """A query parameter that cannot be used; the message names it and what was expected."""


@dataclass(frozen=True)
class Query:
    """A timeline query (see the module docstring); None: no bound."""

    gpu: str | None = None
    since: float | None = None
    until: float | None = None
    kinds: tuple[str, ...] | None = None
    limit: int = LIMIT


def parse_time(name: str, text: str, now: float) -> float:
    """A time parameter: RFC 3339, Unix seconds, or a Go duration ago.

    Raises:
        QueryError: none of these.
    """
    try:
        return float(text) if text.replace(".", "", 1).isdigit() else parse_rfc3339(text)
    except ValueError:
        pass
    try:
        return now - parse_go_duration(text)
    except ValueError:
        raise QueryError(
            f"{name}={text!r}: expected RFC 3339 (2026-12-01T10:00:00Z), Unix seconds, or a duration ago (2h)"
        ) from None


def parse_query(params: Mapping[str, str], now: float | None = None) -> Query:
    """The query of ``params`` (a request's query string).

    Raises:
        QueryError: an unknown parameter, kind or a bad value.
    """
    wall = time.time() if now is None else now
    unknown = sorted(set(params) - {"gpu", "since", "until", "kind", "limit"})
    if unknown:
        raise QueryError(f"unknown parameter {unknown[0]!r}: expected gpu, since, until, kind, limit")
    kinds = None
    if params.get("kind"):
        kinds = tuple(k.strip() for k in params["kind"].split(",") if k.strip())
        bad = [k for k in kinds if k not in KINDS]
        if bad:
            raise QueryError(f"kind={bad[0]!r}: expected one of {', '.join(KINDS)}")
    limit = LIMIT
    if "limit" in params:
        text = params["limit"]
        if not text.isdigit() or not 1 <= int(text) <= LIMIT_MAX:
            raise QueryError(f"limit={text!r}: expected 1 to {LIMIT_MAX}")
        limit = int(text)
    return Query(
        params.get("gpu") or None,
        parse_time("since", params["since"], wall) if params.get("since") else None,
        parse_time("until", params["until"], wall) if params.get("until") else None,
        kinds,
        limit,
    )


def document(timeline: Timeline, query: Query) -> dict[str, Any]:
    """The timeline document for ``query``.

    Raises:
        KeyError: ``query.gpu`` names no GPU the timeline knows.
    """
    lanes = None
    if query.gpu is not None:
        lane = timeline.find_lane(query.gpu)
        if lane is None:
            raise KeyError(query.gpu)
        lanes = [lane.key]
    events = timeline.events(lanes, query.since, query.until, query.kinds)
    chosen = [timeline.lanes[k] for k in lanes] if lanes is not None else list(timeline.lanes.values())
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": rfc3339(timeline.wall()),
        "exporter_version": __version__,
        "boot_id": timeline.boot_id,
        "query": {
            "gpu": query.gpu,
            "since": rfc3339(query.since) if query.since is not None else None,
            "until": rfc3339(query.until) if query.until is not None else None,
            "kind": list(query.kinds) if query.kinds is not None else None,
            "limit": query.limit,
        },
        "lanes": [
            {
                "uuid": "" if lane.key == NODE else lane.key,
                "lane": lane.key,
                "gpu": lane.identity.get("index", ""),
                "pci_bus_id": lane.identity.get("pci_bus_id", ""),
                "events": len(lane.events),
                "evicted": lane.evicted,
                "evicted_until": rfc3339(lane.evicted_until) if lane.evicted_until is not None else None,
            }
            for lane in sorted(chosen, key=lambda x: (x.key != NODE, str(x.identity.get("index", "")), x.key))
        ],
        "truncated": len(events) > query.limit,
        "events": [e.to_json() for e in events[-query.limit :]],
    }
