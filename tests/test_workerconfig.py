"""exporter.common.workerconfig: what the supervisor starts a worker with, typed and decoded once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from exporter.common.workerconfig import ENV_VAR, CollectorOptions, Exclusion, GpuRef, ProcessOptions, WorkerConfig
from exporter.config import Config
from exporter.supervisor.workerproc import worker_config, worker_env
from guards import features as gf

ROOT = Path(__file__).resolve().parent.parent


def wire(config: WorkerConfig) -> dict[str, Any]:
    """What travels: through JSON, as the environment carries it."""
    return dict(json.loads(worker_env(config, 0.0)[ENV_VAR]))


def test_the_round_trip_through_the_environment_keeps_every_field() -> None:
    config = worker_config(
        Config.from_env({"NVGPU_FEATURE_NVLINK_THROUGHPUT": "on", "NVGPU_PROC_PATH": "/host/proc"}),
        {"gpm": "crashed 3 times"},
        exclude=(Exclusion(GpuRef("GPU-b", "", 1), "hung", "nvmlDeviceGetPowerUsage did not return"),),
        only=(GpuRef("GPU-a", "00000000:00:06.0", 0),),
        samples=1,
    )
    back = WorkerConfig.from_environ(worker_env(config, 0.0))
    assert back == config
    assert back.modes["nvlink_throughput"] is gf.Mode.ON and back.collectors.processes.proc_path == "/host/proc"
    assert back.exclude[0].state == "hung" and back.only[0].bus_id == "00000000:00:06.0" and back.samples == 1
    assert back.exclude[0].gpu.key == "GPU-b" and back.only[0].key == "GPU-a"


def test_the_worker_gets_the_settings_it_needs() -> None:
    """The processes options and the worker's deadlines come from the settings, nowhere else."""
    env = {
        "NVGPU_SAMPLE_INTERVAL_SECONDS": "2",
        "NVGPU_SHUTDOWN_TIMEOUT_SECONDS": "8",
        "NVGPU_PROC_PATH": "/host/proc",
        "NVGPU_CONTAINER_LOG_DIR": "/host/containers",
        "NVGPU_PROCESS_SERIES_PER_GPU": "4",
        "NVGPU_LOG_LEVEL": "DEBUG",
    }
    config = worker_config(Config.from_env(env), {})
    assert (config.interval_s, config.deadline_s, config.drain_s, config.reprobe_s) == (2.0, 10.0, 4.0, 300.0)
    assert worker_config(Config.from_env({"NVGPU_REENUMERATE_SECONDS": "30"}), {}).enumerate_s == 30.0
    assert config.collectors.processes == ProcessOptions("/host/proc", "/host/containers", 4)
    assert config.log_level == "DEBUG" and config.exclude == () and config.only == () and config.samples is None


def test_the_defaults_of_the_settings_and_of_the_options_agree() -> None:
    """ProcessOptions' defaults (a device client without a worker configuration: unit tests) are
    the settings' defaults."""
    assert worker_config(Config.from_env({}), {}).collectors == CollectorOptions()


def test_the_worker_always_logs_json() -> None:
    """The supervisor parses the worker's stderr: JSON whatever NVGPU_LOG_FORMAT says."""
    assert worker_config(Config.from_env({"NVGPU_LOG_FORMAT": "text"}), {}).log_format == "json"


def test_switches_travel_as_modes_and_quarantines_not_as_decisions() -> None:
    """Only the worker sees the GPU models and the driver the known-issue rules match against, so the
    supervisor sends what the operator said and what it quarantined, and the worker decides."""
    data = wire(worker_config(Config.from_env({"NVGPU_FEATURE_PROCESS_USAGE": "on"}), {"pod_attribution": "x"}))
    assert data["modes"]["process_usage"] == "on" and data["quarantined"] == {"pod_attribution": "x"}
    assert set(data["collectors"]["processes"]) == {"proc_path", "container_log_dir", "series_per_gpu"}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda d: d.pop("deadline_s"), "missing field 'deadline_s'"),
        (lambda d: d.update(deadline=d.pop("deadline_s")), "unknown field(s) ['deadline']"),
        (lambda d: d.update(interval_s="5"), "worker config.interval_s: expected a number"),
        (lambda d: d["collectors"]["processes"].pop("proc_path"), "processes: missing field 'proc_path'"),
        (lambda d: d["collectors"]["processes"].update(series_per_gpu=None), "series_per_gpu: expected an integer"),
        (lambda d: d["modes"].update(ecc="maybe"), "worker config.modes['ecc']: 'maybe' is not one of"),
        (lambda d: d["only"].append({"index": 0, "uuid": "GPU-a"}), "only[0]: missing field 'bus_id'"),
        (
            lambda d: d["exclude"].append(
                {"gpu": {"index": "0", "uuid": "", "bus_id": ""}, "state": "hung", "detail": ""}
            ),
            "exclude[0].gpu.index",
        ),
        (lambda d: d["exclude"].append({"index": 0, "uuid": "GPU-a", "state": "hung", "detail": ""}), "exclude[0]"),
    ],
)
def test_a_renamed_missing_or_mistyped_key_fails_at_decode_with_the_field_named(change: Any, named: str) -> None:
    data = wire(worker_config(Config.from_env({}), {}))
    change(data)
    with pytest.raises(ValueError) as exc:
        WorkerConfig.from_wire(data)
    assert named in str(exc.value)


def test_the_environment_variable_missing_or_not_json_is_said() -> None:
    with pytest.raises(ValueError, match="NVGPU_WORKER_CONFIG is not set"):
        WorkerConfig.from_environ({})
    with pytest.raises(ValueError, match="NVGPU_WORKER_CONFIG is not JSON"):
        WorkerConfig.from_environ({ENV_VAR: "{"})


def test_a_worker_given_a_bad_configuration_names_the_field_and_exits_1(tmp_path: Path) -> None:
    data = wire(worker_config(Config.from_env({}), {}))
    data["sample_deadline_s"] = data.pop("deadline_s")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    env.update({ENV_VAR: json.dumps(data), "NVGPU_WORKER_FD": "1"})
    proc = subprocess.run(
        [sys.executable, "-m", "exporter.worker"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1, proc.stderr
    assert "worker config: unknown field(s) ['sample_deadline_s']" in proc.stderr
    assert proc.stdout == ""  # nothing was sent: it stopped before the self-check and NVML
