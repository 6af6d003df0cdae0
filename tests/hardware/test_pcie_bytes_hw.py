"""On a real GPU: what GPM's PCIe byte rate counts, for the DCGM_FI_PROF_PCIE_{TX,RX}_BYTES
compatibility rules (deploy/prometheus/dcgm-compat/rules.yaml).

DCGM documents DCGM_FI_PROF_PCIE_*_BYTES as "including both protocol headers and data payloads";
nvml.h documents NVML_GPM_METRIC_PCIE_{TX,RX}_PER_SEC only as "PCIe traffic from/to this GPU in
MiB/sec". This measures which one GPM is: the exporter's ``nvgpu_gpm_pcie_*_bytes_total`` rate
against the payload rate of a pinned host<->device copy loop. A ratio near 1.00 means payload only;
about 1.05-1.25 means TLP headers are counted too (PCIe Gen5, 256-byte max payload: 20-30 header and
framing bytes per TLP).

Run on a machine with one H200 (PyTorch installed; the project installed with
``pip install --no-deps --no-build-isolation -e .``)::

    NVGPU_HW_OUT=$OUT/hw python3 -m pytest -q -p no:cacheprovider tests/hardware/test_pcie_bytes_hw.py -rs

About 40 s. Skips cleanly without a GPU or without PyTorch/CUDA. Writes ``$NVGPU_HW_OUT/pcie_gpm.json``:
per direction of copy (host_to_device, device_to_host), the copy's payload rate (bytes/s, measured
in the copying thread), the exporter's GPM transmit and receive rates over the same steady window
(counter increase / sample-timestamp difference), and their ratios to the payload rate.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from exporter_proc import Exporter, Scrape

INTERVAL = 1.0
CHUNK = 1 << 28  # 256 MiB per copy
RX = "nvgpu_gpm_pcie_receive_bytes_total"
TX = "nvgpu_gpm_pcie_transmit_bytes_total"


@pytest.fixture(scope="module")
def exp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exporter]:
    tmp = tmp_path_factory.mktemp("pcie")
    with Exporter(None, tmp, env={"NVGPU_NVML_BACKEND": "nvml"}, interval=INTERVAL) as e:
        e.wait_for(lambda s: bool(s.find(RX)), timeout=60, what="the GPM PCIe counters")
        yield e
        assert e.terminate() == 0


def _value(scrape: Scrape, name: str, gpu: str) -> float:
    return sum(s.value for s in scrape.find(name, gpu=gpu))


def _stamp(scrape: Scrape) -> float:
    return scrape.value("nvgpu_last_sample_timestamp_seconds") or 0.0


def _measure(exp: Exporter, torch: Any, gpu: str, to_device: bool) -> dict[str, Any]:
    host = torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(CHUNK, dtype=torch.uint8, device="cuda:0")
    src, dst = (host, dev) if to_device else (dev, host)
    stop = threading.Event()
    marks: list[tuple[float, int]] = []

    def loop() -> None:
        copied = 0
        while not stop.is_set():
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(0)
            copied += CHUNK
            marks.append((time.monotonic(), copied))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        time.sleep(2.0)  # steady state
        start = time.time()
        before = exp.wait_for(lambda s: _stamp(s) >= start + INTERVAL, timeout=30, what="a sample in the loop")
        t0 = time.monotonic()
        time.sleep(8.0)
        after = exp.scrape()
        t1 = time.monotonic()
    finally:
        stop.set()
        thread.join(60)
    window = _stamp(after) - _stamp(before)
    inside = [m for m in marks if t0 <= m[0] <= t1]
    payload = (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
    rx = (_value(after, RX, gpu) - _value(before, RX, gpu)) / window
    tx = (_value(after, TX, gpu) - _value(before, TX, gpu)) / window
    return {
        "payload_bytes_per_s": payload,
        "gpm_rx_bytes_per_s": rx,
        "gpm_tx_bytes_per_s": tx,
        "rx_over_payload": rx / payload,
        "tx_over_payload": tx / payload,
        "window_s": window,
        "copies_in_window": len(inside),
    }


def test_gpm_pcie_bytes_against_a_copy_of_known_size(exp: Exporter) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    scrape = exp.scrape()
    bus = {s.labels["pci_bus_id"].lower()[-12:]: s.labels["gpu"] for s in scrape.find("nvgpu_gpu_info")}
    props = torch.cuda.get_device_properties(0)
    gpu = bus[f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"[-12:]]
    result = {
        "gpu": gpu,
        "host_to_device": _measure(exp, torch, gpu, to_device=True),
        "device_to_host": _measure(exp, torch, gpu, to_device=False),
    }
    out = os.environ.get("NVGPU_HW_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "pcie_gpm.json").write_text(json.dumps(result, indent=1))
    # The data direction carries the payload (host to device: the GPU receives; device to host: it
    # sends), never less, and headers add at most about a third.
    for ratio in (result["host_to_device"]["rx_over_payload"], result["device_to_host"]["tx_over_payload"]):
        assert 0.95 <= ratio <= 1.35, result
