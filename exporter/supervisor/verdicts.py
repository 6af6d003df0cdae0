"""Per-GPU verdicts: what to do with each GPU now, with the evidence.

The engine derives one verdict per GPU from the classified faults (the fault atlas: keep the
evidence, narrow the fault domain, never restart a node because an error code appeared;
docs/design.md, "Fault domains and verdicts", holds the table): the table is
:mod:`exporter.supervisor.faulttable`, the classification :mod:`exporter.supervisor.classify`, the
JSON document :mod:`exporter.supervisor.verdictdoc`.

A fault of the exporter's own environment takes precedence on the GPUs it hides (what else is seen
there is not trustworthy) and is never reported as a lost GPU, a driver reload or a node fault.
Otherwise a GPU's verdict is its most severe fault's. A ``reset_gpu`` fault that comes back within
:data:`~exporter.supervisor.faulttable.RECUR_WINDOW_S` after it cleared (the reset did not cure it)
asks for ``reboot_node``.

Every change of a GPU's verdict is logged once with its evidence, and every transition and every
fault raised or cleared is handed, typed (:class:`VerdictTransition`, :class:`FaultEvent`), to the
engine's subscribers (:meth:`VerdictEngine.subscribe`): the one place where they are produced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.metric import GpuKey, MetricDef
from exporter.supervisor.classify import (
    Memory,
    ServedState,
    gpu_faults,
    index_of,
    is_fresh,
    known_gpus,
    node_faults,
    order,
)
from exporter.supervisor.faulttable import CAUSES, RANK, RECUR_WINDOW_S, Fault, fault

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric
    from exporter.common.snapshot import GpuSample
    from exporter.supervisor.gpuhealth import GpuRecord

log = logging.getLogger("exporter.supervisor.verdicts")

TRANSITIONS_KEPT = 100

VERDICT = MetricDef(
    "nvgpu_gpu_health_verdict",
    "1 for the GPU's current verdict: what to do with it now (ok, unknown, watch, stop_scheduling, reset_gpu, "
    "reboot_node, fix_exporter), the fault domain (exporter, driver, gpu, link, node, application; none for ok "
    "and unknown) and the cause (docs/design.md, fault domains)",
    ("verdict", "domain", "cause"),
)
METRICS = (VERDICT,)


@dataclass(frozen=True)
class Verdict:
    """One GPU's verdict.

    Attributes:
        gpu: NVML index as text.
        uuid: the GPU's UUID.
        verdict: one of :data:`VERDICTS`.
        domain: the deciding fault's domain (``none`` for ok and unknown).
        cause: the deciding fault's cause (``none`` for ok).
        faults: every fault on the GPU, the deciding one first.
        since_wall: Unix time the verdict began.
        since_mono: ``time.monotonic()`` when it began (ages are measured on it).
    """

    gpu: str
    uuid: str
    verdict: str
    domain: str
    cause: str
    faults: tuple[Fault, ...]
    since_wall: float
    since_mono: float

    @property
    def key(self) -> tuple[str, str, str]:
        """(verdict, domain, cause): a change of any is a transition."""
        return (self.verdict, self.domain, self.cause)

    @property
    def action(self) -> str:
        """The deciding fault's action, "" for ok."""
        return self.faults[0].action if self.faults else ""


@dataclass(frozen=True)
class VerdictTransition:
    """A GPU's verdict changed (the typed event a timeline records).

    Attributes:
        uuid: the GPU.
        gpu: its NVML index as text.
        before: (verdict, domain, cause) before; ("", "", "") for a GPU seen the first time.
        after: the new verdict.
        wall: Unix time of the transition.
        mono: ``time.monotonic()`` of the transition.
    """

    uuid: str
    gpu: str
    before: tuple[str, str, str]
    after: Verdict
    wall: float
    mono: float


@dataclass(frozen=True)
class FaultEvent:
    """A classified fault appeared (``raised``) or went away (``cleared``) on a GPU."""

    kind: str
    uuid: str
    gpu: str
    fault: Fault
    wall: float
    mono: float


