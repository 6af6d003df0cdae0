"""exporter.worker.fakenvml: scenario validation, value specs, faults, events, and real crashes.

Scenario time is driven by an injected clock (``FakeNvml(path, epoch=0, clock=...)``); crashes run
in a child interpreter whose return code names the signal.
"""

from __future__ import annotations

import ctypes
import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import pytest
from waiting import masks_signal, wait_until

from exporter.common.nvml import errors
from exporter.common.scenarios import spec
from exporter.common.scenarios.scenario import ScenarioError
from exporter.worker.fakenvml.binding import FakeNvml
from exporter.worker.nvml.backend import UNPOPULATED, FakeBackend

UUID = "GPU-00000000-0000-0000-0000-000000000000"


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def gpu(**values: Any) -> dict[str, Any]:
    return {"uuid": UUID, "values": values}


def make(tmp_path: Path, data: Any, clock: Clock | None = None, name: str = "s.json") -> FakeNvml:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return FakeNvml(str(path), epoch=0.0, clock=clock or Clock(100.0))


def started(tmp_path: Path, data: dict[str, Any], clock: Clock | None = None) -> FakeNvml:
    fake = make(tmp_path, data, clock)
    fake.nvmlInit()
    return fake


def code_of(call: Any) -> int:
    with pytest.raises(pynvml.NVMLError) as info:
        call()
    return int(info.value.value)


# -- validation ----------------------------------------------------------------------------------

INVALID: dict[str, tuple[Any, str, str]] = {
    # name: (scenario, place named, expectation named)
    "top_list": ([], "top level", "a JSON object"),
    "top_unknown_key": ({"gpus": [], "gpu": []}, "unknown top-level keys ['gpu']", "only ["),
    "gpus_missing": ({}, "gpus", "a list of GPU objects"),
    "gpus_object": ({"gpus": {}}, "gpus", "a list of GPU objects"),
    "gpu_not_object": ({"gpus": [1]}, "gpus[0]", "an object"),
    "gpu_unknown_key": ({"gpus": [{"uuid": UUID, "valeus": {}}]}, "gpus[0] unknown keys ['valeus']", "only ["),
    "gpu_uuid_missing": ({"gpus": [{"name": "x"}]}, "gpus[0].uuid", "a printable string"),
    "values_list": ({"gpus": [{"uuid": UUID, "values": []}]}, "gpus[0].values", "an object"),
    "fields_list": ({"gpus": [{"uuid": UUID, "fields": [1]}]}, "gpus[0].fields", "an object"),
    "bad_error_name": (
        {"gpus": [gpu(nvmlDeviceGetPowerUsage={"error": "GPU_GONE"})]},
        "gpus[0].values['nvmlDeviceGetPowerUsage']",
        "unknown NVML error name 'GPU_GONE'",
    ),
    "bad_field_error": (
        {"gpus": [{"uuid": UUID, "fields": {"138:3": {"error": "NOPE"}}}]},
        "gpus[0].fields['138:3']",
        "unknown NVML error name 'NOPE'",
    ),
    "cycle_empty": (
        {"gpus": [gpu(nvmlF={"cycle": [], "step_s": 1})]},
        "gpus[0].values['nvmlF']",
        "cycle to be a non-empty list",
    ),
    "cycle_no_step": ({"gpus": [gpu(nvmlF={"cycle": [1, 2]})]}, "gpus[0].values['nvmlF']", "step_s > 0 with cycle"),
    "cycle_zero_step": (
        {"gpus": [gpu(nvmlF={"cycle": [1], "step_s": 0})]},
        "gpus[0].values['nvmlF']",
        "step_s > 0 with cycle",
    ),
    "ramp_no_rate": ({"gpus": [gpu(nvmlF={"ramp": 0})]}, "gpus[0].values['nvmlF']", "numbers ramp and per_s"),
    "sequence_not_list": (
        {"gpus": [gpu(nvmlF={"sequence": {"value": 1}})]},
        "gpus[0].values['nvmlF']",
        "sequence to be a list",
    ),
    "nested_struct": (
        {"gpus": [gpu(nvmlF={"gpu": {"error": "NOPE"}, "memory": 1})]},
        "gpus[0].values['nvmlF'].gpu",
        "unknown NVML error name",
    ),
    "nested_list": (
        {"gpus": [gpu(nvmlF=[{"usedGpuMemory": {"cycle": []}}])]},
        "gpus[0].values['nvmlF'][0].usedGpuMemory",
        "cycle to be a non-empty list",
    ),
    "fault_not_object": ({"gpus": [], "faults": ["segfault"]}, "faults[0]", "an object"),
    "fault_unknown_key": (
        {"gpus": [], "faults": [{"action": "hang", "secs": 1}]},
        "faults[0] unknown keys ['secs']",
        "only [",
    ),
    "fault_bad_action": ({"gpus": [], "faults": [{"action": "explode"}]}, "faults[0].action='explode'", "one of ["),
    "fault_no_action": ({"gpus": [], "faults": [{"function": "nvmlInit"}]}, "faults[0].action=None", "one of ["),
    "fault_bad_error": (
        {"gpus": [], "faults": [{"action": "error", "error": "LOST"}]},
        "faults[0].error",
        "unknown NVML error name 'LOST'",
    ),
    "fault_error_missing": (
        {"gpus": [], "faults": [{"action": "error"}]},
        "faults[0].error",
        "unknown NVML error name",
    ),
    "event_bad_type": (
        {"gpus": [], "events": [{"at_s": 1, "gpu": 0, "event_type": "Xid"}]},
        "events[0].event_type",
        "one of ['Clock'",
    ),
    "struct_unknown_layout": (
        {"gpus": [gpu(nvmlF={"struct": "r999", "records": []})]},
        "gpus[0].values['nvmlF'].struct='r999'",
        "one of ['r535_v3', 'swapped']",
    ),
    "struct_records_not_list": (
        {"gpus": [gpu(nvmlF={"struct": "swapped", "records": {}})]},
        "gpus[0].values['nvmlF'].records",
        "a list of process records",
    ),
    "struct_record_without_pid": (
        {"gpus": [gpu(nvmlF={"struct": "swapped", "records": [{"usedGpuMemory": 1}]})]},
        "gpus[0].values['nvmlF'].records[0]",
        "an object with an integer pid",
    ),
    "struct_negative_memory": (
        {"gpus": [gpu(nvmlF={"struct": "r535_v3", "records": [{"pid": 1, "usedGpuMemory": -1}]})]},
        "gpus[0].values['nvmlF'].records[0].usedGpuMemory",
        "a non-negative integer or null",
    ),
    "churn_missing_rate": (
        {"gpus": [gpu(nvmlF={"churn": {"first_pid": 10, "lifetime_s": 1}})]},
        "gpus[0].values['nvmlF'].churn",
        "first_pid, per_s, lifetime_s",
    ),
    "churn_zero_rate": (
        {"gpus": [gpu(nvmlF={"churn": {"first_pid": 10, "per_s": 0, "lifetime_s": 1}})]},
        "gpus[0].values['nvmlF'].churn.per_s",
        "a positive number",
    ),
    "per_process_unknown_key": (
        {"gpus": [gpu(nvmlF={"per_process": {"smutil": 5}})]},
        "gpus[0].values['nvmlF'].per_process",
        "an object with keys from ['decUtil', 'encUtil', 'memUtil', 'smUtil']",
    ),
    "records_typo": (
        {"gpus": [gpu(nvmlF={"struct": "swapped", "recods": []})]},
        "gpus[0].values['nvmlF'] unknown keys ['recods']",
        "only ['records', 'struct'] with struct",
    ),
    "event_no_time": (
        {"gpus": [], "events": [{"gpu": 0, "event_type": "XidCriticalError"}]},
        "events[0]",
        "numbers at_s and gpu",
    ),
    "enumeration_not_a_list": ({"gpus": [gpu()], "enumeration": {"gpus": [0]}}, "enumeration", "a non-empty list"),
    "enumeration_past_the_gpus": (
        {"gpus": [gpu()], "enumeration": [{"gpus": [0, 1]}]},
        "enumeration[0].gpus",
        "a list of positions in gpus (integers from 0 to 0)",
    ),
    "enumeration_twice": ({"gpus": [gpu()], "enumeration": [{"gpus": [0, 0]}]}, "enumeration[0].gpus", "each GPU"),
    "enumeration_open_phase_first": (
        {"gpus": [gpu()], "enumeration": [{"gpus": [0]}, {"gpus": []}]},
        "enumeration[0].until_s",
        "a number of seconds on every phase but the last",
    ),
    "enumeration_back_in_time": (
        {"gpus": [gpu()], "enumeration": [{"until_s": 5, "gpus": [0]}, {"until_s": 5, "gpus": []}, {"gpus": [0]}]},
        "enumeration[1].until_s",
        "above the previous phase's (5)",
    ),
    "enumeration_reset_absent": (
        {"gpus": [gpu()], "enumeration": [{"gpus": [], "reset": [0]}]},
        "enumeration[0].reset",
        "GPUs this phase enumerates",
    ),
}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_validation_error_names_file_place_and_expectation(tmp_path: Path, name: str) -> None:
    data, place, expected = INVALID[name]
    with pytest.raises(ScenarioError) as info:
        make(tmp_path, data, name=f"{name}.json")
    message = str(info.value)
    assert message.startswith(f"scenario {tmp_path / (name + '.json')}: "), message
    assert place in message, message
    assert "expected" in message and expected in message, message


