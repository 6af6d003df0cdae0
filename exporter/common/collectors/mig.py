"""MIG (Multi-Instance GPU): a GPU's MIG mode, its GPU instances and MIG devices, and what NVML
gives per instance (memory per GPU instance, compute processes per MIG device).

Terms (NVML API reference, "Multi Instance GPU Management"): a *GPU instance* (GI) is a slice of
the GPU with its own memory; a *compute instance* (CI) is a slice of a GI's SMs; a *MIG device* is
what a MIG device handle stands for: "A MIG device handle is an NVML abstraction which maps to a
MIG compute instance" (nvmlDeviceIsMigDeviceHandle). The kubelet hands out MIG devices, each with
its own ``MIG-…`` UUID.

Sources, all documented in the NVML API reference (docs.nvidia.com/deploy/nvml-api, "Multi
Instance GPU Management" and "Device Queries"), Ampere and newer, Linux only:

- ``nvmlDeviceGetMigMode(device)`` -> ``[current, pending]``: ``NVML_DEVICE_MIG_DISABLE`` 0 /
  ``NVML_DEVICE_MIG_ENABLE`` 1; "Changing MIG modes may require device unbind or reset. The
  'pending' MIG mode refers to the target mode following the next activation trigger." NOT_SUPPORTED
  on GPUs without MIG. About 160 µs on the H200 (an RPC to the GSP; measured on 580.159.04), so on a GPU
  with MIG off the answer is kept until the next re-probe (``NVGPU_REPROBE_SECONDS``, at once after
  a MIG configuration change event): a GPU without MIG costs no call per sample.
- ``nvmlDeviceGetMaxMigDeviceCount(device)``: "the maximum number of MIG devices that can exist
  under a given parent NVML device. Returns zero if MIG is not supported or enabled."
- ``nvmlDeviceGetMigDeviceHandleByIndex(device, index)`` for every index below that count:
  NOT_FOUND for an empty slot (skipped, not an error; index 0 too while MIG is off, measured). "If the compute instance
  is destroyed ... the MIG device handle would remain invalid and must be requested again using
  this API. Handles may be reused and their properties can change in the process": on a GPU with
  MIG on, every sample enumerates again, so a created or destroyed instance shows in the next
  sample, and a call on a handle that went away in between only omits that reading
  (``errors.Context.MIG_DEVICE``).
- ``nvmlDeviceGetGpuInstanceId(migDevice)``, ``nvmlDeviceGetComputeInstanceId(migDevice)``,
  ``nvmlDeviceGetUUID(migDevice)`` (``MIG-…``).
- The profile: ``nvmlDeviceGetName(migDevice)`` names a MIG device after its profile
  (``NVIDIA H100 80GB HBM3 MIG 1g.10gb``; ``… MIG 1c.3g.40gb`` for a compute instance smaller than
  its GPU instance, as nvidia-smi -L prints it) and needs no privilege: a MIG device's
  ``mig_profile`` is the part after `` MIG ``, its GPU instance's the same without a leading
  ``<n>c.`` (``3g.40gb``). Only where the name says nothing is the GPU instance profile asked:
  ``nvmlDeviceGetGpuInstanceById(device, id)`` ("Requires privileged user": NO_PERMISSION for the
  unprivileged exporter, cached like any unsupported answer) and ``nvmlGpuInstanceGetInfo``
  (``profileId``), then ``nvmlDeviceGetGpuInstanceProfileInfoByIdV(device, profileId)`` (pynvml
  ``nvmlDeviceGetGpuInstanceProfileInfoById``; ``nvmlGpuInstanceProfileInfo_v2_t.name``, e.g.
  ``MIG 1g.18gb``, without the ``MIG `` prefix), or, where the by-id call is missing (older
  binding or driver), every profile index once through
  ``nvmlDeviceGetGpuInstanceProfileInfoV(device, profile)``; those names are kept until the next
  re-probe.
- Per GPU instance, on its first MIG device: ``nvmlDeviceGetMemoryInfo`` (v2, v1 fallback).
  "In MIG mode ... Per-instance information can be queried by using specific MIG device handles";
  the framebuffer belongs to the GPU instance, shared by its compute instances, so memory is
  exported once per GPU instance (per MIG device it would count twice in a GPU instance with two).
- Per MIG device: ``nvmlDeviceGetComputeRunningProcesses_v3`` (``_v2``) on its handle, records
  validated as the processes feature does (:mod:`exporter.worker.process_records`); a record whose GPU or
  compute instance id names another instance is left to that instance.

Per-GPU-instance GPM activity (``nvmlGpmMigSampleGet``) is read by the ``gpm`` feature
(:mod:`exporter.common.collectors.gpm`) from the layout this collector keeps (:func:`layout`); device-wide
utilization on a MIG GPU (NOT_SUPPORTED there, "not supported with MIG enabled") is left absent by
:mod:`exporter.common.collectors.utilization`, with ``nvgpu_gpu_feature_unsupported{feature="utilization"}``
and ``nvgpu_mig_mode`` saying why.

Series exist only on GPUs with MIG enabled or a MIG mode change pending: a GPU with MIG off (the
H200s as shipped) gets none, not even ``nvgpu_mig_mode 0``.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exporter.common.gpustate import GpuState, Lifetime
from exporter.common.logs import log_once
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import U64_MAX_VALUE, Check, Each, Exempt, PartsAtMost, Range

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

log = logging.getLogger(__name__)

FEATURE = "mig"
NEEDS: tuple[str, ...] = ()
MIG_ENABLE = 1  # NVML_DEVICE_MIG_ENABLE
NVML_MEMORY_V2 = 0x02000028  # as exporter.common.collectors.memory
PROFILE_COUNT = 0x12  # NVML_GPU_INSTANCE_PROFILE_COUNT (nvidia-ml-py 13.615); older bindings: fewer
PROCESS_LISTS = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")

GI_LABELS = ("gpu_instance_id", "mig_profile")
DEVICE_LABELS = ("gpu_instance_id", "compute_instance_id", "mig_profile", "mig_uuid")

MODE = MetricDef(
    "nvgpu_mig_mode",
    "1 while MIG mode is enabled on the GPU (nvmlDeviceGetMigMode, current); present only on GPUs with MIG "
    "enabled or a MIG mode change pending",
)
MODE_PENDING = MetricDef(
    "nvgpu_mig_mode_pending",
    "MIG mode the GPU takes at its next reset or MIG activation (nvmlDeviceGetMigMode, pending); present only "
    "on GPUs with MIG enabled or a MIG mode change pending",
)
INSTANCE_INFO = MetricDef(
    "nvgpu_mig_instance_info",
    "One MIG device (a compute instance) of the GPU: GPU and compute instance ids, its profile and its UUID "
    "(nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceGetGpuInstanceId, nvmlDeviceGetComputeInstanceId, "
    "nvmlDeviceGetName, nvmlDeviceGetUUID); value is always 1",
    DEVICE_LABELS,
)
MEMORY_USED = MetricDef(
    "nvgpu_mig_memory_used_bytes",
    "Framebuffer memory used in the GPU instance, excluding driver-reserved memory on v2 (nvmlDeviceGetMemoryInfo "
    "on the GPU instance's first MIG device; shared by its compute instances)",
    GI_LABELS,
)
MEMORY_TOTAL = MetricDef(
    "nvgpu_mig_memory_total_bytes",
    "Framebuffer memory of the GPU instance (nvmlDeviceGetMemoryInfo on the GPU instance's first MIG device)",
    GI_LABELS,
)
PROCESSES = MetricDef(
    "nvgpu_mig_compute_processes",
    "Compute processes on the MIG device (nvmlDeviceGetComputeRunningProcesses on its MIG device handle)",
    DEVICE_LABELS,
)
PROCESSES_MEMORY = MetricDef(
    "nvgpu_mig_compute_processes_memory_used_bytes",
    "Memory used by the MIG device's compute processes, where readable (usedGpuMemory of "
    "nvmlDeviceGetComputeRunningProcesses on its MIG device handle)",
    DEVICE_LABELS,
)
METRICS = (MODE, MODE_PENDING, INSTANCE_INFO, MEMORY_USED, MEMORY_TOTAL, PROCESSES, PROCESSES_MEMORY)


@dataclass(frozen=True)
class GpuInstance:
    """One GPU instance of a MIG-enabled GPU.

    Attributes:
        gpu_instance_id: NVML's GPU instance id (``nvidia-smi mig -lgi``).
        profile_id: its GPU instance profile id (``nvmlGpuInstanceInfo_t.profileId``); None if unread.
        profile: the profile's name without ``MIG `` (``1g.18gb``); empty when unknown.
        memory_total_bytes: framebuffer of the instance; None when unread.
        memory_used_bytes: used (v2: excluding reserved); None when unread.
    """

    gpu_instance_id: int
    profile_id: int | None
    profile: str
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (compute instance).

    Attributes:
        index: its index under the parent (``nvmlDeviceGetMigDeviceHandleByIndex``).
        gpu_instance_id: its GPU instance.
        compute_instance_id: its compute instance within the GPU instance.
        uuid: ``MIG-…`` (what the kubelet hands out).
        profile: its profile (``1g.18gb``, ``1c.2g.35gb``); "" when unknown.
        processes: validated compute processes; None when the list gave no answer.
        processes_memory_bytes: their summed usedGpuMemory where known; None when none is known.
    """

    index: int
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    profile: str = ""
    processes: int | None = None
    processes_memory_bytes: int | None = None


