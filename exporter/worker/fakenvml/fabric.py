"""Fabric (NVSwitch/NVLink fabric manager) info in the fake: the versioned struct call and v1.

``nvmlDeviceGetGpuFabricInfoV(handle, byref(struct))`` fills the caller's struct (pynvml passes
the ``byref`` through) from the GPU's ``"nvmlDeviceGetGpuFabricInfoV"`` value; the key
``"nvmlDeviceGetGpuFabricInfoV:<struct major version>"`` overrides it for one struct version,
e.g. ``{"error": "ARGUMENT_VERSION_MISMATCH"}`` for a driver that knows only v2; a scenario's
``driver_branch`` answers ARGUMENT_VERSION_MISMATCH for a struct newer than the branch knows. The
deprecated ``nvmlDeviceGetGpuFabricInfo(handle, byref(v1 struct))`` answers from
``"nvmlDeviceGetGpuFabricInfo"``, else from the V value (docs/scenarios.md, "Calls with special
shapes"). ``clusterUuid`` is given as a UUID string and written as its 16 bytes.
"""

from __future__ import annotations

import uuid
from typing import Any

import pynvml

from exporter.common.nvml import errors
from exporter.worker.fakenvml.core import FakeCore, nvml_error

_NOT_FILLED = ("version",)  # the caller's version stays


class FabricCalls(FakeCore):
    """``nvmlDeviceGetGpuFabricInfoV`` and the struct types pynvml offers for it."""

    c_nvmlGpuFabricInfo_v2_t = getattr(pynvml, "c_nvmlGpuFabricInfo_v2_t", None)
    c_nvmlGpuFabricInfo_v3_t = getattr(pynvml, "c_nvmlGpuFabricInfo_v3_t", None)

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:  # noqa: N802
        """Fill the caller's versioned struct: each of its fields the value names, as an integer.

        Values: ``"nvmlDeviceGetGpuFabricInfoV"`` ({"state": 3, "status": 0, "cliqueId": 0,
        "clusterUuid": "…", "healthMask": 0, "healthSummary": 0}); ``"nvmlDeviceGetGpuFabricInfoV:<struct
        major version>"`` overrides it for one version.
        """
        fn = "nvmlDeviceGetGpuFabricInfoV"
        self.enter(fn, getattr(handle, "gpu", None))
        gpu = self.gpu_of(handle)
        struct = getattr(info, "_obj", info)
        major = int(struct.version) >> 24
        if self.branch is not None and major > self.branch.fabric_struct_max:
            raise nvml_error(errors.ARGUMENT_VERSION_MISMATCH)
        _fill(struct, self.value(gpu, fn, (major,)))
        return 0

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info: Any) -> int:  # noqa: N802
        """The deprecated unversioned call (``nvmlGpuFabricInfo_t``, no version word): from
        ``"nvmlDeviceGetGpuFabricInfo"``, else the V call's value."""
        fn = "nvmlDeviceGetGpuFabricInfo"
        self.enter(fn, getattr(handle, "index", None))
        gpu = self.gpu_of(handle)
        struct = getattr(info, "_obj", info)
        own = fn in gpu["values"]
        _fill(struct, self.value(gpu, fn if own else "nvmlDeviceGetGpuFabricInfoV", () if own else (1,)))
        return 0


def _fill(struct: Any, value: Any) -> None:
    names = {name for name, *_ in struct._fields_}
    for name, v in vars(value).items():
        if name not in names or name in _NOT_FILLED:
            continue
        if name == "clusterUuid":
            raw = uuid.UUID(str(v)).bytes
            for i, byte in enumerate(raw):
                struct.clusterUuid[i] = byte
        else:
            setattr(struct, name, int(v))
