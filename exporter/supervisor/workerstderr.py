"""A worker's stderr as the supervisor reads it: bytes into bounded text lines
(:class:`LineSplitter`), and the lines that are not log records (a traceback, faulthandler's
report, a C library's message) gathered into one record (:class:`StderrBlock`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

# the records keep the logger name they had before this module was split from workerproc
log = logging.getLogger("exporter.supervisor")

BLOCK_QUIET_S = 0.25  # non-log text is one record once the worker is quiet this long
BLOCK_MAX_LINES = 200  # ... or once it is this long


class LineSplitter:
    """Bytes in, text lines out, with a bound on the length of one line.

    Args:
        max_line: bytes kept of one line; the rest is dropped and the line marked with how many.
    """

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self._dropped = 0

    def feed(self, chunk: bytes) -> list[str]:
        """The complete lines ``chunk`` finishes (without their newline)."""
        out: list[str] = []
        self._buf += chunk
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > self.max_line:
                    self._dropped += len(self._buf) - self.max_line
                    del self._buf[self.max_line :]
                return out
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            if len(line) > self.max_line:
                self._dropped += len(line) - self.max_line
                line = line[: self.max_line]
            out.append(self._text(line))

    def close(self) -> list[str]:
        """The last line, if the stream did not end with a newline."""
        if not self._buf and not self._dropped:
            return []
        line, self._buf = bytes(self._buf), bytearray()
        return [self._text(line)]

    def _text(self, line: bytes) -> str:
        text = line.decode("utf-8", "replace").rstrip("\r")
        if self._dropped:
            text += f" [... {self._dropped} more bytes dropped: a stderr line is kept up to {self.max_line} bytes]"
            self._dropped = 0
        return text


class StderrBlock:
    """Consecutive non-log lines of a worker's stderr, written as one record
    (:meth:`exporter.supervisor.workerproc.WorkerProcess._read_stderr`).

    Args:
        pid: the worker's process id, as it is when a record is written.
    """

    def __init__(self, pid: Callable[[], int | None]) -> None:
        self.pid = pid
        self.lines: list[str] = []
        self._timer: asyncio.TimerHandle | None = None

    @property
    def fatal(self) -> bool:
        return bool(self.lines) and self.lines[0].startswith("Fatal Python error")

    def add(self, text: str) -> None:
        if not self.lines and not text.strip():
            return
        if self.lines and not self.fatal and text.startswith("Fatal Python error"):
            self.flush()
        self.lines.append(text)
        if self.fatal:
            return  # the process is dying: the death record carries it
        if len(self.lines) >= BLOCK_MAX_LINES:
            self.flush()
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(BLOCK_QUIET_S, self.flush)

    def flush(self, at_exit: bool = False) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        lines, self.lines = self.lines, []
        if not lines:
            return
        if lines[0].startswith("Fatal Python error"):
            if not at_exit:
                self.lines = lines  # keep gathering until the worker is gone
            return
        text = "\n".join(lines).rstrip()
        last = lines[-1].strip()
        pid = self.pid()
        if last == "KeyboardInterrupt":
            log.info(
                "worker %s interrupted by SIGINT (Ctrl-C reaches the whole process group)",
                pid,
                extra={"worker_pid": pid},
            )
        elif any(line.startswith("Traceback (most recent call last)") for line in lines):
            log.error("worker %s: %s", pid, last[:500], extra={"worker_pid": pid, "stack": text})
        elif len(lines) == 1:
            log.warning("worker %s wrote to stderr: %s", pid, text, extra={"worker_pid": pid})
        else:
            log.warning("worker %s wrote to stderr: %s", pid, last, extra={"worker_pid": pid, "stderr": text})