def test_unreadable_and_invalid_json(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"scenario .*missing\.json: cannot read"):
        FakeNvml(str(tmp_path / "missing.json"))
    (tmp_path / "broken.json").write_text('{"gpus": [}')
    with pytest.raises(ScenarioError, match=r"scenario .*broken\.json: not valid JSON: .*line 1 column 11"):
        FakeNvml(str(tmp_path / "broken.json"))


@pytest.mark.parametrize("name", ["h200x1", "h200x2", "h200x8"])
def test_shipped_scenarios_are_valid(name: str) -> None:
    root = Path(__file__).resolve().parent.parent / "examples" / "scenarios"
    fake = FakeNvml(str(root / f"{name}.json"))
    fake.nvmlInit()
    assert fake.nvmlDeviceGetCount() == int(name[-1])


def test_every_value_kind_has_one_section_in_the_scenario_docs() -> None:
    """docs/scenarios.md has one "#### <key>" section per kind of exporter/common/scenarios/spec.py."""
    docs = (Path(__file__).resolve().parent.parent / "docs" / "scenarios.md").read_text()
    headings = re.findall(r"^#### (.+)$", docs, flags=re.M)
    for kind in spec.KINDS:
        assert headings.count(kind.KEY) == 1, f"docs/scenarios.md: one '#### {kind.KEY}' section"
    assert {"Literal", "List", "Object (struct attributes)"} <= set(headings)


@dataclass(frozen=True)
class _Square(spec.Spec):
    """A kind for the test below: ``{"square": k}`` is ``k * t * t``."""

    KEY = "square"
    KEYS = frozenset({"square"})
    k: float

    @classmethod
    def check(cls, raw: Any, where: str) -> _Square:
        if not spec.is_number(raw["square"]):
            spec.fail(f"{where}.square", "a number")
        return cls(raw["square"])

    def at(self, t: float, ev: spec.Evaluation) -> float:
        return self.k * t * t


def test_a_new_value_kind_is_one_class_the_validator_and_the_fake_both_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spec, "KINDS", (*spec.KINDS, _Square))
    fake = started(
        tmp_path, {"gpus": [gpu(nvmlDeviceGetPowerUsage={"cycle": [{"square": 2}], "step_s": 1})]}, Clock(3.0)
    )
    assert fake.nvmlDeviceGetPowerUsage(fake.nvmlDeviceGetHandleByIndex(0)) == 18.0
    with pytest.raises(ScenarioError, match=r"gpus\[0\]\.values\['nvmlF'\]\.square: expected a number"):
        make(tmp_path, {"gpus": [gpu(nvmlF={"square": "x"})]})


# -- values ----------------------------------------------------------------------------------------


