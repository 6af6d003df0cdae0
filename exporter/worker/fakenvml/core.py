"""The fake NVML's core: scenario, clock, faults, which GPUs exist, and the calls every GPU answers.

:class:`FakeCore` holds what every call needs and answers the library, system, handle, identity,
memory and field-value calls, plus any other ``nvmlDevice*`` getter from the GPU's ``values``
(docs/scenarios.md, "Values"). The domain modules beside it (``mig``, ``gpm``, ``fabric``,
``processes``, ``events``) add the calls with special shapes, through this class's public methods:
:meth:`FakeCore.enter` before each call, :meth:`FakeCore.gpu_of` for a handle, :meth:`FakeCore.value`
and :meth:`FakeCore.resolve` for the scenario's answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pynvml

from exporter.common.nvml import errors
from exporter.common.scenarios import scenario, spec
from exporter.worker.fakenvml.faults import Faults, crash_segfault

# Per-link functions and field ids: a link index (argument or scopeId) at or past the GPU's
# nvlink_link_count answers INVALID_ARGUMENT, as real drivers do (NVIDIA/TensorRT-LLM PR 17060, on GB200).
PER_LINK_FUNCTIONS = frozenset(
    {
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkErrorCounter",
        "nvmlDeviceGetNvLinkVersion",
        "nvmlDeviceGetNvLinkRemotePciInfo",
        "nvmlDeviceGetNvLinkCapability",
    }
)
PER_LINK_FIELDS = frozenset(set(range(32, 60)) | set(range(96, 120)) | {138, 139, 140, 141} | set(range(146, 167)))
ALL_LINKS = 0xFFFFFFFF  # the scopeId that sums a per-link field over every link

DRIVER_VERSION = spec.Literal("580.159.04")  # what an unset driver_version answers
NVML_VERSION = spec.Literal("13.580.159.04")


def nvml_error(code: int | str) -> pynvml.NVMLError:
    """The ``pynvml.NVMLError`` for an NVML error name or code."""
    return pynvml.NVMLError(errors.parse_code(code))


def memory_info(mem: Any, version: Any) -> SimpleNamespace:
    """``nvmlDeviceGetMemoryInfo``'s answer from a ``{total, used, free, reserved}`` value: v1
    (``version`` None) counts the driver's reservation as used, v2 reports it apart."""
    reserved = getattr(mem, "reserved", 0)
    if version is None:
        return SimpleNamespace(total=mem.total, free=mem.free, used=mem.used + reserved)
    return SimpleNamespace(version=version, total=mem.total, reserved=reserved, free=mem.free, used=mem.used)


class FakeHandle:
    """A device handle: the scenario GPU it stands for (its position in ``gpus``, which is not its
    NVML index once ``enumeration`` renumbers) and the GPU's presence it was looked up in. Only the
    fake's own handles are valid arguments; one from before the GPU left (or was reset) answers
    GPU_IS_LOST, as a real stale handle does."""

    __slots__ = ("generation", "gpu")

    def __init__(self, gpu: int, generation: int = 1) -> None:
        self.gpu = gpu
        self.generation = generation

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeHandle) and (other.gpu, other.generation) == (self.gpu, self.generation)

    def __hash__(self) -> int:
        return hash((self.gpu, self.generation))

    def __repr__(self) -> str:
        return f"<FakeHandle gpu={self.gpu} generation={self.generation}>"


class Phases:
    """The scenario's ``enumeration`` (docs/scenarios.md, "Enumeration over time"): which GPUs NVML
    enumerates, in index order, over scenario time; a single phase when the scenario has none."""

    def __init__(self, phases: list[dict[str, Any]]) -> None:
        self.phases = phases

    def at(self, t: float) -> tuple[int, ...]:
        """The phase in force at ``t``: the first whose ``until_s`` lies above it, else the last."""
        phases = self.phases
        if len(phases) == 1:
            return phases[0]["gpus"]  # type: ignore[no-any-return]
        return next((p["gpus"] for p in phases if p["until_s"] is None or t < p["until_s"]), phases[-1]["gpus"])

    def generation(self, gpu: int, t: float) -> int | None:
        """Which presence of scenario GPU ``gpu`` this is at ``t`` (1 for the first; one more each
        time it comes back or is reset), None while NVML does not enumerate it."""
        if len(self.phases) == 1:
            return 1 if gpu in self.phases[0]["gpus"] else None
        generation, present = 0, False
        for phase in self.phases:
            here = gpu in phase["gpus"]
            if here and (not present or gpu in phase["reset"]):
                generation += 1
            present = here
            if phase["until_s"] is None or t < phase["until_s"]:
                break
        return generation if present else None


