"""Running an outside command for ``nvgpu-exporter diagnose``: bounded in time and output, never hanging.

``nvidia-smi`` blocks when the driver does (a GPU that does not answer, a GSP timeout), and a
diagnosis is wanted exactly then. So each command (:func:`run`):

- is looked up on ``PATH`` first: absent, it is skipped with that reason (never a traceback);
- runs in a session of its own (``start_new_session``), so the command and everything it starts
  form one process group: the only processes ``diagnose`` ever signals;
- gets ``timeout_s``: then SIGTERM to its process group, :data:`GRACE_S` later SIGKILL to it, and
  :data:`GRACE_S` after that it is given up on (a process in uninterruptible sleep cannot be reaped;
  the archive says so) rather than waited for;
- has its standard output and error read on a thread and kept up to ``max_bytes`` (the rest is
  counted and dropped: a command that floods cannot fill the memory), standard input closed.

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

GRACE_S = 2.0
MAX_BYTES = 4 << 20
_CHUNK = 65536


@dataclass(frozen=True)
class Result:
    """How one command went.

    Attributes:
        argv: the command as asked for.
        status: ``ok`` (exit 0), ``failed`` (another exit status or a signal), ``timed_out``
            (stopped after its time), ``skipped`` (not on PATH, or no time left), ``error`` (could
            not be started).
        exit_code: its exit status (negative: the signal), None when it did not end by itself.
        output: standard output and error as read, at most ``max_bytes``.
        dropped: bytes of output read past ``max_bytes`` and dropped.
        seconds: how long it ran.
        detail: what happened, in words.
    """

    argv: tuple[str, ...]
    status: str
    exit_code: int | None
    output: bytes
    dropped: int
    seconds: float
    detail: str


def run(argv: list[str], timeout_s: float, max_bytes: int = MAX_BYTES, grace_s: float = GRACE_S) -> Result:
    """Run ``argv`` bounded (see the module docstring); never raises for the command's sake."""
    exe = shutil.which(argv[0]) if argv else None
    if exe is None:
        return Result(tuple(argv), "skipped", None, b"", 0, 0.0, f"{argv[0] if argv else '(empty)'} not found on PATH")
    if timeout_s <= 0:
        return Result(tuple(argv), "skipped", None, b"", 0, 0.0, "the total time budget is spent")
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [exe, *argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        return Result(tuple(argv), "error", None, b"", 0, 0.0, f"could not be started: {exc.strerror or exc}")
    reader = _Reader(proc, max_bytes)
    reader.start()
    status, detail = "ok", ""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        status, detail = "timed_out", _stop(proc, timeout_s, grace_s)
    reader.join(grace_s)
    if reader.is_alive():  # a process it started still holds the pipe: our own descendants, stop them
        _signal_group(proc.pid, signal.SIGKILL)
        reader.join(grace_s)
    code = proc.returncode
    if status == "ok" and code != 0:
        status = "failed"
        detail = f"exit status {code}" if code is not None and code >= 0 else f"killed by signal {-(code or 0)}"
    elif status == "ok":
        detail = "exit status 0"
    if reader.dropped:
        detail += f"; {reader.dropped} bytes of output past {max_bytes} dropped"
    return Result(tuple(argv), status, code, bytes(reader.data), reader.dropped, time.monotonic() - start, detail)


def _stop(proc: subprocess.Popen[bytes], timeout_s: float, grace_s: float) -> str:
    """SIGTERM the command's process group, then SIGKILL; returns what happened."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
        return f"stopped with SIGTERM after {timeout_s:g} s"
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=grace_s)
        return f"ignored SIGTERM; killed with SIGKILL after {timeout_s + grace_s:g} s"
    except subprocess.TimeoutExpired:
        return (
            f"did not end {grace_s:g} s after SIGKILL (uninterruptible sleep in the driver?): given up on, "
            f"pid {proc.pid} may still exist"
        )


def _signal_group(pgid: int, sig: int) -> None:
    """Signal the process group the command leads (its own session): nothing else."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class _Reader(threading.Thread):
    """Reads a command's output until the pipe closes, keeping the first ``limit`` bytes."""

    def __init__(self, proc: subprocess.Popen[bytes], limit: int) -> None:
        super().__init__(daemon=True, name=f"diagnose-read-{proc.pid}")
        self.proc = proc
        self.limit = limit
        self.data = bytearray()
        self.dropped = 0

    def run(self) -> None:
        pipe = self.proc.stdout
        if pipe is None:
            return
        fd = pipe.fileno()
        with contextlib.suppress(OSError, ValueError):
            while chunk := os.read(fd, _CHUNK):
                room = self.limit - len(self.data)
                self.data += chunk[: max(room, 0)]
                self.dropped += max(len(chunk) - max(room, 0), 0)
