"""Property tests (Hypothesis) of everything the kernel-log reader takes in: ``/dev/kmsg``
records, text-log lines, whole files of random bytes read in random pieces, and the cursor file.

Each property is "correct behaviour or a clear error, never anything else": parsers return a
record/event or None and never raise; a reader never raises anything but KernelLogUnavailable,
never loses or double-counts an event whatever the read boundaries and restarts, keeps its memory
bounded, and leaves a valid cursor behind whatever cursor it found.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

from fake_kmsg import FakeKmsg
from fuzzing import HOSTILE_TEXT, JSON_VALUES, NUMBERS, bounded_memory
from hypothesis import given
from hypothesis import strategies as st

from exporter.supervisor.xid import reader as kmsg_reader
from exporter.supervisor.xid.parse import KernelXidEvent, normalize_pci_bus_id, parse_kmsg_record, parse_line
from exporter.supervisor.xid.reader import KmsgReader

NVML_BUS = re.compile(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]")
HEX = "0123456789abcdefABCDEF"

# -- lines ------------------------------------------------------------------------------------------

BUS = st.builds(
    lambda domain, bus, dev, fn: f"{domain + ':' if domain else ''}{bus}:{dev}{'.' + fn if fn else ''}",
    st.text(HEX, min_size=0, max_size=8),
    st.text(HEX, min_size=2, max_size=2),
    st.text(HEX, min_size=2, max_size=2),
    st.sampled_from(["", "0", "1", "7"]),
)
NO_NEWLINE = st.text(st.characters(blacklist_characters="\n"), max_size=60)
NAME = st.text(st.characters(blacklist_characters=",\n"), max_size=20)
PREFIX = st.sampled_from(
    ["", "[  864.022016] ", "2026-11-30T06:00:00.123456+00:00 node-7 kernel: ", "Nov 30 06:00:00 node-7 kernel: "]
)


@st.composite
def xid_lines(draw: st.DrawFn) -> tuple[str, int, str]:
    """A driver Xid line in any of its observed forms, with random text where the driver puts text."""
    bus = draw(BUS)
    xid = draw(st.integers(min_value=0, max_value=10**6))
    pid = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=2**22).map(str), st.just("'<unknown>'")))
    rest = f", pid={pid}, name={draw(NAME)}" if pid is not None else ""
    tail = draw(st.one_of(st.just(""), NO_NEWLINE.map(lambda t: ", " + t)))
    pci = draw(st.sampled_from(["PCI:", ""]))
    line = f"{draw(PREFIX)}NVRM: Xid ({pci}{bus}): {xid}{rest}{tail}"
    return line, xid, bus


@given(xid_lines())
def test_every_xid_line_form_parses(case: tuple[str, int, str]) -> None:
    line, xid, bus = case
    event = parse_line(line)
    assert event is not None, line
    assert event.xid == xid and event.pci_bus_id == normalize_pci_bus_id(bus)
    assert NVML_BUS.fullmatch(event.pci_bus_id)


@given(st.one_of(st.text(max_size=400), NO_NEWLINE.map(lambda t: "NVRM: " + t), xid_lines().map(lambda c: c[0] + "\n")))
def test_parse_line_never_raises(line: str) -> None:
    event = parse_line(line)
    if event is not None:
        assert isinstance(event.xid, int) and event.xid >= 0 and NVML_BUS.fullmatch(event.pci_bus_id)


KMSG_FIELDS = st.tuples(NUMBERS.map(lambda n: str(abs(int(n))) if isinstance(n, int) else "1"), st.integers(0, 2**64))


@given(
    st.one_of(
        st.binary(max_size=300),
        st.text(max_size=300),
        st.builds(
            lambda prio, seq, usec, flags, msg: f"{prio},{seq},{usec},{flags};{msg}\n",
            st.integers(min_value=0, max_value=10**30),
            st.integers(min_value=0, max_value=2**64),
            st.integers(min_value=0, max_value=2**64),
            st.sampled_from(["-", "c", "+", "", "x,caller=T1"]),
            st.text(max_size=80),
        ),
    )
)
def test_parse_kmsg_record_never_raises(raw: bytes | str) -> None:
    record = parse_kmsg_record(raw)
    if record is not None:
        assert record.facility >= 0 and 0 <= record.level <= 7 and record.seq >= 0 and record.boot_time_us >= 0
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        assert text.startswith(f"{record.facility * 8 + record.level},{record.seq},")


# -- text files read in pieces ----------------------------------------------------------------------

XID = b"[ 5.0] NVRM: Xid (PCI:0000:00:06): 13, pid=7, name=a, Graphics SM Warp Exception\n"
PIECES = st.one_of(
    st.binary(max_size=120),
    st.sampled_from(
        [
            XID,
            b"\n",
            b"NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.\n",
            b"4,1203,864022016,-;NVRM: Xid (PCI:0000:00:07): 31, pid=9, name=b, MMU Fault\n",
            b"x" * (kmsg_reader._MAX_LINE - 10),
            b"y" * (kmsg_reader._MAX_LINE + 10) + b" NVRM: Xid (PCI:0000:00:06): 48, inside a dropped line\n",
        ]
    ),
)


def _key(events: list[KernelXidEvent]) -> list[tuple[Any, ...]]:
    return [(e.seq, e.xid, e.pci_bus_id, e.message, e.fallen_off_bus) for e in events]


def _same_but_79_repeats(got: list[KernelXidEvent], expected: list[KernelXidEvent]) -> None:
    """Exactly the same events, except one thing known and left alone: the parser's memory of the
    last Xid 79 per GPU (one loss reported by two lines counts once) does not survive a restart, so
    a restart between the two reports counts that loss twice."""
    assert _key([e for e in got if e.xid != 79]) == _key([e for e in expected if e.xid != 79])
    assert set(_key([e for e in expected if e.xid == 79])) <= set(_key([e for e in got if e.xid == 79]))


@given(
    pieces=st.lists(PIECES, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=4),
    restart=st.integers(min_value=0, max_value=5),
)
def test_file_read_in_any_pieces_with_a_restart_equals_one_read(
    pieces: list[bytes], cuts: list[int], restart: int
) -> None:
    """The file grows in random pieces with a poll after each, and the exporter restarts once (a new
    reader from the cursor): the events are exactly those of one reader reading the whole file."""
    blob = b"".join(pieces)
    points = sorted({c % (len(blob) + 1) for c in cuts} | {len(blob)})
    with tempfile.TemporaryDirectory() as tmp:
        path, cursor = Path(tmp) / "kern.log", Path(tmp) / "cursor.json"
        path.write_bytes(b"")
        got: list[KernelXidEvent] = []
        reader = KmsgReader(path, cursor, boot_id_path=None)
        with bounded_memory():
            previous = 0
            for i, point in enumerate(points):
                with path.open("ab") as fh:
                    fh.write(blob[previous:point])
                previous = point
                if i == restart:
                    reader.close()
                    reader = KmsgReader(path, cursor, boot_id_path=None)
                got += reader.poll()
            reader.close()
        whole = Path(tmp) / "whole.log"
        whole.write_bytes(blob)
        with KmsgReader(whole, None, boot_id_path=None) as reference:
            expected = reference.poll()
        saved = json.loads(cursor.read_text()) if cursor.exists() else {"offset": 0}
    _same_but_79_repeats(got, expected)
    assert saved["offset"] == blob.rfind(b"\n") + 1  # the cursor points at the start of a line


# -- /dev/kmsg records with gaps and a restart ------------------------------------------------------


@st.composite
def kmsg_streams(draw: st.DrawFn) -> list[bytes]:
    seq = draw(st.integers(min_value=0, max_value=2**40))
    records = []
    for _ in range(draw(st.integers(min_value=0, max_value=25))):
        seq += draw(st.sampled_from([1, 1, 1, 2, 50]))
        facility = draw(st.sampled_from([0, 0, 0, 1, 3]))
        body = draw(
            st.one_of(
                st.just("NVRM: Xid (PCI:0000:00:06): 13, pid=1, name=a, x"),
                st.just("NVRM: Xid (PCI:0000:00:07): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."),
                st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=40),
            )
        )
        records.append(f"{facility * 8 + 4},{seq},{seq * 1000},-;{body}\n".encode())
    return records


@given(records=kmsg_streams(), split=st.integers(min_value=0, max_value=30))
def test_device_restart_from_cursor_neither_loses_nor_repeats(records: list[bytes], split: int) -> None:
    split = min(split, len(records))
    with tempfile.TemporaryDirectory() as tmp:
        cursor = Path(tmp) / "cursor.json"
        fake = FakeKmsg(records[:split])
        with KmsgReader("/dev/null", cursor, boot_id_path=None, read_fn=fake.read, devices=None) as first:
            got = first.poll()
        fake.records = list(records)
        fake.reads.clear()  # a new open of /dev/kmsg starts at the oldest record
        with KmsgReader("/dev/null", cursor, boot_id_path=None, read_fn=fake.read, devices=None) as second:
            got += second.poll()
        whole = FakeKmsg(records)
        with KmsgReader("/dev/null", None, boot_id_path=None, read_fn=whole.read, devices=None) as reference:
            expected = reference.poll()
    _same_but_79_repeats(got, expected)


# -- the cursor file --------------------------------------------------------------------------------


def _cursors(path: str, dev: int, inode: int, size: int) -> st.SearchStrategy[bytes]:
    near = st.fixed_dictionaries(
        {},
        optional={
            "version": st.one_of(st.just(1), JSON_VALUES),
            "path": st.one_of(st.just(path), JSON_VALUES),
            "kind": st.sampled_from(["file", "device", "", 1]),
            "boot_id": st.one_of(st.none(), JSON_VALUES),
            "seq": st.one_of(st.integers(min_value=-5, max_value=5), NUMBERS, JSON_VALUES),
            "offset": st.one_of(st.integers(min_value=-5, max_value=size + 5), NUMBERS, JSON_VALUES),
            "dev": st.one_of(st.just(dev), NUMBERS),
            "inode": st.one_of(st.just(inode), NUMBERS),
        },
    )
    return st.one_of(
        near.map(lambda d: json.dumps(d).encode()), JSON_VALUES.map(lambda v: json.dumps(v).encode()), HOSTILE_TEXT
    )


LOG = XID + b"noise\n" + XID.replace(b"13,", b"31,")


@given(data=st.data())
def test_any_cursor_leaves_a_working_reader_and_a_valid_cursor(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path, cursor = Path(tmp) / "kern.log", Path(tmp) / "cursor.json"
        path.write_bytes(LOG)
        st_ = path.stat()
        cursor.write_bytes(data.draw(_cursors(str(path), st_.st_dev, st_.st_ino, st_.st_size)))
        with bounded_memory(), KmsgReader(path, cursor, boot_id_path=None) as reader:
            events = reader.poll()
        with KmsgReader(path, None, boot_id_path=None) as reference:
            full = _key(reference.poll())
        # history from some line on: all of it, or what a valid cursor had not covered yet
        assert _key(events) == full[len(full) - len(events) :]
        saved = json.loads(cursor.read_text())
        assert saved["offset"] == len(LOG) and saved["seq"] == 3 and saved["inode"] == st_.st_ino
        with path.open("ab") as fh:
            fh.write(XID)
        with KmsgReader(path, cursor, boot_id_path=None) as again:
            assert [e.xid for e in again.poll()] == [13]  # exactly the new line: the feature works on
