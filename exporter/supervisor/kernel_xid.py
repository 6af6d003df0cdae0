"""The ``kernel_xid`` feature: Xid lines from ``/dev/kmsg`` (or a file), counted once.

A supervisor extension (:mod:`exporter.supervisor.extensions`). It reads new kernel-log records in a
thread (:class:`exporter.supervisor.xid.reader.KmsgReader`, which keeps a cursor across restarts)
when ``/dev/kmsg`` has some (``poll(2)`` says it is readable: an idle kernel log costs nothing), at
most every :data:`KMSG_POLL_S` seconds; a text log, or a device that cannot be polled, is read every
:data:`KMSG_POLL_S` seconds. It maps each Xid's PCI bus id to the GPU's UUID through the last snapshot,
and counts it unless the same Xid already arrived as an NVML event
(:class:`exporter.supervisor.xid.dedupe.XidDeduplicator`, both directions: :meth:`KernelXid.accept_xid`
filters the NVML side). The line's ``pid=`` and ``name=`` go with the Xid either way: on the
kernel record it counts, or onto the NVML event's record it duplicates. A kernel log that cannot be
read switches the feature off with reason
``unsupported``; nothing else is affected.

The two reports of one Xid are paired on the monotonic clock, not the wall clock: an NVML event at
its arrival (``time.monotonic()`` when the supervisor takes it, milliseconds after the worker's
thread woke), a kernel record at its time on the log's own clock (boot time + the record's
microseconds since boot, turned into monotonic time with the wall/monotonic offset taken once when
the log is first read). A wall-clock step after that therefore cannot pull the two apart or push
unrelated reports together; the exported ``nvgpu_xid_last_timestamp_seconds`` stays the event's
wall time. (A text log's own timestamps are wall-clock: they pair correctly only while the clock
has not stepped since the exporter started.)
A record's time comes from the log (``/dev/kmsg``: boot time plus the record's monotonic stamp; a
text log: its line prefix, which may be local time or a clock that was wrong). An Xid stamped later
than now is counted at the time it was read instead, since a time in the future would show as the
Xid's last time and defeat the match with its NVML event; each one is counted in
``nvgpu_readings_dropped_total{feature="kernel_xid",reason="timestamp_in_future"}`` and said once
per GPU. NVML's own Xid events carry no time (``nvmlEventData_t``): the worker stamps them as they
arrive, so they are never in the future.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import stat
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from exporter.common import fileio, plausibility
from exporter.common.collectors import identity
from exporter.common.logs import log_once
from exporter.common.metric import GpuKey, MetricDef, single
from exporter.supervisor.extensions import Extension, Host
from guards import features as gf

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric
    from exporter.common.snapshot import Snapshot
    from exporter.config import Config
    from exporter.supervisor.xid.parse import KernelXidEvent

log = logging.getLogger(__name__)
KMSG_POLL_S = 2.0  # at most one read of the kernel log this often (and every this often if it cannot be polled)
POLL_DEADLINE_S = 10.0  # a poll reads at most 4 MiB: longer than this is a hung mount
PENDING_MAX = 1000

KERNEL_LOG_UP = MetricDef(
    "nvgpu_kernel_log_up",
    "1 if the kernel_xid feature can read the kernel log (NVGPU_KMSG_PATH)",
    per_gpu=False,
)
METRICS = (KERNEL_LOG_UP,)


def bus_to_gpu(snapshot: Snapshot | None) -> dict[str, tuple[str, str]]:
    """PCI bus id (NVML form, upper case) -> (gpu index, uuid), from a snapshot's identity readings."""
    out: dict[str, tuple[str, str]] = {}
    for g in snapshot.gpus if snapshot else ():
        ident = g.reading(identity.Reading)
        if g.state == "removed":
            continue
        if ident and ident.pci_bus_id:
            out[ident.pci_bus_id.upper()] = (str(g.index), g.uuid)
    return out