Event = VerdictTransition | FaultEvent


class VerdictEngine:
    """Derives every GPU's verdict from the served state; keeps the current ones and their history.

    Args:
        clock: ``time.monotonic`` (tests inject).
        wall: ``time.time`` (tests inject).
        recur_window_s: a ``reset_gpu`` fault back within this after it cleared asks for a reboot
            (``NVGPU_RECURRENCE_WINDOW_SECONDS``).
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        recur_window_s: float = RECUR_WINDOW_S,
    ) -> None:
        self.clock = clock
        self.wall = wall
        self.recur_window_s = recur_window_s
        self.current: dict[str, Verdict] = {}
        self.node_faults: tuple[Fault, ...] = ()
        self.transitions: list[VerdictTransition] = []
        self._memory: dict[str, Memory] = {}
        self._subscribers: list[Callable[[Event], None]] = []

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        """Hand every :class:`VerdictTransition` and :class:`FaultEvent` to ``callback``."""
        self._subscribers.append(callback)

    # -- evaluation -------------------------------------------------------------------------------

    def update(self, state: ServedState) -> list[VerdictTransition]:
        """Evaluate every known GPU from ``state``; returns (and logs, and hands on) the transitions."""
        now, wall = self.clock(), self.wall()
        node = node_faults(state)
        self.node_faults = tuple(node)
        gpus = known_gpus(state)
        lost = [u for u, (rec, _g) in gpus.items() if rec is not None and rec.state == "lost"]
        every_gpu_lost = len(gpus) >= 2 and len(lost) == len(gpus)
        out = []
        for uuid, (rec, sample) in sorted(gpus.items(), key=lambda kv: index_of(kv[1])):
            mem = self._memory.setdefault(uuid, Memory())
            found = [*node, *gpu_faults(state, uuid, rec, sample, mem, now, wall, every_gpu_lost)]
            found = self._escalate(uuid, found, mem, now)
            verdict = self._decide(state, uuid, rec, sample, found, now, wall)
            self._fault_events(uuid, verdict.gpu, found, mem, now, wall)
            before = self.current.get(uuid)
            if before is not None and before.key == verdict.key:
                verdict = Verdict(verdict.gpu, uuid, *verdict.key, verdict.faults, before.since_wall, before.since_mono)
            self.current[uuid] = verdict
            if before is None or before.key != verdict.key:
                t = VerdictTransition(uuid, verdict.gpu, before.key if before else ("", "", ""), verdict, wall, now)
                out.append(t)
                self._transition(t)
        for uuid in [u for u in self.current if u not in gpus]:
            del self.current[uuid]
        return out

    def _decide(
        self,
        state: ServedState,
        uuid: str,
        rec: GpuRecord | None,
        sample: GpuSample | None,
        found: list[Fault],
        now: float,
        wall: float,
    ) -> Verdict:
        gpu = str(rec.index) if rec is not None else state.gpu_index.get(uuid, "")
        exporter = [f for f in found if f.domain == "exporter"]
        ranked = sorted(found, key=lambda f: -RANK[f.verdict])
        if exporter:
            first = exporter[0]
            ordered = (first, *[f for f in ranked if f is not first])
        elif ranked and RANK[ranked[0].verdict] > 0:
            ordered = tuple(ranked)
        elif sample is None or not is_fresh(state):
            ordered = (fault("no_fresh_sample", "no fresh NVML reading of this GPU"), *ranked)
        else:
            ordered = (fault("none"), *ranked) if ranked else (fault("none"),)
        head = ordered[0]
        return Verdict(gpu, uuid, head.verdict, head.domain, head.cause, ordered, wall, now)

    def _escalate(self, uuid: str, found: list[Fault], mem: Memory, now: float) -> list[Fault]:
        """A reset_gpu fault back within the recurrence window after it cleared, or a GPU lost after a
        reset_gpu verdict: the reset did not cure it, reboot."""
        out = []
        for f in found:
            cleared = mem.cleared.get(f.cause)
            if f.verdict == "reset_gpu" and cleared is not None and now - cleared <= self.recur_window_s:
                f = Fault(
                    f.cause,
                    f.domain,
                    "reboot_node",
                    (*f.evidence, f"it came back {now - cleared:.0f} s after it had cleared: a reset did not cure it"),
                    "drain the node and reboot it: " + f.action,
                    f.owner,
                )
            elif f.cause == "gpu_lost" and mem.was_reset_gpu and f.verdict != "reboot_node":
                f = Fault(
                    f.cause,
                    f.domain,
                    "reboot_node",
                    (*f.evidence, "lost after a reset_gpu verdict: the reset was refused or did not bring it back"),
                    f.action,
                    f.owner,
                )
            out.append(f)
        return out

    def _fault_events(self, uuid: str, gpu: str, found: list[Fault], mem: Memory, now: float, wall: float) -> None:
        causes = {f.cause: f for f in found}
        for cause, f in causes.items():
            if cause not in mem.causes:
                self._emit(FaultEvent("raised", uuid, gpu, f, wall, now))
        for cause, f in mem.causes.items():
            if cause not in causes:
                if f.verdict == "reset_gpu" or CAUSES[cause].verdict == "reset_gpu":
                    mem.cleared[cause] = now
                self._emit(FaultEvent("cleared", uuid, gpu, f, wall, now))
        mem.causes = causes
        mem.was_reset_gpu = mem.was_reset_gpu or any(f.verdict == "reset_gpu" for f in found)
        if not found:
            mem.was_reset_gpu = False

    def _transition(self, t: VerdictTransition) -> None:
        v = t.after
        level = logging.INFO
        if v.verdict in ("stop_scheduling", "reset_gpu", "fix_exporter"):
            level = logging.WARNING
        elif v.verdict == "reboot_node":
            level = logging.ERROR
        evidence = "; ".join(e for f in v.faults[:3] for e in f.evidence) or "-"
        log.log(
            level,
            "GPU %s (%s) verdict %s -> %s (%s: %s); evidence: %s%s",
            v.gpu or "?",
            t.uuid,
            t.before[0] or "new",
            v.verdict,
            v.domain or "-",
            v.cause,
            evidence,
            f"; action: {v.action}" if v.action else "",
            extra={
                "gpu": v.gpu,
                "uuid": t.uuid,
                "verdict": v.verdict,
                "domain": v.domain,
                "cause": v.cause,
                "previous_verdict": t.before[0],
            },
        )
        self.transitions = [*self.transitions[-(TRANSITIONS_KEPT - 1) :], t]
        self._emit(t)

    def _emit(self, event: Event) -> None:
        for callback in self._subscribers:
            try:
                callback(event)
            except Exception:  # noqa: BLE001 - a subscriber's bug must not cost the verdicts
                log.exception("a verdict subscriber failed on %s", type(event).__name__)

    # -- reads ------------------------------------------------------------------------------------

    def node_verdict(self) -> Verdict | None:
        """The node's summary: the most demanding GPU verdict (``fix_exporter`` when any GPU asks
        for it and none asks for more than stop_scheduling), None before any GPU is known."""
        if not self.current:
            return None
        return max(self.current.values(), key=lambda v: (RANK[v.verdict], v.verdict == "fix_exporter"))

    def families(self) -> list[Metric]:
        """``nvgpu_gpu_health_verdict`` for every known GPU (since when: the JSON document; in
        Prometheus, the series' own start)."""
        fam = VERDICT.family()
        for v in sorted(self.current.values(), key=lambda v: (order(v.gpu), v.uuid)):
            fam.add(GpuKey(v.gpu, "" if v.uuid.startswith("index:") else v.uuid), 1, v.verdict, v.domain, v.cause)
        return [fam.always()]