def test_cycle_steps_and_wraps(tmp_path: Path) -> None:
    clock = Clock(0.0)
    fake = started(tmp_path, {"gpus": [gpu(nvmlDeviceGetPowerUsage={"cycle": [10, 20, 30], "step_s": 5})]}, clock)
    h = fake.nvmlDeviceGetHandleByIndex(0)
    seen = []
    for t in (0.0, 4.99, 5.0, 9.99, 10.0, 15.0, 36.0):
        clock.t = t
        seen.append(fake.nvmlDeviceGetPowerUsage(h))
    assert seen == [10, 10, 20, 20, 30, 10, 20]


def test_ramp_is_an_integer_counter_from_time_zero(tmp_path: Path) -> None:
    clock = Clock(0.0)
    fake = started(tmp_path, {"gpus": [gpu(nvmlDeviceGetTotalEnergyConsumption={"ramp": 1000, "per_s": 250})]}, clock)
    h = fake.nvmlDeviceGetHandleByIndex(0)
    values = []
    for t in (-3.0, 0.0, 1.0, 2.5, 10.0):
        clock.t = t
        values.append(fake.nvmlDeviceGetTotalEnergyConsumption(h))
    assert values == [1000, 1000, 1250, 1625, 3500]
    assert all(isinstance(v, int) for v in values)


def test_sequence_by_time_then_not_supported(tmp_path: Path) -> None:
    clock = Clock(0.0)
    spec = {"sequence": [{"until_s": 10, "value": 1}, {"until_s": 20, "value": {"cycle": [2, 3], "step_s": 5}}]}
    fake = started(tmp_path, {"gpus": [gpu(nvmlDeviceGetPerformanceState=spec)]}, clock)
    h = fake.nvmlDeviceGetHandleByIndex(0)
    out = []
    for t in (0.0, 9.9, 10.0, 15.0):
        clock.t = t
        out.append(fake.nvmlDeviceGetPerformanceState(h))
    assert out == [1, 1, 2, 3]
    clock.t = 20.0
    assert code_of(lambda: fake.nvmlDeviceGetPerformanceState(h)) == errors.NOT_SUPPORTED


def test_sequence_open_ended_entry(tmp_path: Path) -> None:
    spec = {"sequence": [{"until_s": 60, "value": 0}, {"value": 7}]}
    clock = Clock(61.0)
    fake = started(tmp_path, {"gpus": [gpu(nvmlDeviceGetPcieReplayCounter=spec)]}, clock)
    assert fake.nvmlDeviceGetPcieReplayCounter(fake.nvmlDeviceGetHandleByIndex(0)) == 7


