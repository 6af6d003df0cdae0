"""The timeline and the incident record on the real exporter: both incidents of docs/design.md replayed.

1. The NVLink field-value crash loop: every NVLink throughput query segfaults the worker, on each GPU
   in turn, until the feature is quarantined. The node's timeline holds the deaths with the call in
   flight, then the quarantine, then the first sample; a restart of the exporter with the same state
   file keeps all of it and adds only its own start.
2. The stuck GPU: Xid 13, 31 and 43 of one process (in a pod), then busy with nothing running:
   ``reset_gpu``. The record names the signature, the first Xid as first seen, the GPU, its pod, the
   versions and the commands; after the reset (the runbook's pause: the exporter stops, the GPU is
   reset, the exporter starts again) the exporter checks the recovery: "recovered at T" when the GPU
   stays clean for the recurrence window, "recurred" when the stuck signature comes back.

Plus a flood of Xids from thousands of processes: the timeline stays within its bounds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import verdict_scenarios as vs
from exporter_proc import SCENARIOS, Exporter, load_scenario, write_scenario
from fakeproc import Container, make_container_logs, make_proc

from exporter.supervisor import timelineevents

UUID0 = "GPU-ef65bf38-0ae6-479b-9ebc-46c6463961e6"
UUID1 = "GPU-094221fd-19f9-1561-7ef8-949bb0d57826"
INTERVAL = 0.5


def get_json(exp: Exporter, path: str) -> dict[str, Any]:
    status, headers, body = exp.get(path)
    assert status == 200, (path, status, body[:300])
    assert headers["Content-Type"].startswith("application/json")
    doc: dict[str, Any] = json.loads(body)
    assert doc["schema_version"] == 1
    return doc


def answer(exp: Exporter, path: str) -> dict[str, Any]:
    """The document at ``path``, or {} while the exporter does not know yet (404 before the first sample)."""
    status, _, body = exp.get(path)
    return json.loads(body) if status == 200 else {}  # type: ignore[no-any-return]


def timeline(exp: Exporter, query: str = "") -> list[dict[str, Any]]:
    return get_json(exp, f"/api/v1/timeline{query}")["events"]  # type: ignore[no-any-return]


def seqs(events: list[dict[str, Any]], kind: str, **data: Any) -> list[int]:
    """Sequence numbers of the events of ``kind`` whose data has ``data``."""
    return [e["seq"] for e in events if e["kind"] == kind and all(e["data"].get(k) == v for k, v in data.items())]


def test_the_nvlink_crash_loop_is_on_the_timeline_in_order_and_survives_a_restart(tmp_path: Path) -> None:
    scenario = SCENARIOS / "h200x2-nvlink-crash.json"
    with Exporter(scenario, tmp_path, interval=INTERVAL) as exp:
        node = exp.wait_until(
            lambda: (
                (e := answer(exp, "/api/v1/timeline?gpu=node").get("events", []))
                and seqs(e, "quarantine")
                and seqs(e, "boot")
                and e
            ),
            timeout=40,
            what="the quarantine and the first sample on the node's timeline",
        )
        deaths = [e for e in node if e["kind"] == "worker_death"]
        assert deaths and all(
            d["data"]["function"] == "nvmlDeviceGetFieldValues" and d["data"]["signal"] == "SIGSEGV" for d in deaths
        )
        assert {d["data"]["uuid"] for d in deaths} == {UUID0, UUID1}  # the crash followed the feature
        (quarantine,) = [e for e in node if e["kind"] == "quarantine"]
        assert quarantine["data"]["feature"] == "nvlink_throughput"
        start, boot = seqs(node, "exporter_start")[0], seqs(node, "boot")[0]
        assert start < min(d["seq"] for d in deaths) < max(d["seq"] for d in deaths) < quarantine["seq"] < boot
        gpu1 = timeline(exp, "?gpu=1&kind=worker_death")
        assert gpu1 and gpu1[0]["uuid"] == UUID1  # a death is on the lane of the GPU whose call crashed too
        first = {e["seq"]: e for e in timeline(exp)}
        exp.wait_until(lambda: (tmp_path / "timeline.json").exists(), what="the timeline file")
        assert exp.terminate() == 0
    with Exporter(scenario, tmp_path, interval=INTERVAL) as exp:
        exp.wait_until(
            lambda: (
                seqs(timeline(exp, "?gpu=0"), "verdict", to="ok") and len(seqs(timeline(exp), "exporter_start")) == 2
            ),
            timeout=30,
            what="the second start and GPU 0 ok",
        )
        events = timeline(exp)
        again = {e["seq"]: e for e in events}
        assert all(again[s]["summary"] == e["summary"] for s, e in first.items())  # kept, same order
        new = [e for e in events if e["seq"] not in first]
        assert new[0]["kind"] == "exporter_start" and new[0]["data"]["away_s"] >= 0
        assert not [e for e in new if e["kind"] in ("worker_death", "quarantine", "boot")]  # quarantine held
        assert not [e for e in new if e["kind"] == "state" and e["data"]["from"] is None]  # no "new -> up" again
        record = get_json(exp, "/api/v1/incidents/node")
        assert any(e["kind"] == "quarantine" for e in record["timeline"])
        assert exp.terminate() == 0


def stuck_env(tmp_path: Path, **more: str) -> dict[str, str]:
    """The stuck GPU's kernel log (Xid 13, 31, 43 of pid 4242 in pod ml/train-0) and a /proc that names the pod."""
    train = Container("ml", "train-0", "trainer")
    proc_root = make_proc(tmp_path / "proc", {4242: ("python3", train)})
    logs = make_container_logs(tmp_path / "containers", [train])
    kmsg = tmp_path / "kern.log"
    if not kmsg.exists():
        kmsg.write_text(
            vs.kernel_line(100, 0, 13, 4242, "python3", tail="Graphics SM Warp Exception")
            + vs.kernel_line(101, 0, 31, 4242, "python3", tail="MMU Fault")
            + vs.kernel_line(102, 0, 43, 4242, "python3")
        )
    return {
        "NVGPU_FEATURE_KERNEL_XID": "on",
        "NVGPU_KMSG_PATH": str(kmsg),
        "NVGPU_PROC_PATH": str(proc_root),
        "NVGPU_CONTAINER_LOG_DIR": str(logs),
        "NVGPU_STUCK_AFTER_SECONDS": "2",
        "NVGPU_RECURRENCE_WINDOW_SECONDS": "4",
        **more,
    }


