"""Process records as nvidia-ml-py decodes them, and the misreadings a scenario can ask for.

The ``struct`` value kind (:class:`exporter.common.scenarios.spec.Struct`, docs/scenarios.md "Process
lists") names one of :data:`STRUCT_LAYOUTS`: the records as NVML meant them go in, the records a
caller of the binding sees come out. Real ctypes structs do the misreading, so the wrong offsets
are the real ones. Standard library only (the scenario validator imports this module).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

U32 = 0xFFFFFFFF  # a 32-bit NVML_VALUE_NOT_AVAILABLE; as an instance id: MIG off
U64 = (1 << 64) - 1  # usedGpuMemory NVML_VALUE_NOT_AVAILABLE


class ProcessInfoV2(ctypes.Structure):
    """nvmlProcessInfo_v2_t, 24 bytes: what nvidia-ml-py reads for _v2 and _v3."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class ProcessInfoR535(ctypes.Structure):
    """The 32-byte record drivers 535.43-535.86 write through the _v3 calls: ``usedGpuCcProtectedMemory``
    added without a version bump (XuehaiPan/nvitop PRs #79 and #89, NVIDIA/go-nvml#75)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
        ("usedGpuCcProtectedMemory", ctypes.c_ulonglong),
    ]


def _u(value: Any, default: int, mask: int) -> int:
    return default if value is None else int(value) & mask


def _friendly(rec: Any) -> SimpleNamespace:
    """A decoded record as pynvml hands it out: NVML_VALUE_NOT_AVAILABLE memory becomes None."""
    mem = int(rec.usedGpuMemory)
    return SimpleNamespace(
        pid=int(rec.pid),
        usedGpuMemory=None if mem == U64 else mem,
        gpuInstanceId=int(rec.gpuInstanceId),
        computeInstanceId=int(rec.computeInstanceId),
    )


def misaligned_r535(records: Sequence[Any]) -> list[SimpleNamespace]:
    """``records`` written as the 535.43-535.86 driver writes them and read back as the binding does.

    The driver fills ``n`` 32-byte records into the binding's array of ``n * 2 + 5`` 24-byte
    entries and sets the count to ``n``; the binding decodes the first ``n`` 24-byte entries.
    The first record reads right; from the second on, every field comes from the wrong offset.
    """
    n = len(records)
    if n == 0:
        return []
    written = (ProcessInfoR535 * n)()
    for i, r in enumerate(records):
        written[i].pid = _u(getattr(r, "pid", 0), 0, U32)
        written[i].usedGpuMemory = _u(getattr(r, "usedGpuMemory", None), U64, U64)
        written[i].gpuInstanceId = _u(getattr(r, "gpuInstanceId", None), U32, U32)
        written[i].computeInstanceId = _u(getattr(r, "computeInstanceId", None), U32, U32)
        written[i].usedGpuCcProtectedMemory = 0
    array = (ctypes.c_char * (ctypes.sizeof(ProcessInfoV2) * (n * 2 + 5)))()
    ctypes.memmove(array, written, ctypes.sizeof(written))
    read = (ProcessInfoV2 * n).from_buffer(array)
    return [_friendly(read[i]) for i in range(n)]


def swapped(records: Sequence[Any]) -> list[SimpleNamespace]:
    """``records`` with pid and usedGpuMemory exchanged, as a binding with the fields in the other
    order decodes them (the pid shows up as a byte count and the memory as a pid)."""
    return [
        SimpleNamespace(
            pid=getattr(r, "usedGpuMemory", None),
            usedGpuMemory=getattr(r, "pid", None),
            gpuInstanceId=getattr(r, "gpuInstanceId", U32),
            computeInstanceId=getattr(r, "computeInstanceId", U32),
        )
        for r in records
    ]


# Layout name (the struct kind's "struct" key) -> records as meant -> records as the binding reads them.
STRUCT_LAYOUTS: dict[str, Callable[[Sequence[Any]], list[SimpleNamespace]]] = {
    "r535_v3": misaligned_r535,
    "swapped": swapped,
}