def test_error_spec_raises_real_pynvml_error(tmp_path: Path) -> None:
    fake = started(
        tmp_path,
        {
            "gpus": [
                gpu(
                    nvmlDeviceGetFanSpeed_v2={"error": "NOT_SUPPORTED"},
                    nvmlDeviceGetPowerUsage={"error": 15},
                    nvmlDeviceGetTemperature={"error": "NVML_ERROR_UNKNOWN"},
                )
            ]
        },
    )
    h = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetFanSpeed_v2(h, 0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetPowerUsage(h)
    assert code_of(lambda: fake.nvmlDeviceGetTemperature(h, 0)) == errors.UNKNOWN


def test_struct_values_and_lookup_precedence(tmp_path: Path) -> None:
    fake = started(
        tmp_path,
        {
            "gpus": [
                gpu(
                    **{
                        "nvmlDeviceGetUtilizationRates": {"gpu": {"cycle": [5, 6], "step_s": 1000}, "memory": 1},
                        "nvmlDeviceGetTotalEccErrors": 9,
                        "nvmlDeviceGetTotalEccErrors:1": 8,
                        "nvmlDeviceGetTotalEccErrors:1,1": 7,
                    }
                )
            ]
        },
    )
    h = fake.nvmlDeviceGetHandleByIndex(0)
    util = fake.nvmlDeviceGetUtilizationRates(h)
    assert (util.gpu, util.memory) == (5, 1)
    assert fake.nvmlDeviceGetTotalEccErrors(h, 1, 1) == 7  # "fn:a1,a2"
    assert fake.nvmlDeviceGetTotalEccErrors(h, 1, 0) == 8  # then "fn:a1"
    assert fake.nvmlDeviceGetTotalEccErrors(h, 0, 0) == 9  # then "fn"


def test_unknown_function_not_supported_and_non_device_attribute_missing(tmp_path: Path) -> None:
    fake = started(tmp_path, {"gpus": [gpu()]})
    assert code_of(lambda: fake.nvmlDeviceGetPowerUsage(fake.nvmlDeviceGetHandleByIndex(0))) == errors.NOT_SUPPORTED
    with pytest.raises(AttributeError):
        fake.nvmlSomethingElse  # noqa: B018 - not a device function: AttributeError like an old binding


def test_uninitialised_and_missing_functions(tmp_path: Path) -> None:
    fake = make(
        tmp_path,
        {
            "gpus": [gpu(nvmlDeviceGetPowerUsage=1)],
            "missing_functions": ["nvmlDeviceGetPowerUsage", "nvmlDeviceGetMemoryInfo_v2"],
        },
    )
    assert code_of(fake.nvmlDeviceGetCount) == errors.UNINITIALIZED
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert code_of(lambda: fake.nvmlDeviceGetPowerUsage(h)) == errors.FUNCTION_NOT_FOUND
    assert code_of(lambda: fake.nvmlDeviceGetHandleByIndex(1)) == errors.INVALID_ARGUMENT
    fake.nvmlShutdown()
    assert code_of(fake.nvmlDeviceGetCount) == errors.UNINITIALIZED


def test_memory_info_v1_includes_reserved_v2_separates_it(tmp_path: Path) -> None:
    mem = {"total": 1000, "reserved": 100, "free": 600, "used": 300}
    fake = started(tmp_path, {"gpus": [gpu(nvmlDeviceGetMemoryInfo=mem)]})
    h = fake.nvmlDeviceGetHandleByIndex(0)
    v1 = fake.nvmlDeviceGetMemoryInfo(h)
    v2 = fake.nvmlDeviceGetMemoryInfo(h, version=0x02000028)
    assert (v1.total, v1.free, v1.used) == (1000, 600, 400)
    assert (v2.total, v2.free, v2.used, v2.reserved) == (1000, 600, 300, 100)


def test_per_link_calls_past_the_link_count(tmp_path: Path) -> None:
    data = {"gpus": [{"uuid": UUID, "nvlink_link_count": 2, "values": {"nvmlDeviceGetNvLinkState": 1}}]}
    fake = started(tmp_path, data)
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert [fake.nvmlDeviceGetNvLinkState(h, link) for link in (0, 1)] == [1, 1]
    assert code_of(lambda: fake.nvmlDeviceGetNvLinkState(h, 2)) == errors.INVALID_ARGUMENT


def test_field_values_per_entry_codes(tmp_path: Path) -> None:
    data = {
        "gpus": [
            {
                "uuid": UUID,
                "nvlink_link_count": 4,
                "default_field_error": "NO_PERMISSION",
                "fields": {
                    "91": 4,
                    "82": 41.5,
                    "138:0": {"ramp": 10, "per_s": 1},
                    "138:3": {"error": "NOT_SUPPORTED"},
                    "138:4294967295": 99,
                },
            }
        ]
    }
    backend = FakeBackend.__new__(FakeBackend)
    backend._fake = started(tmp_path, data, Clock(5.0))
    h = backend._fake.nvmlDeviceGetHandleByIndex(0)
    pairs = [(91, 0), (82, 0), (138, 0), (138, 3), (138, 4), (138, 0xFFFFFFFF), (230, 0)]
    entries = {(e.field_id, e.scope_id): e for e in backend.field_values(h, pairs)}
    assert [(e.field_id, e.scope_id) for e in entries.values()] == pairs
    assert (entries[(91, 0)].code, entries[(91, 0)].value) == (0, 4)
    assert (entries[(82, 0)].code, entries[(82, 0)].value) == (0, 41.5)  # a float comes back as dVal
    assert (entries[(138, 0)].code, entries[(138, 0)].value) == (0, 15)
    assert (entries[(138, 3)].code, entries[(138, 3)].value) == (errors.NOT_SUPPORTED, None)
    assert entries[(138, 4)].code == errors.INVALID_ARGUMENT  # link past the count
    assert entries[(138, 0xFFFFFFFF)].value == 99  # the all-links scope is not a link
    assert entries[(230, 0)].code == errors.NO_PERMISSION  # unlisted: default_field_error
    assert all(e.code != UNPOPULATED for e in entries.values())
    assert code_of(lambda: backend._fake.nvmlDeviceGetFieldValues(h, [])) == errors.INVALID_ARGUMENT


# -- faults ----------------------------------------------------------------------------------------


def test_fault_by_call_numbers(tmp_path: Path) -> None:
    fake = started(
        tmp_path,
        {
            "gpus": [gpu(nvmlDeviceGetPowerUsage=5)],
            "faults": [{"function": "nvmlDeviceGetPowerUsage", "calls": [2, 4], "action": "error", "error": "UNKNOWN"}],
        },
    )
    h = fake.nvmlDeviceGetHandleByIndex(0)
    out = []
    for _ in range(5):
        try:
            out.append(fake.nvmlDeviceGetPowerUsage(h))
        except pynvml.NVMLError as exc:
            out.append(exc.value)
    assert out == [5, 999, 5, 999, 5]
    assert fake.call_counts()["nvmlDeviceGetPowerUsage"] == 5


def test_fault_after_calls_and_per_gpu(tmp_path: Path) -> None:
    data = {
        "gpus": [gpu(nvmlDeviceGetPowerUsage=5), {"uuid": "GPU-1", "values": {"nvmlDeviceGetPowerUsage": 6}}],
        "faults": [
            {
                "function": "nvmlDeviceGetPowerUsage",
                "gpu": 1,
                "after_calls": 3,
                "action": "error",
                "error": "GPU_IS_LOST",
            }
        ],
    }
    fake = started(tmp_path, data)
    h0, h1 = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    assert fake.nvmlDeviceGetPowerUsage(h1) == 6  # call 1
    assert fake.nvmlDeviceGetPowerUsage(h0) == 5  # call 2 (counts are per function, all GPUs)
    assert code_of(lambda: fake.nvmlDeviceGetPowerUsage(h1)) == errors.GPU_IS_LOST  # call 3
    assert fake.nvmlDeviceGetPowerUsage(h0) == 5  # call 4: GPU 0 does not match
    assert code_of(lambda: fake.nvmlDeviceGetPowerUsage(h1)) == errors.GPU_IS_LOST


def four(**top: Any) -> dict[str, Any]:
    """GPUs A-D (positions 0-3) with their letter as power reading and a bus id each."""
    gpus = [
        {"uuid": f"GPU-{c}", "pci_bus_id": f"00000000:0{i}:00.0", "values": {"nvmlDeviceGetPowerUsage": i}}
        for i, c in enumerate("ABCD")
    ]
    return {"gpus": gpus, **top}


def test_a_drain_renumbers_and_the_drained_gpus_handle_is_lost(tmp_path: Path) -> None:
    """B is drained at t = 10: index 1 answers C, index 2 D, index 3 is gone; B's old handle answers
    GPU_IS_LOST, C's and D's old handles keep working (a handle is the GPU, not the index)."""
    clock = Clock(0.0)
    fake = make(tmp_path, four(enumeration=[{"until_s": 10, "gpus": [0, 1, 2, 3]}, {"gpus": [0, 2, 3]}]), clock)
    fake.nvmlInit()
    before = [fake.nvmlDeviceGetHandleByIndex(i) for i in range(fake.nvmlDeviceGetCount())]
    assert [fake.nvmlDeviceGetUUID(h) for h in before] == ["GPU-A", "GPU-B", "GPU-C", "GPU-D"]
    clock.t = 10.0
    assert fake.nvmlDeviceGetCount() == 3
    assert [fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(i)) for i in range(3)] == ["GPU-A", "GPU-C", "GPU-D"]
    assert code_of(lambda: fake.nvmlDeviceGetHandleByIndex(3)) == errors.INVALID_ARGUMENT
    assert code_of(lambda: fake.nvmlDeviceGetPowerUsage(before[1])) == errors.GPU_IS_LOST
    assert code_of(lambda: fake.nvmlDeviceGetUUID(before[1])) == errors.GPU_IS_LOST
    assert [fake.nvmlDeviceGetPowerUsage(before[i]) for i in (0, 2, 3)] == [0, 2, 3]
    assert code_of(lambda: fake.nvmlDeviceGetHandleByPciBusId("00000000:01:00.0")) == errors.NOT_FOUND
    assert fake.nvmlDeviceGetHandleByPciBusId("00000000:02:00.0") == before[2]


