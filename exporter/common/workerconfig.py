"""What the supervisor starts a worker with: the other direction of the process contract, typed.

The supervisor builds one :class:`WorkerConfig` per worker or probe
(:func:`exporter.supervisor.workerproc.worker_config`: the parsed settings, the quarantines, the GPUs kept out,
a probe's one GPU) and hands it over as JSON in the environment variable :data:`ENV_VAR`. The
worker decodes it once, first thing (:meth:`WorkerConfig.from_environ`), with the decoder that
checks the snapshot on the way back (:func:`exporter.common.decode.decode_dataclass`), and every field
must be there: a key renamed, missing or of the wrong type on one side fails at start with the
field named, and under ``mypy --strict`` wherever it is read. Whatever the worker knows of its
configuration is an attribute of this object; the defaults it has are the ones written here.

Feature switches travel as the operator's modes (``auto``/``on``/``off``) and the supervisor's
quarantines, not as decided states: only the worker sees the GPUs' models and the driver, so only it
applies the known-issue rules (``guards/known_issues.json``) and decides (``Sampler.resolve_features``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from exporter.common.decode import decode_dataclass
from exporter.common.gpuid import gpu_key
from guards.features import Mode

# The worker's host paths when the operator sets none (procfs and containerlogs default to them too).
DEFAULT_PROC_PATH = "/proc"
DEFAULT_CONTAINER_LOG_DIR = "/var/log/containers"  # the kubelet's container log symlinks

__all__ = ["ENV_VAR", "CollectorOptions", "Exclusion", "GpuRef", "ProcessOptions", "WorkerConfig"]

ENV_VAR = "NVGPU_WORKER_CONFIG"
"""The environment variable that carries the configuration (JSON) to the worker process."""


@dataclass(frozen=True)
class GpuRef:
    """A GPU by identity (:func:`exporter.common.gpuid.gpu_key`): what a probe attaches, or an exclusion names.

    Attributes:
        uuid: GPU UUID, "" when it could not be read.
        bus_id: PCI bus id (``nvmlDeviceGetHandleByPciBusId_v2``), "" when unknown.
        index: the NVML index it was last seen at: a hint only (indices move when a GPU leaves or
            arrives); a GPU with neither UUID nor bus id is looked up by it.
    """

    uuid: str
    bus_id: str
    index: int

    @property
    def key(self) -> str:
        """The GPU's state key: UUID, else PCI bus id, else ``#<index>``."""
        return gpu_key(self.uuid, self.bus_id, self.index)


@dataclass(frozen=True)
class Exclusion:
    """A GPU the worker must not attach (:mod:`exporter.supervisor.gpuhealth`); it reports it in this state.

    Attributes:
        gpu: which GPU (found by UUID or bus id wherever NVML now numbers it).
        state: ``hung`` or ``crashed`` (:data:`exporter.common.snapshot.GPU_STATES`).
        detail: why, for ``nvgpu_device_state`` and the logs.
    """

    gpu: GpuRef
    state: str
    detail: str


@dataclass(frozen=True)
class ProcessOptions:
    """What the processes collector needs beyond NVML (:mod:`exporter.common.collectors.processes`).

    Attributes:
        proc_path: the proc file system GPU pids are resolved in ("": none).
        container_log_dir: the kubelet's container log directory ("": none).
        series_per_gpu: processes with their own series per GPU (feature ``process_usage``).
    """

    proc_path: str = DEFAULT_PROC_PATH
    container_log_dir: str = DEFAULT_CONTAINER_LOG_DIR
    series_per_gpu: int = 16


@dataclass(frozen=True)
class CollectorOptions:
    """Per-collector settings, by collector; read through ``dev.client.options``."""

    processes: ProcessOptions = field(default_factory=ProcessOptions)


@dataclass(frozen=True)
class WorkerConfig:
    """One worker's (or probe's) configuration.

    Attributes:
        backend: ``nvml`` or ``fake:<scenario file>`` (``NVGPU_NVML_BACKEND``).
        interval_s: seconds between samples.
        deadline_s: seconds one GPU's NVML call may take before the GPU counts as hung.
        reprobe_s: seconds between re-probes of what each GPU supports.
        enumerate_s: seconds between re-enumerations of the GPUs (UUID per index) when nothing
            asked for one sooner (a count change, a lost GPU, a reset or bus event).
        drain_s: seconds an orderly stop waits for calls in flight before ``nvmlShutdown``.
        log_level: ``NVGPU_LOG_LEVEL``.
        log_format: the format of the worker's stderr; ``json`` (the supervisor parses it).
        modes: feature name -> the operator's mode (``NVGPU_FEATURE_*``).
        quarantined: feature name -> why the supervisor quarantined it.
        collectors: per-collector settings.
        exclude: GPUs not to attach (hung or crashed ones a probe retries).
        only: attach just these GPUs (a probe); empty: every GPU.
        samples: stop after this many samples (a probe: 1); None: until asked to stop.
    """

    backend: str
    interval_s: float
    deadline_s: float
    reprobe_s: float
    enumerate_s: float
    drain_s: float
    log_level: str
    log_format: str
    modes: Mapping[str, Mode]
    quarantined: Mapping[str, str]
    collectors: CollectorOptions
    exclude: tuple[Exclusion, ...] = ()
    only: tuple[GpuRef, ...] = ()
    samples: int | None = None

    def to_wire(self) -> dict[str, Any]:
        """The JSON object the worker receives (every field, so the worker can insist on all)."""
        return {
            "backend": self.backend,
            "interval_s": self.interval_s,
            "deadline_s": self.deadline_s,
            "reprobe_s": self.reprobe_s,
            "enumerate_s": self.enumerate_s,
            "drain_s": self.drain_s,
            "log_level": self.log_level,
            "log_format": self.log_format,
            "modes": {name: Mode(mode).value for name, mode in self.modes.items()},
            "quarantined": dict(self.quarantined),
            "collectors": asdict(self.collectors),
            "exclude": [asdict(e) for e in self.exclude],
            "only": [asdict(g) for g in self.only],
            "samples": self.samples,
        }

    @classmethod
    def from_wire(cls, data: Any) -> WorkerConfig:
        """Decode :meth:`to_wire`'s object.

        Raises:
            ValueError: a field missing, unknown or of the wrong type, named
                (``worker config.collectors.processes.proc_path: missing field``).
        """
        return decode_dataclass(cls, data, "worker config", complete=True)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> WorkerConfig:
        """The configuration in :data:`ENV_VAR` of ``environ``.

        Raises:
            ValueError: the variable is missing, not JSON, or does not decode (see :meth:`from_wire`).
        """
        text = environ.get(ENV_VAR)
        if text is None:
            raise ValueError(f"{ENV_VAR} is not set: the worker is started by the supervisor")
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{ENV_VAR} is not JSON: {exc}") from None
        return cls.from_wire(data)
