"""Per-GPU health in the supervisor: the fault domain of one GPU, and its slow retry.

The runbook isolates at the smallest level that contains the fault (event, then GPU, then node), and
so does the exporter. A GPU is out of the worker's sampling when:

- ``hung``: the worker reported that an NVML call on it outlasted the deadline (the worker itself
  stops calling it; its other GPUs keep being sampled, the worker is not replaced);
- ``crashed``: a worker died natively (SIGSEGV, SIGABRT …) with the breadcrumb of the crashing
  thread naming this GPU. The next worker is started without it, so it does not walk back into the
  crash, as long as another GPU remains to sample (on a one-GPU node, or when the crash follows a
  feature across GPUs, the feature quarantine is the right cure and the GPU stays in).

Such a GPU is retried by something expendable: a probe, a short-lived worker process that attaches
only that GPU and samples it a few times (:mod:`exporter.supervisor.probes` says what answering
takes), started on a backoff (``NVGPU_GPU_RETRY_SECONDS``, doubling to
``NVGPU_GPU_RETRY_MAX_SECONDS``). A probe that answers readmits the GPU; one that hangs is killed;
one that crashes counts toward the feature quarantine like any crash. At most one probe runs at a
time, and none while an earlier one is stuck unreaped in the driver. A readmission does not reset
the backoff: a GPU that hangs or crashes again within ``NVGPU_GPU_RETRY_MAX_SECONDS`` of it is
retried at the next, doubled delay (a GPU that relapses at once is not readmitted every 30 s);
only a GPU that stays up that long starts again from the first delay.

The GPU's state is exported whatever the age of its readings: ``nvgpu_device_up`` and
``nvgpu_device_state`` (an enum), faults by kind, and the features it does not support.

A record is one GPU, keyed by its UUID (its PCI bus id where the UUID cannot be read:
:func:`exporter.common.gpuid.gpu_key`); the NVML index is only its ``gpu`` label, taken from each
snapshot, so a renumbering (a GPU drained before it) moves the label and keeps the state. A GPU the
worker reports ``removed`` (NVML no longer enumerates it), or no longer reports at all, loses its
record: its exclusion, its probe and its series go with it.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exporter.common.collectors import identity
from exporter.common.gpuid import gpu_key
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.workerconfig import Exclusion, GpuRef

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric
    from exporter.common.snapshot import GpuSample, Snapshot

log = logging.getLogger("exporter.supervisor")

STATES = ("up", "unknown", "lost", "hung", "crashed")
# Answers that make a GPU unreachable because of the exporter's own container, not the GPU: the
# device cgroup or the device node refuses this pod (NVML's count includes the GPU, its handle
# lookup answers NO_PERMISSION). Such a GPU's record is ``denied``, never ``lost``; it is exported
# as ``unknown`` (the exporter cannot see it) and its verdict says ``fix_exporter`` with the cause
# (exporter/supervisor/verdicts.py; docs/design.md, fault domains).
DENIED_ERRORS = frozenset({"NO_PERMISSION"})
DEVICE_UP = MetricDef(
    "nvgpu_device_up",
    "1 if the GPU answered NVML in the last fresh sample, else 0 (nvgpu_device_state says why)",
)
DEVICE_STATE = MetricDef(
    "nvgpu_device_state",
    "1 for the GPU's current state: up (sampled), unknown (no fresh sample: the worker is not sampling), "
    "lost (GPU_IS_LOST or no handle), hung (an NVML call outlasted the deadline), crashed (a worker died "
    "in one of its calls); hung and crashed GPUs are retried by a probe process; a GPU the exporter's container may "
    "not open (NO_PERMISSION) is unknown, never lost (nvgpu_gpu_health_verdict says fix_exporter)",
    ("state",),
)
DEVICE_FAULTS = MetricDef(
    "nvgpu_device_faults_total",
    "GPU-level faults: hang (a call outlasted the deadline), crash (a worker died in one of its calls), "
    "lost (the GPU went from up to lost), probe_failed (a retry of a hung or crashed GPU did not answer)",
    ("fault",),
)
FEATURE_UNSUPPORTED = MetricDef(
    "nvgpu_gpu_feature_unsupported",
    "1 for each enabled feature none of whose NVML calls this GPU supports (re-probed periodically and "
    "after MIG changes, resets and recovery events); absent when supported",
    ("feature",),
)
GPU_COUNT = MetricDef(
    "nvgpu_gpus",
    "GPUs of this node by view: present (NVML enumerates them: nvmlDeviceGetCount at the worker's last "
    "enumeration; absent without a fresh sample), max_present (the most present since the exporter started), "
    "expected (NVGPU_EXPECTED_GPUS; absent when unset), device_plugin (distinct whole GPUs behind the devices "
    "the kubelet can allocate, PodResources GetAllocatableResources: a MIG device or time-sliced replica counts "
    "its parent GPU once; absent without pod attribution or an answer), device_plugin_unmapped (device ids the "
    "kubelet offers that cannot be mapped to a GPU: not a UUID, a MIG device in no GPU's layout)",
    ("view",),
    per_gpu=False,
)
METRICS = (DEVICE_UP, DEVICE_STATE, DEVICE_FAULTS, FEATURE_UNSUPPORTED, GPU_COUNT)
COUNT_VIEWS = ("present", "max_present", "expected", "device_plugin", "device_plugin_unmapped")


@dataclass
class GpuRecord:
    """What the supervisor knows of one GPU, across workers (keyed by :attr:`key`; ``index`` is the
    NVML index of the last report, a label)."""

    index: int
    uuid: str
    bus_id: str = ""
    state: str = "unknown"  # the last reported state
    excluded: str = ""  # "crashed" or "hung": the next worker does not attach it; a probe retries it
    detail: str = ""
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    crash_features: set[str] = field(default_factory=set)
    backoff_s: float = 0.0
    next_probe: float | None = None  # monotonic time of the next probe
    unsupported: tuple[str, ...] = ()
    readings_at: float | None = None  # Unix time of its last readings
    hung_in: tuple[str, str] = ("", "")  # (feature, function) of the call that did not return
    error: str = ""  # the NVML code name the worker gave for a GPU that is not up
    readmitted_at: float | None = None  # monotonic time of the last readmission, until it stays up

    @property
    def key(self) -> str:
        """The GPU's state key: UUID, else PCI bus id, else ``#<index>``."""
        return gpu_key(self.uuid, self.bus_id, self.index)

    @property
    def labels(self) -> GpuKey:
        """Its ``gpu`` and ``uuid`` labels."""
        return GpuKey(str(self.index), self.uuid)

    def ref(self) -> GpuRef:
        """The GPU as a worker finds it (UUID, bus id, last index as a hint)."""
        return GpuRef(self.uuid, self.bus_id, self.index)

    def label(self) -> str:
        """How logs name it: ``GPU 1 (GPU-7bca…)``."""
        return f"GPU {self.index} ({self.uuid or self.bus_id or 'uuid unknown'})"


