"""Shared-memory breadcrumbs: which NVML call a worker thread is in, readable after it dies.

The supervisor creates a small anonymous memory file (``memfd_create``) and hands its descriptor to
the worker. Before every NVML call the worker writes (feature, NVML function, GPU UUID, monotonic
time) into its thread's slot and marks it in flight; after the call it clears the flag. A native crash leaves
the last record in place, so the supervisor can name the call that killed the worker, and a hung
call can be named while it hangs. Writing costs two ``struct.pack_into`` calls per NVML call, no
system call, so the pipe carries only snapshots.

Each slot is a seqlock: ``seq`` is odd while a record is being written; the reader retries.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass

SLOT_SIZE = 256
SLOT_SAMPLER = 0  # the worker's main thread: init, enumeration, coordination
SLOT_EVENTS = 1  # the NVML event thread
SLOT_ENUMERATION = 2  # the thread that reads each index's UUID (exporter.worker.enumeration)
SLOT_GPU_BASE = 3  # one slot per GPU sampling thread, by a position the worker hands out
MAX_GPU_SLOTS = 64
SLOTS = SLOT_GPU_BASE + MAX_GPU_SLOTS
SIZE = SLOT_SIZE * SLOTS  # 16.75 KiB


def gpu_slot(position: int) -> int:
    """The breadcrumb slot of the sampling thread of the GPU at ``position`` (a number the worker
    hands each GPU it tracks, not its NVML index, which moves).

    Raises:
        ValueError: more GPUs than slots (no supported system has more than 64 per node).
    """
    if not 0 <= position < MAX_GPU_SLOTS:
        raise ValueError(f"GPU position {position} has no breadcrumb slot (at most {MAX_GPU_SLOTS} GPUs)")
    return SLOT_GPU_BASE + position


# seq, in_flight, pad, t_enter, thread ident, feature, function, uuid (224 of 256 bytes)
_LAYOUT = struct.Struct("<QI4xdQ32s64s96s")
_SEQ = struct.Struct("<Q")
_FLAG = struct.Struct("<I")


@dataclass(frozen=True)
class Breadcrumb:
    """The last NVML call a worker thread entered.

    Attributes:
        feature: feature name (``"nvlink_throughput"``), ``"init"`` or ``"events"``.
        function: pynvml function name (``"nvmlDeviceGetFieldValues"``).
        uuid: GPU UUID (its PCI bus id when the UUID is unknown), empty when the call is not per GPU.
        entered_at: ``time.monotonic()`` when the call was entered, seconds: CLOCK_MONOTONIC, the
            same clock in the supervisor on this host, so a wall-clock step cannot reorder calls.
        in_flight: True while the call has not returned.
        thread: ``threading.get_ident()`` of the calling thread (faulthandler prints it as
            "Current thread 0x…", which tells which of several calls in flight crashed).
    """

    feature: str
    function: str
    uuid: str
    entered_at: float
    in_flight: bool
    thread: int = 0


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _read(buf: mmap.mmap | bytearray, slot: int) -> Breadcrumb | None:
    """The slot's last complete record (seqlock: retry while a write is in progress)."""
    off = slot * SLOT_SIZE
    for _ in range(100):
        seq, flag, t_enter, tid, feature, function, uuid = _LAYOUT.unpack_from(buf, off)
        if seq == 0:
            return None
        if seq % 2 == 0 and _SEQ.unpack_from(buf, off)[0] == seq:
            return Breadcrumb(_text(feature), _text(function), _text(uuid), t_enter, bool(flag), tid)
    return None


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
            time.monotonic(),
            threading.get_ident(),
            feature.encode()[:31],
            function.encode()[:63],
            uuid.encode()[:95],
        )
        self._seq[slot] = seq + 1
        _SEQ.pack_into(self._buf, off, seq + 1)

    def exit(self, slot: int) -> None:
        """Record that the call returned (or raised)."""
        _FLAG.pack_into(self._buf, slot * SLOT_SIZE + 8, 0)

    def read(self, slot: int) -> Breadcrumb | None:
        """This process's own record in ``slot`` (the worker names a hung GPU's call with it)."""
        return _read(self._buf, slot)


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
        return _read(self._map, slot)

    def in_flight(self) -> list[Breadcrumb]:
        """Records of calls that have not returned, in slot order (main thread, events, GPUs)."""
        crumbs = [self.read(slot) for slot in range(SLOTS)]
        return [c for c in crumbs if c is not None and c.in_flight]

    def close(self) -> None:
        """Release the mapping and the descriptor."""
        self._map.close()
        os.close(self.fd)