@dataclass(frozen=True)
class Reading:
    """One GPU's MIG state.

    Attributes:
        current_mode: ``nvmlDeviceGetMigMode`` current (0 disabled, 1 enabled).
        pending_mode: the mode after the next activation (GPU reset).
        gpu_instances: every GPU instance with a MIG device, by id (empty with MIG off).
        devices: every MIG device, by index (empty with MIG off).
    """

    current_mode: int
    pending_mode: int
    gpu_instances: tuple[GpuInstance, ...] = ()
    devices: tuple[MigDevice, ...] = ()

    @property
    def enabled(self) -> bool:
        """MIG mode is on now."""
        return self.current_mode == MIG_ENABLE

    def profile_of(self, gpu_instance_id: int) -> str:
        """The profile name of a GPU instance ("" when unknown)."""
        return next((g.profile for g in self.gpu_instances if g.gpu_instance_id == gpu_instance_id), "")

    def device_profile(self, device: MigDevice) -> str:
        """A MIG device's profile, else its GPU instance's ("" when neither is known)."""
        return device.profile or self.profile_of(device.gpu_instance_id)


CHECKS: tuple[Check, ...] = (
    Range("current_mode", "pending_mode", low=0, high=1),
    Each(
        "gpu_instances",
        Exempt("gpu_instance_id", "profile_id", "profile", why="identifiers"),
        Range("memory_total_bytes", "memory_used_bytes", low=0, high=U64_MAX_VALUE),
        PartsAtMost("memory_used_bytes", total="memory_total_bytes"),
    ),
    Each(
        "devices",
        Exempt("index", "gpu_instance_id", "compute_instance_id", "uuid", "profile", why="identifiers"),
        Exempt("processes", "processes_memory_bytes", why="records validated one by one (process_records)"),
    ),
)


