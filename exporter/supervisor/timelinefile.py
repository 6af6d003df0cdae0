"""The timeline file: read without blocking, every value checked, written atomically.

The discipline of the quarantine state file (:mod:`exporter.supervisor.quarantine`): the file is
never a reason not to start. It is opened without following a link at its name and without
blocking (``O_NOFOLLOW | O_NONBLOCK`` through :mod:`exporter.common.fileio`: a FIFO or a device
there is refused, never waited on), on a thread of its own within :data:`IO_DEADLINE_S` (a hung
mount is abandoned), read up to :data:`~exporter.supervisor.timelineevents.FILE_MAX_BYTES`, and each value is checked
(known kinds, positive unique sequence numbers, finite times, strings, scalars and short lists
only): a bad lane or event is dropped and named, the rest is kept; a file that is not ours at all
(not JSON, another version, too large, not a regular file) counts as empty, and says why. A write
goes to a fresh temporary file in the same directory (``mkstemp``), then ``os.replace`` moves it
over the old one (which replaces a symbolic link at that name rather than writing through it); a
failed write removes its temporary file. :class:`~exporter.supervisor.timeline.Timeline` writes on
its own thread, never on the event loop.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from exporter.common import fileio
from exporter.supervisor.timelineevents import (
    EVENTS_PER_LANE,
    FILE_MAX_BYTES,
    KINDS,
    LANES_MAX,
    TEXT_MAX,
    Event,
    Lane,
    clean_data,
    cut,
    finite,
)

FILE_VERSION = 1
IO_DEADLINE_S = 5.0  # a read or write of the file that takes longer is abandoned (a hung mount)


@dataclass
class Decoded:
    """What a timeline file held, checked.

    Attributes:
        meta: node facts (versions, boot id) as last seen.
        extra: sections other parts own (they check them).
        lanes: the lanes, without their events.
        events: (lane key, event) of every valid event, in no particular order.
        next_seq: the next sequence number to give.
        dropped: what was not valid, in words.
    """

    meta: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    lanes: dict[str, Lane] = field(default_factory=dict)
    events: list[tuple[str, Event]] = field(default_factory=list)
    next_seq: int = 1
    dropped: list[str] = field(default_factory=list)


def read_bounded(path: str, limit: int, runner: fileio.Runner | None = None) -> bytes:
    """The content of a regular file, at most ``limit`` bytes, opened without following a link at
    the name or blocking (a FIFO or a device is refused, never waited on), read on a
    :class:`~exporter.common.fileio.Runner` thread within :data:`IO_DEADLINE_S` (a hung mount is
    abandoned, never waited on).

    Raises:
        FileNotFoundError: no file there.
        ValueError: it cannot be opened or read, is not a regular file, is larger than ``limit``, or
            did not answer in time (the reason is the message).
    """
    try:
        return (runner or fileio.default_runner()).call(_read_nofollow, path, limit, deadline_s=IO_DEADLINE_S)
    except fileio.TimedOut:
        raise ValueError(f"no answer within {IO_DEADLINE_S:g} s (a hung mount?)") from None
    except fileio.FileRefused as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise FileNotFoundError(errno.ENOENT, "no such file", path) from None
        raise ValueError(exc.detail) from None


def _read_nofollow(path: str, limit: int) -> bytes:
    return fileio.read_bytes(path, limit, follow=False)


def read(path: str, runner: fileio.Runner | None = None) -> Decoded | None:
    """The timeline file at ``path``, checked; None when there is none.

    Raises:
        ValueError: it cannot be read, or it is not a timeline file (the reason is the message).
    """
    try:
        raw = read_bounded(path, FILE_MAX_BYTES, runner)
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=lambda c: float("nan"))
    except RecursionError:  # JSON nested too deeply
        raise ValueError("nested too deeply") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("version") != FILE_VERSION:
        raise ValueError(f"version {data.get('version')!r}, expected {FILE_VERSION}")
    return decode(data)


def decode(data: dict[str, Any]) -> Decoded:
    """Every valid part of a timeline file's object (see the module docstring)."""
    out = Decoded()
    out.meta = {str(k): v for k, v in _dict(data.get("meta")).items() if valid(v)}
    out.extra = _dict(data.get("extra"))
    seen: set[int] = set()
    for key, body in list(_dict(data.get("lanes")).items())[: 4 * LANES_MAX]:
        if not key or len(key) > 100 or not isinstance(body, dict):
            out.dropped.append(f"lane {str(key)[:40]!r}")
            continue
        lane = Lane(key)
        lane.identity = {str(k): v for k, v in _dict(body.get("identity")).items() if valid(v, lists=False)}
        lane.last = {str(k): v for k, v in _dict(body.get("last")).items() if valid(v)}
        evicted, until = body.get("evicted", 0), body.get("evicted_until")
        lane.evicted = evicted if _count(evicted, 0) else 0
        lane.evicted_until = float(until) if finite(until) else None
        raw_events = body.get("events")
        for raw in raw_events[: 4 * EVENTS_PER_LANE] if isinstance(raw_events, list) else ():
            event = decode_event(key, raw)
            if event is None or event.seq in seen:
                out.dropped.append(f"event {str(raw)[:60]}")
                continue
            seen.add(event.seq)
            out.events.append((key, event))
        out.lanes[key] = lane
    next_seq = data.get("next_seq")
    top = max(seen, default=0) + 1
    out.next_seq = max(next_seq, top) if _count(next_seq, 1) else top
    return out


