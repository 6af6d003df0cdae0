"""Test helpers: a fake ``/proc`` tree and a fake kubelet ``/var/log/containers`` directory.

The exporter reads both through injectable roots (``NVGPU_PROC_PATH``,
``NVGPU_CONTAINER_LOG_DIR``); these helpers write what a node with ``hostPID`` shows: per pid a
``comm`` and a ``cgroup`` file, ``sys/kernel/pid_max``, ``self/ns/pid`` (a symlink whose target
names the PID namespace), and one symlink per container named as the kubelet names them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HOST_PID_NS = "pid:[4026531836]"
CONTAINER_PID_NS = "pid:[4026532412]"


def container_id(name: str) -> str:
    """A stable 64-hex container id for a test container name."""
    return hashlib.sha256(name.encode()).hexdigest()


def pod_uid(name: str) -> str:
    """A stable UUID-shaped pod UID for a test pod name."""
    h = hashlib.sha256(("pod " + name).encode()).hexdigest()
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def cgroup_v2_systemd(uid: str, cid: str, qos: str = "burstable") -> str:
    """cgroup v2 with the systemd driver and containerd, as on most current nodes."""
    slice_uid = uid.replace("-", "_")
    return f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slice_uid}.slice/cri-containerd-{cid}.scope\n"


def cgroup_v1_cgroupfs(uid: str, cid: str, qos: str = "besteffort") -> str:
    """cgroup v1 with the cgroupfs driver: one line per hierarchy."""
    path = f"/kubepods/{qos}/pod{uid}/{cid}"
    return "".join(f"{n}:{c}:{path}\n" for n, c in ((12, "memory"), (11, "cpu,cpuacct"), (1, "name=systemd")))


@dataclass(frozen=True)
class Container:
    namespace: str
    pod: str
    container: str

    @property
    def uid(self) -> str:
        return pod_uid(f"{self.namespace}/{self.pod}")

    @property
    def id(self) -> str:
        return container_id(f"{self.namespace}/{self.pod}/{self.container}")


def make_proc(
    root: Path,
    processes: Mapping[int, tuple[str, Container | str | None]],
    *,
    pid_max: int | None = 4194304,
    pid_namespace: str | None = HOST_PID_NS,
    own: Container | None = None,
) -> Path:
    """Write a fake /proc: ``processes`` maps pid -> (comm, container, raw cgroup text or None);
    ``own`` is the container the reader itself runs in (``self/cgroup``)."""
    root.mkdir(parents=True, exist_ok=True)
    if own is not None:
        (root / "self").mkdir(parents=True, exist_ok=True)
        (root / "self" / "cgroup").write_text(cgroup_v2_systemd(own.uid, own.id))
    if pid_max is not None:
        (root / "sys" / "kernel").mkdir(parents=True, exist_ok=True)
        (root / "sys" / "kernel" / "pid_max").write_text(f"{pid_max}\n")
    if pid_namespace is not None:
        (root / "self" / "ns").mkdir(parents=True, exist_ok=True)
        link = root / "self" / "ns" / "pid"
        if link.is_symlink():
            link.unlink()
        os.symlink(pid_namespace, link)
    for pid, (comm, where) in processes.items():
        d = root / str(pid)
        d.mkdir(exist_ok=True)
        (d / "comm").write_text(comm + "\n")
        if isinstance(where, Container):
            text = cgroup_v2_systemd(where.uid, where.id)
        elif where is None:
            text = "0::/system.slice/some-daemon.service\n"
        else:
            text = where
        (d / "cgroup").write_text(text)
    return root


def make_container_logs(directory: Path, containers: list[Container]) -> Path:
    """Write the kubelet's /var/log/containers symlinks (targets in /var/log/pods, not present)."""
    directory.mkdir(parents=True, exist_ok=True)
    for c in containers:
        name = f"{c.pod}_{c.namespace}_{c.container}-{c.id}.log"
        target = f"/var/log/pods/{c.namespace}_{c.pod}_{c.uid}/{c.container}/0.log"
        if not (directory / name).is_symlink():
            os.symlink(target, directory / name)
    return directory
