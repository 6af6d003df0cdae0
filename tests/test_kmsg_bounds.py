"""Kernel-log input: every read bounded per record and per poll, nothing read twice, a
bad cursor never switches Xid collection off, a planted symlink is never written through."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_kmsg import FIXTURES, FakeKmsg, device_reader, kmsg_records, xids

from exporter.supervisor.xid import reader as kmsg_reader
from exporter.supervisor.xid.reader import KernelLogUnavailable, KmsgReader

XID = b"[ 5.0] NVRM: Xid (PCI:0000:00:06): 13, pid=7, name=x, Graphics SM Warp Exception\n"


class CountingPread:
    """``os.pread`` that counts the bytes it returns (to prove nothing is read twice)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.calls: list[int] = []
        self._real = os.pread

    def __call__(self, fd: int, size: int, offset: int) -> bytes:
        data = self._real(fd, size, offset)
        self.bytes += len(data)
        self.calls.append(len(data))
        return data


@pytest.fixture
def pread(monkeypatch: pytest.MonkeyPatch) -> Iterator[CountingPread]:
    counting = CountingPread()
    monkeypatch.setattr(kmsg_reader.os, "pread", counting)
    yield counting


def test_line_without_newline_is_read_once_in_bounded_polls(tmp_path: Path, pread: CountingPread) -> None:
    """64 MiB without a newline: each poll reads at most _POLL_BYTES, the bytes are consumed as they
    come (never buffered, never read again), and the line after it is parsed."""
    size = 64 << 20
    path = tmp_path / "huge.log"
    with path.open("wb") as fh:
        fh.truncate(size)  # sparse: zeros, no newline
    cursor = tmp_path / "cursor.json"
    with KmsgReader(path, cursor) as reader:
        polls = 0
        while pread.bytes < size:
            before = pread.bytes
            assert reader.poll() == []
            assert pread.bytes - before <= kmsg_reader._POLL_BYTES
            polls += 1
        assert polls == size // kmsg_reader._POLL_BYTES
        assert max(pread.calls) <= kmsg_reader._FILE_CHUNK
        assert len(reader._lines.carry) == 0 and reader._lines.skipping
        assert reader.poll() == [] and pread.bytes == size  # at the end: nothing read again
        with path.open("ab") as fh:
            fh.write(b"tail of the long line\n" + XID)
        assert xids(reader.poll()) == [13]
        assert pread.bytes == size + len(b"tail of the long line\n" + XID)
        assert reader._lines.dropped == 1
    saved = json.loads(cursor.read_text())
    assert saved["offset"] == path.stat().st_size and saved["seq"] == 2


def test_partial_line_is_not_read_again(tmp_path: Path, pread: CountingPread) -> None:
    path = tmp_path / "kern.log"
    path.write_bytes(b"[ 1.0] NVRM: Xid (PCI:0000:00:06): 31, half")
    with KmsgReader(path, tmp_path / "cursor.json") as reader:
        for _ in range(5):
            assert reader.poll() == []
        assert pread.bytes == path.stat().st_size  # held, not re-read at every poll
        with path.open("ab") as fh:
            fh.write(b" a line\n")
        events = reader.poll()
    assert xids(events) == [31] and events[0].message.endswith("half a line")


