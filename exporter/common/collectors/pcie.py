"""PCIe link generation and width (current and max) and the replay counter.

Sources: nvmlDeviceGetCurrPcieLinkGeneration, nvmlDeviceGetMaxPcieLinkGeneration (max of device
and system), nvmlDeviceGetCurrPcieLinkWidth, nvmlDeviceGetMaxPcieLinkWidth,
nvmlDeviceGetPcieReplayCounter (cumulative). PCIe throughput (nvmlDeviceGetPcieThroughput) is not
read: it blocks ~21 ms per call (nvml.h: "querying a byte counter over a 20ms interval"; 20.8-21.5 ms
measured on H200 / 580.159.04).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.common.gpustate import GpuState, Lifetime
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import AtMost, Check, Monotonic, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "pcie"
NEEDS: tuple[str, ...] = ()
DETAILS = "details"  # the static maxima: outside the default budget of 60 series per GPU

LINK_GENERATION = MetricDef(
    "nvgpu_pcie_link_generation", "Current PCIe link generation (nvmlDeviceGetCurrPcieLinkGeneration)"
)
LINK_MAX_GENERATION = MetricDef(
    "nvgpu_pcie_link_max_generation",
    "Maximum PCIe link generation of device and system (nvmlDeviceGetMaxPcieLinkGeneration)",
)
LINK_WIDTH = MetricDef("nvgpu_pcie_link_width", "Current PCIe link width in lanes (nvmlDeviceGetCurrPcieLinkWidth)")
LINK_MAX_WIDTH = MetricDef(
    "nvgpu_pcie_link_max_width", "Maximum PCIe link width in lanes (nvmlDeviceGetMaxPcieLinkWidth)"
)
REPLAY_ERRORS = MetricDef("nvgpu_pcie_replay_errors_total", "PCIe replays (nvmlDeviceGetPcieReplayCounter)")
METRICS = (
    LINK_GENERATION,
    LINK_MAX_GENERATION,
    LINK_WIDTH,
    LINK_MAX_WIDTH,
    REPLAY_ERRORS,
)


@dataclass(frozen=True)
class Reading:
    generation: int | None
    max_generation: int | None
    width: int | None
    max_width: int | None
    replay_count: int | None


# PCIe defines generations 1 to 7 and links of 1 to 32 lanes; the current link at most the maximum.
CHECKS: tuple[Check, ...] = (
    Range("generation", "max_generation", low=1, high=7),
    Range("width", "max_width", low=1, high=32),
    AtMost("generation", "max_generation", factor=1, reason="above_max"),
    AtMost("width", "max_width", factor=1, reason="above_max"),
    Monotonic("replay_count"),
)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass
class MaxLink(GpuState):
    """The static maxima (generation, width) as NVML answered them, until the next re-probe."""

    LIFETIME = Lifetime.PROBE
    read: bool = False
    generation: Any = None
    width: Any = None


def read(dev: DeviceClient) -> Reading | None:
    static: tuple[Any, Any] = (None, None)
    if DETAILS in dev.enabled:
        maxima = dev.state_of(MaxLink)
        if not maxima.read:
            maxima.generation = dev.get(FEATURE, "nvmlDeviceGetMaxPcieLinkGeneration")
            maxima.width = dev.get(FEATURE, "nvmlDeviceGetMaxPcieLinkWidth")
            maxima.read = True
        static = (maxima.generation, maxima.width)
    r = Reading(
        generation=_int(dev.get(FEATURE, "nvmlDeviceGetCurrPcieLinkGeneration")),
        max_generation=_int(static[0]),
        width=_int(dev.get(FEATURE, "nvmlDeviceGetCurrPcieLinkWidth")),
        max_width=_int(static[1]),
        replay_count=_int(dev.get(FEATURE, "nvmlDeviceGetPcieReplayCounter")),
    )
    return None if r == Reading(None, None, None, None, None) else r


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    gen = LINK_GENERATION.family()
    mgen = LINK_MAX_GENERATION.family()
    width = LINK_WIDTH.family()
    mwidth = LINK_MAX_WIDTH.family()
    replay = REPLAY_ERRORS.family()
    for key, r in samples:
        gen.add(key, r.generation)
        mgen.add(key, r.max_generation)
        width.add(key, r.width)
        mwidth.add(key, r.max_width)
        replay.add(key, r.replay_count)
    for fam in (gen, mgen, width, mwidth, replay):
        yield from fam.done()