class KernelXid(Extension):
    """Kernel-log Xids (see the module docstring)."""

    feature = "kernel_xid"
    metrics = (*METRICS, plausibility.DROPPED)

    def __init__(self, config: Config) -> None:
        from exporter.supervisor.xid.dedupe import XidDeduplicator
        from exporter.supervisor.xid.reader import KmsgReader

        cursor = config.kmsg_cursor_file or (
            os.path.join(os.path.dirname(config.state_file), "kmsg-cursor.json") if config.state_file else None
        )
        self.reader = KmsgReader(config.kmsg_path, cursor)
        self.io = fileio.Runner("nvgpu-kernel-log", deadline_s=None)  # polls are waited for, never abandoned
        self.dedupe = XidDeduplicator()
        self.up: bool | None = None
        self.pending: list[KernelXidEvent] = []  # events waiting for a bus id -> UUID mapping
        self._pollable: bool | None = None  # the open log is a character device that poll(2) takes
        self.wall_to_mono: float | None = None  # time.monotonic() - time.time() when the log was first read
        self.in_future: collections.Counter[tuple[str, str]] = collections.Counter()  # (gpu, uuid) -> Xids

    def accept_xid(self, uuid: str, xid: int, ts: float) -> bool:
        """An NVML event's Xid, offered at its arrival on the monotonic clock (``ts``, its wall
        time, is not compared: see the module docstring)."""
        return self.dedupe.offer_nvml(uuid, xid, time.monotonic())

    def _mono(self, wall: float | None) -> float:
        """A kernel record's time on the monotonic clock (now, when it has none)."""
        if wall is None:
            return time.monotonic()
        if self.wall_to_mono is None:
            self.wall_to_mono = time.monotonic() - time.time()
        return wall + self.wall_to_mono

    def self_families(self) -> Iterable[Metric]:
        return [single(KERNEL_LOG_UP, None if self.up is None else int(self.up))]

    async def _poll(self, host: Host) -> list[KernelXidEvent]:
        """One poll of the reader on the kernel log's own daemon thread (never the loop's default
        executor, which a shutdown would wait for). A poll that has not answered within
        :data:`POLL_DEADLINE_S` (a text log or cursor on a hung mount) turns ``nvgpu_kernel_log_up``
        0 and is logged once; the reader is not thread-safe, so no other poll starts until it
        answers."""
        future = self.io.submit(self.reader.poll)
        wrapped = asyncio.wrap_future(future)
        try:
            return await asyncio.wait_for(asyncio.shield(wrapped), POLL_DEADLINE_S)
        except asyncio.TimeoutError:
            fileio.count_failure("kernel_log", fileio.TimedOut())
            self.up = False
            host.changed()
            log_once(
                log,
                logging.WARNING,
                ("kmsg-stuck", self.reader.path),
                "kernel_xid: reading %s (or its cursor) did not answer within %g s (a hung mount?); waiting for it",
                self.reader.path,
                POLL_DEADLINE_S,
            )
            return await wrapped

    def gpu_families(self, snapshot: Snapshot) -> Iterable[Metric]:
        """Kernel-log Xids stamped in the future, per GPU, in the readings' drop family."""
        counted = sorted(self.in_future.items())
        return plausibility.families(
            [(GpuKey(g, u), {self.feature: {"timestamp_in_future": n}}) for (g, u), n in counted]
        )

    def _time_of(self, gpu: str, uuid: str, ev: KernelXidEvent) -> float:
        """The record's time, or now for one stamped in the future (counted, said once per GPU).
        "In the future" is judged on the monotonic clock (the record's time on the log's own clock
        against now), so a wall clock stepped back since the log was first read does not make the
        records after it look ahead."""
        now = time.time()
        if ev.wall_time is None:
            return now
        ahead = self._mono(ev.wall_time) - time.monotonic()
        if ahead <= plausibility.FUTURE_TOLERANCE_S:
            return ev.wall_time
        self.in_future[(gpu, uuid)] += 1
        log_once(
            log,
            logging.WARNING,
            ("kmsg-future", uuid),
            "kernel log Xid %d on GPU %s is stamped %.0f s in the future; counted at the time it was read "
            '(nvgpu_readings_dropped_total{feature="kernel_xid",reason="timestamp_in_future"}); a text log in '
            "local time, or a clock set back before the line was written",
            ev.xid,
            uuid,
            ahead,
            extra={"uuid": uuid, "xid": ev.xid},
        )
        return now

    def count(self, host: Host, events: list[KernelXidEvent]) -> None:
        """Count new kernel-log Xids; those seen before any snapshot wait for the bus id mapping."""
        mapping = bus_to_gpu(host.snapshot)
        keep = []
        for ev in [*self.pending, *events]:
            where = mapping.get(ev.pci_bus_id.upper())
            if where is None:
                if not mapping:
                    keep.append(ev)  # no snapshot yet: wait for the bus id -> UUID mapping
                else:
                    log_once(
                        log,
                        logging.WARNING,
                        ("kmsg-bus", ev.pci_bus_id),
                        "kernel log Xid %d for PCI %s, which is not one of this node's GPUs as NVML sees them",
                        ev.xid,
                        ev.pci_bus_id,
                    )
                continue
            gpu, uuid = where
            ts = self._time_of(gpu, uuid, ev)
            if self.dedupe.offer_kernel(uuid, ev.xid, self._mono(ev.wall_time)):
                host.record_xid(gpu, uuid, ev.xid, ts, "kernel log", ev.pid, ev.process_name or "")
            else:  # counted from its NVML event already: that record gets the kernel line's process
                host.attribute_xid(uuid, ev.xid, ts, ev.pid, ev.process_name or "")
        self.pending = keep[-PENDING_MAX:]
        if events:
            host.changed()

    async def run(self, host: Host) -> None:
        from exporter.supervisor.xid.reader import KernelLogUnavailable

        while True:
            polled_at = time.monotonic()
            try:
                events = await self._poll(host)
            except KernelLogUnavailable as exc:
                self.up = False
                detail = f"kernel log unreadable: {exc}"
                host.set_feature_state(gf.FeatureState(self.feature, False, gf.Reason.UNSUPPORTED, detail))
                log.warning("kernel_xid: %s; the feature is off (unsupported), nothing else is affected", exc)
                host.changed()
                return
            self.up = True
            if self.wall_to_mono is None:  # right after the reader took boot time from the wall clock
                self.wall_to_mono = time.monotonic() - time.time()
            if events or self.pending:
                self.count(host, events)
            await asyncio.sleep(max(0.0, KMSG_POLL_S - (time.monotonic() - polled_at)))
            await self._readable()

    async def _readable(self) -> None:
        """Return once ``/dev/kmsg`` has a record to read (at once for a text log, or a device that
        ``poll(2)`` does not take, such as ``/dev/zero``: those are read on the timer)."""
        from exporter.supervisor.xid.reader import KernelLogUnavailable

        try:
            fd = self.reader.fileno()
        except KernelLogUnavailable:  # not open (it opens on the next read): the timer decides
            return
        if self._pollable is None:
            self._pollable = stat.S_ISCHR(os.fstat(fd).st_mode)
        if not self._pollable:
            return
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        try:
            loop.add_reader(fd, lambda: None if ready.done() else ready.set_result(None))
        except (OSError, ValueError, NotImplementedError):  # EPERM: a device without poll support
            self._pollable = False
            return
        try:
            await ready
        finally:
            with contextlib.suppress(OSError, ValueError):
                loop.remove_reader(fd)
