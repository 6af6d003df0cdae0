"""NVLink links up and data-link error counters: per GPU by default, per link where it matters.

Sources: nvmlDeviceGetNvLinkState(link) every sample (2 µs a call); the DL error counters through
one ``nvmlDeviceGetFieldValues`` call per GPU and sample with fields
``NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY`` (161), ``_RECOVERY`` (162) and ``_CRC`` (163), the link as
scopeId (every entry's own return code checked); nvmlDeviceGetNvLinkErrorCounter(link, counter:
NVML_NVLINK_ERROR_DL_REPLAY 0, DL_RECOVERY 1, DL_CRC_FLIT 2, DL_CRC_DATA 3) for data CRC, which has
no per-link field, and for any counter whose field the driver does not serve (the 570 header marks
161-163 "unsupported for Blackwell+").

Measured on the H200 pair (driver 580.159.04, 2026-11-30):
each nvmlDeviceGetNvLinkErrorCounter call is a driver RPC of about 0.9 ms (18 links x 4 counters:
63 ms per GPU); the one field-value call for 18 links x 3 fields takes 14-15 ms and gives the same
values as the per-call replay, recovery and flit-CRC counters; the all-lane total fields (38, 45,
52, 59) answer NOT_SUPPORTED. So the three batched counters are read every sample (about 15 ms per
GPU, on that GPU's own thread), and the per-call ones every :data:`SLOW_EVERY_S` seconds (data CRC:
18 calls, about 16 ms per GPU every 30 s), their last values exported in between.

Blackwell (NVLink5: B200, GB200, from the 12.6 header / R560): fields 161-163 answer NOT_SUPPORTED
("unsupported for Blackwell+", nvml.h 12.8+), and so, the fake assumes, does the per-call counter
(no public source says what it answers there). NVLink5 counts its errors in the
``NVML_FI_DEV_NVLINK_COUNT_*`` fields, per link (scopeId = link), read in a field-value call of their
own (DCGM answered N/A for them when asked together with other fields on GB200: NVIDIA/DCGM#265).
They go under the same families as Hopper's where the meaning is the same, and under error types of
their own where it is not (:data:`NVLINK5_FIELDS`):

- ``recovery``: 215 ``LINK_RECOVERY_EVENTS`` (the link went from up into recovery, whatever the
  result), the meaning of Hopper's DL recovery counter (162). One source per link, chosen at its
  first answer and kept for the GPU's life (:data:`RECOVERY_SOURCES`): 215 where it answers, else
  162, else the per-call DL recovery counter; a driver answering two of them never writes both into
  one series (they would alternate and read as decreases, then a reset). The counter that predicted a public
  GB200 link failure: 505 recovery events on one link, still growing, then Xid 149 link down five
  days later (marin-community/marin#9086).
- new error types, NVLink5 only: ``recovery_failed`` (214: recovery failed, link declared down),
  ``effective`` (219: errors summed over each packet) and ``symbol`` (221: errors in received
  symbols) by default; with ``details`` also ``malformed_packet`` (206), ``buffer_overrun`` (207),
  ``receive`` (208), ``receive_remote`` (209, marked by an upstream error), ``receive_general``
  (210, header mismatch), ``local_link_integrity`` (211) and ``transmit_discard`` (212).
- Hopper's ``replay`` (retransmissions) and flit/data CRC counts have no NVLink5 field of the same
  meaning: 219 and 221 count bit errors, not retransmitted flits, so they are not called ``replay``
  or ``crc_*``.

A link is shown on its own by default once it counts NVLink5 recoveries (``recovery`` or
``recovery_failed``), as a Hopper link is once it counts replays, recoveries or flit CRCs. A GPU with
links whose every error counter answers unsupported (legacy fields, per-call counters and NVLink5
fields alike) has the feature ``unsupported``: link states alone are not NVLink monitoring, and a
dashboard must not show such a GPU's links as healthy.

The links are discovered once per worker life (and after a re-probe) by asking link 0, 1, … until
the driver answers INVALID_ARGUMENT or NOT_SUPPORTED: ``NVML_NVLINK_MAX_LINKS`` is only an upper
bound (18 up to nvidia-ml-py 13.595, 36 from 13.610) and indices past the real count answer
INVALID_ARGUMENT (NVIDIA/TensorRT-LLM PR #17060, on GB200's 18 links).

Series (the everyday question is "is any link of this GPU erroring", and 18 links x 5
series per GPU were most of a node's series):

- per GPU, always: links up, and each error type summed over the links. The sum adds each link's
  last value, so a link that fails to answer once does not make the counter look reset.
- per link (state and the four error counters): every link with the ``nvlink_links`` feature on;
  otherwise only links with a non-zero replay, recovery or flit-CRC count. Data CRC does not
  select a link: every link of the measured healthy pair counted 25 to 375 data-CRC errors since the
  driver loaded, so it would select them all. A selected link stays selected for the worker's life,
  and because the counters only grow until the driver reloads (or an explicit reset), the next
  worker selects the same links at once: a link's series do not appear and vanish. The increase
  that selects a link is seen by the per-GPU total (alert on that); the per-link series say which.
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

FEATURE = "nvlink"
NEEDS: tuple[str, ...] = ()
LINKS_SWITCH = "nvlink_links"  # every link's series
MAX_LINKS = 36
COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))
_DL_TYPES = tuple(name for name, _ in COUNTERS)
# Per-link field ids of the DL error counters (nvml.h; scopeId = link).
FIELDS = {"replay": 161, "recovery": 162, "crc_flit": 163}
_TYPE_OF_FIELD = {fid: name for name, fid in FIELDS.items()}
# NVLink5 per-link error fields (nvml.h 12.6+, NVML_FI_DEV_NVLINK_COUNT_*): error type -> field id.
NVLINK5_FIELDS = {
    "recovery": 215,  # ..._LINK_RECOVERY_EVENTS: the meaning of Hopper's DL recovery
    "recovery_failed": 214,  # ..._LINK_RECOVERY_FAILED_EVENTS
    "effective": 219,  # ..._EFFECTIVE_ERRORS
    "symbol": 221,  # ..._SYMBOL_ERRORS
    "malformed_packet": 206,  # ..._MALFORMED_PACKET_ERRORS
    "buffer_overrun": 207,  # ..._BUFFER_OVERRUN_ERRORS
    "receive": 208,  # ..._RCV_ERRORS
    "receive_remote": 209,  # ..._RCV_REMOTE_ERRORS
    "receive_general": 210,  # ..._RCV_GENERAL_ERRORS
    "local_link_integrity": 211,  # ..._LOCAL_LINK_INTEGRITY_ERRORS
    "transmit_discard": 212,  # ..._XMIT_DISCARDS
}
NVLINK5_DEFAULT = ("recovery", "recovery_failed", "effective", "symbol")  # the rest with ``details``
_TYPE_OF_NVLINK5 = {fid: name for name, fid in NVLINK5_FIELDS.items()}
# Every error type, Hopper's first (the order of the series)
ERROR_TYPES = _DL_TYPES + tuple(t for t in NVLINK5_FIELDS if t not in _DL_TYPES)
DETAILS = "details"
# The counters that make a link's own series appear by default (see the module docstring).
SELECTING = ("replay", "recovery", "crc_flit", "recovery_failed")
SLOW_EVERY_S = 30.0
# The sources of a link's ``recovery`` counter, most preferred first; one per link, never two.
RECOVERY_NVLINK5 = "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS"  # field 215, the documented NVLink5 one
RECOVERY_FIELD = "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY"  # field 162 (Hopper and older)
RECOVERY_CALL = "nvmlDeviceGetNvLinkErrorCounter"  # NVML_NVLINK_ERROR_DL_RECOVERY, where 162 is unsupported
RECOVERY_SOURCES = (RECOVERY_NVLINK5, RECOVERY_FIELD, RECOVERY_CALL)
NO_COUNTER = "nvmlDeviceGetNvLinkErrorCounter"  # the unsupported-cache key of "no error counter at all"

LINKS_UP = MetricDef(
    "nvgpu_nvlink_links_up", "NVLink links whose state is active (nvmlDeviceGetNvLinkState over the links present)"
)
ERRORS = MetricDef(
    "nvgpu_nvlink_errors_total",
    "NVLink errors summed over the GPU's links (fields NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY/RECOVERY/CRC "
    "161-163 per link; nvmlDeviceGetNvLinkErrorCounter for data CRC and where the fields are unsupported; "
    "NVLink5: fields NVML_FI_DEV_NVLINK_COUNT_* 206-221, recovery = LINK_RECOVERY_EVENTS)",
    ("error_type",),
)
LINK_UP = MetricDef(
    "nvgpu_nvlink_link_up",
    "1 if the NVLink link is active (nvmlDeviceGetNvLinkState); every link with the nvlink_links feature, "
    "else the links with replay, recovery or flit-CRC errors",
    ("link",),
)
LINK_ERRORS = MetricDef(
    "nvgpu_nvlink_link_errors_total",
    "NVLink errors of one link (fields 161-163, nvmlDeviceGetNvLinkErrorCounter; NVLink5: fields "
    "NVML_FI_DEV_NVLINK_COUNT_*); every link with the nvlink_links feature, else the links with replay, "
    "recovery, failed-recovery or flit-CRC errors",
    ("link", "error_type"),
)
METRICS = (
    LINKS_UP,
    ERRORS,
    LINK_UP,
    LINK_ERRORS,
)


@dataclass(frozen=True)
class Reading:
    links_up: int | None  # links whose state is active
    errors: dict[str, int]  # error type -> sum over the links of each link's last value
    link_up: dict[int, int]  # link -> 1/0, for the links shown one by one
    link_errors: dict[str, int]  # "<link>/<error_type>" -> count, same links


CHECKS: tuple[Check, ...] = (
    Range("links_up", low=0, high=MAX_LINKS),
    Range("link_up", low=0, high=1),
    Monotonic("errors", "link_errors"),
)


@dataclass
class Links(GpuState):
    """The GPU's links (link 0, 1, … while the state query answers), until the next re-probe."""

    LIFETIME = Lifetime.PROBE
    links: list[int] | None = None