def test_a_reset_gpu_comes_back_with_a_new_handle_and_a_hot_added_one_appears(tmp_path: Path) -> None:
    """C is reset at t = 5 (same index, old handle stale); D is hot-added at t = 8 at index 3."""
    clock = Clock(0.0)
    phases = [
        {"until_s": 5, "gpus": [0, 1, 2]},
        {"until_s": 8, "gpus": [0, 1, 2], "reset": [2]},
        {"gpus": [0, 1, 2, 3]},
    ]
    fake = make(tmp_path, four(enumeration=phases), clock)
    fake.nvmlInit()
    old_c = fake.nvmlDeviceGetHandleByIndex(2)
    assert fake.nvmlDeviceGetCount() == 3 and fake.nvmlDeviceGetPowerUsage(old_c) == 2
    clock.t = 5.0
    assert code_of(lambda: fake.nvmlDeviceGetPowerUsage(old_c)) == errors.GPU_IS_LOST
    new_c = fake.nvmlDeviceGetHandleByIndex(2)
    assert new_c != old_c and fake.nvmlDeviceGetPowerUsage(new_c) == 2
    clock.t = 8.0
    assert fake.nvmlDeviceGetCount() == 4 and fake.nvmlDeviceGetPowerUsage(new_c) == 2
    assert fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(3)) == "GPU-D"


def test_a_fault_follows_its_gpu_not_its_index(tmp_path: Path) -> None:
    """A fault's gpu is the scenario GPU: after the drain, C's calls at index 1 do not match the
    fault written for B (position 1); C at position 2 does."""
    clock = Clock(0.0)
    data = four(
        enumeration=[{"until_s": 10, "gpus": [0, 1, 2, 3]}, {"gpus": [0, 2, 3]}],
        faults=[{"function": "nvmlDeviceGetPowerUsage", "gpu": 1, "action": "error", "error": "UNKNOWN"}],
    )
    fake = make(tmp_path, data, clock)
    fake.nvmlInit()
    assert code_of(lambda: fake.nvmlDeviceGetPowerUsage(fake.nvmlDeviceGetHandleByIndex(1))) == errors.UNKNOWN
    clock.t = 10.0
    assert fake.nvmlDeviceGetPowerUsage(fake.nvmlDeviceGetHandleByIndex(1)) == 2


def test_scenario_time_runs_on_the_monotonic_clock_and_timestamps_on_the_wall_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an injected clock, a wall-clock step of an hour moves NVML's timestamps (as real NVML's
    would) but not scenario time: a scenario's windows and cycles do not jump with the clock."""
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"gpus": [gpu()]}))
    fake = FakeNvml(str(path), epoch=time.monotonic() - 100.0)
    t0, stamp0 = fake.now(), fake.timestamp_us()
    wall = time.time
    monkeypatch.setattr(time, "time", lambda: wall() + 3600.0)
    assert fake.now() - t0 < 5.0
    assert 99.0 < t0 < 105.0
    assert fake.timestamp_us() - stamp0 > 3599 * 1_000_000


def test_fault_time_window_and_wildcard(tmp_path: Path) -> None:
    clock = Clock(0.0)
    data = {
        "gpus": [gpu(nvmlDeviceGetPowerUsage=5)],
        "faults": [{"function": "*", "from_s": 10, "until_s": 20, "action": "error", "error": "UNKNOWN"}],
    }
    fake = make(tmp_path, data, clock)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    for t, fails in ((9.99, False), (10.0, True), (19.99, True), (20.0, False)):
        clock.t = t
        if fails:
            assert code_of(lambda: fake.nvmlDeviceGetPowerUsage(h)) == errors.UNKNOWN
            assert code_of(fake.nvmlInit) == errors.UNKNOWN  # "*" includes nvmlInit
            assert code_of(fake.nvmlDeviceGetCount) == errors.UNKNOWN
        else:
            assert fake.nvmlDeviceGetPowerUsage(h) == 5


def test_fault_on_requested_fields(tmp_path: Path) -> None:
    data = {
        "gpus": [{"uuid": UUID, "nvlink_link_count": 2, "fields": {"82": 40, "138:0": 1}}],
        "faults": [
            {"function": "nvmlDeviceGetFieldValues", "fields": [138, 139], "action": "error", "error": "UNKNOWN"}
        ],
    }
    fake = started(tmp_path, data)
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetFieldValues(h, [(82, 0)])[0].value.ullVal == 40
    assert code_of(lambda: fake.nvmlDeviceGetFieldValues(h, [(82, 0), (138, 0)])) == errors.UNKNOWN


def test_hang_with_seconds_returns(tmp_path: Path) -> None:
    fake = started(
        tmp_path,
        {
            "gpus": [gpu(nvmlDeviceGetPowerUsage=5)],
            "faults": [{"function": "nvmlDeviceGetPowerUsage", "calls": [1], "action": "hang", "seconds": 0.3}],
        },
    )
    h = fake.nvmlDeviceGetHandleByIndex(0)
    t0 = time.monotonic()
    assert fake.nvmlDeviceGetPowerUsage(h) == 5
    assert time.monotonic() - t0 >= 0.3
    t0 = time.monotonic()
    assert fake.nvmlDeviceGetPowerUsage(h) == 5
    assert time.monotonic() - t0 < 0.3


def test_events_delivered_once_after_registration(tmp_path: Path) -> None:
    clock = Clock(0.0)
    data = {
        "gpus": [gpu(nvmlDeviceGetSupportedEventTypes=0xFFFF)],
        "events": [
            {"at_s": -1, "gpu": 0, "event_type": "XidCriticalError", "data": 13},
            {"at_s": 5, "gpu": 0, "event_type": "XidCriticalError", "data": 79},
            {"at_s": 6, "gpu": 0, "event_type": "DoubleBitEccError"},
        ],
    }
    fake = started(tmp_path, data, clock)
    h = fake.nvmlDeviceGetHandleByIndex(0)
    events = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(h, 0x8 | 0x2, events)  # at t = 0: the event at -1 predates it
    assert code_of(lambda: fake.nvmlEventSetWait_v2(events, 10)) == errors.TIMEOUT
    clock.t = 7.0
    got = [fake.nvmlEventSetWait_v2(events, 10) for _ in range(2)]
    assert [(e.eventType, e.eventData) for e in got] == [(0x8, 79), (0x2, 0)]
    assert got[0].device.gpu == 0 and got[0].gpuInstanceId == 0xFFFFFFFF
    assert code_of(lambda: fake.nvmlEventSetWait_v2(events, 10)) == errors.TIMEOUT  # each once


