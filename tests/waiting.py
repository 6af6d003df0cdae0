"""The one polling helper of the tests: wait for a condition instead of sleeping a guessed time.

A test that needs the exporter (or a server, or a child process) to reach some state asks for that
state with a deadline; it never sleeps and hopes. A sleep stays only where letting time pass is the
point of the test (proving that nothing happens meanwhile), and says so in a comment.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(
    pred: Callable[[], T],
    timeout: float,
    what: str | Callable[[], str],
    logs: Callable[[], str] | None = None,
    every: float = 0.1,
    retry_on: tuple[type[BaseException], ...] = (OSError, ValueError),
) -> T:
    """Call ``pred`` every ``every`` seconds until it returns something truthy, and return that.

    Args:
        pred: the condition; an exception of ``retry_on`` (a refused connection, a half-written
            file) counts as "not yet".
        timeout: seconds (time.monotonic()) before giving up.
        what: what is awaited, for the failure message (a callable is asked at the deadline, so the
            message can say what is still missing).
        logs: called at the deadline; its text is appended to the message.
        every: seconds between calls.
        retry_on: exception types that mean "not yet".

    Raises:
        AssertionError: the condition did not hold within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            got: Any = pred()
        except retry_on:
            got = None
        if got:
            return got  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(
                f"timed out after {timeout} s waiting for {described}" + (f"\n{logs()}" if logs else "")
            )
        time.sleep(every)


def masks_signal(pid: int, signum: int) -> bool:
    """Whether process ``pid`` ignores ``signum`` or one of its threads blocks it (the SigIgn and
    per-thread SigBlk masks of /proc/<pid>/status and /proc/<pid>/task/*/status, Linux). The fake
    NVML's ``ignore_sigterm`` hang does one of the two: this tells a test the hang has begun."""
    bit = 1 << (signum - 1)
    paths = [Path(f"/proc/{pid}/status"), *Path(f"/proc/{pid}/task").glob("*/status")]
    for path in paths:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("SigIgn", "SigBlk") and int(value.strip(), 16) & bit:
                return True
    return False


def accept_queue(port: int) -> int | None:
    """Connections waiting in the accept queue of the TCP socket listening on ``port`` (the
    ``rx_queue`` of its LISTEN row in /proc/net/tcp and tcp6, Linux); None when nothing listens.
    0 means the server has taken every connection made so far."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return int(fields[4].split(":")[1], 16)
    return None
