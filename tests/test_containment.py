"""Containment: an exception in any part of the supervisor's own work never ends the process.

Each test runs the real exporter (HTTP server, supervisor loop, real workers on the fake backend)
with one fault injected into one component (``tests/faultinject.py``) and asserts that ``/metrics``
and ``/healthz`` keep answering, the error is counted in ``nvgpu_supervisor_errors_total{component}``
(or, for rendering, in ``nvgpu_render_errors_total{family}``) and logged once, the component goes
on working after it, and SIGTERM still ends the exporter with exit 0.
"""

from __future__ import annotations

import http.client
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from exporter_proc import SCENARIOS, Exporter, Scrape

H200X1_UUID = "GPU-820f4b2d-da15-c9b7-3ba6-c396976ca722"
H200X2_UUID0 = "GPU-ef65bf38-0ae6-479b-9ebc-46c6463961e6"
ERRORS = "nvgpu_supervisor_errors_total"


def _errors(scrape: Scrape, component: str) -> float:
    return scrape.value(ERRORS, component=component) or 0.0


def _component_logs(exp: Exporter, component: str) -> list[dict[str, Any]]:
    return [r for r in exp.log_records() if r.get("component") == component]


def assert_contained(exp: Exporter, component: str, at_least: int = 1, timeout: float = 30.0) -> Scrape:
    """The component's errors are counted (at least ``at_least``) and logged exactly once, with the
    traceback; the process lives and both endpoints answer 200."""
    scrape = exp.wait_for(
        lambda s: _errors(s, component) >= at_least, timeout=timeout, what=f"{at_least} {component} error(s)"
    )
    assert exp.proc.poll() is None
    for path in ("/metrics", "/healthz"):
        assert exp.get(path)[0] == 200, path
    records = _component_logs(exp, component)
    assert len(records) == 1, records
    assert records[0]["level"] == "ERROR" and "contained" in records[0]["msg"] and "injected" in records[0]["exc"]
    return scrape


def test_worker_message_handling_that_raises(tmp_path: Path) -> None:
    """Every second snapshot raises while it is applied: the others still arrive and are served."""
    with Exporter(SCENARIOS / "h200x1.json", tmp_path, fault="dispatch") as exp:
        assert_contained(exp, "worker_io", at_least=3)
        scrape = exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, what="fresh samples between failures")
        assert scrape.value("nvgpu_worker_restarts_total", reason="crash") in (None, 0.0)
        assert exp.terminate() == 0


def test_worker_message_that_cannot_be_decoded(tmp_path: Path) -> None:
    """Decoding every third message raises RecursionError (not a ProtocolError): the reading goes on
    with the next line, the worker is not mistaken for a hung one."""
    with Exporter(SCENARIOS / "h200x1.json", tmp_path, fault="decode") as exp:
        assert_contained(exp, "worker_io", at_least=3)
        exp.wait_samples(4)  # the reading goes on past the undecodable lines
        scrape = exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, what="fresh samples")
        assert not scrape.find("nvgpu_worker_restarts_total", reason="hang") or (
            scrape.value("nvgpu_worker_restarts_total", reason="hang") == 0.0
        )
        assert exp.terminate() == 0


def test_long_worker_stderr_line_is_cut_and_never_fatal(tmp_path: Path) -> None:
    """The issue's 70 KB stderr line (asyncio's 64 KiB readline limit raised ValueError when the
    worker ended, and the supervisor exited 1). Every worker here starts by writing one."""
    wrapper = tmp_path / "python-with-long-stderr"
    wrapper.write_text(f"#!/bin/sh\nhead -c 70000 /dev/zero | tr '\\0' x >&2\necho >&2\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    with Exporter(
        SCENARIOS / "h200x1.json", tmp_path, fault="long_stderr", env={"FAULT_WORKER_PYTHON": str(wrapper)}
    ) as exp:
        before = exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, what="first worker up").value(
            "nvgpu_worker_start_time_seconds"
        )
        first = exp.wait_worker()
        first.send_signal(signal.SIGKILL)
        marker = f"{70000 - 8192} more bytes dropped"
        exp.wait_for(
            lambda s: (
                s.value("nvgpu_worker_restarts_total", reason="killed") == 1.0
                and exp.logs().count(marker) >= 2
                and s.value("nvgpu_worker_start_time_seconds") != before
            ),
            what="the death accounted and a second worker started (its long line read)",
        )
        assert exp.wait_worker().pid != first.pid
        scrape = exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, what="the second worker samples")
        assert _errors(scrape, "worker_io") == 0 and _errors(scrape, "lifecycle") == 0
        assert exp.terminate() == 0


def test_state_file_save_that_raises(tmp_path: Path) -> None:
    """Every save raises RuntimeError: the quarantine still holds in memory, no temporary file is
    left behind, the error is counted as component ``state``."""
    with Exporter(SCENARIOS / "h200x2-nvlink-crash.json", tmp_path, fault="state") as exp:
        exp.wait_for(
            lambda s: s.value("nvgpu_feature_enabled", feature="nvlink_throughput", reason="quarantined") == 0.0,
            timeout=40,
            what="nvlink_throughput quarantined",
        )
        assert_contained(exp, "state", at_least=2)
        exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, what="fresh samples after the quarantine")
        assert exp.terminate() == 0
    assert not (tmp_path / "state.json").exists()
    assert not list(tmp_path.glob(".state-*"))


