"""A scenario-driven stand-in for the ``pynvml`` module, with real faults.

The worker loads this instead of ``pynvml`` when ``NVGPU_NVML_BACKEND=fake:<scenario.json>``. It
answers the pynvml functions the exporter uses from the scenario (docs/scenarios.md), raises real
``pynvml.NVMLError`` codes, and injects faults that behave like the real thing: a NULL read through
ctypes (SIGSEGV), ``abort()`` (SIGABRT, as glibc on heap corruption), hangs that may ignore SIGTERM.

Bad scenario files raise :class:`ScenarioError` naming the file, the place and what was expected.
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pynvml

from exporter.nvml import errors
from exporter.nvml.fake_mig import FakeGpuInstance, FakeMigHandle, MigModel
from exporter.nvml.scenario import _PER_LINK, _PER_LINK_FIELDS, EVENT_TYPES, ScenarioError, load_scenario

__all__ = ["EVENT_TYPES", "FakeHandle", "FakeMigHandle", "FakeNvml", "ScenarioError", "crash_segfault"]


class FakeHandle:
    """A device handle; only the fake's own handles are valid arguments."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<FakeHandle gpu={self.index}>"


class FakeEventSet:
    """An event set: which GPUs registered, when, and which scenario events were delivered."""

    def __init__(self) -> None:
        self.registered: dict[int, float] = {}  # gpu index -> scenario time of registration
        self.delivered: set[int] = set()


def _integral(cycle: Mapping[str, Any], t: float) -> float:
    """The integral from 0 to ``t`` of a cycle of numbers (a counter of time spent in a state)."""
    values, step = [float(v) for v in cycle["cycle"]], float(cycle["step_s"])
    t = max(t, 0.0)
    periods, rest = divmod(t, step * len(values))
    total = periods * step * sum(values)
    for v in values:
        if rest <= 0:
            break
        total += v * min(step, rest)
        rest -= step
    return total


class _GpmSample:
    """One ``nvmlGpmSampleAlloc`` buffer: the memory its pointer points at, and what it holds."""

    def __init__(self) -> None:
        self.buffer = ctypes.create_string_buffer(16)
        self.gpu: int | None = None  # GPU index of the last nvmlGpmSampleGet, None while empty
        self.gi: int | None = None  # GPU instance of an nvmlGpmMigSampleGet, None for the whole GPU
        self.t = 0.0  # scenario time of that sample


def crash_segfault() -> None:
    """Die by a real SIGSEGV: read address 0 through ctypes."""
    ctypes.string_at(0)


def _err(code: int | str) -> pynvml.NVMLError:
    return pynvml.NVMLError(errors.parse_code(code))


class Faults:
    """The scenario's faults: each matches calls (function, GPU, fields, time window, call numbers)
    and acts before the value lookup (docs/scenarios.md, "Faults")."""

    def __init__(self, faults: list[dict[str, Any]]) -> None:
        self._faults = faults
        self._exclusive = threading.Lock()  # "exclusive": true: one such delay at a time (a driver lock)

    def apply(self, fn: str, gpu: int | None, count: int, fields: Sequence[int], t: float) -> None:
        """Act on every fault that matches this call, in order."""
        for fault in self._faults:
            if self._matches(fault, fn, gpu, count, fields, t):
                if fault.get("exclusive"):
                    with self._exclusive:
                        self._act(fault)
                else:
                    self._act(fault)

    @staticmethod
    def _matches(
        fault: Mapping[str, Any], fn: str, gpu: int | None, count: int, fields: Sequence[int], t: float
    ) -> bool:
        name = fault.get("function", "*")
        return (
            (name == "*" or name == fn)
            and ("gpu" not in fault or fault["gpu"] == gpu)
            and ("fields" not in fault or bool(set(fault["fields"]) & set(fields)))
            and ("from_s" not in fault or t >= fault["from_s"])
            and ("until_s" not in fault or t < fault["until_s"])
            and ("calls" not in fault or count in fault["calls"])
            and ("after_calls" not in fault or count >= fault["after_calls"])
        )

    @staticmethod
    def _act(fault: Mapping[str, Any]) -> None:
        action = fault["action"]
        if action == "error":
            raise _err(fault["error"])
        if action == "segfault":
            crash_segfault()
        if action == "abort":
            os.abort()
        if action == "exit":
            os._exit(int(fault.get("code", 1)))
        if action in ("hang", "delay"):
            if fault.get("ignore_sigterm"):
                if threading.current_thread() is threading.main_thread():
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                else:  # only the main thread may set handlers; keep SIGTERM away from this thread
                    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            seconds = fault.get("seconds")
            deadline = None if seconds is None else time.monotonic() + float(seconds)
            while deadline is None or time.monotonic() < deadline:
                time.sleep(0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic())))


# -- process lists as the binding decodes them (docs/scenarios.md, "Process lists") ----------------

