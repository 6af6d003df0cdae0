#!/usr/bin/env python3
"""Series per GPU: what one exporter costs Prometheus, by family and by feature.

Runs the real exporter (``python -m exporter``, supervisor and worker) on the fake NVML backend with
each H200 scenario (``h200x1``, ``h200x2``, ``h200x8``), scrapes ``/metrics`` after the second
sample and counts series:

- per GPU: series carrying a ``uuid`` label, divided by the number of GPUs, by family and by the
  feature that owns the family (the collectors' ``METRICS``; the supervisor's own families are
  ``(always)``);
- per node: series without ``uuid`` (self-metrics), which a node pays once whatever its GPUs.

Default settings first, then with each off-by-default feature that adds per-GPU series switched on
(one at a time), so the cost of each switch is measured, not estimated::

    python bench/series.py                       # all scenarios, default + each switch
    python bench/series.py --scenario h200x2 --json out.json
    python bench/series.py --markdown            # the tables docs/performance.md shows

About 5 s per exporter start on an idle machine (13 starts with the defaults). Not a test: the budget
test (``tests/test_series_budget.py``) counts the committed golden expositions instead, which the
golden test keeps equal to what the exporter renders.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import load  # noqa: E402

import bench  # noqa: E402  (bench/bench.py: start_exporter)
from exporter.common import collectors  # noqa: E402

SCENARIOS = ("h200x1", "h200x2", "h200x8")
# Off-by-default switches that add per-GPU series, each measured on its own.
SWITCHES: dict[str, dict[str, str]] = {
    "nvlink_links": {"NVGPU_FEATURE_NVLINK_LINKS": "on"},
    "details": {"NVGPU_FEATURE_DETAILS": "on"},
    "gpm_pipes": {"NVGPU_FEATURE_GPM_PIPES": "on"},
    "process_usage": {"NVGPU_FEATURE_PROCESS_USAGE": "on"},
}


def feature_of_family() -> dict[str, str]:
    """Family name -> the feature whose collector declares it."""
    out: dict[str, str] = {}
    for feature, c in collectors.COLLECTORS.items():
        for spec in c.METRICS:
            out[spec.name] = feature
    return out


def count(text: str) -> dict[str, Any]:
    """Series of one exposition (text 0.0.4): per GPU by family, per node, GPUs seen.

    Returns:
        ``{"gpus": n, "per_gpu_total": float, "per_gpu": {family: float}, "per_feature": {feature:
        float}, "node": int, "node_families": {family: int}, "total": int}``.
    """
    from prometheus_client.parser import text_string_to_metric_families

    features = feature_of_family()
    per_family: Counter[str] = Counter()
    node: Counter[str] = Counter()
    uuids: set[str] = set()
    for fam in text_string_to_metric_families(text):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            if "uuid" in s.labels:
                uuids.add(s.labels["uuid"])
                per_family[name] += 1
            else:
                node[name] += 1
    gpus = max(1, len(uuids))
    per_feature: Counter[str] = Counter()
    for name, n in per_family.items():
        per_feature[features.get(name, "(always)")] += n
    return {
        "gpus": len(uuids),
        "per_gpu_total": round(sum(per_family.values()) / gpus, 2),
        "per_gpu": {k: round(v / gpus, 2) for k, v in sorted(per_family.items(), key=lambda kv: (-kv[1], kv[0]))},
        "per_feature": {k: round(v / gpus, 2) for k, v in sorted(per_feature.items(), key=lambda kv: (-kv[1], kv[0]))},
        "node": sum(node.values()),
        "node_families": dict(sorted(node.items(), key=lambda kv: (-kv[1], kv[0]))),
        "total": sum(per_family.values()) + sum(node.values()),
    }


def scrape(scenario: str, env: dict[str, str], timeout_s: float = 60.0) -> str:
    """Start the exporter on ``scenario`` with ``env``, return ``/metrics`` after the second sample."""
    with tempfile.TemporaryDirectory(prefix="nvgpu-series-") as tmp:
        full = {
            "NVGPU_NVML_BACKEND": f"fake:{ROOT / 'examples' / 'scenarios' / (scenario + '.json')}",
            "NVGPU_STATE_FILE": "",
            "NVGPU_SAMPLE_INTERVAL_SECONDS": "1",
            "NVGPU_LOG_LEVEL": "WARNING",
            **env,
        }
        server = bench.start_exporter(full, load.free_port(), Path(tmp) / "exporter.log")
        try:
            server.wait_status("/readyz", timeout_s)
            first = bench.metric(server, "nvgpu_last_sample_timestamp_seconds")
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                time.sleep(0.3)
                now = bench.metric(server, "nvgpu_last_sample_timestamp_seconds")
                if now is not None and first is not None and now > first:
                    break
            time.sleep(0.2)
            status, body = server.get("/metrics")
            if status != 200:
                raise RuntimeError(f"/metrics answered {status}")
            return body.decode()
        finally:
            server.stop()


def measure(scenarios: tuple[str, ...], switches: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"default": {}, "switches": defaultdict(dict)}
    for sc in scenarios:
        out["default"][sc] = count(scrape(sc, {}))
        if not switches:
            continue
        for name, env in SWITCHES.items():
            out["switches"][name][sc] = count(scrape(sc, env))
    out["switches"] = dict(out["switches"])
    return out


def markdown(result: dict[str, Any]) -> str:
    """Tables for docs/performance.md: per feature and per family (per GPU), per node, switches."""
    default = result["default"]
    scs = list(default)
    lines = ["| feature | " + " | ".join(scs) + " |", "|---|" + "---|" * len(scs)]
    features = sorted({f for sc in scs for f in default[sc]["per_feature"]})
    features.sort(key=lambda f: -max(default[sc]["per_feature"].get(f, 0) for sc in scs))
    for f in features:
        lines.append(f"| {f} | " + " | ".join(_n(default[sc]["per_feature"].get(f)) for sc in scs) + " |")
    lines.append("| **per GPU** | " + " | ".join(f"**{_n(default[sc]['per_gpu_total'])}**" for sc in scs) + " |")
    lines.append("| per node (no `uuid`) | " + " | ".join(str(default[sc]["node"]) for sc in scs) + " |")
    lines.append("| whole scrape | " + " | ".join(str(default[sc]["total"]) for sc in scs) + " |")
    lines += ["", "| family (per GPU) | " + " | ".join(scs) + " |", "|---|" + "---|" * len(scs)]
    families = sorted({f for sc in scs for f in default[sc]["per_gpu"]})
    families.sort(key=lambda f: -max(default[sc]["per_gpu"].get(f, 0) for sc in scs))
    for f in families:
        lines.append(f"| `{f}` | " + " | ".join(_n(default[sc]["per_gpu"].get(f)) for sc in scs) + " |")
    if result.get("switches"):
        lines += ["", "| switched on | " + " | ".join(scs) + " |", "|---|" + "---|" * len(scs)]
        for name, by_sc in result["switches"].items():
            cells = []
            for sc in scs:
                if sc not in by_sc:
                    cells.append("-")
                    continue
                delta = by_sc[sc]["per_gpu_total"] - default[sc]["per_gpu_total"]
                cells.append(f"{_n(by_sc[sc]['per_gpu_total'])} (+{_n(delta)})")
            lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _n(v: float | None) -> str:
    if v is None:
        return "-"
    return str(int(v)) if float(v).is_integer() else f"{v:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", action="append", choices=SCENARIOS, help="default: all three")
    ap.add_argument("--no-switches", action="store_true", help="only the default settings")
    ap.add_argument("--json", type=Path, help="write the raw counts here")
    ap.add_argument("--markdown", action="store_true", help="print the Markdown tables")
    args = ap.parse_args(argv)
    result = measure(tuple(args.scenario or SCENARIOS), not args.no_switches)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        print(markdown(result))
    else:
        print(json.dumps({sc: r["per_gpu_total"] for sc, r in result["default"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