def test_kernel_log_reader_that_raises(tmp_path: Path) -> None:
    """The first poll raises something other than KernelLogUnavailable: the extension is restarted
    after a backoff, and the Xid in the log is counted once."""
    log_file = tmp_path / "kern.log"
    log_file.write_text("[ 12.5] NVRM: Xid (PCI:0000:00:06): 13, pid=7, name=python3, Graphics SM Warp Exception\n")
    env = {
        "NVGPU_FEATURE_KERNEL_XID": "on",
        "NVGPU_KMSG_PATH": str(log_file),
        "NVGPU_KMSG_CURSOR_FILE": str(tmp_path / "cursor.json"),
    }
    with Exporter(SCENARIOS / "h200x1.json", tmp_path, env=env, fault="kernel_log") as exp:
        assert_contained(exp, "extension:kernel_xid")
        scrape = exp.wait_for(
            lambda s: s.value("nvgpu_xid_errors_total", gpu="0", xid="13") == 1.0, what="the Xid counted after retry"
        )
        assert scrape.value("nvgpu_kernel_log_up") == 1.0
        assert _errors(scrape, "extension:kernel_xid") == 1.0
        assert exp.terminate() == 0


def test_pod_attribution_client_that_raises(tmp_path: Path) -> None:
    env = {
        "NVGPU_FEATURE_POD_ATTRIBUTION": "on",
        "NVGPU_POD_RESOURCES_SOCKET": str(tmp_path / "kubelet.sock"),
        "NVGPU_POD_REFRESH_SECONDS": "1",
        "FAULT_POD_UUID": H200X1_UUID,
    }
    with Exporter(SCENARIOS / "h200x1.json", tmp_path, env=env, fault="pods") as exp:
        assert_contained(exp, "extension:pod_attribution")
        scrape = exp.wait_for(
            lambda s: s.find("nvgpu_gpu_pod_info", pod="train-0"), what="pods attributed after the restart"
        )
        assert scrape.value("nvgpu_pod_attribution_up") == 1.0
        assert exp.terminate() == 0


def test_rendering_family_that_raises_and_value_that_cannot_be_encoded(tmp_path: Path) -> None:
    """temperature's families() raise for GPU 1, the stuck detector's for every GPU, and a pod name
    holds a lone surrogate (not encodable as UTF-8): exactly those series are dropped and counted by
    family, each logged once, everything else is served and /readyz stays 200."""
    env = {
        "NVGPU_FEATURE_POD_ATTRIBUTION": "on",
        "NVGPU_POD_RESOURCES_SOCKET": str(tmp_path / "kubelet.sock"),
        "NVGPU_POD_REFRESH_SECONDS": "1",
        "FAULT_POD_UUID": H200X2_UUID0,
    }
    with Exporter(SCENARIOS / "h200x2.json", tmp_path, env=env, fault="render") as exp:
        scrape = exp.wait_for(
            lambda s: (
                s.value("nvgpu_up") == 1.0
                and (s.value("nvgpu_render_errors_total", family="nvgpu_gpu_pod_info") or 0) >= 1
                and (s.value("nvgpu_render_errors_total", family="nvgpu_gpu_temperature_celsius") or 0) >= 2
            ),
            what="render errors counted",
        )
        assert [s.labels["pod"] for s in scrape.find("nvgpu_gpu_pod_info")] == ["train-0"]
        assert scrape.gpus("nvgpu_gpu_info") == {"0", "1"}
        assert scrape.gpus("nvgpu_gpu_temperature_celsius") == {"0"}
        assert scrape.gpus("nvgpu_power_usage_watts") == {"0", "1"}
        assert scrape.value("nvgpu_feature_success", feature="temperature") == 0.0
        assert (scrape.value("nvgpu_render_errors_total", family="nvgpu_stuck_context_suspected") or 0) >= 1
        for path in ("/metrics", "/healthz", "/readyz"):
            assert exp.get(path)[0] == 200, path
        exp.wait_samples(3)  # more snapshots, so more renderings: still one log line each
        msgs = [r["msg"] for r in exp.log_records() if r.get("level") == "ERROR"]
        assert msgs.count("rendering feature temperature failed; retrying per GPU") == 1, msgs
        assert msgs.count("StuckDetector.gpu_families failed; its families are dropped from this rendering") == 1
        assert msgs.count("family nvgpu_gpu_pod_info cannot be encoded") == 1
        assert exp.terminate() == 0


def _get(conn: http.client.HTTPConnection, path: str) -> int:
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    return resp.status


