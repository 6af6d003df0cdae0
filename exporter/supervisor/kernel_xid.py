"""The ``kernel_xid`` feature: Xid lines from ``/dev/kmsg`` (or a file), counted once.

A supervisor extension (:mod:`exporter.supervisor.extensions`). It reads new kernel-log records in a
thread (:class:`exporter.supervisor.xid.reader.KmsgReader`, which keeps a cursor across restarts)
when ``/dev/kmsg`` has some (``poll(2)`` says it is readable: an idle kernel log costs nothing), at
most every :data:`KMSG_POLL_S` seconds; a text log, or a device that cannot be polled, is read every
:data:`KMSG_POLL_S` seconds. It maps each Xid's PCI bus id to the GPU's UUID through the last snapshot,
and counts it unless the same Xid already arrived as an NVML event
(:class:`exporter.supervisor.xid.dedupe.XidDeduplicator`, both directions: :meth:`KernelXid.accept_xid`
filters the NVML side). A kernel log that cannot be read switches the feature off with reason
``unsupported``; nothing else is affected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from exporter.common.collectors import identity
from exporter.common.logs import log_once
from exporter.common.metric import MetricDef, single
from exporter.supervisor.extensions import Extension, Host
from guards import features as gf

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric
    from exporter.common.snapshot import Snapshot
    from exporter.config import Config
    from exporter.supervisor.xid.parse import KernelXidEvent

log = logging.getLogger(__name__)
KMSG_POLL_S = 2.0  # at most one read of the kernel log this often (and every this often if it cannot be polled)
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
        if ident and ident.pci_bus_id:
            out[ident.pci_bus_id.upper()] = (str(g.index), g.uuid)
    return out


class KernelXid(Extension):
    """Kernel-log Xids (see the module docstring)."""

    feature = "kernel_xid"
    metrics = METRICS

    def __init__(self, config: Config) -> None:
        from exporter.supervisor.xid.dedupe import XidDeduplicator
        from exporter.supervisor.xid.reader import KmsgReader

        cursor = config.kmsg_cursor_file or (
            os.path.join(os.path.dirname(config.state_file), "kmsg-cursor.json") if config.state_file else None
        )
        self.reader = KmsgReader(config.kmsg_path, cursor)
        self.dedupe = XidDeduplicator()
        self.up: bool | None = None
        self.pending: list[KernelXidEvent] = []  # events waiting for a bus id -> UUID mapping
        self._pollable: bool | None = None  # the open log is a character device that poll(2) takes

    def accept_xid(self, uuid: str, xid: int, ts: float) -> bool:
        return self.dedupe.offer_nvml(uuid, xid, ts)

    def self_families(self) -> Iterable[Metric]:
        return [single(KERNEL_LOG_UP, None if self.up is None else int(self.up))]

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
            ts = ev.wall_time or time.time()
            if self.dedupe.offer_kernel(uuid, ev.xid, ts):
                host.record_xid(gpu, uuid, ev.xid, ts, source="kernel log")
        self.pending = keep[-PENDING_MAX:]
        if events:
            host.changed()

    async def run(self, host: Host) -> None:
        from exporter.supervisor.xid.reader import KernelLogUnavailable

        while True:
            polled_at = time.monotonic()
            try:
                events = await asyncio.to_thread(self.reader.poll)
            except KernelLogUnavailable as exc:
                self.up = False
                detail = f"kernel log unreadable: {exc}"
                host.set_feature_state(gf.FeatureState(self.feature, False, gf.Reason.UNSUPPORTED, detail))
                log.warning("kernel_xid: %s; the feature is off (unsupported), nothing else is affected", exc)
                host.changed()
                return
            self.up = True
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