class GpuHealth:
    """The GPUs of this node and their fault state.

    Args:
        retry_s: first probe delay for a hung or crashed GPU.
        retry_max_s: longest probe delay.
        clock: monotonic clock (tests).
        expected: GPUs this node should have (``NVGPU_EXPECTED_GPUS``), None when unknown.
    """

    def __init__(
        self, retry_s: float, retry_max_s: float, clock: Any = time.monotonic, expected: int | None = None
    ) -> None:
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self.clock = clock
        self.expected = expected
        self.gpus: dict[str, GpuRecord] = {}  # GPU key -> record
        self.present: int | None = None  # GPUs the last snapshot named (removed ones not counted)
        self.max_present = 0  # the most present in one snapshot since the exporter started

    # -- what workers report ---------------------------------------------------------------------

    def on_snapshot(self, snap: Snapshot) -> list[GpuRecord]:
        """Take the worker's view; returns GPUs that just became hung (to log and probe). A GPU the
        snapshot says is ``removed``, or does not name at all, is forgotten."""
        newly_hung = []
        reported: set[str] = set()
        for g in snap.gpus:
            if g.state == "removed":
                gone = self.gpus.pop(g.key, None)
                if gone is not None:
                    log.info("%s left the node: its state, exclusion and probe are dropped", gone.label())
                continue
            rec = self._record(g)
            reported.add(rec.key)
            if g.state == "hung" and rec.state != "hung":
                rec.faults["hang"] += 1
                rec.detail = g.detail
                rec.hung_in = (g.feature, g.function)
                self._schedule(rec, first=not rec.backoff_s)  # a relapse after a readmission backs off further
                newly_hung.append(rec)
            elif g.state == "hung" and rec.next_probe is None:
                self._schedule(rec, first=False)  # readmitted, but its thread was still stuck: retry
            elif g.state == "lost" and rec.state == "up" and g.error not in DENIED_ERRORS:
                rec.faults["lost"] += 1
            if g.state == "up":
                rec.excluded, rec.next_probe = "", None
                if rec.readmitted_at is not None and self.clock() - rec.readmitted_at >= self.retry_max_s:
                    rec.readmitted_at, rec.backoff_s = None, 0.0  # up long enough: the next fault starts over
            rec.error = g.error
            rec.state = "denied" if g.state == "lost" and g.error in DENIED_ERRORS else g.state
            if g.state != "up" and g.detail:
                rec.detail = g.detail
            rec.unsupported = g.unsupported
            rec.readings_at = g.sampled_at
        for key in [k for k in self.gpus if k not in reported]:
            log.debug("%s is no longer reported by the worker: its record is dropped", self.gpus[key].label())
            del self.gpus[key]
        self._count(len(reported))
        return newly_hung

    def _count(self, present: int) -> None:
        if self.present is not None and present < self.present:
            log.warning(
                "NVML enumerates %d GPU(s), %d before (most since the exporter started: %d%s)",
                present,
                self.present,
                self.max_present,
                "" if self.expected is None else f"; expected {self.expected}",
            )
        self.present, self.max_present = present, max(self.max_present, present)

    def on_hello(self, gpus: Iterable[tuple[int, str, str]]) -> None:
        """A worker attached these (index, uuid, bus id) GPUs: known from now on, even before a
        snapshot (a worker can die in its first pass); a known GPU's index label follows."""
        for index, uuid, bus_id in gpus:
            key = gpu_key(uuid, bus_id, index)
            rec = self.gpus.get(key)
            if rec is None:
                self.gpus[key] = GpuRecord(index, uuid, bus_id)
            else:
                rec.index = index

    def _record(self, g: GpuSample) -> GpuRecord:
        rec = self.gpus.get(g.key)
        if rec is None:
            rec = self.gpus[g.key] = GpuRecord(g.index, g.uuid, g.bus_id)
        rec.index = g.index
        rec.bus_id = g.bus_id or rec.bus_id
        ident = g.reading(identity.Reading)
        if ident and ident.pci_bus_id:
            rec.bus_id = ident.pci_bus_id
        return rec

    def by_key(self, key: str) -> GpuRecord | None:
        """The record of the GPU whose UUID (or, without one, PCI bus id) is ``key``."""
        if not key:
            return None
        return self.gpus.get(key) or next(
            (r for r in self.gpus.values() if key in (r.uuid, r.bus_id.upper()) and key), None
        )

    def index_of(self, key: str) -> str:
        """The current ``gpu`` label of the GPU ``key`` ("" when unknown)."""
        rec = self.by_key(key)
        return str(rec.index) if rec is not None else ""

    def on_crash(self, uuid: str, feature: str, quarantined: bool) -> GpuRecord | None:
        """A worker died natively in a call on GPU ``uuid`` (its key: the UUID, or the bus id of a GPU
        whose UUID cannot be read); exclude that GPU from the next workers
        unless the crash's feature was just quarantined or no other GPU would be left to sample.

        Returns:
            The record when the GPU is now excluded, else None.
        """
        rec = self.by_key(uuid)
        if rec is None:
            return None
        rec.faults["crash"] += 1
        rec.crash_features.add(feature)
        others = [r for r in self.gpus.values() if r is not rec and not r.excluded and r.state != "lost"]
        if quarantined or not others:
            return None
        rec.excluded, rec.state = "crashed", "crashed"
        rec.detail = f"a worker died in {feature} on this GPU; retried by a probe"
        self._schedule(rec, first=not rec.backoff_s)
        return rec

    def others_left(self, key: str) -> bool:
        """Another GPU than ``key`` is left to sample (not excluded, not lost): leaving ``key`` out
        contains its fault."""
        return any(r.key != key and r.uuid != key and not r.excluded and r.state != "lost" for r in self.gpus.values())

    def excluded(self, key: str) -> bool:
        """The GPU ``key`` is out of the worker's sampling (hung or crashed)."""
        rec = self.by_key(key)
        return rec is not None and (bool(rec.excluded) or rec.state == "hung")

    def on_quarantine(self, feature: str) -> list[GpuRecord]:
        """A feature was quarantined: GPUs excluded only for crashes in it are back at once."""
        back = []
        for rec in self.gpus.values():
            if rec.excluded == "crashed" and rec.crash_features <= {feature}:
                rec.excluded, rec.next_probe, rec.backoff_s, rec.state = "", None, 0.0, "unknown"
                rec.crash_features.clear()
                back.append(rec)
        return back

    # -- probes ---------------------------------------------------------------------------------

    def _schedule(self, rec: GpuRecord, first: bool) -> None:
        rec.backoff_s = self.retry_s if first or not rec.backoff_s else min(rec.backoff_s * 2, self.retry_max_s)
        rec.next_probe = self.clock() + rec.backoff_s

    def due_probe(self) -> GpuRecord | None:
        """The GPU whose probe is due (the earliest), or None."""
        now = self.clock()
        due = [r for r in self.gpus.values() if r.next_probe is not None and r.next_probe <= now]
        return min(due, key=lambda r: r.next_probe or 0.0) if due else None

    def probe_done(self, rec: GpuRecord, ok: bool, why: str) -> None:
        """Record a probe's answer: readmit, or try again later."""
        if ok:
            log.info(
                "%s answered a probe: readmitted (%s)",
                rec.label(),
                why,
                extra={"gpu": rec.index, "uuid": rec.uuid},
            )
            rec.excluded, rec.next_probe, rec.readmitted_at = "", None, self.clock()
            rec.crash_features.clear()
            return
        rec.faults["probe_failed"] += 1
        self._schedule(rec, first=False)
        log.warning(
            "%s still does not answer (%s); next probe in %.0f s",
            rec.label(),
            why,
            rec.backoff_s,
            extra={"gpu": rec.index, "uuid": rec.uuid},
        )

    def probe_inconclusive(self, rec: GpuRecord, why: str) -> None:
        """A probe ended without an answer either way (killed from outside, by the OOM killer): try
        again at the same backoff; no ``probe_failed`` fault, no longer delay."""
        rec.next_probe = self.clock() + (rec.backoff_s or self.retry_s)
        log.info(
            "%s: its probe proved nothing (%s); next probe in %.0f s",
            rec.label(),
            why,
            rec.next_probe - self.clock(),
            extra={"gpu": rec.index, "uuid": rec.uuid},
        )

    def exclusions(self) -> tuple[Exclusion, ...]:
        """The GPUs a new worker must not attach, by UUID (bus id), with their last index as a hint."""
        return tuple(
            Exclusion(r.ref(), r.excluded, r.detail) for r in sorted(self.gpus.values(), key=_order) if r.excluded
        )

    # -- rendering ------------------------------------------------------------------------------

    def state_of(self, rec: GpuRecord, fresh: bool) -> str:
        """The GPU's state: what the worker said while its report is fresh, else ``unknown``
        (an excluded GPU stays ``crashed`` / ``hung``: that is the supervisor's own knowledge);
        ``denied`` for a GPU the exporter's container may not open (exported as ``unknown``)."""
        if rec.excluded:
            return rec.excluded
        return rec.state if fresh and (rec.state in STATES or rec.state == "denied") else "unknown"

    def families(self, fresh: bool, views: Mapping[str, int] | None = None) -> list[Metric]:
        """device_up, device_state, device_faults and feature_unsupported for every known GPU, and
        the GPU count by view (``views``: those extensions know, e.g. ``device_plugin``)."""
        up, state, faults, unsup = (d.family() for d in (DEVICE_UP, DEVICE_STATE, DEVICE_FAULTS, FEATURE_UNSUPPORTED))
        for rec in sorted(self.gpus.values(), key=_order):
            current = self.state_of(rec, fresh)
            current = "unknown" if current == "denied" else current
            up.add(rec.labels, 1 if current == "up" else 0)
            for s in STATES:
                state.add(rec.labels, 1 if s == current else 0, s)
            for kind, n in sorted(rec.faults.items()):
                faults.add(rec.labels, n, kind)
            if fresh:
                for feature in rec.unsupported:
                    unsup.add(rec.labels, 1, feature)
        count = GPU_COUNT.family()
        known: dict[str, int | None] = {**(views or {})}
        known.update(present=self.present if fresh else None, max_present=self.max_present or None)
        known["expected"] = self.expected
        for view in COUNT_VIEWS:
            count.add_labels([view], known.get(view))
        return [up.always(), state.always(), faults.always(), unsup.always(), count.always()]

    def describe(self) -> Iterable[tuple[GpuRecord, str]]:
        """(record, exported state) per GPU for the status page."""
        for rec in sorted(self.gpus.values(), key=_order):
            yield rec, self.state_of(rec, True)


def _order(rec: GpuRecord) -> tuple[int, str]:
    return rec.index, rec.key
