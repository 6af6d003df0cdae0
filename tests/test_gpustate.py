"""Per-GPU worker state: each kind lives as long as its Lifetime says, through a re-probe and a GPU
attached again, on the real DeviceClient and GpuSlot over the fake backend."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fake_device import Clock, backend

from exporter.common import scenarios
from exporter.common.breadcrumb import BreadcrumbWriter
from exporter.common.gpustate import GpuState, GpuStates, Lifetime
from exporter.worker.gpuslot import GpuPass, GpuSlot
from exporter.worker.nvml.client import NvmlClient


@dataclass
class Static(GpuState):
    LIFETIME = Lifetime.PROBE
    value: int | None = None


@dataclass
class Buffers(GpuState):
    LIFETIME = Lifetime.DEVICE
    held: list[int] = field(default_factory=list)


@dataclass
class Counted(GpuState):
    LIFETIME = Lifetime.WORKER
    total: int = 0


def test_one_instance_per_kind_made_on_first_use() -> None:
    states = GpuStates()
    assert not states.holds(Lifetime.PROBE)
    states.of(Static).value = 7
    assert states.of(Static).value == 7 and states.of(Static) is states.of(Static)
    assert states.holds(Lifetime.PROBE) and not states.holds(Lifetime.DEVICE)


def test_a_reprobe_forgets_only_the_static_readings() -> None:
    states = GpuStates()
    states.of(Static).value, states.of(Buffers).held, states.of(Counted).total = 1, [2], 3
    states.forget()
    assert (states.of(Static).value, states.of(Buffers).held, states.of(Counted).total) == (None, [2], 3)


def test_a_gpu_attached_again_keeps_only_the_worker_lived_states() -> None:
    states = GpuStates()
    states.of(Static).value, states.of(Buffers).held, states.of(Counted).total = 1, [2], 3
    again = states.reattached()
    assert (again.of(Static).value, again.of(Buffers).held, again.of(Counted).total) == (None, [], 3)
    again.of(Counted).total += 1
    assert states.of(Counted).total == 4  # the same object: one GPU, one counter


def test_a_state_class_without_a_lifetime_is_refused_where_it_is_declared() -> None:
    with pytest.raises(TypeError, match="NoLifetime: set LIFETIME"):

        class NoLifetime(GpuState):
            pass

    with pytest.raises(TypeError, match="WrongLifetime"):

        class WrongLifetime(GpuState):
            LIFETIME = "probe"  # type: ignore[assignment]


def _slot(tmp_path: Path) -> GpuSlot:
    scenario = json.loads(scenarios.path("h200x1").read_text())
    client = NvmlClient(backend(tmp_path, scenario, Clock()), BreadcrumbWriter(None))
    client.raw("init", "nvmlInit", "")
    return GpuSlot(0, client)


def _attach(slot: GpuSlot) -> None:
    slot.start_attach()
    assert slot.future is not None and slot.future.result(timeout=10) is True
    slot.harvest()


def test_the_slot_hands_worker_lived_states_to_the_gpus_next_device_client(tmp_path: Path) -> None:
    slot = _slot(tmp_path)
    try:
        _attach(slot)
        first = slot.dev
        assert first is not None
        first.state_of(Counted).total, first.state_of(Buffers).held, first.state_of(Static).value = 5, [1], 9
        slot.apply(GpuPass(lost="GPU_IS_LOST"))
        assert slot.dev is None and slot.state == "lost"
        _attach(slot)
        second = slot.dev
        assert second is not None and second is not first and second.uuid == first.uuid
        assert second.state_of(Counted).total == 5
        assert second.state_of(Buffers).held == [] and second.state_of(Static).value is None
    finally:
        slot.close()


def test_the_slot_reprobe_forgets_static_readings_and_keeps_the_rest(tmp_path: Path) -> None:
    slot = _slot(tmp_path)
    try:
        _attach(slot)
        dev = slot.dev
        assert dev is not None
        dev.state_of(Static).value, dev.state_of(Buffers).held = 9, [1]
        slot.request_reprobe()
        slot._maybe_reprobe(dev)
        assert dev.state_of(Static).value is None and dev.state_of(Buffers).held == [1]
    finally:
        slot.close()
