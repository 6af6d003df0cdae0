"""Load the NVML backend: the real ``pynvml`` or the scenario-driven fake.

Only the worker calls :func:`load`; the supervisor never imports ``pynvml``.

The real backend is ``pynvml`` itself plus one replacement: :func:`field_values`, because pynvml's
``nvmlDeviceGetFieldValues`` allocates exactly ``n`` zeroed entries, so an entry the driver leaves
untouched reads as SUCCESS with value 0 and timestamp 0 (measured on H200 / 580.159.04, for field
147 and in large batches), and NVML may touch one entry past the count during NVLink queries (a
comment in nvitop 1.7.2's ``libnvml.py``, which allocates one entry more for it).
"""

from __future__ import annotations

import ctypes
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from exporter.common import fileio, nativelib
from exporter.common.nvml import errors

FAKE_PREFIX = "fake:"
# Preset in every entry's nvmlReturn: a driver that does not fill an entry leaves it visible.
UNPOPULATED = 0x7EADBEEF


@dataclass(frozen=True)
class FieldValue:
    """One decoded ``nvmlFieldValue_t`` entry.

    Attributes:
        field_id: ``NVML_FI_*`` id.
        scope_id: link, power scope or lane, per field.
        code: the entry's own NVML return code (``UNPOPULATED`` if the driver did not fill it).
        value: decoded by ``valueType``; None unless ``code`` is SUCCESS.
        timestamp_us: CPU time of the reading, microseconds since 1970.
    """

    field_id: int
    scope_id: int
    code: int
    value: int | float | None
    timestamp_us: int


_UNION_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def decode_entry(entry: Any) -> FieldValue:
    """Decode a pynvml-shaped entry (ctypes struct or the fake's namespace)."""
    code = int(entry.nvmlReturn)
    ts = int(entry.timestamp)
    value: int | float | None = None
    if code == errors.SUCCESS:
        if ts == 0:
            code = UNPOPULATED  # zero-initialised and never written by the driver
        else:
            member = _UNION_MEMBER.get(int(entry.valueType))
            if member is None:
                code = errors.UNKNOWN
            else:
                raw = getattr(entry.value, member)
                value = float(raw) if member == "dVal" else int(raw)
    return FieldValue(int(entry.fieldId), int(entry.scopeId), code, value, ts)


DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu ..." (proprietary) or
# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..." (open).
_KERNEL_MODULE_RE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)*)")


def kernel_module_version(path: str = DRIVER_VERSION_FILE) -> str:
    """The loaded NVIDIA kernel module's version from ``/proc/driver/nvidia/version``; "" if absent.

    Not NVML: readable when NVML is not (LIB_RM_VERSION_MISMATCH names the mismatch this shows).
    """
    try:  # opened without blocking; the file is one line
        head = fileio.read_bytes(path, 65536).decode("utf-8", "replace")
    except fileio.FileRefused:
        return ""
    m = _KERNEL_MODULE_RE.search(head)
    return m.group(1) if m else ""


class RealNvml:
    """``pynvml`` with a safe field-value call. Attribute access falls through to pynvml."""

    def __init__(self) -> None:
        import pynvml  # the only import of the real binding

        self._pynvml = pynvml
        self.NVMLError = pynvml.NVMLError

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pynvml, name)

    def clock(self) -> float:
        """The clock NVML windows are measured on (GPM): ``time.monotonic()``."""
        return time.monotonic()

    def timestamp_us(self) -> int:
        """Now as NVML stamps its samples (field values, process utilization): CPU time in µs since 1970."""
        return int(time.time() * 1e6)

    def field_values(self, handle: Any, pairs: list[tuple[int, int]]) -> list[FieldValue]:
        """Query field values with a sentinel-filled, one-longer array.

        Args:
            handle: device handle.
            pairs: (field id, scope id) pairs.

        Returns:
            One decoded entry per pair, in order.

        Raises:
            pynvml.NVMLError: the call itself failed (per-entry failures are in ``code``).
        """
        p = self._pynvml
        n = len(pairs)
        array = (p.c_nvmlFieldValue_t * (n + 1))()
        for i, (fid, scope) in enumerate(pairs):
            array[i].fieldId = fid
            array[i].scopeId = scope
            array[i].nvmlReturn = UNPOPULATED
        fn = p._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        ret = fn(handle, ctypes.c_int32(n), array)
        p._nvmlCheckReturn(ret)
        return [decode_entry(array[i]) for i in range(n)]

    def kernel_module_version(self) -> str:
        """The loaded kernel module's version (:func:`kernel_module_version`)."""
        return kernel_module_version()

    def proc_view(self) -> nativelib.ProcView:
        """This process's ``/proc/self/maps``, ``/proc/self/mountinfo`` and the host libraries visible."""
        return nativelib.read_proc_view()

    def realpath(self, path: str) -> str:
        """``os.path.realpath`` of a mapped file."""
        return os.path.realpath(path)

    def binding_version(self) -> str | None:
        """The installed nvidia-ml-py version, or None."""
        from importlib import metadata

        try:
            return metadata.version("nvidia-ml-py")
        except metadata.PackageNotFoundError:
            return None


class FakeBackend:
    """The fake (:class:`exporter.worker.fakenvml.binding.FakeNvml`) with the extra surface of :class:`RealNvml`."""

    def __init__(self, path: str) -> None:
        from exporter.worker.fakenvml.binding import FakeNvml  # lazily: the real path never loads the fake

        epoch = os.environ.get("NVGPU_FAKE_EPOCH")
        self._fake = FakeNvml(path, epoch=float(epoch) if epoch else None)
        self.NVMLError = self._fake.NVMLError

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fake, name)

    def clock(self) -> float:
        """Scenario time: windows measured on it match the scenario's ramps and cycles."""
        return self._fake.now()

    def timestamp_us(self) -> int:
        """Now as the fake stamps its samples (its clock, in µs since 1970)."""
        return self._fake.timestamp_us()

    def field_values(self, handle: Any, pairs: list[tuple[int, int]]) -> list[FieldValue]:
        """Same contract as :meth:`RealNvml.field_values`."""
        return [decode_entry(e) for e in self._fake.nvmlDeviceGetFieldValues(handle, pairs)]

    def proc_view(self) -> nativelib.ProcView:
        """The scenario's ``native_library`` as ``/proc/self`` would show it (the real files are never read)."""
        maps, mountinfo, hosts = self._fake.proc_self()
        return nativelib.ProcView(maps, mountinfo, hosts)

    def realpath(self, path: str) -> str:
        """The scenario's paths are not on this file system: as given."""
        return path

    def binding_version(self) -> str | None:
        """The installed nvidia-ml-py version (the fake raises its errors)."""
        from importlib import metadata

        try:
            return metadata.version("nvidia-ml-py")
        except metadata.PackageNotFoundError:
            return None


def load(spec: str) -> RealNvml | FakeBackend:
    """Load the backend named by ``spec``: ``"nvml"`` or ``"fake:<scenario.json>"``.

    Raises:
        ValueError: unknown spec.
        exporter.common.scenarios.scenario.ScenarioError: bad scenario file.
    """
    if spec == "nvml":
        return RealNvml()
    if spec.startswith(FAKE_PREFIX):
        return FakeBackend(spec[len(FAKE_PREFIX) :])
    raise ValueError(f"NVML backend {spec!r}: expected 'nvml' or 'fake:<scenario file>'")