def test_register_events_outside_supported_mask(tmp_path: Path) -> None:
    fake = started(tmp_path, {"gpus": [gpu(nvmlDeviceGetSupportedEventTypes=0x8)]})
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert (
        code_of(lambda: fake.nvmlDeviceRegisterEvents(h, 0x8 | 0x2, fake.nvmlEventSetCreate())) == errors.NOT_SUPPORTED
    )


# -- real crashes, in a child interpreter ---------------------------------------------------------


def run_child(tmp_path: Path, data: dict[str, Any], body: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "crash.json"
    path.write_text(json.dumps(data))
    code = (
        textwrap.dedent(f"""
        from exporter.worker.fakenvml.binding import FakeNvml
        from exporter.worker.fakenvml.core import FakeHandle
        fake = FakeNvml({str(path)!r})
        fake.nvmlInit()
        print("before", flush=True)
    """)
        + textwrap.dedent(body)
        + '\nprint("after", flush=True)\n'
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("handle", ["None", "0x7f00dead", "FakeHandle(5)", "'GPU-0'"])
def test_bad_handle_segfaults(tmp_path: Path, handle: str) -> None:
    """A call given a handle that is not a valid fake handle dies by SIGSEGV, as a wild pointer would."""
    proc = run_child(tmp_path, {"gpus": [gpu(nvmlDeviceGetPowerUsage=5)]}, f"fake.nvmlDeviceGetPowerUsage({handle})")
    assert proc.returncode == -signal.SIGSEGV, proc
    assert proc.stdout == "before\n"


def test_good_handle_in_child_exits_cleanly(tmp_path: Path) -> None:
    proc = run_child(
        tmp_path,
        {"gpus": [gpu(nvmlDeviceGetPowerUsage=5)]},
        "print(fake.nvmlDeviceGetPowerUsage(fake.nvmlDeviceGetHandleByIndex(0)))",
    )
    assert proc.returncode == 0 and proc.stdout == "before\n5\nafter\n", proc


@pytest.mark.parametrize(
    ("fault", "returncode"),
    [
        ({"action": "segfault"}, -signal.SIGSEGV),
        ({"action": "abort"}, -signal.SIGABRT),
        ({"action": "exit", "code": 3}, 3),
        ({"action": "hang", "seconds": 60, "ignore_sigterm": True}, "hang"),
    ],
)
def test_crash_faults_are_real(tmp_path: Path, fault: dict[str, Any], returncode: int | str) -> None:
    data = {
        "gpus": [gpu(nvmlDeviceGetPowerUsage=5)],
        "faults": [{"function": "nvmlDeviceGetPowerUsage", "calls": [2], **fault}],
    }
    body = "\n".join(
        [
            "h = fake.nvmlDeviceGetHandleByIndex(0)",
            "fake.nvmlDeviceGetPowerUsage(h)",
            "print('first', flush=True)",
            "fake.nvmlDeviceGetPowerUsage(h)",
        ]
    )
    if returncode == "hang":
        path = tmp_path / "crash.json"
        path.write_text(json.dumps(data))
        code = (
            f"from exporter.worker.fakenvml.binding import FakeNvml\nfake = FakeNvml({str(path)!r})\nfake.nvmlInit()\n"
            + body
            + "\nprint('after', flush=True)\n"
        )
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None and child.stdout.readline() == "first\n"
            wait_until(lambda: masks_signal(child.pid, signal.SIGTERM), 10, "the hang to ignore SIGTERM")
            child.send_signal(signal.SIGTERM)  # masked by the fault
            with pytest.raises(subprocess.TimeoutExpired):
                child.wait(1.0)
        finally:
            child.kill()
            child.wait()
        assert child.returncode == -signal.SIGKILL
        return
    proc = run_child(tmp_path, data, body)
    assert proc.returncode == returncode, proc
    assert proc.stdout == "before\nfirst\n"


# -- integral values, GPM and fabric shapes ------------------------------------------------


def test_integral_counts_time_spent_where_the_cycle_is_non_zero(tmp_path: Path) -> None:
    clock = Clock(0.0)
    spec = {"integral": {"cycle": [0, 1, 0, 0], "step_s": 2.5}, "scale": 1000, "initial": 7}
    fake = started(tmp_path, {"gpus": [gpu(nvmlDeviceGetPcieReplayCounter=spec)]}, clock)
    h = fake.nvmlDeviceGetHandleByIndex(0)
    seen = []
    for t in (-1.0, 0.0, 2.5, 3.5, 5.0, 10.0, 13.75, 100.0):
        clock.t = t
        seen.append(fake.nvmlDeviceGetPcieReplayCounter(h))
    assert seen == [7, 7, 7, 1007, 2507, 2507, 3757, 25007]


@pytest.mark.parametrize(
    "spec",
    [
        {"integral": {"cycle": [], "step_s": 1}},
        {"integral": {"cycle": [1, "x"], "step_s": 1}},
        {"integral": {"cycle": [1], "step_s": 0}},
        {"integral": [1, 2]},
        {"integral": {"cycle": [1], "step_s": 1}, "scale": "big"},
        {"integral": {"cycle": [1], "step_s": 1}, "offset": 3},
    ],
)
def test_bad_integral_specs_are_named(tmp_path: Path, spec: dict[str, Any]) -> None:
    with pytest.raises(ScenarioError, match=r"gpus\[0\]\.values\['nvmlF'\]"):
        make(tmp_path, {"gpus": [gpu(nvmlF=spec)]})


def gpm_fake(tmp_path: Path, clock: Clock, **metrics: Any) -> FakeNvml:
    values = {"nvmlGpmQueryDeviceSupport": {"isSupportedDevice": 1}}
    values.update({f"nvmlGpmMetricsGet:{k}": v for k, v in metrics.items()})
    data = {"gpus": [gpu(**values), {"uuid": "GPU-2", "values": values}]}
    return started(tmp_path, data, clock)


def metrics_request(fake: FakeNvml, s1: Any, s2: Any, ids: list[int]) -> Any:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version, request.numMetrics, request.sample1, request.sample2 = 1, len(ids), s1, s2
    for i, m in enumerate(ids):
        request.metrics[i].metricId = m
    return request


def test_gpm_as_pynvml_shapes_it(tmp_path: Path) -> None:
    clock = Clock(1.0)
    fake = gpm_fake(tmp_path, clock, **{"2": {"cycle": [10.0, 90.0], "step_s": 5}, "3": {"error": "NOT_SUPPORTED"}})
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
    s1, s2 = fake.nvmlGpmSampleAlloc(), fake.nvmlGpmSampleAlloc()
    assert isinstance(s1, pynvml.c_nvmlGpmSample_t) and bool(s1)
    fake.nvmlGpmSampleGet(h, s1)
    clock.t = 6.0
    assert fake.nvmlGpmSampleGet(h, s2) is s2
    request = fake.nvmlGpmMetricsGet(metrics_request(fake, s1, s2, [2, 3, 5]))
    entries = [(request.metrics[i].nvmlReturn, request.metrics[i].value) for i in range(3)]
    # value at the newer sample's time; an error spec and a missing key set that entry's code
    assert entries == [(0, 90.0), (errors.NOT_SUPPORTED, 0.0), (errors.NOT_SUPPORTED, 0.0)]
    fake.nvmlGpmSampleFree(s1)
    fake.nvmlGpmSampleFree(s2)


def test_gpm_misuse_answers_like_nvml(tmp_path: Path) -> None:
    clock = Clock(1.0)
    fake = gpm_fake(tmp_path, clock, **{"2": 5.0})
    h0, h1 = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    s1, s2 = fake.nvmlGpmSampleAlloc(), fake.nvmlGpmSampleAlloc()
    null = pynvml.c_nvmlGpmSample_t()
    assert code_of(lambda: fake.nvmlGpmSampleGet(h0, null)) == errors.INVALID_ARGUMENT
    assert code_of(lambda: fake.nvmlGpmMetricsGet(metrics_request(fake, s1, s2, [2]))) == errors.INVALID_ARGUMENT
    fake.nvmlGpmSampleGet(h0, s1)
    fake.nvmlGpmSampleGet(h1, s2)  # two GPUs
    assert code_of(lambda: fake.nvmlGpmMetricsGet(metrics_request(fake, s1, s2, [2]))) == errors.INVALID_ARGUMENT
    fake.nvmlGpmSampleGet(h0, s2)
    bad_version = metrics_request(fake, s1, s2, [2])
    bad_version.version = 2
    assert code_of(lambda: fake.nvmlGpmMetricsGet(bad_version)) == errors.ARGUMENT_VERSION_MISMATCH
    assert code_of(lambda: fake.nvmlGpmSampleFree(null)) == errors.INVALID_ARGUMENT


def test_gpm_without_support_is_not_supported(tmp_path: Path) -> None:
    fake = started(tmp_path, {"gpus": [gpu(nvmlDeviceGetPowerUsage=5)]}, Clock(1.0))
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert code_of(lambda: fake.nvmlGpmQueryDeviceSupport(h)) == errors.NOT_SUPPORTED
    assert code_of(lambda: fake.nvmlGpmSampleGet(h, fake.nvmlGpmSampleAlloc())) == errors.NOT_SUPPORTED


@pytest.mark.parametrize(
    ("body", "returncode"),
    [
        ("s = fake.nvmlGpmSampleAlloc(); fake.nvmlGpmSampleFree(s); fake.nvmlGpmSampleFree(s)", -signal.SIGABRT),
        ("s = fake.nvmlGpmSampleAlloc(); fake.nvmlGpmSampleFree(s); fake.nvmlGpmSampleGet(h, s)", -signal.SIGSEGV),
        ("import ctypes, pynvml; fake.nvmlGpmSampleGet(h, ctypes.cast(0x7F00DEAD, pynvml.c_nvmlGpmSample_t))", -11),
    ],
    ids=["double_free_aborts", "use_after_free_segfaults", "wild_pointer_segfaults"],
)
def test_gpm_memory_errors_crash_like_the_real_library(tmp_path: Path, body: str, returncode: int) -> None:
    data = {"gpus": [gpu(nvmlGpmQueryDeviceSupport={"isSupportedDevice": 1})]}
    proc = run_child(tmp_path, data, "h = fake.nvmlDeviceGetHandleByIndex(0)\n" + body)
    assert proc.returncode == returncode, proc
    assert proc.stdout == "before\n"


def test_fabric_info_fills_the_callers_versioned_struct(tmp_path: Path) -> None:
    spec = {"state": 2, "status": 0, "cliqueId": 4, "healthMask": 0, "healthSummary": 1}
    only_v2 = {"error": "ARGUMENT_VERSION_MISMATCH"}
    values = {"nvmlDeviceGetGpuFabricInfoV": spec, "nvmlDeviceGetGpuFabricInfoV:3": only_v2}
    fake = started(tmp_path, {"gpus": [gpu(**values)]}, Clock(1.0))
    h = fake.nvmlDeviceGetHandleByIndex(0)
    v3, v2 = pynvml.c_nvmlGpuFabricInfo_v3_t(), pynvml.c_nvmlGpuFabricInfo_v2_t()
    assert code_of(lambda: fake.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(v3))) == errors.ARGUMENT_VERSION_MISMATCH
    assert fake.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(v2)) == 0
    assert (v2.state, v2.status, v2.cliqueId, v2.version) == (2, 0, 4, pynvml.nvmlGpuFabricInfo_v2)


