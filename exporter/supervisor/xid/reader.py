"""A cursor-keeping reader of the kernel log, ``/dev/kmsg`` or a text log, that yields Xid events.

Reading ``/dev/kmsg`` (Linux ``Documentation/ABI/testing/dev-kmsg``): one record per ``read()``;
``read()`` returns ``EAGAIN`` (non-blocking) when no record is left and ``EPIPE`` once when records
were overwritten before being read; the next read continues at the oldest record still present.
Userspace cannot write facility 0 (kernel), so records with another facility are ignored: a
process that writes a fake ``NVRM: Xid`` line into ``/dev/kmsg`` cannot raise our counters.

What a line means is :mod:`exporter.supervisor.xid.parse`'s job; where the reader stopped is kept by
:mod:`exporter.supervisor.xid.cursor`; the boot id and uptime read here place each event in wall time.

Standard library only.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable, Collection
from typing import Final

from exporter.common import fileio
from exporter.supervisor.xid.cursor import Cursor
from exporter.supervisor.xid.parse import (
    KernelXidEvent,
    KernelXidParser,
    KmsgRecord,
    parse_kmsg_record,
    split_text_line,
)

__all__ = [
    "BOOT_ID_PATH",
    "DEFAULT_KMSG_PATH",
    "UPTIME_PATH",
    "KernelLogUnavailable",
    "KmsgReader",
]

# One logger for parser and reader, named after the module they were (operators filter on it).
log = logging.getLogger("exporter.supervisor.xid.kmsg")

DEFAULT_KMSG_PATH: Final = "/dev/kmsg"
BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"
UPTIME_PATH: Final = "/proc/uptime"
_READ_SIZE: Final = 16384  # larger than any printk record (the kernel caps a line near 1 KiB)
_MAX_LINE: Final = 16384  # a text-log line longer than this is not a kernel message: dropped unread
_FILE_CHUNK: Final = 1 << 20  # text logs are read in chunks of this size ...
_POLL_BYTES: Final = 4 << 20  # ... and at most this much per poll (the rest waits for the next poll)
_POLL_READS: Final = 16384  # /dev/kmsg: at most this many read() calls per poll


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


def _read_small(path: str) -> str:
    return fileio.read_bytes(path, 4096).decode("ascii")


def _read_boot_id(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return _read_small(path).strip() or None
    except (fileio.FileRefused, UnicodeDecodeError):
        return None


def _read_uptime(path: str) -> float | None:
    try:
        return float(_read_small(path).split()[0])
    except (fileio.FileRefused, UnicodeDecodeError, ValueError, IndexError):
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
        devices: (major, minor) of the character devices accepted: ``/dev/kmsg``'s (1:11) by
            default; None accepts any (tests that replay records through ``/dev/null``). Any other
            device, a FIFO, a directory or a socket is refused at open, without blocking.
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
        devices: Collection[tuple[int, int]] | None = (fileio.KMSG_DEVICE,),
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
        self._devices = devices
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
                is neither ``/dev/kmsg`` (or another accepted device) nor a regular file.
        """
        if self._fd is not None:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
            raise KernelLogUnavailable(self.path, f"cannot open: {getattr(exc, 'strerror', None) or exc}") from exc
        try:
            st = os.fstat(fd)
        except OSError as exc:  # pragma: no cover - fstat on an open fd does not fail
            os.close(fd)
            raise KernelLogUnavailable(self.path, f"cannot stat: {exc}") from exc
        device = (os.major(st.st_rdev), os.minor(st.st_rdev))
        if stat.S_ISCHR(st.st_mode) and (self._devices is None or device in self._devices):
            self._is_device = True
        elif stat.S_ISREG(st.st_mode):
            self._is_device = False
            self._identity = (st.st_dev, st.st_ino)
        else:
            os.close(fd)
            what = fileio.describe_kind(st.st_mode)
            if stat.S_ISCHR(st.st_mode):
                what += f" {device[0]}:{device[1]}, not /dev/kmsg (1:11)"
            raise KernelLogUnavailable(self.path, f"is {what}: expected /dev/kmsg or a regular text file")
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
        """Saves the cursor if it moved (atomically; see :mod:`exporter.supervisor.xid.cursor`)."""
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
        message, boot_us, wall, kernel = split_text_line(raw_line.decode("utf-8", "replace"))
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