def test_long_line_between_xids_is_dropped_alone(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_bytes(XID + b"x" * (kmsg_reader._MAX_LINE + 1) + b" NVRM: Xid (PCI:0000:00:06): 48, hidden\n" + XID)
    with KmsgReader(path, None) as reader:
        events = reader.poll()
    assert xids(events) == [13, 13] and [e.seq for e in events] == [1, 3]


@pytest.mark.parametrize("split", [1, 7, 100, kmsg_reader._MAX_LINE])
def test_line_buffer_is_independent_of_chunking(split: int) -> None:
    data = XID * 3 + b"y" * (kmsg_reader._MAX_LINE + 5) + b"\n" + XID + b"partial"
    buffer = kmsg_reader._LineBuffer()
    lines: list[bytes | None] = []
    done = 0
    for start in range(0, len(data), split):
        got, n = buffer.feed(data[start : start + split])
        lines += got
        done += n
    assert lines == [XID[:-1]] * 3 + [None] + [XID[:-1]]
    assert done == len(data) - len(b"partial") and bytes(buffer.carry) == b"partial"


def test_rss_stays_flat_on_300_mib_without_newline(tmp_path: Path) -> None:
    """The issue's figure: 646 MiB RSS on this file before. A fresh interpreter reads it to the end."""
    path = tmp_path / "huge.log"
    with path.open("wb") as fh:
        fh.truncate(300 << 20)
    code = f"""
import resource
from exporter.supervisor.xid.reader import KmsgReader
reader = KmsgReader({str(path)!r}, None)
reader.open()
reader.poll()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
while reader._pos < {300 << 20}:
    reader.poll()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    growth_kib = int(out.stdout.strip())
    assert growth_kib < 8 * 1024, f"RSS grew {growth_kib} KiB"


def test_dev_zero_is_refused_after_one_bounded_poll() -> None:
    """/dev/zero is a character device that never runs dry and holds no kmsg record: refused at
    open (it is not /dev/kmsg, 1:11); accepted as any device, refused after one bounded poll."""
    with pytest.raises(KernelLogUnavailable, match=r"character device 1:5, not /dev/kmsg"):
        KmsgReader("/dev/zero", None, boot_id_path=None).open()
    with KmsgReader("/dev/zero", None, boot_id_path=None, devices=None) as reader:
        with pytest.raises(KernelLogUnavailable, match="not a kernel log"):
            reader.poll()


def test_device_that_never_runs_dry_returns_within_a_bound(tmp_path: Path) -> None:
    """A flood of valid records (a busy or hostile /dev/kmsg): one poll stops after _POLL_READS
    reads, the next continues where it stopped, and nothing is lost or counted twice."""
    seq = 0

    def flood(fd: int, size: int) -> bytes:
        nonlocal seq
        seq += 1
        return f"4,{seq},{seq},-;NVRM: Xid (PCI:0000:00:06): 13, pid=1, name=a, flood\n".encode()

    reader = KmsgReader("/dev/null", tmp_path / "cursor.json", boot_id_path=None, read_fn=flood, devices=None)
    with reader:
        first = reader.poll()
        second = reader.poll()
    assert len(first) == len(second) == kmsg_reader._POLL_READS
    assert [e.seq for e in first + second] == list(range(1, 2 * kmsg_reader._POLL_READS + 1))


def test_cursor_held_across_a_bounded_poll(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cursor lies beyond what one poll may read: the reader keeps skipping on the next poll
    instead of taking an unfinished catch-up for a new boot (which would count history twice)."""
    monkeypatch.setattr(kmsg_reader, "_POLL_READS", 2)
    records = kmsg_records(FIXTURES / "overwritten.kmsg")
    cursor = tmp_path / "cursor.json"
    cursor.write_text(json.dumps({"version": 1, "path": "/dev/null", "kind": "device", "boot_id": None, "seq": 251}))
    fake = FakeKmsg(records)
    with device_reader(fake, cursor, boot_id_path=None) as reader:
        got = reader.poll() + reader.poll() + reader.poll() + reader.poll()
    assert xids(got) == [43]


@pytest.mark.parametrize(
    "bad",
    [{"offset": -5}, {"offset": "12"}, {"offset": 1 << 70}, {"offset": None}, {"seq": -1}, {"offset": 10**9}],
)
def test_bad_offset_with_matching_identity_never_disables_collection(tmp_path: Path, bad: dict[str, object]) -> None:
    path = tmp_path / "kern.log"
    path.write_bytes(XID + XID)
    st = path.stat()
    cursor = tmp_path / "cursor.json"
    good = {"version": 1, "path": str(path), "kind": "file", "boot_id": None, "seq": 2}
    cursor.write_text(json.dumps({**good, "offset": 5, "dev": st.st_dev, "inode": st.st_ino, **bad}))
    with KmsgReader(path, cursor, boot_id_path=None) as reader:
        assert xids(reader.poll()) == [13, 13]  # history read again from the start
    saved = json.loads(cursor.read_text())
    assert saved["offset"] == st.st_size and saved["seq"] == 2  # rewritten: the next start resumes
    with KmsgReader(path, cursor, boot_id_path=None) as reader:
        assert reader.poll() == []
        with path.open("ab") as fh:
            fh.write(XID)
        assert xids(reader.poll()) == [13]


def test_deeply_nested_cursor_is_ignored(tmp_path: Path) -> None:
    cursor = tmp_path / "cursor.json"
    cursor.write_text("[" * 4000)
    path = tmp_path / "kern.log"
    path.write_bytes(XID)
    with KmsgReader(path, cursor) as reader:
        assert xids(reader.poll()) == [13]


def test_planted_symlink_at_the_temporary_path_is_not_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mkstemp's next name is predicted and a symlink planted there: O_EXCL refuses it, another
    name is taken, and the link's target keeps its content."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    names = iter(["planted", "fresh"])
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: names)
    planted = tmp_path / ".kmsg-cursor-planted"
    planted.symlink_to(victim)
    path = tmp_path / "kern.log"
    path.write_bytes(XID)
    cursor = tmp_path / "cursor.json"
    with KmsgReader(path, cursor) as reader:
        assert xids(reader.poll()) == [13]
    assert victim.read_text() == "precious"
    assert planted.is_symlink()
    assert json.loads(cursor.read_text())["offset"] == len(XID)
    assert not (tmp_path / ".kmsg-cursor-fresh").exists()  # moved over the cursor


