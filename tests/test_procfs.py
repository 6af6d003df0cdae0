"""exporter.worker.procfs and exporter.worker.containerlogs on fake trees: cgroup formats, names, pid_max,
the PID namespace check, the kubelet's container log names."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from fakeproc import (
    CONTAINER_PID_NS,
    Container,
    cgroup_v1_cgroupfs,
    cgroup_v2_systemd,
    make_container_logs,
    make_proc,
)
from waiting import wait_until

from exporter.worker.containerlogs import ContainerLogIndex, ContainerRef, parse_link_name
from exporter.worker.procfs import PodCgroup, ProcFs, clean_name, parse_cgroup

TRAINER = Container("ml", "trainer-0", "main")
UID = "7c1d0f3a-4e2b-4a7e-9c1d-0123456789ab"
CID = "a" * 64


@pytest.mark.parametrize(
    "text",
    [
        cgroup_v2_systemd(UID, CID),
        cgroup_v2_systemd(UID, CID, qos="besteffort"),
        cgroup_v1_cgroupfs(UID, CID),
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n",  # guaranteed, CRI-O
        f"0::/../../kubepods-besteffort-pod{UID.replace('-', '_')}.slice/docker-{CID}.scope\n",  # cgroup namespace
        f"0::/kubepods/burstable/pod{UID}/{CID}\n",  # k3s, cgroupfs on v2
    ],
)
def test_cgroup_formats_name_pod_and_container(text: str) -> None:
    assert parse_cgroup(text) == PodCgroup(UID, CID)


def test_static_pod_hash_and_pod_level_cgroup() -> None:
    static = "d41d8cd98f00b204e9800998ecf8427e"
    assert parse_cgroup(f"0::/kubepods.slice/kubepods-besteffort-pod{static}.slice\n") == PodCgroup(static, "")


@pytest.mark.parametrize(
    "text",
    ["0::/system.slice/containerd.service\n", "0::/user.slice/user-1000.slice/session-3.scope\n", "", "garbage"],
)
def test_processes_outside_pods_have_no_pod(text: str) -> None:
    assert parse_cgroup(text) is None


def test_procfs_reads_names_pods_pid_max_and_namespace(tmp_path: Path) -> None:
    root = make_proc(tmp_path / "proc", {42: ("python3", TRAINER), 43: ("Xorg", None)}, pid_max=32768)
    proc = ProcFs(str(root))
    assert proc.pid_max() == 32768
    assert proc.name(42) == "python3" and proc.exists(42) and not proc.exists(44)
    assert proc.pod(42) == PodCgroup(TRAINER.uid, TRAINER.id)
    assert proc.pod(43) is None and proc.pod(44) is None and proc.name(44) is None
    assert proc.host_pid_namespace() is True
    other = make_proc(tmp_path / "other", {}, pid_max=None, pid_namespace=CONTAINER_PID_NS)
    assert ProcFs(str(other)).host_pid_namespace() is False and ProcFs(str(other)).pid_max() is None
    assert ProcFs(str(tmp_path / "missing")).host_pid_namespace() is None
    assert proc.own_pod() is None  # not in a pod
    inside = make_proc(tmp_path / "inside", {}, own=TRAINER)
    assert ProcFs(str(inside)).own_pod() == PodCgroup(TRAINER.uid, TRAINER.id)


def test_an_empty_root_reads_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVGPU_PROC_PATH / NVGPU_CONTAINER_LOG_DIR empty: off, not "relative to the working directory"."""
    make_proc(tmp_path, {42: ("python3", TRAINER)})
    make_container_logs(tmp_path, [TRAINER])
    monkeypatch.chdir(tmp_path)
    off = ProcFs("")
    assert (off.pid_max(), off.name(42), off.pod(42), off.own_pod(), off.host_pid_namespace()) == (None,) * 5
    assert not off.exists(42)
    logs = ContainerLogIndex("")
    assert logs.lookup(TRAINER.id) is None and not logs.check()


def test_odd_pid_max_is_unknown(tmp_path: Path) -> None:
    for text in ("", "-1", "lots", "0"):
        root = make_proc(tmp_path / f"p{text}", {}, pid_max=None)
        (root / "sys" / "kernel").mkdir(parents=True, exist_ok=True)
        (root / "sys" / "kernel" / "pid_max").write_text(text)
        assert ProcFs(str(root)).pid_max() is None, text