_U32 = 0xFFFFFFFF
_U64 = (1 << 64) - 1
_PROCESS_LISTS = (  # the compute list of a GPU, in the order the fake looks for its spec
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)


class _ProcessInfoV2(ctypes.Structure):
    """nvmlProcessInfo_v2_t, 24 bytes: what nvidia-ml-py reads for _v2 and _v3."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _ProcessInfoR535(ctypes.Structure):
    """The 32-byte record drivers 535.43-535.86 write through the _v3 calls (nvml-notes §5.1)."""

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
        usedGpuMemory=None if mem == _U64 else mem,
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
    written = (_ProcessInfoR535 * n)()
    for i, r in enumerate(records):
        written[i].pid = _u(getattr(r, "pid", 0), 0, _U32)
        written[i].usedGpuMemory = _u(getattr(r, "usedGpuMemory", None), _U64, _U64)
        written[i].gpuInstanceId = _u(getattr(r, "gpuInstanceId", None), _U32, _U32)
        written[i].computeInstanceId = _u(getattr(r, "computeInstanceId", None), _U32, _U32)
        written[i].usedGpuCcProtectedMemory = 0
    array = (ctypes.c_char * (ctypes.sizeof(_ProcessInfoV2) * (n * 2 + 5)))()
    ctypes.memmove(array, written, ctypes.sizeof(written))
    read = (_ProcessInfoV2 * n).from_buffer(array)
    return [_friendly(read[i]) for i in range(n)]


def swapped(records: Sequence[Any]) -> list[SimpleNamespace]:
    """``records`` with pid and usedGpuMemory exchanged, as a binding with the fields in the other
    order decodes them (the pid shows up as a byte count and the memory as a pid)."""
    return [
        SimpleNamespace(
            pid=getattr(r, "usedGpuMemory", None),
            usedGpuMemory=getattr(r, "pid", None),
            gpuInstanceId=getattr(r, "gpuInstanceId", _U32),
            computeInstanceId=getattr(r, "computeInstanceId", _U32),
        )
        for r in records
    ]


STRUCT_LAYOUTS: dict[str, Callable[[Sequence[Any]], list[SimpleNamespace]]] = {
    "r535_v3": misaligned_r535,
    "swapped": swapped,
}


def churn(spec: Mapping[str, Any], t: float) -> list[SimpleNamespace]:
    """Short-lived processes: process ``i`` (pid ``first_pid + i``) starts at ``i / per_s`` and
    exits ``lifetime_s`` later; ``count`` (optional) processes in all."""
    per_s, life = float(spec["per_s"]), float(spec["lifetime_s"])
    last = math.floor(t * per_s + 1e-9)
    first = max(0, math.floor((t - life) * per_s + 1e-9) + 1)
    if "count" in spec:
        last = min(last, int(spec["count"]) - 1)
    return [
        SimpleNamespace(
            pid=int(spec["first_pid"]) + i,
            usedGpuMemory=spec.get("used_bytes"),
            gpuInstanceId=_U32,
            computeInstanceId=_U32,
        )
        for i in range(first, last + 1)
    ]


class _PerProcess:
    """A utilization spec that applies to every process of the GPU's compute list."""

    def __init__(self, values: Any) -> None:
        self.values = values