def test_respawn_with_file_descriptors_exhausted(tmp_path: Path) -> None:
    """Every free descriptor is taken (RLIMIT_NOFILE 256), then the worker is killed: creating the
    next worker's pipe fails with EMFILE, again and again. The supervisor counts it as component
    ``lifecycle`` and retries with a bounded backoff; a kept-alive connection is still served
    throughout; once descriptors are free the next retry starts a worker."""
    with Exporter(SCENARIOS / "h200x1.json", tmp_path, fault="fd_hog") as exp:
        exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, what="first worker up")
        conn = http.client.HTTPConnection("127.0.0.1", exp.port, timeout=10)
        assert _get(conn, "/healthz") == 200
        worker = exp.wait_worker()
        os.kill(exp.proc.pid, signal.SIGUSR1)
        supervisor = psutil.Process(exp.proc.pid)
        exp.wait_until(lambda: supervisor.num_fds() >= 250, 5, "the hog to hold every descriptor (limit 256)")
        worker.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:  # the kept-alive connection is served while fds are gone
            assert _get(conn, "/metrics") == 200 and _get(conn, "/healthz") == 200
            time.sleep(0.5)
        assert exp.proc.poll() is None
        os.kill(exp.proc.pid, signal.SIGUSR2)
        scrape = exp.wait_for(
            lambda s: s.value("nvgpu_up") == 1.0 and s.value("nvgpu_worker_restarts_total", reason="killed") == 1.0,
            timeout=30,
            what="a new worker once descriptors are free",
        )
        assert _errors(scrape, "lifecycle") >= 2
        records = _component_logs(exp, "lifecycle")
        # uvloop (the fast extra) reports EMFILE from socketpair() as "[Errno -1] Unknown error -1"
        assert len(records) == 1 and "OSError" in records[0]["msg"], records
        conn.close()
        assert exp.terminate() == 0


@pytest.mark.parametrize("component", ["worker_io", "state", "lifecycle"])
def test_count_error_is_counted_and_logged_once_per_type(component: str, caplog: pytest.LogCaptureFixture) -> None:
    """The unit under every test above: counted each time, logged once per component and type."""
    from exporter.config import Config
    from exporter.supervisor.quarantine import QuarantineStore
    from exporter.supervisor.served import ServedState

    state = ServedState(Config(state_file=""), QuarantineStore("", 3, 600, 86400), [])
    for exc in (RuntimeError("a"), RuntimeError("b"), KeyError("c")):
        try:
            raise exc
        except Exception:  # noqa: BLE001
            state.count_error(f"{component}-unit", "testing")
    assert state.component_errors[f"{component}-unit"] == 3
    logged = [r for r in caplog.records if getattr(r, "component", None) == f"{component}-unit"]
    assert [r.exc_info[0] for r in logged if r.exc_info] == [RuntimeError, KeyError]


def test_failed_listen_socket_is_the_one_start_failure(tmp_path: Path) -> None:
    """The other way the process may end: its listen socket cannot be had. Exit 1, said why."""
    import socket
    import subprocess

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
        env.update(NVGPU_LISTEN_ADDRESS=f"127.0.0.1:{port}", NVGPU_STATE_FILE="", NVGPU_LOG_FORMAT="json")
        env["NVGPU_NVML_BACKEND"] = f"fake:{SCENARIOS / 'h200x1.json'}"
        proc = subprocess.run(
            [sys.executable, "-m", "exporter"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_extension_that_raises_on_a_snapshot_is_counted_and_the_snapshot_kept() -> None:
    from exporter.common.snapshot import Snapshot, SystemInfo
    from exporter.config import Config
    from exporter.supervisor.extensions import Extension
    from exporter.supervisor.quarantine import QuarantineStore
    from exporter.supervisor.served import ServedState

    class Broken(Extension):
        feature = "broken_unit"

        def on_snapshot(self, snapshot: Snapshot) -> None:
            raise RuntimeError("injected")

    state = ServedState(Config(state_file=""), QuarantineStore("", 3, 600, 86400), [Broken()])
    snap = Snapshot(time.time(), 0.1, SystemInfo(), (), {}, {}, {}, 0, {})
    for _ in range(3):
        state.apply_snapshot(snap)
    assert state.last is snap and state.component_errors["extension:broken_unit"] == 3


def test_extension_whose_gpu_count_views_raise_costs_only_its_views() -> None:
    """A bug in an extension's ``nvgpu_gpus`` views (the device plugin's) leaves the rendering and
    the other views intact, and is counted."""
    from exporter.common.snapshot import GpuSample, Snapshot, SystemInfo
    from exporter.config import Config
    from exporter.supervisor import exposition
    from exporter.supervisor.extensions import Extension
    from exporter.supervisor.quarantine import QuarantineStore
    from exporter.supervisor.served import ServedState

    class Broken(Extension):
        feature = "broken_unit"

        def gpu_count_views(self) -> dict[str, int]:
            raise RuntimeError("injected")

    state = ServedState(Config(state_file=""), QuarantineStore("", 3, 600, 86400), [Broken()])
    gpu = GpuSample(index=0, uuid="GPU-a", state="up", readings={}, sampled_at=time.time())
    state.apply_snapshot(Snapshot(time.time(), 0.1, SystemInfo(), (gpu,), {}, {}, {}, 0, {}))
    text = exposition.render(state).text.decode()
    assert 'nvgpu_gpus{view="present"} 1.0' in text
    assert state.render_errors["Broken.gpu_count_views"] >= 1
