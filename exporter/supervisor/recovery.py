"""Recovery is verified, not assumed: after a reset, a reboot or a driver reload, did the GPU come back clean?

The runbook's recovery order ends with "check again, then return a small amount of traffic". The
exporter does the checking: when a GPU's verdict asks for action (``stop_scheduling`` or more), a
:class:`Watch` opens for its cause (the *signature*). It then waits for what can cure it:

- ``gpu_reset``: the GPU went away (lost, hung, absent) and came back; NVML announced it (event
  ``gpu_unavailable`` or ``gpu_recovery_action``); or its volatile ECC counts fell (they restart at a
  reset or a driver reload, nvmlDeviceGetTotalEccErrors);
- ``reboot``: the exporter found a new boot id (``/proc/sys/kernel/random/boot_id``);
- ``driver_reload``: the driver or kernel-module version changed, or NVML worked again after
  ``LIB_RM_VERSION_MISMATCH``;
- ``exporter_restart``: the exporter was stopped and started again on the same boot and driver
  (the runbook's pause-label procedure takes the exporter off the node for a reset). A restart is
  no cure by itself (an OOM kill, a liveness restart or a rollout restarts it too): a signature gone
  after it is watched like any, one still there sends the watch back to open, never "recurred";
  it does not replace a reset, reboot or reload the watch already waits on;
- ``cleared``: none of these, the signature went away by itself (the stuck process finally exited).

After the action, the GPU's first fresh sample in which it answers is "back at T"; the signature
cleared when the verdict then no longer names it (or a cause of the same signature: the stuck
context with or without Xid 43). From then on the exporter watches for the recurrence window
(``NVGPU_RECURRENCE_WINDOW_SECONDS``, default 3600 s: the fault atlas's recurrence threshold, and
the verdicts' own "a reset_gpu fault back within an hour asks for a reboot"): a fault of the same
signature raised again, a verdict that asks for action again, or any Xid on the GPU stamped after it
came back, is "recurred at T" (with what); a window without any is "recovered at T" (T: when it
came back). The window is measured on the monotonic clock while the exporter runs, on the wall
clock across a restart (the only clock that spans one).

The watches are kept in the timeline file (:meth:`exporter.supervisor.timeline.Timeline.set_extra`),
checked on load like everything in it, and every change is a ``recovery`` event on the GPU's lane.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporter.common.logs import rfc3339
from exporter.supervisor.faulttable import RANK
from exporter.supervisor.timeline import Timeline

log = logging.getLogger(__name__)

DEFAULT_WINDOW_S = 3600.0
ACTIONS = ("gpu_reset", "reboot", "driver_reload", "exporter_restart", "cleared")
STATES = ("open", "pending", "watching", "recovered", "recurred")
# Causes that are one signature: the stuck context is the same fault whether or not Xid 43 was seen.
FAMILIES = ({"stuck_context", "busy_and_empty"}, {"gpu_lost", "fell_off_bus", "all_gpus_lost"})
ACTS = 2  # verdict rank at and above which a watch opens (stop_scheduling, reset_gpu, reboot_node)
EXTRA = "recovery"
KEPT = 4  # watches kept per GPU (the current one and the last ended ones)
LANES = 64


def family(cause: str) -> set[str]:
    """The causes that are the same signature as ``cause``."""
    return next((f for f in FAMILIES if cause in f), {cause})


@dataclass
class Watch:
    """One GPU's recovery, from the verdict that asked for action to recovered or recurred.

    Attributes:
        uuid: the GPU.
        signature: the deciding cause (a key of the fault table).
        verdict: the verdict it asked for.
        opened: Unix time the watch opened.
        state: one of :data:`STATES`.
        action: one of :data:`ACTIONS`, "" before one is seen.
        action_at: Unix time of the action.
        detail: the action in words.
        back_at: Unix time of the GPU's first answering sample after the action.
        cleared: the signature was gone when it came back.
        until: Unix time the recurrence window ends.
        ended_at: Unix time it recovered (the window passed) or recurred.
        recurred_by: what recurred, in words.
    """

    uuid: str
    signature: str
    verdict: str
    opened: float
    state: str = "open"
    action: str = ""
    action_at: float | None = None
    detail: str = ""
    back_at: float | None = None
    cleared: bool | None = None
    until: float | None = None
    ended_at: float | None = None
    recurred_by: str = ""

    def summary(self) -> str:
        """The record's line: "recovered at T", "recurred at T: …", or where it stands."""
        if self.state == "recovered":
            return f"recovered at {rfc3339(self.back_at or 0)} ({self.action.replace('_', ' ')}; no recurrence)"
        if self.state == "recurred":
            return f"recurred at {rfc3339(self.ended_at or 0)}: {self.recurred_by}"
        if self.state == "watching":
            return (
                f"back at {rfc3339(self.back_at or 0)} after {self.action.replace('_', ' ')}, signature cleared; "
                f"watching for a recurrence until {rfc3339(self.until or 0)}"
            )
        if self.state == "pending":
            return f"{self.detail} at {rfc3339(self.action_at or 0)}; the GPU has not answered since"
        return "no reset, reboot or driver reload seen yet"


