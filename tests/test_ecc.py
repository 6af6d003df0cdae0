"""ECC: current and pending mode, volatile and aggregate counts in two families."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fake_device import DETAILS, Clock, device, fake_of, render

from exporter.common.collectors import ecc


def ecc_gpu(mode: list[int], **counts: int) -> dict[str, Any]:
    values: dict[str, Any] = {"nvmlDeviceGetEccMode": mode}
    values.update({f"nvmlDeviceGetTotalEccErrors:{k[1]},{k[3]}": v for k, v in counts.items()})
    return {"values": values}


def test_volatile_and_aggregate_are_two_families(tmp_path: Path) -> None:
    # e{type}c{counter}: type 0 corrected / 1 uncorrected; counter 0 volatile / 1 aggregate
    dev = device(tmp_path, ecc_gpu([1, 1], e0c0=3, e0c1=10, e1c0=2, e1c1=2), Clock(1.0), DETAILS)
    r = ecc.read(dev)
    assert r == ecc.Reading(True, True, {"corrected": 3, "uncorrected": 2}, {"corrected": 10, "uncorrected": 2})
    fams = render("ecc", [(dev, r)])
    key = ("0", dev.uuid)
    assert fams["nvgpu_ecc_volatile_errors_total"] == {(*key, "corrected"): 3.0, (*key, "uncorrected"): 2.0}
    assert fams["nvgpu_ecc_aggregate_errors_total"] == {(*key, "corrected"): 10.0, (*key, "uncorrected"): 2.0}
    assert fams["nvgpu_ecc_enabled"] == {key: 1.0} and fams["nvgpu_ecc_pending_enabled"] == {key: 1.0}
    # no family mixes the two counter types: sum() over a family never counts an error twice
    assert all(len(labels) == 3 for name in fams if name.endswith("_total") for labels in fams[name])


def test_lifetime_counters_only_with_details(tmp_path: Path) -> None:
    """The aggregate (lifetime) counters are history no alert reads: not asked by default."""
    dev = device(tmp_path, ecc_gpu([1, 1], e0c0=3, e0c1=10, e1c0=2, e1c1=2), Clock(1.0))
    r = ecc.read(dev)
    assert r == ecc.Reading(True, True, {"corrected": 3, "uncorrected": 2}, {})
    assert set(render("ecc", [(dev, r)])) == {
        "nvgpu_ecc_enabled",
        "nvgpu_ecc_pending_enabled",
        "nvgpu_ecc_volatile_errors_total",
    }
    calls = [k for k in fake_of(dev).call_counts() if k.startswith("nvmlDeviceGetTotalEccErrors")]
    assert fake_of(dev).call_counts()["nvmlDeviceGetTotalEccErrors"] == 2, calls  # volatile x 2 types


def test_pending_mode_change(tmp_path: Path) -> None:
    """nvidia-smi -e 0 on a running GPU: current 1, pending 0 until the next reset."""
    dev = device(tmp_path, ecc_gpu([1, 0], e0c0=0, e0c1=0, e1c0=0, e1c1=0), Clock(1.0))
    fams = render("ecc", [(dev, ecc.read(dev))])
    key = ("0", dev.uuid)
    assert fams["nvgpu_ecc_enabled"] == {key: 1.0} and fams["nvgpu_ecc_pending_enabled"] == {key: 0.0}


def test_ecc_disabled_reads_no_counters(tmp_path: Path) -> None:
    dev = device(tmp_path, ecc_gpu([0, 1], e1c0=5), Clock(1.0))
    r = ecc.read(dev)
    assert r == ecc.Reading(False, True, {}, {})
    fams = render("ecc", [(dev, r)])
    assert set(fams) == {"nvgpu_ecc_enabled", "nvgpu_ecc_pending_enabled"}
