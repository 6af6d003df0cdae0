"""Which variant of each versioned NVML call the real driver answers, and which features it lacks.

Every versioned call (memory info v2 or v1, temperature ``V`` or legacy, clock event or throttle
reasons, the process lists ``_v3`` or ``_v2``, fabric info v3, v2 or v1) is chosen once per worker
and shown in ``nvgpu_nvml_api_info``; a fallback is logged once ("chosen once for this worker"). On
an H200 with an R580 driver and nvidia-ml-py 13 none is taken: the newest variant answers each call.

Run on a GPU machine: ``python3 -m pytest -q tests/hardware/test_api_fallbacks_hw.py -s``. With
``$NVGPU_HW_OUT`` set, ``api_fallbacks.json`` there records the info rows, the features off as
unsupported (by GPU and node-wide), the fallback log lines and the driver, for docs/validation/.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from exporter_proc import Exporter, Scrape

# The newest variant of each call on R580 with nvidia-ml-py 13 (docs/capabilities.md, "NVML facts per
# generation"): what an H200 must answer. Calls a GPU has no use for are absent (fabric on a GPU
# without NVSwitch fabric answers NOT_SUPPORTED to every variant: no row).
NEWEST = {
    "memory": ("nvmlDeviceGetMemoryInfo_v2", "2"),
    "temperature": ("nvmlDeviceGetTemperatureV", ""),
    "clock_event_reasons": ("nvmlDeviceGetCurrentClocksEventReasons", ""),
    "compute_processes": ("nvmlDeviceGetComputeRunningProcesses_v3", ""),
    "graphics_processes": ("nvmlDeviceGetGraphicsRunningProcesses_v3", ""),
    "mps_processes": ("nvmlDeviceGetMPSComputeRunningProcesses_v3", ""),
    "fabric": ("nvmlDeviceGetGpuFabricInfoV", "3"),
}
# Answered by every NVIDIA GPU this exporter supports on R580: their absence is a finding.
ALWAYS = ("memory", "temperature", "clock_event_reasons", "compute_processes")


def _rows(scrape: Scrape) -> list[dict[str, str]]:
    return [dict(s.labels) for s in scrape.find("nvgpu_nvml_api_info")]


def test_the_h200_driver_takes_no_fallback(tmp_path: Path) -> None:
    # details on: the clock event reasons are read only with it
    env = {"NVGPU_NVML_BACKEND": "nvml", "NVGPU_FEATURE_DETAILS": "on"}
    with Exporter(None, tmp_path, env=env, interval=1.0) as exp:
        scrape = exp.wait_for(
            lambda s: {r["call"] for r in _rows(s)} >= set(ALWAYS), timeout=60, what="nvgpu_nvml_api_info on real NVML"
        )
        exp.wait_samples(2)
        scrape = exp.scrape()
        rows = sorted(_rows(scrape), key=lambda r: r["call"])
        records = list(exp.log_records())
        fallback_lines = [r["msg"] for r in records if "chosen once for this worker" in r.get("msg", "")]
        record = {
            "build": [dict(s.labels) for s in scrape.find("nvgpu_build_info")],
            "gpus": [
                {k: s.labels.get(k, "") for k in ("gpu", "name", "architecture")} for s in scrape.find("nvgpu_gpu_info")
            ],
            "api_info": rows,
            "gpu_feature_unsupported": sorted(
                f"{s.labels.get('gpu')}:{s.labels.get('feature')}" for s in scrape.find("nvgpu_gpu_feature_unsupported")
            ),
            "features_off_as_unsupported": sorted(
                s.labels["feature"] for s in scrape.find("nvgpu_feature_enabled", reason="unsupported")
            ),
            "fallback_log_lines": fallback_lines,
            "answers_again_log_lines": [r["msg"] for r in records if "answers again" in r.get("msg", "")],
        }
        out = os.environ.get("NVGPU_HW_OUT")
        if out:
            Path(out, "api_fallbacks.json").write_text(json.dumps(record, indent=1))
        print(json.dumps(record, indent=1))
    taken = {r["call"]: (r["function"], r["version"], r["fallback"]) for r in rows if r["fallback"]}
    assert taken == {}, f"fallbacks taken: {taken}"
    assert fallback_lines == []
    for row in rows:
        if row["call"] in NEWEST:
            assert (row["function"], row["version"]) == NEWEST[row["call"]], row
    assert {r["call"] for r in rows} >= set(ALWAYS)
