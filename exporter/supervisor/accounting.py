"""What a worker's death, or one GPU's hang, means: counters, one log record, quarantines, exclusions.

The supervisor hands every ended worker (:class:`~exporter.supervisor.policy.Outcome`) and every GPU a worker
reports hung to an :class:`Accountant`. It counts the death by reason and by the NVML call in
flight, logs one structured record with the dead worker's stack, counts a crash or hang toward its
feature's quarantine (:mod:`exporter.supervisor.quarantine`: a fault that follows the feature to a
second GPU, or the threshold of faults no GPU's exclusion contains), keeps a GPU that crashed
natively out of the next workers
(:mod:`exporter.supervisor.gpuhealth`), and returns the delay the restart policy (:mod:`exporter.supervisor.policy`)
decides. A feature quarantined by a GPU hang asks for the worker to be replaced: the hung thread
cannot be reused.

Only the worker's own fault (``crash``) and a call that did not return (``hang``) are counted
against the NVML call in flight; a worker killed from outside (``killed``) or by the OOM killer
(``oom``) is counted by reason and logged with the call it was in, never blamed on it
(:mod:`exporter.supervisor.deaths`).
"""

from __future__ import annotations

import logging

from exporter.config import Config
from exporter.supervisor.policy import Outcome, RestartPolicy
from exporter.supervisor.quarantine import Quarantine, QuarantineStore, retry_hint
from exporter.supervisor.served import ServedState

log = logging.getLogger("exporter.supervisor")

RM_MISMATCH_RETRY_S = 60.0  # LIB_RM_VERSION_MISMATCH: re-init at most once a minute


class Accountant:
    """Counts and decides after worker deaths and GPU hangs.

    Args:
        config: parsed configuration.
        state: the served state (counters, GPU health).
        quarantine: the crash quarantine store.
        policy: the restart policy.
    """

    def __init__(self, config: Config, state: ServedState, quarantine: QuarantineStore, policy: RestartPolicy) -> None:
        self.config = config
        self.state = state
        self.quarantine = quarantine
        self.policy = policy
        self.replace_worker = False  # a quarantine needs a worker without the feature

    def worker_ended(self, out: Outcome, unreaped: int) -> float:
        """Count the death, log one record, quarantine if due; returns the restart delay."""
        w = self.state.worker
        w.restarts[out.reason] += 1
        w.last_exit_signal = out.signal
        if out.returncode is not None and out.returncode >= 0:
            w.last_exit_code = out.returncode
        if out.reason in ("crash", "hang"):
            w.crashes[out.place()] += 1
        self._log_death(out)
        self.state.record(self.state.recorder.worker_death, out)
        new = self.count_crash(out)
        decision = self.policy.decide(
            out, unreaped=unreaped, had_snapshot=self.state.last is not None, new_quarantine=new is not None
        )
        delay = decision.delay_s
        if out.reason == "nvml_error" and self.state.nvml.driver_reload_required:
            delay = max(delay, RM_MISMATCH_RETRY_S)
        if decision.stop_respawn and not w.respawn_stopped:
            w.respawn_stopped = True
            log.error(
                "the replacement worker hung in the same place (%s/%s) and cannot be reaped: respawning "
                "stopped; /metrics keeps serving; the node needs attention (GPU reset or reboot)",
                *out.place(),
            )
        return delay

    def gpu_hung(self, uuid: str, feature: str, function: str) -> None:
        """A call on one GPU did not return: it counts toward the feature's quarantine like a worker
        hang. When it tips the feature into quarantine, the worker is replaced (its hung thread
        cannot be reused) by one that runs without the feature."""
        if not feature or feature not in self.policy.quarantinable:
            return
        self.state.worker.crashes[(feature, function)] += 1
        new = self.quarantine.record(feature, function, uuid, contained=self.state.health.others_left(uuid))
        if new is not None:
            self._log_quarantine(new)
            self.state.health.on_quarantine(new.feature)
            self.replace_worker = True

    def count_crash(self, out: Outcome) -> Quarantine | None:
        """Count a crash or hang toward its feature's quarantine and, for a native crash in a call on
        one GPU, keep that GPU out of the next workers (exporter.supervisor.gpuhealth). Returns a new quarantine."""
        candidate = self.policy.quarantine_candidate(out)
        crumb = out.crumb
        uuid = crumb.uuid if crumb is not None and out.reason in ("crash", "hang") else ""
        # contained: a crashed GPU is left out of the next workers (a probe's GPU is out already),
        # as long as another GPU is left to sample; a whole-worker hang leaves no GPU out
        contained = bool(uuid) and (out.reason == "crash" or self.state.health.excluded(uuid))
        contained = contained and self.state.health.others_left(uuid)
        new = self.quarantine.record(*candidate, uuid, contained=contained) if candidate is not None else None
        if new is not None:
            self._log_quarantine(new)
            for rec in self.state.health.on_quarantine(new.feature):
                log.info("%s was out only for crashes in %s: back in", rec.label(), new.feature)
        # only a crash is the GPU's "crashed": a whole-worker hang is a deadline kill (a frozen or
        # CPU-throttled exporter causes one too), and a GPU whose own call hangs is reported hung by
        # the worker (gpuhealth.on_snapshot); a probe that hangs on a hung GPU leaves it hung
        if uuid and crumb is not None and out.reason == "crash":
            out_rec = self.state.health.on_crash(uuid, crumb.feature, quarantined=new is not None)
            if out_rec is not None:
                log.error(
                    "%s is left out of the next workers after a crash in %s/%s; the other GPUs keep being "
                    "sampled; a probe retries it in %.0f s",
                    out_rec.label(),
                    crumb.feature,
                    crumb.function,
                    out_rec.backoff_s,
                    extra={"gpu": out_rec.index, "uuid": out_rec.uuid, "feature": crumb.feature},
                )
        return new

    def _log_death(self, out: Outcome) -> None:
        record = out.record()
        if out.reason in ("crash", "hang"):
            feature, function = out.place()
            log.error(
                "worker died: %s in %s/%s on GPU %s after %.1f s",
                out.reason,
                feature,
                function,
                (out.crumb.uuid if out.crumb else "") or "-",
                out.lifetime_s,
                extra={**record, "stack": out.stack},
            )
        elif out.reason in ("killed", "oom"):
            crumb = out.crumb
            where = f"{crumb.feature}/{crumb.function} on {crumb.uuid or '-'}" if crumb else "no NVML call"
            log.warning(
                "worker killed by %s %s after %.1f s (%s); not counted against any NVML call",
                record["signal"],
                "from outside" if out.reason == "killed" else "of the OOM killer",
                out.lifetime_s,
                f"in flight: {where}",
                extra=record,
            )
        elif out.reason == "nvml_error":
            log.debug("worker exited: %s", self.state.last_init_error or "NVML unavailable", extra=record)
        else:
            log.warning("worker exited with code %s after %.1f s", out.returncode, out.lifetime_s, extra=record)

    def _log_quarantine(self, new: Quarantine) -> None:
        self.state.record(self.state.recorder.quarantine, new)
        # No extra fields: in the text format they would follow the command the message ends with.
        log.warning(
            "feature %s QUARANTINED: %s. All other features keep being sampled; NVGPU_FEATURE_%s=on does not "
            "override a quarantine; %s",
            new.feature,
            new.detail(),
            new.feature.upper(),
            retry_hint(self.config.state_file, new.feature),
        )
