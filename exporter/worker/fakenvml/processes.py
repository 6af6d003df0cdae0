"""Per-process utilization in the fake (docs/scenarios.md, "Process lists and per-process utilization").

Process lists themselves are ordinary values (a list of records, or a ``struct`` or ``churn``
spec: :mod:`exporter.common.scenarios.spec`) answered by the core; this module adds
``nvmlDeviceGetProcessUtilization``, whose ``per_process`` spec follows the GPU's compute list as
NVML meant it (a struct spec's true records, not the misread ones).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from exporter.common.nvml import errors
from exporter.common.scenarios.spec import PerProcessSample
from exporter.worker.fakenvml.core import FakeCore, nvml_error

PROCESS_LISTS = (  # the compute list of a GPU, in the order the fake looks for its spec
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
_UTILIZATION = ("smUtil", "memUtil", "encUtil", "decUtil")


class ProcessCalls(FakeCore):
    """``nvmlDeviceGetProcessUtilization``, from the scenario or from the GPU's true process list."""

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[SimpleNamespace]:  # noqa: N802, N803
        """Samples newer than ``timeStamp`` (µs since 1970), as NVML returns them.

        The spec is a list of samples (``pid``, ``smUtil``, ``memUtil``, ``encUtil``,
        ``decUtil``, optional ``timeStamp``) or ``{"per_process": {...}}`` (one sample per
        process of the GPU's compute list). A sample without ``timeStamp`` is stamped now, and
        never older than the request, so each call sees fresh data as a busy GPU gives; none
        newer than ``timeStamp`` raises NOT_FOUND, as the driver does.
        """
        fn = "nvmlDeviceGetProcessUtilization"
        self.enter(fn, getattr(handle, "gpu", None))
        gpu = self.gpu_of(handle)
        if fn not in gpu["values"]:
            raise nvml_error(errors.NOT_SUPPORTED)
        t = self.now()
        value = self.resolve(gpu["values"][fn], t)
        if isinstance(value, PerProcessSample):
            template = value.values
            value = [
                SimpleNamespace(pid=p.pid, **{k: getattr(template, k, 0) for k in _UTILIZATION})
                for p in self._true_processes(gpu, t)
            ]
        fresh = max(self.timestamp_us(), int(timeStamp) + 1)
        out = []
        for sample in value or []:
            ts = getattr(sample, "timeStamp", None)
            stamped = SimpleNamespace(**{**vars(sample), "timeStamp": fresh if ts is None else ts})
            if stamped.timeStamp > int(timeStamp):
                out.append(stamped)
        if not out:
            raise nvml_error(errors.NOT_FOUND)
        return out

    def _true_processes(self, gpu: dict[str, Any], t: float) -> list[Any]:
        """The GPU's compute processes as NVML meant them (struct layouts not applied)."""
        values = gpu["values"]
        for fn in PROCESS_LISTS:
            if fn in values:
                try:
                    found = self.resolve(values[fn], t, as_read=False)
                except self.NVMLError:
                    return []
                return list(found or [])
        return []
