#!/usr/bin/env python3
"""One exposition of the exporter on real NVML with default settings, for the record.

Starts ``python -m exporter`` on this machine's GPUs (default settings: 5 s interval), waits for a
fresh sample and two more, then writes under ``--out``: ``exposition.prom`` (the text format, for
series counts per GPU and per family), ``summary.json`` (series per GPU and per family, sample and
feature durations, supervisor and worker RSS, GPU states). Never changes a GPU's settings.

    python3 bench/hw_exposition.py --out $OUT/expo
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from exporter_proc import Exporter  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--backend", default="nvml")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        env = {"NVGPU_NVML_BACKEND": args.backend, "NVGPU_LOG_FORMAT": "json"}
        with Exporter(None, Path(tmp), env=env, interval=5.0) as exp:
            first = exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, timeout=90, what="nvgpu_up")
            t0 = first.value("nvgpu_last_sample_timestamp_seconds") or 0
            scrape = exp.wait_for(
                lambda s: (s.value("nvgpu_last_sample_timestamp_seconds") or 0) >= t0 + 9, timeout=30, what="samples"
            )
            (args.out / "exposition.prom").write_text(scrape.text)
            per_gpu: dict[str, int] = collections.Counter()
            per_family: dict[str, int] = collections.Counter()
            for s in scrape.samples:
                if "gpu" in s.labels:
                    per_gpu[s.labels["gpu"]] += 1
                    per_family[s.name] += 1
            rss = {}
            try:
                sup = psutil.Process(exp.proc.pid)
                rss["supervisor_mb"] = round(sup.memory_info().rss / 1e6, 1)
                rss["workers_mb"] = [round(c.memory_info().rss / 1e6, 1) for c in sup.children()]
            except psutil.Error:
                pass
            summary = {
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "series_per_gpu": dict(per_gpu),
                "series_per_family_all_gpus": dict(sorted(per_family.items(), key=lambda kv: -kv[1])),
                "sample_duration_s": scrape.value("nvgpu_sample_duration_seconds"),
                "feature_duration_s": {
                    s.labels["feature"]: s.value for s in scrape.find("nvgpu_feature_duration_seconds")
                },
                "feature_enabled": {
                    s.labels["feature"]: s.labels["reason"] for s in scrape.find("nvgpu_feature_enabled") if s.value
                },
                "device_state": {
                    s.labels["gpu"]: s.labels["state"] for s in scrape.find("nvgpu_device_state") if s.value
                },
                "build_info": scrape.find("nvgpu_build_info")[0].labels if scrape.find("nvgpu_build_info") else {},
                "rss": rss,
            }
            (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
            print(json.dumps({k: summary[k] for k in ("series_per_gpu", "sample_duration_s", "rss")}))
            exp.terminate()
        shutil.copy(exp.log_path, args.out / "exporter.log")  # the exporter's own JSON log, kept
    return 0


if __name__ == "__main__":
    sys.exit(main())
