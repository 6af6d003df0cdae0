"""Kernel-log Xid parser and a cursor-keeping reader for ``/dev/kmsg`` or a text log.

What the NVIDIA driver writes, and what this module recognises (formats written from the driver's
observed output, our own regular expressions):

- ``NVRM: Xid (PCI:0000:00:06): 13, pid=1234, name=python3, Graphics SM Warp Exception ...``;
  ``pid``/``name`` are optional, ``pid='<unknown>', name=<unknown>`` appears for kernel
  contexts, and older drivers omit the ``PCI:`` prefix.
- The NVLink5 (Blackwell) form of Xid 144-150, which after the optional pid/name carries
  ``<UNIT>[/<SUBUNIT>] <Fatal|Nonfatal> XC<n> i<n> Link <n> (<intrinfo> <error status> [...])``
  (documented in NVIDIA's Xid catalog, sheet "XID 144-150 Decode"); the fields land in
  `KernelXidEvent.extended`.
- "GPU has fallen off the bus" lines without an Xid number (``NVRM: GPU at PCI:0000:00:06: GPU has
  fallen off the bus.``, ``NVRM: GPU 0000:00:06.0: GPU has fallen off the bus.`` and the two-line
  ``The NVIDIA GPU 0000:00:06.0 ... has fallen off the bus and is not responding to commands.``):
  reported as Xid 79 with ``fallen_off_bus=True``. Several 79 reports for one GPU within
  `FALLEN_OFF_DEDUPE_S` count once (the driver logs the Xid line and the plain line for one loss).

Record format of ``/dev/kmsg`` (Linux ``Documentation/ABI/testing/dev-kmsg``): one record per
``read()``, ``<prio>,<seq>,<usec since boot>,<flags>[,...];<message>\\n`` followed by optional
``\\n KEY=value`` dictionary lines; non-printable bytes in the message are escaped as ``\\xNN``.
``read()`` returns ``EAGAIN`` (non-blocking) when no record is left and ``EPIPE`` once when records
were overwritten before being read; the next read continues at the oldest record still present.
The facility is ``prio >> 3``; userspace cannot write facility 0 (kernel), so records with another
facility are ignored: a process that writes a fake ``NVRM: Xid`` line into ``/dev/kmsg`` cannot
raise our counters.

Standard library only.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import os
import re
import stat
import time
import types
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Final, Literal, NamedTuple

from exporter.xid.cursor import Cursor

__all__ = [
    "BOOT_ID_PATH",
    "DEFAULT_KMSG_PATH",
    "FALLEN_OFF_DEDUPE_S",
    "UPTIME_PATH",
    "KernelLogUnavailable",
    "KernelXidEvent",
    "KernelXidParser",
    "KmsgReader",
    "KmsgRecord",
    "XidDeduplicator",
    "XidSighting",
    "dedupe",
    "normalize_pci_bus_id",
    "parse_kmsg_record",
    "parse_line",
]

log = logging.getLogger(__name__)

DEFAULT_KMSG_PATH: Final = "/dev/kmsg"
BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"
UPTIME_PATH: Final = "/proc/uptime"
FALLEN_OFF_DEDUPE_S: Final = 10.0
"""Xid 79 reports for one GPU closer than this (kernel time) are one event."""
_FALLEN_OFF_DEDUPE_RECORDS: Final = 50  # same, by record distance, when a line has no time
_MULTILINE_SPAN: Final = 5  # records between "The NVIDIA GPU <bdf>" and "... fallen off the bus"
_READ_SIZE: Final = 16384  # larger than any printk record (the kernel caps a line near 1 KiB)
_MAX_LINE: Final = 16384  # a text-log line longer than this is not a kernel message: dropped unread
_FILE_CHUNK: Final = 1 << 20  # text logs are read in chunks of this size ...
_POLL_BYTES: Final = 4 << 20  # ... and at most this much per poll (the rest waits for the next poll)
_POLL_READS: Final = 16384  # /dev/kmsg: at most this many read() calls per poll

_EMPTY: Final[Mapping[str, str]] = types.MappingProxyType({})

# Bus id as the driver prints it: domain:bus:device with optional .function; old lines have no
# domain. The domain has 4 hex digits on most hosts, more on large ones (0018 on GB200).
_BDF: Final = r"(?:[0-9A-Fa-f]{1,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
_XID_RE: Final = re.compile(rf"NVRM: Xid \((?:PCI:)?(?P<bus>{_BDF})\): (?P<xid>\d+)(?:,\s*(?P<rest>.*?))?\s*$")
_PID_NAME_RE: Final = re.compile(r"pid=(?P<pid>'?<unknown>'?|\d+)(?:,\s*name=(?P<name>[^,]*?))?(?:,\s*(?P<tail>.*))?$")
_NVLINK5_RE: Final = re.compile(
    r"(?P<unit>[A-Z][A-Z0-9_]*(?:/[A-Z][A-Z0-9_]*)?)\s+(?P<severity>Fatal|Nonfatal)\s+"
    r"(?P<containment>XC\d+)\s+(?P<injected>i\d+)\s+Link\s+(?P<link>-?\d+)\s+"
    r"\((?P<intrinfo>0x[0-9A-Fa-f]+)\s+(?P<error_status>0x[0-9A-Fa-f]+)"
    r"(?P<extra>(?:\s+0x[0-9A-Fa-f]+)*)\s*\)"
)
_FALLEN_RE: Final = re.compile(r"fallen off the bus", re.IGNORECASE)
_GPU_ANNOUNCE_RE: Final = re.compile(rf"NVRM: The NVIDIA GPU (?P<bus>{_BDF})\b")
_FALLEN_BUS_RES: Final = (
    re.compile(rf"NVRM: GPU at PCI:(?P<bus>{_BDF}): "),
    re.compile(rf"NVRM: GPU (?P<bus>{_BDF}): "),
    _GPU_ANNOUNCE_RE,
)
_KMSG_HEADER_RE: Final = re.compile(r"(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),(?P<flags>[^,;]*)(?:,[^;]*)?;")
_DMESG_TIME_RE: Final = re.compile(r"\[\s*(?P<sec>\d+)\.(?P<frac>\d{1,9})\]")
_ISO_TIME_RE: Final = re.compile(
    r"^(?P<ts>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?)"
    r"(?P<tz>Z|[+-]\d{2}:?\d{2})?\s"
)
_ESCAPE_RE: Final = re.compile(r"\\x([0-9A-Fa-f]{2})")


class KernelLogUnavailable(Exception):
    """The kernel log cannot be opened or read; the caller logs once and marks it unsupported.

    Attributes:
        path: the path that failed.
        reason: a short human explanation, including the OS error where there was one.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"kernel log {path!r} unavailable: {reason}")
        self.path = path
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class KernelXidEvent:
    """One Xid found in the kernel log.

    Attributes:
        seq: kmsg record sequence number, or the 1-based line number for a text file; None when
            the caller parsed a single line without position.
        boot_time_us: microseconds since boot when the record or line carries it.
        pci_bus_id: the GPU's bus id in NVML's form (``00000000:00:06.0``), to map to a UUID.
        xid: the Xid number (79 for a fallen-off-the-bus line).
        pid: process id when the line names one.
        process_name: process name when the line names one.
        message: the driver's message from ``NVRM:`` on, unescaped.
        extended: NVLink5 fields (``unit``, ``severity``, ``containment``, ``injected``, ``link``,
            ``intrinfo``, ``error_status``, ``extra``) when the line has that form, else empty.
        wall_time: Unix time of the event (boot wall time + ``boot_time_us``, or the timestamp a
            journal line carries), None when unknown.
        fallen_off_bus: True when the event comes from a "fallen off the bus" line without an
            Xid number.
    """

    seq: int | None
    boot_time_us: int | None
    pci_bus_id: str
    xid: int
    pid: int | None
    process_name: str | None
    message: str
    extended: Mapping[str, str]
    wall_time: float | None = None
    fallen_off_bus: bool = False


