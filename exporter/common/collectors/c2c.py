"""NVLink-C2C, the chip-to-chip link between the GPU and its Grace CPU (GH200, GB200): links, their
state, and their error counters.

Sources, one ``nvmlDeviceGetFieldValues`` call per GPU and sample (each entry's own code checked):
``NVML_FI_DEV_C2C_LINK_COUNT`` (170, read once per re-probe; 0 or NOT_SUPPORTED on a GPU without
C2C: the H200 says "GPU C2C Mode: Disabled"), ``NVML_FI_DEV_C2C_LINK_GET_STATUS`` (171: 0 inactive,
1 active), and from the 12.9 header (R575) ``NVML_FI_DEV_C2C_LINK_ERROR_INTR`` (231: CRC errors),
``…_ERROR_REPLAY`` (232) and ``…_ERROR_REPLAY_B2B`` (233: back-to-back replays), counters since the
driver loaded; on R570 those ids are unknown (INVALID_ARGUMENT, cached: no error series there). The
header does not say whether 171 and 231-233 take the link as scopeId; they are asked per link
(scopeId = link index, as the NVLink fields), so a driver that rejects the scope answers
INVALID_ARGUMENT and those series are absent. Per GPU: links present, links up, errors summed over
the links.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.common.gpustate import GpuState, Lifetime
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import Check, Monotonic, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "c2c"
NEEDS: tuple[str, ...] = ()
NVML_FI_DEV_C2C_LINK_COUNT = 170
NVML_FI_DEV_C2C_LINK_GET_STATUS = 171
ERROR_FIELDS = (("crc", 231), ("replay", 232), ("replay_b2b", 233))  # NVML_FI_DEV_C2C_LINK_ERROR_*
_TYPE_OF = {fid: name for name, fid in ERROR_FIELDS}

LINKS = MetricDef("nvgpu_c2c_links", "NVLink-C2C links present (field NVML_FI_DEV_C2C_LINK_COUNT)")
LINKS_UP = MetricDef(
    "nvgpu_c2c_links_up", "NVLink-C2C links whose status is active (field NVML_FI_DEV_C2C_LINK_GET_STATUS per link)"
)
ERRORS = MetricDef(
    "nvgpu_c2c_errors_total",
    "NVLink-C2C errors summed over the links: crc, replay, replay_b2b (fields NVML_FI_DEV_C2C_LINK_ERROR_INTR, "
    "_REPLAY, _REPLAY_B2B per link; R575+)",
    ("error_type",),
)
METRICS = (LINKS, LINKS_UP, ERRORS)


@dataclass(frozen=True)
class Reading:
    """One GPU's NVLink-C2C links and their errors, from one ``nvmlDeviceGetFieldValues`` call.

    Attributes:
        links: links present (field ``NVML_FI_DEV_C2C_LINK_COUNT``, 170; > 0: a GPU without C2C gives
            no reading).
        links_up: links whose status (``NVML_FI_DEV_C2C_LINK_GET_STATUS``, 171, per link) is 1
            (active); None unless every link's status answered (an unknown link is not a down one).
        errors: error type (crc, replay, replay_b2b: fields 231-233, R575+) -> count since the driver
            loaded, summed over each link's last answer; a type no link answered is left out.
    """

    links: int
    links_up: int | None
    errors: dict[str, int] = field(default_factory=dict)  # error type -> sum of each link's last value


MAX_LINKS = 64  # NVML_NVLINK_MAX_LINKS: more C2C links than NVLinks is not a reading
CHECKS: tuple[Check, ...] = (
    Range("links", "links_up", low=0, high=MAX_LINKS),
    Monotonic("errors"),
)


@dataclass
class LinkCount(GpuState):
    """The C2C link count, until the next re-probe."""

    LIFETIME = Lifetime.PROBE
    count: int | None = None


@dataclass
class LastErrors(GpuState):
    """Each link's error counters as last read ((link, type) -> count), so a link that does not answer
    once does not make a sum look reset."""

    LIFETIME = Lifetime.DEVICE
    last: dict[tuple[int, str], int] = field(default_factory=dict)


def read(dev: DeviceClient) -> Reading | None:
    """The GPU's C2C reading: the link count once per re-probe (field 170), then the status and error
    fields of every link (scopeId = link index) in one ``nvmlDeviceGetFieldValues`` call.

    Returns:
        The reading; None where the GPU has no C2C link (count 0 or NOT_SUPPORTED: the feature
        unsupported) or the count did not answer this time.
    Raises:
        DeviceLost: the GPU is gone.
        NvmlFatal: NVML is unusable.
    """
    static = dev.state_of(LinkCount)
    if static.count is None:
        value = dev.fields(FEATURE, [(NVML_FI_DEV_C2C_LINK_COUNT, 0)]).get((NVML_FI_DEV_C2C_LINK_COUNT, 0))
        if value is None:
            return None  # unsupported (cached: asked again at a re-probe) or transient
        static.count = int(value)
    if static.count <= 0:
        dev.nothing_to_read(FEATURE, "C2C link count", "0 NVLink-C2C links")
        return None
    links = range(static.count)
    pairs = [(NVML_FI_DEV_C2C_LINK_GET_STATUS, link) for link in links]
    pairs += [(fid, link) for link in links for _, fid in ERROR_FIELDS]
    got = dev.fields(FEATURE, pairs)
    status = [got.get((NVML_FI_DEV_C2C_LINK_GET_STATUS, link)) for link in links]
    # Links up only when every link's status answered: a link whose field failed is unknown, not
    # down, and counting it down would make links_up < links (the critical NvgpuC2cLinkDown).
    links_up = None if any(s is None for s in status) else sum(1 for s in status if s is not None and int(s) == 1)
    last = dev.state_of(LastErrors).last
    for (fid, link), value in got.items():
        if fid in _TYPE_OF:
            last[(link, _TYPE_OF[fid])] = int(value)
    errors: dict[str, int] = {}
    for (_, name), value in last.items():
        errors[name] = errors.get(name, 0) + value
    return Reading(static.count, links_up, errors)


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    links = LINKS.family()
    up = LINKS_UP.family()
    errors = ERRORS.family()
    for key, r in samples:
        links.add(key, r.links)
        up.add(key, r.links_up)
        for name, _ in ERROR_FIELDS:
            errors.add(key, r.errors.get(name), name)
    for fam in (links, up, errors):
        yield from fam.done()