class _FakeCore:
    """Scenario, clock, faults, values, and the calls of every GPU (library, identity, memory,
    field values, and any other per-device getter answered from ``values``)."""

    NVMLError = pynvml.NVMLError

    def __init__(self, path: str, epoch: float | None = None, clock: Callable[[], float] = time.time):
        self._path = path
        self._clock = clock
        self._epoch = clock() if epoch is None else epoch
        self._scenario = load_scenario(path)
        self._gpus: list[dict[str, Any]] = self._scenario["gpus"]
        self._missing = set(self._scenario.get("missing_functions", []))
        self._faults = Faults(self._scenario.get("faults", []))
        self._events: list[dict[str, Any]] = self._scenario.get("events", [])
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._initialised = 0
        self._gpm_samples: dict[int, _GpmSample] = {}  # address of an allocated sample -> its state
        self._metrics_get_inside = 0  # threads in nvmlGpmMetricsGet (the real one is not reentrant)
        self._metrics_get_count = threading.Lock()

    # -- time, values, faults ------------------------------------------------------------------

    def now(self) -> float:
        """Scenario time in seconds."""
        return self._clock() - self._epoch

    def _resolve(self, spec: Any, t: float, layout: bool = True) -> Any:
        """A value spec at scenario time ``t``; ``layout=False`` gives a struct spec's records
        as NVML meant them (the truth behind a misread list)."""
        if isinstance(spec, dict):
            if "error" in spec:
                raise _err(spec["error"])
            if "cycle" in spec:
                seq = spec["cycle"]
                return self._resolve(seq[int(math.floor(t / spec["step_s"])) % len(seq)], t, layout)
            if "ramp" in spec:
                return int(spec["ramp"] + spec["per_s"] * max(t, 0.0))
            if "integral" in spec:
                return int(spec.get("initial", 0) + spec.get("scale", 1) * _integral(spec["integral"], t))
            if "sequence" in spec:
                for entry in spec["sequence"]:
                    if "until_s" not in entry or t < entry["until_s"]:
                        return self._resolve(entry.get("value"), t, layout)
                raise _err(errors.NOT_SUPPORTED)
            if "struct" in spec:
                records = self._resolve(spec["records"], t, layout)
                return STRUCT_LAYOUTS[spec["struct"]](records) if layout else records
            if "churn" in spec:
                return churn(spec["churn"], t)
            if "per_process" in spec:
                return _PerProcess(self._resolve(spec["per_process"], t, layout))
            return SimpleNamespace(**{k: self._resolve(v, t, layout) for k, v in spec.items()})
        if isinstance(spec, list):
            return [self._resolve(v, t, layout) for v in spec]
        return spec

    def _enter(self, fn: str, gpu: int | None, fields: Sequence[int] = ()) -> None:
        with self._lock:
            count = self._counts[fn] = self._counts.get(fn, 0) + 1
        self._faults.apply(fn, gpu, count, fields, self.now())
        if fn in self._missing:
            raise _err(errors.FUNCTION_NOT_FOUND)
        if fn != "nvmlInit" and not self._initialised:
            raise _err(errors.UNINITIALIZED)

    def _gpu(self, handle: Any) -> dict[str, Any]:
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self._gpus):
            # A real bad handle is a wild pointer: the library reads garbage and crashes.
            crash_segfault()
        gpu: dict[str, Any] = self._gpus[handle.index]
        return gpu

    def _value(self, gpu: dict[str, Any], fn: str, args: Sequence[Any], t: float | None = None) -> Any:
        values = gpu.get("values", {})
        keys = []
        if args:
            keys.append(f"{fn}:{','.join(str(a) for a in args)}")
            keys.append(f"{fn}:{args[0]}")
        keys.append(fn)
        for key in keys:
            if key in values:
                return self._resolve(values[key], self.now() if t is None else t)
        raise _err(errors.NOT_SUPPORTED)

    # -- library ----------------------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self._enter("nvmlInit", None)
        self._initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._enter("nvmlShutdown", None)
        self._initialised = max(0, self._initialised - 1)

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._enter("nvmlSystemGetDriverVersion", None)
        return str(self._resolve(self._scenario.get("driver_version", "580.159.04"), self.now()))

    def nvmlSystemGetNVMLVersion(self) -> str:  # noqa: N802
        self._enter("nvmlSystemGetNVMLVersion", None)
        return str(self._resolve(self._scenario.get("nvml_version", "13.580.159.04"), self.now()))

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        self._enter("nvmlSystemGetCudaDriverVersion", None)
        return int(self._scenario.get("cuda_driver_version", 13000))

    def kernel_module_version(self) -> str:
        """What ``/proc/driver/nvidia/version`` would say (``kernel_module_version``, else the
        driver version): not an NVML call, so no faults apply."""
        spec = self._scenario.get("kernel_module_version", self._scenario.get("driver_version", "580.159.04"))
        return str(self._resolve(spec, self.now()))

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetCount", None)
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:  # noqa: N802
        self._enter("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self._gpus):
            raise _err(errors.INVALID_ARGUMENT)
        return FakeHandle(index)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str | bytes) -> FakeHandle:  # noqa: N802
        """By PCI bus id (``00000000:00:06.0`` or ``0000:00:06.0``, case-insensitive)."""
        text = (bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)).strip().upper()
        wanted = text[-12:] if len(text) >= 12 else text
        index = next(
            (i for i, g in enumerate(self._gpus) if str(g.get("pci_bus_id", "")).upper().endswith(wanted)), None
        )
        self._enter("nvmlDeviceGetHandleByPciBusId", index)
        if index is None:
            raise _err(errors.NOT_FOUND)
        return FakeHandle(index)

    # -- identity --------------------------------------------------------------------------

    def _identity(self, fn: str, handle: Any, key: str, default: Any) -> Any:
        self._enter(fn, getattr(handle, "index", None))
        gpu = self._gpu(handle)
        if fn in gpu.get("values", {}):
            return self._value(gpu, fn, ())
        if key not in gpu and default is None:
            raise _err(errors.NOT_SUPPORTED)
        return gpu.get(key, default)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:  # noqa: N802
        return str(self._identity("nvmlDeviceGetUUID", handle, "uuid", None))

    def nvmlDeviceGetName(self, handle: Any) -> str:  # noqa: N802
        return str(self._identity("nvmlDeviceGetName", handle, "name", "NVIDIA H200"))

    def nvmlDeviceGetSerial(self, handle: Any) -> str:  # noqa: N802
        return str(self._identity("nvmlDeviceGetSerial", handle, "serial", None))

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:  # noqa: N802
        return int(self._identity("nvmlDeviceGetMinorNumber", handle, "minor_number", handle.index))

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:  # noqa: N802
        return int(self._identity("nvmlDeviceGetArchitecture", handle, "architecture", 9))

    def nvmlDeviceGetPciInfo(self, handle: Any) -> SimpleNamespace:  # noqa: N802
        bus = self._identity("nvmlDeviceGetPciInfo", handle, "pci_bus_id", None)
        if isinstance(bus, SimpleNamespace):
            return bus
        return SimpleNamespace(busId=str(bus), busIdLegacy=str(bus)[4:])

    # -- special shapes ----------------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> SimpleNamespace:  # noqa: N802
        fn = "nvmlDeviceGetMemoryInfo"
        self._enter(fn, getattr(handle, "index", None))
        if version is not None and "nvmlDeviceGetMemoryInfo_v2" in self._missing:
            raise _err(errors.FUNCTION_NOT_FOUND)
        mem = self._value(self._gpu(handle), fn, ())
        reserved = getattr(mem, "reserved", 0)
        if version is None:  # v1: used includes the driver's reservation
            return SimpleNamespace(total=mem.total, free=mem.free, used=mem.used + reserved)
        return SimpleNamespace(version=version, total=mem.total, reserved=reserved, free=mem.free, used=mem.used)

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Sequence[Any]) -> list[SimpleNamespace]:  # noqa: N802
        pairs = [(f, 0) if isinstance(f, int) else (int(f[0]), int(f[1])) for f in field_ids]
        self._enter("nvmlDeviceGetFieldValues", getattr(handle, "index", None), [p[0] for p in pairs])
        gpu = self._gpu(handle)
        if not pairs:
            raise _err(errors.INVALID_ARGUMENT)
        fields = gpu.get("fields", {})
        links = gpu.get("nvlink_link_count", 0)
        default = errors.parse_code(gpu.get("default_field_error", "NOT_SUPPORTED"))
        t = self.now()
        out = []
        for fid, scope in pairs:
            entry = SimpleNamespace(
                fieldId=fid,
                scopeId=scope,
                timestamp=int(self._clock() * 1e6),
                latencyUsec=1,
                valueType=3,
                nvmlReturn=0,
                value=SimpleNamespace(dVal=0.0, uiVal=0, ulVal=0, ullVal=0, sllVal=0, siVal=0, usVal=0),
            )
            spec_key = f"{fid}:{scope}" if f"{fid}:{scope}" in fields else str(fid)
            if fid in _PER_LINK_FIELDS and scope != 0xFFFFFFFF and scope >= links:
                entry.nvmlReturn = errors.INVALID_ARGUMENT
            elif spec_key not in fields:
                entry.nvmlReturn = default
            else:
                try:
                    value = self._resolve(fields[spec_key], t)
                except pynvml.NVMLError as exc:
                    entry.nvmlReturn = exc.value
                else:
                    if isinstance(value, float):
                        entry.valueType, entry.value.dVal = 0, value
                    else:
                        v = int(value)
                        entry.value.ullVal = entry.value.ulVal = entry.value.uiVal = v
                        entry.value.sllVal = entry.value.siVal = v
            out.append(entry)
        return out

    # -- everything else: per-device getters answered from "values" ------------------------------

    def __getattr__(self, fn: str) -> Callable[..., Any]:
        if not fn.startswith("nvmlDevice"):
            raise AttributeError(fn)

        def call(handle: Any, *args: Any) -> Any:
            self._enter(fn, getattr(handle, "index", None))
            gpu = self._gpu(handle)
            if fn in _PER_LINK and args and int(args[0]) >= gpu.get("nvlink_link_count", 0):
                raise _err(errors.INVALID_ARGUMENT)
            return self._value(gpu, fn, args)

        call.__name__ = fn
        return call

    def call_counts(self) -> dict[str, int]:
        """Calls per function name in this process (tests)."""
        with self._lock:
            return dict(self._counts)


