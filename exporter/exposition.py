"""Render the exposition once per snapshot; ``/metrics`` serves the bytes from memory.

:func:`render` builds fresh metric families from the supervisor's state (the last snapshot, when
it is younger than the stale bound, plus the self-metrics that survive worker restarts), and
encodes them twice: Prometheus text 0.0.4 and OpenMetrics 1.0.0. Gzip bodies are made on first
request and cached with the rendering. A collector whose ``families()`` raises loses only the GPU
that made it raise; that feature's ``nvgpu_feature_success`` becomes 0.
"""

from __future__ import annotations

import gzip
import logging
import math
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import exposition as text_format
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as om_format

from exporter import __version__, collectors
from exporter.collectors import identity
from exporter.collectors.base import GpuKey
from exporter.logs import log_once

if TYPE_CHECKING:
    from exporter.supervisor import SupervisorState

log = logging.getLogger(__name__)

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


class _Families:
    """A ``collect()``-able bag of families that merges families of the same name."""

    def __init__(self) -> None:
        self._by_name: dict[str, Metric] = {}

    def add(self, metrics: Iterable[Metric]) -> None:
        for m in metrics:
            have = self._by_name.get(m.name)
            if have is None:
                self._by_name[m.name] = m
            else:
                have.samples.extend(m.samples)

    def collect(self) -> Iterator[Metric]:
        return iter(self._by_name.values())


class Rendered:
    """One rendering: the text format eagerly; OpenMetrics and gzip bodies on first request, kept.

    Rendering OpenMetrics costs about twice the text format in prometheus_client (it validates
    every label name), and most scrapers of a cluster ask for one format only.
    """

    def __init__(self, families: _Families) -> None:
        self._families = families
        self.text: bytes = text_format.generate_latest(families)  # type: ignore[arg-type, unused-ignore]
        self._openmetrics: bytes | None = None
        self._gzip: dict[bool, bytes] = {}

    @property
    def openmetrics(self) -> bytes:
        """OpenMetrics 1.0.0 body (ends with ``# EOF``)."""
        if self._openmetrics is None:
            self._openmetrics = om_format.generate_latest(self._families)  # type: ignore[no-untyped-call, arg-type, unused-ignore]
        return self._openmetrics

    def body(self, openmetrics: bool, gzipped: bool) -> bytes:
        """The body for a format, compressed if asked."""
        raw = self.openmetrics if openmetrics else self.text
        if not gzipped:
            return raw
        if openmetrics not in self._gzip:
            self._gzip[openmetrics] = gzip.compress(raw, compresslevel=6, mtime=0)
        return self._gzip[openmetrics]


def negotiate(accept: str | None) -> bool:
    """True when the Accept header prefers OpenMetrics 1.0 over the text format.

    Honours q-values (Prometheus 3 sends OpenMetrics 1.0.0 at q=0.6 and text 0.0.4 at q=0.3);
    OpenMetrics versions other than 1.x are not offered.
    """
    if not accept:
        return False
    best_om = best_text = -1.0
    for part in accept.split(","):
        items = [p.strip() for p in part.split(";")]
        mime = items[0].lower()
        params = dict(p.split("=", 1) for p in items[1:] if "=" in p)
        try:
            q = float(params.get("q", "1"))
        except ValueError:
            q = 0.0
        if mime == "application/openmetrics-text":
            version = params.get("version", "1.0.0")
            if version.startswith("1."):
                best_om = max(best_om, q)
        elif mime in ("text/plain", "*/*", "text/*"):
            best_text = max(best_text, q)
    return best_om > 0 and best_om >= best_text


def _gauge(name: str, doc: str, value: float | None, labels: dict[str, str] | None = None) -> Metric:
    fam = GaugeMetricFamily(name, doc, labels=list(labels or {}))
    if value is not None and math.isfinite(value):
        fam.add_metric(list((labels or {}).values()), value)
    return fam


def gpu_families(state: SupervisorState) -> tuple[list[Metric], set[str]]:
    """Per-GPU families from the fresh snapshot; returns (families, features whose rendering failed)."""
    snap = state.fresh_snapshot()
    if snap is None:
        return [], set()
    bag = _Families()
    failed: set[str] = set()
    by_feature: dict[str, list[tuple[GpuKey, Any]]] = {}
    up = GaugeMetricFamily(
        "nvgpu_device_up",
        "1 if the GPU answered NVML in the last sample, 0 if it is lost (GPU_IS_LOST, handle lookup failure)",
        labels=["gpu", "uuid"],
    )
    for g in snap["gpus"]:
        key = GpuKey(str(g["index"]), g["uuid"])
        # A GPU whose handle lookup failed before its UUID was ever read (Xid 79 can surface as
        # UNKNOWN from nvmlDeviceGetHandleByIndex) is still a GPU that is down: device_up 0 with an
        # empty uuid, rather than no series that an alert on device_up == 0 could see.
        up.add_metric(list(key), 1.0 if g["up"] else 0.0)
        for feature, data in g["readings"].items():
            if feature not in collectors.COLLECTORS:
                continue
            try:
                reading = collectors.from_json(feature, data)
            except TypeError:
                failed.add(feature)
                continue
            by_feature.setdefault(feature, []).append((key, reading))
    bag.add([up])
    for feature, samples in by_feature.items():
        module = collectors.COLLECTORS[feature]
        extra = (state.system,) if module is identity else ()
        try:
            bag.add(list(module.families(samples, *extra)))
        except Exception:  # one GPU's odd reading must not cost the others
            failed.add(feature)
            log_once(
                log,
                logging.ERROR,
                ("render", feature),
                "rendering feature %s failed; retrying per GPU",
                feature,
                exc_info=True,
            )
            for sample in samples:
                try:
                    bag.add(list(module.families([sample], *extra)))
                except Exception:  # noqa: BLE001 - that GPU's series of this feature are omitted
                    continue
    bag.add(state.extra_gpu_families(snap))
    metrics = list(bag.collect())
    if state.pod_labels is not None:
        metrics = [_with_pod_labels(m, state.pod_labels) for m in metrics]
    return metrics, failed


