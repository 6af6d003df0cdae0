"""The stuck-context signature: a GPU busy with nothing on it.

The second incident: after Xid 13/31 (a kernel's illegal access) and Xid 43, the driver never
cleaned up the context; the GPU showed 100 % utilization, 0 MiB used and no processes. An Xid
alone does not tell "one bad job" from "the GPU is wedged"; this signature does, together with
the Xid counters (see deploy/prometheus/rules.yaml).

Per GPU, from each snapshot: utilization >= ``utilization`` ratio and zero compute processes, and
nothing actually running:

- where GPM reads (Hopper and newer, feature ``gpm``): SM activity over the last sample interval
  <= ``sm_activity`` (``nvgpu_gpm_sm_activity_ratio``). Busy by utilization, no SM busy, no
  process is the strongest evidence of a wedged context: utilization only says a context is
  resident and "active", GPM says whether any SM did work. It holds whatever memory the dead
  context still pins, and it tells a real job apart even where the exporter sees no processes
  (no hostPID) and the job uses little memory;
- elsewhere (Ampere, Ada: no GPM): framebuffer memory used (v2: excluding driver-reserved memory)
  <= ``memory_bytes``. Where only memory info v1 answers (its ``used`` counts the driver's
  reservation, hundreds of MB on an idle GPU) "empty" cannot be told, and the signature is not
  evaluated: no series rather than one that can never fire.

When the conditions hold continuously for ``after_s`` seconds, ``nvgpu_stuck_context_suspected``
is 1 and ``nvgpu_stuck_context_since_timestamp_seconds`` says when they began. How long they held is
measured on the supervisor's monotonic clock (the snapshots' arrival), so a wall-clock step cannot
make the signature fire early or late; the exported "since" is the wall time of the snapshot in
which they began. A GPU's state is keyed by its UUID: a renumbering moves only its ``gpu`` label. Any condition ending
resets it. When a reading the signature needs is missing (feature off or unsupported) it is not
evaluated and no series is exported for that GPU. Nor on a GPU in MIG mode: device-wide
utilization is not defined there (NVML answers NOT_SUPPORTED), and the parent's process list and
memory do not describe the instances' work, so a utilization some driver might still report would
make the signature fire on a GPU whose instances are busy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.common.collectors import gpm, memory, mig, processes, utilization
from exporter.common.metric import GpuKey, MetricDef
from exporter.supervisor.extensions import Extension

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric
    from exporter.common.snapshot import Snapshot

SUSPECTED = MetricDef(
    "nvgpu_stuck_context_suspected",
    "1 while the GPU shows the stuck-context signature for the configured time (NVGPU_STUCK_*): utilization at "
    "or above the threshold, no compute processes, and no SM activity (GPM) or, without GPM, memory used at or "
    "below the threshold",
)
SINCE = MetricDef(
    "nvgpu_stuck_context_since_timestamp_seconds",
    "Unix time the current stuck-context signature began (present only while it holds)",
)
METRICS = (SUSPECTED, SINCE)


@dataclass
class _GpuState:
    since: float | None = None  # snapshot time (Unix) the conditions first held, None if not holding
    holding: bool = False
    evaluable: bool = False
    since_mono: float | None = None  # supervisor monotonic time they first held (the decision's clock)
    index: str = ""  # the gpu label of the last snapshot
    uuid: str = ""


class StuckDetector(Extension):
    """Feeds on snapshots (supervisor side); renders two per-GPU families.

    Args:
        utilization: ratio at or above which the GPU counts as busy (0..1).
        memory_bytes: memory used at or below which the GPU counts as empty (without GPM).
        after_s: how long the conditions must hold.
        sm_activity: GPM SM activity ratio at or below which no SM counts as working (0..1).
        clock: monotonic clock (tests); read when a snapshot arrives.
    """

    metrics = METRICS

    def __init__(
        self,
        utilization: float,
        memory_bytes: int,
        after_s: float,
        sm_activity: float = 0.01,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.utilization = utilization
        self.memory_bytes = memory_bytes
        self.after_s = after_s
        self.sm_activity = sm_activity
        self.clock = clock
        self.gpus: dict[str, _GpuState] = {}  # GPU key (UUID) -> its signature state

    def on_snapshot(self, snapshot: Snapshot) -> None:
        """Update every GPU's state from one snapshot."""
        ts, now = snapshot.ts, self.clock()
        seen = set()
        for g in snapshot.gpus:
            if g.state == "removed":
                continue
            key = g.key
            seen.add(key)
            st = self.gpus.setdefault(key, _GpuState())
            st.index, st.uuid = str(g.index), g.uuid
            util = g.reading(utilization.Reading)
            procs = g.reading(processes.Reading)
            busy = util.gpu_percent if util else None
            idle = self._nothing_runs(g.reading(gpm.Reading), g.reading(memory.Reading))
            partitioned = g.reading(mig.Reading)
            if partitioned is not None and partitioned.enabled:
                busy = None  # MIG mode: no device-wide utilization to judge by
            if not g.up or busy is None or idle is None or procs is None:
                st.evaluable, st.since, st.since_mono, st.holding = False, None, None, False
                continue
            st.evaluable = True
            if not (busy / 100.0 >= self.utilization and idle and procs.count == 0):
                st.since, st.since_mono, st.holding = None, None, False
                continue
            if st.since is None or st.since_mono is None:
                st.since, st.since_mono = ts, now
            st.holding = now - st.since_mono >= self.after_s
        for key in list(self.gpus):
            if key not in seen:
                del self.gpus[key]

    def _nothing_runs(self, profile: gpm.Reading | None, mem: memory.Reading | None) -> bool | None:
        """No SM busy (GPM) or, without GPM, no memory in use; None when neither can be told."""
        sm = profile.activity_percent.get(gpm.SM_UTIL) if profile else None
        if sm is not None:
            return sm / 100.0 <= self.sm_activity
        if mem is None or mem.used_bytes is None or mem.includes_reserved:
            return None  # v1 memory counts the driver's reservation as used: "empty" cannot be told
        return mem.used_bytes <= self.memory_bytes

    def suspected(self, uuid: str) -> bool:
        """True while the signature holds for that GPU."""
        st = self.gpus.get(uuid)
        return st is not None and st.holding

    def since(self, uuid: str) -> float | None:
        """Unix time (snapshot time) the signature's conditions began on that GPU, None when they do not hold."""
        st = self.gpus.get(uuid)
        return st.since if st is not None else None

    def since_mono(self, uuid: str) -> float | None:
        """The same on the supervisor's monotonic clock (how long it held is measured on it)."""
        st = self.gpus.get(uuid)
        return st.since_mono if st is not None else None

    def gpu_families(self, snapshot: Snapshot) -> Iterable[Metric]:
        flag, since = SUSPECTED.family(), SINCE.family()
        for _key, st in sorted(self.gpus.items(), key=lambda item: (item[1].index, item[0])):
            if not st.evaluable:
                continue
            labels = GpuKey(st.index, st.uuid)
            flag.add(labels, 1 if st.holding else 0)
            if st.holding and st.since is not None:
                since.add(labels, st.since)
        return [flag.always(), since.always()]
