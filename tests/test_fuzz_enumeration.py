"""Property tests (Hypothesis) of enumeration changes: whatever NVML does to the index -> GPU map
over time (drains, hot-adds, renumbering, resets, GPUs coming back), the worker's GPU table keeps one
slot per GPU, keyed by its UUID, at the index NVML gives it now; a GPU that left is reported removed
exactly once and then dropped; a GPU that came back is found again under its UUID; the supervisor's
records follow. In-process: the real enumeration thread and GPU table on the fake NVML
(``enumeration`` phases, docs/scenarios.md), the real GpuHealth on the snapshots' GPUs."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fuzzing  # noqa: F401 - the Hypothesis profile
from hypothesis import given
from hypothesis import strategies as st

from exporter.common.breadcrumb import BreadcrumbWriter
from exporter.common.snapshot import Snapshot, SystemInfo
from exporter.common.workerconfig import Exclusion, GpuRef
from exporter.supervisor.gpuhealth import GpuHealth
from exporter.worker.enumeration import Enumerator, GpuTable
from exporter.worker.fakenvml.binding import FakeNvml
from exporter.worker.nvml.backend import FakeBackend
from exporter.worker.nvml.client import NvmlClient

GPUS = 5
UUIDS = [f"GPU-0000000{i}-0000-0000-0000-00000000000{i}" for i in range(GPUS)]


@st.composite
def phases(draw: Any) -> list[tuple[list[int], list[int]]]:
    """Enumeration phases: which GPUs in which index order, and which of them were just reset."""
    out = []
    for _ in range(draw(st.integers(min_value=1, max_value=8))):
        present = draw(st.permutations(range(GPUS)).flatmap(lambda p: st.integers(0, GPUS).map(lambda n: p[:n])))
        reset = draw(st.lists(st.sampled_from(present), unique=True)) if present else []
        out.append((list(present), reset))
    return out


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def scenario(steps: Sequence[tuple[list[int], list[int]]]) -> dict[str, Any]:
    gpus = [{"uuid": u, "pci_bus_id": f"00000000:{16 + i:02X}:00.0"} for i, u in enumerate(UUIDS)]
    enumeration: list[dict[str, Any]] = [
        {"until_s": 10.0 * (k + 1), "gpus": p, "reset": r} for k, (p, r) in enumerate(steps)
    ]
    enumeration[-1].pop("until_s")
    return {"gpus": gpus, "enumeration": enumeration}


def attach(table: GpuTable) -> None:
    """What the sampler does after an enumeration: attach every lost or new slot, on its thread."""
    for slot in list(table.slots.values()):
        if slot.state == "lost" and not slot.removed:
            slot.start_attach()
            assert slot.future is not None
            slot.future.result(timeout=5)
            slot.harvest()
            table.attached(slot)


def sample(table: GpuTable, backend: FakeBackend) -> bool:
    """A sample pass: a GPU whose handle went stale (reset, gone and back) answers GPU_IS_LOST and is
    lost, as GpuSlot.apply does; True when one was (the sampler then enumerates again)."""
    lost = False
    for slot in table.slots.values():
        if slot.state == "up" and slot.dev is not None:
            try:
                backend.nvmlDeviceGetUUID(slot.dev.handle)
            except backend.NVMLError:
                slot.state, slot.dev, lost = "lost", None, True
    return lost


def step(table: GpuTable, enumerator: Enumerator, client: NvmlClient, starting: bool) -> None:
    """Enumerate, apply, attach (the sampler's start-up or a count change)."""
    table.apply(enumerator.wait(int(client.raw("init", "nvmlDeviceGetCount", ""))), starting=starting)
    attach(table)


@given(steps=phases(), excluded=st.sets(st.integers(0, GPUS - 1), max_size=2))
def test_every_gpu_keeps_one_slot_under_its_uuid_whatever_the_enumeration_does(
    steps: list[tuple[list[int], list[int]]], excluded: set[int]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scenario.json"
        path.write_text(json.dumps(scenario(steps)))
        clock = Clock()
        backend = FakeBackend(str(path))
        backend._fake = FakeNvml(str(path), epoch=0.0, clock=clock)
        client = NvmlClient(backend, BreadcrumbWriter(None))
        client.raw("init", "nvmlInit", "")
        exclusions = [Exclusion(GpuRef(UUIDS[g], "", g), "crashed", "a crash") for g in sorted(excluded)]
        table = GpuTable(client, 300.0, exclusions)
        enumerator = Enumerator(client, 5.0)
        health = GpuHealth(30.0, 600.0)
        removed_once: dict[str, int] = {}
        try:
            before: set[str] = set()
            for k, (present, _reset) in enumerate(steps):
                clock.t = 10.0 * k + 1.0
                step(table, enumerator, client, starting=k == 0)
                if sample(table, backend):  # a reset or returned GPU: lost, enumerated again at once
                    step(table, enumerator, client, starting=False)
                live = {s.uuid: s for s in table.slots.values() if not s.removed}
                now = {UUIDS[g] for g in present}
                # one slot per GPU NVML enumerates now, keyed by its UUID, at its index now
                assert set(live) == now
                assert all(live[UUIDS[g]].index == i for i, g in enumerate(present))
                assert all(key == s.key for key, s in table.slots.items())
                assert len({s.position for s in live.values()}) == len(live)
                # excluded GPUs are never attached; the others answer through their own handle
                for uuid, slot in live.items():
                    if UUIDS.index(uuid) in excluded:
                        assert slot.state == "crashed" and slot.dev is None
                    else:
                        assert slot.state == "up" and slot.dev is not None
                        assert backend.nvmlDeviceGetUUID(slot.dev.handle) == uuid
                # a GPU that left is reported removed in one snapshot, then gone
                gone = {s.uuid for s in table.slots.values() if s.removed}
                assert gone == before - now
                for uuid in gone:
                    removed_once[uuid] = removed_once.get(uuid, 0) + 1
                views = [s.sample_view((), 1_800_000_000.0, 0.0) for s in table.slots.values()]
                health.on_snapshot(Snapshot(1_800_000_000.0, 0.0, SystemInfo(), tuple(views), {}, {}, {}, 0, {}))
                table.drop_removed()
                assert {s.uuid for s in table.slots.values()} == now
                # the supervisor keeps one record per GPU present, with its index as the label
                assert {r.uuid: r.index for r in health.gpus.values()} == {UUIDS[g]: i for i, g in enumerate(present)}
                assert health.present == len(present)
                before = now
            assert all(n >= 1 for n in removed_once.values())
        finally:
            enumerator.close()
            for slot in table.slots.values():
                slot.close()