Shape = tuple[int, int, tuple[tuple[int, int, str], ...]]  # modes, (GI, CI, MIG UUID) of each MIG device


@dataclass
class Static(GpuState):
    """What this collector keeps until the next re-probe (or MIG configuration change event).

    Attributes:
        layout: the last reading (the MIG layout utilization and gpm read: :func:`layout`).
        no_mig: the GPU answered NOT_SUPPORTED to the mode: no call until the next re-probe.
        max_devices: ``nvmlDeviceGetMaxMigDeviceCount``.
        profiles: GPU instance profile id -> name (``1g.18gb``).
        profiles_scanned: every profile index was asked once (the by-id call is missing).
    """

    LIFETIME = Lifetime.PROBE
    layout: Reading | None = None
    no_mig: bool = False
    max_devices: int | None = None
    profiles: dict[int, str] = field(default_factory=dict)
    profiles_scanned: bool = False


@dataclass
class Logged(GpuState):
    """The MIG shape last logged (kept across re-probes, so a re-probe logs nothing new)."""

    LIFETIME = Lifetime.DEVICE
    shape: Shape | None = None


def layout(dev: DeviceClient) -> Reading | None:
    """This GPU's MIG state as this pass (or the last one) read it; None when not read (the ``mig``
    feature off, or before its first answer since the last re-probe) or the GPU has no MIG.

    The collectors that read it name ``mig`` in their ``NEEDS`` (so the registry samples ``mig``
    before them in each pass: ``tests/test_collectors.py`` checks the order).
    """
    return dev.state_of(Static).layout