_FIELDS = {f.name: f.type for f in dataclasses.fields(Watch)}


def _watch(raw: Any) -> Watch | None:
    """A watch read back from the file, every field checked; None when anything is off."""
    if not isinstance(raw, dict) or set(raw) != set(_FIELDS):
        return None
    try:
        w = Watch(**raw)
    except TypeError:
        return None
    texts = (w.uuid, w.signature, w.verdict, w.state, w.action, w.detail, w.recurred_by)
    times = (w.action_at, w.back_at, w.until, w.ended_at)
    if not all(isinstance(t, str) and len(t) <= 300 for t in texts) or w.state not in STATES:
        return None
    if w.action and w.action not in ACTIONS:
        return None
    if not isinstance(w.opened, (int, float)) or isinstance(w.opened, bool) or w.opened != w.opened:
        return None
    if not all(t is None or (isinstance(t, (int, float)) and not isinstance(t, bool) and t == t) for t in times):
        return None
    if w.cleared is not None and not isinstance(w.cleared, bool):
        return None
    return w


class RecoveryTracker:
    """The watches of every GPU (see the module docstring); the last :data:`KEPT` per GPU are kept.

    Args:
        timeline: where the watches are kept and their changes recorded.
        window_s: the recurrence window, seconds.
        clock: monotonic clock (tests inject).
        wall: Unix time (tests inject).
    """

    def __init__(
        self,
        timeline: Timeline,
        window_s: float = DEFAULT_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.timeline = timeline
        self.window_s = window_s
        self.clock = clock
        self.wall = wall
        self.watches: dict[str, list[Watch]] = {}  # uuid -> its watches, oldest first
        self._back_mono: dict[str, float] = {}  # uuid -> monotonic time it came back (this process)
        raw = timeline.extra.get(EXTRA)
        for uuid, bodies in list(raw.items())[:LANES] if isinstance(raw, dict) else ():
            kept = [w for w in map(_watch, bodies[-KEPT:] if isinstance(bodies, list) else ()) if w and w.uuid == uuid]
            if len(kept) != (min(len(bodies), KEPT) if isinstance(bodies, list) else -1):
                timeline.dropped.append(f"recovery watch of {str(uuid)[:40]!r}")
            if kept:
                self.watches[uuid] = kept

    def latest(self, uuid: str) -> Watch | None:
        """The GPU's last watch (over or not), None when it never had one."""
        found = self.watches.get(uuid)
        return found[-1] if found else None

    def open_for(self, uuid: str) -> Watch | None:
        """The GPU's watch that is not over (open, pending or watching), or None."""
        w = self.latest(uuid)
        return w if w is not None and w.state in ("open", "pending", "watching") else None

    # -- what the recorder tells it --------------------------------------------------------------

    def sample(self, uuid: str, gpu: str, answers: bool, verdict: str, cause: str) -> None:
        """The GPU's verdict after an evaluation, and whether it answered NVML in a fresh sample.

        A verdict that asks for action opens a watch (or makes an open one's signature the worse
        one); the first answering sample after an action is "back"; while watching, a verdict that
        asks for action again is a recurrence, and a window that passes is "recovered". ``unknown``
        (no fresh reading) is no news.
        """
        if verdict == "unknown":
            return
        acts = RANK.get(verdict, 0) >= ACTS and verdict != "fix_exporter"
        w = self.open_for(uuid)
        if w is None:
            if acts:
                self._open(uuid, gpu, verdict, cause)
            return
        if w.state == "open" and acts and RANK.get(verdict, 0) > RANK.get(w.verdict, 0):
            w.verdict, w.signature = verdict, cause  # it got worse before anything was done
            self._changed(w, gpu, f"{verdict} ({cause}) now")
        elif w.state == "open" and not acts:
            w.action, w.action_at, w.detail = "cleared", self.wall(), "the signature went away by itself"
            self._back(w, gpu, cleared=True)
        elif w.state == "pending" and answers:
            self._back(w, gpu, cleared=not (acts or cause in family(w.signature)))
        elif w.state == "watching" and acts:
            self._recur(w, gpu, f"the verdict asks for {verdict} again ({cause})")
        elif w.state == "watching" and self._window_over(w):
            w.state, w.ended_at = "recovered", self.wall()
            self._changed(w, gpu, w.summary())

    def fault_raised(self, uuid: str, gpu: str, cause: str, verdict: str) -> None:
        """A fault was raised on the GPU: a recurrence while watching when it is the signature's."""
        w = self.open_for(uuid)
        if w is not None and w.state == "watching" and cause in family(w.signature):
            self._recur(w, gpu, f"{cause} raised again ({verdict})")

    def xid(self, uuid: str, gpu: str, xid: int, ts: float) -> None:
        """An Xid on the GPU: a recurrence while watching when it is stamped after the GPU came back."""
        w = self.open_for(uuid)
        if w is not None and w.state == "watching" and w.back_at is not None and ts >= w.back_at:
            self._recur(w, gpu, f"Xid {xid} at {rfc3339(ts)}")

    def action(self, kind: str, detail: str, uuid: str | None = None, gpu: str = "", at: float | None = None) -> None:
        """Something that can cure a fault happened to one GPU or (``uuid`` None) to the whole node:
        every watch not over waits for its GPU to answer (an exporter restart acts on open watches
        only: it does not restart a window already counting, nor replace an action already pending)."""
        for u in [uuid] if uuid is not None else list(self.watches):
            w = self.open_for(u)
            if w is None or (w.state != "open" and kind == "exporter_restart"):
                continue
            w.state, w.action, w.action_at, w.detail = "pending", kind, at or self.wall(), detail
            w.back_at = w.cleared = w.until = None
            self._back_mono.pop(u, None)
            self._changed(w, gpu, f"{detail}; waiting for the GPU to answer")

    # -- transitions -----------------------------------------------------------------------------

    def _open(self, uuid: str, gpu: str, verdict: str, cause: str) -> None:
        w = Watch(uuid, cause, verdict, self.wall())
        self.watches[uuid] = [*self.watches.get(uuid, [])[-(KEPT - 1) :], w]
        self._changed(w, gpu, f"{verdict}: recovery is checked once it is acted on")

    def _back(self, w: Watch, gpu: str, cleared: bool) -> None:
        if not cleared and w.action == "exporter_restart":
            w.state, w.action, w.action_at, w.detail = "open", "", None, ""  # no cure, no recurrence
            self._changed(w, gpu, f"the signature ({w.signature}) is still there after the exporter restart: open")
            return
        w.back_at, w.cleared = self.wall(), cleared
        if not cleared:
            self._recur(w, gpu, f"the signature ({w.signature}) did not clear after {w.action.replace('_', ' ')}")
            return
        w.state, w.until = "watching", w.back_at + self.window_s
        self._back_mono[w.uuid] = self.clock()
        self._changed(w, gpu, w.summary())

    def _recur(self, w: Watch, gpu: str, why: str) -> None:
        w.state, w.ended_at, w.recurred_by = "recurred", self.wall(), why
        self._changed(w, gpu, w.summary(), level=logging.WARNING)

    def _window_over(self, w: Watch) -> bool:
        mono = self._back_mono.get(w.uuid)
        if mono is not None:
            return self.clock() - mono >= self.window_s
        return w.until is not None and self.wall() >= w.until  # since a restart: the wall clock spans it

    def _changed(self, w: Watch, gpu: str, text: str, level: int = logging.INFO) -> None:
        self.timeline.set_extra(EXTRA, {u: [dataclasses.asdict(x) for x in ws] for u, ws in self.watches.items()})
        self.timeline.add(
            "recovery",
            w.uuid,
            f"{w.signature}: {text}",
            {"signature": w.signature, "verdict": w.verdict, "state": w.state, "action": w.action},
            gpu=gpu,
        )
        log.log(
            level, "GPU %s (%s) recovery check (%s): %s", gpu or "?", w.uuid, w.signature, text, extra={"uuid": w.uuid}
        )
