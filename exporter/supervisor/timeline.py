"""The timeline: what happened to each GPU and to the node, in order, kept across restarts.

The fault atlas asks to keep Xid events, the GPU's UUID and PCI bus id, the pods and the
maintenance actions on one timeline. This is that timeline's store: one *lane* per GPU, keyed by
its UUID (never by the index a container sees), and one for the node (``NODE``: worker deaths,
quarantines, driver versions, boots). :mod:`exporter.supervisor.recorder` decides what goes
in; the kinds are :data:`~exporter.supervisor.timelineevents.KINDS`.

Order and time. Each event has a sequence number, one counter for the whole file, that orders it;
its wall-clock time (Unix seconds, RFC 3339 in the JSON) is for display, since a wall clock can step.
Events are never re-ordered by time.

Bounds (a flood of Xids or of worker deaths must not grow the file or the memory):

- at most ``EVENTS_PER_LANE`` events per lane: when a lane is full, the oldest event of its most
  numerous kind goes, so a storm of one kind evicts itself, not the rare verdict change or
  quarantine; the lane counts what it evicted (``evicted``) and until when;
- an event repeating the last one of its kind and key within ``COALESCE_S`` (the same Xid of
  the same process, the same worker death) is counted on it (``count``, ``last_time``), not added;
- every string is cut to ``TEXT_MAX`` characters, every list to ``LIST_MAX`` items, an
  event to ``EVENT_MAX_BYTES`` of JSON; the lanes together to ``FILE_MAX_BYTES`` (the largest
  lane gives up events first); at most ``LANES_MAX`` lanes (the GPU lane quiet the longest goes).

The events and their bounds are :mod:`exporter.supervisor.timelineevents`. The file
(:mod:`exporter.supervisor.timelinefile`) lies beside the state file (``timeline.json``;
``NVGPU_STATE_FILE`` empty keeps the timeline in memory only) and follows the quarantine state
file's discipline: read without blocking, every value checked (a bad event is dropped with one log
line, a file that is not ours counts as empty: the exporter starts), written atomically. Writes are
coalesced: at most one every ``SAVE_DELAY_S`` on the event loop, and one at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from exporter.common import fileio
from exporter.supervisor import timelinefile
from exporter.supervisor.timelineevents import (
    COALESCE_LOOKBACK,
    COALESCE_S,
    EVENTS_PER_LANE,
    FILE_MAX_BYTES,
    KINDS,
    LANES_MAX,
    NODE,
    SAVE_DELAY_S,
    TEXT_MAX,
    Event,
    Lane,
    Value,
    clean_data,
    cut,
    finite,
)

__all__ = ["NODE", "Event", "Lane", "Timeline"]

log = logging.getLogger(__name__)


class Timeline:
    """The per-GPU and node timeline (see the module docstring).

    Args:
        path: the timeline file; "" keeps it in memory only.
        boot_id: this boot's id (``/proc/sys/kernel/random/boot_id``), "" when unknown.
        wall: Unix time source (tests inject).
        on_error: called from an except block with (component, doing) when a save raised something
            unexpected (counted as component ``timeline``); None: logged once here.
    """

    def __init__(
        self,
        path: str,
        boot_id: str = "",
        wall: Callable[[], float] = time.time,
        on_error: Callable[[str, str], None] | None = None,
    ) -> None:
        self.path = path
        self.boot_id = boot_id
        self.wall = wall
        self.on_error = on_error
        self.lanes: dict[str, Lane] = {}
        self.meta: dict[str, Value] = {}  # node facts the recorder compares across restarts
        self.extra: dict[str, Any] = {}  # sections other parts own and check (the recovery watches)
        self.next_seq = 1
        self.load_error: str | None = None
        self.dropped: list[str] = []
        self.lanes_dropped = 0
        self._save_pending = False
        self._save_warned = False
        self._io = fileio.Runner("nvgpu-timeline-file", timelinefile.IO_DEADLINE_S)
        self._generation = 0  # of the last save asked for
        self._written = 0  # of the last save that reached the file
        self._write_lock = threading.Lock()
        self._load()

    # -- writing ---------------------------------------------------------------------------------

    def lane(self, key: str) -> Lane:
        """The lane of ``key`` (a GPU's UUID or :data:`NODE`), made when it does not exist yet."""
        found = self.lanes.get(key)
        if found is not None:
            return found
        if len(self.lanes) >= LANES_MAX:
            quiet = min((lane for k, lane in self.lanes.items() if k != NODE), key=lambda lane: lane.newest)
            del self.lanes[quiet.key]
            self.lanes_dropped += 1
        made = self.lanes[key] = Lane(cut(key, 100))
        return made

    def add(
        self,
        kind: str,
        lane: str,
        summary: str,
        data: Mapping[str, Any] | None = None,
        gpu: str = "",
        ts: float | None = None,
        key: tuple[Any, ...] | None = None,
    ) -> Event:
        """Record one event; returns it (or the earlier event a repeat was counted on).

        Args:
            kind: one of :data:`KINDS`.
            lane: a GPU's UUID, or :data:`NODE`.
            summary: one line for people.
            data: the facts (bounded by :func:`clean_data`).
            gpu: the GPU's index at the time.
            ts: Unix time it happened (default now).
            key: repeats of an event with the same kind and key within :data:`COALESCE_S` are counted
                on it; None: never coalesced.

        Raises:
            ValueError: an unknown kind (a bug of the caller).
        """
        if kind not in KINDS:
            raise ValueError(f"unknown timeline event kind {kind!r}")
        when = self.wall() if ts is None or not finite(ts) else float(ts)
        target = self.lane(lane)
        if key is not None:
            for prior in reversed(target.events[-COALESCE_LOOKBACK:]):
                if prior.kind == kind and prior.key == key and abs(when - (prior.last_ts or prior.ts)) <= COALESCE_S:
                    prior.count += 1
                    prior.last_ts = max(when, prior.last_ts or prior.ts)
                    self.changed()
                    return prior
        event = Event(
            self.next_seq,
            when,
            kind,
            target.key,
            cut(gpu, 16),
            cut(summary, 2 * TEXT_MAX),
            clean_data(data or {}),
            cut(self.boot_id, 64),
            key=key,
        )
        self.next_seq += 1
        self._append(target, event)
        self.changed()
        return event

    def amend(self, event: Event, data: Mapping[str, Any], summary: str | None = None) -> None:
        """Add facts learnt later to an event (the pod of an Xid's PID)."""
        lane = self.lanes.get(event.lane)
        if lane is None or event not in lane.events:
            return
        event.data = clean_data({**event.data, **data})
        if summary is not None:
            event.summary = cut(summary, 2 * TEXT_MAX)
        lane.size -= event.size
        lane.size += event.measure()
        self.changed()

    def _append(self, lane: Lane, event: Event) -> None:
        lane.events.append(event)
        lane.kinds[event.kind] += 1
        lane.size += event.measure()
        while len(lane.events) > EVENTS_PER_LANE:
            self._evict(lane)
        while sum(x.size for x in self.lanes.values()) > FILE_MAX_BYTES - (64 << 10):
            self._evict(max(self.lanes.values(), key=lambda x: x.size))

    def _evict(self, lane: Lane) -> None:
        """Drop the oldest event of the lane's most numerous kind."""
        kind = max(lane.kinds, key=lambda k: lane.kinds[k])
        victim = next(i for i, e in enumerate(lane.events) if e.kind == kind)
        gone = lane.events.pop(victim)
        lane.kinds[kind] -= 1
        if not lane.kinds[kind]:
            del lane.kinds[kind]
        lane.size -= gone.size
        lane.evicted += 1
        lane.evicted_until = max(lane.evicted_until or 0.0, gone.last_ts or gone.ts)

    def set_extra(self, section: str, value: Any) -> None:
        """Keep another part's section (JSON-ready) in the file."""
        self.extra[section] = value
        self.changed()

    # -- reading ---------------------------------------------------------------------------------

    def events(
        self,
        lanes: Iterable[str] | None = None,
        since: float | None = None,
        until: float | None = None,
        kinds: Iterable[str] | None = None,
    ) -> list[Event]:
        """Events of ``lanes`` (all when None) whose time (or last repeat) lies in [since, until], of
        ``kinds`` (all when None), in order (by sequence number)."""
        chosen = [self.lanes[k] for k in lanes if k in self.lanes] if lanes is not None else self.lanes.values()
        wanted = set(kinds) if kinds is not None else None
        out = [
            e
            for lane in chosen
            for e in lane.events
            if (wanted is None or e.kind in wanted)
            and (since is None or (e.last_ts or e.ts) >= since)
            and (until is None or e.ts <= until)
        ]
        return sorted(out, key=lambda e: e.seq)

    def gpu_lanes(self) -> list[Lane]:
        """Every GPU lane, by index (as last seen), then UUID."""
        lanes = [lane for k, lane in self.lanes.items() if k != NODE]
        return sorted(lanes, key=lambda lane: (_index(lane.identity.get("index")), lane.key))

    def find_lane(self, gpu: str) -> Lane | None:
        """The lane of a GPU named by UUID, NVML index (as last seen) or PCI bus id; the node lane for
        ``node``; None when no lane matches."""
        if gpu == NODE:
            return self.lane(NODE)
        if gpu in self.lanes:
            return self.lanes[gpu]
        for lane in self.gpu_lanes():
            ident = lane.identity
            if str(ident.get("index", "")) == gpu or str(ident.get("pci_bus_id", "")).lower() == gpu.lower():
                return lane
        return None

    # -- the file --------------------------------------------------------------------------------

    def changed(self) -> None:
        """Something changed: save soon (coalesced on the event loop), or now without a loop."""
        if not self.path or self._save_pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.save()
            return
        self._save_pending = True
        loop.call_later(SAVE_DELAY_S, self._save_later)

    def _save_later(self) -> None:
        self._save_pending = False
        self.save(wait=False)

    def flush(self) -> None:
        """Write what is pending now and wait for it, within the file's deadline (the shutdown)."""
        self._save_pending = False
        self.save(wait=True)

    def to_file(self) -> dict[str, Any]:
        """The file's content."""
        return {
            "version": timelinefile.FILE_VERSION,
            "next_seq": self.next_seq,
            "boot_id": self.boot_id,
            "meta": self.meta,
            "extra": self.extra,
            "lanes": {
                key: {
                    "identity": lane.identity,
                    "last": lane.last,
                    "evicted": lane.evicted,
                    "evicted_until": lane.evicted_until,
                    "events": [e.to_file() for e in lane.events],
                }
                for key, lane in self.lanes.items()
            },
        }

    def save(self, wait: bool | None = None) -> None:
        """Write the timeline atomically on the file's own thread; errors are logged once, never raised.

        Args:
            wait: wait for the write (at most :data:`~timelinefile.IO_DEADLINE_S`); None (the
                default) waits unless called on a running event loop, which a file never holds up.
        """
        if not self.path:
            return
        try:
            body = timelinefile.encode(self.to_file())  # here: the lanes change on this thread
        except Exception:  # noqa: BLE001 - our own bug: the timeline holds in memory, counted
            if self.on_error is not None:
                self.on_error("timeline", "writing the timeline file")
            else:
                self._warn_once("cannot encode it")
            return
        self._generation += 1
        late = self._io.write_behind(self._write, body, self._generation, wait=wait)
        if late is not None:
            self._warn_once(late)

    def _write(self, body: bytes, generation: int) -> None:
        """On the file's thread: write ``body`` unless a later save already reached the file (a write
        stuck on a hung mount that comes back late never overwrites a newer one)."""
        with self._write_lock:
            if generation <= self._written:
                return
            try:
                timelinefile.write_atomic(self.path, body)
            except OSError as exc:
                self._warn_once(exc)
                return
            self._written = generation

    def _warn_once(self, why: object) -> None:
        if not self._save_warned:
            log.warning("cannot write timeline file %s (%s); it will not survive a restart", self.path, why)
            self._save_warned = True

    def _load(self) -> None:
        if not self.path:
            return
        try:
            decoded = timelinefile.read(self.path, self._io)
        except ValueError as exc:
            log.error("timeline file %s unreadable (%s); starting with an empty timeline", self.path, exc)
            self.load_error = str(exc)
            return
        if decoded is None:
            return
        self.meta, self.extra, self.dropped = decoded.meta, decoded.extra, decoded.dropped
        self.lanes = decoded.lanes
        while len(self.lanes) > LANES_MAX:
            quiet = min((lane for k, lane in self.lanes.items() if k != NODE), key=lambda lane: lane.newest)
            del self.lanes[quiet.key]
        for key, event in sorted(decoded.events, key=lambda pair: pair[1].seq):
            if key in self.lanes:
                self._append(self.lanes[key], event)
        self.next_seq = decoded.next_seq
        if self.dropped:
            log.warning(
                "timeline file %s: dropped %d invalid entr%s (%s); the rest is kept",
                self.path,
                len(self.dropped),
                "y" if len(self.dropped) == 1 else "ies",
                "; ".join(self.dropped[:5]),
            )


def _index(value: Any) -> int:
    return int(value) if isinstance(value, str) and value.isdigit() else 1 << 30
