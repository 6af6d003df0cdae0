"""exporter.common.fileio: files opened without blocking, checked, bounded; calls with a deadline."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from pathlib import Path

import pytest
from waiting import wait_until

from exporter.common import fileio
from exporter.common.fileio import FileRefused, Runner, TimedOut


def test_a_regular_file_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1000)
    assert fileio.read_bytes(str(path), 1000) == b"x" * 1000


@pytest.mark.parametrize(
    ("kind", "reason", "says"),
    [
        ("fifo", "not_regular", "is a FIFO, not a regular file"),
        ("directory", "not_regular", "is a directory, not a regular file"),
        ("device", "not_regular", "is a character device 1:3, not a regular file"),
        ("socket", "not_regular", "not a regular file"),
        ("loop", "error", "symbolic links"),
        ("huge", "too_large", "larger than"),
        ("missing", "error", "does not exist"),
        ("nul", "error", "NUL byte"),
        ("not-a-directory", "error", "cannot be opened"),
    ],
)
def test_anything_else_is_refused_at_once_naming_what_it_is(tmp_path: Path, kind: str, reason: str, says: str) -> None:
    """A FIFO would block a plain open() until a writer comes: opened with O_NONBLOCK it is refused
    at once (a blocking open would hang this test)."""
    path = str(tmp_path / "f")
    listener = None
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "device":
        path = "/dev/null"
    elif kind == "socket":
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
    elif kind == "loop":
        os.symlink(path, path)
    elif kind == "huge":
        with open(path, "wb") as fh:
            fh.truncate(1 << 40)  # sparse: a terabyte that takes no disk
    elif kind == "nul":
        path += "\0x"
    elif kind == "not-a-directory":
        Path(path).write_text("x")
        path += "/state.json"
    try:
        with pytest.raises(FileRefused) as info:
            fileio.read_bytes(path, 1 << 20)
    finally:
        if listener is not None:
            listener.close()
    assert info.value.reason == reason and says in info.value.detail, info.value.detail
    assert info.value.path == path and says in str(info.value)


def test_a_device_is_accepted_only_when_named(tmp_path: Path) -> None:
    fd, st = fileio.open_checked("/dev/null", 1, devices=((1, 3),))
    os.close(fd)
    assert os.major(st.st_rdev) == 1
    with pytest.raises(FileRefused, match="character device 1:3"):
        fileio.open_checked("/dev/null", 1, devices=(fileio.KMSG_DEVICE,))


def test_a_proc_file_reports_size_0_and_is_bounded_by_what_is_read() -> None:
    assert b"Name:" in fileio.read_bytes("/proc/self/status", 1 << 20)
    with pytest.raises(FileRefused, match="holds more than 10 bytes"):
        fileio.read_bytes("/proc/self/status", 10)


def test_a_link_is_refused_when_not_followed(tmp_path: Path) -> None:
    (tmp_path / "target").write_text("{}")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    assert fileio.read_bytes(str(tmp_path / "link"), 10) == b"{}"
    with pytest.raises(FileRefused, match="symbolic links"):
        fileio.read_bytes(str(tmp_path / "link"), 10, follow=False)


# -- the runner ------------------------------------------------------------------------------------


def blocking_open(path: str) -> bytes:
    """What a hung mount does to open(): the kernel waits (here: for a FIFO's writer)."""
    with open(path, "rb") as fh:
        return fh.read()


def test_a_call_that_blocks_is_abandoned_and_the_next_runs_on_a_new_thread(tmp_path: Path) -> None:
    fifo = str(tmp_path / "hung")
    os.mkfifo(fifo)
    runner = Runner("test-io", deadline_s=0.2)
    with pytest.raises(TimedOut, match="no answer within 0.2 s"):
        runner.call(blocking_open, fifo)
    assert runner.abandoned == 1 and runner.stuck == 1
    assert runner.call(len, b"abc") == 3, "a new thread answers while the first is still stuck"
    # unblock the abandoned thread: it returns, is not reused, and the stuck count goes back
    with open(fifo, "wb") as fh:
        fh.write(b"late")
    wait_until(lambda: runner.stuck == 0, 5, "the abandoned thread to come back")
    assert runner.call(len, b"ab") == 2


def test_too_many_stuck_calls_fail_at_once(tmp_path: Path) -> None:
    release = threading.Event()
    runner = Runner("test-io", deadline_s=0.05, max_stuck=2)
    try:
        for _ in range(2):
            with pytest.raises(TimedOut):
                runner.call(release.wait)
        with pytest.raises(TimedOut, match="2 earlier calls are still stuck"):
            runner.submit(len, b"").result(timeout=1)
    finally:
        release.set()
    wait_until(lambda: runner.stuck == 0, 5, "the stuck threads to come back")
    assert runner.call(len, b"x") == 1


def test_a_call_queued_behind_a_stuck_one_moves_to_the_new_thread() -> None:
    release = threading.Event()
    clock = [0.0]
    runner = Runner("test-io", deadline_s=1.0, clock=lambda: clock[0])
    stuck = runner.submit(release.wait)
    wait_until(lambda: stuck.running(), 5, "the first call to start")
    queued = runner.submit(len, b"abcd")
    clock[0] = 2.0  # past the deadline: the next submit abandons the stuck thread
    third = runner.submit(len, b"ab")
    assert queued.result(timeout=5) == 4 and third.result(timeout=5) == 2
    with pytest.raises(TimedOut):
        stuck.result(timeout=0)
    release.set()


def test_exceptions_come_back_to_the_caller() -> None:
    with pytest.raises(ZeroDivisionError):
        Runner("test-io").call(lambda: 1 // 0)


def test_the_event_loop_is_never_held_by_a_stuck_call() -> None:
    release = threading.Event()
    runner = Runner("test-io", deadline_s=0.3)

    async def main() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.ensure_future(ticker())
        with pytest.raises(TimedOut):
            await runner.acall(release.wait)
        task.cancel()
        return ticks

    try:
        assert asyncio.run(main()) >= 2, "the loop ran while the call was stuck"
    finally:
        release.set()


def test_read_file_names_a_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = str(tmp_path / "hung")
    os.mkfifo(fifo)
    monkeypatch.setattr(fileio, "read_bytes", lambda path, max_bytes, follow=True: blocking_open(path))
    with pytest.raises(FileRefused) as info:
        fileio.read_file(fifo, 10, deadline_s=0.1, runner=Runner("test-io"))
    assert info.value.reason == "timeout" and "hung mount" in info.value.detail
    with open(fifo, "wb"):  # let the abandoned thread go
        pass


def test_failures_are_counted_by_input_and_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fileio, "FAILURES", fileio.FAILURES.__class__())
    fileio.count_failure("state_file", FileRefused("/x", "not_regular", "is a FIFO"))
    fileio.count_failure("state_file", TimedOut("x"))
    fileio.count_failure("web_config", ValueError("x"))
    assert fileio.FAILURES == {
        ("state_file", "not_regular"): 1,
        ("state_file", "timeout"): 1,
        ("web_config", "error"): 1,
    }


def test_write_behind_waits_off_the_loop_only_and_says_when_the_write_is_late() -> None:
    """Off an event loop a write is waited for at most the deadline (a hung mount says so and the
    caller goes on); on the loop it is only queued, never waited for."""
    runner = Runner("test-io", deadline_s=0.1)
    release, wrote = threading.Event(), []
    assert runner.write_behind(wrote.append, "quick") is None and wrote == ["quick"]
    late = runner.write_behind(release.wait, 5.0)
    assert late is not None and "0.1 s" in late and "hung mount" in late

    async def on_loop() -> str | None:
        assert fileio.on_event_loop()
        return runner.write_behind(release.wait, 5.0)  # queued; returns at once

    assert asyncio.run(on_loop()) is None and not fileio.on_event_loop()
    release.set()
