"""NVLink fabric: exporter.common.collectors.fabric on the fake backend: state and status, the three
fabric info variants (v3, v2, v1) with struct layouts of our own, the health mask and summary, and the
NVLink domain (clique id, cluster UUID)."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest
from fake_device import DETAILS, Clock, device, fake_of, render

from exporter.common.collectors import fabric
from exporter.worker.nvml import structs
from exporter.worker.nvml.client import ApiChoices

COMPLETED = {"state": 3, "status": 0, "cliqueId": 0, "healthMask": 0, "healthSummary": 0}
ZERO_UUID = "00000000-0000-0000-0000-000000000000"
DOMAIN = "5f1a9c3e-2b7d-4e60-8a15-0c3d9e7f2a41"
# every healthMask field reported FALSE (2): the four conditions at shifts 0, 2, 4, 6
ALL_FALSE = 2 | 2 << 2 | 2 << 4 | 2 << 6


def fabric_gpu(spec: Any, **more: Any) -> dict[str, Any]:
    return {"values": {"nvmlDeviceGetGpuFabricInfoV": spec, **more}}


def chosen(dev: Any) -> tuple[str, str, str]:
    return dev.state_of(ApiChoices).calls["fabric"]


def test_our_struct_layouts_are_the_headers() -> None:
    """Sizes and version words as nvml.h defines them (v1 28 bytes, v2 36, v3 40)."""
    assert ctypes.sizeof(structs.GpuFabricInfoV1) == 28
    assert structs.GpuFabricInfoV1.state.offset == 24 and structs.GpuFabricInfoV1.status.offset == 16
    assert structs.struct_version(structs.GpuFabricInfoV2, 2) == 0x02000024
    assert structs.GpuFabricInfoV2.status.offset == 20 and structs.GpuFabricInfoV2.healthMask.offset == 32
    assert structs.struct_version(structs.GpuFabricInfoV3, 3) == 0x03000028
    assert structs.GpuFabricInfoV3.healthSummary.offset == 36


def test_completed_state_status_and_domain(tmp_path: Path) -> None:
    dev = device(tmp_path, fabric_gpu({**COMPLETED, "cliqueId": 7, "clusterUuid": DOMAIN}), Clock(1.0))
    r = fabric.read(dev)
    assert r == fabric.Reading(3, 0, 3, 7, DOMAIN, 0, 0, False)
    fams = render("fabric", [(dev, r)])
    assert fams == {
        "nvgpu_fabric_state": {("0", dev.uuid): 3.0},
        "nvgpu_fabric_status": {("0", dev.uuid): 0.0},
        "nvgpu_fabric_info": {("0", dev.uuid, "7", DOMAIN): 1.0},
    }  # health mask 0 and summary 0: every field "not supported", no health series
    assert chosen(dev) == ("nvmlDeviceGetGpuFabricInfoV", "3", "")


def test_state_and_status_follow_fabric_manager(tmp_path: Path) -> None:
    """Fabric Manager starting late: not started, in progress, then completed with an error code."""
    spec = {
        "sequence": [
            {"until_s": 10, "value": {**COMPLETED, "state": 1}},
            {"until_s": 20, "value": {**COMPLETED, "state": 2}},
            {"value": {**COMPLETED, "status": 27}},  # NVML_ERROR_NOT_READY
        ]
    }
    clock = Clock(1.0)
    dev = device(tmp_path, fabric_gpu(spec), clock)
    seen = []
    for t in (1.0, 11.0, 21.0):
        clock.t = t
        r = fabric.read(dev)
        assert r is not None
        seen.append((r.state, r.status))
    assert seen == [(1, 0), (2, 0), (3, 27)]
    fams = render("fabric", [(dev, fabric.Reading(2, 0, 3, 4, DOMAIN, 0, 0))])
    assert "nvgpu_fabric_info" not in fams  # the domain only once the registration completed
    fams = render("fabric", [(dev, fabric.Reading(3, 0, 3, 0, ZERO_UUID, 0, 0))])
    assert "nvgpu_fabric_info" not in fams  # clique 0 and no cluster UUID (direct NVLink): no domain


def test_v3_rejected_falls_back_to_v2_once(tmp_path: Path) -> None:
    gpu = fabric_gpu(COMPLETED, **{"nvmlDeviceGetGpuFabricInfoV:3": {"error": "ARGUMENT_VERSION_MISMATCH"}})
    dev = device(tmp_path, gpu, Clock(1.0))
    assert fabric.read(dev) == fabric.read(dev) == fabric.Reading(3, 0, 2, 0, ZERO_UUID, 0, None, False)
    assert fake_of(dev).call_counts()["nvmlDeviceGetGpuFabricInfoV"] == 3  # v3 once, v2 twice
    assert "fabric" in dev.feature_ok
    assert chosen(dev) == ("nvmlDeviceGetGpuFabricInfoV", "2", "argument_version_mismatch")
    dev.forget()  # a re-probe does not ask v3 again: the driver will not learn it
    fabric.read(dev)
    assert fake_of(dev).call_counts()["nvmlDeviceGetGpuFabricInfoV"] == 4


def test_a_branch_that_knows_v2_answers_v3_with_a_version_mismatch(tmp_path: Path) -> None:
    """driver_branch R550 (the 12.4 header knows the v2 struct): v2, without a scenario override."""
    dev = device(tmp_path, fabric_gpu(COMPLETED), Clock(1.0), driver_branch="R550")
    r = fabric.read(dev)
    assert r is not None and r.version == 2 and r.health_summary is None
    assert chosen(dev) == ("nvmlDeviceGetGpuFabricInfoV", "2", "argument_version_mismatch")


@pytest.mark.parametrize("how", ["missing_functions", "driver_branch"])
def test_without_the_v_call_the_deprecated_v1_call_answers(tmp_path: Path, how: str) -> None:
    """R535 (or nvidia-ml-py 12.535 without the wrapper): nvmlDeviceGetGpuFabricInfoV is
    FUNCTION_NOT_FOUND, so the v1 call with its 28-byte struct gives state, status and domain."""
    top = {"missing_functions": ["nvmlDeviceGetGpuFabricInfoV"]} if how == "missing_functions" else {}
    if how == "driver_branch":
        top["driver_branch"] = "R535"
    dev = device(tmp_path, fabric_gpu({**COMPLETED, "cliqueId": 3, "clusterUuid": DOMAIN}), Clock(1.0), **top)
    assert fabric.read(dev) == fabric.read(dev) == fabric.Reading(3, 0, 1, 3, DOMAIN, None, None, False)
    counts = fake_of(dev).call_counts()
    assert counts["nvmlDeviceGetGpuFabricInfoV"] == 1  # the missing symbol is asked once
    assert counts["nvmlDeviceGetGpuFabricInfo"] == 2
    assert chosen(dev) == ("nvmlDeviceGetGpuFabricInfo", "1", "function_not_found")
    fams = render("fabric", [(dev, fabric.read(dev))])
    assert set(fams) == {"nvgpu_fabric_state", "nvgpu_fabric_status", "nvgpu_fabric_info"}


@pytest.mark.parametrize(
    "spec", [{"error": "NOT_SUPPORTED"}, {**COMPLETED, "state": 0}], ids=["not_supported", "state_not_supported"]
)
def test_no_fabric_no_series_and_not_asked_again(tmp_path: Path, spec: Any) -> None:
    """NOT_SUPPORTED means the GPU has no fabric: no older variant is tried."""
    dev = device(tmp_path, fabric_gpu(spec), Clock(1.0))
    assert fabric.read(dev) is None and fabric.read(dev) is None
    counts = fake_of(dev).call_counts()
    assert counts["nvmlDeviceGetGpuFabricInfoV"] == 1 and "nvmlDeviceGetGpuFabricInfo" not in counts
    assert "fabric" in dev.feature_unsupported and "fabric" not in dev.feature_ok
    assert render("fabric", [(dev, None)]) == {}


def test_a_degraded_domain_shows_its_summary_and_conditions(tmp_path: Path) -> None:
    """GB200 NVL72 with a link lost (the recipe in docs/capabilities.md): DEGRADED_BW true (value 1
    at shift 0), the other conditions false, summary 3 (limited capacity), configuration correct.
    With a summary the conditions are details; without details only the summary and the check."""
    mask = (ALL_FALSE & ~0x3) | 1 | 1 << 8
    gpu = fabric_gpu({**COMPLETED, "healthMask": mask, "healthSummary": 3})
    (tmp_path / "default").mkdir()
    dev = device(tmp_path / "default", gpu, Clock(1.0))
    fams = render("fabric", [(dev, fabric.read(dev))])
    assert fams["nvgpu_fabric_health"] == {("0", dev.uuid): 3.0} and "nvgpu_fabric_health_condition" not in fams
    dev = device(tmp_path, gpu, Clock(1.0), DETAILS)
    fams = render("fabric", [(dev, fabric.read(dev))])
    assert fams["nvgpu_fabric_health"] == {("0", dev.uuid): 3.0}
    assert fams["nvgpu_fabric_health_condition"] == {
        ("0", dev.uuid, "degraded_bandwidth"): 1.0,
        ("0", dev.uuid, "route_recovery"): 0.0,
        ("0", dev.uuid, "route_unhealthy"): 0.0,
        ("0", dev.uuid, "access_timeout_recovery"): 0.0,
    }
    assert fams["nvgpu_fabric_incorrect_configuration"] == {("0", dev.uuid): 1.0}


def test_the_mask_is_decoded_two_bits_a_field_whatever_the_binding_says() -> None:
    """nvidia-ml-py up to 13.580.82 says NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_* = 0x11; decoding with it
    would read a route recovery (shift 2) into the degraded-bandwidth field."""
    route_recovery_only = 2 | 1 << 2 | 2 << 4  # degraded false, route recovery TRUE, unhealthy false
    assert fabric.conditions(route_recovery_only) == {
        "degraded_bandwidth": 0,
        "route_recovery": 1,
        "route_unhealthy": 0,
    }
    assert route_recovery_only & 0x11 != 2  # what the binding's width would have read for DEGRADED_BW