def test_process_names_are_cleaned_for_labels() -> None:
    assert clean_name("python3\n") == "python3"
    assert clean_name("bad\x1bname\x00") == "bad?name?"
    assert len(clean_name("x" * 500)) == 64


def test_container_log_names() -> None:
    cid = "b" * 64
    assert parse_link_name(f"trainer-0_ml_main-{cid}.log") == (cid, ContainerRef("ml", "trainer-0", "main"))
    assert parse_link_name(f"web.v2-abc_prod-ns_side-car-{cid}.log") == (
        cid,
        ContainerRef("prod-ns", "web.v2-abc", "side-car"),
    )
    for bad in (f"trainer-0_ml_main-{cid[:60]}.log", "README", f"a_b-{cid}.log", f"a_b_c_d-{cid}.log"):
        assert parse_link_name(bad) is None, bad


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_container_log_index_relists_for_unknown_ids_at_most_every_interval(tmp_path: Path) -> None:
    d = make_container_logs(tmp_path / "containers", [TRAINER])
    clock = Clock()
    index = ContainerLogIndex(str(d), min_relist_s=5.0, clock=clock)
    assert index.lookup(TRAINER.id) == ContainerRef("ml", "trainer-0", "main") and index.readable
    late = Container("ml", "late-1", "main")
    make_container_logs(d, [late])
    assert index.lookup(late.id) is None  # listed just now: not again within 5 s
    clock.t = 5.0
    assert index.lookup(late.id) == ContainerRef("ml", "late-1", "main")
    (d / next(p.name for p in d.iterdir() if "trainer-0" in p.name)).unlink()
    clock.t = 10.0
    assert index.lookup("c" * 64) is None and index.lookup(TRAINER.id) is None  # rebuilt, not accumulated
    assert len(index) == 1


def test_container_log_index_without_the_directory(tmp_path: Path) -> None:
    index = ContainerLogIndex(str(tmp_path / "nope"))
    assert index.lookup(TRAINER.id) is None and index.readable is False and not index.check()
    assert index.lookup("") is None


# -- a /proc read that blocks costs that process's attribution, never the GPU's sample -------------


def test_a_fifo_in_the_tree_is_refused_without_blocking(tmp_path: Path) -> None:
    root = make_proc(tmp_path / "proc", {42: ("python3", TRAINER)}, pid_max=32768)
    (root / "42" / "comm").unlink()
    os.mkfifo(root / "42" / "comm")
    assert ProcFs(str(root)).name(42) is None and ProcFs(str(root)).pod(42) == PodCgroup(TRAINER.uid, TRAINER.id)


def test_a_read_that_blocks_costs_only_that_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pid 43's cgroup read never answers (a kernel lock, a hung mount): resolve() returns within
    its budget with what it read before; in the next samples pid 43 is skipped (unattributed)
    and every other pid is attributed; once the read answers, pid 43 is read again."""
    from exporter.worker.process_attribution import HostView

    others = {pid: ("python3", Container("ml", f"trainer-{pid}", "main")) for pid in (42, 44, 45)}
    root = make_proc(tmp_path / "proc", {**others, 43: ("python3", TRAINER)}, pid_max=32768)
    host = HostView(str(root), "", budget_s=0.2)
    release = threading.Event()
    real = host.proc.pod

    def pod(pid: int) -> PodCgroup | None:
        if pid == 43 and not release.is_set():
            release.wait()  # what a read of /proc/43/cgroup does when the kernel waits
        return real(pid)

    monkeypatch.setattr(host.proc, "pod", pod)
    _own, first = host.resolve([42, 43, 44, 45], names=True)
    assert set(first) == {42} and host.stuck_pids == {43} and host.timeouts == 1
    for _ in range(3):  # later samples: 43 skipped, the others attributed, no new thread stuck
        _own, later = host.resolve([42, 43, 44, 45], names=True)
        assert set(later) == {42, 44, 45} and later[44].name == "python3"
        assert later[44].cgroup == PodCgroup(others[44][1].uid, others[44][1].id)
    assert host.io.stuck == 1 and host.timeouts == 1
    release.set()
    wait_until(lambda: host.io.stuck == 0 and not host.stuck_pids, 5, "the stuck read to answer")
    _own, again = host.resolve([42, 43, 44, 45], names=True)
    assert set(again) == {42, 43, 44, 45}
