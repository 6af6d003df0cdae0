"""The exporter, started as README says, against nvidia-smi and real NVLink traffic (point 10).

Run on a GPU machine: ``python3 -m pytest -q tests/hardware -s``. Results are written to
``$NVGPU_HW_OUT`` (a directory) as JSON when that variable is set.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from exporter_proc import Exporter, Scrape

from tests.hardware.conftest import GPU_COUNT

SMI_FIELDS = (
    "index,uuid,memory.used,memory.total,power.draw,temperature.gpu,clocks.sm,clocks.mem,pstate,name,driver_version"
)


def _smi() -> list[dict[str, str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    keys = SMI_FIELDS.split(",")
    return [dict(zip(keys, (c.strip() for c in line.split(",")), strict=True)) for line in out.strip().splitlines()]


def _record(name: str, data: object) -> None:
    out = os.environ.get("NVGPU_HW_OUT")
    if out:
        Path(out, f"{name}.json").write_text(json.dumps(data, indent=1, default=str))


def test_metrics_match_nvidia_smi(tmp_path: Path) -> None:
    env = {"NVGPU_NVML_BACKEND": "nvml", "NVGPU_FEATURE_DETAILS": "on"}  # the performance state too
    with Exporter(None, tmp_path, env=env, interval=1.0) as exp:
        exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, timeout=60, what="nvgpu_up on real NVML")
        time.sleep(2.5)
        rows = []
        for _ in range(3):  # three paired readings; values move, so compare each pair
            scrape = exp.scrape()
            smi = _smi()
            for g in smi:
                labels = {"gpu": g["index"], "uuid": g["uuid"]}
                row = {
                    "gpu": g["index"],
                    "uuid": g["uuid"],
                    "name": g["name"],
                    "driver": g["driver_version"],
                    "smi_memory_used_mib": float(g["memory.used"]),
                    "exp_memory_used_mib": scrape.value("nvgpu_memory_used_bytes", **labels) / 2**20,
                    "smi_memory_total_mib": float(g["memory.total"]),
                    "exp_memory_total_mib": scrape.value("nvgpu_memory_total_bytes", **labels) / 2**20,
                    "smi_power_w": float(g["power.draw"]),
                    "exp_power_w": scrape.value("nvgpu_power_usage_watts", **labels),
                    "smi_temp_c": float(g["temperature.gpu"]),
                    "exp_temp_c": scrape.value("nvgpu_gpu_temperature_celsius", **labels),
                    "smi_clock_sm_mhz": float(g["clocks.sm"]),
                    "exp_clock_sm_mhz": scrape.value("nvgpu_clock_hertz", clock="sm", **labels) / 1e6,
                    "smi_clock_mem_mhz": float(g["clocks.mem"]),
                    "exp_clock_mem_mhz": scrape.value("nvgpu_clock_hertz", clock="memory", **labels) / 1e6,
                    "smi_pstate": g["pstate"],
                    "exp_pstate": scrape.value("nvgpu_performance_state", **labels),
                }
                rows.append(row)
            time.sleep(1.0)
        _record("nvidia_smi_comparison", rows)
        assert len({r["gpu"] for r in rows}) == GPU_COUNT
        for r in rows:
            assert abs(r["exp_memory_total_mib"] - r["smi_memory_total_mib"]) <= 1, r
            assert abs(r["exp_memory_used_mib"] - r["smi_memory_used_mib"]) <= max(
                2, 0.02 * r["smi_memory_total_mib"]
            ), r
            assert abs(r["exp_power_w"] - r["smi_power_w"]) <= 0.10 * r["smi_power_w"] + 1, r
            assert abs(r["exp_temp_c"] - r["smi_temp_c"]) <= 2, r
            assert r["smi_pstate"] == f"P{int(r['exp_pstate'])}", r
            assert abs(r["exp_clock_mem_mhz"] - r["smi_clock_mem_mhz"]) <= 0.05 * r["smi_clock_mem_mhz"], r
            assert r["exp_clock_sm_mhz"] > 0
        assert exp.terminate() == 0


def _nvlink_bytes(scrape: Scrape, name: str, gpu: str) -> float:
    return sum(s.value for s in scrape.find(name, gpu=gpu))


@pytest.mark.skipif(GPU_COUNT < 2, reason="needs two NVLink-connected GPUs")
def test_nvlink_counters_track_a_known_copy(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2 or not torch.cuda.can_device_access_peer(0, 1):
        pytest.skip("no peer access between cuda:0 and cuda:1")
    with Exporter(None, tmp_path, env={"NVGPU_NVML_BACKEND": "nvml"}, interval=1.0) as exp:
        exp.wait_for(
            lambda s: s.value("nvgpu_up") == 1.0 and s.find("nvgpu_nvlink_transmit_bytes_total"),
            timeout=60,
            what="NVLink throughput counters",
        )
        # map NVML index <-> CUDA device by PCI bus id
        scrape = exp.scrape()
        bus = {s.labels["pci_bus_id"].lower()[-12:]: s.labels["gpu"] for s in scrape.find("nvgpu_gpu_info")}

        def nvml_index(cuda_dev: int) -> str:
            props = torch.cuda.get_device_properties(cuda_dev)
            key = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            return bus[key[-12:]]

        src, dst = nvml_index(0), nvml_index(1)
        chunk = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")  # 1 GiB
        target = torch.empty_like(chunk, device="cuda:1")
        target.copy_(chunk)  # warm-up: P2P mappings
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        time.sleep(2.5)
        before = exp.scrape()
        copies = 16
        for _ in range(copies):
            target.copy_(chunk, non_blocking=True)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        time.sleep(2.5)
        after = exp.scrape()
        moved = copies * chunk.numel()
        tx = _nvlink_bytes(after, "nvgpu_nvlink_transmit_bytes_total", src) - _nvlink_bytes(
            before, "nvgpu_nvlink_transmit_bytes_total", src
        )
        rx = _nvlink_bytes(after, "nvgpu_nvlink_receive_bytes_total", dst) - _nvlink_bytes(
            before, "nvgpu_nvlink_receive_bytes_total", dst
        )
        tx_rev = _nvlink_bytes(after, "nvgpu_nvlink_transmit_bytes_total", dst) - _nvlink_bytes(
            before, "nvgpu_nvlink_transmit_bytes_total", dst
        )
        rx_rev = _nvlink_bytes(after, "nvgpu_nvlink_receive_bytes_total", src) - _nvlink_bytes(
            before, "nvgpu_nvlink_receive_bytes_total", src
        )
        _record(
            "nvlink_copy",
            {
                "bytes_copied": moved,
                "src_gpu": src,
                "dst_gpu": dst,
                "src_tx_delta": tx,
                "dst_rx_delta": rx,
                "dst_tx_delta": tx_rev,
                "src_rx_delta": rx_rev,
                "tx_ratio": tx / moved,
                "rx_ratio": rx / moved,
                "series": len(after.find("nvgpu_nvlink_transmit_bytes_total", gpu=src)),  # 1: all links
            },
        )
        # The copy may be driven as reads by the destination (then the bytes show as the source's TX
        # and destination's RX either way); accept the direction with the data.
        best_tx, best_rx = max(tx, tx_rev), max(rx, rx_rev)
        assert abs(best_tx - moved) <= 0.10 * moved, (tx, tx_rev, moved)
        assert abs(best_rx - moved) <= 0.10 * moved, (rx, rx_rev, moved)
        assert exp.terminate() == 0
