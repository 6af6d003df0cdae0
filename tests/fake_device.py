"""Unit-test harness: a collector's ``read()`` on a real :class:`DeviceClient` over the fake backend.

The fake runs on an injected scenario clock (:class:`Clock`), so value cycles, ramps, integrals and
the GPM windows (measured on the backend's clock) are exact. :func:`render` turns readings into
``{family: {labels: value}}`` through the collector's ``families()``, after a round trip through the
snapshot's JSON encoding and typed decoding (what the supervisor receives).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from exporter.common import collectors
from exporter.common.breadcrumb import BreadcrumbWriter
from exporter.common.collectors.base import SystemInfo
from exporter.common.decode import decode_dataclass
from exporter.common.metric import GpuKey
from exporter.worker.fakenvml.binding import FakeNvml
from exporter.worker.nvml.backend import FakeBackend
from exporter.worker.nvml.client import DeviceClient, NvmlClient
from guards.featuretable import FEATURES

UUID = "GPU-00000000-0000-0000-0000-0000000000aa"


class Clock:
    """Scenario time, set by the test."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def backend(tmp_path: Path, scenario: Mapping[str, Any], clock: Clock) -> FakeBackend:
    """A FakeBackend on ``scenario`` whose scenario time is ``clock``."""
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    fake = FakeBackend(str(path))
    fake._fake = FakeNvml(str(path), epoch=0.0, clock=clock)
    return fake


# The features a worker with no NVGPU_FEATURE_* settings has on: what collectors see in dev.enabled.
DEFAULT_ON = frozenset(name for name, feature in FEATURES.items() if feature.default)
DETAILS = DEFAULT_ON | {"details"}


def devices(
    tmp_path: Path, scenario: Mapping[str, Any], clock: Clock, switches: Collection[str] = DEFAULT_ON
) -> list[DeviceClient]:
    """nvmlInit and a DeviceClient per GPU of the scenario, with ``switches`` the enabled features."""
    client = NvmlClient(backend(tmp_path, scenario, clock), BreadcrumbWriter(None))
    client.raw("init", "nvmlInit", "")
    out = []
    for i, gpu in enumerate(scenario["gpus"]):
        handle = client.raw("init", "nvmlDeviceGetHandleByIndex", "", i)
        dev = DeviceClient(client, i, gpu["uuid"], handle)
        dev.enabled = frozenset(switches)
        out.append(dev)
    return out


def device(
    tmp_path: Path, gpu: Mapping[str, Any], clock: Clock, switches: Collection[str] = DEFAULT_ON, **top: Any
) -> DeviceClient:
    """One GPU (``gpu`` is the scenario's GPU object; ``uuid`` defaults to :data:`UUID`)."""
    return devices(tmp_path, {**top, "gpus": [{"uuid": UUID, **gpu}]}, clock, switches)[0]


def fake_of(dev: DeviceClient) -> FakeNvml:
    """The FakeNvml behind a device (call counts, GPM sample registry)."""
    fake: FakeNvml = dev.client.backend._fake
    return fake


def wire(reading: Any) -> Any:
    """The reading as the supervisor gets it: JSON and back, checked against the Reading class."""
    feature = collectors.feature_of(type(reading))
    data = json.loads(json.dumps(collectors.to_json(reading)))
    return decode_dataclass(collectors.COLLECTORS[feature].Reading, data, feature)


def render(feature: str, readings: Sequence[tuple[DeviceClient, Any]]) -> dict[str, dict[tuple[str, ...], float]]:
    """``{family name: {label values (gpu and uuid first): value}}`` for one collector's readings."""
    samples = [(GpuKey(str(d.index), d.uuid), wire(r)) for d, r in readings if r is not None]
    out: dict[str, dict[tuple[str, ...], float]] = {}
    for metric in collectors.COLLECTORS[feature].families(samples, SystemInfo()):
        for s in metric.samples:
            out.setdefault(metric.name, {})[tuple(s.labels.values())] = s.value
    return out
