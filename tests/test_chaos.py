"""Chaos benchmark: bench/chaos.py's run for 60 s meets its goals (docs/reliability.md).

The real exporter on the fake backend (8 H200s) while its worker is killed from outside with random
signals, hangs in seeded scenario-time windows, and crashes on purpose in one feature until that
feature is quarantined; one client scrapes at 20 requests/s and bursts of 200 concurrent requests
arrive every ~5 s.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from exporter_proc import ROOT


def _chaos() -> ModuleType:
    name = "nvgpu_bench_chaos"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "chaos.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def test_fault_plan_is_seeded_and_a_valid_scenario(tmp_path: Path) -> None:
    """Same seed, same plan; the scenario it writes is accepted by the fake backend."""
    from exporter.worker.fakenvml.binding import FakeNvml

    chaos = _chaos()
    cfg = chaos.ChaosConfig(duration=300, seed=7)
    a, b = chaos.plan_faults(cfg, 8), chaos.plan_faults(cfg, 8)
    assert a == b
    assert a != chaos.plan_faults(chaos.ChaosConfig(duration=300, seed=8), 8)
    assert len(a.hangs) == 15 and all(h["until_s"] - h["from_s"] == pytest.approx(2.0) for h in a.hangs)
    assert {h["function"] for h in a.hangs} == {f for _, f in chaos.HANG_TARGETS}
    assert a.deliberate["from_s"] == 75.0 and a.deliberate["action"] == "segfault" and "gpu" not in a.deliberate
    assert set(a.kill_signals) == {"SIGSEGV", "SIGABRT", "SIGKILL", "SIGTERM"}
    data = json.loads(chaos.SCENARIOS.joinpath("h200x8.json").read_text())
    data["faults"] = a.hangs + [a.deliberate]
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(data))
    FakeNvml(str(path))  # raises ScenarioError on a bad fault


@pytest.mark.slow
def test_chaos_60s_meets_goals(tmp_path: Path) -> None:
    chaos = _chaos()
    # the deliberate fault from 9 s on: 8 crashes at up to ~4 s apart fit well inside 60 s on a slow machine
    report = chaos.run(chaos.ChaosConfig(duration=60, seed=1, workdir=tmp_path, deliberate_at_fraction=0.15))
    text = chaos.summary(report)
    (tmp_path / "report.json").write_text(json.dumps(report, indent=2))
    log_tail = Path(report["exporter"]["log"]).read_text(errors="replace")[-3000:]
    detail = f"{text}\n--- exporter log tail ---\n{log_tail}"
    s, w = report["scrapes"], report["worker"]
    assert s["attempted"] > 1500, detail  # 20/s steady + 10+ bursts of 200
    assert s["non_200"] == 0, detail
    assert s["connection_errors"] == 0, detail
    assert s["bad_bodies"] == 0, detail
    assert s["all"]["max_s"] < 1.0, detail
    assert w["max_workers_at_once"] <= 3, detail  # the worker, a probe, one hung being replaced
    assert report["faults"]["kills_sent"] > 0, detail
    assert w["restarts_total"] > 0, detail
    # the deliberate repeated SIGSEGV and nothing else reached the quarantine threshold
    assert w["quarantined"] == ["nvlink_throughput"], detail
    assert report["exporter"]["exit_code"] == 0, detail


def _chaos_hw() -> ModuleType:
    name = "nvgpu_bench_chaos_hw"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "chaos_hw.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _hw_state(tmp_path: Path, tx0_after: float) -> Path:
    """A finished chaos_hw run's records: 2 GPUs x 2 links, a mover at 1 GiB/s each way, 1 kill."""
    gib = float(1 << 30)
    uuids = {"0": "GPU-aaaa", "1": "GPU-bbbb"}
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "duration": 20,
                "backend": "nvml",
                "torch": True,
                "kill_every": 30,
                "scrape_every": 1,
                "interval": 1,
                "gib": 1,
            }
        )
    )
    (tmp_path / "exporter_exit.json").write_text(json.dumps({"exit_code": 0, "stop_s": 1.0}))
    t0 = 1_000_000.0
    devices = [{"cuda": 0, "uuid": "GPU-bbbb"}, {"cuda": 1, "uuid": "GPU-aaaa"}]
    mover: list[dict[str, object]] = [{"event": "start", "wall": t0, "devices": devices}]
    mover += [{"event": "progress", "wall": t0 + i, "b01": i * gib, "b10": i * gib} for i in range(0, 21)]
    (tmp_path / "mover.jsonl").write_text("".join(json.dumps(m) + "\n" for m in mover))
    (tmp_path / "kills.jsonl").write_text(json.dumps({"t": 10, "signal": "SIGSEGV", "result": "sent"}) + "\n")
    lines = []
    for i in range(1, 20):
        # cuda:0 is NVML GPU 1 (matched by UUID): GPU 1 sends bytes 0->1, GPU 0 receives them, and back
        moved = i * gib
        tx = {f"{g}|{uuids[g]}|{link}": moved / 2 for g in ("0", "1") for link in (0, 1)}
        rx = dict(tx)
        if i == 15:
            tx[f"0|{uuids['0']}|0"] = tx0_after
        lines.append(
            {
                "t": i,
                "wall": t0 + i,
                "status": 200,
                "latency_s": 0.01,
                "sample_ts": t0 + i,
                "tx": tx,
                "rx": rx,
                "restarts": {"crash": 0.0 if i < 11 else 1.0},
                "nvlink_throughput": {"enabled": 1.0, "reason": "env"},
            }
        )
    (tmp_path / "scrapes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return tmp_path


@pytest.mark.integration  # bench/chaos.py's versions() runs git, out of the marking's sight
def test_chaos_hw_analysis_ratio_and_monotonic(tmp_path: Path) -> None:
    hw = _chaos_hw()
    good = hw.analyze(_hw_state(tmp_path, tx0_after=15 * float(1 << 30) / 2))
    assert good["ok"], good["checks"]
    assert good["mover"]["cuda_to_nvml_gpu"] == {0: "1", 1: "0"}
    assert set(good["mover"]["ratios"].values()) == {1.0}
    assert good["monotonic"]["restarts_crossed"] == 1 and not good["monotonic"]["decreases"]
    assert good["checks"]["restarts_equal_kills"]["ok"]
    bad = hw.analyze(_hw_state(tmp_path, tx0_after=1.0))  # one counter went backwards
    assert not bad["ok"] and not bad["checks"]["counters_monotonic"]["ok"]
    assert bad["monotonic"]["decreases"][0]["series"] == "tx|0|GPU-aaaa|0"
