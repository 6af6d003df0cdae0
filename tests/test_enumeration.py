"""exporter.worker.enumeration: the UUID per index on its own thread, the GPU table, when to ask again.

In-process on the fake NVML (``enumeration`` phases change the map over scenario time). The four
enumeration cases on the real exporter are tests/test_identity.py; the property over any sequence of
changes is tests/test_fuzz_enumeration.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.common.breadcrumb import BreadcrumbWriter
from exporter.common.workerconfig import Exclusion, GpuRef
from exporter.worker.enumeration import Enumerator, GpuTable, Rediscovery
from exporter.worker.fakenvml.binding import FakeNvml
from exporter.worker.nvml.backend import FakeBackend
from exporter.worker.nvml.client import NvmlClient

UUIDS = ["GPU-a", "GPU-b", "GPU-c"]
BUSES = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0"]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def nvml(tmp_path: Path) -> Iterator[Any]:
    """``nvml(**scenario)``: an initialised client on GPUs a, b, c with that scenario's extras."""
    made: list[Enumerator] = []

    def make(values: dict[int, dict[str, Any]] | None = None, **top: Any) -> tuple[NvmlClient, Clock, Enumerator]:
        gpus = [
            {"uuid": u, "pci_bus_id": b, "values": (values or {}).get(i, {})}
            for i, (u, b) in enumerate(zip(UUIDS, BUSES, strict=True))
        ]
        path = tmp_path / "scenario.json"
        path.write_text(json.dumps({"gpus": gpus, **top}))
        clock = Clock()
        backend = FakeBackend(str(path))
        backend._fake = FakeNvml(str(path), epoch=0.0, clock=clock)
        client = NvmlClient(backend, BreadcrumbWriter(None))
        client.raw("init", "nvmlInit", "")
        enumerator = Enumerator(client, 0.3)
        made.append(enumerator)
        return client, clock, enumerator

    yield make
    for e in made:
        e.close()


def test_an_index_whose_read_hangs_ends_the_enumeration_there_and_keeps_what_was_known(nvml: Any) -> None:
    """GPU b's UUID read hangs 1 s (the deadline is 0.3 s): the enumeration names a, stops at index
    1 and is busy until the call returns; the slots last seen at 1 and 2 keep their GPUs (nothing is
    removed); its late result is not used."""
    client, clock, enumerator = nvml(
        faults=[{"function": "nvmlDeviceGetUUID", "gpu": 1, "from_s": 5, "action": "hang", "seconds": 1.0}]
    )
    table = GpuTable(client, 300.0)
    table.apply(enumerator.wait(3), starting=True)
    assert [table.slots[u].index for u in UUIDS] == [0, 1, 2]
    clock.t = 6.0
    partial = enumerator.wait(3)
    assert partial.hung_at == 1 and set(partial.found) == {0} and partial.unknown() == {1, 2}
    assert enumerator.busy
    table.apply(partial)
    assert not any(s.removed for s in table.slots.values()) and [table.slots[u].index for u in UUIDS] == [0, 1, 2]
    deadline = time.monotonic() + 5.0
    while enumerator.busy and time.monotonic() < deadline:
        time.sleep(0.05)  # the hung call returns after its 1 s: waiting for that is the point
    assert enumerator.poll() is None and not enumerator.busy


def test_a_gpu_whose_uuid_cannot_be_read_is_its_pci_bus_id(nvml: Any) -> None:
    """GPU c answers NOT_SUPPORTED for its UUID: it is keyed by its PCI bus id, and an exclusion
    made by bus id finds it."""
    client, _, enumerator = nvml(values={2: {"nvmlDeviceGetUUID": {"error": "NOT_SUPPORTED"}}})
    found = enumerator.wait(3)
    assert found.found[2].uuid == "" and found.found[2].key == BUSES[2]
    table = GpuTable(client, 300.0, [Exclusion(GpuRef("", BUSES[2].lower(), 5), "crashed", "a crash")])
    table.apply(found, starting=True)
    assert table.slots[BUSES[2]].state == "crashed" and table.slots["GPU-a"].state == "lost"


def test_rediscovery_asks_on_a_count_change_a_request_and_the_period_and_skips_hung_gpus(nvml: Any) -> None:
    client, clock, enumerator = nvml(enumeration=[{"until_s": 10, "gpus": [0, 1, 2]}, {"gpus": [0, 2]}])
    table = GpuTable(client, 300.0)
    mono = [100.0]
    rediscovery = Rediscovery(enumerator, table, 60.0, 5.0, clock=lambda: mono[0])
    rediscovery.count = 3
    table.apply(enumerator.wait(3), starting=True)
    rediscovery.step(client)
    assert not enumerator.busy  # nothing asked: no enumeration
    clock.t = 11.0  # b drained: the count changes
    rediscovery.step(client)
    wait_done(enumerator)
    rediscovery.step(client)  # applies it
    assert table.slots["GPU-b"].removed and table.slots["GPU-c"].index == 1
    table.drop_removed()
    rediscovery.ask("GPU 1 lost")
    table.slots["GPU-c"].state = "hung"
    rediscovery.step(client)
    started = enumerator._partial
    assert started is not None and started.skipped == frozenset({1})  # c hangs there: not asked
    wait_done(enumerator)
    rediscovery.step(client)
    mono[0] += 61.0  # the period
    rediscovery.step(client)
    assert enumerator.busy or enumerator.poll() is not None


def wait_done(enumerator: Enumerator) -> None:
    deadline = time.monotonic() + 5.0
    while enumerator.busy and time.monotonic() < deadline:
        time.sleep(0.01)  # the enumeration thread reads three GPUs: it finishes within milliseconds
