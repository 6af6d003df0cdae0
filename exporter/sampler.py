"""One worker's NVML state and sampling pass: init, GPUs by index keyed by UUID, features, snapshots.

Runs in the worker process only. :class:`Sampler` calls ``nvmlInit`` once, reads the versions,
attaches every GPU (``nvmlDeviceGetHandleByIndex`` then ``nvmlDeviceGetUUID``), resolves feature
states (environment, quarantine from the supervisor, known-issue rules for these GPUs), and makes
one :class:`~exporter.snapshot.Snapshot` per :meth:`Sampler.sample`. Every NVML call goes through
the :class:`~exporter.nvml.client.NvmlClient` (breadcrumb, counting); what an error means is
decided in :mod:`exporter.nvml.errors`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter import collectors, logs
from exporter.collectors.base import Collector
from exporter.nvml import errors
from exporter.nvml.client import DeviceClient, DeviceLost, NvmlClient, NvmlFatal, Stopping
from exporter.snapshot import FeatureStat, GpuSample, InitFailed, Snapshot, SystemInfo
from guards import features as gf

log = logging.getLogger("exporter.worker")

_VERSION_CALLS = (
    ("driver_version", "nvmlSystemGetDriverVersion"),
    ("nvml_version", "nvmlSystemGetNVMLVersion"),
    ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion"),
)


@dataclass
class _Stats:
    """Per-feature time and success over one sample (all GPUs)."""

    seconds: dict[str, float] = field(default_factory=dict)
    ok: dict[str, bool] = field(default_factory=dict)

    def add(self, feature: str, seconds: float, ok: bool) -> None:
        self.seconds[feature] = self.seconds.get(feature, 0.0) + seconds
        self.ok[feature] = self.ok.get(feature, True) and ok

    def features(self) -> dict[str, FeatureStat]:
        return {f: FeatureStat(self.ok[f], self.seconds[f]) for f in self.seconds}


class Sampler:
    """Sampling state of one worker process.

    Args:
        config: the worker configuration (``exporter.config.Config.worker_config``).
        client: the NVML client of the sampling thread.
        binding_version: the installed nvidia-ml-py version (empty if unknown).
    """

    def __init__(self, config: Mapping[str, Any], client: NvmlClient, binding_version: str) -> None:
        self.config = config
        self.client = client
        self.binding_version = binding_version
        self.system = SystemInfo(nvidia_ml_py_version=binding_version)
        self.devices: list[DeviceClient] = []
        self.lost: dict[int, str] = {}  # index -> uuid ("" if never known)
        self.states: dict[str, gf.FeatureState] = {}
        self.events_enabled: dict[str, bool] = {}  # written by the event thread

    # -- start-up ----------------------------------------------------------------------------

    def init(self) -> InitFailed | None:
        """``nvmlInit``, versions, enumeration. Returns the failure to report, or None.

        Raises:
            NvmlFatal: a handle lookup said NVML itself is unusable.
            Stopping: a shutdown was requested meanwhile.
        """
        try:
            self.client.raw("init", "nvmlInit", "")
        except Stopping:
            raise
        except Exception as exc:
            failure = errors.classify(exc)
            return InitFailed(failure.code, failure.name, failure.message)
        versions: dict[str, str] = {}
        for key, fn in _VERSION_CALLS:
            try:
                value = self.client.raw("init", fn, "")
            except Stopping:
                raise
            except Exception as exc:  # noqa: BLE001 - version strings are informational
                log.warning("%s failed: %s", fn, errors.classify(exc).message)
                continue
            if key == "cuda_driver_version":
                value = f"{int(value) // 1000}.{int(value) % 1000 // 10}"
            versions[key] = value.decode() if isinstance(value, bytes) else str(value)
        self.system = SystemInfo(nvidia_ml_py_version=self.binding_version, **versions)
        self.enumerate()
        return None

    def enumerate(self) -> None:
        """A handle and UUID per NVML index; a GPU whose lookup fails is recorded as lost."""
        count = self.client.raw("init", "nvmlDeviceGetCount", "")
        known = {d.index for d in self.devices}
        for index in range(int(count)):
            if index not in known:
                self._attach(index)

    def _attach(self, index: int) -> None:
        try:
            handle = self.client.raw("init", "nvmlDeviceGetHandleByIndex", "", index)
            uuid_raw = self.client.raw("init", "nvmlDeviceGetUUID", "", handle)
        except Stopping:
            raise
        except Exception as exc:
            failure = errors.classify(exc, errors.Context.HANDLE_LOOKUP)
            if failure.error_class is errors.ErrorClass.FATAL:
                raise NvmlFatal(failure, "nvmlDeviceGetHandleByIndex") from exc
            self.lost.setdefault(index, "")
            logs.log_once(
                log,
                logging.WARNING,
                ("attach", str(index), failure.name),
                "GPU %d: handle lookup failed (%s); it is skipped and retried every sample",
                index,
                failure.message,
                extra={"gpu": index, "nvml_error": failure.name},
            )
            return
        uuid = uuid_raw.decode() if isinstance(uuid_raw, bytes) else str(uuid_raw)
        self.lost.pop(index, None)
        self.devices.append(DeviceClient(self.client, index, uuid, handle))
        self.devices.sort(key=lambda d: d.index)

    def resolve_features(self) -> None:
        """Effective feature states: env modes, quarantine, known-issue rules for these GPUs."""
        from guards import known_issues

        models = []
        for dev in self.devices:
            try:
                models.append(str(self.client.raw("identity", "nvmlDeviceGetName", dev.uuid, dev.handle)))
            except Stopping:
                raise
            except Exception:  # noqa: BLE001 - a model we cannot read matches no rule
                continue
        hits: dict[str, str] = {}
        try:
            hits = known_issues.match_known_issues(
                known_issues.load_known_issues(),
                gpu_models=models,
                driver_version=self.system.driver_version or "0",
                binding_version=self.system.nvidia_ml_py_version or None,
            )
        except ValueError as exc:
            log.error("known-issue rules could not be evaluated: %s", exc)
        modes = {name: gf.Mode(value) for name, value in self.config["modes"].items()}
        self.states = gf.resolve(modes, known_issues=hits, quarantined=self.config.get("quarantined", {}))
        for name, state in self.states.items():
            if state.reason is gf.Reason.KNOWN_ISSUE:
                log.warning(
                    "feature %s is off: known issue on this node: %s (set NVGPU_FEATURE_%s=on to override)",
                    name,
                    state.detail,
                    name.upper(),
                )

    # -- sampling ----------------------------------------------------------------------------

    def enabled(self, feature: str) -> bool:
        """Whether ``feature`` is on in this worker."""
        state = self.states.get(feature)
        return bool(state and state.enabled)

    def sample(self) -> Snapshot:
        """One pass over every GPU and enabled feature.

        Raises:
            NvmlFatal: NVML is unusable (a fatal error, or every call of the sample failed).
            Stopping: a shutdown was requested.
        """
        started = time.time()
        t0 = time.perf_counter()
        for index in list(self.lost):
            self._attach(index)
        calls_before, ok_before = self.client.calls, self.client.ok_calls
        stats = _Stats()
        gpus = [self._sample_gpu(dev, stats) for dev in list(self.devices)]
        sampled = {g.index for g in gpus}
        gpus += [GpuSample(i, uuid, False) for i, uuid in self.lost.items() if i not in sampled]
        self._mark_unsupported()
        if self.devices:
            failure = errors.sample_failed_everywhere(
                self.client.calls - calls_before, self.client.ok_calls - ok_before
            )
            if failure is not None:
                raise NvmlFatal(failure, "sample")
        return Snapshot(
            ts=started,
            duration_s=time.perf_counter() - t0,
            system=self.system,
            gpus=tuple(sorted(gpus, key=lambda g: g.index)),
            features=stats.features(),
            feature_states=dict(self.states),
            errors=dict(self.client.errors),
            calls=self.client.calls,
            events_enabled=dict(self.events_enabled),
        )

    def _sample_gpu(self, dev: DeviceClient, stats: _Stats) -> GpuSample:
        readings: dict[str, object] = {}
        for feature, collector in collectors.COLLECTORS.items():
            if not self.enabled(feature):
                continue
            f0 = time.perf_counter()
            errors_before = self._feature_errors(feature)
            try:
                reading = self._read(dev, feature, collector)
            except DeviceLost as exc:
                stats.add(feature, time.perf_counter() - f0, False)
                log.error(
                    "GPU %s (index %d) lost: %s; its series are dropped until it comes back",
                    dev.uuid,
                    dev.index,
                    exc,
                    extra={"uuid": dev.uuid, "gpu": dev.index},
                )
                self.devices.remove(dev)
                self.lost[dev.index] = dev.uuid
                return GpuSample(dev.index, dev.uuid, False)
            if reading is not None and reading is not _FAILED:
                readings[feature] = reading
            ok = reading is not _FAILED and self._feature_errors(feature) == errors_before
            stats.add(feature, time.perf_counter() - f0, ok)
        return GpuSample(dev.index, dev.uuid, True, readings)

    def _read(self, dev: DeviceClient, feature: str, collector: Collector) -> object:
        """The collector's reading; ``_FAILED`` when the collector raised (our bug, counted)."""
        try:
            return collector.read(dev)
        except (DeviceLost, NvmlFatal, Stopping):
            raise
        except Exception:  # a collector bug must not fail the sample
            self.client.errors[(feature, "exception")] += 1
            logs.log_once(log, logging.ERROR, ("collector", feature), "collector %s raised", feature, exc_info=True)
            return _FAILED

    def _feature_errors(self, feature: str) -> int:
        return sum(v for (f, _), v in self.client.errors.items() if f == feature)

    def _mark_unsupported(self) -> None:
        """A feature that no GPU supports is switched off with reason ``unsupported``."""
        if not self.devices:
            return
        for feature in collectors.COLLECTORS:
            if not self.enabled(feature):
                continue
            if not all(feature in d.feature_unsupported and feature not in d.feature_ok for d in self.devices):
                continue
            missing = sorted(
                {
                    str(k[0]) if k[0] != "field" else f"field {k[1]}"
                    for d in self.devices
                    for k, (f, _) in d.unsupported.items()
                    if f == feature
                }
            )
            detail = f"no GPU supports it ({', '.join(missing)})"
            self.states[feature] = gf.FeatureState(feature, False, gf.Reason.UNSUPPORTED, detail)
            # The hardware saying no (no fan on an H200, no NVLink on a single GPU) is not a fault:
            # INFO, once (the supervisor keeps it once across workers too; issue 16). A missing
            # symbol or a refused permission is worth a WARNING: a newer binding or driver, or the
            # container's device access, would change it.
            answers = {why for d in self.devices for (f, why) in d.unsupported.values() if f == feature}
            expected = not answers & _NOT_HARDWARE
            logs.log_once(
                log,
                logging.INFO if expected else logging.WARNING,
                ("unsupported-feature", feature, detail),
                "feature %s is unsupported on every GPU (%s): it is switched off for this worker's life",
                feature,
                detail,
                extra={"feature": feature},
            )


_NOT_HARDWARE = {"FUNCTION_NOT_FOUND", "ARGUMENT_VERSION_MISMATCH", "NO_PERMISSION"}  # binding, driver, container
_FAILED = object()  # a collector raised: no reading, feature failed