def test_symlink_at_the_cursor_path_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    cursor = tmp_path / "cursor.json"
    cursor.symlink_to(victim)
    path = tmp_path / "kern.log"
    path.write_bytes(XID)
    with KmsgReader(path, cursor) as reader:
        assert xids(reader.poll()) == [13]  # the link is not read either (O_NOFOLLOW)
    assert victim.read_text() == "precious"
    assert not cursor.is_symlink() and json.loads(cursor.read_text())["seq"] == 1


def test_dev_zero_on_the_real_exporter_costs_no_core_and_sigterm_works(tmp_path: Path) -> None:
    """The issue: NVGPU_KMSG_PATH=/dev/zero burnt a core and the exporter was alive 4 minutes after
    SIGTERM. Now the feature goes unsupported at once (a character device that is not /dev/kmsg is
    refused at open; accepted as any device it would be after one bounded poll); nothing else changes."""
    import time

    import psutil
    from exporter_proc import SCENARIOS, Exporter

    env = {"NVGPU_FEATURE_KERNEL_XID": "on", "NVGPU_KMSG_PATH": "/dev/zero"}
    with Exporter(SCENARIOS / "h200x1.json", tmp_path, env=env) as exp:
        scrape = exp.wait_for(
            lambda s: s.value("nvgpu_kernel_log_up") == 0.0 and s.value("nvgpu_up") == 1.0, what="kernel log off"
        )
        assert scrape.value("nvgpu_feature_enabled", feature="kernel_xid", reason="unsupported") == 0.0
        supervisor = psutil.Process(exp.proc.pid)
        before = supervisor.cpu_times()
        time.sleep(3)  # the point: what 3 s on /dev/zero cost, measured
        after = supervisor.cpu_times()
        used = (after.user - before.user) + (after.system - before.system)
        assert used < 1.0, f"supervisor used {used:.2f} CPU-s in 3 s"
        assert "character device 1:5, not /dev/kmsg (1:11)" in exp.logs()
        t0 = time.monotonic()
        assert exp.terminate(timeout=20) == 0
        assert time.monotonic() - t0 < 15


# -- nothing here blocks, and a stuck poll costs the kernel log, not the supervisor ----------------


def test_a_fifo_cursor_is_ignored_at_once_and_replaced(tmp_path: Path) -> None:
    """A FIFO at the cursor path: a plain open() would wait for a writer (and hold the poll thread
    forever). Opened without blocking, it is ignored (history counted), and the first save
    replaces it with a regular file (os.replace replaces the name, never writes through it)."""
    log_file = tmp_path / "kern.log"
    log_file.write_bytes(XID)
    cursor = tmp_path / "cursor.json"
    os.mkfifo(cursor)
    with KmsgReader(log_file, cursor, boot_id_path=None) as reader:
        assert xids(reader.poll()) == [13]
    assert cursor.is_file() and json.loads(cursor.read_text())["seq"] == 1


def test_a_poll_that_does_not_answer_costs_the_kernel_log_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll stuck on a hung mount: the loop goes on, nvgpu_kernel_log_up turns 0 and the stuck
    poll is logged once; no second poll starts while it is stuck (the reader is not thread-safe);
    once it answers, its events are counted."""
    import asyncio
    import threading
    from types import SimpleNamespace

    from exporter.common import fileio
    from exporter.config import Config
    from exporter.supervisor import kernel_xid

    monkeypatch.setattr(kernel_xid, "POLL_DEADLINE_S", 0.1)
    monkeypatch.setattr(fileio, "FAILURES", fileio.FAILURES.__class__())
    ext = kernel_xid.KernelXid(Config(kmsg_path="/nonexistent", state_file=""))
    release = threading.Event()
    polls = [0]

    def stuck_poll() -> list[object]:
        polls[0] += 1
        release.wait()
        return []

    monkeypatch.setattr(ext.reader, "poll", stuck_poll)
    changed = [0]
    host = SimpleNamespace(snapshot=None, changed=lambda: changed.__setitem__(0, changed[0] + 1))

    async def main() -> None:
        task = asyncio.ensure_future(ext._poll(host))  # type: ignore[arg-type]
        while ext.up is not False:
            await asyncio.sleep(0.01)  # the loop runs while the poll is stuck
        assert polls[0] == 1 and changed[0] == 1 and not task.done()
        release.set()
        assert await task == []

    asyncio.run(main())
    assert fileio.FAILURES[("kernel_log", "timeout")] == 1