class _FakeProcesses(_FakeCore):
    """Per-process utilization, from the GPU's true (not misread) process list."""

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[SimpleNamespace]:  # noqa: N802, N803
        """Samples newer than ``timeStamp`` (µs since 1970), as NVML returns them.

        The spec is a list of samples (``pid``, ``smUtil``, ``memUtil``, ``encUtil``,
        ``decUtil``, optional ``timeStamp``) or ``{"per_process": {...}}`` (one sample per
        process of the GPU's compute list). A sample without ``timeStamp`` is stamped now, and
        never older than the request, so each call sees fresh data as a busy GPU gives; none
        newer than ``timeStamp`` raises NOT_FOUND, as the driver does.
        """
        fn = "nvmlDeviceGetProcessUtilization"
        self._enter(fn, getattr(handle, "index", None))
        gpu = self._gpu(handle)
        if fn not in gpu.get("values", {}):
            raise _err(errors.NOT_SUPPORTED)
        t = self.now()
        value = self._resolve(gpu["values"][fn], t)
        if isinstance(value, _PerProcess):
            template = value.values
            value = [
                SimpleNamespace(
                    pid=p.pid, **{k: getattr(template, k, 0) for k in ("smUtil", "memUtil", "encUtil", "decUtil")}
                )
                for p in self._true_processes(gpu, t)
            ]
        fresh = max(int(self._clock() * 1e6), int(timeStamp) + 1)
        out = []
        for sample in value or []:
            ts = getattr(sample, "timeStamp", None)
            stamped = SimpleNamespace(**{**vars(sample), "timeStamp": fresh if ts is None else ts})
            if stamped.timeStamp > int(timeStamp):
                out.append(stamped)
        if not out:
            raise _err(errors.NOT_FOUND)
        return out

    def _true_processes(self, gpu: dict[str, Any], t: float) -> list[Any]:
        """The GPU's compute processes as NVML meant them (struct layouts not applied)."""
        values = gpu.get("values", {})
        for fn in _PROCESS_LISTS:
            if fn in values:
                try:
                    found = self._resolve(values[fn], t, layout=False)
                except pynvml.NVMLError:
                    return []
                return list(found or [])
        return []