# -- process lists, churn and utilization samples ---------------------------------------------------

NOT_MIG = 0xFFFFFFFF
TRUTH = [
    {"pid": 1184, "usedGpuMemory": 3 << 30, "gpuInstanceId": NOT_MIG, "computeInstanceId": NOT_MIG},
    {"pid": 16040, "usedGpuMemory": 7 << 30, "gpuInstanceId": NOT_MIG, "computeInstanceId": NOT_MIG},
    {"pid": 16041, "usedGpuMemory": None, "gpuInstanceId": NOT_MIG, "computeInstanceId": NOT_MIG},
]


def _procs(fake: FakeNvml, fn: str = "nvmlDeviceGetComputeRunningProcesses_v3") -> list[dict[str, Any]]:
    return [vars(p) for p in getattr(fake, fn)(fake.nvmlDeviceGetHandleByIndex(0))]


def test_r535_layout_reads_the_first_record_right_and_the_rest_from_wrong_offsets(tmp_path: Path) -> None:
    fake = started(
        tmp_path, {"gpus": [gpu(nvmlDeviceGetComputeRunningProcesses_v3={"struct": "r535_v3", "records": TRUTH})]}
    )
    got = _procs(fake)
    assert len(got) == 3 and got[0] == {**TRUTH[0]}
    # record 1 starts at byte 24: the CC-protected memory of record 0 (0) is read as its pid, and
    # record 1's pid as its memory; record 2 starts in record 1's instance ids (0xFFFFFFFF).
    assert got[1]["pid"] == 0 and got[1]["usedGpuMemory"] == 16040
    assert got[2]["pid"] == NOT_MIG and got[2]["usedGpuMemory"] == 0