def decode_event(lane: str, raw: Any) -> Event | None:
    """One event of the file, every field checked; None when anything is off."""
    if not isinstance(raw, dict):
        return None
    seq, ts, kind, gpu, summary = (raw.get(k) for k in ("seq", "ts", "kind", "gpu", "summary"))
    count, last_ts, boot, data = raw.get("count", 1), raw.get("last_ts"), raw.get("boot_id", ""), raw.get("data")
    if not (_count(seq, 1) and finite(ts)) or kind not in KINDS or not _count(count, 1):
        return None
    if not (isinstance(gpu, str) and isinstance(summary, str) and isinstance(boot, str)):
        return None
    if last_ts is not None and not finite(last_ts):
        return None
    if not isinstance(data, dict) or not all(valid(v) for v in data.values()):
        return None
    return Event(
        seq,
        float(ts),
        kind,
        lane,
        cut(gpu, 16),
        cut(summary, 2 * TEXT_MAX),
        clean_data(data),
        cut(boot, 64),
        count,
        float(last_ts) if last_ts is not None else None,
    )


def encode(content: dict[str, Any]) -> bytes:
    """``content`` as the file's JSON.

    Raises:
        ValueError: it cannot be encoded (a NaN, a value JSON has no form for).
    """
    try:
        return json.dumps(content, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def write_atomic(path: str, body: bytes) -> None:
    """Write ``body`` to ``path`` atomically (see the module docstring).

    Raises:
        OSError: the directory or the file cannot be written.
    """
    tmp = None
    try:
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".timeline-", dir=directory)
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
        os.replace(tmp, path)
        tmp = None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def path_beside(state_file: str) -> str:
    """The timeline file beside the state file (``timeline.json``); "" (memory only) without one."""
    return os.path.join(os.path.dirname(state_file), "timeline.json") if state_file else ""


def valid(value: Any, lists: bool = True) -> bool:
    """A value the file may hold: a scalar, or (``lists``) a list of scalars."""
    if value is None or isinstance(value, (bool, str)):
        return True
    if isinstance(value, (int, float)):
        return finite(value)
    return lists and isinstance(value, list) and all(valid(v, lists=False) for v in value)


def _count(value: Any, least: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and least <= value < 1 << 62


def _dict(value: Any) -> dict[str, Any]:
    return {k: v for k, v in value.items() if isinstance(k, str)} if isinstance(value, dict) else {}
