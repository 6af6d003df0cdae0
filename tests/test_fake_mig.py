"""The fake backend's MIG model (exporter/worker/fakenvml/mig_model.py, docs/scenarios.md "MIG"): mode and
instance layouts over time, MIG device handles that go stale as NVML documents, per-instance values
and errors, GPM samples per GPU instance, and strict validation of the ``mig`` object."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import pynvml
import pytest
from fake_device import Clock

from exporter.common.nvml import errors
from exporter.common.scenarios.scenario import ScenarioError
from exporter.worker.fakenvml.binding import FakeNvml
from exporter.worker.fakenvml.mig_model import FakeMigHandle

UUID = "GPU-00000000-0000-0000-0000-0000000000aa"
MIG_A = "MIG-aaaaaaaa-0000-5000-8000-000000000001"
MIG_B = "MIG-aaaaaaaa-0000-5000-8000-000000000002"


def scenario(mig: dict[str, Any], **values: Any) -> dict[str, Any]:
    return {"gpus": [{"uuid": UUID, "values": values, "mig": mig}]}


def fake(tmp_path: Path, data: dict[str, Any], clock: Clock | None = None) -> FakeNvml:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    nvml = FakeNvml(str(path), epoch=0.0, clock=clock or Clock())
    nvml.nvmlInit()
    return nvml


def code(exc: pytest.ExceptionInfo[pynvml.NVMLError]) -> int:
    return int(exc.value.value)


MIG = {
    "mode": {"sequence": [{"until_s": 20, "value": [1, 1]}, {"value": [0, 0]}]},
    "max_devices": 7,
    "profiles": {"19": {"name": "MIG 1g.18gb", "index": 0, "memorySizeMB": 17920, "sliceCount": 1}},
    "layouts": [
        {
            "until_s": 10,
            "instances": [
                {
                    "gpu_instance_id": 9,
                    "compute_instance_id": 0,
                    "profile_id": 19,
                    "uuid": MIG_A,
                    "placement": {"start": 6, "size": 1},
                    "values": {
                        "nvmlDeviceGetMemoryInfo": {"total": 100, "used": 10, "free": 80, "reserved": 10},
                        "nvmlGpmMetricsGet:2": {"cycle": [10.0, 50.0], "step_s": 5},
                    },
                },
                {"index": 3, "gpu_instance_id": 10, "compute_instance_id": 0, "profile_id": 19, "uuid": MIG_B},
            ],
        },
        {"instances": []},
    ],
}


def test_mode_layouts_and_handles_over_time(tmp_path: Path) -> None:
    clock = Clock()
    nvml = fake(tmp_path, scenario(MIG), clock)
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1] and nvml.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    a = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert isinstance(a, FakeMigHandle)
    assert (nvml.nvmlDeviceGetGpuInstanceId(a), nvml.nvmlDeviceGetComputeInstanceId(a)) == (9, 0)
    assert nvml.nvmlDeviceGetUUID(a) == MIG_A and nvml.nvmlDeviceGetUUID(h) == UUID
    for empty in (1, 2, 4, 5, 6):
        with pytest.raises(pynvml.NVMLError) as info:
            nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, empty)
        assert code(info) == errors.NOT_FOUND  # an empty slot: skip, do not stop
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 3)) == MIG_B  # explicit index
    mem = nvml.nvmlDeviceGetMemoryInfo(a, 0x02000028)
    assert (mem.total, mem.used, mem.reserved) == (100, 10, 10)
    assert nvml.nvmlDeviceGetMemoryInfo(a).used == 20  # v1: used includes reserved
    gi = nvml.nvmlDeviceGetGpuInstanceById(h, 9)
    info = nvml.nvmlGpuInstanceGetInfo(gi)
    assert (info.id, info.profileId, info.placement.start, info.placement.size) == (9, 19, 6, 1)
    assert nvml.nvmlDeviceGetGpuInstanceProfileInfoById(h, 19).name == b"MIG 1g.18gb"
    assert nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, 0).id == 19
    assert nvml.nvmlDeviceGetComputeRunningProcesses_v3(a) == []  # unlisted: no processes
    with pytest.raises(pynvml.NVMLError) as info_e:
        nvml.nvmlDeviceGetTemperature(a, 0)  # anything else unlisted: NOT_SUPPORTED
    assert code(info_e) == errors.NOT_SUPPORTED
    clock.t = 10.0  # the instances are destroyed: the old handle is invalid, the slots empty
    with pytest.raises(pynvml.NVMLError) as info_e:
        nvml.nvmlDeviceGetUUID(a)
    assert code(info_e) == errors.INVALID_ARGUMENT
    with pytest.raises(pynvml.NVMLError) as info_e:
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert code(info_e) == errors.NOT_FOUND
    clock.t = 20.0  # MIG off
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 0] and nvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0


def test_gpm_per_gpu_instance(tmp_path: Path) -> None:
    clock = Clock()
    nvml = fake(tmp_path, scenario(MIG, nvmlGpmQueryDeviceSupport={"isSupportedDevice": 1}), clock)
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError) as info:
        nvml.nvmlGpmSampleGet(h, s1)  # the whole GPU is not sampled in MIG mode
    assert code(info) == errors.NOT_SUPPORTED
    nvml.nvmlGpmMigSampleGet(h, 9, s1)
    clock.t = 5.0
    nvml.nvmlGpmMigSampleGet(h, 9, s2)
    req = pynvml.c_nvmlGpmMetricsGet_t()
    req.version, req.numMetrics, req.sample1, req.sample2 = pynvml.NVML_GPM_METRICS_GET_VERSION, 2, s1, s2
    req.metrics[0].metricId, req.metrics[1].metricId = 2, 3
    nvml.nvmlGpmMetricsGet(req)
    assert (req.metrics[0].nvmlReturn, req.metrics[0].value) == (0, 50.0)  # at the newer sample's time
    assert req.metrics[1].nvmlReturn == errors.NOT_SUPPORTED
    nvml.nvmlGpmMigSampleGet(h, 10, s1)  # two GPU instances: no window between them
    with pytest.raises(pynvml.NVMLError) as info:
        req.sample1, req.sample2 = s2, s1
        nvml.nvmlGpmMetricsGet(req)
    assert code(info) == errors.INVALID_ARGUMENT
    with pytest.raises(pynvml.NVMLError) as info:
        nvml.nvmlGpmMigSampleGet(h, 4, s1)  # no such GPU instance
    assert code(info) == errors.INVALID_ARGUMENT
    assert ctypes.cast(s1, ctypes.c_void_p).value  # still a live buffer


def test_a_gpu_without_a_mig_object_answers_from_its_values(tmp_path: Path) -> None:
    nvml = fake(tmp_path, {"gpus": [{"uuid": UUID, "values": {"nvmlDeviceGetMigMode": [0, 0]}}]})
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 0]
    with pytest.raises(pynvml.NVMLError) as info:
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert code(info) == errors.NOT_FOUND


def test_faults_match_calls_on_mig_device_handles_by_their_gpu(tmp_path: Path) -> None:
    data = scenario(MIG)
    data["faults"] = [{"function": "nvmlDeviceGetUUID", "gpu": 0, "action": "error", "error": "GPU_IS_LOST"}]
    nvml = fake(tmp_path, data)
    a = nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(0), 0)
    with pytest.raises(pynvml.NVMLError) as info:
        nvml.nvmlDeviceGetUUID(a)
    assert code(info) == errors.GPU_IS_LOST


def _inst(**over: Any) -> dict[str, Any]:
    return {"gpu_instance_id": 1, "compute_instance_id": 0, "uuid": MIG_A, **over}


INVALID: dict[str, tuple[Any, str, str]] = {
    "not_an_object": ([1, 1], "gpus[0].mig", "an object"),
    "unknown_key": ({"layout": []}, "gpus[0].mig unknown keys ['layout']", "only ["),
    "bad_mode": ({"mode": [2, 0]}, "gpus[0].mig.mode", "[current, pending] with 0 (disabled) or 1"),
    "bad_max": ({"max_devices": 0}, "gpus[0].mig.max_devices", "an integer from 1 to 64"),
    "bad_profile": ({"profiles": {"x": {}}}, "gpus[0].mig.profiles['x']", "a profile id in digits"),
    "missing_uuid": (
        {"layouts": [{"instances": [{"gpu_instance_id": 1, "compute_instance_id": 0}]}]},
        "gpus[0].mig.layouts[0].instances[0]",
        "a uuid",
    ),
    "gpu_uuid_for_mig": (
        {"layouts": [{"instances": [_inst(uuid=UUID)]}]},
        "gpus[0].mig.layouts[0].instances[0].uuid",
        "a printable MIG UUID",
    ),
    "same_instance_twice": (
        {"layouts": [{"instances": [_inst(), _inst(uuid=MIG_B)]}]},
        "gpus[0].mig.layouts[0].instances[1].gpu/compute instance",
        "not already used by",
    ),
    "bad_instance_value": (
        {"layouts": [{"instances": [_inst(values={"nvmlDeviceGetMemoryInfo": {"error": "NOPE"}})]}]},
        "gpus[0].mig.layouts[0].instances[0].values['nvmlDeviceGetMemoryInfo']",
        "an NVML error name",
    ),
    "gi_out_of_range": (
        {"layouts": [{"instances": [_inst(gpu_instance_id=64)]}]},
        "gpus[0].mig.layouts[0].instances[0].gpu_instance_id",
        "an integer from 0 to 63",
    ),
}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_mig_validation_names_the_place_and_the_expectation(tmp_path: Path, name: str) -> None:
    mig, place, expected = INVALID[name]
    with pytest.raises(ScenarioError) as info:
        fake(tmp_path, scenario(mig))
    message = str(info.value)
    assert place in message and "expected" in message and expected in message, message


def test_the_mode_is_not_given_twice(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"gpus\[0\]\.values \['nvmlDeviceGetMigMode'\].*under gpus\[\]\.mig"):
        fake(tmp_path, scenario(MIG, nvmlDeviceGetMigMode=[1, 1]))
