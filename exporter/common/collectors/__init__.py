"""Collector registry: feature name -> collector module, in sampling order.

The order is the order of ``guards.featuretable.FEATURES`` (each GPU's pass reads the collectors in it,
and the exposition renders their families in it). Identity comes first so a GPU's labels are known
before anything else is read. A collector that reads what another keeps about the GPU declares it
in ``NEEDS`` (``utilization``, ``gpm`` and ``gpm_pipes`` need ``mig``'s layout);
:func:`order_problems` says where an order breaks that, and ``tests/test_collectors.py`` holds the
registry to it.

The features without a per-sample collector are listed in :data:`NOT_COLLECTORS` (an NVML event
thread in the worker; the kernel log and the kubelet in the supervisor); ``tests/test_collectors.py``
checks that the two together name exactly ``guards.featuretable.FEATURES``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from exporter.common.collectors import (
    c2c,
    clocks,
    confidential_computing,
    ecc,
    fabric,
    fan,
    gpm,
    gpm_pipes,
    identity,
    memory,
    mig,
    nvlink,
    nvlink_throughput,
    pcie,
    power,
    processes,
    remapped_rows,
    temperature,
    throttle_time,
    utilization,
)
from exporter.common.collectors.base import Collector

_ORDER: tuple[Collector, ...] = (
    identity,
    mig,
    utilization,
    memory,
    power,
    temperature,
    fan,
    clocks,
    throttle_time,
    pcie,
    ecc,
    remapped_rows,
    nvlink,
    nvlink_throughput,
    c2c,
    fabric,
    confidential_computing,
    gpm,
    gpm_pipes,
    processes,
)
COLLECTORS: dict[str, Collector] = {c.FEATURE: c for c in _ORDER}


def order_problems(order: Iterable[Collector]) -> list[str]:
    """Where ``order`` samples a collector before one it ``NEEDS`` (or needs one not in it).

    Returns:
        One sentence per broken need, naming both features; empty when the order holds.
    """
    problems: list[str] = []
    seen: set[str] = set()
    collectors = list(order)
    present = {c.FEATURE for c in collectors}
    for c in collectors:
        for need in c.NEEDS:
            if need not in present:
                problems.append(f"{c.FEATURE} needs {need}, which is not a collector here")
            elif need not in seen:
                problems.append(f"{c.FEATURE} needs {need} sampled before it, but {need} comes later")
        seen.add(c.FEATURE)
    return problems


# Features that are not read per sample by a collector, and who serves them.
NOT_COLLECTORS: dict[str, str] = {
    "events": "exporter.worker.nvml_events (worker thread); counted by exporter.supervisor.xids",
    "kernel_xid": "exporter.supervisor.kernel_xid (supervisor extension)",
    "pod_attribution": "exporter.supervisor.pods (supervisor extension)",
    "process_usage": "exporter.common.collectors.processes (per-process rows, read when this feature is on)",
    "nvlink_links": "exporter.common.collectors.nvlink and .nvlink_throughput "
    "(every link's series, when this feature is on)",
    "details": "several collectors read their series beyond the default budget when this feature is on "
    "(clocks, throttle_time, memory, ecc, pcie, utilization, nvlink_throughput)",
}

_FEATURE_OF: dict[type[Any], str] = {c.Reading: c.FEATURE for c in _ORDER}


def feature_of(reading_class: type[Any]) -> str:
    """The feature whose collector defines ``reading_class``.

    Raises:
        KeyError: not a collector's Reading class.
    """
    return _FEATURE_OF[reading_class]


def to_json(reading: Any) -> dict[str, Any]:
    """A Reading as a JSON-ready dict (worker side).

    Shallow where it can be: Reading fields hold plain numbers, strings, tuples and flat dicts, so
    ``dataclasses.asdict``'s deep copy (a third of a sample's time on 8 GPUs) buys nothing. A field
    holding a dataclass or a tuple of them (the MIG instances of ``exporter.common.collectors.mig``) is
    converted the same way, recursively.
    """
    return {name: _plain(getattr(reading, name)) for name in reading.__dataclass_fields__}


def _plain(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return to_json(value)
    if type(value) is tuple and value and hasattr(value[0], "__dataclass_fields__"):
        return [to_json(v) for v in value]
    return value