@dataclass
class LinkCounters(GpuState):
    """One GPU's error counters as last read (kept across re-probes).

    Attributes:
        last: (link, error type) -> the last value read.
        selected: links whose own series are shown by default (non-zero replay, recovery or flit CRC).
        slow_at: backend clock (``NvmlClient.now``: monotonic for real NVML, scenario time for the
            fake) of the last per-call read; None before the first.
        recovery_from: link -> the one source of its ``recovery`` counter, chosen at its first
            answer and kept (:data:`RECOVERY_SOURCES`): two counters in one series would alternate,
            look like decreases and then like a reset.
    """

    LIFETIME = Lifetime.DEVICE
    last: dict[tuple[int, str], int] = field(default_factory=dict)
    selected: set[int] = field(default_factory=set)
    slow_at: float | None = None
    recovery_from: dict[int, str] = field(default_factory=dict)


def links_of(dev: DeviceClient) -> list[int]:
    """The GPU's links (cached until a re-probe): link 0, 1, … while the state query answers."""
    static = dev.state_of(Links)
    if static.links is None:
        links = []
        for link in range(MAX_LINKS):
            state = dev.probe(FEATURE, "nvmlDeviceGetNvLinkState", link)
            if state is None:
                break
            links.append(link)
        static.links = links
    return static.links


