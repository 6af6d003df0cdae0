"""Tests for the kernel-log Xid parser (exporter.supervisor.xid.parse) and the cursor-keeping reader
(exporter.supervisor.xid.reader); the NVML/kernel dedupe is tests/test_xid_dedupe.py."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_kmsg import BOOT_ID, BOOT_WALL, FIXTURES, FakeKmsg, device_reader, kmsg_records, xids

from exporter.supervisor.xid.parse import (
    KernelXidEvent,
    KernelXidParser,
    normalize_pci_bus_id,
    parse_kmsg_record,
    parse_line,
)
from exporter.supervisor.xid.reader import KernelLogUnavailable, KmsgReader


@pytest.fixture
def cursor(tmp_path: Path) -> Path:
    return tmp_path / "kmsg.cursor.json"


# -- bus ids and records ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PCI:0000:00:06", "00000000:00:06.0"),
        ("0000:00:06", "00000000:00:06.0"),
        ("0000:3b:00.0", "00000000:3B:00.0"),
        ("00000000:3B:00.0", "00000000:3B:00.0"),
        ("0018:01:00", "00000018:01:00.0"),
        ("01:00", "00000000:01:00.0"),
        ("pci:0000:00:07.1", "00000000:00:07.1"),
    ],
)
def test_normalize_pci_bus_id(text: str, expected: str) -> None:
    assert normalize_pci_bus_id(text) == expected


@pytest.mark.parametrize("text", ["", "GPU-1234", "0000:00:6", "0000:00:06.9", "zz:00:06"])
def test_normalize_pci_bus_id_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a PCI bus id"):
        normalize_pci_bus_id(text)


def test_parse_kmsg_record_header_dictionary_and_escapes() -> None:
    record = parse_kmsg_record(b"12,4711,864021334,-,caller=T12;NVRM: tab\\x09here\n SUBSYSTEM=pci\n DEVICE=+pci:x\n")
    assert record is not None
    assert (record.facility, record.level, record.seq, record.boot_time_us) == (
        1,
        4,
        4711,
        864021334,
    )
    assert record.flags == "-"
    assert record.message == "NVRM: tab\there"


def test_parse_kmsg_record_rejects_garbage() -> None:
    assert parse_kmsg_record("not a record") is None
    assert parse_kmsg_record(b"4,x,1,-;msg") is None


# -- single lines ---------------------------------------------------------------------------


def test_parse_line_brief_example() -> None:
    line = "NVRM: Xid (PCI:0000:00:06): 13, pid=1234, name=python3, Graphics SM Warp Exception ..."
    assert parse_line(line) == KernelXidEvent(
        seq=None,
        boot_time_us=None,
        pci_bus_id="00000000:00:06.0",
        xid=13,
        pid=1234,
        process_name="python3",
        message=line,
        extended={},
    )


@pytest.mark.parametrize(
    ("line", "xid", "pid", "name"),
    [
        ("NVRM: Xid (PCI:0000:00:06): 31, Ch 00000010, intr 10000000", 31, None, None),
        (
            "NVRM: Xid (0000:01:00): 31, Ch 0000000b, engmask 00000120, intr 10000000",
            31,
            None,
            None,
        ),
        (
            "NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            79,
            None,
            None,
        ),
        (
            "NVRM: Xid (PCI:0000:00:06): 43, pid=48211, name=python3, Ch 00000018",
            43,
            48211,
            "python3",
        ),
        ("NVRM: Xid (PCI:0000:00:06): 45, pid=17, name=pt_main_thread", 45, 17, "pt_main_thread"),
        (
            "NVRM: Xid (PCI:0000:00:06): 119, pid=3, Timeout after 6s of waiting for RPC",
            119,
            3,
            None,
        ),
        (
            "NVRM: Xid (PCI:0000:00:06): 154, GPU recovery action changed from 0x0 (None)",
            154,
            None,
            None,
        ),
    ],
)
def test_parse_line_variants(line: str, xid: int, pid: int | None, name: str | None) -> None:
    event = parse_line(line)
    assert event is not None
    assert (event.xid, event.pid, event.process_name) == (xid, pid, name)
    assert event.extended == {} and not event.fallen_off_bus


def test_parse_line_prefixes_dmesg_and_journal() -> None:
    dmesg = parse_line("[  864.021334] NVRM: Xid (PCI:0000:00:06): 13, pid=1, name=a, x")
    assert dmesg is not None and dmesg.boot_time_us == 864_021_334 and dmesg.wall_time is None
    journal = parse_line("2026-03-14T09:26:51.021334+0000 gpu-node-a kernel: NVRM: Xid (PCI:0000:00:06): 31, x")
    assert journal is not None and journal.xid == 31
    assert journal.wall_time == pytest.approx(1_773_480_411.021334)
    nanos = parse_line("2026-03-14T09:26:51,021334999Z host kernel: NVRM: Xid (PCI:0000:00:06): 8, z")
    assert nanos is not None and nanos.wall_time == pytest.approx(1_773_480_411.021334)
    naive = parse_line("2026-03-14T09:26:51 host kernel: NVRM: Xid (PCI:0000:00:06): 8, no zone")
    assert naive is not None and naive.wall_time is None
    syslog = parse_line("Mar 14 09:26:51 gpu-node-a kernel: [  864.02] NVRM: Xid (PCI:0000:00:06): 43, y")
    assert syslog is not None and (syslog.xid, syslog.boot_time_us) == (43, 864_020_000)


def test_parse_line_ignores_user_facility_records() -> None:
    assert parse_line("12,9,1,-;NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.") is None
    assert parse_line("4,9,1,-;NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.") is not None


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: GPU at PCI:0000:00:06: GPU-6b0c5e4e-3f1a-4c8e-9d7b-2a51f0c3e8d1",
        "NVRM: Xid mentioned in prose",
        "nvidia 0000:00:06.0: enabling device (0000 -> 0002)",
        "NVRM: fallen off the bus and is not responding to commands.",  # no bus id, no context
        "",
    ],
)
def test_parse_line_noise(line: str) -> None:
    assert parse_line(line) is None


def test_nvlink5_extended_fields() -> None:
    event = parse_line(
        "NVRM: Xid (PCI:0019:01:00): 144, pid=90210, name=python3, SAW_MVB Fatal XC1 i0 Link 07 "
        "(0x00000001 0x00000002 0x00000000 0x00000000)"
    )
    assert event is not None
    assert (event.pci_bus_id, event.xid, event.pid, event.process_name) == (
        "00000019:01:00.0",
        144,
        90210,
        "python3",
    )
    assert dict(event.extended) == {
        "unit": "SAW_MVB",
        "severity": "Fatal",
        "containment": "XC1",
        "injected": "i0",
        "link": "7",
        "intrinfo": "0x00000001",
        "error_status": "0x00000002",
        "extra": "0x00000000 0x00000000",
    }


def test_nvlink5_subunit_and_negative_link() -> None:
    event = parse_line(
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT/NETIR_LINK_DOWN Fatal XC0 i0 Link -1 (0x02500011 0x00000000)"
    )
    assert event is not None
    assert event.extended["unit"] == "NETIR_LINK_EVT/NETIR_LINK_DOWN"
    assert event.extended["link"] == "-1"
    assert "extra" not in event.extended


def test_extended_mapping_is_read_only() -> None:
    event = parse_line("NVRM: Xid (PCI:0018:01:00): 147, TREX Nonfatal XC0 i0 Link 00 (0x0e 0x01)")
    assert event is not None
    with pytest.raises(TypeError):
        event.extended["unit"] = "x"  # type: ignore[index]


@pytest.mark.parametrize(
    ("line", "bus"),
    [
        ("NVRM: GPU at PCI:0000:00:06: GPU has fallen off the bus.", "00000000:00:06.0"),
        ("NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.", "00000000:18:00.0"),
        (
            "NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:2335) installed in this system has "
            "fallen off the bus and is not responding to commands.",
            "00000000:3B:00.0",
        ),
    ],
)
def test_fallen_off_the_bus_lines_are_xid_79(line: str, bus: str) -> None:
    event = parse_line(line)
    assert event is not None
    assert (event.xid, event.pci_bus_id, event.fallen_off_bus, event.pid) == (79, bus, True, None)


def test_parser_joins_two_line_fallen_off_message_only_when_close() -> None:
    parser = KernelXidParser()
    assert parser.feed("NVRM: The NVIDIA GPU 0000:00:07.0", seq=10) is None
    assert parser.feed("NVRM: (PCI ID: 10de:2335) installed in this system has", seq=11) is None
    event = parser.feed("NVRM: fallen off the bus and is not responding to commands.", seq=12)
    assert event is not None and event.pci_bus_id == "00000000:00:07.0" and event.seq == 12

    far = KernelXidParser()
    far.feed("NVRM: The NVIDIA GPU 0000:00:07.0", seq=10)
    assert far.feed("NVRM: fallen off the bus and is not responding to commands.", seq=40) is None


def test_parser_counts_one_loss_once_but_a_later_one_again() -> None:
    parser = KernelXidParser()
    first = parser.feed("NVRM: GPU at PCI:0000:00:06: GPU has fallen off the bus.", boot_time_us=1_000_000)
    dup = parser.feed("NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.", boot_time_us=1_000_050)
    other_gpu = parser.feed("NVRM: Xid (PCI:0000:00:07): 79, GPU has fallen off the bus.", boot_time_us=1_000_060)
    later = parser.feed("NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.", boot_time_us=900_000_000)
    assert first is not None and first.fallen_off_bus
    assert dup is None
    assert other_gpu is not None and not other_gpu.fallen_off_bus
    assert later is not None


# -- reader on text files ----------------------------------------------------------------------


def test_file_reader_boot_fixture(cursor: Path) -> None:
    with KmsgReader(FIXTURES / "boot_xid13_31_43.kmsg", cursor, boot_wall_time=BOOT_WALL) as reader:
        events = reader.poll()
    assert xids(events) == [13, 13, 31, 43]  # the userspace-written Xid 79 is not counted
    assert {(e.pid, e.process_name, e.pci_bus_id) for e in events} == {(48211, "python3", "00000000:00:06.0")}
    assert [e.seq for e in events] == [17, 18, 19, 21]  # line numbers in text mode
    assert events[0].boot_time_us == 864_021_334
    assert events[0].wall_time == pytest.approx(BOOT_WALL + 864.021334)
    assert events[-1].message == "NVRM: Xid (PCI:0000:00:06): 43, pid=48211, name=python3, Ch 00000018"


def test_file_reader_fixtures_end_to_end(tmp_path: Path) -> None:
    def read(name: str) -> list[KernelXidEvent]:
        with KmsgReader(FIXTURES / name, tmp_path / f"{name}.cursor") as reader:
            return reader.poll()

    nvlink = read("nvlink5_xid144.kmsg")
    assert xids(nvlink) == [144, 144, 149, 149]
    assert [e.extended.get("severity") for e in nvlink] == ["Nonfatal", "Fatal", "Fatal", None]
    assert nvlink[0].pci_bus_id == "00000018:01:00.0" and nvlink[0].extended["link"] == "-1"

    fallen = read("fallen_off_bus.kmsg")
    assert [(e.xid, e.pci_bus_id, e.fallen_off_bus) for e in fallen] == [
        (79, "00000000:00:06.0", True),
        (79, "00000000:00:07.0", True),
        (79, "00000000:00:08.0", True),
    ]

    assert read("noise.kmsg") == []

    journal = read("journal_short_iso.txt")
    assert xids(journal) == [13, 31, 43]
    assert journal[0].wall_time == pytest.approx(1_773_480_411.021334)

    story = read("dmesg_story.txt")
    assert xids(story) == [13, 31, 43, 13]
    assert story[-1].pid is None and story[-1].boot_time_us == 900_000_000


def test_file_reader_cursor_resumes_and_waits_for_complete_lines(tmp_path: Path, cursor: Path) -> None:
    log_file = tmp_path / "kern.log"
    log_file.write_text("[ 1.0] NVRM: Xid (PCI:0000:00:06): 13, a\n[ 2.0] NVRM: Xid (PCI:0000:00:06): 31, b")
    with KmsgReader(log_file, cursor) as reader:
        assert xids(reader.poll()) == [13]  # the second line has no newline yet
    with KmsgReader(log_file, cursor) as reader:  # restart: nothing new, nothing twice
        assert reader.poll() == []
        with log_file.open("a") as handle:
            handle.write("\n[ 3.0] NVRM: Xid (PCI:0000:00:06): 43, c\n")
        events = reader.poll()
    assert xids(events) == [31, 43]
    assert [e.seq for e in events] == [2, 3]
    saved = json.loads(cursor.read_text())
    assert saved["kind"] == "file" and saved["seq"] == 3 and saved["offset"] == log_file.stat().st_size


def test_file_reader_starts_over_after_rotation_or_truncation(tmp_path: Path, cursor: Path) -> None:
    log_file = tmp_path / "kern.log"
    log_file.write_text("NVRM: Xid (PCI:0000:00:06): 13, a\nNVRM: Xid (PCI:0000:00:06): 31, b\n")
    with KmsgReader(log_file, cursor) as reader:
        assert xids(reader.poll()) == [13, 31]
        log_file.write_text("NVRM: Xid (PCI:0000:00:06): 48, c\n")  # truncated in place
        assert xids(reader.poll()) == [48]
    rotated = tmp_path / "kern.log.new"
    rotated.write_text("NVRM: Xid (PCI:0000:00:06): 79, d\n")
    os.replace(rotated, log_file)  # new inode, the cursor's identity no longer matches
    with KmsgReader(log_file, cursor) as reader:
        assert xids(reader.poll()) == [79]


def test_commit_false_keeps_cursor_until_commit(tmp_path: Path, cursor: Path) -> None:
    log_file = tmp_path / "kern.log"
    log_file.write_text("NVRM: Xid (PCI:0000:00:06): 13, a\n")
    with KmsgReader(log_file, cursor) as reader:
        assert xids(reader.poll(commit=False)) == [13]
        assert not cursor.exists()
        reader.commit()
    assert cursor.exists()


# -- reader on a character device ------------------------------------------------------------


def test_device_reader_history_then_only_new(cursor: Path) -> None:
    fake = FakeKmsg(kmsg_records(FIXTURES / "boot_xid13_31_43.kmsg"))
    with device_reader(fake, cursor) as reader:
        events = reader.poll()
        assert xids(events) == [13, 13, 31, 43]
        assert [e.seq for e in events] == [1203, 1204, 1205, 1207]
        assert events[2].wall_time == pytest.approx(BOOT_WALL + 864.022016)
        assert reader.poll() == []
        fake.append("4,1210,900000000,-;NVRM: Xid (PCI:0000:00:06): 13, pid=5, name=b, again\n")
        assert [e.seq for e in reader.poll()] == [1210]
    saved = json.loads(cursor.read_text())
    assert (saved["kind"], saved["seq"], saved["boot_id"]) == ("device", 1210, BOOT_ID)

    # A restart re-reads the buffer from its start and skips what the cursor covers.
    fake.reads.clear()
    with device_reader(fake, cursor) as reader:
        assert reader.poll() == []
        assert reader.poll() == []
    fake.append("4,1211,900000100,-;NVRM: Xid (PCI:0000:00:06): 31, pid=5, name=b, next\n")
    fake.reads.clear()
    with device_reader(fake, cursor) as reader:
        assert [e.seq for e in reader.poll()] == [1211]


def test_device_reader_overwritten_records(cursor: Path) -> None:
    fake = FakeKmsg(kmsg_records(FIXTURES / "overwritten.kmsg"))
    with device_reader(fake, cursor) as reader:
        events = reader.poll()
        assert xids(events) == [13, 31, 43]
        assert [e.pid for e in events] == [7001, 7002, 7002]
        assert (reader.overruns, reader.records_lost, reader.records_read) == (1, 147, 6)


def test_device_reader_cursor_older_than_buffer_counts_loss(cursor: Path) -> None:
    cursor.write_text(json.dumps({"version": 1, "path": "/dev/null", "kind": "device", "boot_id": BOOT_ID, "seq": 150}))
    fake = FakeKmsg(kmsg_records(FIXTURES / "overwritten.kmsg")[3:])  # buffer now starts at 250
    with device_reader(fake, cursor) as reader:
        assert xids(reader.poll()) == [31, 43]
        assert reader.records_lost == 99


def test_device_reader_other_boot_id_counts_history_again(cursor: Path) -> None:
    fake = FakeKmsg(kmsg_records(FIXTURES / "overwritten.kmsg"))
    cursor.write_text(
        json.dumps({"version": 1, "path": "/dev/null", "kind": "device", "boot_id": "old-boot", "seq": 252})
    )
    with device_reader(fake, cursor) as reader:
        assert xids(reader.poll()) == [13, 31, 43]


def test_device_reader_unknown_boot_id_detects_reboot_by_sequence(cursor: Path) -> None:
    fake = FakeKmsg(kmsg_records(FIXTURES / "overwritten.kmsg"))
    cursor.write_text(json.dumps({"version": 1, "path": "/dev/null", "kind": "device", "boot_id": None, "seq": 90000}))
    with device_reader(fake, cursor, boot_id_path=None) as reader:
        assert xids(reader.poll()) == [13, 31, 43]
        assert reader.poll() == []


def test_device_reader_same_boot_unknown_id_skips_covered(cursor: Path) -> None:
    fake = FakeKmsg(kmsg_records(FIXTURES / "overwritten.kmsg"))
    cursor.write_text(json.dumps({"version": 1, "path": "/dev/null", "kind": "device", "boot_id": None, "seq": 251}))
    with device_reader(fake, cursor, boot_id_path=None) as reader:
        assert xids(reader.poll()) == [43]


@pytest.mark.parametrize("content", ["{", "[]", '{"version": 9}', '{"version": 1, "path": "/other", "seq": 5}'])
def test_bad_or_foreign_cursor_means_history(cursor: Path, content: str) -> None:
    cursor.write_text(content)
    fake = FakeKmsg(kmsg_records(FIXTURES / "overwritten.kmsg"))
    with device_reader(fake, cursor) as reader:
        assert xids(reader.poll()) == [13, 31, 43]


def test_no_cursor_path_keeps_position_in_memory() -> None:
    fake = FakeKmsg(kmsg_records(FIXTURES / "overwritten.kmsg"))
    reader = device_reader(fake, None)
    with reader:
        assert xids(reader.poll()) == [13, 31, 43]
        assert reader.poll() == []
    fake.append("4,253,610000300,-;NVRM: Xid (PCI:0000:00:06): 45, pid=7002, name=trainer\n")
    fake.reads.clear()  # a new open of /dev/kmsg starts at the oldest record again
    with reader:
        assert xids(reader.poll()) == [45]


def test_unwritable_cursor_warns_once_and_keeps_reading(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "missing-dir" / "cursor.json"
    fake = FakeKmsg(kmsg_records(FIXTURES / "overwritten.kmsg"))
    with (
        caplog.at_level(logging.WARNING, logger="exporter.supervisor.xid.kmsg"),
        device_reader(fake, blocked) as reader,
    ):
        assert xids(reader.poll()) == [13, 31, 43]
        fake.append("4,253,610000300,-;NVRM: Xid (PCI:0000:00:06): 45, pid=7002, name=trainer\n")
        assert xids(reader.poll()) == [45]
    assert sum("cannot save kernel-log cursor" in r.message for r in caplog.records) == 1


def test_boot_wall_time_from_uptime_and_clock(tmp_path: Path) -> None:
    uptime = tmp_path / "uptime"
    uptime.write_text("1000.50 3900.00\n")
    fake = FakeKmsg(kmsg_records(FIXTURES / "overwritten.kmsg"))
    reader = KmsgReader(
        "/dev/null",
        None,
        uptime_path=str(uptime),
        clock=lambda: 1_800_000_000.5,
        boot_id_path=None,
        read_fn=fake.read,
        devices=None,
    )
    with reader:
        events = reader.poll()
    assert reader.boot_wall_time == pytest.approx(1_799_999_000.0)
    assert events[0].wall_time == pytest.approx(1_799_999_000.0 + 500.0)


# -- unavailable ------------------------------------------------------------------------------


def test_missing_path_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(KernelLogUnavailable, match="cannot open") as caught:
        KmsgReader(tmp_path / "nope").open()
    assert caught.value.path.endswith("nope")


def test_directory_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(KernelLogUnavailable, match="is a directory: expected /dev/kmsg or a regular text file"):
        KmsgReader(tmp_path).open()


def test_a_fifo_or_another_device_is_refused_at_open_without_blocking(tmp_path: Path) -> None:
    """A FIFO at NVGPU_KMSG_PATH is refused at once (opened with O_NONBLOCK, then fstat); so is a
    character device other than /dev/kmsg (1:11), unless the caller accepts any (devices=None)."""
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    with pytest.raises(KernelLogUnavailable, match="is a FIFO: expected /dev/kmsg"):
        KmsgReader(fifo).open()
    with pytest.raises(KernelLogUnavailable, match=r"character device 1:3, not /dev/kmsg \(1:11\)"):
        KmsgReader("/dev/null").open()
    with KmsgReader("/dev/null", devices=None) as reader:
        assert reader.fileno() >= 0


def test_read_error_is_unavailable() -> None:
    def denied(fd: int, size: int) -> bytes:
        raise PermissionError(1, "Operation not permitted")

    reader = KmsgReader("/dev/null", None, read_fn=denied, boot_id_path=None, devices=None)
    with pytest.raises(KernelLogUnavailable, match="read failed: Operation not permitted"):
        reader.poll()
    reader.close()


def test_fileno_requires_open() -> None:
    with pytest.raises(KernelLogUnavailable, match="not open"):
        KmsgReader("/dev/null").fileno()


@pytest.fixture
def real_kmsg() -> Iterator[str]:
    path = "/dev/kmsg"
    if not os.path.exists(path):
        pytest.skip("no /dev/kmsg on this machine")
    yield path


def test_real_dev_kmsg(real_kmsg: str, cursor: Path) -> None:
    """The real device: non-blocking open, EAGAIN at the end, cursor with the real boot id."""
    try:
        with KmsgReader(real_kmsg, cursor) as reader:
            reader.poll()
            first_read = reader.records_read
            assert reader.fileno() >= 0
    except KernelLogUnavailable as exc:  # e.g. dmesg_restrict without CAP_SYSLOG in a container
        pytest.skip(f"/dev/kmsg not readable here: {exc.reason}")
    assert first_read > 0
    saved = json.loads(cursor.read_text())
    assert saved["kind"] == "device" and isinstance(saved["seq"], int)
    boot_id = Path("/proc/sys/kernel/random/boot_id")
    if boot_id.exists():
        assert saved["boot_id"] == boot_id.read_text().strip()
    with KmsgReader(real_kmsg, cursor) as reader:
        again = reader.poll()
    assert all(e.seq is not None and e.seq > saved["seq"] for e in again)
