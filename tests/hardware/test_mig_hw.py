"""On real GPUs, read-only: MIG-mode reads on GPUs with MIG off, and what the MIG code path
costs per sample there. It NEVER changes the MIG mode, creates or destroys instances, or resets a
GPU (the lab machines' settings must stay as they are): every call below is a query.

Run on a machine with one or two H200s (the project installed with
``pip install --no-deps --no-build-isolation -e .``)::

    NVGPU_HW_OUT=$OUT/hw python3 -m pytest -q -p no:cacheprovider tests/hardware/test_mig_hw.py -rs

Skips cleanly without a GPU. About 40 seconds. Writes under ``$NVGPU_HW_OUT`` (when set):

- ``mig_disabled.json``: per GPU, ``nvmlDeviceGetMigMode`` (expected ``[0, 0]``), what
  ``nvidia-smi --query-gpu=mig.mode.current,mig.mode.pending`` says (expected ``Disabled``),
  ``nvmlDeviceGetMaxMigDeviceCount`` (expected 0), ``nvmlDeviceGetMigDeviceHandleByIndex(0)``
  (expected NOT_FOUND), the exporter's ``mig`` reading through its own collector on the real
  device client, and whether the running exporter shows any ``nvgpu_mig_*`` series (expected none)
  or ``nvgpu_gpu_feature_unsupported{feature="mig"}`` (expected none: MIG-capable, mode off);
- ``mig_cost.json``: per GPU, the median of 50 ``nvmlDeviceGetMigMode`` calls (what a re-probe of a
  MIG-off GPU costs, about 160 µs on the H200, measured on 580.159.04), the NVML calls the ``mig``
  collector makes over 200 samples after its first (expected 0) and its median time per sample
  (the cached path: Python only); and from the exporter, one run with ``mig`` on (default) and
  one with ``NVGPU_FEATURE_MIG=off``, 1 s interval, 12 samples each: the median
  ``nvgpu_feature_duration_seconds{feature="mig"}`` (all GPUs) and the median
  ``nvgpu_sample_duration_seconds`` of both runs.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from exporter_proc import Exporter, Scrape

from tests.hardware.conftest import GPU_COUNT

INTERVAL = 1.0
SAMPLES = 12


def _record(name: str, data: object) -> None:
    out = os.environ.get("NVGPU_HW_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, f"{name}.json").write_text(json.dumps(data, indent=1, default=str))


def _smi_modes() -> dict[int, list[str]]:
    """nvidia-smi's MIG mode per GPU index: [current, pending] as it prints them."""
    smi = shutil.which("nvidia-smi")
    assert smi is not None
    out = subprocess.run(
        [smi, "--query-gpu=index,mig.mode.current,mig.mode.pending", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    modes = {}
    for line in out.strip().splitlines():
        index, current, pending = (part.strip() for part in line.split(","))
        modes[int(index)] = [current, pending]
    return modes


def _devices() -> tuple[Any, list[Any]]:
    """The exporter's own NVML client and device clients on the real binding (read-only)."""
    from exporter.common.breadcrumb import BreadcrumbWriter
    from exporter.worker.nvml.backend import RealNvml
    from exporter.worker.nvml.client import DeviceClient, NvmlClient

    client = NvmlClient(RealNvml(), BreadcrumbWriter(None))
    client.raw("init", "nvmlInit", "")
    devs = []
    for i in range(int(client.raw("init", "nvmlDeviceGetCount", ""))):
        handle = client.raw("init", "nvmlDeviceGetHandleByIndex", "", i)
        uuid = client.raw("init", "nvmlDeviceGetUUID", "", handle)
        devs.append(DeviceClient(client, i, uuid.decode() if isinstance(uuid, bytes) else str(uuid), handle))
    return client, devs


def _exporter_run(tmp: Path, env: dict[str, str]) -> list[Scrape]:
    scrapes = []
    tmp.mkdir(parents=True, exist_ok=True)
    with Exporter(None, tmp, env={"NVGPU_NVML_BACKEND": "nvml", **env}, interval=INTERVAL) as exp:
        first = exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, timeout=60, what="up")
        last_ts = first.value("nvgpu_last_sample_timestamp_seconds") or 0.0
        while len(scrapes) < SAMPLES:
            s = exp.wait_for(
                lambda s, after=last_ts: (s.value("nvgpu_last_sample_timestamp_seconds") or 0.0) > after,
                timeout=30,
                what="the next sample",
            )
            last_ts = s.value("nvgpu_last_sample_timestamp_seconds") or 0.0
            scrapes.append(s)
        assert exp.terminate() == 0
    return scrapes


@pytest.mark.skipif(GPU_COUNT == 0, reason="no NVIDIA GPU")
def test_mig_reads_say_disabled_and_cost_nothing_per_sample(tmp_path: Path) -> None:
    import pynvml

    from exporter.common.collectors import mig

    smi = _smi_modes()
    client, devs = _devices()
    rows, costs = [], []
    try:
        for dev in devs:
            mode = pynvml.nvmlDeviceGetMigMode(dev.handle)
            count = pynvml.nvmlDeviceGetMaxMigDeviceCount(dev.handle)
            try:
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, 0)
                slot0 = "a handle"
            except pynvml.NVMLError as exc:
                slot0 = f"NVMLError {exc.value}"
            times = []
            for _ in range(50):
                t0 = time.perf_counter()
                pynvml.nvmlDeviceGetMigMode(dev.handle)
                times.append(time.perf_counter() - t0)
            reading = mig.read(dev)  # the first sample after a (re-)probe: one nvmlDeviceGetMigMode
            calls_before = client.calls
            per_sample = []
            for _ in range(200):
                t0 = time.perf_counter()
                again = mig.read(dev)
                per_sample.append(time.perf_counter() - t0)
                assert again == reading
            rows.append(
                {
                    "index": dev.index,
                    "uuid": dev.uuid,
                    "nvmlDeviceGetMigMode": list(mode),
                    "nvidia_smi": smi.get(dev.index),
                    "nvmlDeviceGetMaxMigDeviceCount": count,
                    "nvmlDeviceGetMigDeviceHandleByIndex_0": slot0,
                    "collector_reading": reading,
                }
            )
            costs.append(
                {
                    "index": dev.index,
                    "nvmlDeviceGetMigMode_median_us": statistics.median(times) * 1e6,
                    "nvmlDeviceGetMigMode_max_us": max(times) * 1e6,
                    "collector_nvml_calls_in_200_samples_after_the_first": client.calls - calls_before,
                    "collector_median_us_per_sample": statistics.median(per_sample) * 1e6,
                }
            )
    finally:
        client.raw_during_shutdown("shutdown", "nvmlShutdown", "")

    on = _exporter_run(tmp_path / "on", {})
    off = _exporter_run(tmp_path / "off", {"NVGPU_FEATURE_MIG": "off"})
    exported = sorted({s.name for s in on[-1].samples if s.name.startswith("nvgpu_mig_")})
    unsupported = [s.labels for s in on[-1].find("nvgpu_gpu_feature_unsupported", feature="mig")]
    mig_durations = [s.value("nvgpu_feature_duration_seconds", feature="mig") or 0.0 for s in on]
    _record("mig_disabled", {"gpus": rows, "exported_mig_series": exported, "mig_unsupported_on": unsupported})
    _record(
        "mig_cost",
        {
            "gpus": costs,
            "exporter_mig_feature_duration_seconds_median_all_gpus": statistics.median(mig_durations),
            "exporter_sample_duration_seconds_median_mig_on": statistics.median(
                [s.value("nvgpu_sample_duration_seconds") or 0.0 for s in on]
            ),
            "exporter_sample_duration_seconds_median_mig_off": statistics.median(
                [s.value("nvgpu_sample_duration_seconds") or 0.0 for s in off]
            ),
            "interval_s": INTERVAL,
            "samples": SAMPLES,
            "gpu_count": GPU_COUNT,
        },
    )
    for row in rows:
        assert row["nvmlDeviceGetMigMode"] == [0, 0], row
        assert row["nvidia_smi"] == ["Disabled", "Disabled"], row
        assert row["nvmlDeviceGetMaxMigDeviceCount"] == 0, row
        assert row["nvmlDeviceGetMigDeviceHandleByIndex_0"] != "a handle", row
        reading = row["collector_reading"]
        assert isinstance(reading, mig.Reading) and (reading.current_mode, reading.pending_mode) == (0, 0), row
        assert reading.devices == () and reading.gpu_instances == ()
    for cost in costs:  # a GPU with MIG off: no NVML call from the MIG code path between re-probes
        assert cost["collector_nvml_calls_in_200_samples_after_the_first"] == 0, cost
    assert exported == [], "a GPU with MIG off must not have MIG series"
    assert unsupported == []
    assert on[-1].value("nvgpu_feature_enabled", feature="mig", reason="default") == 1.0
    assert off[-1].value("nvgpu_feature_enabled", feature="mig", reason="env") == 0.0
