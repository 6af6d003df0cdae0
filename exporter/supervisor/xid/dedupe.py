"""One Xid, two witnesses: counting an Xid once when NVML's event and the kernel log both report it.

The NVML event thread (``nvmlEventSetWait_v2``, event type ``nvmlEventTypeXidCriticalError``) and
the kernel log (:mod:`exporter.supervisor.xid.reader`) see the same Xid at slightly different times: the event
arrives when the worker's thread wakes, the log line carries the driver's time. A report is paired
with the other source's report of the same GPU and Xid within a window, one-to-one.

Standard library only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Literal, NamedTuple

__all__ = ["Source", "XidDeduplicator", "XidSighting", "dedupe"]


class XidSighting(NamedTuple):
    """One report of an Xid, from either source, as `dedupe` and `XidDeduplicator` take it.

    Attributes:
        gpu: a key naming the GPU, the same for both sources (UUID, or NVML bus id).
        xid: the Xid number.
        wall_time: Unix time: arrival of an NVML event, or the kernel line's time.
    """

    gpu: str
    xid: int
    wall_time: float


Source = Literal["nvml", "kernel"]


class XidDeduplicator:
    """Counts an Xid once when both NVML and the kernel log report it.

    Every report is offered with its source. A report is a duplicate when a not yet paired
    report of the same GPU and Xid from the *other* source lies within ``window_s`` of it; the two
    are then paired and the second is dropped. Pairing is one-to-one, so three Xid 13 in a burst
    seen by both sources still count three. Feed both streams in any order.

    Args:
        window_s: largest time difference between the two reports of one Xid.
        retention_s: how long an unpaired report waits for its partner (relative to the newest
            time offered); keep it above the kernel-log polling delay.
    """

    def __init__(self, window_s: float = 5.0, retention_s: float = 120.0) -> None:
        if window_s < 0 or retention_s < window_s:
            raise ValueError("need 0 <= window_s <= retention_s")
        self.window_s = window_s
        self.retention_s = retention_s
        self._pending: dict[tuple[str, int], deque[tuple[float, Source]]] = {}
        self._newest = float("-inf")
        self.duplicates = 0
        """Reports dropped as duplicates so far."""

    def offer(self, source: Source, gpu: str, xid: int, wall_time: float) -> bool:
        """Offers one report.

        Args:
            source: ``"nvml"`` or ``"kernel"``.
            gpu: GPU key, the same key space for both sources.
            xid: Xid number.
            wall_time: Unix time of the report.

        Returns:
            True when this report is new and must be counted, False for a duplicate.
        """
        self._newest = max(self._newest, wall_time)
        self._prune()
        key = (gpu, xid)
        pending = self._pending.setdefault(key, deque())
        best: int | None = None
        for index, (seen, seen_source) in enumerate(pending):
            if seen_source != source and abs(seen - wall_time) <= self.window_s:
                if best is None or abs(seen - wall_time) < abs(pending[best][0] - wall_time):
                    best = index
        if best is not None:
            del pending[best]
            if not pending:
                del self._pending[key]
            self.duplicates += 1
            return False
        pending.append((wall_time, source))
        return True

    def offer_nvml(self, gpu: str, xid: int, wall_time: float) -> bool:
        """`offer` for an NVML event (``wall_time`` = its arrival)."""
        return self.offer("nvml", gpu, xid, wall_time)

    def offer_kernel(self, gpu: str, xid: int, wall_time: float) -> bool:
        """`offer` for a kernel-log event (``wall_time`` = its original time)."""
        return self.offer("kernel", gpu, xid, wall_time)

    def _prune(self) -> None:
        horizon = self._newest - self.retention_s
        for key in [k for k, q in self._pending.items() if q and max(t for t, _ in q) < horizon]:
            del self._pending[key]
        for queue in self._pending.values():
            while queue and queue[0][0] < horizon:
                queue.popleft()


def dedupe(
    nvml_events: Iterable[XidSighting],
    kernel_events: Iterable[XidSighting],
    window_s: float = 5.0,
) -> list[XidSighting]:
    """Returns the kernel sightings that no NVML sighting already accounts for.

    Batch form of `XidDeduplicator` for two complete lists: every NVML sighting counts, a kernel
    sighting is dropped when an NVML sighting of the same GPU and Xid lies within ``window_s``
    (one-to-one).

    Args:
        nvml_events: NVML sightings (``wall_time`` = arrival).
        kernel_events: kernel-log sightings (``wall_time`` = original time).
        window_s: largest time difference between the two reports of one Xid.

    Returns:
        The kernel sightings to count, in their input order.
    """
    dedup = XidDeduplicator(window_s=window_s, retention_s=float("inf"))
    for sighting in nvml_events:
        dedup.offer_nvml(*sighting)
    return [s for s in kernel_events if dedup.offer_kernel(*s)]
