"""The restart policy: how a worker ended -> what the supervisor does next. Pure: no processes, no I/O.

Rules (docs/design.md, "Failure model"):

- every death is followed by a restart after a delay that doubles per consecutive failure
  (``backoff_initial_s``, ``2x``, ``4x`` … up to ``backoff_max_s``); a worker that lived long
  enough (``healthy_after_s``) after delivering samples resets the sequence, and so does a new
  quarantine (the cause is switched off, so the next worker should start at once);
- a crash (a fault signal of the worker's own) or hang with a breadcrumb in a quarantinable feature
  counts toward that feature's quarantine (:mod:`exporter.supervisor.quarantine` keeps the window and
  the threshold); a death from outside (``killed``) or by the OOM killer (``oom``) never does
  (:mod:`exporter.supervisor.deaths`);
- a hung worker that cannot be reaped (uninterruptible sleep) is set aside; when a second one
  is set aside, or the replacement hangs unreapably in the same place, respawning stops rather
  than piling up workers stuck in the driver.
"""

from __future__ import annotations

import signal
from collections.abc import Collection
from dataclasses import dataclass

from exporter.common.breadcrumb import Breadcrumb

MAX_EXPONENT = 62  # 2.0 ** 62 s is beyond any max: the delay is capped long before, without overflow


@dataclass(frozen=True)
class Outcome:
    """How a worker ended.

    Attributes:
        reason: ``crash`` (a fault signal of its own: SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE),
            ``hang`` (missed its deadline and was killed), ``killed`` (a signal from outside:
            SIGKILL, SIGTERM …), ``oom`` (SIGKILL by the OOM killer), ``exit`` (exited by itself),
            ``nvml_error`` (NVML unusable), ``quarantine`` (replaced so that a feature quarantined
            meanwhile is off), ``stopped`` (we stopped it) (:func:`exporter.supervisor.deaths.classify`).
        returncode: the process return code (negative: signal), None if it could not be reaped.
        signal: the signal number that ended it, 0 if none.
        crumb: the NVML call in flight when it ended, if any.
        lifetime_s: seconds from spawn to end.
        reaped: False when it survived SIGKILL (uninterruptible sleep).
        stack: the worker's faulthandler output, if it printed one.
        signal_from: who sent :attr:`signal`: ``self``, ``supervisor``, ``outside``, ``oom_killer``,
            "" when no signal ended it.
    """

    reason: str
    returncode: int | None
    signal: int
    crumb: Breadcrumb | None
    lifetime_s: float
    reaped: bool
    stack: str
    signal_from: str = ""

    def record(self) -> dict[str, object]:
        """The structured log record of this death."""
        crumb = self.crumb
        return {
            "reason": self.reason,
            "exit_code": self.returncode if self.returncode is not None and self.returncode >= 0 else None,
            "signal": signal.Signals(self.signal).name if self.signal else None,
            "signal_from": self.signal_from or None,
            "feature": crumb.feature if crumb else None,
            "function": crumb.function if crumb else None,
            "uuid": crumb.uuid if crumb else None,
            "worker_lifetime_s": round(self.lifetime_s, 3),
        }

    def place(self) -> tuple[str, str]:
        """(feature, NVML function) in flight, ``("unknown", "unknown")`` without a breadcrumb."""
        return (self.crumb.feature, self.crumb.function) if self.crumb else ("unknown", "unknown")


@dataclass(frozen=True)
class Decision:
    """What to do after a worker ended.

    Attributes:
        delay_s: wait this long before the next worker.
        stop_respawn: do not start another worker while the unreaped ones live.
    """

    delay_s: float
    stop_respawn: bool


class RestartPolicy:
    """Backoff and respawn decisions.

    Args:
        backoff_initial_s: first restart delay.
        backoff_max_s: longest restart delay.
        healthy_after_s: a worker that delivered samples and lived this long resets the backoff.
        quarantinable: features whose crashes count toward a quarantine.
    """

    def __init__(
        self, backoff_initial_s: float, backoff_max_s: float, healthy_after_s: float, quarantinable: Collection[str]
    ) -> None:
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.healthy_after_s = healthy_after_s
        self.quarantinable = frozenset(quarantinable)
        self.consecutive = 0
        self.last_hang_place: tuple[str, str] | None = None

    def quarantine_candidate(self, out: Outcome) -> tuple[str, str] | None:
        """(feature, function) to count toward a quarantine, or None."""
        if out.reason in ("crash", "hang") and out.crumb and out.crumb.feature in self.quarantinable:
            return out.crumb.feature, out.crumb.function
        return None

    def decide(self, out: Outcome, *, unreaped: int, had_snapshot: bool, new_quarantine: bool) -> Decision:
        """The delay before the next worker, and whether to stop respawning.

        Args:
            out: how the worker ended.
            unreaped: workers set aside because they survived SIGKILL (this one included).
            had_snapshot: at least one snapshot ever arrived.
            new_quarantine: this death tipped a feature into quarantine.
        """
        stop = False
        if out.reason == "hang" and not out.reaped:
            place = out.place()
            stop = unreaped > 1 or self.last_hang_place == place
            self.last_hang_place = place
        if new_quarantine or (out.lifetime_s >= self.healthy_after_s and had_snapshot):
            self.consecutive = 0
        self.consecutive += 1
        exponent = min(self.consecutive - 1, MAX_EXPONENT)
        return Decision(min(self.backoff_initial_s * 2.0**exponent, self.backoff_max_s), stop)
