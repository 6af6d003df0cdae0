"""Per-GPU health in the supervisor: the fault domain of one GPU, and its slow retry.

The runbook isolates at the smallest level that contains the fault (event, then GPU, then node), and
so does the exporter. A GPU is out of the worker's sampling when:

- ``hung``: the worker reported that an NVML call on it outlasted the deadline (the worker itself
  stops calling it; its other GPUs keep being sampled, the worker is not replaced);
- ``crashed``: a worker died natively (SIGSEGV, SIGABRT …) with the breadcrumb of the crashing
  thread naming this GPU. The next worker is started without it, so it does not walk back into the
  crash, as long as another GPU remains to sample (on a one-GPU node, or when the crash follows a
  feature across GPUs, the feature quarantine is the right cure and the GPU stays in).

Such a GPU is retried by something expendable: a probe, a one-shot worker process that attaches
only that GPU and samples it once, started on a backoff (``NVGPU_GPU_RETRY_SECONDS``, doubling to
``NVGPU_GPU_RETRY_MAX_SECONDS``). A probe that answers readmits the GPU; one that hangs is killed;
one that crashes counts toward the feature quarantine like any crash. At most one probe runs at a
time, and none while an earlier one is stuck unreaped in the driver.

The GPU's state is exported whatever the age of its readings: ``nvgpu_device_up`` and
``nvgpu_device_state`` (an enum), faults by kind, and the features it does not support.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exporter.common.collectors import identity
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.workerconfig import Exclusion

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric
    from exporter.common.snapshot import GpuSample, Snapshot

log = logging.getLogger("exporter.supervisor")

STATES = ("up", "unknown", "lost", "hung", "crashed")
DEVICE_UP = MetricDef(
    "nvgpu_device_up",
    "1 if the GPU answered NVML in the last fresh sample, else 0 (nvgpu_device_state says why)",
)
DEVICE_STATE = MetricDef(
    "nvgpu_device_state",
    "1 for the GPU's current state: up (sampled), unknown (no fresh sample: the worker is not sampling), "
    "lost (GPU_IS_LOST or no handle), hung (an NVML call outlasted the deadline), crashed (a worker died "
    "in one of its calls); hung and crashed GPUs are retried by a probe process",
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
METRICS = (DEVICE_UP, DEVICE_STATE, DEVICE_FAULTS, FEATURE_UNSUPPORTED)


@dataclass
class GpuRecord:
    """What the supervisor knows of one GPU, across workers."""

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

    @property
    def key(self) -> GpuKey:
        return GpuKey(str(self.index), self.uuid)


class GpuHealth:
    """The GPUs of this node and their fault state.

    Args:
        retry_s: first probe delay for a hung or crashed GPU.
        retry_max_s: longest probe delay.
        clock: monotonic clock (tests).
    """

    def __init__(self, retry_s: float, retry_max_s: float, clock: Any = time.monotonic) -> None:
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self.clock = clock
        self.gpus: dict[int, GpuRecord] = {}

    # -- what workers report ---------------------------------------------------------------------

    def on_snapshot(self, snap: Snapshot) -> list[GpuRecord]:
        """Take the worker's view; returns GPUs that just became hung (to log and probe)."""
        newly_hung = []
        for g in snap.gpus:
            rec = self._record(g)
            if g.state == "hung" and rec.state != "hung":
                rec.faults["hang"] += 1
                rec.detail = g.detail
                rec.hung_in = (g.feature, g.function)
                self._schedule(rec, first=True)
                newly_hung.append(rec)
            elif g.state == "hung" and rec.next_probe is None:
                self._schedule(rec, first=False)  # readmitted, but its thread was still stuck: retry
            elif g.state == "lost" and rec.state == "up":
                rec.faults["lost"] += 1
            if g.state == "up":
                rec.excluded, rec.next_probe = "", None
            rec.state = g.state
            if g.state != "up" and g.detail:
                rec.detail = g.detail
            rec.unsupported = g.unsupported
            rec.readings_at = g.sampled_at
        return newly_hung

    def on_hello(self, gpus: Iterable[tuple[int, str]]) -> None:
        """A worker attached these (index, uuid) GPUs: known from now on, even before a snapshot
        (a worker can die in its first pass)."""
        for index, uuid in gpus:
            rec = self.gpus.get(index)
            if rec is None or (rec.uuid and rec.uuid != uuid):
                self.gpus[index] = GpuRecord(index, uuid)
            else:
                rec.uuid = uuid

    def _record(self, g: GpuSample) -> GpuRecord:
        rec = self.gpus.get(g.index)
        if rec is None or (g.uuid and rec.uuid and rec.uuid != g.uuid):
            rec = self.gpus[g.index] = GpuRecord(g.index, g.uuid)
        rec.uuid = g.uuid or rec.uuid
        ident = g.reading(identity.Reading)
        if ident and ident.pci_bus_id:
            rec.bus_id = ident.pci_bus_id
        return rec

    def by_uuid(self, uuid: str) -> GpuRecord | None:
        """The record of the GPU ``uuid``."""
        return next((r for r in self.gpus.values() if uuid and r.uuid == uuid), None)

    def on_crash(self, uuid: str, feature: str, quarantined: bool) -> GpuRecord | None:
        """A worker died natively in a call on GPU ``uuid``; exclude that GPU from the next workers
        unless the crash's feature was just quarantined or no other GPU would be left to sample.

        Returns:
            The record when the GPU is now excluded, else None.
        """
        rec = self.by_uuid(uuid)
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
            log.info("GPU %d (%s) answered a probe: readmitted", rec.index, rec.uuid)
            rec.excluded, rec.next_probe, rec.backoff_s = "", None, 0.0
            rec.crash_features.clear()
            return
        rec.faults["probe_failed"] += 1
        self._schedule(rec, first=False)
        log.warning(
            "GPU %d (%s) still does not answer (%s); next probe in %.0f s",
            rec.index,
            rec.uuid,
            why,
            rec.backoff_s,
            extra={"gpu": rec.index, "uuid": rec.uuid},
        )

    def exclusions(self) -> tuple[Exclusion, ...]:
        """The GPUs a new worker must not attach, by index."""
        return tuple(
            Exclusion(r.index, r.uuid, r.excluded, r.detail)
            for r in sorted(self.gpus.values(), key=lambda r: r.index)
            if r.excluded
        )

    # -- rendering ------------------------------------------------------------------------------

    def state_of(self, rec: GpuRecord, fresh: bool) -> str:
        """The exported state: what the worker said while its report is fresh, else ``unknown``
        (an excluded GPU stays ``crashed`` / ``hung``: that is the supervisor's own knowledge)."""
        if rec.excluded:
            return rec.excluded
        return rec.state if fresh and rec.state in STATES else "unknown"

    def families(self, fresh: bool) -> list[Metric]:
        """device_up, device_state, device_faults and feature_unsupported for every known GPU."""
        up, state, faults, unsup = (d.family() for d in METRICS)
        for rec in sorted(self.gpus.values(), key=lambda r: r.index):
            current = self.state_of(rec, fresh)
            up.add(rec.key, 1 if current == "up" else 0)
            for s in STATES:
                state.add(rec.key, 1 if s == current else 0, s)
            for kind, n in sorted(rec.faults.items()):
                faults.add(rec.key, n, kind)
            if fresh:
                for feature in rec.unsupported:
                    unsup.add(rec.key, 1, feature)
        return [up.always(), state.always(), faults.always(), unsup.always()]

    def describe(self) -> Iterable[tuple[GpuRecord, str]]:
        """(record, exported state) per GPU for the status page."""
        for rec in sorted(self.gpus.values(), key=lambda r: r.index):
            yield rec, self.state_of(rec, True)
