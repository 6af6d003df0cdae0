"""NVLink data throughput: transmit and receive byte counters per GPU (per link on request).

Source: nvmlDeviceGetFieldValues with NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX (138) / _RX (139).
Despite the name these are cumulative counters of payload in KiB (nvml.h: "NVLink TX Data throughput
in KiB"), exported in
bytes as counters. Every entry's own return code is checked; an entry answering NOT_SUPPORTED or
INVALID_ARGUMENT is never asked again. This is the query that crashed with glibc heap corruption on
H20 / 580 (the incident); it is its own feature so it can be switched off or quarantined alone.

Per GPU (the default): the two fields with scopeId ``0xFFFFFFFF``, which nvml.h defines as the sum
over all links: two entries in one call where per-link counters take 36 (about 30 ms per H200 on
the pair, measured 2026-11-29). Where the driver does not serve that scope, the per-link counters
are read and summed, each link's last value kept so that a link that fails to answer once does not
make the total look reset. With the ``nvlink_links`` feature on, every link's counters are read
and exported, and the per-GPU totals are their sum. NVML_FI_DEV_NVLINK_LINK_COUNT (91) is read
once per worker life (no links: nothing else is asked) and exported with the ``details`` feature.

NVLink5 (Blackwell) counts bytes per link in ``NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES`` (202) and
``…_RCV_BYTES`` (204), in bytes (nvml.h 12.6+: "total Tx/Rx bytes on the link"). Whether 138/139 still
answer on NVLink5 has no public source; where every 138/139 entry answers unsupported, the per-link
202/204 counters are read and summed the same way (their bytes kept in whole KiB, as the reading
counts: a KiB's resolution on a counter that moves by gigabytes a second).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.common.collectors.base import kib_to_bytes
from exporter.common.gpustate import GpuState, Lifetime
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import Check, Monotonic, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "nvlink_throughput"
NEEDS: tuple[str, ...] = ()
LINKS_SWITCH = "nvlink_links"
DETAILS = "details"
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
ALL_LINKS = 0xFFFFFFFF  # scopeId: the sum over every link (nvml.h, fields 138-141)
TX, RX = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES = 202  # NVLink5, bytes per link
NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES = 204
TX5, RX5 = NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES, NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES

LINKS = MetricDef("nvgpu_nvlink_links", "NVLink links present (field NVML_FI_DEV_NVLINK_LINK_COUNT)")
TRANSMIT = MetricDef(
    "nvgpu_nvlink_transmit_bytes_total",
    "NVLink payload bytes transmitted over all the GPU's links (field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, "
    "scope 0xFFFFFFFF or summed per link, KiB x 1024; NVLink5 where that field is unsupported: "
    "NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES per link, summed)",
)
RECEIVE = MetricDef(
    "nvgpu_nvlink_receive_bytes_total",
    "NVLink payload bytes received over all the GPU's links (field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, "
    "scope 0xFFFFFFFF or summed per link, KiB x 1024; NVLink5 where that field is unsupported: "
    "NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES per link, summed)",
)
LINK_TRANSMIT = MetricDef(
    "nvgpu_nvlink_link_transmit_bytes_total",
    "NVLink payload bytes transmitted on one link (field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, KiB x 1024); "
    "with the nvlink_links feature",
    ("link",),
)
LINK_RECEIVE = MetricDef(
    "nvgpu_nvlink_link_receive_bytes_total",
    "NVLink payload bytes received on one link (field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, KiB x 1024); "
    "with the nvlink_links feature",
    ("link",),
)
METRICS = (
    LINKS,
    TRANSMIT,
    RECEIVE,
    LINK_TRANSMIT,
    LINK_RECEIVE,
)


@dataclass(frozen=True)
class Reading:
    link_count: int | None  # with the details feature
    tx_kib: int | None  # all links
    rx_kib: int | None
    link_tx_kib: dict[int, int]  # per link, with the nvlink_links feature
    link_rx_kib: dict[int, int]


# Ten times NVLink 5's 1.8 TB/s per GPU, in KiB per second: a faster rise is a misread counter.
MAX_KIB_PER_S = 18e12 / 1024
CHECKS: tuple[Check, ...] = (
    Range("link_count", low=0, high=36),  # NVML_NVLINK_MAX_LINKS is 36 from nvidia-ml-py 13.610
    Monotonic("tx_kib", "rx_kib", "link_tx_kib", "link_rx_kib", max_rate=MAX_KIB_PER_S),
)


@dataclass
class LinkCount(GpuState):
    """The GPU's NVLink count, until the next re-probe."""

    LIFETIME = Lifetime.PROBE
    count: int | None = None


