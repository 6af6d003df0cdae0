"""Kernel-log Xid parser: the NVIDIA driver's ``NVRM:`` lines and ``/dev/kmsg`` records -> events.

What the NVIDIA driver writes, and what this module recognises (formats written from the driver's
observed output, our own regular expressions):

- ``NVRM: Xid (PCI:0000:00:06): 13, pid=1234, name=python3, Graphics SM Warp Exception ...``;
  ``pid``/``name`` are optional, ``pid='<unknown>', name=<unknown>`` appears for kernel
  contexts, and older drivers omit the ``PCI:`` prefix. Both land on the event
  (`KernelXidEvent.pid`, `KernelXidEvent.process_name`), None where the line has none.
- The NVLink5 (Blackwell) form of Xid 144-150, which after the optional pid/name carries
  ``<UNIT>[/<SUBUNIT>] <Fatal|Nonfatal> XC<n> i<n> Link <n> (<intrinfo> <error status> [...])``
  (documented in NVIDIA's Xid catalog, sheet "XID 144-150 Decode"); the fields land in
  `KernelXidEvent.extended`.
- "GPU has fallen off the bus" lines without an Xid number (``NVRM: GPU at PCI:0000:00:06: GPU has
  fallen off the bus.``, ``NVRM: GPU 0000:00:06.0: GPU has fallen off the bus.`` and the two-line
  ``The NVIDIA GPU 0000:00:06.0 ... has fallen off the bus and is not responding to commands.``):
  reported as Xid 79 with ``fallen_off_bus=True``. Several 79 reports for one GPU within
  `FALLEN_OFF_DEDUPE_S` count once (the driver logs the Xid line and the plain line for one loss).

Record format of ``/dev/kmsg`` (Linux ``Documentation/ABI/testing/dev-kmsg``):
``<prio>,<seq>,<usec since boot>,<flags>[,...];<message>\\n`` followed by optional
``\\n KEY=value`` dictionary lines; non-printable bytes in the message are escaped as ``\\xNN``.
The facility is ``prio >> 3`` (0 is the kernel). Text logs (``dmesg``, syslog, ``journalctl -k``)
are split by `split_text_line`. Reading the log is :mod:`exporter.supervisor.xid.reader`'s job; this module
keeps no file open.

Standard library only.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import re
import types
from collections.abc import Mapping
from typing import Final, NamedTuple

__all__ = [
    "FALLEN_OFF_DEDUPE_S",
    "KernelXidEvent",
    "KernelXidParser",
    "KmsgRecord",
    "normalize_pci_bus_id",
    "parse_kmsg_record",
    "parse_line",
    "split_text_line",
]

# One logger for parser and reader, named after the module they were (operators filter on it).
log = logging.getLogger("exporter.supervisor.xid.kmsg")

FALLEN_OFF_DEDUPE_S: Final = 10.0
"""Xid 79 reports for one GPU closer than this (kernel time) are one event."""
_FALLEN_OFF_DEDUPE_RECORDS: Final = 50  # same, by record distance, when a line has no time
_MULTILINE_SPAN: Final = 5  # records between "The NVIDIA GPU <bdf>" and "... fallen off the bus"

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


def split_text_line(line: str) -> tuple[str, int | None, float | None, bool]:
    """Splits one text-log line into its message, boot time, wall time and origin.

    Args:
        line: a saved ``/dev/kmsg`` record, a ``dmesg``, syslog or ``journalctl -k`` line, or a
            bare ``NVRM:`` message (without its newline).

    Returns:
        ``(message, boot_us, wall_time, is_kernel)``: the text from ``NVRM:`` on (the whole line
        when it has none); microseconds since boot from a kmsg header or a ``[  123.456789]``
        prefix, else None; Unix time from a leading ISO-8601 timestamp with a zone, else None;
        False only for a kmsg record whose facility is not the kernel's.
    """
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
    message, boot_us, wall, kernel = split_text_line(line.rstrip("\n"))
    if not kernel:
        return None
    return KernelXidParser().feed(message, boot_time_us=boot_us, wall_time=wall)
