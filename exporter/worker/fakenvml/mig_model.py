"""MIG in the fake NVML backend: a GPU's MIG mode and instance layouts over time, MIG device handles.

A GPU of a scenario may carry a ``"mig"`` object (docs/scenarios.md, "MIG"; validated by
:mod:`exporter.common.scenarios.scenario`)::

    "mig": {
      "mode": [1, 1],                    // nvmlDeviceGetMigMode [current, pending]; any value spec
      "max_devices": 7,                  // nvmlDeviceGetMaxMigDeviceCount while MIG is on (0 when off)
      "profiles": {"19": {"name": "MIG 1g.18gb", "index": 0, "sliceCount": 1, "memorySizeMB": 17664}},
      "layouts": [                       // the first whose until_s is above scenario time
        {"until_s": 30, "instances": [
          {"gpu_instance_id": 9, "compute_instance_id": 0, "profile_id": 19, "uuid": "MIG-…",
           "values": {"nvmlDeviceGetMemoryInfo": {...}, "nvmlGpmMetricsGet:2": 40.0}}]},
        {"instances": []}
      ]
    }

An instance exists only while MIG mode is on (current 1). Its position in the layout is its MIG
device index unless it says ``"index"``. Its ``values`` answer the calls made with its MIG device
handle (any value spec; an error spec is a per-instance error; ``nvmlDeviceGetName`` defaults to
``<GPU name> MIG <profile>``), ``nvmlGpmMetricsGet:<id>`` for its
GPU instance's GPM samples, and ``nvmlDeviceGetMigDeviceHandleByIndex`` / ``nvmlGpmMigSampleGet``
(an error spec makes that call fail for this instance only).

This module holds the model; :mod:`exporter.worker.fakenvml.mig` and :mod:`exporter.worker.fakenvml.gpm` expose it
as pynvml calls.
Handles behave as NVML documents them: a MIG device handle whose compute instance was destroyed
(the layout changed, or MIG went off) answers INVALID_ARGUMENT and "must be requested again"
(NVML API reference, nvmlDeviceGetMigDeviceHandleByIndex).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

from exporter.common.nvml import errors
from exporter.common.scenarios.spec import Spec, parse
from exporter.worker.fakenvml.core import nvml_error

MIG_ENABLE = 1
DEFAULT_MAX_DEVICES = 7  # H100/H200: seven MIG devices at most
DEFAULT_MODE = parse([MIG_ENABLE, MIG_ENABLE], "mig.mode")  # [current, pending] when not given


class FakeMigHandle:
    """A MIG device handle: the parent GPU's index, the MIG device index, and what it stood for."""

    __slots__ = ("compute_instance_id", "gpu", "gpu_instance_id", "mig_index", "uuid")

    def __init__(self, gpu: int, mig_index: int, gpu_instance_id: int, compute_instance_id: int, uuid: str) -> None:
        self.gpu = gpu
        self.mig_index = mig_index
        self.gpu_instance_id = gpu_instance_id
        self.compute_instance_id = compute_instance_id
        self.uuid = uuid

    def __repr__(self) -> str:
        return f"<FakeMigHandle gpu={self.gpu} mig={self.mig_index} gi={self.gpu_instance_id}>"


class FakeGpuInstance:
    """A GPU instance handle (``nvmlDeviceGetGpuInstanceById``)."""

    __slots__ = ("gpu", "gpu_instance_id")

    def __init__(self, gpu: int, gpu_instance_id: int) -> None:
        self.gpu = gpu
        self.gpu_instance_id = gpu_instance_id


