"""The ``pod_attribution`` feature: which pods hold each GPU, and how much of it each uses.

A supervisor extension (:mod:`exporter.supervisor.extensions`). Every ``NVGPU_POD_REFRESH_SECONDS`` it asks
the kubelet's PodResources v1 ``List`` (in a thread: a blocking gRPC call with a deadline) which
containers hold which GPU, and re-renders only when the answer changed. It exports one
``nvgpu_gpu_pod_info`` series per container per GPU; with ``NVGPU_POD_LABELS=true`` it also adds
``namespace``/``pod``/``container`` to every per-GPU series of a GPU held by exactly one container
(empty values for a shared or free GPU: join ``nvgpu_gpu_pod_info`` for those).

MIG devices: the kubelet names a MIG device by its ``MIG-…`` UUID (or, from drivers
before R470, ``MIG-GPU-<parent UUID>/<GPU instance>/<compute instance>``). It is mapped to its
parent GPU and instance through the MIG layout the worker reported (:mod:`exporter.common.collectors.mig`):
``nvgpu_gpu_pod_info`` carries the parent's ``gpu``/``uuid`` and the instance labels
(``gpu_instance_id``, ``compute_instance_id``, ``mig_profile``, ``mig_uuid``; empty for a whole
or shared GPU). A device id that cannot be mapped (not a UUID: the device plugin's
``deviceIDStrategy=index``; a GPU this exporter does not see; a MIG device in no GPU's layout) is
never dropped silently: ``nvgpu_pod_attribution_unmapped_devices{reason}`` counts them (distinct
ids in the kubelet's last answer) and each is logged once.

Dynamic Resource Allocation: a GPU allocated through a ResourceClaim is attributed like a
device-plugin GPU once its UUID is known, from the device's CDI names or from the DRA driver's
ResourceSlice (the opt-in ``NVGPU_DRA_RESOURCESLICES``: :mod:`exporter.supervisor.podresources.resourceslices`);
a device of a GPU driver neither names is counted under ``reason="dra_unresolved"`` and logged
once with its claim (:func:`exporter.supervisor.podresources.client.assignments`).

Per-pod usage (``nvgpu_pod_memory_used_bytes``, ``nvgpu_pod_sm_utilization_ratio``): the kubelet
says which pods hold a GPU, not how much of it each uses (time-slicing and MPS share one GPU
between pods). The worker's processes collector sums memory and SM utilization of each GPU's
processes per pod UID, found through ``/proc/<pid>/cgroup`` (needs ``hostPID``), and names the
pods it can through the kubelet's ``/var/log/containers`` (:mod:`exporter.worker.containerlogs`). This
extension joins that with PodResources (:func:`pod_usage`): a GPU's one unnamed pod UID is the one
holder not named otherwise; a holder without processes uses 0 (only when processes are visible at
all); what stays unnamed is summed under ``namespace=""``, ``pod=""``. Series exist only for pods
that hold or use a GPU. Which sources work is exported (``nvgpu_pod_attribution_source_up``) and
logged once per change.

The device plugin's view of the GPU count: at most every ``ALLOCATABLE_EVERY_S`` (and at once after
the kubelet answers again) the extension asks PodResources ``GetAllocatableResources`` which devices
the node offers, and serves ``nvgpu_gpus{view="device_plugin"}`` (through
:meth:`PodAttribution.gpu_count_views`): the distinct whole GPUs behind them. A time-sliced
replica ``GPU-…::3`` is its GPU; a MIG device is its parent GPU, found from the legacy id
``MIG-GPU-<parent>/<gi>/<ci>`` itself or, for a ``MIG-<uuid>``, from the MIG layout the worker
reported (:class:`Layout`); each parent counts once. A device that cannot be mapped to a parent (a
``MIG-<uuid>`` in no GPU's layout, an id that is not a UUID) is counted in
``view="device_plugin_unmapped"`` (distinct device ids), never dropped. Both views are absent while
the kubelet does not answer, before Kubernetes 1.21 (the call is UNIMPLEMENTED) or when the call
fails; each such reason is logged once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from exporter.common.collectors import mig, processes
from exporter.common.collectors.base import percent_to_ratio
from exporter.common.logs import log_once
from exporter.common.metric import GpuKey, MetricDef, single
from exporter.supervisor.extensions import Extension, Host
from guards import features as gf

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric
    from exporter.common.snapshot import Snapshot
    from exporter.config import Config
    from exporter.supervisor.podresources import DraDevice, PodRef

log = logging.getLogger(__name__)

GPU_POD_INFO = MetricDef(
    "nvgpu_gpu_pod_info",
    "Pods holding the GPU or one of its MIG devices (kubelet PodResources List); one series per container and "
    "device; the instance labels are empty for a whole or shared GPU; value is always 1",
    ("namespace", "pod", "container", *mig.DEVICE_LABELS),
)
UNMAPPED = MetricDef(
    "nvgpu_pod_attribution_unmapped_devices",
    "GPU device ids the kubelet assigned to pods that cannot be mapped to a GPU or MIG device of this exporter "
    "(distinct ids in the last List answer): not_a_uuid (deviceIDStrategy=index), unknown_gpu, "
    "unknown_mig_device, dra_unresolved (a ResourceClaim's GPU whose UUID neither its CDI names nor the "
    "driver's ResourceSlice give); each is logged once",
    ("reason",),
    per_gpu=False,
)
UNMAPPED_REASONS = ("not_a_uuid", "unknown_gpu", "unknown_mig_device", "dra_unresolved")
POD_ATTRIBUTION_UP = MetricDef(
    "nvgpu_pod_attribution_up", "1 if the kubelet PodResources socket answered the last List", per_gpu=False
)
POD_MEMORY = MetricDef(
    "nvgpu_pod_memory_used_bytes",
    "GPU memory used by the pod's processes on this GPU (usedGpuMemory of nvmlDeviceGet*RunningProcesses, "
    "process -> pod via /proc/<pid>/cgroup); namespace and pod empty: pods that cannot be named",
    ("namespace", "pod"),
)
POD_SM = MetricDef(
    "nvgpu_pod_sm_utilization_ratio",
    "Sum of the SM utilization of the pod's processes on this GPU (smUtil of nvmlDeviceGetProcessUtilization); "
    "may exceed 1 when MPS runs their kernels concurrently",
    ("namespace", "pod"),
)
SOURCE_UP = MetricDef(
    "nvgpu_pod_attribution_source_up",
    "1 if a source of per-pod usage works: proc (GPU processes resolve in /proc: hostPID), "
    "container_logs (the kubelet's /var/log/containers names containers)",
    ("source",),
    per_gpu=False,
)
METRICS = (GPU_POD_INFO, POD_ATTRIBUTION_UP, POD_MEMORY, POD_SM, SOURCE_UP, UNMAPPED)
SOURCES = ("proc", "container_logs")

PodName = tuple[str, str]  # (namespace, pod); ("", "") = pods that cannot be named

ALLOCATABLE_EVERY_S = 60.0  # GetAllocatableResources at most this often (and after a reconnect)


def _add(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


def pod_usage(reading: processes.Reading, holders: set[PodName]) -> dict[PodName, tuple[int | None, int | None]]:
    """Memory (bytes) and SM utilization (percent, summed) per pod on one GPU.

    Args:
        reading: the GPU's processes reading (``pods``, ``pod_names``, ``sources``, ``functions``).
        holders: (namespace, pod) of the pods the kubelet says hold this GPU.

    Returns:
        (namespace, pod) -> (memory bytes, SM percent); None where unknown. Pods named by the
        worker come first; one remaining unnamed pod UID is the one remaining holder; holders
        with no process use 0 when processes are visible and nothing else is unnamed; the rest
        of the unnamed pods are summed under ("", "").
    """
    named: dict[PodName, tuple[int | None, int | None]] = {}
    unnamed: list[tuple[int | None, int | None]] = []
    for uid, (mem, sm, _n) in sorted(reading.pods.items()):
        name = reading.pod_names.get(uid)
        if name is None:
            unnamed.append((mem, sm))
            continue
        have = named.get(name, (None, None))
        named[name] = (_add(have[0], mem), _add(have[1], sm))
    free = sorted(holders - set(named))
    if len(unnamed) == 1 and len(free) == 1:
        named[free[0]] = unnamed.pop()
        free = []
    if not unnamed and reading.sources.get("proc"):
        idle_sm = 0 if ("utilization" in reading.functions or not reading.pods) else None
        for holder in free:
            named[holder] = (0, idle_sm)
    if unnamed:
        named[("", "")] = (
            _sum(m for m, _ in unnamed),
            _sum(s for _, s in unnamed),
        )
    return named


_NO_INSTANCE = ("", "", "", "")


class Layout:
    """Where each GPU and MIG device of a snapshot is: the join from kubelet device ids to series.

    Attributes:
        gpus: GPU UUID -> NVML index.
        devices: MIG UUID, and its legacy form ``MIG-GPU-<parent>/<gi>/<ci>`` -> (parent key,
            instance labels ``(gpu_instance_id, compute_instance_id, mig_profile, mig_uuid)``).
    """

    def __init__(self, snapshot: Snapshot) -> None:
        self.gpus = {g.uuid: g.index for g in snapshot.gpus if g.uuid and g.state != "removed"}  # by UUID
        self.devices: dict[str, tuple[GpuKey, tuple[str, str, str, str]]] = {}
        for g in snapshot.gpus:
            state = g.reading(mig.Reading)
            if state is None:
                continue
            key = GpuKey(str(g.index), g.uuid)
            for d in state.devices:
                labels = (
                    str(d.gpu_instance_id),
                    str(d.compute_instance_id),
                    state.device_profile(d),
                    d.uuid,
                )
                self.devices[d.uuid] = (key, labels)
                self.devices[f"MIG-{g.uuid}/{d.gpu_instance_id}/{d.compute_instance_id}"] = (key, labels)

    def parent_of(self, uuid: str) -> str | None:
        """The UUID of the whole GPU behind a kubelet device UUID (a GPU is its own parent), or None
        when a ``MIG-<uuid>`` is in no GPU's layout."""
        if uuid.startswith("MIG-") and not uuid.startswith("MIG-GPU-"):
            where = self.devices.get(uuid)
            return None if where is None else where[0].uuid
        return _parent_without_layout(uuid)

    def place(self, uuid: str) -> tuple[GpuKey, tuple[str, str, str, str]] | str:
        """(parent key, instance labels) of a kubelet device UUID, or why it cannot be placed."""
        if uuid.startswith("MIG-"):
            return self.devices.get(uuid, "unknown_mig_device")
        if uuid in self.gpus:
            return GpuKey(str(self.gpus[uuid]), uuid), _NO_INSTANCE
        return "unknown_gpu"


