"""NVLink per-link state and error counters.

Sources: nvmlDeviceGetNvLinkState(link), nvmlDeviceGetNvLinkErrorCounter(link, counter:
NVML_NVLINK_ERROR_DL_REPLAY 0, DL_RECOVERY 1, DL_CRC_FLIT 2, DL_CRC_DATA 3). The links are
discovered once per worker life by asking link 0, 1, … until the driver answers INVALID_ARGUMENT
or NOT_SUPPORTED: ``NVML_NVLINK_MAX_LINKS`` is only an upper bound (18 up to nvidia-ml-py 13.595,
36 from 13.610) and indices past the real count answer INVALID_ARGUMENT (nvml-notes §3.9). This
feature deliberately avoids the field-value API, whose NVLink throughput path is the one that
crashed in the incident (that is ``nvlink_throughput``).

Cost: each nvmlDeviceGetNvLinkErrorCounter call is a ~0.9 ms driver RPC on H200 / 580.159
(measured: 72 calls per GPU were 150 ms of a 2-GPU sample), so the error counters are re-read every
:data:`ERRORS_EVERY_S` seconds and the last values are exported in between; link state (2 µs) is
read every sample.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.metric import GpuKey, MetricDef

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from exporter.nvml.client import DeviceClient
    from exporter.snapshot import SystemInfo

FEATURE = "nvlink"
MAX_LINKS = 36
COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))
ERRORS_EVERY_S = 30.0

LINK_UP = MetricDef("nvgpu_nvlink_up", "1 if the NVLink link is active (nvmlDeviceGetNvLinkState)", ("link",))
LINK_ERRORS = MetricDef(
    "nvgpu_nvlink_errors_total", "NVLink data-link errors (nvmlDeviceGetNvLinkErrorCounter)", ("link", "error_type")
)
METRICS = (
    LINK_UP,
    LINK_ERRORS,
)


@dataclass(frozen=True)
class Reading:
    up: dict[int, int]
    errors: dict[str, int]  # "<link>/<error_type>" -> count


def read(dev: DeviceClient) -> Reading | None:
    links = dev.cache.get("nvlink_links")
    if links is None:
        links = []
        for link in range(MAX_LINKS):
            state = dev.probe(FEATURE, "nvmlDeviceGetNvLinkState", link)
            if state is None:
                break
            links.append(link)
        dev.cache["nvlink_links"] = links
    if not links:
        return None
    up: dict[int, int] = {}
    for link in links:
        state = dev.get(FEATURE, "nvmlDeviceGetNvLinkState", link)
        if state is not None:
            up[link] = int(bool(state))
    read_at, errs = dev.cache.get("nvlink_errors", (None, {}))
    now = time.monotonic()
    if read_at is None or now - read_at >= ERRORS_EVERY_S:
        errs = {}
        for link in links:
            for name, counter in COUNTERS:
                value = dev.get(FEATURE, "nvmlDeviceGetNvLinkErrorCounter", link, counter)
                if value is not None:
                    errs[f"{link}/{name}"] = int(value)
        dev.cache["nvlink_errors"] = (now, errs)
    return Reading(up, dict(errs)) if up or errs else None


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    up = LINK_UP.family()
    errs = LINK_ERRORS.family()
    for key, r in samples:
        for link, state in sorted(r.up.items(), key=lambda kv: int(kv[0])):
            up.add(key, state, str(link))
        for name, count in r.errors.items():
            link_label, etype = name.split("/")
            errs.add(key, count, link_label, etype)
    yield from up.done()
    yield from errs.done()
