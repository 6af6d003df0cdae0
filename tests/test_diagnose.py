"""``nvgpu-exporter diagnose``: one archive, whatever the node's tools do (missing, failing, hanging),
never a secret in it, never a command that changes anything.

The outside commands are fake scripts on PATH: each writes the arguments it was called with to a
file, so the test sees exactly what ``diagnose`` ran.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import psutil
from exporter_proc import Exporter, free_port
from timeline_fixtures import U0, build, gpu, hello, snapshot

from exporter.common.snapshot import NvmlEvent

PASSWORD = "correct horse battery staple"
BCRYPT = "$2b$10$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy"
KEY = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"
# the nvidia-smi forms that only read (README "diagnose"; exporter/supervisor/runbook.py)
SLEEP, CAT = shutil.which("sleep"), shutil.which("cat")  # PATH holds only the fakes: they name these in full
READ_ONLY_FLAGS = {"-q", "-i", "pmon", "-c", "5", "nvlink", "-s", "topo", "-m", "--format=csv"}


def fake_tools(tmp_path: Path, scripts: dict[str, str]) -> Path:
    """A directory of fake commands (and nothing else: every other command is missing)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\necho "$0 $*" >> {tmp_path}/calls.log\n{body}\n')
        path.chmod(0o755)
    return bin_dir


def incident_files(tmp_path: Path) -> Path:
    """A state directory whose timeline holds GPU 0's reset_gpu incident (ECC), as an exporter left it."""
    state = tmp_path / "state"
    state.mkdir()
    sup = build(state)
    sup.handle(hello())
    sup.handle(snapshot(gpu(0), gpu(1)))
    sup.handle(NvmlEvent(time.time(), 0, U0, "xid", 48))
    sup.handle(snapshot(gpu(0, ecc_uncorrected=2), gpu(1)))
    sup.close()
    return state / "state.json"


def diagnose(
    tmp_path: Path, bin_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], dict[str, bytes], float]:
    """Run ``diagnose``; (its process, the archive's files by name below the root, seconds it took)."""
    out = tmp_path / "out.tar.gz"
    full = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    full.update({"PATH": str(bin_dir), "NVGPU_LISTEN_ADDRESS": f"127.0.0.1:{free_port()}", **(env or {})})
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "diagnose", "--output", str(out), *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )
    took = time.monotonic() - start
    files: dict[str, bytes] = {}
    if out.exists():
        with tarfile.open(out) as tar:
            for member in tar.getmembers():
                data = tar.extractfile(member)
                files[member.name.split("/", 1)[1]] = data.read() if data else b""
    return proc, files, took


def items(files: dict[str, bytes]) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in json.loads(files["MANIFEST.json"])["items"]}


def test_every_command_missing_and_the_exporter_down_still_gives_the_records_from_its_files(tmp_path: Path) -> None:
    state_file = incident_files(tmp_path)
    proc, files, _ = diagnose(tmp_path, fake_tools(tmp_path, {}), "--state-file", str(state_file))
    assert proc.returncode == 0, proc.stderr
    found = items(files)
    assert "does not answer" in found["the running exporter"]["detail"]
    for name in (
        "nvidia-smi",
        "nvidia-smi-q",
        "pmon",
        "kernel-log-journalctl",
        "kernel-log-dmesg",
        "nvidia-smi-q-gpu0",
    ):
        assert found[name]["status"] == "skipped" and "not found on PATH" in found[name]["detail"], name
    record = json.loads(files[f"record/gpu-0-{U0}.json"])
    assert record["source"] == "files" and record["signature"]["cause"] == "ecc_uncorrectable"
    assert files[f"record/gpu-0-{U0}.md"].startswith(b"# Incident record: GPU 0")
    assert "exporter/timeline-file.json" in files and "record/node.json" in files
    assert b"| nvidia-smi | skipped | - | nvidia-smi not found on PATH |" in files["MANIFEST.md"]
    assert "not (see MANIFEST.md)" in proc.stdout


