"""Fabric (NVSwitch/NVLink fabric manager) info in the fake: the versioned struct call.

``nvmlDeviceGetGpuFabricInfoV(handle, byref(struct))`` fills the caller's struct (pynvml passes
the ``byref`` through) from the GPU's ``"nvmlDeviceGetGpuFabricInfoV"`` value; the key
``"nvmlDeviceGetGpuFabricInfoV:<struct major version>"`` overrides it for one struct version,
e.g. ``{"error": "ARGUMENT_VERSION_MISMATCH"}`` for a driver that knows only v2
(docs/scenarios.md, "Calls with special shapes").
"""

from __future__ import annotations

from typing import Any

import pynvml

from exporter.worker.fakenvml.core import FakeCore

_NOT_FILLED = ("version", "clusterUuid")  # the caller's version stays; clusterUuid (bytes) stays zeroed


class FabricCalls(FakeCore):
    """``nvmlDeviceGetGpuFabricInfoV`` and the struct types pynvml offers for it."""

    c_nvmlGpuFabricInfo_v2_t = getattr(pynvml, "c_nvmlGpuFabricInfo_v2_t", None)
    c_nvmlGpuFabricInfo_v3_t = getattr(pynvml, "c_nvmlGpuFabricInfo_v3_t", None)

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:  # noqa: N802
        """Fill the caller's versioned struct: each of its fields the value names, as an integer.

        Values: ``"nvmlDeviceGetGpuFabricInfoV"`` ({"state": 3, "status": 0, "cliqueId": 0,
        "healthMask": 0, "healthSummary": 0}); ``"nvmlDeviceGetGpuFabricInfoV:<struct major
        version>"`` overrides it for one version.
        """
        fn = "nvmlDeviceGetGpuFabricInfoV"
        self.enter(fn, getattr(handle, "gpu", None))
        gpu = self.gpu_of(handle)
        struct = getattr(info, "_obj", info)
        value = self.value(gpu, fn, (int(struct.version) >> 24,))
        names = {name for name, *_ in struct._fields_}
        for name, v in vars(value).items():
            if name in names and name not in _NOT_FILLED:
                setattr(struct, name, int(v))
        return 0
