"""NVLink-C2C (exporter/common/collectors/c2c.py) and confidential computing
(exporter/common/collectors/confidential_computing.py) on the fake backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fake_device import DETAILS, Clock, device, fake_of, render

from exporter.common.collectors import c2c, confidential_computing

KEY_LINKS = 2


def grace_gpu(**fields: Any) -> dict[str, Any]:
    """Two C2C links, both active, errors on link 1 (the values are made up: no GH200/GB200 was measured)."""
    f: dict[str, Any] = {"170": KEY_LINKS, "171:0": 1, "171:1": 1, "231:0": 0, "231:1": 3, "232:0": 0, "232:1": 1}
    f.update({"233:0": 0, "233:1": 0})
    f.update(fields)
    return {"fields": f}


def test_links_up_and_errors_summed_over_the_links(tmp_path: Path) -> None:
    dev = device(tmp_path, grace_gpu(), Clock(1.0))
    r = c2c.read(dev)
    assert r == c2c.Reading(2, 2, {"crc": 3, "replay": 1, "replay_b2b": 0})
    fams = render("c2c", [(dev, r)])
    key = ("0", dev.uuid)
    assert fams["nvgpu_c2c_links"] == {key: 2.0} and fams["nvgpu_c2c_links_up"] == {key: 2.0}
    assert fams["nvgpu_c2c_errors_total"][(*key, "crc")] == 3.0


def test_a_link_down_and_the_r570_driver_without_error_fields(tmp_path: Path) -> None:
    """R570's header has no 231-234 (the C2C error fields arrive with R575): no error series."""
    dev = device(tmp_path, grace_gpu(**{"171:1": 0}), Clock(1.0), driver_branch="R570")
    r = c2c.read(dev)
    assert r == c2c.Reading(2, 1, {})
    c2c.read(dev)
    assert fake_of(dev).call_counts()["nvmlDeviceGetFieldValues"] == 3  # the count once, then one call a sample


def test_a_link_whose_status_did_not_answer_leaves_links_up_absent(tmp_path: Path) -> None:
    """Link 1's status field fails (UNKNOWN) from t = 5 s: links up is unknown, not 1 of 2 (which
    NvgpuC2cLinkDown would page on as a link down); it comes back with the answer."""
    flaky = {"sequence": [{"until_s": 5, "value": 1}, {"until_s": 10, "value": {"error": "UNKNOWN"}}, {"value": 1}]}
    clock = Clock(1.0)
    dev = device(tmp_path, grace_gpu(**{"171:1": flaky}), clock)
    assert c2c.read(dev) == c2c.Reading(2, 2, {"crc": 3, "replay": 1, "replay_b2b": 0})
    clock.t = 6.0
    r = c2c.read(dev)
    assert r is not None and r.links == 2 and r.links_up is None
    fams = render("c2c", [(dev, r)])
    assert fams["nvgpu_c2c_links"] == {("0", dev.uuid): 2.0} and not fams.get("nvgpu_c2c_links_up")
    clock.t = 11.0
    r = c2c.read(dev)
    assert r is not None and r.links_up == 2


def test_no_c2c_is_unsupported(tmp_path: Path) -> None:
    """H200 ("GPU C2C Mode: Disabled"): the count NOT_SUPPORTED, or 0."""
    for i, fields in enumerate(({}, {"170": 0})):
        sub = tmp_path / str(i)
        sub.mkdir()
        dev = device(sub, {"fields": fields}, Clock(1.0))
        assert c2c.read(dev) is None
        assert "c2c" in dev.feature_unsupported and "c2c" not in dev.feature_ok


CC_OFF = {"environment": 0, "ccFeature": 0, "devToolsMode": 0}
CC_ON = {"environment": 2, "ccFeature": 1, "devToolsMode": 0}
PROTECTED = {"total": 80 << 30, "used": 1 << 30, "free": 79 << 30}


def test_cc_off_is_one_info_series_and_nothing_else(tmp_path: Path) -> None:
    dev = device(tmp_path, {}, Clock(1.0), system_values={"nvmlSystemGetConfComputeState": CC_OFF})
    r = confidential_computing.read(dev)
    assert r == confidential_computing.Reading(0, False, False)
    fams = render("confidential_computing", [(dev, r)])
    assert fams == {"nvgpu_confidential_computing_info": {("unavailable", "off", "off"): 1.0}}
    assert "nvmlSystemGetConfComputeGpusReadyState" not in fake_of(dev).call_counts()


def test_cc_on_and_not_ready_is_a_state_not_an_error(tmp_path: Path) -> None:
    """CC on, attestation not done until t = 10 s: the ready state 0, then 1; nothing counted."""
    ready = {"sequence": [{"until_s": 10, "value": 0}, {"value": 1}]}
    system = {"nvmlSystemGetConfComputeState": CC_ON, "nvmlSystemGetConfComputeGpusReadyState": ready}
    clock = Clock(1.0)
    gpu = {"values": {"nvmlDeviceGetConfComputeProtectedMemoryUsage": PROTECTED}}
    dev = device(tmp_path, gpu, clock, DETAILS, system_values=system)  # the protected memory: details
    r = confidential_computing.read(dev)
    assert r is not None and r.enabled and r.gpus_ready == 0 and r.protected_used_bytes == 1 << 30
    assert not dev.client.errors
    fams = render("confidential_computing", [(dev, r)])
    assert fams["nvgpu_confidential_computing_gpus_ready"] == {(): 0.0}
    assert fams["nvgpu_confidential_computing_info"] == {("production", "on", "off"): 1.0}
    clock.t = 11.0
    later = confidential_computing.read(dev)
    assert later is not None and later.gpus_ready == 1


def test_a_system_without_cc_is_unsupported(tmp_path: Path) -> None:
    dev = device(tmp_path, {}, Clock(1.0))
    assert confidential_computing.read(dev) is None
    assert "confidential_computing" in dev.feature_unsupported