class _FakeEvents(_FakeCore):
    """NVML event sets: events are delivered once scenario time passes them, to sets registered before."""

    def nvmlEventSetCreate(self) -> FakeEventSet:  # noqa: N802
        self._enter("nvmlEventSetCreate", None)
        return FakeEventSet()

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:  # noqa: N802
        self._enter("nvmlEventSetFree", None)

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, event_set: FakeEventSet) -> None:  # noqa: N802
        fn = "nvmlDeviceRegisterEvents"
        self._enter(fn, getattr(handle, "index", None))
        gpu = self._gpu(handle)
        spec = gpu.get("values", {}).get(fn)
        if spec is not None:
            self._resolve(spec, self.now())  # raises the scenario's error, if any
        supported = self._value(gpu, "nvmlDeviceGetSupportedEventTypes", ())
        if mask & ~int(supported):
            raise _err(errors.NOT_SUPPORTED)
        event_set.registered[handle.index] = self.now()

    def nvmlEventSetWait_v2(self, event_set: FakeEventSet, timeout_ms: int) -> SimpleNamespace:  # noqa: N802
        self._enter("nvmlEventSetWait_v2", None)
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            t = self.now()
            for i, ev in enumerate(self._events):
                reg = event_set.registered.get(ev["gpu"])
                if i in event_set.delivered or reg is None or not reg <= ev["at_s"] <= t:
                    continue
                event_set.delivered.add(i)
                return SimpleNamespace(
                    device=FakeHandle(ev["gpu"]),
                    eventType=EVENT_TYPES[ev["event_type"]],
                    eventData=int(ev.get("data", 0)),
                    gpuInstanceId=0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF,
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _err(errors.TIMEOUT)
            time.sleep(min(remaining, 0.05))


class _FakeGpm(_FakeCore):
    """GPM (GPU performance monitoring, Hopper and newer) and fabric info, as pynvml shapes them."""

    # -- GPM: GPU performance monitoring (Hopper and newer) -------------------------------------
    #
    # As pynvml shapes them: nvmlGpmSampleAlloc returns a c_nvmlGpmSample_t (an opaque pointer);
    # nvmlGpmSampleGet fills it for one GPU; nvmlGpmMetricsGet takes a c_nvmlGpmMetricsGet_t
    # (version, numMetrics, sample1, sample2, metrics[i].metricId) and fills each entry's
    # nvmlReturn and value; nvmlGpmSampleFree releases it. Per GPU, "nvmlGpmQueryDeviceSupport"
    # ({"isSupportedDevice": 1}) says whether GPM works (no value: NOT_SUPPORTED, as an old driver),
    # and "nvmlGpmMetricsGet:<metric id>" gives each metric's value (percent or MiB/s, any value
    # spec, evaluated at the newer sample's time; an error spec sets that entry's nvmlReturn; no
    # value: NOT_SUPPORTED). Misuse behaves like the real library: a NULL sample is
    # INVALID_ARGUMENT, an unknown pointer crashes (SIGSEGV), freeing twice aborts (SIGABRT).

    c_nvmlGpmMetricsGet_t = getattr(pynvml, "c_nvmlGpmMetricsGet_t", None)
    NVML_GPM_METRICS_GET_VERSION = getattr(pynvml, "NVML_GPM_METRICS_GET_VERSION", None)
    c_nvmlGpuFabricInfo_v2_t = getattr(pynvml, "c_nvmlGpuFabricInfo_v2_t", None)
    c_nvmlGpuFabricInfo_v3_t = getattr(pynvml, "c_nvmlGpuFabricInfo_v3_t", None)

    def _gpm_supported(self, gpu: dict[str, Any]) -> bool:
        try:
            support = self._value(gpu, "nvmlGpmQueryDeviceSupport", ())
        except pynvml.NVMLError:
            return False
        return bool(getattr(support, "isSupportedDevice", 0))

    def _gpm_sample(self, sample: Any) -> _GpmSample:
        address = ctypes.cast(sample, ctypes.c_void_p).value if sample is not None else None
        if not address:
            raise _err(errors.INVALID_ARGUMENT)
        state = self._gpm_samples.get(address)
        if state is None:  # never allocated, or freed: a wild pointer
            crash_segfault()
        assert state is not None
        return state

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> SimpleNamespace:  # noqa: N802
        fn = "nvmlGpmQueryDeviceSupport"
        self._enter(fn, getattr(handle, "index", None))
        value = self._value(self._gpu(handle), fn, ())
        return SimpleNamespace(version=1, isSupportedDevice=int(getattr(value, "isSupportedDevice", 0)))

    def nvmlGpmSampleAlloc(self) -> Any:  # noqa: N802
        self._enter("nvmlGpmSampleAlloc", None)
        state = _GpmSample()
        address = ctypes.addressof(state.buffer)
        self._gpm_samples[address] = state
        return ctypes.cast(state.buffer, pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:  # noqa: N802
        self._enter("nvmlGpmSampleFree", None)
        address = ctypes.cast(sample, ctypes.c_void_p).value if sample is not None else None
        if not address:
            raise _err(errors.INVALID_ARGUMENT)
        if self._gpm_samples.pop(address, None) is None:
            os.abort()  # double free: glibc aborts

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:  # noqa: N802
        fn = "nvmlGpmSampleGet"
        self._enter(fn, getattr(handle, "index", None))
        gpu = self._gpu(handle)
        state = self._gpm_sample(sample)
        spec = gpu.get("values", {}).get(fn)
        if spec is not None:
            self._resolve(spec, self.now())  # raises the scenario's error, if any
        if not self._gpm_supported(gpu):
            raise _err(errors.NOT_SUPPORTED)
        state.gpu, state.gi, state.t = handle.index, None, self.now()
        return sample

    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any:  # noqa: N802
        """As the real library: two threads inside at once die by SIGSEGV (measured on the H200 pair,
        driver 580.159.04: docs/validation/2026-11-30-h200x2/gpm-concurrency.md). The call holds for
        a moment, so that callers that do not serialize it overlap here as they do on hardware."""
        with self._metrics_get_count:
            overlapping = self._metrics_get_inside > 0
            self._metrics_get_inside += 1
        try:
            if overlapping:
                crash_segfault()
            time.sleep(0.003)
            return self._metrics_get(metrics_get)
        finally:
            with self._metrics_get_count:
                self._metrics_get_inside -= 1

    def _metrics_get(self, metrics_get: Any) -> Any:
        fn = "nvmlGpmMetricsGet"
        older = self._gpm_samples.get(ctypes.cast(metrics_get.sample1, ctypes.c_void_p).value or 0)
        self._enter(fn, older.gpu if older is not None else None)  # the GPU, for faults matching "gpu"
        if metrics_get.version != self.NVML_GPM_METRICS_GET_VERSION:
            raise _err(errors.ARGUMENT_VERSION_MISMATCH)
        first, second = self._gpm_sample(metrics_get.sample1), self._gpm_sample(metrics_get.sample2)
        if first.gpu is None or second.gpu is None or first.gpu != second.gpu or second.t < first.t:
            raise _err(errors.INVALID_ARGUMENT)  # unfilled samples, two GPUs, or in the wrong order
        if not 0 < metrics_get.numMetrics <= len(metrics_get.metrics):
            raise _err(errors.INVALID_ARGUMENT)
        gpu = self._gpus[second.gpu]
        for i in range(metrics_get.numMetrics):
            entry = metrics_get.metrics[i]
            try:
                value = self._value(gpu, fn, (int(entry.metricId),), t=second.t)
            except pynvml.NVMLError as exc:
                entry.nvmlReturn, entry.value = int(exc.value), 0.0
            else:
                entry.nvmlReturn, entry.value = 0, float(value)
        return metrics_get

    # -- fabric ------------------------------------------------------------------------------------

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:  # noqa: N802
        """Fill the caller's versioned struct (pynvml passes ``byref(struct)`` through).

        Values: ``"nvmlDeviceGetGpuFabricInfoV"`` ({"state": 3, "status": 0, "cliqueId": 0,
        "healthMask": 0, "healthSummary": 0}); ``"nvmlDeviceGetGpuFabricInfoV:<struct major
        version>"`` overrides it for one version, e.g. {"error": "ARGUMENT_VERSION_MISMATCH"} for a
        driver that knows only v2.
        """
        fn = "nvmlDeviceGetGpuFabricInfoV"
        self._enter(fn, getattr(handle, "index", None))
        gpu = self._gpu(handle)
        struct = getattr(info, "_obj", info)
        value = self._value(gpu, fn, (int(struct.version) >> 24,))
        names = {name for name, *_ in struct._fields_}
        for name, v in vars(value).items():
            if name in names and name not in ("version", "clusterUuid"):
                setattr(struct, name, int(v))
        return 0


class _FakeMig(_FakeGpm):
    """MIG (docs/scenarios.md, "MIG"): the calls on a GPU with a ``mig`` object, and every call made
    with a MIG device handle (answered from its instance, :class:`~exporter.nvml.fake_mig.MigModel`)."""

    @property
    def _mig(self) -> MigModel:
        model = self.__dict__.get("_mig_model")
        if model is None:
            model = self.__dict__["_mig_model"] = MigModel(self._gpus, self._resolve, self.now)
        return model

    def _parent(self, fn: str, handle: Any, *args: Any) -> int | None:
        """Enter ``fn`` on a parent handle; the GPU index when it has a ``mig`` object, else None
        (answered from ``values`` by the caller)."""
        self._enter(fn, getattr(handle, "index", getattr(handle, "gpu", None)))
        if isinstance(handle, FakeMigHandle):
            self._mig.instance(handle)  # a stale handle answers INVALID_ARGUMENT
            raise _err(errors.NOT_SUPPORTED)  # not on a MIG device handle
        self._gpu(handle)
        return handle.index if self._mig.spec(handle.index) is not None else None

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:  # noqa: N802
        gpu = self._parent("nvmlDeviceGetMigMode", handle)
        if gpu is None:
            return list(self._value(self._gpu(handle), "nvmlDeviceGetMigMode", ()))
        return self._mig.mode(gpu)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:  # noqa: N802
        gpu = self._parent("nvmlDeviceGetMaxMigDeviceCount", handle)
        if gpu is None:
            values = self._gpu(handle).get("values", {})
            if "nvmlDeviceGetMaxMigDeviceCount" not in values and "nvmlDeviceGetMigMode" in values:
                return 0  # a MIG-capable GPU with MIG off answers 0 (nvml-notes §2.2, measured on the H200)
            return int(self._value(self._gpu(handle), "nvmlDeviceGetMaxMigDeviceCount", ()))
        return self._mig.max_devices(gpu)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> FakeMigHandle:  # noqa: N802
        gpu = self._parent("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if gpu is None:
            raise _err(errors.NOT_FOUND)  # no MIG device without a mig object (as with MIG off)
        return self._mig.handle(gpu, int(index))

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gpu_instance_id: int) -> FakeGpuInstance:  # noqa: N802
        gpu = self._parent("nvmlDeviceGetGpuInstanceById", handle)
        if gpu is None or not self._mig.enabled(gpu):
            raise _err(errors.NOT_SUPPORTED)
        spec = self._gpus[gpu].get("values", {}).get("nvmlDeviceGetGpuInstanceById")
        if spec is not None:
            self._resolve(spec, self.now())  # e.g. {"error": "NO_PERMISSION"}: an unprivileged caller
        self._mig.gpu_instance(gpu, int(gpu_instance_id))
        return FakeGpuInstance(gpu, int(gpu_instance_id))

    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any) -> SimpleNamespace:  # noqa: N802
        self._enter("nvmlGpuInstanceGetInfo", getattr(gpu_instance, "gpu", None))
        if not isinstance(gpu_instance, FakeGpuInstance):
            crash_segfault()  # a wild pointer
        return self._mig.gpu_instance_info(gpu_instance)

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, handle: Any, profile_id: int) -> SimpleNamespace:  # noqa: N802
        gpu = self._parent("nvmlDeviceGetGpuInstanceProfileInfoById", handle)
        if gpu is None:
            raise _err(errors.NOT_SUPPORTED)
        return self._mig.profile(gpu, profile_id=int(profile_id))

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> SimpleNamespace:  # noqa: N802
        gpu = self._parent("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        if gpu is None:
            raise _err(errors.NOT_SUPPORTED)
        return self._mig.profile(gpu, index=int(profile))

    def nvmlDeviceGetUUID(self, handle: Any) -> str:  # noqa: N802
        if isinstance(handle, FakeMigHandle):
            self._enter("nvmlDeviceGetUUID", handle.gpu)
            return str(self._mig.instance(handle)["uuid"])
        return super().nvmlDeviceGetUUID(handle)

    def nvmlDeviceGetName(self, handle: Any) -> str:  # noqa: N802
        if isinstance(handle, FakeMigHandle):
            self._enter("nvmlDeviceGetName", handle.gpu)
            gpu = self._gpus[handle.gpu]
            return self._mig.name(handle, str(gpu.get("name", "NVIDIA H200")))
        return super().nvmlDeviceGetName(handle)

    def _mig_id(self, fn: str, handle: Any, key: str) -> int:
        self._enter(fn, getattr(handle, "gpu", getattr(handle, "index", None)))
        if not isinstance(handle, FakeMigHandle):
            self._gpu(handle)
            raise _err(errors.INVALID_ARGUMENT)  # not a MIG device handle
        return int(self._mig.instance(handle)[key])

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:  # noqa: N802
        return self._mig_id("nvmlDeviceGetGpuInstanceId", handle, "gpu_instance_id")

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:  # noqa: N802
        return self._mig_id("nvmlDeviceGetComputeInstanceId", handle, "compute_instance_id")

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> SimpleNamespace:  # noqa: N802
        if not isinstance(handle, FakeMigHandle):
            return super().nvmlDeviceGetMemoryInfo(handle, version)
        self._enter("nvmlDeviceGetMemoryInfo", handle.gpu)
        mem = self._mig.value(handle, "nvmlDeviceGetMemoryInfo", ())
        reserved = getattr(mem, "reserved", 0)
        if version is None:
            return SimpleNamespace(total=mem.total, free=mem.free, used=mem.used + reserved)
        return SimpleNamespace(version=version, total=mem.total, reserved=reserved, free=mem.free, used=mem.used)

    def __getattr__(self, fn: str) -> Callable[..., Any]:
        on_gpu = super().__getattr__(fn)  # AttributeError for anything that is not a device call

        def call(handle: Any, *args: Any) -> Any:
            if not isinstance(handle, FakeMigHandle):
                return on_gpu(handle, *args)
            self._enter(fn, handle.gpu)
            return self._mig.value(handle, fn, args)

        call.__name__ = fn
        return call

    # -- GPM per GPU instance ----------------------------------------------------------------------

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:  # noqa: N802
        if isinstance(handle, FakeHandle) and self._mig.enabled(handle.index):
            self._enter("nvmlGpmSampleGet", handle.index)
            raise _err(errors.NOT_SUPPORTED)  # the whole GPU is not sampled in MIG mode
        return super().nvmlGpmSampleGet(handle, sample)

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: int, sample: Any) -> Any:  # noqa: N802
        fn = "nvmlGpmMigSampleGet"
        gpu = self._parent(fn, handle)
        state = self._gpm_sample(sample)
        if gpu is None or not self._mig.enabled(gpu) or not self._gpm_supported(self._gpus[gpu]):
            raise _err(errors.NOT_SUPPORTED)
        inst = self._mig.gpu_instance(gpu, int(gpu_instance_id))  # INVALID_ARGUMENT when gone
        if fn in inst.get("values", {}):
            self._mig.value_spec(inst, fn)  # a per-instance error spec
        state.gpu, state.gi, state.t = gpu, int(gpu_instance_id), self.now()
        return sample

    def _metrics_get(self, metrics_get: Any) -> Any:
        first = self._gpm_samples.get(ctypes.cast(metrics_get.sample1, ctypes.c_void_p).value or 0)
        second = self._gpm_samples.get(ctypes.cast(metrics_get.sample2, ctypes.c_void_p).value or 0)
        if first is None or second is None or (first.gi is None and second.gi is None):
            return super()._metrics_get(metrics_get)
        fn = "nvmlGpmMetricsGet"
        self._enter(fn, first.gpu)
        if metrics_get.version != self.NVML_GPM_METRICS_GET_VERSION:
            raise _err(errors.ARGUMENT_VERSION_MISMATCH)
        if first.gpu != second.gpu or first.gi != second.gi or second.t < first.t:
            raise _err(errors.INVALID_ARGUMENT)  # two GPUs or GPU instances, or the wrong order
        assert second.gpu is not None and second.gi is not None
        self._mig.gpu_instance(second.gpu, second.gi)  # INVALID_ARGUMENT when it went away
        for i in range(metrics_get.numMetrics):
            entry = metrics_get.metrics[i]
            try:
                value = self._mig.gpm_metric(second.gpu, second.gi, int(entry.metricId), second.t)
            except KeyError:
                entry.nvmlReturn, entry.value = errors.NOT_SUPPORTED, 0.0
            except pynvml.NVMLError as exc:
                entry.nvmlReturn, entry.value = int(exc.value), 0.0
            else:
                entry.nvmlReturn, entry.value = 0, float(value)
        return metrics_get


class FakeNvml(_FakeMig, _FakeProcesses, _FakeEvents):
    """pynvml look-alike answering from a scenario.

    Args:
        path: scenario JSON file.
        epoch: Unix time that is scenario time 0 (the supervisor's start); default: now.
        clock: time source (tests).

    Raises:
        ScenarioError: the file is unreadable or not a valid scenario.
    """