def test_failing_commands_are_kept_with_their_status_and_dmesg_stands_in_for_a_journal(tmp_path: Path) -> None:
    bin_dir = fake_tools(
        tmp_path,
        {
            "nvidia-smi": 'echo "Unable to determine the device handle for GPU0000:00:06.0: Unknown Error" >&2; exit 3',
            "journalctl": 'echo "No journal files were found." >&2; exit 1',
            "dmesg": 'echo "[  12.5] NVRM: Xid (PCI:0000:00:06): 48, pid=\'<unknown>\', DBE"; echo "[  13.0] eth0: up"',
        },
    )
    proc, files, _ = diagnose(tmp_path, bin_dir, "--state-file", str(incident_files(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    found = items(files)
    assert found["nvidia-smi"]["status"] == "failed" and found["nvidia-smi"]["exit_code"] == 3
    assert b"Unknown Error" in files["commands/nvidia-smi.txt"]
    assert found["kernel-log-journalctl"]["status"] == "failed"
    dmesg = files["commands/kernel-log-dmesg.txt"]
    assert b"NVRM: Xid" in dmesg and b"eth0" not in dmesg  # the NVIDIA lines only
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert any(line.endswith("nvidia-smi -q -i 00000000:00:06.0") for line in calls)  # the affected GPU, by bus id
    for line in calls:
        tool, *argv = line.split()
        if tool.endswith("nvidia-smi"):
            flags = {a.split("=", 1)[0] if a.startswith("--query") else a for a in argv}
            flags = {f for f in flags if not f.startswith("--query") and f not in ("0", "00000000:00:06.0")}
            assert flags <= READ_ONLY_FLAGS, line


def test_a_hanging_command_that_ignores_sigterm_is_killed_with_its_process_group_and_the_rest_goes_on(
    tmp_path: Path,
) -> None:
    marker = f"299.{os.getpid()}"  # a sleep no other process runs: found again below
    hang = f"trap '' TERM; {SLEEP} {marker} & {SLEEP} {marker}"  # it and its child ignore SIGTERM
    bin_dir = fake_tools(tmp_path, {"nvidia-smi": hang, "journalctl": hang, "dmesg": 'echo "NVRM: loaded"'})
    proc, files, took = diagnose(
        tmp_path, bin_dir, "--state-file", str(incident_files(tmp_path)), "--budget", "30", "--command-timeout", "2"
    )
    assert proc.returncode == 0, proc.stderr
    assert took < 30 + 10, took  # the budget, and the time to stop the last command, not 300 s
    found = items(files)
    assert found["kernel-log-journalctl"]["status"] == "timed_out"
    assert "SIGKILL" in found["kernel-log-journalctl"]["detail"]
    assert found["kernel-log-dmesg"]["status"] == "collected"  # the journal hung: dmesg has the lines
    timed_out = [n for n, i in found.items() if i["status"] == "timed_out"]
    assert timed_out == ["kernel-log-journalctl", "nvidia-smi-q-gpu0"]  # no further nvidia-smi once one hung
    assert "did not answer in its time" in found["nvidia-smi"]["detail"]
    leftover = [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
    assert leftover == [], "a hung command or its child was left running"


def test_the_archive_holds_no_password_hash_or_key_from_the_web_config_or_the_logs(tmp_path: Path) -> None:
    key = tmp_path / "server.key"
    key.write_text(KEY)
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{BCRYPT}'\ntls_server_config:\n  key_file: {key}\n")
    log = tmp_path / "exporter.log"
    log.write_text(
        "level=info msg=started\n"
        f"Authorization: Basic cHJvbWV0aGV1czp7UEFTU1dPUkR9\npassword={PASSWORD}\nhash {BCRYPT}\n{KEY}"
        "level=info msg=serving\n"
    )
    bin_dir = fake_tools(tmp_path, {"nvidia-smi": f"echo 'GPU 0: H200'; {CAT} {key}"})
    proc, files, _ = diagnose(
        tmp_path,
        bin_dir,
        "--state-file",
        str(incident_files(tmp_path)),
        "--log-file",
        str(log),
        env={"NVGPU_WEB_CONFIG_FILE": str(web)},
    )
    assert proc.returncode == 0, proc.stderr
    assert b"GPU 0: H200" in files["commands/nvidia-smi.txt"] and b"[REDACTED]" in files["commands/nvidia-smi.txt"]
    everything = b"\n".join(files.values())
    for secret in (PASSWORD, BCRYPT, "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC", "cHJvbWV0aGV1czp7UEFTU1dPUkR9"):
        assert secret.encode() not in everything, secret
    logs = files["logs/0-exporter.log"]
    assert b"msg=started" in logs and b"msg=serving" in logs and b"[REDACTED]" in logs
    assert items(files)["log " + str(log)]["redacted"] >= 4
    assert not any("web" in name for name in files), "the web config file is never collected"


def test_against_the_running_exporter_the_records_come_from_its_api(tmp_path: Path) -> None:
    from exporter_proc import SCENARIOS

    with Exporter(SCENARIOS / "h200x2.json", tmp_path, interval=0.5) as exp:
        exp.wait_samples(2)
        proc, files, _ = diagnose(
            tmp_path,
            fake_tools(tmp_path, {"nvidia-smi": "echo ok"}),
            "--url",
            exp.base,
            "--state-file",
            str(tmp_path / "state.json"),
        )
        assert proc.returncode == 0, proc.stderr
        record = json.loads(files[f"record/gpu-0-{U0}.json"])
        assert record["source"] == "live" and record["affected"]["gpu"]["pci_bus_id"] == "00000000:00:06.0"
        assert json.loads(files["exporter/timeline.json"])["events"]
        assert b"nvgpu_device_up" in files["exporter/metrics.txt"] and files["exporter/readyz.txt"] == b"ok\n"
        assert "NVGPU_RECURRENCE_WINDOW_SECONDS=3600.0" in files["exporter/settings.txt"].decode()
        assert exp.terminate() == 0
