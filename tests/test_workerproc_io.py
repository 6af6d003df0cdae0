"""Worker I/O: nothing the worker writes ends the reading of its streams.

The supervisor reads two pipes of each worker: JSON lines (``_read_messages``) and stderr
(``_read_stderr``). These tests feed real asyncio stream readers with what a broken or hostile
worker could write and check that every line after it is still read.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from exporter.common import protocol
from exporter.common.snapshot import Message, Progress
from exporter.supervisor import workerproc
from exporter.supervisor.workerproc import MAX_LINE as STDERR_LINE_MAX
from exporter.supervisor.workerproc import WorkerProcess


def _worker(errors: list[str], seen: list[Message], on_message: Any = None) -> WorkerProcess:
    return WorkerProcess(
        {},
        None,  # type: ignore[arg-type]  # no breadcrumbs needed to read streams
        on_message or seen.append,
        (1.0, 1.0),
        on_error=errors.append,
    )


def _stream(data: bytes, limit: int = 1 << 16) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=limit)
    reader.feed_data(data)
    reader.feed_eof()
    return reader


def _progress(step: str) -> bytes:
    return protocol.encode("progress", step=step)


async def test_messages_after_bad_lines_are_still_read() -> None:
    errors: list[str] = []
    seen: list[Message] = []
    lines = [
        _progress("one"),
        b'{"v": 1, "type": "progress", "step": "' + b"x" * 300_000 + b'"}\n',  # longer than the limit
        b'{"v": 1, "type": ' + b"[" * 100_000 + b"\n",  # RecursionError in json
        b'{"v": 1, "type": ["progress"]}\n',  # unhashable type
        b"not json\n",  # a protocol error: logged, not counted
        _progress("two"),
    ]
    await _worker(errors, seen)._read_messages(_stream(b"".join(lines), limit=200_000))
    assert seen == [Progress("one"), Progress("two")]
    assert errors == [
        "reading a worker message longer than the stream limit",
        "decoding a worker message",
        "decoding a worker message",
    ]


async def test_a_handler_that_raises_costs_only_its_message() -> None:
    errors: list[str] = []
    seen: list[Message] = []

    def on_message(msg: Message) -> None:
        if msg == Progress("bad"):
            raise RuntimeError("handler bug")
        seen.append(msg)

    worker = _worker(errors, seen, on_message)
    await worker._read_messages(_stream(_progress("a") + _progress("bad") + _progress("b")))
    assert seen == [Progress("a"), Progress("b")]
    assert errors == ["handling a Progress message"]


def _cut(dropped: int) -> str:
    return f" [... {dropped} more bytes dropped: a stderr line is kept up to {STDERR_LINE_MAX} bytes]\n"


async def test_stderr_long_line_is_cut_marked_and_the_rest_read() -> None:
    """The issue's 70 KB line, then a faulthandler report: the report is still found."""
    worker = _worker([], [])
    data = b"x" * 70_000 + b"\nFatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n"
    await worker._read_stderr(_stream(data + b"  File x.py, line 1 (no newline at the end)"))
    tail = list(worker.stderr_tail)
    assert tail[0] == "x" * STDERR_LINE_MAX + _cut(70_000 - STDERR_LINE_MAX)
    assert tail[-1] == "  File x.py, line 1 (no newline at the end)\n"
    assert worker.dead_stack().startswith("Fatal Python error: Segmentation fault")


@pytest.mark.parametrize("chunk", [1, 1000, workerproc.STDERR_CHUNK])
async def test_stderr_lines_do_not_depend_on_how_the_pipe_splits_them(chunk: int, monkeypatch: Any) -> None:
    monkeypatch.setattr(workerproc, "STDERR_CHUNK", chunk)
    worker = _worker([], [])
    lines = [b"short", b"y" * (STDERR_LINE_MAX + 1), b"", b"z" * STDERR_LINE_MAX]
    await worker._read_stderr(_stream(b"\n".join(lines) + b"\n"))
    assert list(worker.stderr_tail) == [
        "short\n",
        "y" * STDERR_LINE_MAX + _cut(1),
        "\n",
        "z" * STDERR_LINE_MAX + "\n",
    ]


async def test_stderr_is_drained_when_our_own_stderr_fails(monkeypatch: Any) -> None:
    class Broken:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(workerproc.sys, "stderr", Broken())
    worker = _worker([], [])
    await worker._read_stderr(_stream(b"a\nb\n"))
    assert list(worker.stderr_tail) == ["a\n", "b\n"]


async def test_failed_spawn_leaves_no_descriptor(monkeypatch: Any) -> None:
    """A spawn that fails after the message pipe was made (fork refused, EMFILE in the event loop's
    own pipes) closes both ends: a retry loop under EMFILE must not leak one descriptor per try."""
    import os

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError(11, "Resource temporarily unavailable")

    class Crumbs:
        fd = os.open(os.devnull, os.O_RDONLY)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", refuse)
    before = len(os.listdir("/proc/self/fd"))
    worker = WorkerProcess({}, Crumbs(), lambda m: None, (1.0, 1.0))  # type: ignore[arg-type]
    for _ in range(20):
        with pytest.raises(OSError):
            await worker.spawn()
    assert len(os.listdir("/proc/self/fd")) == before
    os.close(Crumbs.fd)