def read_counters(dev: DeviceClient, links: Sequence[int], counters: LinkCounters, now: float) -> None:
    """Update ``counters``: the batched fields every call (Hopper's, then NVLink5's in a call of their
    own), per-call counters every SLOW_EVERY_S.

    Raises:
        DeviceLost: the GPU is gone.
        NvmlFatal: NVML is unusable.
    """
    recovery: dict[tuple[int, str], int] = {}  # (link, source) -> this sample's answer
    pairs = [(fid, link) for link in links for fid in FIELDS.values()]
    for (fid, link), value in dev.fields(FEATURE, pairs).items():
        if fid == FIELDS["recovery"]:
            recovery[(link, RECOVERY_FIELD)] = int(value)
        else:
            counters.last[(link, _TYPE_OF_FIELD[fid])] = int(value)
    wanted = NVLINK5_FIELDS if DETAILS in dev.enabled else {t: NVLINK5_FIELDS[t] for t in NVLINK5_DEFAULT}
    nvlink5 = [(fid, link) for link in links for fid in wanted.values()]
    for (fid, link), value in dev.fields(FEATURE, nvlink5).items():  # NOT_SUPPORTED before Blackwell: once
        if fid == NVLINK5_FIELDS["recovery"]:
            recovery[(link, RECOVERY_NVLINK5)] = int(value)
        else:
            counters.last[(link, _TYPE_OF_NVLINK5[fid])] = int(value)
    if counters.slow_at is None or now - counters.slow_at >= SLOW_EVERY_S:
        counters.slow_at = now
        for link in links:
            for name, counter in COUNTERS:
                field_id = FIELDS.get(name)
                if field_id is not None and not dev.field_unsupported(field_id, link):
                    continue  # the batched call serves it
                if name == "recovery" and counters.recovery_from.get(link, RECOVERY_CALL) != RECOVERY_CALL:
                    continue  # a field is this link's recovery source
                value = dev.get(FEATURE, "nvmlDeviceGetNvLinkErrorCounter", link, counter)
                if value is None:
                    continue
                if name == "recovery":
                    recovery[(link, RECOVERY_CALL)] = int(value)
                else:
                    counters.last[(link, name)] = int(value)
    for link in links:
        source = counters.recovery_from.get(link) or _recovery_source(dev, link, recovery)
        if source is not None and (link, source) in recovery:
            counters.recovery_from[link] = source
            counters.last[(link, "recovery")] = recovery[(link, source)]


