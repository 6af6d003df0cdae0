"""A /dev/kmsg stand-in and the kernel-log fixtures, shared by the kernel-log tests
(tests/test_kmsg.py, test_kmsg_bounds.py, test_fuzz_kmsg.py)."""

from __future__ import annotations

from pathlib import Path

from exporter.supervisor.xid.parse import KernelXidEvent, parse_kmsg_record
from exporter.supervisor.xid.reader import KmsgReader

FIXTURES = Path(__file__).parent / "fixtures" / "kmsg"
BOOT_WALL = 1_773_000_000.0  # injected wall time of boot for the fixtures
BOOT_ID = "4b1f0d2e-0000-4000-8000-000000000001"


def kmsg_records(path: Path) -> list[bytes]:
    """Splits a saved kmsg dump into records (header line + its ' KEY=value' lines)."""
    records: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.startswith(" ") and records:
            records[-1] += line
        else:
            records.append(line)
    return [r.encode() for r in records]


class FakeKmsg:
    """Serves records one per read() like /dev/kmsg.

    EAGAIN (BlockingIOError) when none is left; EPIPE (BrokenPipeError) once wherever the next
    record's sequence number jumps, as the kernel does after records were overwritten. Each
    reader open starts at the oldest record, as a new open of /dev/kmsg does.
    """

    def __init__(self, records: list[bytes]) -> None:
        self.records = list(records)
        self.reads: dict[int, int] = {}
        self.epipe_at: set[tuple[int, int]] = set()

    def append(self, *lines: str) -> None:
        self.records.extend(line.encode() for line in lines)

    def read(self, fd: int, size: int) -> bytes:
        index = self.reads.get(fd, 0)
        if index >= len(self.records):
            raise BlockingIOError(11, "Resource temporarily unavailable")
        record = self.records[index]
        if index > 0 and (fd, index) not in self.epipe_at:
            previous = parse_kmsg_record(self.records[index - 1])
            current = parse_kmsg_record(record)
            assert previous is not None and current is not None
            if current.seq > previous.seq + 1:
                self.epipe_at.add((fd, index))
                raise BrokenPipeError(32, "Broken pipe")
        self.reads[fd] = index + 1
        assert len(record) <= size
        return record


def device_reader(fake: FakeKmsg, cursor: Path | None, **kwargs: object) -> KmsgReader:
    """A reader on /dev/null (a real character device, accepted with ``devices=None``) whose reads
    the fake answers."""
    options: dict[str, object] = {"boot_wall_time": BOOT_WALL, "read_fn": fake.read, "devices": None}
    if cursor is not None and cursor.parent.is_dir():
        boot_id = cursor.parent / "boot_id"
        boot_id.write_text(BOOT_ID + "\n", encoding="ascii")
        options["boot_id_path"] = str(boot_id)
    else:
        options["boot_id_path"] = None
    options.update(kwargs)
    return KmsgReader("/dev/null", cursor, **options)  # type: ignore[arg-type]


def xids(events: list[KernelXidEvent]) -> list[int]:
    return [e.xid for e in events]