# -- reading (worker) --------------------------------------------------------------------------------


def read(dev: DeviceClient) -> Reading | None:
    """The GPU's MIG mode and, with MIG on, its instances (see the module docstring).

    Returns:
        None on a GPU without MIG (NOT_SUPPORTED: cached until a re-probe) or when the mode read
        failed this sample (counted; the last layout stays for the other collectors: :func:`layout`).

    Raises:
        DeviceLost, NvmlFatal: from the device client.
    """
    static = dev.state_of(Static)
    if static.no_mig:
        return None  # no MIG on this GPU (until a re-probe)
    cached = static.layout
    if cached is not None and not cached.enabled:
        return cached  # MIG off: asked again at the next re-probe or MIG configuration change event
    mode = dev.get(FEATURE, "nvmlDeviceGetMigMode")
    if mode is None:
        if ("nvmlDeviceGetMigMode",) in dev.unsupported:
            static.layout, static.no_mig = None, True
        return None
    current, pending = int(mode[0]), int(mode[1])
    if cached is not None and cached.current_mode != current:
        # MIG went off under a running worker: utilization, remapped rows and GPM answer again
        # without waiting for the periodic re-probe.
        dev.reprobe_requested = True
    reading = Reading(current, pending) if current != MIG_ENABLE else _enumerate(dev, current, pending)
    static.layout = reading
    _log_layout(dev, reading)
    return reading


def _enumerate(dev: DeviceClient, current: int, pending: int) -> Reading:
    """Every MIG device and GPU instance of a MIG-enabled GPU, read now."""
    from exporter.common.nvml import errors

    static = dev.state_of(Static)
    if static.max_devices is None:
        count = dev.get(FEATURE, "nvmlDeviceGetMaxMigDeviceCount")
        if count is not None:
            static.max_devices = int(count)
    count = static.max_devices
    handles: dict[int, tuple[Any, MigDevice]] = {}
    for index in range(int(count or 0)):
        handle = dev.call(
            FEATURE,
            "nvmlDeviceGetMigDeviceHandleByIndex",
            index,
            key=("nvmlDeviceGetMigDeviceHandleByIndex",),
            context=errors.Context.MIG_DEVICE,
        )
        if handle is None:
            continue  # an empty slot (NOT_FOUND), or an error counted by the device client
        ids = [_on(dev, fn, handle) for fn in ("nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId")]
        uuid = _on(dev, "nvmlDeviceGetUUID", handle)
        if ids[0] is None or ids[1] is None or uuid is None:
            continue  # this MIG device is left out of this sample
        name = _on(dev, "nvmlDeviceGetName", handle)
        profile = _profile_in_name(name) if name is not None else ""
        handles[index] = (handle, MigDevice(index, int(ids[0]), int(ids[1]), _text(uuid), profile))
    instances: list[GpuInstance] = []
    for gi in sorted({d.gpu_instance_id for _, d in handles.values()}):
        first, device = next((h, d) for h, d in handles.values() if d.gpu_instance_id == gi)
        instances.append(_gpu_instance(dev, gi, first, _COMPUTE_SLICES.sub("", device.profile)))
    totals = {g.gpu_instance_id: g.memory_total_bytes for g in instances}
    devices = tuple(_with_processes(dev, h, d, totals.get(d.gpu_instance_id)) for h, d in handles.values())
    return Reading(current, pending, tuple(instances), devices)


