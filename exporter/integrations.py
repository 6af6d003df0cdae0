"""Supervisor-side concerns that are not NVML: stuck signature, kernel-log Xids, pod attribution.

:func:`attach` wires each enabled concern into the supervisor (snapshot hooks, family hooks,
feature-state overrides) and returns the coroutines to run beside it. None of them waits on NVML;
blocking reads (the kernel log, the kubelet's gRPC socket) run in a thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Coroutine, Iterable
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.config import Config
from exporter.logs import log_once
from exporter.stuck import StuckDetector
from exporter.supervisor import Supervisor

log = logging.getLogger(__name__)
KMSG_POLL_S = 2.0


def _enabled(supervisor: Supervisor, feature: str) -> bool:
    state = supervisor.feature_states().get(feature)
    return bool(state and state["enabled"])


def _bus_to_gpu(supervisor: Supervisor) -> dict[str, tuple[str, str]]:
    """PCI bus id (NVML form, upper case) -> (gpu index, uuid), from the last snapshot."""
    snap = supervisor.last_snapshot
    out: dict[str, tuple[str, str]] = {}
    if snap is None:
        return out
    for g in snap["gpus"]:
        bus = g["readings"].get("identity", {}).get("pci_bus_id")
        if bus:
            out[bus.upper()] = (str(g["index"]), g["uuid"])
    return out


class KernelXid:
    """The ``kernel_xid`` feature: Xid lines from ``/dev/kmsg`` (or a file), counted once."""

    def __init__(self, supervisor: Supervisor, config: Config) -> None:
        from exporter.xid.kmsg import KmsgReader, XidDeduplicator

        self.supervisor = supervisor
        cursor = config.kmsg_cursor_file or (
            os.path.join(os.path.dirname(config.state_file), "kmsg-cursor.json") if config.state_file else None
        )
        self.reader = KmsgReader(config.kmsg_path, cursor)
        self.dedupe = XidDeduplicator()
        self.up: bool | None = None
        self.pending: list[Any] = []  # events waiting for a bus id -> UUID mapping
        supervisor.xid_filter = self.nvml_filter
        supervisor.self_family_hooks.append(self.families)

    def nvml_filter(self, gpu: str, uuid: str, xid: int, ts: float) -> bool:
        return self.dedupe.offer_nvml(uuid, xid, ts)

    def families(self) -> Iterable[Metric]:
        fam = GaugeMetricFamily(
            "nvgpu_kernel_log_up", "1 if the kernel_xid feature can read the kernel log (NVGPU_KMSG_PATH)"
        )
        if self.up is not None:
            fam.add_metric([], 1.0 if self.up else 0.0)
        return [fam]

    def _count(self, events: list[Any]) -> None:
        mapping = _bus_to_gpu(self.supervisor)
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
                self.supervisor.record_xid(gpu, uuid, ev.xid, ts, source="kernel log")
        self.pending = keep[-1000:]
        if events:
            self.supervisor._changed()

    async def run(self) -> None:
        from exporter.xid.kmsg import KernelLogUnavailable

        while True:
            try:
                events = await asyncio.to_thread(self.reader.poll)
            except KernelLogUnavailable as exc:
                self.up = False
                self.supervisor.state_overrides["kernel_xid"] = {
                    "enabled": False,
                    "reason": "unsupported",
                    "detail": f"kernel log unreadable: {exc}",
                }
                log.warning("kernel_xid: %s; the feature is off (unsupported), nothing else is affected", exc)
                self.supervisor._changed()
                return
            self.up = True
            if events or self.pending:
                self._count(events)
            await asyncio.sleep(KMSG_POLL_S)


class PodAttribution:
    """The ``pod_attribution`` feature: GPU UUID -> namespace/pod/container from the kubelet."""

    def __init__(self, supervisor: Supervisor, config: Config) -> None:
        self.supervisor = supervisor
        self.config = config
        self.assignments: dict[str, tuple[Any, ...]] = {}
        self.up: bool | None = None
        self._last_error: str | None = None
        supervisor.gpu_family_hooks.append(self.families)
        supervisor.self_family_hooks.append(self.self_families)
        if config.pod_labels:
            supervisor.pod_labels = self.labels_for

    def labels_for(self, uuid: str) -> tuple[str, str, str]:
        """(namespace, pod, container) when exactly one container holds the GPU, else empty."""
        refs = self.assignments.get(uuid, ())
        if len(refs) == 1:
            r = refs[0]
            return (r.namespace, r.pod, r.container)
        return ("", "", "")

    def families(self, snap: dict[str, Any]) -> Iterable[Metric]:
        info = GaugeMetricFamily(
            "nvgpu_gpu_pod_info",
            "Pods holding the GPU (kubelet PodResources List); one series per container; value is always 1",
            labels=["gpu", "uuid", "namespace", "pod", "container"],
        )
        index = {g["uuid"]: str(g["index"]) for g in snap["gpus"]}
        for uuid, refs in sorted(self.assignments.items()):
            if uuid not in index:
                continue
            for r in refs:
                info.add_metric([index[uuid], uuid, r.namespace, r.pod, r.container], 1.0)
        return [info]

    def self_families(self) -> Iterable[Metric]:
        fam = GaugeMetricFamily(
            "nvgpu_pod_attribution_up", "1 if the kubelet PodResources socket answered the last List"
        )
        if self.up is not None:
            fam.add_metric([], 1.0 if self.up else 0.0)
        return [fam]

    async def run(self) -> None:
        from exporter.podresources import PodResourcesClient, PodResourcesError, unsupported_reason

        reason = unsupported_reason()
        if reason is not None:
            self.up = False
            self.supervisor.state_overrides["pod_attribution"] = {
                "enabled": False,
                "reason": "unsupported",
                "detail": reason,
            }
            log.warning("pod_attribution unsupported: %s", reason)
            self.supervisor._changed()
            return
        client = PodResourcesClient(self.config.pod_resources_socket, timeout_s=min(5.0, self.config.pod_refresh_s))
        try:
            while True:
                before = (self.up, self.assignments)
                try:
                    self.assignments = await asyncio.to_thread(client.list_gpu_assignments)
                    if self.up is False:
                        log.info("pod_attribution: kubelet socket %s answers again", self.config.pod_resources_socket)
                    self.up, self._last_error = True, None
                except PodResourcesError as exc:
                    if self._last_error != str(exc):
                        log.warning("pod_attribution: %s; nvgpu_pod_attribution_up is 0, nothing else changes", exc)
                    self.up, self._last_error = False, str(exc)
                    self.assignments = {}
                if (self.up, self.assignments) != before:
                    self.supervisor._changed()  # re-render only when something changed
                await asyncio.sleep(self.config.pod_refresh_s)
        finally:
            client.close()


def attach(supervisor: Supervisor, config: Config) -> list[Coroutine[Any, Any, None]]:
    """Wire the concerns into ``supervisor``; returns the background coroutines to run."""
    stuck = StuckDetector(config.stuck_utilization, config.stuck_memory_bytes, config.stuck_after_s)
    supervisor.snapshot_hooks.append(stuck.feed)
    supervisor.gpu_family_hooks.append(stuck.families)
    supervisor.stuck_state = stuck.suspected
    tasks: list[Coroutine[Any, Any, None]] = []
    if _enabled(supervisor, "kernel_xid"):
        tasks.append(KernelXid(supervisor, config).run())
    if _enabled(supervisor, "pod_attribution"):
        tasks.append(PodAttribution(supervisor, config).run())
    return tasks
