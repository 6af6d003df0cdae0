"""A GPU is its UUID, not its NVML index: renumbering, count changes and resets on the real exporter.

Every test runs the real exporter (supervisor + worker) on the fake backend, whose ``enumeration``
changes the GPU count and the index -> GPU map over scenario time (docs/scenarios.md, "Enumeration
over time"). The four GPUs A-D are the first four of the shipped ``h200x8`` scenario.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporter_proc import Exporter, Scrape, load_scenario, write_scenario

INTERVAL = 0.5


def four_gpus(**top: Any) -> tuple[dict[str, Any], list[str]]:
    """GPUs A-D (positions 0-3) and their UUIDs."""
    scenario = load_scenario("h200x8")
    scenario["gpus"] = scenario["gpus"][:4]
    scenario.update(top)
    return scenario, [g["uuid"] for g in scenario["gpus"]]


def by_uuid(s: Scrape, name: str, uuid: str) -> list[str]:
    """The ``gpu`` labels under which a family has series for ``uuid``."""
    return sorted(x.labels["gpu"] for x in s.find(name, uuid=uuid))


def sampled(s: Scrape, uuid: str, gpu: str) -> bool:
    """The GPU ``uuid`` is up under index ``gpu`` with fresh readings."""
    return s.value("nvgpu_device_up", gpu=gpu, uuid=uuid) == 1.0 and bool(
        s.find("nvgpu_power_usage_watts", gpu=gpu, uuid=uuid)
    )


def test_a_drain_renumbers_and_every_gpu_keeps_its_own_state(tmp_path: Path) -> None:
    """The issue's case. B crashes the worker in its temperature call and is left out; then B is
    drained at t = 8 s, so NVML renumbers: index 1 answers C, index 2 D, index 3 is gone.

    C is sampled again (under index 1), nothing says B crashed (B left the node: its series go,
    its exclusion with it), D appears once (index 2), nothing is left at index 3."""
    scenario, (a, b, c, d) = four_gpus(
        enumeration=[{"until_s": 8.0, "gpus": [0, 1, 2, 3]}, {"gpus": [0, 2, 3]}],
        faults=[{"function": "nvmlDeviceGetTemperatureV", "gpu": 1, "action": "segfault"}],
    )
    env = {"NVGPU_GPU_RETRY_SECONDS": "60"}  # no probe of B before the drain: the exclusion stands
    with Exporter(write_scenario(tmp_path, scenario), tmp_path, env=env, interval=INTERVAL) as exp:
        before = exp.wait_for(
            lambda s: (
                s.value("nvgpu_device_state", gpu="1", uuid=b, state="crashed") == 1.0
                and all(sampled(s, u, g) for u, g in ((a, "0"), (c, "2"), (d, "3")))
            ),
            timeout=20,
            what="B left out after its crash, A, C and D sampled",
        )
        assert before.value("nvgpu_worker_restarts_total", reason="crash") == 1.0
        after = exp.wait_for(
            lambda s: all(sampled(s, u, g) for u, g in ((a, "0"), (c, "1"), (d, "2"))),
            timeout=30,
            what="C sampled at index 1 and D at index 2 after the drain",
        )
        after = exp.wait_samples(3, after=after.value("nvgpu_last_sample_timestamp_seconds"))
        assert not after.find("nvgpu_device_state", uuid=b), "B left the node but is still shown"
        assert not [x for x in after.samples if x.labels.get("uuid") == b]
        for uuid, gpu in ((a, "0"), (c, "1"), (d, "2")):
            assert by_uuid(after, "nvgpu_device_up", uuid) == [gpu], (uuid, after.text[-3000:])
            assert by_uuid(after, "nvgpu_gpu_info", uuid) == [gpu]
        assert not [x for x in after.samples if x.labels.get("gpu") == "3"]
        assert after.value("nvgpu_worker_restarts_total", reason="crash") == 1.0
        assert exp.terminate() == 0
