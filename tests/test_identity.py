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


def removals(exp: Exporter, uuid: str) -> list[dict[str, Any]]:
    """The worker's "removed" log records for ``uuid``."""
    return [r for r in exp.log_records() if " removed: " in r.get("msg", "") and r.get("uuid") == uuid]


def test_a_count_drop_from_four_to_three_drops_the_gpu_that_left(tmp_path: Path) -> None:
    """C leaves at t = 5 s (count 4 -> 3): D moves from index 3 to 2. The node counts three GPUs up,
    C's series are gone after one report, the count family says present 3 of a maximum 4 and the
    expected 4, and the removal is logged once with C's UUID, bus id and last index."""
    scenario, (a, b, c, d) = four_gpus(enumeration=[{"until_s": 5.0, "gpus": [0, 1, 2, 3]}, {"gpus": [0, 1, 3]}])
    env = {"NVGPU_EXPECTED_GPUS": "4", "NVGPU_REENUMERATE_SECONDS": "3600"}  # the count change, not the period
    with Exporter(write_scenario(tmp_path, scenario), tmp_path, env=env, interval=INTERVAL) as exp:
        exp.wait_for(lambda s: all(sampled(s, u, str(i)) for i, u in enumerate((a, b, c, d))), what="A-D up")
        after = exp.wait_for(
            lambda s: sampled(s, d, "2") and not s.find("nvgpu_device_up", uuid=c),
            timeout=20,
            what="C gone, D at index 2",
        )
        after = exp.wait_samples(3, after=after.value("nvgpu_last_sample_timestamp_seconds"))
        assert sorted((x.labels["gpu"], x.value) for x in after.find("nvgpu_device_up")) == [
            ("0", 1.0),
            ("1", 1.0),
            ("2", 1.0),
        ]
        assert not [x for x in after.samples if x.labels.get("uuid") == c]
        assert after.value("nvgpu_gpus", view="present") == 3.0
        assert after.value("nvgpu_gpus", view="max_present") == 4.0
        assert after.value("nvgpu_gpus", view="expected") == 4.0
        (record,) = removals(exp, c)
        assert record["gpu"] == 2 and record["pci_bus_id"] == scenario["gpus"][2]["pci_bus_id"]
        assert not any(v for v in (x.value for x in after.find("nvgpu_worker_restarts_total")))
        assert exp.terminate() == 0


def test_a_hot_added_gpu_is_attached_and_sampled(tmp_path: Path) -> None:
    """Three GPUs, then D appears at index 3 at t = 5 s (hot-added, or discovered again after a
    drain): the running worker attaches and samples it; nothing restarts."""
    scenario, (a, b, c, d) = four_gpus(enumeration=[{"until_s": 5.0, "gpus": [0, 1, 2]}, {"gpus": [0, 1, 2, 3]}])
    env = {"NVGPU_REENUMERATE_SECONDS": "3600"}
    with Exporter(write_scenario(tmp_path, scenario), tmp_path, env=env, interval=INTERVAL) as exp:
        three = exp.wait_for(lambda s: all(sampled(s, u, str(i)) for i, u in enumerate((a, b, c))), what="A-C up")
        assert not three.find("nvgpu_device_up", uuid=d) and three.value("nvgpu_gpus", view="present") == 3.0
        four = exp.wait_for(lambda s: sampled(s, d, "3"), timeout=20, what="D attached and sampled at index 3")
        assert four.value("nvgpu_gpus", view="present") == 4.0 and four.find("nvgpu_gpu_info", uuid=d)
        assert all(sampled(four, u, str(i)) for i, u in enumerate((a, b, c)))
        assert [r for r in exp.log_records() if " appeared: " in r.get("msg", "") and r.get("uuid") == d]
        assert not any(v for v in (x.value for x in four.find("nvgpu_worker_restarts_total")))
        assert exp.terminate() == 0


def test_a_reset_gpu_is_found_again_under_its_uuid(tmp_path: Path) -> None:
    """B is reset at t = 5 s: its old handle answers GPU_IS_LOST. The worker counts it lost once,
    enumerates again at once (not at the 1 h period) and samples B again under the same UUID and
    index with a fresh handle; the other GPUs are never dark, nothing restarts."""
    scenario, (a, b, c, d) = four_gpus(
        enumeration=[{"until_s": 5.0, "gpus": [0, 1, 2, 3]}, {"gpus": [0, 1, 2, 3], "reset": [1]}]
    )
    env = {"NVGPU_REENUMERATE_SECONDS": "3600"}
    with Exporter(write_scenario(tmp_path, scenario), tmp_path, env=env, interval=INTERVAL) as exp:
        exp.wait_for(lambda s: all(sampled(s, u, str(i)) for i, u in enumerate((a, b, c, d))), what="A-D up")
        back = exp.wait_for(
            lambda s: s.value("nvgpu_device_faults_total", uuid=b, fault="lost") == 1.0 and sampled(s, b, "1"),
            timeout=20,
            what="B lost once, then sampled again",
        )
        back = exp.wait_samples(3, after=back.value("nvgpu_last_sample_timestamp_seconds"))
        assert sampled(back, b, "1") and back.value("nvgpu_device_faults_total", uuid=b, fault="lost") == 1.0
        assert all(sampled(back, u, g) for u, g in ((a, "0"), (c, "2"), (d, "3")))
        asked = [r for r in exp.log_records() if "per NVML index again" in r.get("msg", "")]
        assert asked and "lost" in asked[0]["msg"], [r.get("msg") for r in asked]
        assert not removals(exp, b) and back.value("nvgpu_gpus", view="present") == 4.0
        assert not any(v for v in (x.value for x in back.find("nvgpu_worker_restarts_total")))
        assert exp.terminate() == 0