@dataclass
class LastBytes(GpuState):
    """Each link's counters as last read (field id -> link -> KiB); kept across re-probes."""

    LIFETIME = Lifetime.DEVICE
    last: dict[int, dict[int, int]] = field(default_factory=lambda: {TX: {}, RX: {}, TX5: {}, RX5: {}})


def _link_count(dev: DeviceClient) -> int | None:
    static = dev.state_of(LinkCount)
    if static.count is None:
        got = dev.fields(FEATURE, [(NVML_FI_DEV_NVLINK_LINK_COUNT, 0)])
        value = got.get((NVML_FI_DEV_NVLINK_LINK_COUNT, 0))
        if value is None:
            return None
        static.count = int(value)
    return static.count


def _per_link(dev: DeviceClient, count: int, tx: int = TX, rx: int = RX) -> tuple[dict[int, int], dict[int, int]]:
    """Every link's counters (fields ``tx`` and ``rx``), the last value kept for a link that does not
    answer this time."""
    last = dev.state_of(LastBytes).last
    pairs = [(fid, link) for link in range(count) for fid in (tx, rx)]
    for (fid, link), value in dev.fields(FEATURE, pairs).items():
        last[fid][link] = int(value)
    return dict(last[tx]), dict(last[rx])


def _no_data_fields(dev: DeviceClient, count: int) -> bool:
    """Every link's 138/139 answered unsupported (NVLink5 may not serve them)."""
    return all(dev.field_unsupported(fid, link) for link in range(count) for fid in (TX, RX))


def _all_links_scope(dev: DeviceClient) -> bool:
    """The driver has not refused the all-links scope (for both fields)."""
    return not (dev.field_unsupported(TX, ALL_LINKS) and dev.field_unsupported(RX, ALL_LINKS))


def read(dev: DeviceClient) -> Reading | None:
    count = _link_count(dev)
    if count is None or count <= 0:
        return None
    shown_count = count if DETAILS in dev.enabled else None
    if LINKS_SWITCH not in dev.enabled and _all_links_scope(dev):
        got = dev.fields(FEATURE, [(TX, ALL_LINKS), (RX, ALL_LINKS)])
        if _all_links_scope(dev):  # still served after asking: else per link, below
            tx_all, rx_all = got.get((TX, ALL_LINKS)), got.get((RX, ALL_LINKS))
            if tx_all is None and rx_all is None:
                return None
            return Reading(
                shown_count, None if tx_all is None else int(tx_all), None if rx_all is None else int(rx_all), {}, {}
            )
    tx, rx = _per_link(dev, count)
    if not tx and not rx and _no_data_fields(dev, count):
        tx, rx = _per_link(dev, count, TX5, RX5)  # bytes: kept in KiB as the reading counts
        tx, rx = ({link: b // 1024 for link, b in d.items()} for d in (tx, rx))
    if not tx and not rx:
        return None
    per_link = LINKS_SWITCH in dev.enabled
    return Reading(
        shown_count,
        sum(tx.values()) if tx else None,
        sum(rx.values()) if rx else None,
        tx if per_link else {},
        rx if per_link else {},
    )


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    links = LINKS.family()
    tx = TRANSMIT.family()
    rx = RECEIVE.family()
    link_tx = LINK_TRANSMIT.family()
    link_rx = LINK_RECEIVE.family()
    for key, r in samples:
        links.add(key, r.link_count)
        tx.add(key, None if r.tx_kib is None else kib_to_bytes(r.tx_kib))
        rx.add(key, None if r.rx_kib is None else kib_to_bytes(r.rx_kib))
        for link, kib in sorted(r.link_tx_kib.items(), key=lambda kv: int(kv[0])):
            link_tx.add(key, kib_to_bytes(kib), str(link))
        for link, kib in sorted(r.link_rx_kib.items(), key=lambda kv: int(kv[0])):
            link_rx.add(key, kib_to_bytes(kib), str(link))
    for fam in (links, tx, rx, link_tx, link_rx):
        yield from fam.done()
