"""NVLink fabric state: exporter.common.collectors.fabric on the fake backend (the real binding's
versioned struct is exercised in tests/test_gpm.py against pynvml's own structures)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_device import Clock, device, fake_of, render

from exporter.common.collectors import fabric

COMPLETED = {"state": 3, "status": 0, "cliqueId": 0, "healthMask": 0, "healthSummary": 0}


def fabric_gpu(spec: Any, **more: Any) -> dict[str, Any]:
    return {"values": {"nvmlDeviceGetGpuFabricInfoV": spec, **more}}


def test_completed_state_and_status(tmp_path: Path) -> None:
    dev = device(tmp_path, fabric_gpu(COMPLETED), Clock(1.0))
    r = fabric.read(dev)
    assert r == fabric.Reading(state=3, status=0)
    fams = render("fabric", [(dev, r)])
    assert fams == {"nvgpu_fabric_state": {("0", dev.uuid): 3.0}, "nvgpu_fabric_status": {("0", dev.uuid): 0.0}}


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
        seen.append(fabric.read(dev))
    assert seen == [fabric.Reading(1, 0), fabric.Reading(2, 0), fabric.Reading(3, 27)]


def test_v3_rejected_falls_back_to_v2_once(tmp_path: Path) -> None:
    gpu = fabric_gpu(COMPLETED, **{"nvmlDeviceGetGpuFabricInfoV:3": {"error": "ARGUMENT_VERSION_MISMATCH"}})
    dev = device(tmp_path, gpu, Clock(1.0))
    assert fabric.read(dev) == fabric.read(dev) == fabric.Reading(3, 0)
    assert fake_of(dev).call_counts()["nvmlDeviceGetGpuFabricInfoV"] == 3  # v3 once, v2 twice
    assert "fabric" in dev.feature_ok


@pytest.mark.parametrize(
    "spec", [{"error": "NOT_SUPPORTED"}, {**COMPLETED, "state": 0}], ids=["not_supported", "state_not_supported"]
)
def test_no_fabric_no_series_and_not_asked_again(tmp_path: Path, spec: Any) -> None:
    dev = device(tmp_path, fabric_gpu(spec), Clock(1.0))
    assert fabric.read(dev) is None and fabric.read(dev) is None
    calls = fake_of(dev).call_counts()["nvmlDeviceGetGpuFabricInfoV"]
    assert calls == (2 if spec.get("error") else 1)  # NOT_SUPPORTED: v3 then v2, once each
    assert "fabric" in dev.feature_unsupported and "fabric" not in dev.feature_ok
    assert render("fabric", [(dev, None)]) == {}
