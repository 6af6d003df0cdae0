"""Shared-memory breadcrumbs: which NVML call a worker thread is in, readable after it dies.

The supervisor creates a small anonymous memory file (``memfd_create``) and hands its descriptor to
the worker. Before every NVML call the worker writes (feature, NVML function, GPU UUID, time) into
its thread's slot and marks it in flight; after the call it clears the flag. A native crash leaves
the last record in place, so the supervisor can name the call that killed the worker, and a hung
call can be named while it hangs. Writing costs two ``struct.pack_into`` calls per NVML call, no
system call, so the pipe carries only snapshots.

Each slot is a seqlock: ``seq`` is odd while a record is being written; the reader retries.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass

SLOT_SIZE = 256
SLOTS = 2  # 0: sampling thread, 1: NVML event thread
SLOT_SAMPLER = 0
SLOT_EVENTS = 1
SIZE = SLOT_SIZE * SLOTS

# seq, in_flight, pad, t_enter, feature, function, uuid
_LAYOUT = struct.Struct("<QI4xd32s64s96s")
_SEQ = struct.Struct("<Q")
_FLAG = struct.Struct("<I")


@dataclass(frozen=True)
class Breadcrumb:
    """The last NVML call a worker thread entered.

    Attributes:
        feature: feature name (``"nvlink_throughput"``), ``"init"`` or ``"events"``.
        function: pynvml function name (``"nvmlDeviceGetFieldValues"``).
        uuid: GPU UUID, empty when the call is not per GPU.
        entered_at: Unix time the call was entered, seconds.
        in_flight: True while the call has not returned.
    """

    feature: str
    function: str
    uuid: str
    entered_at: float
    in_flight: bool


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


class BreadcrumbWriter:
    """Worker side: one writer per process, slots chosen per thread."""

    def __init__(self, fd: int | None) -> None:
        """Map the memory file ``fd``; ``None`` gives an in-process buffer (selfcheck, tests)."""
        if fd is None:
            self._buf: mmap.mmap | bytearray = bytearray(SIZE)
        else:
            self._buf = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._seq = [0] * SLOTS

    def enter(self, slot: int, feature: str, function: str, uuid: str = "") -> None:
        """Record that ``function`` is about to be called (before the call)."""
        off = slot * SLOT_SIZE
        seq = self._seq[slot] + 1
        _SEQ.pack_into(self._buf, off, seq)  # odd: writing
        _LAYOUT.pack_into(
            self._buf,
            off,
            seq,
            1,
            time.time(),
            feature.encode()[:31],
            function.encode()[:63],
            uuid.encode()[:95],
        )
        self._seq[slot] = seq + 1
        _SEQ.pack_into(self._buf, off, seq + 1)

    def exit(self, slot: int) -> None:
        """Record that the call returned (or raised)."""
        _FLAG.pack_into(self._buf, slot * SLOT_SIZE + 8, 0)


class BreadcrumbReader:
    """Supervisor side: owns the memory file and reads the slots at any time."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("nvgpu-breadcrumbs", 0)
        os.ftruncate(self.fd, SIZE)
        self._map = mmap.mmap(self.fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def clear(self) -> None:
        """Zero every slot (before a new worker starts)."""
        self._map[:] = bytes(SIZE)

    def read(self, slot: int) -> Breadcrumb | None:
        """The slot's last record, or None if nothing was ever written."""
        off = slot * SLOT_SIZE
        for _ in range(100):
            seq, flag, t_enter, feature, function, uuid = _LAYOUT.unpack_from(self._map, off)
            if seq == 0:
                return None
            if seq % 2 == 0 and _SEQ.unpack_from(self._map, off)[0] == seq:
                return Breadcrumb(_text(feature), _text(function), _text(uuid), t_enter, bool(flag))
        return None

    def in_flight(self) -> list[Breadcrumb]:
        """Records of calls that have not returned, sampler slot first."""
        crumbs = [self.read(slot) for slot in range(SLOTS)]
        return [c for c in crumbs if c is not None and c.in_flight]

    def close(self) -> None:
        """Release the mapping and the descriptor."""
        self._map.close()
        os.close(self.fd)
