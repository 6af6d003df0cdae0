"""Run the real exporter with one fault injected into the supervisor's own work (tests only).

``python tests/faultinject.py FAULT [exporter arguments]`` patches one component of the supervisor
process, then runs ``exporter.cli.main`` exactly as ``python -m exporter`` does: the HTTP server,
the supervisor loop and real worker subprocesses (which are not patched). Each fault stands for a
class of bug or environment failure that the component must contain:

- ``dispatch``: applying every second snapshot raises (a bug in the supervisor's message handling);
- ``decode``: decoding every third message raises RecursionError (what a deeply nested line does);
- ``state``: every state-file save raises RuntimeError (not an OSError: a bug in the writer);
- ``kernel_log``: the kernel-log reader's first poll raises RuntimeError (not KernelLogUnavailable);
- ``pods``: the kubelet client's first List raises RuntimeError, later ones answer;
- ``render``: temperature's ``families()`` raises for GPU 1, the stuck detector's for every GPU, and
  the kubelet names a pod with a lone surrogate (a value no UTF-8 encoder takes);
- ``long_stderr``: workers are started through ``$FAULT_WORKER_PYTHON``, a wrapper that writes a
  70 KB line to the worker's stderr before it execs Python;
- ``worker_python``: workers are started through ``$FAULT_WORKER_PYTHON``, whatever that wrapper does
  (tests/test_feature_authority.py: it points the worker's known-issue rules at a test table);
- ``fd_hog``: SIGUSR1 takes every free file descriptor (RLIMIT_NOFILE lowered to 256 first),
  SIGUSR2 gives them back, so a worker respawn meets EMFILE for real.
- ``hung_mount``: ``open``, ``stat`` and ``lstat`` of any path under ``$FAULT_HUNG_DIR`` block (the
  calling thread sleeps, as in a hung NFS mount) while the file ``$FAULT_HUNG_FLAG`` exists;
- ``slow_bcrypt``: a bcrypt check of the password ``slow`` takes an hour (sleeping, the GIL released,
  as bcrypt does; it creates ``$FAULT_BCRYPT_STARTED`` first), any other is checked for real.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import types
from typing import Any


def _dispatch() -> None:
    from exporter.common.snapshot import Snapshot
    from exporter.supervisor.supervisor import Supervisor

    real = Supervisor._dispatch
    seen = [0]

    def dispatch(self: Supervisor, msg: Any) -> None:
        if isinstance(msg, Snapshot):
            seen[0] += 1
            if seen[0] % 2 == 0:
                raise RuntimeError("injected: applying a snapshot failed")
        real(self, msg)

    Supervisor._dispatch = dispatch  # type: ignore[method-assign]


def _decode() -> None:
    from exporter.common.snapshotdecode import SnapshotDecoder

    real = SnapshotDecoder.decode_message
    seen = [0]

    def decode(self: SnapshotDecoder, msg: dict[str, Any]) -> Any:
        seen[0] += 1
        if msg.get("type") == "snapshot" and seen[0] % 3 == 0:
            raise RecursionError("injected: maximum recursion depth exceeded while decoding")
        return real(self, msg)

    SnapshotDecoder.decode_message = decode  # type: ignore[method-assign]


def _state() -> None:
    from exporter.supervisor import quarantine

    def dump(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("injected: the state writer failed")

    quarantine.json = types.SimpleNamespace(dump=dump, loads=json.loads)  # type: ignore[assignment]


def _kernel_log() -> None:
    from exporter.supervisor.xid.reader import KmsgReader

    real = KmsgReader.poll
    seen = [0]

    def poll(self: KmsgReader, **kwargs: Any) -> Any:
        seen[0] += 1
        if seen[0] == 1:
            raise RuntimeError("injected: the kernel-log reader failed")
        return real(self, **kwargs)

    KmsgReader.poll = poll  # type: ignore[method-assign]


def _no_kubelet_needed() -> None:
    """The pod extension waits for the kubelet's socket before it loads gRPC: there is no
    kubelet here, and the client's List is replaced anyway."""
    import exporter.supervisor.podresources as podresources

    podresources.check_socket = lambda path: None  # type: ignore[assignment]


