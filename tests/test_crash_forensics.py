"""Crashes and hangs of the real worker are survived, attributed, and quarantined."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import pytest
from exporter_proc import SCENARIOS, Exporter, load_scenario, write_scenario

UUID0 = "GPU-ef65bf38-0ae6-479b-9ebc-46c6463961e6"
UUID1 = "GPU-094221fd-19f9-1561-7ef8-949bb0d57826"


class Scraper(threading.Thread):
    """Scrapes /metrics continuously; records status codes and latencies."""

    def __init__(self, exp: Exporter, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.exp, self.period = exp, period
        self.statuses: list[int] = []
        self.latencies: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                status = self.exp.get("/metrics", timeout=5)[0]
            except OSError:
                status = -1
            self.latencies.append(time.monotonic() - t0)
            self.statuses.append(status)
            self.stop.wait(self.period)

    def finish(self) -> None:
        self.stop.set()
        self.join(10)


def _workers(exp: Exporter) -> list[psutil.Process]:
    """Live worker processes of the exporter (a zombie being reaped counts as gone)."""
    found = []
    for p in psutil.Process(exp.proc.pid).children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "exporter.worker" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def test_nvlink_segfault_is_quarantined_and_survives_restart(tmp_path: Path) -> None:
    scenario = SCENARIOS / "h200x2-nvlink-crash.json"
    with Exporter(scenario, tmp_path) as exp:
        scraper = Scraper(exp)
        scraper.start()
        scrape = exp.wait_for(
            lambda s: s.value("nvgpu_feature_enabled", feature="nvlink_throughput", reason="quarantined") == 0.0,
            timeout=40,
            what="nvlink_throughput quarantined",
        )
        # every other metric of both GPUs comes back from the next sample on
        scrape = exp.wait_for(
            lambda s: s.value("nvgpu_up") == 1.0 and len(s.find("nvgpu_nvlink_links_up")) == 2,
            timeout=20,
            what="fresh sample after quarantine",
        )
        scraper.finish()
        assert scraper.statuses and set(scraper.statuses) == {200}, set(scraper.statuses)
        # the crash followed the feature from one GPU to the other: quarantined after the second
        assert scrape.value("nvgpu_worker_restarts_total", reason="crash") == 2.0
        assert (
            scrape.value("nvgpu_worker_crashes_total", feature="nvlink_throughput", function="nvmlDeviceGetFieldValues")
            == 2.0
        )
        assert scrape.value("nvgpu_worker_last_exit_signal") == 11.0
        assert scrape.gpus() == {"0", "1"}
        assert not scrape.find("nvgpu_nvlink_transmit_bytes_total")
        # With the field counters quarantined, GPM measures the NVLink traffic instead
        scrape = exp.wait_for(
            lambda s: len(s.find("nvgpu_gpm_nvlink_transmit_bytes_total")) == 2, timeout=20, what="GPM NVLink bytes"
        )
        for name in (
            "nvgpu_gpu_temperature_celsius",
            "nvgpu_memory_used_bytes",
            "nvgpu_power_usage_watts",
            "nvgpu_clock_hertz",
        ):
            assert {s.labels["gpu"] for s in scrape.find(name)} == {"0", "1"}, name
        records = list(exp.log_records())
        deaths = [r for r in records if r.get("msg", "").startswith("worker died")]
        assert len(deaths) == 2
        for r in deaths:
            assert r["signal"] == "SIGSEGV" and r["feature"] == "nvlink_throughput"
            assert r["function"] == "nvmlDeviceGetFieldValues"
            assert "Fatal Python error: Segmentation fault" in r["stack"] and "nvlink_throughput.py" in r["stack"]
        # each crash was blamed on the GPU whose thread crashed: one on each, the first kept out
        assert {r["uuid"] for r in deaths} == {UUID0, UUID1}
        left_out = [r for r in records if "left out of the next workers" in r.get("msg", "")]
        assert len(left_out) == 1 and left_out[0]["uuid"] == deaths[0]["uuid"]
        warnings = [r for r in records if "QUARANTINED" in r.get("msg", "")]
        assert len(warnings) == 1 and warnings[0]["level"] == "WARNING"
        assert "nvmlDeviceGetFieldValues" in warnings[0]["msg"] and "--clear nvlink_throughput" in warnings[0]["msg"]
        status, _, body = exp.get("/")
        assert b"quarantined" in body
        assert exp.terminate() == 0
    # a restart of the whole exporter with the same state file keeps the quarantine: no new crash
    with Exporter(scenario, tmp_path) as exp2:
        exp2.wait_for(lambda s: s.value("nvgpu_up") == 1.0, what="up after restart")
        scrape = exp2.wait_samples(3)  # three samples with the quarantine kept: none crashed
        assert scrape.value("nvgpu_feature_enabled", feature="nvlink_throughput", reason="quarantined") == 0.0
        assert scrape.value("nvgpu_worker_restarts_total", reason="crash") == 0.0
        assert exp2.terminate() == 0


@pytest.mark.parametrize("forever", [False, True], ids=["sleeps-30s", "forever-ignoring-sigterm"])
def test_hung_temperature_query_costs_one_gpu_only(tmp_path: Path, forever: bool) -> None:
    """GPU 0's temperature call hangs. GPU 1 keeps fresh samples throughout; GPU 0 is hung (not the
    worker); a probe retries GPU 0 and hangs in the same call. Both hangs are on GPU 0 and contained
    by leaving it out, so temperature is not quarantined even at NVGPU_QUARANTINE_AFTER=2 (until
    2026-12-01 the probe's hang switched temperature off on GPU 1 too): GPU 1 keeps its temperature."""
    data = load_scenario("h200x2")
    fault = {"function": "nvmlDeviceGetTemperatureV", "gpu": 0, "action": "hang"}
    if forever:
        fault["ignore_sigterm"] = True
    else:
        fault["seconds"] = 30
    data["faults"] = [fault]
    env = {"NVGPU_SAMPLE_DEADLINE_SECONDS": "1.5", "NVGPU_QUARANTINE_AFTER": "2", "NVGPU_GPU_RETRY_SECONDS": "1"}
    with Exporter(write_scenario(tmp_path, data), tmp_path, env=env) as exp:
        exp.wait_for(lambda s: s.value("nvgpu_device_up", gpu="1") == 1.0, what="GPU 1 up")
        scraper = Scraper(exp, period=0.1)
        scraper.start()
        most_workers, gpu1_dark, saw_hung = 0, 0, False
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            most_workers = max(most_workers, len(_workers(exp)))
            s = exp.scrape()
            assert s.value("nvgpu_feature_enabled", feature="temperature", reason="quarantined") is None
            gpu1_dark += s.value("nvgpu_device_up", gpu="1") != 1.0 or not s.find(
                "nvgpu_gpu_temperature_celsius", gpu="1"
            )
            saw_hung = saw_hung or s.value("nvgpu_device_state", gpu="0", state="hung") == 1.0
            if (s.value("nvgpu_device_faults_total", gpu="0", fault="probe_failed") or 0) >= 1:
                break
            time.sleep(0.1)
        scraper.finish()
        s = exp.scrape()
        assert saw_hung, "GPU 0 was never reported hung"
        assert gpu1_dark == 0, "GPU 1 lost its fresh samples or its temperature while only GPU 0 hung"
        assert s.value("nvgpu_worker_restarts_total", reason="hang") == 0.0  # the worker was never killed for it
        assert s.value("nvgpu_worker_restarts_total", reason="quarantine") == 0.0
        assert (s.value("nvgpu_device_faults_total", gpu="0", fault="probe_failed") or 0) >= 1
        assert s.value("nvgpu_device_faults_total", gpu="0", fault="hang") == 1.0
        assert s.value("nvgpu_feature_enabled", feature="temperature", reason="quarantined") is None
        assert s.value("nvgpu_device_state", gpu="0", state="hung") == 1.0
        assert set(scraper.statuses) == {200}
        assert max(scraper.latencies) < 1.0, max(scraper.latencies)
        assert most_workers <= 3, most_workers  # the worker, a probe, at most one hung one being replaced
        hung = [r for r in exp.log_records() if "hung:" in r.get("msg", "") and r.get("uuid") == UUID0]
        assert hung and all(r["function"] == "nvmlDeviceGetTemperatureV" for r in hung)
        assert exp.terminate() == 0


def test_scrapers_do_not_change_nvml_load(tmp_path: Path) -> None:
    """Five scrapers at one request a second make the same NVML calls per sample as none."""

    def calls_per_sample(exp: Exporter, seconds: float) -> set[float]:
        seen: dict[float, float] = {}
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            s = exp.scrape()
            ts, calls = s.value("nvgpu_last_sample_timestamp_seconds"), s.value("nvgpu_nvml_calls_total")
            if ts is not None and ts not in seen:
                seen[ts] = calls or 0.0
            time.sleep(0.05)
        values = [seen[k] for k in sorted(seen)]
        return {b - a for a, b in zip(values, values[1:], strict=False)}

    with Exporter(SCENARIOS / "h200x2.json", tmp_path, interval=0.5) as exp:
        exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0)
        exp.wait_samples(2)  # past the first samples, which make one-time calls
        quiet = calls_per_sample(exp, 3.0)
        scrapers = [Scraper(exp, period=1.0) for _ in range(5)]
        for sc in scrapers:
            sc.start()
        busy = calls_per_sample(exp, 3.0)
        for sc in scrapers:
            sc.finish()
        assert len(quiet) == 1 and quiet == busy, (quiet, busy)


def test_sigterm_while_sampling_is_busy_exits_cleanly(tmp_path: Path) -> None:
    data = load_scenario("h200x2")
    # every energy read takes 1.5 s: SIGTERM lands while an NVML call is in flight
    data["faults"] = [{"function": "nvmlDeviceGetTotalEnergyConsumption", "action": "hang", "seconds": 1.5}]
    with Exporter(write_scenario(tmp_path, data), tmp_path, env={"NVGPU_SAMPLE_DEADLINE_SECONDS": "10"}) as exp:
        exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, timeout=30)
        time.sleep(0.7)  # the point: the SIGTERM lands inside the next 1.5 s energy read, not between calls
        t0 = time.monotonic()
        code = exp.terminate(timeout=30)
        took = time.monotonic() - t0
        assert code == 0
        assert took < 10, took
        assert any(r.get("msg") == "worker stopped (nvmlShutdown done)" for r in exp.log_records()), exp.logs()[-2000:]
