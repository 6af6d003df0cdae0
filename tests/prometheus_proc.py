"""A real Prometheus server for the end-to-end tests (Debian's `prometheus` binary): written
config, started on a free port, ready before use, always stopped."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter_proc import free_port
from waiting import wait_until


@dataclass
class Prometheus:
    base: str  # http://127.0.0.1:<port>
    process: subprocess.Popen[bytes]
    log: Path

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@contextmanager
def running_prometheus(binary: str, tmp: Path, config: Mapping[str, Any], ready_s: float = 30) -> Iterator[Prometheus]:
    """Start ``binary`` with ``config`` (written as JSON, which is YAML) and its data under ``tmp``;
    yield once ``/-/ready`` answers 200. Raises AssertionError (with its log) if it exits or is not
    ready within ``ready_s``."""
    (tmp / "prometheus.yml").write_text(json.dumps(config))
    port = free_port()
    log = tmp / "prometheus.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {proc.returncode}:\n{prom.logs()}")
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                pass
            with urllib.request.urlopen(f"{prom.base}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)

        wait_until(ready, ready_s, "prometheus /-/ready", prom.logs, every=0.25)
        yield prom
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
