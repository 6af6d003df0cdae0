"""NVLink data throughput: per-link transmit and receive byte counters.

Source: nvmlDeviceGetFieldValues with NVML_FI_DEV_NVLINK_LINK_COUNT (91) for the real link count,
then NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX (138) / _RX (139) with the link as scopeId. Despite the
name these are cumulative counters of payload in KiB (nvml-notes §4.3), exported in bytes as
counters. Every entry's own return code is checked; a link answering NOT_SUPPORTED or
INVALID_ARGUMENT is never asked again. This is the query that crashed with glibc heap corruption on
H20 / 580 (the incident); it is its own feature so it can be switched off or quarantined alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.collectors.base import kib_to_bytes
from exporter.metric import GpuKey, MetricDef

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from exporter.nvml.client import DeviceClient
    from exporter.snapshot import SystemInfo

FEATURE = "nvlink_throughput"
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139

LINKS = MetricDef("nvgpu_nvlink_links", "NVLink links present (field NVML_FI_DEV_NVLINK_LINK_COUNT)")
TRANSMIT = MetricDef(
    "nvgpu_nvlink_transmit_bytes_total",
    "NVLink payload bytes transmitted (field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, KiB x 1024)",
    ("link",),
)
RECEIVE = MetricDef(
    "nvgpu_nvlink_receive_bytes_total",
    "NVLink payload bytes received (field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, KiB x 1024)",
    ("link",),
)
METRICS = (
    LINKS,
    TRANSMIT,
    RECEIVE,
)


@dataclass(frozen=True)
class Reading:
    link_count: int
    tx_kib: dict[int, int]
    rx_kib: dict[int, int]


def read(dev: DeviceClient) -> Reading | None:
    count = dev.cache.get("nvlink_link_count")
    if count is None:
        got = dev.fields(FEATURE, [(NVML_FI_DEV_NVLINK_LINK_COUNT, 0)])
        value = got.get((NVML_FI_DEV_NVLINK_LINK_COUNT, 0))
        if value is None:
            return None
        count = dev.cache["nvlink_link_count"] = int(value)
    if count <= 0:
        return None
    pairs = [
        (fid, link)
        for link in range(count)
        for fid in (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
    ]
    values = dev.fields(FEATURE, pairs)
    tx = {link: int(v) for (fid, link), v in values.items() if fid == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX}
    rx = {link: int(v) for (fid, link), v in values.items() if fid == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX}
    if not tx and not rx:
        return None
    return Reading(count, tx, rx)


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    links = LINKS.family()
    tx = TRANSMIT.family()
    rx = RECEIVE.family()
    for key, r in samples:
        links.add(key, r.link_count)
        for link, kib in sorted(r.tx_kib.items(), key=lambda kv: int(kv[0])):
            tx.add(key, kib_to_bytes(kib), str(link))
        for link, kib in sorted(r.rx_kib.items(), key=lambda kv: int(kv[0])):
            rx.add(key, kib_to_bytes(kib), str(link))
    for fam in (links, tx, rx):
        yield from fam.done()
