"""Issue 3: crashes and hangs of the real worker are survived, attributed, and quarantined."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import pytest
from exporter_proc import SCENARIOS, Exporter, load_scenario, write_scenario

from exporter import logs

UUID0 = "GPU-ef65bf38-0ae6-479b-9ebc-46c6463961e6"


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
            lambda s: s.value("nvgpu_up") == 1.0 and len(s.find("nvgpu_nvlink_up")) == 36,
            timeout=20,
            what="fresh sample after quarantine",
        )
        scraper.finish()
        assert scraper.statuses and set(scraper.statuses) == {200}, set(scraper.statuses)
        assert scrape.value("nvgpu_worker_restarts_total", reason="crash") == 3.0
        assert (
            scrape.value("nvgpu_worker_crashes_total", feature="nvlink_throughput", function="nvmlDeviceGetFieldValues")
            == 3.0
        )
        assert scrape.value("nvgpu_worker_last_exit_signal") == 11.0
        assert scrape.gpus() == {"0", "1"}
        assert not scrape.find("nvgpu_nvlink_transmit_bytes_total")
        for name in (
            "nvgpu_gpu_temperature_celsius",
            "nvgpu_memory_used_bytes",
            "nvgpu_power_usage_watts",
            "nvgpu_clock_hertz",
        ):
            assert {s.labels["gpu"] for s in scrape.find(name)} == {"0", "1"}, name
        records = list(exp.log_records())
        deaths = [r for r in records if r.get("msg", "").startswith("worker died")]
        assert len(deaths) == 3
        for r in deaths:
            assert r["signal"] == "SIGSEGV" and r["feature"] == "nvlink_throughput"
            assert r["function"] == "nvmlDeviceGetFieldValues" and r["uuid"] == UUID0
            assert "Fatal Python error: Segmentation fault" in r["stack"] and "nvlink_throughput.py" in r["stack"]
        # backoff: the gap between restarts grows
        times = [logs.parse_rfc3339(r["time"]) for r in deaths]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert gaps[1] > gaps[0], gaps
        warnings = [r for r in records if "QUARANTINED" in r.get("msg", "")]
        assert len(warnings) == 1 and warnings[0]["level"] == "WARNING"
        assert "nvmlDeviceGetFieldValues" in warnings[0]["msg"] and "--clear nvlink_throughput" in warnings[0]["msg"]
        status, _, body = exp.get("/")
        assert b"quarantined" in body
        assert exp.terminate() == 0
    # a restart of the whole exporter with the same state file keeps the quarantine: no new crash
    with Exporter(scenario, tmp_path) as exp2:
        scrape = exp2.wait_for(lambda s: s.value("nvgpu_up") == 1.0, what="up after restart")
        time.sleep(1.5)
        scrape = exp2.scrape()
        assert scrape.value("nvgpu_feature_enabled", feature="nvlink_throughput", reason="quarantined") == 0.0
        assert scrape.value("nvgpu_worker_restarts_total", reason="crash") == 0.0
        assert exp2.terminate() == 0


@pytest.mark.parametrize("forever", [False, True], ids=["sleeps-30s", "forever-ignoring-sigterm"])
def test_hung_temperature_query_is_replaced(tmp_path: Path, forever: bool) -> None:
    data = load_scenario("h200x2")
    fault = {"function": "nvmlDeviceGetTemperatureV", "gpu": 0, "action": "hang"}
    if forever:
        fault["ignore_sigterm"] = True
    else:
        fault["seconds"] = 30
    data["faults"] = [fault]
    env = {"NVGPU_SAMPLE_DEADLINE_SECONDS": "1.5", "NVGPU_QUARANTINE_AFTER": "2"}
    with Exporter(write_scenario(tmp_path, data), tmp_path, env=env) as exp:
        scraper = Scraper(exp, period=0.1)
        scraper.start()
        most_workers = 0
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            most_workers = max(most_workers, len(_workers(exp)))
            s = exp.scrape()
            if (
                s.value("nvgpu_feature_enabled", feature="temperature", reason="quarantined") == 0.0
                and s.value("nvgpu_up") == 1.0
            ):
                break
            time.sleep(0.1)
        scraper.finish()
        s = exp.scrape()
        assert s.value("nvgpu_worker_restarts_total", reason="hang") == 2.0
        assert s.value("nvgpu_worker_crashes_total", feature="temperature", function="nvmlDeviceGetTemperatureV") == 2.0
        assert s.value("nvgpu_feature_enabled", feature="temperature", reason="quarantined") == 0.0
        assert s.gpus() == {"0", "1"} and s.find("nvgpu_memory_used_bytes", gpu="0")
        assert set(scraper.statuses) == {200}
        assert max(scraper.latencies) < 1.0, max(scraper.latencies)
        assert most_workers <= 2, most_workers
        hangs = [r for r in exp.log_records() if r.get("msg", "").startswith("worker died: hang")]
        assert hangs and all(r["function"] == "nvmlDeviceGetTemperatureV" and r["uuid"] == UUID0 for r in hangs)
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
        time.sleep(1.0)
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
        time.sleep(0.7)
        t0 = time.monotonic()
        code = exp.terminate(timeout=30)
        took = time.monotonic() - t0
        assert code == 0
        assert took < 10, took
        assert any(r.get("msg") == "worker stopped (nvmlShutdown done)" for r in exp.log_records()), exp.logs()[-2000:]