class FakeCore:
    """Scenario, clock, faults, values, and the calls of every GPU.

    Args:
        path: scenario JSON file.
        epoch: when scenario time is 0 (the supervisor's start): a ``time.monotonic()`` instant
            (CLOCK_MONOTONIC is one clock for every process of a host), or, with ``clock``, a time
            on that clock; default: now.
        clock: the scenario clock and the wall clock at once (tests); default: scenario time runs on
            ``time.monotonic()``, so a wall-clock step moves NVML's timestamps (as it would real
            NVML's) but not scenario time, in this worker or the next one.

    Raises:
        ScenarioError: the file is unreadable or not a valid scenario.
    """

    NVMLError = pynvml.NVMLError

    def __init__(self, path: str, epoch: float | None = None, clock: Callable[[], float] | None = None) -> None:
        if clock is None:
            origin_mono = time.monotonic() if epoch is None else epoch
            self._wall: Callable[[], float] = lambda: time.time()  # looked up per call: a clock stepped later
            self._scenario_clock: Callable[[], float] = lambda: time.monotonic() - origin_mono
        else:
            origin = clock() if epoch is None else epoch
            self._wall = clock
            self._scenario_clock = lambda: clock() - origin
        self.scenario = scenario.load_compiled(path)
        self._gpus: list[dict[str, Any]] = self.scenario["gpus"]
        self._phases = Phases(self.scenario["enumeration"])
        self._missing = set(self.scenario.get("missing_functions", []))
        self._faults = Faults(self.scenario.get("faults", []), nvml_error)
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._initialised = 0
        self._as_read = spec.Evaluation(nvml_error)
        self._as_meant = spec.Evaluation(nvml_error, as_read=False)

    # -- for the domain modules: time, values, faults, GPUs ---------------------------------------

    def now(self) -> float:
        """Scenario time in seconds."""
        return self._scenario_clock()

    def timestamp_us(self) -> int:
        """The clock as NVML timestamps are: microseconds since 1970 (the wall clock)."""
        return int(self._wall() * 1e6)

    def resolve(self, value: spec.Spec, t: float, as_read: bool = True) -> Any:
        """A compiled value spec at scenario time ``t``; ``as_read=False`` gives a struct spec's
        records as NVML meant them (the truth behind a misread list)."""
        return value.at(t, self._as_read if as_read else self._as_meant)

    def enter(self, fn: str, gpu: int | None, fields: Sequence[int] = ()) -> None:
        """Count a call of ``fn`` and apply the scenario's faults, then refuse it when the function
        is missing (FUNCTION_NOT_FOUND) or NVML is not initialised (UNINITIALIZED)."""
        with self._lock:
            count = self._counts[fn] = self._counts.get(fn, 0) + 1
        self._faults.apply(fn, gpu, count, fields, self.now())
        if fn in self._missing:
            raise nvml_error(errors.FUNCTION_NOT_FOUND)
        if fn != "nvmlInit" and not self._initialised:
            raise nvml_error(errors.UNINITIALIZED)

    def enumerated(self, t: float | None = None) -> tuple[int, ...]:
        """The scenario GPUs (positions in ``gpus``) NVML enumerates at ``t`` (default now), in
        index order (:class:`Phases`)."""
        return self._phases.at(self.now() if t is None else t)

    def generation(self, gpu: int, t: float | None = None) -> int | None:
        """Which presence of scenario GPU ``gpu`` this is at ``t`` (:meth:`Phases.generation`)."""
        return self._phases.generation(gpu, self.now() if t is None else t)

    def gpu_count(self) -> int:
        """How many GPUs NVML enumerates now."""
        return len(self.enumerated())

    def gpu_at(self, gpu: int) -> dict[str, Any]:
        """The compiled GPU object of scenario GPU ``gpu`` (its position in ``gpus``)."""
        return self._gpus[gpu]

    def handle_of(self, gpu: int) -> FakeHandle:
        """A handle for scenario GPU ``gpu`` as it is now (a stale one while it is not enumerated)."""
        return FakeHandle(gpu, self.generation(gpu) or 0)

    def gpu_of(self, handle: Any) -> dict[str, Any]:
        """The GPU a device handle stands for; anything but a :class:`FakeHandle` crashes, and a handle
        of a GPU that left or was reset since answers GPU_IS_LOST."""
        if not isinstance(handle, FakeHandle) or not 0 <= handle.gpu < len(self._gpus):
            # A real bad handle is a wild pointer: the library reads garbage and crashes.
            crash_segfault()
        if self.generation(handle.gpu) != handle.generation:
            raise nvml_error(errors.GPU_IS_LOST)
        return self.gpu_at(handle.gpu)

    def value(self, gpu: dict[str, Any], fn: str, args: Sequence[Any], t: float | None = None) -> Any:
        """The GPU's ``values`` answer for ``fn(handle, *args)`` at ``t`` (default now): the key
        ``fn:a1,a2…``, then ``fn:a1``, then ``fn``; none: NOT_SUPPORTED."""
        values = gpu["values"]
        keys = []
        if args:
            keys.append(f"{fn}:{','.join(str(a) for a in args)}")
            keys.append(f"{fn}:{args[0]}")
        keys.append(fn)
        for key in keys:
            if key in values:
                return self.resolve(values[key], self.now() if t is None else t)
        raise nvml_error(errors.NOT_SUPPORTED)

    def call_counts(self) -> dict[str, int]:
        """Calls per function name in this process (tests)."""
        with self._lock:
            return dict(self._counts)

    # -- library ----------------------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self.enter("nvmlInit", None)
        self._initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.enter("nvmlShutdown", None)
        self._initialised = max(0, self._initialised - 1)

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self.enter("nvmlSystemGetDriverVersion", None)
        return str(self.resolve(self.scenario.get("driver_version", DRIVER_VERSION), self.now()))

    def nvmlSystemGetNVMLVersion(self) -> str:  # noqa: N802
        self.enter("nvmlSystemGetNVMLVersion", None)
        return str(self.resolve(self.scenario.get("nvml_version", NVML_VERSION), self.now()))

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        self.enter("nvmlSystemGetCudaDriverVersion", None)
        return int(self.scenario.get("cuda_driver_version", 13000))

    def kernel_module_version(self) -> str:
        """What ``/proc/driver/nvidia/version`` would say (``kernel_module_version``, else the
        driver version): not an NVML call, so no faults apply."""
        version = self.scenario.get("kernel_module_version", self.scenario.get("driver_version", DRIVER_VERSION))
        return str(self.resolve(version, self.now()))

    def proc_self(self) -> tuple[str, str, tuple[str, ...]]:
        """What ``/proc/self/maps`` and ``/proc/self/mountinfo`` would say about the mapped
        ``libnvidia-ml.so``, and the host libraries visible, from the scenario's ``native_library``
        (default: the host's ``libnvidia-ml.so.<driver_version>``, bind-mounted as the NVIDIA
        container toolkit mounts it). Not an NVML call: no faults apply."""
        t = self.now()
        raw = self.scenario.get("native_library")
        lib = self.resolve(raw, t) if raw is not None else None
        version = str(self.resolve(self.scenario.get("driver_version", DRIVER_VERSION), t))
        path = str(getattr(lib, "path", f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}"))
        origin = str(getattr(lib, "origin", "host"))
        deleted = " (deleted)" if getattr(lib, "deleted", False) else ""
        maps = "7f0000000000-7f0000100000 r--p 00000000 fd:00 1234  /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        if origin != "none":
            maps += f"7f1000000000-7f1000200000 r-xp 00000000 fd:00 4321  {path}{deleted}\n"
        mountinfo = "1 0 0:50 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w\n"
        if origin == "host":
            mountinfo += f"2 1 259:1 {path} {path} ro,nosuid,nodev,relatime - ext4 /dev/nvme0n1p1 rw\n"
        hosts = tuple(str(h) for h in getattr(lib, "host_libraries", ()))
        return maps, mountinfo, hosts

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self.enter("nvmlDeviceGetCount", None)
        return self.gpu_count()

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:  # noqa: N802
        gpus = self.enumerated()
        self.enter("nvmlDeviceGetHandleByIndex", gpus[index] if 0 <= index < len(gpus) else None)
        if not 0 <= index < len(gpus):
            raise nvml_error(errors.INVALID_ARGUMENT)
        return self.handle_of(gpus[index])

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str | bytes) -> FakeHandle:  # noqa: N802
        """By PCI bus id (``00000000:00:06.0`` or ``0000:00:06.0``, case-insensitive)."""
        text = (bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)).strip().upper()
        wanted = text[-12:] if len(text) >= 12 else text
        gpus = self.enumerated()
        index = next(
            (i for i, g in enumerate(gpus) if str(self.gpu_at(g).get("pci_bus_id", "")).upper().endswith(wanted)),
            None,
        )
        self.enter("nvmlDeviceGetHandleByPciBusId", None if index is None else gpus[index])
        if index is None:
            raise nvml_error(errors.NOT_FOUND)
        return self.handle_of(gpus[index])

    # -- identity --------------------------------------------------------------------------

    def _identity(self, fn: str, handle: Any, key: str, default: Any) -> Any:
        self.enter(fn, getattr(handle, "gpu", None))
        gpu = self.gpu_of(handle)
        if fn in gpu["values"]:
            return self.value(gpu, fn, ())
        if key not in gpu and default is None:
            raise nvml_error(errors.NOT_SUPPORTED)
        return gpu.get(key, default)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:  # noqa: N802
        return str(self._identity("nvmlDeviceGetUUID", handle, "uuid", None))

    def nvmlDeviceGetName(self, handle: Any) -> str:  # noqa: N802
        return str(self._identity("nvmlDeviceGetName", handle, "name", "NVIDIA H200"))

    def nvmlDeviceGetSerial(self, handle: Any) -> str:  # noqa: N802
        return str(self._identity("nvmlDeviceGetSerial", handle, "serial", None))

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:  # noqa: N802
        return int(self._identity("nvmlDeviceGetMinorNumber", handle, "minor_number", handle.gpu))

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
        self.enter(fn, getattr(handle, "gpu", None))
        if version is not None and "nvmlDeviceGetMemoryInfo_v2" in self._missing:
            raise nvml_error(errors.FUNCTION_NOT_FOUND)
        return memory_info(self.value(self.gpu_of(handle), fn, ()), version)

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Sequence[Any]) -> list[SimpleNamespace]:  # noqa: N802
        pairs = [(f, 0) if isinstance(f, int) else (int(f[0]), int(f[1])) for f in field_ids]
        self.enter("nvmlDeviceGetFieldValues", getattr(handle, "gpu", None), [p[0] for p in pairs])
        gpu = self.gpu_of(handle)
        if not pairs:
            raise nvml_error(errors.INVALID_ARGUMENT)
        t, default = self.now(), errors.parse_code(gpu.get("default_field_error", "NOT_SUPPORTED"))
        return [self._field_value(gpu, fid, scope, t, default) for fid, scope in pairs]

    def _field_value(self, gpu: dict[str, Any], fid: int, scope: int, t: float, default: int) -> SimpleNamespace:
        """One ``nvmlFieldValue_t`` entry: the GPU's ``fields`` value, else the entry's own error
        (``default`` for an unlisted field)."""
        fields = gpu["fields"]
        entry = SimpleNamespace(
            fieldId=fid,
            scopeId=scope,
            timestamp=self.timestamp_us(),
            latencyUsec=1,
            valueType=3,
            nvmlReturn=0,
            value=SimpleNamespace(dVal=0.0, uiVal=0, ulVal=0, ullVal=0, sllVal=0, siVal=0, usVal=0),
        )
        spec_key = f"{fid}:{scope}" if f"{fid}:{scope}" in fields else str(fid)
        if fid in PER_LINK_FIELDS and scope != ALL_LINKS and scope >= gpu.get("nvlink_link_count", 0):
            entry.nvmlReturn = errors.INVALID_ARGUMENT
        elif spec_key not in fields:
            entry.nvmlReturn = default
        else:
            try:
                value = self.resolve(fields[spec_key], t)
            except pynvml.NVMLError as exc:
                entry.nvmlReturn = exc.value
            else:
                if isinstance(value, float):
                    entry.valueType, entry.value.dVal = 0, value
                else:
                    v = int(value)
                    entry.value.ullVal = entry.value.ulVal = entry.value.uiVal = v
                    entry.value.sllVal = entry.value.siVal = v
        return entry

    # -- everything else: per-device getters answered from "values" ------------------------------

    def __getattr__(self, fn: str) -> Callable[..., Any]:
        if not fn.startswith("nvmlDevice"):
            raise AttributeError(fn)

        def call(handle: Any, *args: Any) -> Any:
            self.enter(fn, getattr(handle, "gpu", None))
            gpu = self.gpu_of(handle)
            if fn in PER_LINK_FUNCTIONS and args and int(args[0]) >= gpu.get("nvlink_link_count", 0):
                raise nvml_error(errors.INVALID_ARGUMENT)
            return self.value(gpu, fn, args)

        call.__name__ = fn
        return call