class KmsgRecord(NamedTuple):
    """One ``/dev/kmsg`` record.

    Attributes:
        facility: syslog facility (0 = kernel).
        level: syslog level (0 emerg .. 7 debug).
        seq: record sequence number (64-bit, restarts at boot).
        boot_time_us: microseconds since boot.
        flags: ``-`` for a normal record, ``c``/``+`` for continuation fragments.
        message: the message text, ``\\xNN`` escapes decoded, without the dictionary lines.
    """

    facility: int
    level: int
    seq: int
    boot_time_us: int
    flags: str
    message: str


def normalize_pci_bus_id(text: str) -> str:
    """Converts a bus id as the kernel prints it to NVML's ``busId`` form.

    ``PCI:0000:00:06`` and ``0000:00:06.0`` become ``00000000:00:06.0``; ``0018:01:00`` becomes
    ``00000018:01:00.0``; a missing domain is 0 and a missing function is 0. Hex digits are upper
    case, as ``nvmlDeviceGetPciInfo().busId`` reports them.

    Args:
        text: the bus id, optionally prefixed with ``PCI:``.

    Returns:
        ``DDDDDDDD:BB:DD.F``.

    Raises:
        ValueError: the text is not a bus id.
    """
    raw = text.strip()
    if raw[:4].upper() == "PCI:":
        raw = raw[4:]
    if not re.fullmatch(_BDF, raw):
        raise ValueError(f"not a PCI bus id: {text!r}")
    function = 0
    if "." in raw:
        raw, fn = raw.rsplit(".", 1)
        function = int(fn)
    parts = raw.split(":")
    domain = int(parts[0], 16) if len(parts) == 3 else 0
    bus, device = int(parts[-2], 16), int(parts[-1], 16)
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function}"