def test_swapped_layout_and_the_truth_behind_a_layout(tmp_path: Path) -> None:
    spec = {"struct": "swapped", "records": [{"pid": 9980, "usedGpuMemory": 6498025472}]}
    fake = started(
        tmp_path,
        {
            "gpus": [
                gpu(
                    nvmlDeviceGetComputeRunningProcesses_v3=spec,
                    nvmlDeviceGetProcessUtilization={"per_process": {"smUtil": 7}},
                )
            ]
        },
    )
    assert _procs(fake)[0]["pid"] == 6498025472 and _procs(fake)[0]["usedGpuMemory"] == 9980
    samples = fake.nvmlDeviceGetProcessUtilization(fake.nvmlDeviceGetHandleByIndex(0), 0)
    assert [(s.pid, s.smUtil, s.memUtil) for s in samples] == [(9980, 7, 0)]  # util samples are not misread


def test_churn_keeps_per_s_times_lifetime_processes_alive(tmp_path: Path) -> None:
    clock = Clock(0.0)
    spec = {"churn": {"first_pid": 20000, "per_s": 100, "lifetime_s": 0.5, "used_bytes": 1 << 20, "count": 1000}}
    fake = started(tmp_path, {"gpus": [gpu(nvmlDeviceGetComputeRunningProcesses_v3=spec)]}, clock)
    seen: set[int] = set()
    for step in range(0, 1200):
        clock.t = step * 0.01
        pids = [p["pid"] for p in _procs(fake)]
        assert len(pids) <= 51
        seen.update(pids)
    assert seen == set(range(20000, 21000))
    assert _procs(fake) == []  # all 1000 have exited by t = 10.5 s
    clock.t = 5.0
    alive = _procs(fake)
    assert [p["pid"] for p in alive] == list(range(20451, 20501)) and alive[0]["usedGpuMemory"] == 1 << 20


def test_process_utilization_honours_the_last_seen_timestamp(tmp_path: Path) -> None:
    clock = Clock(100.0)
    spec = [
        {"pid": 1184, "timeStamp": 1_000, "smUtil": 90, "memUtil": 20, "encUtil": 0, "decUtil": 0},
        {"pid": 1184, "timeStamp": 2_000, "smUtil": 95, "memUtil": 21, "encUtil": 0, "decUtil": 0},
        {"pid": 16040, "smUtil": 3, "memUtil": 1, "encUtil": 0, "decUtil": 0},
    ]
    fake = started(tmp_path, {"gpus": [gpu(nvmlDeviceGetProcessUtilization=spec)]}, clock)
    h = fake.nvmlDeviceGetHandleByIndex(0)
    first = fake.nvmlDeviceGetProcessUtilization(h, 0)
    assert [(s.pid, s.timeStamp) for s in first] == [(1184, 1000), (1184, 2000), (16040, 100_000_000)]
    later = fake.nvmlDeviceGetProcessUtilization(h, 1500)
    assert [(s.pid, s.timeStamp) for s in later] == [(1184, 2000), (16040, 100_000_000)]
    # samples without a timestamp are always fresher than the request (a busy GPU keeps sampling)
    assert [s.pid for s in fake.nvmlDeviceGetProcessUtilization(h, 100_000_000)] == [16040]


def test_process_utilization_not_found_and_not_supported(tmp_path: Path) -> None:
    data = {
        "gpus": [
            gpu(
                nvmlDeviceGetProcessUtilization=[
                    {"pid": 5, "timeStamp": 10, "smUtil": 1, "memUtil": 0, "encUtil": 0, "decUtil": 0}
                ]
            ),
            {"uuid": "GPU-1", "values": {}},
        ]
    }
    fake = started(tmp_path, data)
    assert (
        code_of(lambda: fake.nvmlDeviceGetProcessUtilization(fake.nvmlDeviceGetHandleByIndex(0), 10))
        == errors.NOT_FOUND
    )
    assert (
        code_of(lambda: fake.nvmlDeviceGetProcessUtilization(fake.nvmlDeviceGetHandleByIndex(1), 0))
        == errors.NOT_SUPPORTED
    )


def test_per_process_utilization_follows_the_true_compute_list(tmp_path: Path) -> None:
    clock = Clock(0.0)
    data = {
        "gpus": [
            gpu(
                nvmlDeviceGetComputeRunningProcesses_v3={"struct": "r535_v3", "records": TRUTH},
                nvmlDeviceGetProcessUtilization={
                    "per_process": {"smUtil": {"cycle": [0, 60], "step_s": 5}, "memUtil": 9}
                },
            )
        ]
    }
    fake = started(tmp_path, data, clock)
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert {(s.pid, s.smUtil) for s in fake.nvmlDeviceGetProcessUtilization(h, 0)} == {
        (1184, 0),
        (16040, 0),
        (16041, 0),
    }
    clock.t = 5.0
    assert {s.smUtil for s in fake.nvmlDeviceGetProcessUtilization(h, 0)} == {60}
