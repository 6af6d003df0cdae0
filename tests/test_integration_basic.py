"""The real exporter on the two-GPU scenario: core metrics, probes, routes."""

from __future__ import annotations

from pathlib import Path

from exporter_proc import SCENARIOS, Exporter


def test_two_gpus_core_metrics_and_probes(tmp_path: Path) -> None:
    with Exporter(SCENARIOS / "h200x2.json", tmp_path) as exp:
        scrape = exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, what="nvgpu_up 1")
        assert scrape.gpus() == {"0", "1"}
        uuid0 = "GPU-ef65bf38-0ae6-479b-9ebc-46c6463961e6"
        assert scrape.value("nvgpu_memory_total_bytes", gpu="0", uuid=uuid0) == 150754820096
        assert scrape.value("nvgpu_power_limit_watts", gpu="0", uuid=uuid0) == 700.0
        assert scrape.value("nvgpu_nvlink_links_up", gpu="0", uuid=uuid0) == 18
        assert len(scrape.find("nvgpu_nvlink_transmit_bytes_total", gpu="0")) == 1  # all links
        assert len(scrape.find("nvgpu_nvlink_errors_total", gpu="1")) == 4
        assert not scrape.find("nvgpu_nvlink_link_up")  # no link with errors in this scenario
        info = scrape.find("nvgpu_gpu_info", gpu="0")[0].labels
        assert info["pci_bus_id"] == "00000000:00:06.0" and info["driver_version"] == "580.159.04"
        assert not scrape.find("nvgpu_fan_speed_ratio")
        assert exp.get("/healthz")[0] == 200
        assert exp.get("/readyz")[0] == 200
        status, headers, body = exp.get("/")
        assert status == 200 and b"/metrics" in body and uuid0.encode() in body
        assert exp.get("/nope")[0] == 404
        assert exp.get("/metrics", method="POST")[0] == 405
        assert exp.get("/metrics", method="HEAD")[0] == 200
        assert exp.terminate() == 0