def _on(dev: DeviceClient, function: str, handle: Any, *args: Any) -> Any:
    """``function(migHandle, *args)`` on this GPU's behalf; an unsupported answer is cached for every
    MIG device of the GPU (they share the driver and mode)."""
    from exporter.common.nvml import errors

    return dev.call(
        FEATURE, function, handle, *args, key=("mig", function, *args), handle=False, context=errors.Context.MIG_DEVICE
    )


_COMPUTE_SLICES = re.compile(r"^\d+c\.(?=\d+g\.)")  # "1c.3g.40gb": a compute instance of a 3g.40gb


def _text(raw: Any) -> str:
    """A driver string as text: bytes decoded, printable characters only."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    return "".join(ch for ch in text if ch.isprintable()).strip()


def _profile_in_name(raw: Any) -> str:
    """``NVIDIA H200 MIG 1g.18gb`` -> ``1g.18gb``; "" for a name that names no MIG profile."""
    _, sep, rest = f" {_text(raw)}".partition(" MIG ")
    profile = rest.strip()
    return profile if sep and profile and " " not in profile else ""


def _gpu_instance(dev: DeviceClient, gi: int, handle: Any, profile: str) -> GpuInstance:
    from exporter.common.nvml import errors

    info = None
    if not profile:  # the MIG device's name said nothing: ask for the profile (a privileged call)
        gi_handle = dev.call(
            FEATURE,
            "nvmlDeviceGetGpuInstanceById",
            gi,
            key=("nvmlDeviceGetGpuInstanceById",),
            context=errors.Context.MIG_DEVICE,
        )
        if gi_handle is not None:
            info = dev.call(
                FEATURE,
                "nvmlGpuInstanceGetInfo",
                gi_handle,
                key=("nvmlGpuInstanceGetInfo",),
                handle=False,
                context=errors.Context.MIG_DEVICE,
            )
    profile_id = int(info.profileId) if info is not None else None
    v2 = ("mig", "nvmlDeviceGetMemoryInfo", NVML_MEMORY_V2)
    mem = _on(dev, "nvmlDeviceGetMemoryInfo", handle, NVML_MEMORY_V2) if v2 not in dev.unsupported else None
    if mem is None and v2 in dev.unsupported:  # v1 only where v2 is missing, not after a transient error
        mem = _on(dev, "nvmlDeviceGetMemoryInfo", handle)
    return GpuInstance(
        gi,
        profile_id,
        profile or _profile_name(dev, profile_id),
        int(mem.total) if mem is not None else None,
        int(mem.used) if mem is not None else None,
    )


def _profile_name(dev: DeviceClient, profile_id: int | None) -> str:
    """The GPU instance profile's name (``1g.18gb``) from its id; "" when NVML does not say."""
    from exporter.common.nvml import errors

    if profile_id is None:
        return ""
    static = dev.state_of(Static)
    names = static.profiles
    if profile_id in names:
        return names[profile_id]
    by_id = ("nvmlDeviceGetGpuInstanceProfileInfoById",)
    if by_id not in dev.unsupported:
        info = dev.call(FEATURE, by_id[0], profile_id, key=by_id, context=errors.Context.MIG_DEVICE)
        if info is not None:
            names[profile_id] = _name(getattr(info, "name", b""))
            return names[profile_id]
    if by_id in dev.unsupported and not static.profiles_scanned:
        # The by-id call is missing: ask every profile index once (until the next re-probe).
        static.profiles_scanned = True
        count = int(getattr(dev.client.backend, "NVML_GPU_INSTANCE_PROFILE_COUNT", PROFILE_COUNT))
        for index in range(count):
            info = dev.call(
                FEATURE,
                "nvmlDeviceGetGpuInstanceProfileInfo",
                index,
                key=("nvmlDeviceGetGpuInstanceProfileInfo", index),
                context=errors.Context.INDEXED,
            )
            if info is not None:
                names.setdefault(int(info.id), _name(getattr(info, "name", b"")))
    return names.get(profile_id, "")


def _name(raw: Any) -> str:
    """``MIG 1g.18gb`` (bytes or text) as ``1g.18gb``; printable characters only."""
    text = _text(raw)
    return text[4:].strip() if text.upper().startswith("MIG ") else text