def _pods() -> None:
    from exporter.supervisor.podresources import Assignments, PodRef, PodResourcesClient

    seen = [0]
    uuid = os.environ["FAULT_POD_UUID"]

    def list_assignments(self: PodResourcesClient, dra_uuids: Any = None) -> Assignments:
        seen[0] += 1
        if seen[0] == 1:
            raise RuntimeError("injected: the kubelet client failed")
        return Assignments({uuid: (PodRef("ml", "train-0", "trainer"),)})

    _no_kubelet_needed()
    PodResourcesClient.list_assignments = list_assignments  # type: ignore[method-assign]


def _render() -> None:
    from exporter.common.collectors import temperature
    from exporter.supervisor.podresources import Assignments, PodRef, PodResourcesClient
    from exporter.supervisor.stuck import StuckDetector

    uuid = os.environ["FAULT_POD_UUID"]

    def list_assignments(self: PodResourcesClient, dra_uuids: Any = None) -> Assignments:
        return Assignments({uuid: (PodRef("ml", "bad-\udc80", "trainer"), PodRef("ml", "train-0", "trainer"))})

    _no_kubelet_needed()
    PodResourcesClient.list_assignments = list_assignments  # type: ignore[method-assign]

    real = temperature.families

    def families(samples: Any, system: Any) -> Any:
        if any(key.gpu == "1" for key, _ in samples):
            raise RuntimeError("injected: temperature families failed for GPU 1")
        return real(samples, system)

    def gpu_families(self: StuckDetector, snapshot: Any) -> Any:
        raise RuntimeError("injected: the stuck detector's families failed")

    temperature.families = families
    StuckDetector.gpu_families = gpu_families  # type: ignore[method-assign]


def _worker_python() -> None:
    sys.executable = os.environ["FAULT_WORKER_PYTHON"]  # a wrapper around the worker's interpreter


def _fd_hog() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    held: list[int] = []

    def take(*_: object) -> None:
        while True:
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                return

    def give_back(*_: object) -> None:
        while held:
            os.close(held.pop())

    signal.signal(signal.SIGUSR1, take)
    signal.signal(signal.SIGUSR2, give_back)


def _hung_mount() -> None:
    import time

    hung_dir = os.environ["FAULT_HUNG_DIR"].rstrip("/") + "/"
    flag = os.environ["FAULT_HUNG_FLAG"]
    real_stat, real_lstat, real_open = os.stat, os.lstat, os.open

    def hung(path: Any) -> None:
        if isinstance(path, (str, os.PathLike)) and os.fspath(path).startswith(hung_dir):
            while True:
                try:
                    real_stat(flag)
                except OSError:
                    return
                time.sleep(0.05)  # the kernel waits for the server; here, for the flag to go

    def stat(path: Any, *args: Any, **kwargs: Any) -> Any:
        hung(path)
        return real_stat(path, *args, **kwargs)

    def lstat(path: Any, *args: Any, **kwargs: Any) -> Any:
        hung(path)
        return real_lstat(path, *args, **kwargs)

    def open_(path: Any, *args: Any, **kwargs: Any) -> Any:
        hung(path)
        return real_open(path, *args, **kwargs)

    os.stat, os.lstat, os.open = stat, lstat, open_  # type: ignore[assignment]


def _slow_bcrypt() -> None:
    import time

    import bcrypt

    real = bcrypt.checkpw

    started = os.environ.get("FAULT_BCRYPT_STARTED")

    def checkpw(password: bytes, hashed: bytes) -> bool:
        if password == b"slow":
            if started:
                open(started, "w").close()  # noqa: SIM115 - a marker for the test
            time.sleep(3600)  # bcrypt at a cost nobody should use: the GIL is released meanwhile
        return bool(real(password, hashed))

    bcrypt.checkpw = checkpw


FAULTS = {
    "dispatch": _dispatch,
    "decode": _decode,
    "state": _state,
    "kernel_log": _kernel_log,
    "pods": _pods,
    "render": _render,
    "long_stderr": _worker_python,  # the wrapper writes a 70 KB stderr line first
    "worker_python": _worker_python,
    "fd_hog": _fd_hog,
    "hung_mount": _hung_mount,
    "slow_bcrypt": _slow_bcrypt,
}


def main() -> int:
    fault = sys.argv.pop(1)
    FAULTS[fault]()
    from exporter.cli import main as exporter_main

    return exporter_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
