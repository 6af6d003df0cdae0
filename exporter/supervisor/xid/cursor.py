"""Where the kernel-log reader stopped, kept in a small JSON file across restarts.

The file holds the path it belongs to, the kind of source (``device`` for ``/dev/kmsg``, ``file``
for a text log), the boot id, the last sequence number (kmsg record sequence, or line number), and
for text files the byte offset and the file's identity (device and inode). A cursor for another
path, another boot or a replaced file is ignored, and so is one whose values are out of range (a
negative sequence or offset, an offset past the end of the file): every value is checked, and a
bad file costs one log line and a re-read of the history, never the feature.

Writes are atomic and refuse to follow links: the new content goes to a fresh temporary file made
with :func:`tempfile.mkstemp` in the cursor's own directory (``O_CREAT | O_EXCL``: a planted
symlink cannot redirect it), then :func:`os.replace` moves it over the cursor, which replaces a
symlink at that name rather than writing through it. A failed write removes its temporary file.

Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

from exporter.common import fileio

log = logging.getLogger(__name__)

VERSION: Final = 1
MAX_BYTES: Final = 4096  # a cursor is ~200 bytes; anything larger is not ours


@dataclass(frozen=True)
class Position:
    """A loaded cursor.

    Attributes:
        seq: last record sequence (device) or line number (file) consumed.
        offset: text files: byte offset after the last consumed line (0 for devices).
    """

    seq: int
    offset: int = 0


def _non_negative_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


class Cursor:
    """Load and save the reader's position for one source.

    Args:
        path: the cursor file; None keeps nothing on disk.
        source: the kernel-log path the cursor belongs to.
    """

    def __init__(self, path: str | None, source: str) -> None:
        self.path = path
        self.source = source
        self._warned = False

    def load(
        self, *, device: bool, boot_id: str | None, identity: tuple[int, int] | None, size: int
    ) -> Position | None:
        """The saved position if it belongs to this source, boot and file, else None (logged).

        Args:
            device: the source is a character device (``/dev/kmsg``).
            boot_id: this boot's id, None when unknown.
            identity: (st_dev, st_ino) of a text file.
            size: the text file's current size.
        """
        data = self._read()
        if data is None:
            return None
        seq = data.get("seq")
        if data.get("path") != self.source or not _non_negative_int(seq):
            log.info("kernel-log cursor %s is for another source or holds no valid seq; starting over", self.path)
            return None
        if device:
            saved_boot = data.get("boot_id")
            if saved_boot is not None and boot_id is not None and saved_boot != boot_id:
                log.info(
                    "kernel-log cursor is from boot %s, this is %s: counting history since boot", saved_boot, boot_id
                )
                return None
            return Position(seq)
        offset = data.get("offset")
        if (data.get("dev"), data.get("inode")) != identity or not _non_negative_int(offset) or offset > size:
            log.info(
                "kernel-log file %s was replaced or truncated (or the cursor is bad); reading from the start",
                self.source,
            )
            return None
        return Position(seq, offset)

    def _read(self) -> dict[str, Any] | None:
        if self.path is None:
            return None
        try:  # without blocking on a FIFO, a regular file only, not through a link
            raw = fileio.read_bytes(self.path, MAX_BYTES, follow=False)
        except fileio.FileRefused as exc:
            if exc.errno == errno.ENOENT:
                log.info("no kernel-log cursor at %s: counting history since boot", self.path)
            else:
                fileio.count_failure("kmsg_cursor", exc)
                log.warning("ignoring unreadable kernel-log cursor %s: %s", self.path, exc.detail)
            return None
        try:
            data = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deeply
            log.warning("ignoring unreadable kernel-log cursor %s: %s", self.path, exc)
            return None
        if not isinstance(data, dict) or data.get("version") != VERSION:
            log.warning("ignoring kernel-log cursor %s of unknown version", self.path)
            return None
        return data

    def save(
        self, *, device: bool, boot_id: str | None, seq: int | None, offset: int, identity: tuple[int, int] | None
    ) -> bool:
        """Write the position atomically; False (logged once) if it could not be written."""
        if self.path is None:
            return True
        data: dict[str, object] = {
            "version": VERSION,
            "path": self.source,
            "kind": "device" if device else "file",
            "boot_id": boot_id,
            "seq": seq,
        }
        if not device and identity is not None:
            data.update(offset=offset, dev=identity[0], inode=identity[1])
        directory = os.path.dirname(os.path.abspath(self.path))
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=".kmsg-cursor-", dir=directory)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(data, sort_keys=True) + "\n")
            os.replace(tmp, self.path)
            tmp = None
        except OSError as exc:
            if not self._warned:
                log.warning("cannot save kernel-log cursor %s (%s); a restart will count history again", self.path, exc)
                self._warned = True
            return False
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return True