def stuck_then_record(tmp_path: Path) -> dict[str, Any]:
    """Run the stuck GPU until reset_gpu and its pod is known; check the timeline and the record."""
    with Exporter(
        write_scenario(tmp_path, vs.stuck_gpu()), tmp_path, env=stuck_env(tmp_path), interval=INTERVAL
    ) as exp:
        rec = exp.wait_until(
            lambda: (
                (r := answer(exp, f"/api/v1/incidents/{UUID0}")).get("signature", {}).get("cause") == "stuck_context"
                and r["affected"]["pods"]
                and r
            ),
            timeout=30,
            what="the stuck GPU's record with its pod",
        )
        events = timeline(exp, "?gpu=0")
        x13, x31, x43 = (seqs(events, "xid", xid=x)[0] for x in (13, 31, 43))
        raised = seqs(events, "fault", cause="stuck_context", change="raised")[0]
        reset = seqs(events, "verdict", to="reset_gpu")[0]
        assert x13 < x31 < x43 < raised <= reset
        xid13 = next(e for e in events if e["seq"] == x13)
        assert (xid13["data"]["pid"], xid13["data"]["process"], xid13["data"]["source"]) == (
            4242,
            "python3",
            "kernel log",
        )
        assert rec["signature"]["verdict"] == "reset_gpu" and rec["status"] == "open"
        assert rec["first_seen"] == xid13["time"]
        assert rec["affected"]["gpu"]["pci_bus_id"] == "00000000:00:06.0" and rec["affected"]["gpu"]["serial"]
        assert {(p["namespace"], p["pod"], p["container"]) for p in rec["affected"]["pods"]} == {
            ("ml", "train-0", "trainer")
        }
        v = rec["versions"]
        assert (v["driver"], v["vbios"], v["inforom"]) == ("580.159.04", "96.00.A5.00.1A", "G520.0282.02.02")
        assert v["nvml_library_path"].endswith("libnvidia-ml.so.580.159.04") and v["nvidia_ml_py"]
        shells = {c["shell"] for c in rec["diagnostic_commands"]}
        assert {"nvidia-smi -q -i 00000000:00:06.0", "nvidia-smi pmon -c 5 -i 00000000:00:06.0"} <= shells
        status, headers, md = exp.get("/api/v1/incidents/0?format=markdown")
        assert status == 200 and headers["Content-Type"].startswith("text/markdown")
        assert b"cause `stuck_context`" in md and b"no reset, reboot or driver reload seen yet" in md
        assert exp.get("/api/v1/incidents/7")[0] == 404 and exp.get("/api/v1/timeline?since=soon")[0] == 400
        status, _, page = exp.get("/")
        assert status == 200 and b'id="timeline"' in page and b"Xid 43" in page
        assert exp.terminate() == 0
    return rec