def _unescape(message: str) -> str:
    return _ESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), message)


def parse_kmsg_record(raw: bytes | str) -> KmsgRecord | None:
    """Parses one ``/dev/kmsg`` record.

    Args:
        raw: what one ``read()`` returned (or one line of a saved kmsg dump).

    Returns:
        The record, or None when the header is malformed.
    """
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    match = _KMSG_HEADER_RE.match(text)
    if match is None:
        return None
    prio = int(match["prio"])
    body = text[match.end() :].split("\n", 1)[0]  # dictionary lines follow the first newline
    return KmsgRecord(
        facility=prio >> 3,
        level=prio & 7,
        seq=int(match["seq"]),
        boot_time_us=int(match["usec"]),
        flags=match["flags"],
        message=_unescape(body.rstrip("\r")),
    )


def _pid(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _name(text: str | None) -> str | None:
    if text is None:
        return None
    name = text.strip().strip("'\"")
    return None if not name or name == "<unknown>" else name


def _parse_xid(message: str) -> KernelXidEvent | None:
    match = _XID_RE.search(message)
    if match is None:
        return None
    try:
        bus = normalize_pci_bus_id(match["bus"])
    except ValueError:  # pragma: no cover - the regex only admits bus ids
        return None
    pid: int | None = None
    name: str | None = None
    tail = match["rest"] or ""
    pid_match = _PID_NAME_RE.match(tail)
    if pid_match is not None:
        pid, name = _pid(pid_match["pid"]), _name(pid_match["name"])
        tail = pid_match["tail"] or ""
    extended: Mapping[str, str] = _EMPTY
    nvlink = _NVLINK5_RE.match(tail)
    if nvlink is not None:
        fields = {key: value for key, value in nvlink.groupdict().items() if key != "extra"}
        fields["link"] = str(int(fields["link"]))  # "08" -> "8", "-1" stays
        extra = " ".join(nvlink["extra"].split())
        if extra:
            fields["extra"] = extra
        extended = types.MappingProxyType(fields)
    return KernelXidEvent(
        seq=None,
        boot_time_us=None,
        pci_bus_id=bus,
        xid=int(match["xid"]),
        pid=pid,
        process_name=name,
        message=message[match.start() :].strip(),
        extended=extended,
    )


class KernelXidParser:
    """Turns kernel-log messages into `KernelXidEvent` values, keeping the little state needed.

    State: the bus id announced by a "The NVIDIA GPU <bdf>" line (the driver may print the rest
    of the fallen-off message on the next line), and the last Xid 79 per GPU so that the Xid line
    and the plain fallen-off line of one loss count once.
    """

    def __init__(self) -> None:
        self._announced: tuple[str, int | None] | None = None  # (bus id, seq of the line)
        self._last_79: dict[str, tuple[int | None, int | None]] = {}  # bus -> (boot us, seq)

    def feed(
        self,
        message: str,
        *,
        seq: int | None = None,
        boot_time_us: int | None = None,
        wall_time: float | None = None,
    ) -> KernelXidEvent | None:
        """Parses one message (the text after the record header or the line prefix).

        Args:
            message: kernel message text; only ``NVRM:`` messages can produce events.
            seq: record sequence number or line number, if known.
            boot_time_us: microseconds since boot, if known.
            wall_time: Unix time of the message, if known.

        Returns:
            The Xid event, or None (not an Xid, or a repeated report of a lost GPU).
        """
        if "NVRM:" not in message:
            return None
        event = _parse_xid(message)
        if event is None:
            event = self._fallen_off(message, seq)
        if event is None:
            return None
        event = dataclasses.replace(event, seq=seq, boot_time_us=boot_time_us, wall_time=wall_time)
        if event.xid == 79 and self._repeat_79(event):
            return None
        return event

    def _fallen_off(self, message: str, seq: int | None) -> KernelXidEvent | None:
        if not _FALLEN_RE.search(message):
            announce = _GPU_ANNOUNCE_RE.search(message)
            if announce is not None:
                self._announced = (normalize_pci_bus_id(announce["bus"]), seq)
            return None
        bus: str | None = None
        for pattern in _FALLEN_BUS_RES:
            found = pattern.search(message)
            if found is not None:
                bus = normalize_pci_bus_id(found["bus"])
                break
        if bus is None and self._announced is not None:
            announced_bus, announced_seq = self._announced
            if seq is None or announced_seq is None or 0 < seq - announced_seq <= _MULTILINE_SPAN:
                bus = announced_bus
        self._announced = None
        if bus is None:
            log.debug("fallen-off-the-bus line without a bus id ignored: %s", message)
            return None
        start = message.find("NVRM:")
        return KernelXidEvent(
            seq=None,
            boot_time_us=None,
            pci_bus_id=bus,
            xid=79,
            pid=None,
            process_name=None,
            message=message[start:].strip(),
            extended=_EMPTY,
            fallen_off_bus=True,
        )

    def _repeat_79(self, event: KernelXidEvent) -> bool:
        previous = self._last_79.get(event.pci_bus_id)
        self._last_79[event.pci_bus_id] = (event.boot_time_us, event.seq)
        if previous is None:
            return False
        prev_us, prev_seq = previous
        if prev_us is not None and event.boot_time_us is not None:
            return 0 <= event.boot_time_us - prev_us <= FALLEN_OFF_DEDUPE_S * 1_000_000
        if prev_seq is not None and event.seq is not None:
            return 0 <= event.seq - prev_seq <= _FALLEN_OFF_DEDUPE_RECORDS
        return False


def _split_text_line(line: str) -> tuple[str, int | None, float | None, bool]:
    """Splits a text log line into (message, boot us, wall time, is kernel)."""
    record = parse_kmsg_record(line)
    if record is not None:
        return record.message, record.boot_time_us, None, record.facility == 0
    start = line.find("NVRM:")
    if start < 0:
        return line, None, None, True
    prefix = line[:start]
    boot_us: int | None = None
    dmesg = _DMESG_TIME_RE.search(prefix)
    if dmesg is not None:
        boot_us = int(dmesg["sec"]) * 1_000_000 + int(dmesg["frac"].ljust(6, "0")[:6])
    wall: float | None = None
    iso = _ISO_TIME_RE.match(prefix)
    if iso is not None:
        tz = iso["tz"] or ""
        if tz and tz != "Z" and ":" not in tz:
            tz = f"{tz[:3]}:{tz[3:]}"
        stamp_text = iso["ts"].replace(",", ".")
        if "." in stamp_text:  # Python 3.10 accepts only 3 or 6 fractional digits
            whole, fraction = stamp_text.split(".")
            stamp_text = f"{whole}.{fraction[:6].ljust(6, '0')}"
        try:
            stamp = _dt.datetime.fromisoformat(stamp_text + tz.replace("Z", "+00:00"))
        except ValueError:
            stamp = None
        if stamp is not None and stamp.tzinfo is not None:
            wall = stamp.timestamp()
    return line[start:], boot_us, wall, True


def parse_line(line: str) -> KernelXidEvent | None:
    """Parses one kernel-log line without context.

    Accepts a ``/dev/kmsg`` record, ``dmesg`` output (``[  123.456789] NVRM: ...``), syslog or
    ``journalctl -k`` lines (``... kernel: NVRM: ...``, with the wall time taken from a leading
    ISO-8601 timestamp such as ``journalctl -o short-iso``), or a bare ``NVRM:`` message. The
    two-line fallen-off message needs `KernelXidParser` (or `KmsgReader`), which keep state.

    Args:
        line: the line.

    Returns:
        The event (``seq`` None), or None when the line holds no Xid.
    """
    message, boot_us, wall, kernel = _split_text_line(line.rstrip("\n"))
    if not kernel:
        return None
    return KernelXidParser().feed(message, boot_time_us=boot_us, wall_time=wall)


def _read_boot_id(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="ascii").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _read_uptime(path: str) -> float | None:
    try:
        return float(Path(path).read_text(encoding="ascii").split()[0])
    except (OSError, UnicodeDecodeError, ValueError, IndexError):
        return None


class _LineBuffer:
    """Complete lines out of consecutive chunks of a text log, each at most `_MAX_LINE` bytes.

    A partial line at the end of a chunk waits for the next chunk (at most `_MAX_LINE` bytes are
    held); a longer line is dropped whole: its bytes are consumed as they come, never buffered and
    never read again. `feed` says how many bytes are done with (lines ended by a newline), so the
    saved offset always points at the start of a line: a restart reads an unfinished line again
    from its start, and drops an overlong one again, exactly as an uninterrupted reader does.
    """

    def __init__(self) -> None:
        self.carry = bytearray()
        self.pending = 0  # bytes of the unfinished line (held in carry, or skipped)
        self.skipping = False  # the unfinished line is longer than _MAX_LINE: being dropped
        self.dropped = 0
        """Lines dropped for being longer than `_MAX_LINE`."""

    def feed(self, chunk: bytes) -> tuple[list[bytes | None], int]:
        """Returns the lines completed by ``chunk`` (None for a dropped one) and the bytes done with."""
        lines: list[bytes | None] = []
        done = start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            size = self.pending + end - start
            if self.skipping:  # the end of a line already counted as dropped
                lines.append(None)
            elif size <= _MAX_LINE:
                lines.append(bytes(self.carry) + chunk[start:end])
            else:
                lines.append(None)
                self._dropped_one()
            done += size + 1
            self.carry.clear()
            self.pending = 0
            self.skipping = False
            start = end + 1
        self.pending += len(chunk) - start
        if not self.skipping and self.pending > _MAX_LINE:
            self.carry.clear()
            self.skipping = True
            self._dropped_one()
        elif not self.skipping:
            self.carry += chunk[start:]
        return lines, done

    def _dropped_one(self) -> None:
        if not self.dropped:
            log.warning("kernel-log line longer than %d bytes dropped (not a kernel message)", _MAX_LINE)
        self.dropped += 1


class KmsgReader:
    """Reads Xid events from ``/dev/kmsg`` (or a text log) from where the last run stopped.

    The first poll without a cursor returns the whole history the source still holds (for
    ``/dev/kmsg``: since boot, as far as the ring buffer reaches), each event with its original
    time. Later polls return only new events. The cursor (last sequence number, boot id, and for
    text files the byte offset and file identity) is kept in a small JSON file so that a restart
    neither loses nor double-counts; a cursor from another boot, another path or a rotated file is
    ignored.

    Not thread-safe; call from one thread. ``/dev/kmsg`` supports ``poll()``, so an event loop
    can wait with ``loop.add_reader(reader.fileno(), ...)``; poll a text file on a timer.

    Args:
        path: ``/dev/kmsg``, or a regular text file (dmesg, journal export, saved kmsg records) in
            which case the 1-based line number is the sequence number.
        cursor_path: where to keep the cursor; None keeps it in memory only.
        boot_id_path: file with this boot's id; None or unreadable means "unknown" (a reboot is
            then recognised by the sequence numbers starting over).
        uptime_path: ``/proc/uptime``, used to compute the wall time of boot.
        clock: wall clock (``time.time``), injectable for tests.
        boot_wall_time: Unix time of boot; computed as ``clock() - uptime`` when None.
        kernel_only: ignore kmsg records whose facility is not the kernel's (userspace writes).
        read_fn: ``os.read`` stand-in used on character devices, for tests that replay records
            (and EAGAIN/EPIPE) through ``/dev/null``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] = DEFAULT_KMSG_PATH,
        cursor_path: str | os.PathLike[str] | None = None,
        *,
        boot_id_path: str | None = BOOT_ID_PATH,
        uptime_path: str = UPTIME_PATH,
        clock: Callable[[], float] = time.time,
        boot_wall_time: float | None = None,
        kernel_only: bool = True,
        read_fn: Callable[[int, int], bytes] = os.read,
    ) -> None:
        self.path = os.fspath(path)
        self.cursor_path = os.fspath(cursor_path) if cursor_path is not None else None
        self._cursor = Cursor(self.cursor_path, self.path)
        self._boot_id_path = boot_id_path
        self._uptime_path = uptime_path
        self._clock = clock
        self._boot_wall_time = boot_wall_time
        self._kernel_only = kernel_only
        self._read = read_fn
        self._parser = KernelXidParser()
        self._fd: int | None = None
        self._is_device = False
        self._boot_id: str | None = None
        self._identity: tuple[int, int] | None = None
        self._seq: int | None = None  # last record/line consumed
        self._offset = 0  # text files: byte offset after the last line done with (the cursor's)
        self._saved_offset = 0
        self._pos = 0  # text files: where the next read starts (past a partial line held in _lines)
        self._lines = _LineBuffer()
        self._held: list[KernelXidEvent] = []  # device: parsed while skipping to the cursor
        self._skip_through: int | None = None  # device: cursor seq not yet reached
        self._cursor_dirty = False
        self.records_read = 0
        """Records or lines consumed since open."""
        self.records_lost = 0
        """Records overwritten in the ring buffer before we read them (from sequence gaps)."""
        self.overruns = 0
        """Times ``read()`` answered EPIPE."""

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        """Opens the source and loads the cursor.

        Raises:
            KernelLogUnavailable: the path cannot be opened (missing, ``EACCES``, or ``EPERM``
                from ``/dev/kmsg`` under ``kernel.dmesg_restrict=1`` without ``CAP_SYSLOG``), or
                is neither a character device nor a regular file.
        """
        if self._fd is not None:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise KernelLogUnavailable(self.path, f"cannot open: {exc.strerror or exc}") from exc
        try:
            st = os.fstat(fd)
        except OSError as exc:  # pragma: no cover - fstat on an open fd does not fail
            os.close(fd)
            raise KernelLogUnavailable(self.path, f"cannot stat: {exc}") from exc
        if stat.S_ISCHR(st.st_mode):
            self._is_device = True
        elif stat.S_ISREG(st.st_mode):
            self._is_device = False
            self._identity = (st.st_dev, st.st_ino)
        else:
            os.close(fd)
            raise KernelLogUnavailable(self.path, "neither a character device nor a regular file")
        self._fd = fd
        self._boot_id = _read_boot_id(self._boot_id_path)
        if self._boot_wall_time is None:
            uptime = _read_uptime(self._uptime_path)
            if uptime is not None:
                self._boot_wall_time = self._clock() - uptime
        self._load_cursor(st.st_size)
        if self._is_device and self._skip_through is None and self._seq is not None:
            self._skip_through = self._seq  # reopened without a cursor file: skip what we read

    def close(self) -> None:
        """Closes the source (the cursor stays on disk)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> KmsgReader:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fileno(self) -> int:
        """Returns the open file descriptor (``/dev/kmsg`` supports ``poll()``).

        Raises:
            KernelLogUnavailable: the reader is not open.
        """
        if self._fd is None:
            raise KernelLogUnavailable(self.path, "not open")
        return self._fd

    @property
    def boot_wall_time(self) -> float | None:
        """Unix time of boot used for event wall times, None when unknown."""
        return self._boot_wall_time

    # -- reading ---------------------------------------------------------------------------

    def poll(self, *, commit: bool = True) -> list[KernelXidEvent]:
        """Reads everything new and returns the Xid events in log order.

        Args:
            commit: save the cursor before returning. Pass False and call `commit` after the
                events were counted if a crash in between must not lose them (it may then count
                them twice instead).

        Returns:
            The new events (possibly empty).

        Raises:
            KernelLogUnavailable: reading failed with an error other than EAGAIN/EPIPE.
        """
        if self._fd is None:
            self.open()
        events = self._poll_device() if self._is_device else self._poll_file()
        if commit:
            self.commit()
        return events

    def commit(self) -> None:
        """Saves the cursor if it moved (atomically; see :mod:`exporter.xid.cursor`)."""
        if not self._cursor_dirty or self.cursor_path is None:
            return
        if self._cursor.save(
            device=self._is_device, boot_id=self._boot_id, seq=self._seq, offset=self._offset, identity=self._identity
        ):
            self._cursor_dirty = False

    def _wall(self, boot_us: int | None) -> float | None:
        if boot_us is None or self._boot_wall_time is None:
            return None
        return self._boot_wall_time + boot_us / 1_000_000

    def _poll_device(self) -> list[KernelXidEvent]:
        assert self._fd is not None
        events: list[KernelXidEvent] = []
        highest: int | None = None
        caught_up = False
        budget, valid = _POLL_BYTES, False
        for _ in range(_POLL_READS):  # bounded: a device that never runs dry cannot hold the thread
            try:
                raw = self._read(self._fd, _READ_SIZE)
            except BlockingIOError:
                caught_up = True
                break
            except BrokenPipeError:
                # EPIPE: records we had not read yet were overwritten; the next read returns the
                # oldest record still in the buffer. The sequence gap tells how many were lost.
                self.overruns += 1
                continue
            except OSError as exc:  # EPERM (dmesg_restrict), EINVAL (record > buffer), EIO ...
                raise KernelLogUnavailable(self.path, f"read failed: {exc.strerror or exc}") from exc
            if not raw:
                caught_up = True
                break
            budget -= len(raw)
            record = parse_kmsg_record(raw)
            if record is None:
                if budget <= 0:
                    break
                continue
            valid = True
            highest = record.seq if highest is None else max(highest, record.seq)
            self.records_read += 1
            if self._seq is not None and record.seq > self._seq + 1:
                self.records_lost += record.seq - self._seq - 1
            event = self._consume_record(record)
            if self._skip_through is not None and record.seq <= self._skip_through:
                if event is not None:
                    self._held.append(event)
            else:
                self._skip_through = None
                if event is not None:
                    events.append(event)
            if budget <= 0:
                break
        if not caught_up and not valid:
            raise KernelLogUnavailable(self.path, f"no kmsg record in {_POLL_BYTES - budget} bytes: not a kernel log")
        if self._skip_through is not None and caught_up:
            if highest is not None and highest < self._skip_through:
                # The newest record is older than the cursor: sequence numbers started over, so
                # this is another boot whose boot id we could not read. Count what we skipped.
                log.info(
                    "kernel-log cursor seq %d is beyond the newest record %d: new boot, counting its history",
                    self._skip_through,
                    highest,
                )
                events = self._held + events
            self._skip_through = None  # caught up (same boot) or started over (new boot)
        if self._skip_through is None:
            self._held = []
        return events

    def _consume_record(self, record: KmsgRecord) -> KernelXidEvent | None:
        self._seq = record.seq
        self._cursor_dirty = True
        if self._kernel_only and record.facility != 0:
            return None
        return self._parser.feed(
            record.message,
            seq=record.seq,
            boot_time_us=record.boot_time_us,
            wall_time=self._wall(record.boot_time_us),
        )

    def _poll_file(self) -> list[KernelXidEvent]:
        assert self._fd is not None
        events: list[KernelXidEvent] = []
        line_no = self._seq or 0
        try:
            if os.fstat(self._fd).st_size < self._pos:  # truncated in place: start over
                log.info("kernel-log file %s shrank; reading it from the start", self.path)
                self._offset = self._pos = line_no = 0
                self._lines = _LineBuffer()
            budget = _POLL_BYTES  # bounded per poll; reading resumes where it stopped, never re-reads
            while budget > 0 and (chunk := os.pread(self._fd, min(_FILE_CHUNK, budget), self._pos)):
                self._pos += len(chunk)
                budget -= len(chunk)
                lines, done = self._lines.feed(chunk)
                self._offset += done
                for raw_line in lines:
                    line_no += 1
                    self.records_read += 1
                    event = None if raw_line is None else self._text_event(raw_line, line_no)
                    if event is not None:
                        events.append(event)
        except OSError as exc:
            raise KernelLogUnavailable(self.path, f"read failed: {exc.strerror or exc}") from exc
        if line_no != (self._seq or 0) or self._offset != self._saved_offset:
            self._seq, self._saved_offset = line_no, self._offset
            self._cursor_dirty = True
        return events

    def _text_event(self, raw_line: bytes, line_no: int) -> KernelXidEvent | None:
        message, boot_us, wall, kernel = _split_text_line(raw_line.decode("utf-8", "replace"))
        if (self._kernel_only and not kernel) or "NVRM:" not in message:
            return None
        return self._parser.feed(
            message, seq=line_no, boot_time_us=boot_us, wall_time=wall if wall is not None else self._wall(boot_us)
        )

    def _load_cursor(self, size: int) -> None:
        pos = self._cursor.load(device=self._is_device, boot_id=self._boot_id, identity=self._identity, size=size)
        if pos is None:
            return
        self._seq = pos.seq
        if self._is_device:
            self._skip_through = pos.seq
        else:
            self._offset = self._saved_offset = self._pos = pos.offset


class XidSighting(NamedTuple):
    """One report of an Xid, from either source, as `dedupe` and `XidDeduplicator` take it.

    Attributes:
        gpu: a key naming the GPU, the same for both sources (UUID, or NVML bus id).
        xid: the Xid number.
        wall_time: Unix time: arrival of an NVML event, or the kernel line's time.
    """

    gpu: str
    xid: int
    wall_time: float


Source = Literal["nvml", "kernel"]


class XidDeduplicator:
    """Counts an Xid once when both NVML and the kernel log report it.

    Every report is offered with its source. A report is a duplicate when a not yet paired
    report of the same GPU and Xid from the *other* source lies within ``window_s`` of it; the two
    are then paired and the second is dropped. Pairing is one-to-one, so three Xid 13 in a burst
    seen by both sources still count three. Feed both streams in any order.

    Args:
        window_s: largest time difference between the two reports of one Xid.
        retention_s: how long an unpaired report waits for its partner (relative to the newest
            time offered); keep it above the kernel-log polling delay.
    """

    def __init__(self, window_s: float = 5.0, retention_s: float = 120.0) -> None:
        if window_s < 0 or retention_s < window_s:
            raise ValueError("need 0 <= window_s <= retention_s")
        self.window_s = window_s
        self.retention_s = retention_s
        self._pending: dict[tuple[str, int], deque[tuple[float, Source]]] = {}
        self._newest = float("-inf")
        self.duplicates = 0
        """Reports dropped as duplicates so far."""

    def offer(self, source: Source, gpu: str, xid: int, wall_time: float) -> bool:
        """Offers one report.

        Args:
            source: ``"nvml"`` or ``"kernel"``.
            gpu: GPU key, the same key space for both sources.
            xid: Xid number.
            wall_time: Unix time of the report.

        Returns:
            True when this report is new and must be counted, False for a duplicate.
        """
        self._newest = max(self._newest, wall_time)
        self._prune()
        key = (gpu, xid)
        pending = self._pending.setdefault(key, deque())
        best: int | None = None
        for index, (seen, seen_source) in enumerate(pending):
            if seen_source != source and abs(seen - wall_time) <= self.window_s:
                if best is None or abs(seen - wall_time) < abs(pending[best][0] - wall_time):
                    best = index
        if best is not None:
            del pending[best]
            if not pending:
                del self._pending[key]
            self.duplicates += 1
            return False
        pending.append((wall_time, source))
        return True

    def offer_nvml(self, gpu: str, xid: int, wall_time: float) -> bool:
        """`offer` for an NVML event (``wall_time`` = its arrival)."""
        return self.offer("nvml", gpu, xid, wall_time)

    def offer_kernel(self, gpu: str, xid: int, wall_time: float) -> bool:
        """`offer` for a kernel-log event (``wall_time`` = its original time)."""
        return self.offer("kernel", gpu, xid, wall_time)

    def _prune(self) -> None:
        horizon = self._newest - self.retention_s
        for key in [k for k, q in self._pending.items() if q and max(t for t, _ in q) < horizon]:
            del self._pending[key]
        for queue in self._pending.values():
            while queue and queue[0][0] < horizon:
                queue.popleft()


def dedupe(
    nvml_events: Iterable[XidSighting],
    kernel_events: Iterable[XidSighting],
    window_s: float = 5.0,
) -> list[XidSighting]:
    """Returns the kernel sightings that no NVML sighting already accounts for.

    Batch form of `XidDeduplicator` for two complete lists: every NVML sighting counts, a kernel
    sighting is dropped when an NVML sighting of the same GPU and Xid lies within ``window_s``
    (one-to-one).

    Args:
        nvml_events: NVML sightings (``wall_time`` = arrival).
        kernel_events: kernel-log sightings (``wall_time`` = original time).
        window_s: largest time difference between the two reports of one Xid.

    Returns:
        The kernel sightings to count, in their input order.
    """
    dedup = XidDeduplicator(window_s=window_s, retention_s=float("inf"))
    for sighting in nvml_events:
        dedup.offer_nvml(*sighting)
    return [s for s in kernel_events if dedup.offer_kernel(*s)]
