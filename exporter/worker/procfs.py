"""Reading ``/proc`` for GPU processes: pid_max, names, and the cgroup that names their pod.

NVML reports process ids. What a pid belongs to is in ``/proc``: ``/proc/<pid>/comm`` is the
process name and ``/proc/<pid>/cgroup`` its cgroup path, which for a Kubernetes container holds
the pod UID and the container id the runtime gave it::

    0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7c1d…_4e2b….slice/cri-containerd-<64 hex>.scope
    11:memory:/kubepods/besteffort/pod7c1d…-4e2b…/<64 hex>                      (cgroupfs driver)
    0::/../../kubepods-besteffort-pod7c1d….slice/crio-<64 hex>.scope             (reader in a cgroup namespace)

Both files are world-readable, but only for processes in the reader's PID namespace: a container
without ``hostPID: true`` does not see the workloads' processes, and current drivers translate
NVML's pids into the caller's namespace and skip the processes it cannot see (open-gpu-kernel-modules:
``gpuGetProcWithObject_IMPL`` -> ``_gpuConvertPid``; NVIDIA/nvidia-docker#1483 for older drivers).
:meth:`ProcFs.host_pid_namespace` tells whether this process runs in the host's PID namespace.

The root is injectable (``NVGPU_PROC_PATH``; its default is the worker config's) so tests run on a
fake ``/proc`` tree. Standard library only, besides that default; every read is a small file
opened without blocking (:mod:`exporter.common.fileio`), failures answer None; how long the reads
may take is bounded by the caller (:class:`exporter.worker.process_attribution.HostView`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from exporter.common import fileio
from exporter.common.workerconfig import DEFAULT_PROC_PATH as DEFAULT_ROOT

# The initial (host) PID namespace's inode, PROC_PID_INIT_INO in include/linux/proc_ns.h (3.8+).
HOST_PID_NAMESPACE = "pid:[4026531836]"
_NAME_MAX = 64
_READ_MAX = 65536  # a cgroup file of a deep hierarchy is a few KiB; comm is 16 bytes

# Pod UIDs are UUIDs (dashes, or underscores in systemd slice names); static pods use the
# 32-hex config hash.
_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})(?:\.slice)?(?:/|$)"
)
# The container: the runtime's 64-hex id as the last path element, with or without a scope prefix.
_CONTAINER = re.compile(r"/(?:[a-z0-9]+-)*([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class PodCgroup:
    """The Kubernetes identity in one process's cgroup path.

    Attributes:
        pod_uid: the pod's UID with dashes (``7c1d…-4e2b-…``), or a static pod's 32-hex hash.
        container_id: the container runtime's 64-hex id; empty when the path does not end in one.
    """

    pod_uid: str
    container_id: str


def parse_cgroup(text: str) -> PodCgroup | None:
    """The pod and container of a ``/proc/<pid>/cgroup`` file, None outside Kubernetes pods.

    Every line (``hierarchy:controllers:path``; cgroup v2 has one ``0::`` line) is searched; the
    first that names a pod wins.
    """
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        m = _POD_UID.search(path)
        if m is None:
            continue
        c = _CONTAINER.search(path)
        return PodCgroup(m.group(1).replace("_", "-"), c.group(1) if c else "")
    return None


def clean_name(raw: str) -> str:
    """A process name fit for a label value: printable, at most 64 characters."""
    text = "".join(ch if ch.isprintable() else "?" for ch in raw.strip())
    return text[:_NAME_MAX]


class ProcFs:
    """Reads below a ``/proc`` root.

    Args:
        root: the proc file system (``/proc``, or a fake tree in tests); empty: nothing is read.
    """

    def __init__(self, root: str = DEFAULT_ROOT) -> None:
        self.root = root

    def _read(self, *parts: str) -> str | None:
        if not self.root:  # resolving processes is off
            return None
        try:  # without blocking on a FIFO planted in a fake tree; the caller bounds the time
            return fileio.read_bytes(os.path.join(self.root, *parts), _READ_MAX).decode("utf-8", "replace")
        except (fileio.FileRefused, ValueError):
            return None

    def pid_max(self) -> int | None:
        """``/proc/sys/kernel/pid_max``: pids are below it. None when unreadable or odd."""
        text = self._read("sys", "kernel", "pid_max")
        if text is None or not text.strip().isdigit():
            return None
        value = int(text.strip())
        return value if value > 0 else None

    def exists(self, pid: int) -> bool:
        """Whether ``/proc/<pid>`` exists in this PID namespace."""
        return bool(self.root) and os.path.isdir(os.path.join(self.root, str(pid)))

    def name(self, pid: int) -> str | None:
        """``/proc/<pid>/comm`` (at most 15 characters in the kernel), cleaned for a label."""
        text = self._read(str(pid), "comm")
        if text is None:
            return None
        name = clean_name(text)
        return name or None

    def pod(self, pid: int) -> PodCgroup | None:
        """The pod of ``pid`` from ``/proc/<pid>/cgroup``; None when unreadable or not in a pod."""
        text = self._read(str(pid), "cgroup")
        return None if text is None else parse_cgroup(text)

    def own_pod(self) -> PodCgroup | None:
        """The pod this process runs in (``/proc/self/cgroup``), None outside Kubernetes pods.

        The exporter holds no GPU context (NVML only), so a GPU process that resolves to its own
        pod is a PID from another namespace that happens to exist in this one (an old driver
        reporting host PIDs to a container without hostPID): never attribute it.
        """
        text = self._read("self", "cgroup")
        return None if text is None else parse_cgroup(text)

    def host_pid_namespace(self) -> bool | None:
        """True in the host's PID namespace (``hostPID: true``), False in a container's own,
        None when ``/proc/self/ns/pid`` cannot be read."""
        if not self.root:
            return None
        try:
            return os.readlink(os.path.join(self.root, "self", "ns", "pid")) == HOST_PID_NAMESPACE
        except OSError:
            return None