def test_the_stuck_gpu_then_a_reset_is_recovered_at_the_time_it_came_back(tmp_path: Path) -> None:
    stuck_then_record(tmp_path)
    # the reset: the exporter was paused off the node, the GPU reset, the exporter back: GPU 0 idle now
    with Exporter(
        write_scenario(tmp_path, load_scenario("h200x2")), tmp_path, env=stuck_env(tmp_path), interval=INTERVAL
    ) as exp:
        rec = exp.wait_until(
            lambda: (r := answer(exp, f"/api/v1/incidents/{UUID0}")).get("status") == "recovered" and r,
            timeout=30,
            what="recovered",
        )
        watch = rec["recovery_check"]["watch"]
        assert watch["action"] == "exporter_restart" and watch["signature_cleared"] is True
        assert rec["recovery_check"]["summary"] == f"recovered at {watch['back_at']} (exporter restart; no recurrence)"
        assert rec["signature"]["cause"] == "stuck_context" and rec["signature"]["current"] is False
        states = [e["data"]["state"] for e in timeline(exp, "?gpu=0&kind=recovery")]
        assert states == ["open", "pending", "watching", "recovered"]
        status, _, md = exp.get(f"/api/v1/incidents/{UUID0}?format=markdown")
        assert status == 200 and f"**recovered at {watch['back_at']}".encode() in md
        assert exp.terminate() == 0


def test_the_stuck_signature_back_after_the_restart_is_recurred(tmp_path: Path) -> None:
    stuck_then_record(tmp_path)
    # the "reset" did not cure it: the same GPU is busy with nothing on it again
    with Exporter(
        write_scenario(tmp_path, vs.stuck_gpu()), tmp_path, env=stuck_env(tmp_path), interval=INTERVAL
    ) as exp:
        rec = exp.wait_until(
            lambda: (r := answer(exp, f"/api/v1/incidents/{UUID0}")).get("status") == "recurred" and r,
            timeout=30,
            what="recurred",
        )
        assert rec["recovery_check"]["summary"].startswith("recurred at ")
        assert "busy_and_empty raised again" in rec["recovery_check"]["watch"]["recurred_by"]
        assert exp.terminate() == 0


def test_a_flood_of_xids_keeps_the_timeline_within_its_bounds(tmp_path: Path) -> None:
    """1000 Xids from 1000 processes on GPU 0 (no two alike: nothing coalesces; 1000 is what the kernel-log
    reader keeps of the lines it reads before the first sample names the GPUs)."""
    kmsg = tmp_path / "kern.log"
    kmsg.write_text("".join(vs.kernel_line(1000 + n, 0, 13, 10_000 + n, f"job{n}") for n in range(1000)))
    env = {"NVGPU_FEATURE_KERNEL_XID": "on", "NVGPU_KMSG_PATH": str(kmsg), "NVGPU_LOG_LEVEL": "error"}
    with Exporter(write_scenario(tmp_path, vs.application_xids()), tmp_path, env=env, interval=INTERVAL) as exp:
        doc = exp.wait_until(
            lambda: (
                (d := answer(exp, "/api/v1/timeline?gpu=0"))
                and d["lanes"][0]["evicted"] + d["lanes"][0]["events"] >= 1000
                and d
            ),
            timeout=60,
            what="every Xid on GPU 0's lane, kept or evicted",
        )
        assert len(doc["events"]) == doc["lanes"][0]["events"] <= timelineevents.EVENTS_PER_LANE
        assert sum(e["kind"] == "xid" for e in doc["events"]) < timelineevents.EVENTS_PER_LANE
        assert seqs(doc["events"], "verdict")  # the rare kind survives the flood of its neighbours
        assert exp.terminate() == 0
    size = os.path.getsize(tmp_path / "timeline.json")
    assert size <= timelineevents.FILE_MAX_BYTES
