"""The real exporter, started from a directory holding stale copies, reports what it imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from exporter_proc import ROOT, SCENARIOS, Exporter, free_port, load_scenario, write_scenario

import exporter


def _module_rows(scrape, process: str, module: str):  # type: ignore[no-untyped-def]
    return [s.labels for s in scrape.find("nvgpu_module_info", process=process, module=module)]


def test_stale_pynvml_in_working_directory_is_reported_by_the_worker(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    stale = work / "pynvml.py"
    # A stale binding that still works: re-export the real one from its installed file.
    real = Path(__import__("importlib.util").util.find_spec("pynvml").origin)
    stale.write_text(real.read_text())
    with Exporter(SCENARIOS / "h200x1.json", tmp_path, cwd=work) as exp:
        s = exp.wait_for(
            lambda s: (s.value("nvgpu_selfcheck_failures", process="worker") or 0) > 0, what="worker self-check"
        )
        rows = _module_rows(s, "worker", "pynvml")
        assert rows and rows[0]["path"] == str(stale)
        problems = [r for r in exp.log_records() if "self-check (worker)" in r.get("msg", "")]
        assert any(str(stale) in r["msg"] and "shadows" in r["msg"] for r in problems), problems
        assert exp.terminate() == 0
    # strict mode refuses to start (before listening), naming the file
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    env.update(
        NVGPU_SELFCHECK="strict",
        NVGPU_NVML_BACKEND=f"fake:{SCENARIOS / 'h200x1.json'}",
        NVGPU_STATE_FILE="",
        NVGPU_LISTEN_ADDRESS=f"127.0.0.1:{free_port()}",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "exporter"], cwd=work, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3, proc.stderr
    assert "refusing to start" in proc.stderr and str(stale) in proc.stderr


def test_stale_exporter_copy_in_working_directory(tmp_path: Path) -> None:
    work = tmp_path / "work"
    shutil.copytree(Path(exporter.__file__).parent, work / "exporter", ignore=shutil.ignore_patterns("__pycache__"))
    init = work / "exporter" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{exporter.__version__}"', '__version__ = "0.0.9"'))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "selfcheck", "--json", "--strict"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    results = json.loads(proc.stdout)
    for res in results:
        row = next(m for m in res["modules"] if m["module"] == "exporter")
        assert row["path"] == str(init) and row["version"] == "0.0.9"
        assert any(str(init) in p for p in res["problems"]), res["problems"]
    # from a clean directory the installed copy is clean
    clean = subprocess.run(
        [sys.executable, "-m", "exporter", "selfcheck", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert clean.returncode == 0
    for res in json.loads(clean.stdout):
        row = next(m for m in res["modules"] if m["module"] == "exporter")
        assert row["path"] == str(ROOT / "exporter" / "__init__.py")


@pytest.mark.slow
def test_venv_with_older_binding_than_the_driver_is_reported(tmp_path: Path) -> None:
    """nvidia-ml-py 12.575 bindings on a 580 driver (the incident's pairing), in a fresh venv."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "nvidia-ml-py==12.575.51", "prometheus-client", "aiohttp", "psutil"], check=True, timeout=600)
    subprocess.run([*pip, "--no-deps", str(ROOT)], check=True, timeout=600)
    port_env = {k: v for k, v in os.environ.items() if not k.startswith(("NVGPU_", "PYTHON"))}

    port = free_port()
    port_env.update(
        NVGPU_NVML_BACKEND=f"fake:{SCENARIOS / 'h200x1.json'}",
        NVGPU_LISTEN_ADDRESS=f"127.0.0.1:{port}",
        NVGPU_STATE_FILE="",
        NVGPU_SAMPLE_INTERVAL_SECONDS="0.5",
        NVGPU_FEATURE_POD_ATTRIBUTION="off",
    )
    log = tmp_path / "log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [str(venv / "bin" / "nvgpu-exporter")], cwd=tmp_path, env=port_env, stdout=fh, stderr=subprocess.STDOUT
        )
    try:
        import urllib.request

        deadline = time.monotonic() + 60
        body = ""
        while time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                time.sleep(0.2)
                continue
            if 'nvgpu_selfcheck_failures{process="worker"} 1.0' in body:
                break
            time.sleep(0.2)
        assert 'nvidia_ml_py_version="12.575.51"' in body, body[-3000:]
        assert 'nvgpu_selfcheck_failures{process="worker"} 1.0' in body, body[-3000:]
    finally:
        proc.terminate()
        proc.wait(30)
    assert "bindings generated for branch 575 on a 580 driver" in log.read_text()


def test_processes_v3_and_v2_missing_is_unsupported_and_never_called_again(tmp_path: Path) -> None:
    data = load_scenario("h200x1")
    data["missing_functions"] = ["nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"]
    # a second call of either symbol would crash the worker: proof that later samples make none
    data["faults"] = [{"function": f, "after_calls": 2, "action": "segfault"} for f in data["missing_functions"]]
    with Exporter(write_scenario(tmp_path, data), tmp_path) as exp:
        exp.wait_for(lambda s: s.value("nvgpu_feature_enabled", feature="processes", reason="unsupported") == 0.0)
        s = exp.wait_samples(4)  # four more samples, and none called the missing symbols (that would crash)
        assert s.value("nvgpu_worker_restarts_total", reason="crash") == 0.0
        assert not s.find("nvgpu_compute_processes")
        said = [r for r in exp.log_records() if "feature processes is unsupported" in r.get("msg", "")]
        assert len(said) == 1 and "nvmlDeviceGetComputeRunningProcesses_v3" in said[0]["msg"]
        assert exp.terminate() == 0


def test_only_v3_missing_falls_back_to_v2(tmp_path: Path) -> None:
    data = load_scenario("h200x1")
    data["missing_functions"] = ["nvmlDeviceGetComputeRunningProcesses_v3"]
    data["faults"] = [{"function": "nvmlDeviceGetComputeRunningProcesses_v3", "after_calls": 2, "action": "segfault"}]
    data["gpus"][0]["values"]["nvmlDeviceGetComputeRunningProcesses_v2"] = [
        {"pid": 494, "usedGpuMemory": 1050673152, "gpuInstanceId": 4294967295, "computeInstanceId": 4294967295}
    ]
    with Exporter(write_scenario(tmp_path, data), tmp_path) as exp:
        exp.wait_for(lambda s: s.value("nvgpu_compute_processes", gpu="0") == 1.0)
        s = exp.wait_samples(4)  # four more samples, and none called _v3 again (that would crash)
        assert s.value("nvgpu_compute_processes_memory_used_bytes", gpu="0") == 1050673152
        assert s.value("nvgpu_worker_restarts_total", reason="crash") == 0.0
        assert s.value("nvgpu_feature_enabled", feature="processes", reason="default") == 1.0
        assert exp.terminate() == 0
