"""Render the exposition once per state change; ``/metrics`` serves the bytes from memory.

:func:`render` builds fresh metric families from the :class:`~exporter.served.ServedState`: per-GPU
families from the snapshot when it is younger than the stale bound (collectors, then the
supervisor-owned ``device_up`` and Xid/event counters, then extensions), and the self-metrics that
survive worker restarts (:mod:`exporter.selfmetrics`, then extensions). It encodes them as
Prometheus text 0.0.4 at once; OpenMetrics 1.0.0 and gzip bodies are made on first request and
kept with the rendering. A collector whose ``families()`` raises loses only the GPU that made it
raise; that feature's ``nvgpu_feature_success`` becomes 0.
"""

from __future__ import annotations

import functools
import gzip
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import exposition as text_format
from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as om_format

from exporter import collectors, selfmetrics
from exporter.logs import log_once
from exporter.metric import GpuKey, MetricDef

if TYPE_CHECKING:
    from exporter.extensions import Extension
    from exporter.served import ServedState
    from exporter.snapshot import Snapshot

log = logging.getLogger(__name__)

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

DEVICE_UP = MetricDef(
    "nvgpu_device_up",
    "1 if the GPU answered NVML in the last sample, 0 if it is lost (GPU_IS_LOST, handle lookup failure)",
)
METRICS = (DEVICE_UP,)


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


def gpu_families(state: ServedState) -> tuple[list[Metric], set[str]]:
    """Per-GPU families from the fresh snapshot; returns (families, features whose rendering failed)."""
    snap = state.fresh_snapshot()
    if snap is None:
        return [], set()
    bag = _Families()
    up = DEVICE_UP.family()
    by_feature: dict[str, list[tuple[GpuKey, Any]]] = {}
    for g in snap.gpus:
        key = GpuKey(str(g.index), g.uuid)
        # A GPU whose handle lookup failed before its UUID was ever read (Xid 79 can surface as
        # UNKNOWN from nvmlDeviceGetHandleByIndex) is still a GPU that is down: device_up 0 with an
        # empty uuid, rather than no series that an alert on device_up == 0 could see.
        up.add(key, 1 if g.up else 0)
        for feature, reading in g.readings.items():
            by_feature.setdefault(feature, []).append((key, reading))
    bag.add([up.always()])
    failed = set()
    for feature, samples in by_feature.items():
        if not _render_feature(bag, feature, samples, snap):
            failed.add(feature)
    bag.add(state.xids.families((g.uuid for g in snap.gpus if g.up), state.gpu_index))
    for ext in state.extensions:
        bag.add(_guarded(ext, "gpu_families", functools.partial(ext.gpu_families, snap)))
    metrics = list(bag.collect())
    labelers = [e for e in state.extensions if e.relabels_gpus]
    for ext in labelers:
        metrics = [_with_pod_labels(m, ext) for m in metrics]
    return metrics, failed


def _render_feature(bag: _Families, feature: str, samples: list[tuple[GpuKey, Any]], snap: Snapshot) -> bool:
    """Add one collector's families; on an exception retry per GPU. False if any GPU failed."""
    collector = collectors.COLLECTORS[feature]
    try:
        bag.add(list(collector.families(samples, snap.system)))
        return True
    except Exception:  # one GPU's odd reading must not cost the others
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
            bag.add(list(collector.families([sample], snap.system)))
        except Exception:  # noqa: BLE001 - that GPU's series of this feature are omitted
            continue
    return False


def _guarded(ext: Extension, hook: str, call: Callable[[], Iterable[Metric]]) -> Iterable[Metric]:
    """An extension's families; an extension that raises costs only its own families."""
    try:
        return list(call())
    except Exception:  # noqa: BLE001
        log_once(log, logging.ERROR, ("extension", type(ext).__name__, hook), "%s failed", hook, exc_info=True)
        return []


def _with_pod_labels(metric: Metric, ext: Extension) -> Metric:
    """Add namespace/pod/container labels to every sample of a per-GPU family (NVGPU_POD_LABELS).

    A GPU held by exactly one container gets its names; an unassigned or shared GPU (time-slicing:
    several pods on one UUID) gets empty values — join ``nvgpu_gpu_pod_info`` for those.
    """
    first = metric.samples[0].labels if metric.samples else {}
    if "uuid" not in first or "pod" in first:  # not per GPU, or already per pod (pod info, per-pod/process usage)
        return metric
    samples = []
    for s in metric.samples:
        ns, pod, container = ext.gpu_labels(s.labels["uuid"])
        samples.append(s._replace(labels={**s.labels, "namespace": ns, "pod": pod, "container": container}))
    metric.samples = samples
    return metric


def render(state: ServedState) -> Rendered:
    """Both encodings of the current state."""
    bag = _Families()
    gpu, failed = gpu_families(state)
    bag.add(gpu)
    bag.add(selfmetrics.families(state, failed))
    for ext in state.extensions:
        bag.add(_guarded(ext, "self_families", ext.self_families))
    return Rendered(bag)