def _recovery_source(dev: DeviceClient, link: int, answered: dict[tuple[int, str], int]) -> str | None:
    """The most preferred source that answered for ``link`` this sample, none preferred to it still
    possible: field 215 until it answers unsupported, then field 162, then the per-call counter.
    None: wait (a preferred field failed transiently)."""
    for source in RECOVERY_SOURCES:
        if (link, source) in answered:
            return source
        if source == RECOVERY_NVLINK5 and not dev.field_unsupported(NVLINK5_FIELDS["recovery"], link):
            return None
        if source == RECOVERY_FIELD and not dev.field_unsupported(FIELDS["recovery"], link):
            return None
    return None


def no_counter_answers(dev: DeviceClient, links: Sequence[int]) -> bool:
    """Every error counter of every link answered unsupported: the legacy fields, the per-call
    counters and the default NVLink5 fields."""
    legacy = all(dev.field_unsupported(fid, link) for link in links for fid in FIELDS.values())
    per_call = all(
        ("nvmlDeviceGetNvLinkErrorCounter", link, counter) in dev.unsupported
        for link in links
        for _, counter in COUNTERS
    )
    nvlink5 = all(dev.field_unsupported(NVLINK5_FIELDS[t], link) for link in links for t in NVLINK5_DEFAULT)
    return legacy and per_call and nvlink5


def read(dev: DeviceClient) -> Reading | None:
    if (NO_COUNTER,) in dev.unsupported:  # links without any error counter: unsupported until a re-probe
        return None
    links = links_of(dev)
    if not links:
        return None
    up: dict[int, int] = {}
    for link in links:
        state = dev.get(FEATURE, "nvmlDeviceGetNvLinkState", link)
        if state is not None:
            up[link] = int(bool(state))
    counters = dev.state_of(LinkCounters)
    read_counters(dev, links, counters, dev.client.now())
    if no_counter_answers(dev, links):
        dev.nothing_to_read(FEATURE, NO_COUNTER, f"{len(links)} links but no NVLink error counter answers")
        return None
    totals: dict[str, int] = {}
    for (link, name), value in counters.last.items():
        if link in links:
            totals[name] = totals.get(name, 0) + value
    counters.selected |= {link for link in links if any(counters.last.get((link, name), 0) > 0 for name in SELECTING)}
    shown = set(links) if LINKS_SWITCH in dev.enabled else counters.selected
    link_up = {link: state for link, state in up.items() if link in shown}
    link_errors = {f"{link}/{name}": v for (link, name), v in sorted(counters.last.items()) if link in shown}
    if not up and not totals:
        return None
    return Reading(sum(up.values()) if up else None, totals, link_up, link_errors)


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    links_up = LINKS_UP.family()
    errors = ERRORS.family()
    link_up = LINK_UP.family()
    link_errors = LINK_ERRORS.family()
    for key, r in samples:
        links_up.add(key, r.links_up)
        for etype in ERROR_TYPES:
            errors.add(key, r.errors.get(etype), etype)
        for link, state in sorted(r.link_up.items(), key=lambda kv: int(kv[0])):
            link_up.add(key, state, str(link))
        for name, count in sorted(r.link_errors.items(), key=_link_order):
            link_label, etype = name.split("/")
            link_errors.add(key, count, link_label, etype)
    for fam in (links_up, errors, link_up, link_errors):
        yield from fam.done()


def _link_order(item: tuple[str, int]) -> tuple[int, int]:
    link, etype = item[0].split("/")
    return int(link), ERROR_TYPES.index(etype) if etype in ERROR_TYPES else len(ERROR_TYPES)
