"""Collector registry: feature name -> collector module, in sampling order.

Identity comes first so a GPU's labels are known before anything else is read. ``events``,
``kernel_xid`` and ``pod_attribution`` are features without a per-sample collector (an NVML event
thread in the worker; the kernel log and the kubelet in the supervisor).
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

from exporter.collectors import (
    clocks,
    ecc,
    fan,
    identity,
    memory,
    nvlink,
    nvlink_throughput,
    pcie,
    power,
    processes,
    remapped_rows,
    temperature,
    utilization,
)

COLLECTORS: dict[str, ModuleType] = {
    m.FEATURE: m
    for m in (
        identity,
        utilization,
        memory,
        power,
        temperature,
        fan,
        clocks,
        pcie,
        ecc,
        remapped_rows,
        nvlink,
        nvlink_throughput,
        processes,
    )
}


def to_json(reading: Any) -> dict[str, Any]:
    """A Reading as a JSON-ready dict (worker side).

    Shallow: Reading fields hold plain numbers, strings, tuples and flat dicts, so
    ``dataclasses.asdict``'s deep copy (a third of a sample's time on 8 GPUs) buys nothing.
    """
    return {f.name: getattr(reading, f.name) for f in dataclasses.fields(reading)}


def from_json(feature: str, data: dict[str, Any]) -> Any:
    """Rebuild a feature's Reading from its JSON dict (supervisor side).

    Raises:
        TypeError: the dict does not fit the Reading (a worker of another version).
    """
    return COLLECTORS[feature].Reading(**data)
