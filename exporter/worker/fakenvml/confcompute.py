"""Confidential computing in the fake: the system-wide calls, answered from the scenario's
``system_values`` (docs/scenarios.md, "Driver branches"; a call without a value answers
NOT_SUPPORTED, as on a system that is not CC-capable). The per-GPU
``nvmlDeviceGetConfComputeProtectedMemoryUsage`` is a plain getter from the GPU's ``values``.
"""

from __future__ import annotations

from typing import Any

from exporter.worker.fakenvml.core import FakeCore


class ConfComputeCalls(FakeCore):
    """``nvmlSystemGetConfComputeState`` and ``nvmlSystemGetConfComputeGpusReadyState``."""

    def nvmlSystemGetConfComputeState(self) -> Any:  # noqa: N802 - pynvml's names
        """``{environment, ccFeature, devToolsMode}`` as pynvml's ``c_nvmlConfComputeSystemState_t``."""
        self.enter("nvmlSystemGetConfComputeState", None)
        return self.system_value("nvmlSystemGetConfComputeState")

    def nvmlSystemGetConfComputeGpusReadyState(self) -> int:  # noqa: N802
        """0 (not accepting client requests) or 1, for every GPU of the system."""
        self.enter("nvmlSystemGetConfComputeGpusReadyState", None)
        return int(self.system_value("nvmlSystemGetConfComputeGpusReadyState"))