def _parent_without_layout(uuid: str) -> str | None:
    """:meth:`Layout.parent_of` without a MIG layout (before the first snapshot)."""
    if uuid.startswith("MIG-GPU-"):
        return uuid[len("MIG-") :].split("/", 1)[0]  # legacy MIG-GPU-<parent>/<gi>/<ci>: the id says it
    return None if uuid.startswith("MIG-") else uuid


def _sum(values: Iterable[int | None]) -> int | None:
    total: int | None = None
    for v in values:
        total = _add(total, v)
    return total


def _level() -> int:
    """WARNING in a Kubernetes pod (a missing kubelet socket is a deployment fault there), INFO
    elsewhere (a workstation or a bare-metal host has no kubelet: pod attribution is moot)."""
    return logging.WARNING if os.environ.get("KUBERNETES_SERVICE_HOST") else logging.INFO


class PodAttribution(Extension):
    """Pod attribution (see the module docstring)."""

    feature = "pod_attribution"
    metrics = METRICS

    def __init__(self, config: Config) -> None:
        self.config = config
        self.relabels_gpus = config.pod_labels
        self.assignments: dict[str, tuple[PodRef, ...]] = {}
        self.unparsed: dict[str, tuple[PodRef, ...]] = {}  # GPU device ids that are not UUIDs
        self.dra_unresolved: dict[DraDevice, tuple[PodRef, ...]] = {}  # ResourceClaim GPUs without a UUID
        self.dra_uuids: dict[tuple[str, str, str], str] = {}  # (driver, pool, device) -> UUID: ResourceSlices
        self.layout: Layout | None = None  # of the last snapshot
        self.up: bool | None = None
        self._last_error: str | None = None
        self.sources: dict[str, int] = {}  # from the last snapshot's processes readings
        # GetAllocatableResources: ({GPU/MIG UUID: ids}, ids that are not UUIDs); None: not known
        self.allocatable: tuple[dict[str, int], tuple[str, ...]] | None = None
        self._logged_sources: tuple[object, ...] | None = None

    def gpu_labels(self, uuid: str) -> tuple[str, str, str]:
        """(namespace, pod, container) when exactly one container holds the GPU, else empty."""
        refs = self.assignments.get(uuid, ())
        if len(refs) == 1:
            r = refs[0]
            return (r.namespace, r.pod, r.container)
        return ("", "", "")

    def on_snapshot(self, snapshot: Snapshot) -> None:
        """Which per-pod sources work (any GPU's reading), logged once per change; where each GPU
        and MIG device is."""
        self.layout = Layout(snapshot)
        sources: dict[str, int] = {}
        for g in snapshot.gpus:
            r = g.reading(processes.Reading)
            for name, up in (r.sources if r else {}).items():
                sources[name] = max(sources.get(name, 0), up)
        self.sources = sources
        self._log_sources()

    def gpu_count_views(self) -> dict[str, int]:
        """``device_plugin``: distinct whole GPUs behind the devices the kubelet can allocate;
        ``device_plugin_unmapped``: device ids that cannot be mapped to one. Empty when unknown."""
        if not self.up or self.allocatable is None:
            return {}
        uuids, unparsed = self.allocatable
        parents: set[str] = set()
        unmapped = set(unparsed)
        for uuid in uuids:
            parent = self.layout.parent_of(uuid) if self.layout is not None else _parent_without_layout(uuid)
            if parent is None:
                unmapped.add(uuid)
                log_once(
                    log,
                    logging.WARNING,
                    ("allocatable-unmapped", uuid),
                    "pod attribution: the kubelet offers MIG device %s, in no GPU's MIG layout: counted in "
                    'nvgpu_gpus{view="device_plugin_unmapped"}',
                    uuid,
                    extra={"device_id": uuid},
                )
            else:
                parents.add(parent)
        return {"device_plugin": len(parents), "device_plugin_unmapped": len(unmapped)}

    async def _read_allocatable(self, client: Any) -> bool:
        """Ask GetAllocatableResources; True when the answer changed. A failure leaves the views
        absent and is logged once per reason."""
        from exporter.supervisor.podresources import PodResourcesError

        before = self.allocatable
        try:
            found = await asyncio.to_thread(client.allocatable)
            if found is None:
                log_once(
                    log,
                    logging.INFO,
                    ("allocatable", "unimplemented"),
                    "pod attribution: this kubelet does not serve GetAllocatableResources (Kubernetes before 1.21 "
                    'or its feature gate off): nvgpu_gpus{view="device_plugin"} is absent',
                )
            self.allocatable = found
        except PodResourcesError as exc:
            log_once(
                log,
                logging.WARNING,
                ("allocatable", exc.reason),
                'pod attribution: %s; nvgpu_gpus{view="device_plugin"} is absent until it answers',
                exc,
            )
            self.allocatable = None
        return self.allocatable != before

    def _log_sources(self) -> None:
        state = (self.up, tuple(sorted(self.sources.items())))
        if not self.sources or state == self._logged_sources:
            return
        self._logged_sources = state
        said = {True: "yes", False: "no", None: "not yet"}
        proc, logs = self.sources.get("proc"), self.sources.get("container_logs")
        proc_path, log_dir = self.config.proc_path, self.config.container_log_dir
        if not proc_path:
            via_proc = "off (NVGPU_PROC_PATH is empty)"
        else:
            via_proc = f"{proc_path}/<pid>/cgroup: " + (
                "yes" if proc else "no (needs hostPID: true; docs/kubernetes.md)"
            )
        if not log_dir:
            via_logs = "off (NVGPU_CONTAINER_LOG_DIR is empty)"
        else:
            via_logs = f"{log_dir}: " + ("yes" if logs else "no (mount it read-only to name pods that share a GPU)")
        log.info(
            "per-pod GPU usage: kubelet PodResources (which pods hold each GPU): %s; processes -> pods through %s; "
            "pod names through %s",
            said[self.up],
            via_proc,
            via_logs,
            extra={"pod_resources": self.up, "proc": bool(proc), "container_logs": bool(logs)},
        )

    def placed(self, layout: Layout) -> tuple[list[tuple[GpuKey, PodRef, tuple[str, ...]]], dict[str, set[str]]]:
        """(every container's device placed on its GPU with instance labels, reason -> device ids that
        cannot be placed); each id that cannot be placed is logged once."""
        rows: list[tuple[GpuKey, PodRef, tuple[str, ...]]] = []
        unmapped: dict[str, set[str]] = {reason: set() for reason in UNMAPPED_REASONS}
        missing = [(i, refs, "not_a_uuid") for i, refs in self.unparsed.items()]
        missing += [(dev.describe(), refs, "dra_unresolved") for dev, refs in self.dra_unresolved.items()]
        for uuid, refs in sorted(self.assignments.items()):
            where = layout.place(uuid)
            if isinstance(where, str):
                missing.append((uuid, refs, where))
                continue
            rows.extend((where[0], r, where[1]) for r in refs)
        for device_id, refs, reason in missing:
            unmapped[reason].add(device_id)
            holders = ", ".join(f"{r.namespace}/{r.pod}/{r.container}" for r in refs)
            log_once(
                log,
                logging.WARNING,
                ("pod-unmapped", device_id, reason),
                "pod attribution: device id %s held by %s cannot be mapped to a GPU or MIG device of this node "
                "(%s); counted in nvgpu_pod_attribution_unmapped_devices",
                device_id,
                holders,
                {
                    "not_a_uuid": "not a UUID: is the NVIDIA device plugin set to deviceIDStrategy=index?",
                    "unknown_gpu": "NVML does not list this GPU",
                    "unknown_mig_device": "in no GPU's MIG layout: created since the last sample, or MIG feature off",
                    "dra_unresolved": "a DRA device whose CDI names carry no UUID; set NVGPU_DRA_RESOURCESLICES=true "
                    "(deploy/kubernetes/components/dra-resourceslices) to read it from the driver's ResourceSlice",
                }[reason],
                extra={"device_id": device_id, "reason": reason},
            )
        return rows, unmapped

    def gpu_families(self, snapshot: Snapshot) -> Iterable[Metric]:
        info, memory, sm = GPU_POD_INFO.family(), POD_MEMORY.family(), POD_SM.family()
        rows, _ = self.placed(Layout(snapshot))
        for key, r, instance in rows:
            info.add(key, 1, r.namespace, r.pod, r.container, *instance)
        for g in snapshot.gpus:
            reading = g.reading(processes.Reading)
            if reading is None or not g.up:
                continue
            key = GpuKey(str(g.index), g.uuid)
            holders = {(r.namespace, r.pod) for r in self.assignments.get(g.uuid, ())}
            for (namespace, pod), (mem, sm_percent) in sorted(pod_usage(reading, holders).items()):
                memory.add(key, mem, namespace, pod)
                sm.add(key, None if sm_percent is None else percent_to_ratio(sm_percent), namespace, pod)
        return [info.always(), *memory.done(), *sm.done()]

    def self_families(self) -> Iterable[Metric]:
        sources = SOURCE_UP.family()
        for name in SOURCES:
            if name in self.sources:
                sources.add_labels([name], self.sources[name])
        unmapped = UNMAPPED.family()
        if self.up and self.layout is not None:
            for reason, ids in self.placed(self.layout)[1].items():
                unmapped.add_labels([reason], len(ids))
        return [
            single(POD_ATTRIBUTION_UP, None if self.up is None else int(self.up)),
            *sources.done(),
            *unmapped.done(),
        ]

    async def _read_slices(self, reader: Any) -> None:
        """This node's DRA devices -> UUIDs; on failure the last good lookup stays (logged once per reason)."""
        from exporter.supervisor.podresources.resourceslices import ResourceSliceError

        try:
            self.dra_uuids = await asyncio.to_thread(reader.list)
        except ResourceSliceError as exc:
            log_once(log, logging.WARNING, ("dra-resourceslices", str(exc)), "pod attribution: ResourceSlices: %s", exc)

    @staticmethod
    def _say_down(exc: Exception) -> None:
        # Outside Kubernetes there is no kubelet to ask: a missing socket is expected, said at INFO.
        missing = getattr(exc, "reason", None) == "socket_missing"
        level = _level() if missing else logging.WARNING
        log.log(level, "pod_attribution: %s; nvgpu_pod_attribution_up is 0, nothing else changes", exc)

    async def run(self, host: Host) -> None:
        from exporter.supervisor.podresources import (
            PodResourcesClient,
            PodResourcesError,
            check_socket,
            unsupported_reason,
        )

        # h2 and protobuf cost the supervisor a few MB (docs/performance.md): they load only
        # once the kubelet's socket is there (never on a node without a kubelet).
        while True:
            try:
                check_socket(self.config.pod_resources_socket)
                break
            except PodResourcesError as exc:
                if self._last_error != str(exc):
                    self._say_down(exc)
                    self._last_error = str(exc)
                if self.up is not False:
                    self.up = False
                    host.changed()
            await asyncio.sleep(self.config.pod_refresh_s)
        reason = unsupported_reason()
        if reason is not None:
            self.up = False
            host.set_feature_state(gf.FeatureState(self.feature, False, gf.Reason.UNSUPPORTED, reason))
            log.log(_level(), "pod_attribution unsupported: %s", reason)
            host.changed()
            return
        client = PodResourcesClient(self.config.pod_resources_socket, timeout_s=min(5.0, self.config.pod_refresh_s))
        slices = None
        if self.config.dra_resourceslices:
            from exporter.supervisor.podresources.resourceslices import ResourceSliceReader

            slices = ResourceSliceReader(self.config.node_name, timeout_s=min(5.0, self.config.pod_refresh_s))
        allocatable_due: float | None = None  # monotonic; None: ask at the next answer of List
        try:
            while True:
                if slices is not None:
                    await self._read_slices(slices)
                before = (self.up, self.assignments, self.unparsed, self.dra_unresolved)
                try:
                    found = await asyncio.to_thread(client.list_assignments, self.dra_uuids)
                    self.assignments, self.unparsed, self.dra_unresolved = (
                        found.gpus,
                        found.not_a_uuid,
                        found.dra_unresolved,
                    )
                    if self.up is False:
                        log.info("pod_attribution: kubelet socket %s answers again", self.config.pod_resources_socket)
                    self.up, self._last_error = True, None
                except PodResourcesError as exc:
                    if self._last_error != str(exc):
                        self._say_down(exc)
                    self.up, self._last_error = False, str(exc)
                    self.assignments, self.unparsed, self.dra_unresolved = {}, {}, {}
                    self.allocatable, allocatable_due = None, None  # asked again once the kubelet answers
                allocatable_changed = False
                if self.up and (allocatable_due is None or time.monotonic() >= allocatable_due):
                    allocatable_changed = await self._read_allocatable(client)
                    allocatable_due = time.monotonic() + ALLOCATABLE_EVERY_S
                if allocatable_changed or (self.up, self.assignments, self.unparsed, self.dra_unresolved) != before:
                    host.changed()  # re-render only when something changed
                await asyncio.sleep(self.config.pod_refresh_s)
        finally:
            client.close()