class MigModel:
    """The MIG side of a scenario, resolved at scenario time.

    Args:
        gpu_at: the compiled GPU object at an enumeration index
            (:func:`exporter.common.scenarios.scenario.compile_scenario`).
        resolve: the fake's value-spec resolver ``(spec, t) -> value`` (raises the spec's errors).
        now: scenario time.
    """

    def __init__(
        self,
        gpu_at: Callable[[int], Mapping[str, Any]],
        resolve: Callable[[Spec, float], Any],
        now: Callable[[], float],
    ) -> None:
        self._gpu_at = gpu_at
        self._resolve = resolve
        self._now = now

    def spec(self, gpu: int) -> Mapping[str, Any] | None:
        """The GPU's ``mig`` object, or None (a GPU without one answers from its ``values``)."""
        mig = self._gpu_at(gpu).get("mig")
        return mig if isinstance(mig, dict) else None

    def mode(self, gpu: int) -> list[int]:
        """``[current, pending]`` now."""
        mig = self.spec(gpu)
        assert mig is not None
        value = self._resolve(mig.get("mode", DEFAULT_MODE), self._now())
        return [int(value[0]), int(value[1])]

    def enabled(self, gpu: int) -> bool:
        """MIG mode is on now (a GPU with a ``mig`` object)."""
        return self.spec(gpu) is not None and self.mode(gpu)[0] == MIG_ENABLE

    def max_devices(self, gpu: int) -> int:
        mig = self.spec(gpu)
        assert mig is not None
        return int(mig.get("max_devices", DEFAULT_MAX_DEVICES)) if self.enabled(gpu) else 0

    def instances(self, gpu: int) -> dict[int, Mapping[str, Any]]:
        """MIG device index -> instance object of the layout in force now (empty with MIG off)."""
        if not self.enabled(gpu):
            return {}
        mig = self.spec(gpu)
        assert mig is not None
        t = self._now()
        for layout in mig.get("layouts", []):
            if "until_s" not in layout or t < layout["until_s"]:
                return {int(inst.get("index", i)): inst for i, inst in enumerate(layout.get("instances", []))}
        return {}

    # -- the calls ---------------------------------------------------------------------------------

    def handle(self, gpu: int, index: int) -> FakeMigHandle:
        """``nvmlDeviceGetMigDeviceHandleByIndex``: NOT_FOUND for an empty slot (and with MIG off)."""
        if index < 0 or (self.enabled(gpu) and index >= self.max_devices(gpu)):
            raise nvml_error(errors.INVALID_ARGUMENT)
        inst = self.instances(gpu).get(index)
        if inst is None:
            raise nvml_error(errors.NOT_FOUND)
        if "nvmlDeviceGetMigDeviceHandleByIndex" in inst.get("values", {}):
            self.value_spec(inst, "nvmlDeviceGetMigDeviceHandleByIndex")  # a per-instance error spec
        return FakeMigHandle(
            gpu, index, int(inst["gpu_instance_id"]), int(inst["compute_instance_id"]), str(inst["uuid"])
        )

    def instance(self, handle: FakeMigHandle) -> Mapping[str, Any]:
        """What a MIG device handle stands for now; INVALID_ARGUMENT when its instance is gone."""
        inst = self.instances(handle.gpu).get(handle.mig_index)
        if inst is None or (
            int(inst["gpu_instance_id"]),
            int(inst["compute_instance_id"]),
            str(inst["uuid"]),
        ) != (handle.gpu_instance_id, handle.compute_instance_id, handle.uuid):
            raise nvml_error(errors.INVALID_ARGUMENT)
        return inst

    def gpu_instance(self, gpu: int, gpu_instance_id: int) -> Mapping[str, Any]:
        """The first instance of a GPU instance now; INVALID_ARGUMENT when there is none."""
        for _, inst in sorted(self.instances(gpu).items()):
            if int(inst["gpu_instance_id"]) == gpu_instance_id:
                return inst
        raise nvml_error(errors.INVALID_ARGUMENT)

    def gpu_instance_info(self, gi: FakeGpuInstance) -> SimpleNamespace:
        """``nvmlGpuInstanceGetInfo``: id, profileId, placement."""
        inst = self.gpu_instance(gi.gpu, gi.gpu_instance_id)
        placement = inst.get("placement", {"start": 0, "size": 1})
        return SimpleNamespace(
            device=None,
            id=gi.gpu_instance_id,
            profileId=int(inst.get("profile_id", 0)),
            placement=SimpleNamespace(start=int(placement["start"]), size=int(placement["size"])),
        )

    def profile(self, gpu: int, *, profile_id: int | None = None, index: int | None = None) -> SimpleNamespace:
        """A GPU instance profile by id (``…ProfileInfoByIdV``) or by profile index (``…ProfileInfoV``),
        shaped as ``c_nvmlGpuInstanceProfileInfo_v2_t`` (``name`` as bytes)."""
        mig = self.spec(gpu)
        profiles = mig.get("profiles", {}) if mig is not None else {}
        for key, p in profiles.items():
            if (profile_id is not None and int(key) == profile_id) or (index is not None and p.get("index") == index):
                return SimpleNamespace(
                    version=0x02000098,
                    id=int(key),
                    isP2pSupported=0,
                    sliceCount=int(p.get("sliceCount", 1)),
                    instanceCount=int(p.get("instanceCount", 1)),
                    multiprocessorCount=int(p.get("multiprocessorCount", 0)),
                    copyEngineCount=1,
                    decoderCount=0,
                    encoderCount=0,
                    jpegCount=0,
                    ofaCount=0,
                    memorySizeMB=int(p.get("memorySizeMB", 0)),
                    name=str(p.get("name", "")).encode(),
                )
        raise nvml_error(errors.INVALID_ARGUMENT if profile_id is not None else errors.NOT_SUPPORTED)

    def name(self, handle: FakeMigHandle, gpu_name: str) -> str:
        """``nvmlDeviceGetName`` of a MIG device: its ``values`` entry, else ``<GPU name> MIG <profile>``
        from its GPU instance profile's name (just the GPU's name when the profile is not listed)."""
        inst = self.instance(handle)
        if "nvmlDeviceGetName" in inst.get("values", {}):
            return str(self.value_spec(inst, "nvmlDeviceGetName"))
        mig = self.spec(handle.gpu) or {}
        profile = mig.get("profiles", {}).get(str(inst.get("profile_id")), {}).get("name", "")
        profile = profile[4:] if profile.startswith("MIG ") else profile
        return f"{gpu_name} MIG {profile}" if profile else gpu_name

    def value_spec(self, inst: Mapping[str, Any], key: str, t: float | None = None) -> Any:
        """The instance's value for ``key`` now (raises its error spec); KeyError when unlisted."""
        values = inst.get("values", {})
        if key not in values:
            raise KeyError(key)
        return self._resolve(values[key], self._now() if t is None else t)

    def value(self, handle: FakeMigHandle, function: str, args: tuple[Any, ...]) -> Any:
        """A call with a MIG device handle, answered from its instance's ``values`` (``fn:arg`` first).
        Unlisted: a process list is empty (an instance without processes), anything else answers
        NOT_SUPPORTED."""
        inst = self.instance(handle)
        keys = [f"{function}:{','.join(str(a) for a in args)}"] if args else []
        for key in [*keys, function]:
            try:
                return self.value_spec(inst, key)
            except KeyError:
                continue
        if "RunningProcesses" in function:
            return []
        raise nvml_error(errors.NOT_SUPPORTED)

    def gpm_metric(self, gpu: int, gpu_instance_id: int, metric_id: int, t: float) -> Any:
        """A GPM metric of a GPU instance at ``t``: its first instance's ``nvmlGpmMetricsGet:<id>``,
        else the GPU's own (``values``); KeyError when neither lists it (NOT_SUPPORTED)."""
        key = f"nvmlGpmMetricsGet:{metric_id}"
        inst = self.gpu_instance(gpu, gpu_instance_id)
        if key in inst.get("values", {}):
            return self.value_spec(inst, key, t)
        values = self._gpu_at(gpu)["values"]
        if key in values:
            return self._resolve(values[key], t)
        raise KeyError(key)
