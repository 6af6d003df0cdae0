"""Container id -> namespace, pod and container, from the kubelet's ``/var/log/containers``.

A process's cgroup names its pod by UID and its container by the runtime's id
(:mod:`exporter.worker.procfs`); the kubelet's PodResources API names pods by namespace and name and has
no UIDs, so the two cannot be joined directly. The kubelet also keeps, for log collectors, one
symlink per container in ``/var/log/containers`` named::

    <pod>_<namespace>_<container>-<container id>.log

(``legacyLogSymlink`` in the kubelet's kuberuntime; names are DNS labels or subdomains, which
cannot contain ``_``, and the id is the runtime's 64-hex id). Listing that directory joins a
container id to its names without the API server. Only the names are read: the symlinks point
into ``/var/log/pods``, which the exporter does not mount, so no log content is reachable.
The directory is injectable (``NVGPU_CONTAINER_LOG_DIR``; its default is the worker config's). Standard
library only, besides that default.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from exporter.common.workerconfig import DEFAULT_CONTAINER_LOG_DIR as DEFAULT_DIR

_LINK = re.compile(r"^([a-z0-9.-]+)_([a-z0-9-]+)_([a-z0-9-]+)-([0-9a-f]{64})\.log$")


@dataclass(frozen=True, order=True)
class ContainerRef:
    """Where a container runs."""

    namespace: str
    pod: str
    container: str


def parse_link_name(name: str) -> tuple[str, ContainerRef] | None:
    """(container id, names) of one ``/var/log/containers`` entry, None for anything else.

    A name the kubelet truncated at 255 characters (very long pod names) no longer ends in the
    id and is not parsed.
    """
    m = _LINK.match(name)
    if m is None:
        return None
    pod, namespace, container, cid = m.groups()
    return cid, ContainerRef(namespace, pod, container)


class ContainerLogIndex:
    """Container id -> :class:`ContainerRef`, listed again when an unknown id is asked for.

    Args:
        directory: the kubelet's container log symlinks (``/var/log/containers``).
        min_relist_s: an unknown id relists the directory at most this often.
        clock: monotonic time source (tests).

    Attributes:
        readable: whether the last listing worked; None before the first.
    """

    def __init__(
        self, directory: str = DEFAULT_DIR, min_relist_s: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.directory = directory
        self.min_relist_s = min_relist_s
        self._clock = clock
        self._index: dict[str, ContainerRef] = {}
        self._listed_at: float | None = None
        self.readable: bool | None = None

    def _relist(self) -> None:
        self._listed_at = self._clock()
        index: dict[str, ContainerRef] = {}
        if not self.directory:  # off
            self.readable, self._index = False, {}
            return
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    parsed = parse_link_name(entry.name)
                    if parsed is not None:
                        index[parsed[0]] = parsed[1]
        except OSError:
            self.readable = False
            self._index = {}
            return
        self.readable = True
        self._index = index  # rebuilt, not accumulated: bounded by the containers on the node

    def lookup(self, container_id: str) -> ContainerRef | None:
        """The names of a container, or None when the directory does not list it."""
        if not container_id:
            return None
        ref = self._index.get(container_id)
        if ref is None and (self._listed_at is None or self._clock() - self._listed_at >= self.min_relist_s):
            self._relist()
            ref = self._index.get(container_id)
        return ref

    def check(self, max_age_s: float = 60.0) -> bool:
        """Whether the directory is readable, listing it again when the last listing is older
        than ``max_age_s`` (or there was none)."""
        if self._listed_at is None or self._clock() - self._listed_at >= max_age_s:
            self._relist()
        return bool(self.readable)

    def __len__(self) -> int:
        return len(self._index)
