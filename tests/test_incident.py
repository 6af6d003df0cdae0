"""The incident record: the runbook's fields, filled from the timeline and the state now, live or from files."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from timeline_fixtures import ROOT, U0, build, gpu, hello, snapshot

from exporter.common.nativelib import NativeLibrary
from exporter.common.snapshot import GpuSample, Hello, NvmlEvent
from exporter.supervisor import incident, runbook
from exporter.supervisor.incidentmd import markdown
from exporter.supervisor.recovery import RecoveryTracker
from exporter.supervisor.supervisor import Supervisor
from exporter.supervisor.timeline import Timeline

# The runbook's record fields (docs/runbook.md, "What every incident record holds") -> the record's key.
FIELDS = {
    "signature": "signature",
    "first seen": "first_seen",
    "affected": "affected",
    "versions": "versions",
    "reproduction": "reproduction",
    "diagnostic commands": "diagnostic_commands",
    "mitigation": "temporary_handling",
    "recovery check": "recovery_check",
    "conclusion": "conclusion",
    "recurrence threshold": "recurrence_threshold",
}
HEADINGS = [
    "Signature",
    "First seen",
    "Affected",
    "Versions",
    "Reproduction",
    "Evidence, in the atlas's order",
    "Diagnostic commands",
    "Temporary handling",
    "Recovery check",
    "Repair conclusion",
    "Recurrence threshold",
    "Timeline",
]


def ecc_incident(tmp_path: Path, ready: Hello | None = None) -> Supervisor:
    """GPU 0 ok, then Xid 48 (a double-bit ECC error) and uncorrectable ECC counts: reset_gpu."""
    sup = build(tmp_path)
    sup.handle(ready or hello())
    sup.handle(snapshot(gpu(0), gpu(1)))
    sup.handle(NvmlEvent(time.time(), 0, U0, "xid", 48))
    sup.handle(snapshot(gpu(0, ecc_uncorrected=2), gpu(1)))
    return sup


def live_record(sup: Supervisor, target: str) -> dict[str, object]:
    rec = sup.state.recorder
    return incident.record(incident.now_of(sup.state), rec.timeline, rec.recovery, target, 3600.0)


def test_every_field_of_the_runbooks_record_is_in_the_record() -> None:
    text = (ROOT / "docs" / "runbook.md").read_text()
    section = text.split("### What every incident record holds", 1)[1].split("\n## ", 1)[0]
    fields = re.findall(r"^\| ([a-z][a-z ]+) \|", section, re.MULTILINE)
    assert set(fields) - {"field"} == set(FIELDS), "docs/runbook.md's record fields changed: map them in FIELDS"


def test_the_gpu_record_fills_the_runbooks_fields_from_the_timeline_and_the_state_now(tmp_path: Path) -> None:
    sup = ecc_incident(tmp_path)
    rec = live_record(sup, "0")
    for key in FIELDS.values():
        assert rec[key], key
    sig = rec["signature"]
    assert (sig["verdict"], sig["domain"], sig["cause"]) == ("reset_gpu", "gpu", "ecc_uncorrectable")  # type: ignore[index]
    first = rec["timeline"][0]  # type: ignore[index]
    assert first["kind"] == "xid" and first["data"]["xid"] == 48 and rec["first_seen"] == first["time"]
    assert rec["affected"]["gpu"] == {  # type: ignore[index]
        "index": "0",
        "uuid": U0,
        "pci_bus_id": "00000000:00:06.0",
        "serial": "165452401230",
        "name": "NVIDIA H200",
    }
    versions = rec["versions"]
    assert versions["driver"] == "580.159.04" and versions["kernel_module"] == "580.159.04"  # type: ignore[index]
    assert versions["vbios"] == "96.00.A5.00.1A" and versions["inforom"] == "G520.0282.02.02"  # type: ignore[index]
    assert {"nvml_library_path", "nvml_library_version", "nvidia_ml_py", "exporter"} <= set(versions)  # type: ignore[arg-type]
    shells = [c["shell"] for c in rec["diagnostic_commands"]]  # type: ignore[attr-defined]
    assert "nvidia-smi -q -i 00000000:00:06.0" in shells
    assert "nvidia-smi pmon -c 5 -i 00000000:00:06.0" in shells
    assert any(
        s.startswith("nvidia-smi --query-gpu=index,uuid,pci.bus_id") and s.endswith("-i 00000000:00:06.0")
        for s in shells
    )
    assert not any(s.endswith("-i 0") for s in shells)  # the container's index may name another GPU on the host
    assert any(s.startswith("journalctl -k -b 0") and "nvrm|xid" in s for s in shells)
    assert [s["name"] for s in rec["evidence"]] == list(runbook.STEPS)  # type: ignore[attr-defined]
    assert "00000000:00:06.0" in rec["temporary_handling"]  # type: ignore[operator]
    assert rec["status"] == "open" and "no reset, reboot or driver reload" in rec["recovery_check"]["summary"]  # type: ignore[index]
    sup.close()


def test_the_markdown_record_is_the_json_record_in_the_runbooks_order(tmp_path: Path) -> None:
    sup = ecc_incident(tmp_path)
    text = markdown(live_record(sup, "00000000:00:06.0"))  # the GPU named by its bus id
    found = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert found == HEADINGS
    assert "Verdict **reset_gpu**, domain **gpu**, cause `ecc_uncorrectable`" in text
    assert "nvidia-smi -q -i 00000000:00:06.0" in text and "| xid |" in text
    sup.close()


def test_the_record_from_the_files_alone_says_the_same_when_the_exporter_is_down(tmp_path: Path) -> None:
    lib = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.159.04"
    native = NativeLibrary(lib, lib, False, "580.159.04", "13.580.159.04", "580.159.04", "host", state="ok")
    sup = ecc_incident(tmp_path, hello(native=native))
    live = live_record(sup, U0)
    sup.close()
    timeline = Timeline(str(tmp_path / "timeline.json"))
    offline = incident.record(incident.now_from_files(timeline), timeline, RecoveryTracker(timeline), U0, 3600.0)
    assert offline["source"] == "files" and live["source"] == "live"
    for key in ("first_seen", "first_seen_timestamp_seconds", "diagnostic_commands", "status"):
        assert offline[key] == live[key], key
    for key in ("verdict", "domain", "cause", "action"):
        assert offline["signature"][key] == live["signature"][key], key  # type: ignore[index]
    assert offline["affected"]["gpu"] == live["affected"]["gpu"]  # type: ignore[index]
    assert offline["versions"]["driver"] == "580.159.04" and offline["versions"]["vbios"] == "96.00.A5.00.1A"  # type: ignore[index]
    assert offline["versions"] == live["versions"]
    assert (offline["versions"]["nvml_library_path"], offline["versions"]["nvml_library_origin"]) == (lib, "host")  # type: ignore[index]


def test_the_node_record_names_the_gpus_that_are_not_ok_and_the_nodes_events(tmp_path: Path) -> None:
    sup = ecc_incident(tmp_path)
    rec = live_record(sup, "node")
    assert rec["record_of"] == "node" and rec["signature"]["cause"] == "ecc_uncorrectable"  # type: ignore[index]
    gpus = {g["index"]: g["verdict"] for g in rec["affected"]["gpus"]}  # type: ignore[index]
    assert gpus == {"0": "reset_gpu", "1": "ok"}
    assert [e["kind"] for e in rec["timeline"]][:2] == ["exporter_start", "boot"]  # type: ignore[index]
    assert any(c["name"] == "topology" for c in rec["diagnostic_commands"])  # type: ignore[attr-defined]
    sup.close()


def test_a_gpu_the_pod_may_not_open_is_in_the_node_record_by_its_index(tmp_path: Path) -> None:
    """The device-cgroup case: NVML counts GPU 1 but its handle lookup answers NO_PERMISSION, so it has
    no UUID and no lane; the node's record still names it, with the exporter's fault."""
    sup = build(tmp_path)
    sup.handle(hello())
    hidden = GpuSample(
        1, "", "lost", {}, time.time(), "nvmlDeviceGetHandleByIndex: NO_PERMISSION", error="NO_PERMISSION"
    )
    sup.handle(snapshot(gpu(0), hidden))
    rec = live_record(sup, "node")
    gpus = {g["index"]: (g["uuid"], g["state"], g["verdict"]) for g in rec["affected"]["gpus"]}  # type: ignore[index]
    assert gpus == {"0": (U0, "up", "ok"), "1": ("", "denied", "fix_exporter")}
    assert rec["status"] == "open" and rec["signature"]["cause"] == "device_access_denied"  # type: ignore[index]
    one = live_record(sup, "1")
    assert one["signature"]["verdict"] == "fix_exporter" and one["affected"]["gpu"]["uuid"] == ""  # type: ignore[index]
    sup.close()


def test_the_commands_select_the_gpu_by_its_pci_bus_id_not_the_containers_index() -> None:
    """Index 0 inside a container under NVIDIA_VISIBLE_DEVICES=3 is GPU 3 on the host: every command
    that picks one GPU names it by bus id; the index stays a label."""
    bus = "00000000:9A:00.0"
    cmds = runbook.gpu_commands("0", bus)
    selecting = [c["argv"] for c in cmds if "-i" in c["argv"]]
    assert {c["name"] for c in cmds if "-i" in c["argv"]} == {"nvidia-smi-q", "query-gpu", "pmon"}
    assert all(argv[argv.index("-i") + 1] == bus for argv in selecting)
    assert all("GPU 0" in c["why"] for c in cmds if "-i" in c["argv"])
    steps = runbook.step_commands("0", bus, "node-a", [])
    assert f"nvidia-smi nvlink -s -i {bus}" in steps[5] and f"nvidia-smi -q -i {bus}" in steps[4]
    recovery = runbook.recovery_steps("0", bus)
    assert any(line.startswith(f"nvidia-smi pmon -c 5 -i {bus}:") for line in recovery)
    assert not any(re.search(r" -i 0(?![0-9A-F])", line) for line in [*recovery, *steps[4], *steps[5]])


def test_a_target_that_is_no_gpu_is_a_key_error(tmp_path: Path) -> None:
    sup = ecc_incident(tmp_path)
    with pytest.raises(KeyError):
        live_record(sup, "GPU-nothing")
    sup.close()


READ_ONLY = [
    r"nvidia-smi",
    r"nvidia-smi -q( -i \S+)?",
    r"nvidia-smi --query-(gpu|remapped-rows|compute-apps)=[a-z0-9_.,]+ --format=csv( -i \S+)?",
    r"nvidia-smi pmon -c 5( -i \S+)?",
    r"nvidia-smi nvlink -s",
    r"nvidia-smi topo -m",
    r"journalctl -k -b 0 --no-pager -o short-iso",
    r"dmesg -T",
]


def test_every_command_a_record_names_only_reads() -> None:
    """What diagnose runs: nvidia-smi's queries, pmon, nvlink -s, topo -m, the kernel log; never -r."""
    for cmd in [*runbook.node_commands("b"), *runbook.gpu_commands("3", "00000000:1B:00.0", "b")]:
        line = " ".join(cmd["argv"])
        assert any(re.fullmatch(p, line) for p in READ_ONLY), line
