"""Test harness: run the real exporter process (supervisor + worker) on a fake scenario and scrape it."""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "exporter" / "common" / "scenarios"


def load_scenario(name: str) -> dict[str, Any]:
    """A shipped scenario as a dict (a deep copy: tests modify it)."""
    return copy.deepcopy(json.loads((SCENARIOS / f"{name}.json").read_text()))


def write_scenario(tmp_path: Path, data: Mapping[str, Any], name: str = "scenario.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


class Scrape:
    """A parsed text exposition."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: list[Sample] = []
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                self.samples.append(Sample(s.name, dict(s.labels), float(s.value)))

    def find(self, name: str, **labels: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]

    def value(self, name: str, **labels: str) -> float | None:
        found = self.find(name, **labels)
        assert len(found) <= 1, f"{name}{labels} matched {len(found)} series"
        return found[0].value if found else None

    def names(self) -> set[str]:
        return {s.name for s in self.samples}

    def gpus(self, name: str = "nvgpu_device_up") -> set[str]:
        return {s.labels["gpu"] for s in self.find(name)}


class Exporter:
    """The real exporter in a subprocess.

    Args:
        scenario: scenario file path (fake backend).
        env: extra NVGPU_* variables.
        cwd: working directory.
        command_prefix: run the exporter under this (e.g. ``prlimit --nofile=128:128``).
        https: an ``ssl.SSLContext``: :meth:`get` and :meth:`scrape` speak HTTPS with it.
        fault: a fault of tests/faultinject.py to inject into the supervisor process.
    """

    def __init__(
        self,
        scenario: Path | None,
        tmp_path: Path,
        env: Mapping[str, str] | None = None,
        interval: float = 0.5,
        cwd: Path | None = None,
        args: list[str] | None = None,
        command_prefix: list[str] | None = None,
        https: Any = None,
        fault: str | None = None,
    ) -> None:
        self.port = free_port()
        self.interval = interval
        self.log_path = tmp_path / f"exporter-{self.port}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
        full_env.update(
            {
                "NVGPU_LISTEN_ADDRESS": f"127.0.0.1:{self.port}",
                "NVGPU_SAMPLE_INTERVAL_SECONDS": str(interval),
                "NVGPU_STATE_FILE": str(tmp_path / "state.json"),
                "NVGPU_RESTART_BACKOFF_SECONDS": "0.2",
                "NVGPU_RESTART_BACKOFF_MAX_SECONDS": "1",
                "NVGPU_LOG_FORMAT": "json",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if scenario is not None:
            full_env["NVGPU_NVML_BACKEND"] = f"fake:{scenario}"
        full_env.update(env or {})
        self._log = open(self.log_path, "wb")
        # fault: run through tests/faultinject.py, which patches one supervisor component first
        entry = ["-m", "exporter"] if fault is None else [str(ROOT / "tests" / "faultinject.py"), fault]
        self.proc = subprocess.Popen(
            [*(command_prefix or []), sys.executable, *entry, *(args or [])],
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=str(cwd or tmp_path),
            start_new_session=True,
        )
        self.https = https  # an ssl.SSLContext: get() speaks HTTPS with it
        self.base = f"{'https' if https is not None else 'http'}://127.0.0.1:{self.port}"
        self.started = time.monotonic()
        self.wait_listening()

    def wait_listening(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"exporter exited with {self.proc.returncode}:\n{self.logs()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"exporter did not listen within {timeout} s:\n{self.logs()[-3000:]}")

    def get(
        self, path: str, headers: Mapping[str, str] | None = None, timeout: float = 5.0, method: str = "GET"
    ) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(self.base + path, headers=dict(headers or {}), method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.https) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def scrape(self) -> Scrape:
        status, _, body = self.get("/metrics")
        assert status == 200, status
        return Scrape(body.decode())

    def wait_for(self, pred: Callable[[Scrape], Any], timeout: float = 20.0, what: str = "condition") -> Scrape:
        """Scrape every 0.1 s until ``pred(scrape)`` holds; the scrape. AssertionError with the last
        scrape and the log on timeout."""
        last: list[Scrape] = []

        def holds() -> Scrape | None:
            last[:] = [self.scrape()]
            return last[0] if pred(last[0]) else None

        scrape = wait_until(
            holds,
            timeout,
            what,
            lambda: f"last scrape:\n{last[0].text[-4000:] if last else ''}\nlogs:\n{self.logs()[-4000:]}",
            retry_on=(),
        )
        assert scrape is not None
        return scrape

    def wait_samples(self, n: int, after: float | None = None, timeout: float = 20.0) -> Scrape:
        """Wait until ``n`` more samples than the one current at ``after`` (a
        ``nvgpu_last_sample_timestamp_seconds`` value; default: the first sample seen) have arrived.

        This is how a test lets the worker run: "three more samples and still no restart" proves
        what a sleep of three intervals only hopes for.
        """
        start = after
        if start is None:
            first = self.wait_for(
                lambda s: s.value("nvgpu_last_sample_timestamp_seconds") is not None, what="a first sample"
            )
            start = first.value("nvgpu_last_sample_timestamp_seconds")
            assert start is not None
        return self.wait_for(
            lambda s: (s.value("nvgpu_last_sample_timestamp_seconds") or 0) >= start + (n - 0.5) * self.interval,
            timeout=timeout,
            what=f"{n} more samples",
        )

    def wait_until(self, pred: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
        """:func:`waiting.wait_until` with this exporter's log in the failure message."""
        return wait_until(pred, timeout, what, lambda: f"logs:\n{self.logs()[-4000:]}")

    def wait_log(
        self, pred: Callable[[dict[str, Any]], Any], timeout: float = 20.0, what: str = "a log record"
    ) -> dict[str, Any]:
        """The first JSON log record for which ``pred`` holds, waiting up to ``timeout`` s for it."""
        return self.wait_until(lambda: next((r for r in self.log_records() if pred(r)), None), timeout, what)  # type: ignore[no-any-return]

    def workers(self) -> list[psutil.Process]:
        """The live (not zombie) worker processes under this supervisor."""
        found = []
        for p in psutil.Process(self.proc.pid).children():
            try:
                if p.status() != psutil.STATUS_ZOMBIE and "exporter.worker" in " ".join(p.cmdline()):
                    found.append(p)
            except psutil.Error:
                continue
        return found

    def wait_worker(self, timeout: float = 20.0) -> psutil.Process:
        """A live worker (the first found), waiting up to ``timeout`` s for one to start."""
        worker: psutil.Process = self.wait_until(self.workers, timeout, "a live worker")[0]
        return worker

    def logs(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def log_records(self) -> Iterator[dict[str, Any]]:
        for line in self.logs().splitlines():
            if line.startswith("{"):
                try:
                    yield json.loads(line)
                except ValueError:
                    continue

    def terminate(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        return int(self.proc.returncode)

    def kill_group(self) -> None:
        """Kill the exporter and any worker still around (test cleanup)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.terminate()
        self.kill_group()