def _with_pod_labels(metric: Metric, lookup: Any) -> Metric:
    """Add namespace/pod/container labels to every sample of a per-GPU family (NVGPU_POD_LABELS).

    A GPU held by exactly one container gets its names; an unassigned or shared GPU (time-slicing:
    several pods on one UUID) gets empty values — join ``nvgpu_gpu_pod_info`` for those.
    """
    if metric.name == "nvgpu_gpu_pod_info" or not metric.samples or "uuid" not in metric.samples[0].labels:
        return metric
    samples = []
    for s in metric.samples:
        ns, pod, container = lookup(s.labels["uuid"])
        samples.append(s._replace(labels={**s.labels, "namespace": ns, "pod": pod, "container": container}))
    metric.samples = samples
    return metric


def self_families(state: SupervisorState, render_failed: set[str]) -> list[Metric]:
    """Self-metrics: up, build info, sample age, feature states, worker restarts and crashes."""
    out: list[Metric] = []
    snap = state.fresh_snapshot()
    last = state.last_snapshot
    out.append(
        _gauge(
            "nvgpu_up",
            "1 if NVML is initialised and the last sample is younger than the stale bound",
            1.0 if snap is not None and state.nvml_up else 0.0,
        )
    )
    system = state.system
    out.append(
        _gauge(
            "nvgpu_build_info",
            "Versions in use; value is always 1",
            1.0,
            {
                "version": __version__,
                "nvidia_ml_py_version": system.get("nvidia_ml_py_version", ""),
                "nvml_version": system.get("nvml_version", ""),
                "driver_version": system.get("driver_version", ""),
                "python_version": state.python_version,
            },
        )
    )
    if last is not None:
        out.append(
            _gauge("nvgpu_last_sample_timestamp_seconds", "Unix time of the last NVML sample", float(last["ts"]))
        )
        out.append(
            _gauge("nvgpu_sample_duration_seconds", "Wall time of the last NVML sample", float(last["duration_s"]))
        )
    success = GaugeMetricFamily(
        "nvgpu_feature_success", "1 if the feature's last sample succeeded on every GPU", labels=["feature"]
    )
    duration = GaugeMetricFamily(
        "nvgpu_feature_duration_seconds", "Time spent in the feature during the last sample", labels=["feature"]
    )
    if snap is not None:
        for feature, f in sorted(snap["features"].items()):
            ok = 0.0 if feature in render_failed else float(f["success"])
            success.add_metric([feature], ok)
            duration.add_metric([feature], float(f["duration_s"]))
    out += [success, duration]
    enabled = GaugeMetricFamily(
        "nvgpu_feature_enabled",
        "1 if the feature is enabled; reason says why it is in that state "
        "(default, env, known_issue, quarantined, unsupported)",
        labels=["feature", "reason"],
    )
    for feature, st in sorted(state.feature_states().items()):
        enabled.add_metric([feature, st["reason"]], 1.0 if st["enabled"] else 0.0)
    out.append(enabled)
    errors = CounterMetricFamily(
        "nvgpu_nvml_errors", "NVML errors that omitted a sample, by feature and NVML error", labels=["feature", "error"]
    )
    for (feature, name), count in sorted(state.nvml_errors().items()):
        errors.add_metric([feature, name], float(count))
    out.append(errors)
    out.append(
        CounterMetricFamily(
            "nvgpu_nvml_calls", "NVML calls made by workers since the exporter started", value=float(state.nvml_calls())
        )
    )
    restarts = CounterMetricFamily(
        "nvgpu_worker_restarts",
        "Worker restarts by reason (crash: killed by a signal; hang: missed its deadline; exit: exited; "
        "nvml_error: NVML unusable)",
        labels=["reason"],
    )
    for reason in ("crash", "hang", "exit", "nvml_error"):
        restarts.add_metric([reason], float(state.restarts.get(reason, 0)))
    out.append(restarts)
    crashes = CounterMetricFamily(
        "nvgpu_worker_crashes",
        "Worker crashes and hangs by the feature and NVML function in flight",
        labels=["feature", "function"],
    )
    for (feature, function), count in sorted(state.crashes.items()):
        crashes.add_metric([feature, function], float(count))
    out.append(crashes)
    out.append(
        _gauge(
            "nvgpu_worker_last_exit_signal",
            "Signal that ended the last worker (0: none or not a signal)",
            float(state.last_exit_signal),
        )
    )
    out.append(
        _gauge("nvgpu_worker_last_exit_code", "Exit code of the last worker that exited", float(state.last_exit_code))
    )
    if state.worker_started_at is not None:
        out.append(
            _gauge("nvgpu_worker_start_time_seconds", "Unix time the current worker started", state.worker_started_at)
        )
    out.append(
        _gauge(
            "nvgpu_worker_stuck",
            "1 if a worker is in uninterruptible sleep or respawning stopped after repeated hangs",
            1.0 if state.worker_stuck else 0.0,
        )
    )
    out += state.extra_self_families()
    return out


def render(state: SupervisorState) -> Rendered:
    """Both encodings of the current state."""
    bag = _Families()
    gpu, failed = gpu_families(state)
    bag.add(gpu)
    bag.add(self_families(state, failed))
    return Rendered(bag)