def _with_processes(dev: DeviceClient, handle: Any, device: MigDevice, memory_total: int | None) -> MigDevice:
    """The MIG device with its compute processes (the first process list symbol that answers)."""
    from exporter.worker.process_records import PID_MAX_LIMIT, validate_records

    for function in PROCESS_LISTS:
        if ("mig", function) in dev.unsupported:
            continue
        raw = _on(dev, function, handle)
        if raw is None:
            if ("mig", function) in dev.unsupported:
                continue
            return device  # an error that omits this sample
        drops: Counter[str] = Counter()
        records = validate_records(raw, "compute", pid_max=PID_MAX_LIMIT, memory_total=memory_total, drops=drops)
        if drops.keys() - {"memory_not_available"}:
            log_once(
                log,
                logging.WARNING,
                ("mig-process-records", dev.uuid, device.uuid),
                "GPU %s MIG device %s: %s process record(s) from %s failed validation and were not counted",
                dev.uuid,
                device.uuid,
                sum(n for r, n in drops.items() if r != "memory_not_available"),
                function,
            )
        mine = [
            r
            for r in records
            if r.gpu_instance_id in (None, device.gpu_instance_id)
            and r.compute_instance_id in (None, device.compute_instance_id)
        ]
        known = [r.memory_bytes for r in mine if r.memory_bytes is not None]
        return MigDevice(
            device.index,
            device.gpu_instance_id,
            device.compute_instance_id,
            device.uuid,
            device.profile,
            len(mine),
            sum(known) if known or not mine else None,
        )
    return device


def _log_layout(dev: DeviceClient, reading: Reading) -> None:
    """One INFO line whenever a GPU's MIG mode or layout changes (:class:`Logged`)."""
    shape: Shape = (
        reading.current_mode,
        reading.pending_mode,
        tuple((d.gpu_instance_id, d.compute_instance_id, d.uuid) for d in reading.devices),
    )
    logged = dev.state_of(Logged)
    before, logged.shape = logged.shape, shape
    if before == shape or (before is None and not reading.enabled and reading.pending_mode != MIG_ENABLE):
        return
    if not reading.enabled:
        what = "MIG disabled" + (" (enabled at the next GPU reset)" if reading.pending_mode == MIG_ENABLE else "")
    else:
        parts = [
            f"GI {d.gpu_instance_id} CI {d.compute_instance_id} {reading.device_profile(d) or '?'} {d.uuid}"
            for d in reading.devices
        ]
        what = "MIG enabled" + (" (disabled at the next GPU reset)" if reading.pending_mode != MIG_ENABLE else "")
        what += f", {len(parts)} MIG device(s): " + ("; ".join(parts) if parts else "none")
    log.info("GPU %d (%s): %s", dev.index, dev.uuid, what, extra={"gpu": dev.index, "uuid": dev.uuid})


# -- rendering (supervisor) ----------------------------------------------------------------------------


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    mode, pending = MODE.family(), MODE_PENDING.family()
    info, used, total = INSTANCE_INFO.family(), MEMORY_USED.family(), MEMORY_TOTAL.family()
    procs, procs_mem = PROCESSES.family(), PROCESSES_MEMORY.family()
    for key, r in samples:
        if not r.enabled and r.pending_mode != MIG_ENABLE:
            continue  # MIG off and staying off: no MIG series on this GPU
        mode.add(key, int(r.enabled))
        pending.add(key, int(r.pending_mode == MIG_ENABLE))
        for g in r.gpu_instances:
            used.add(key, g.memory_used_bytes, str(g.gpu_instance_id), g.profile)
            total.add(key, g.memory_total_bytes, str(g.gpu_instance_id), g.profile)
        for d in r.devices:
            labels = (str(d.gpu_instance_id), str(d.compute_instance_id), r.device_profile(d), d.uuid)
            info.add(key, 1, *labels)
            procs.add(key, d.processes, *labels)
            procs_mem.add(key, d.processes_memory_bytes, *labels)
    for fam in (mode, pending, info, used, total, procs, procs_mem):
        yield from fam.done()
