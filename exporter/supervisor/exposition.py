"""Render the exposition once per state change; ``/metrics`` serves the bytes from memory.

:func:`render` builds fresh metric families from the :class:`~exporter.supervisor.served.ServedState`: per-GPU
families from the snapshot when it is younger than the stale bound (collectors, then the
supervisor-owned ``device_up`` and Xid/event counters, then extensions), and the self-metrics that
survive worker restarts (:mod:`exporter.supervisor.selfmetrics`, then extensions). It encodes them as
Prometheus text 0.0.4 at once; OpenMetrics 1.0.0 and gzip bodies are made on first request and
kept with the rendering. A collector whose ``families()`` raises loses only the GPU that made it
raise; that feature's ``nvgpu_feature_success`` becomes 0. A family dropped because building it
raised, like a series that cannot be encoded, is counted in ``nvgpu_render_errors_total{family}``
and logged once.
"""

from __future__ import annotations

import collections
import copy
import functools
import gzip
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import exposition as text_format
from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as om_format

from exporter.common import collectors, plausibility
from exporter.common.logs import log_once
from exporter.common.metric import GpuKey, MetricDef
from exporter.supervisor import selfmetrics

if TYPE_CHECKING:
    from exporter.common.snapshot import Snapshot
    from exporter.supervisor.extensions import Extension
    from exporter.supervisor.served import ServedState

log = logging.getLogger(__name__)

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

RENDER_ERRORS = MetricDef(
    "nvgpu_render_errors_total",
    "Series dropped because they could not be encoded (e.g. a driver string that is not valid UTF-8), "
    "or families dropped because building them raised, by family",
    ("family",),
    per_gpu=False,
)
METRICS = (RENDER_ERRORS,)


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


class _One:
    """A registry of one family, for encoding families one at a time."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterator[Metric]:
        yield self.metric


_OM_EOF = b"# EOF\n"


def _encode(metrics: list[Metric], openmetrics: bool, dropped: collections.Counter[str]) -> bytes:
    """Encode family by family; a family that cannot be encoded is retried sample by sample, and
    only the samples that fail are dropped (counted in ``dropped`` by family, logged once)."""

    def generate(metric: Metric) -> bytes:
        if openmetrics:
            out: bytes = om_format.generate_latest(_One(metric))  # type: ignore[no-untyped-call, arg-type, unused-ignore]
            return out[: -len(_OM_EOF)] if out.endswith(_OM_EOF) else out
        return text_format.generate_latest(_One(metric))  # type: ignore[arg-type, unused-ignore]

    parts = []
    for metric in metrics:
        try:
            parts.append(generate(metric))
            continue
        except Exception:  # noqa: BLE001 - one family must not cost the exposition
            log_once(
                log, logging.ERROR, ("encode", metric.name), "family %s cannot be encoded", metric.name, exc_info=True
            )
        keep = []
        for sample in metric.samples:
            probe = copy.copy(metric)
            probe.samples = [sample]
            try:
                generate(probe)
                keep.append(sample)
            except Exception:  # noqa: BLE001
                dropped[metric.name] += 1
        if keep or not metric.samples:
            probe = copy.copy(metric)
            probe.samples = keep
            try:
                parts.append(generate(probe))
            except Exception:  # noqa: BLE001 - the HELP text itself cannot be encoded
                dropped[metric.name] += 1
    if openmetrics:
        parts.append(_OM_EOF)
    return b"".join(parts)


class Rendered:
    """One rendering: the text format eagerly; OpenMetrics and gzip bodies on first request, kept.

    Rendering OpenMetrics costs about twice the text format in prometheus_client (it validates
    every label name), and most scrapers of a cluster ask for one format only.

    Args:
        families: the families to encode.
        dropped: family name -> samples that could not be encoded (updated by this rendering).
    """

    def __init__(self, families: _Families, dropped: collections.Counter[str] | None = None) -> None:
        self._metrics = list(families.collect())
        self._dropped = dropped if dropped is not None else collections.Counter()
        self.text: bytes = _encode(self._metrics, False, self._dropped)
        self._openmetrics: bytes | None = None
        self._gzip: dict[bool, bytes] = {}

    @property
    def openmetrics(self) -> bytes:
        """OpenMetrics 1.0.0 body (ends with ``# EOF``)."""
        if self._openmetrics is None:
            self._openmetrics = _encode(self._metrics, True, collections.Counter())
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
    """Per-GPU families; returns (families, features whose rendering failed).

    What the supervisor owns is rendered whatever the age of the readings: the GPUs' state
    (``exporter.supervisor.gpuhealth``), their identity, Xid and event counters, and the extensions' families
    (stuck signature, pods). Readings are rendered only for GPUs whose readings are younger than the
    stale bound.
    """
    bag = _Families()
    bag.add(state.health.families(state.fresh_snapshot() is not None))
    bag.add(state.verdicts.families())
    snap = state.last
    failed: set[str] = set()
    if snap is not None:
        fresh = {g.key for g in state.fresh_gpus() if g.up}  # a GPU that is not up has no readings
        by_feature: dict[str, list[tuple[GpuKey, Any]]] = {}
        for g in snap.gpus:
            key = GpuKey(str(g.index), g.uuid)
            for feature, reading in g.readings.items():
                if g.key in fresh or feature == "identity":  # identity is static: never dropped
                    by_feature.setdefault(feature, []).append((key, reading))
        for feature, samples in by_feature.items():
            if not _render_feature(bag, feature, samples, snap, state.render_errors):
                failed.add(feature)
        bag.add(plausibility.families([(GpuKey(str(g.index), g.uuid), g.dropped) for g in snap.gpus if g.key in fresh]))
    live = [g.uuid for g in state.fresh_gpus() if g.up]
    bag.add(state.xids.families(live, state.gpu_index, now=state.verdicts.clock()))
    for ext in state.active_extensions():
        if snap is not None:
            call = functools.partial(ext.gpu_families, snap)
            bag.add(_guarded(ext, "gpu_families", call, state.render_errors))
    metrics = list(bag.collect())
    labelers = [e for e in state.active_extensions() if e.relabels_gpus]
    for ext in labelers:
        metrics = [_with_pod_labels(m, ext) for m in metrics]
    return metrics, failed


def _render_feature(
    bag: _Families,
    feature: str,
    samples: list[tuple[GpuKey, Any]],
    snap: Snapshot,
    dropped: collections.Counter[str],
) -> bool:
    """Add one collector's families; on an exception retry per GPU. False if any GPU failed; each
    failed GPU counts one drop of each of the collector's families in ``dropped``."""
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
            for metric in collector.METRICS:
                dropped[metric.name] += 1
    return False


def _guarded(
    ext: Extension, hook: str, call: Callable[[], Iterable[Metric]], dropped: collections.Counter[str]
) -> Iterable[Metric]:
    """An extension's families; an extension that raises costs only its own families, each counted
    in ``dropped`` (its per-GPU families for ``gpu_families``, the others for ``self_families``)."""
    try:
        return list(call())
    except Exception:  # noqa: BLE001
        log_once(
            log,
            logging.ERROR,
            ("extension", type(ext).__name__, hook),
            "%s.%s failed; its families are dropped from this rendering",
            type(ext).__name__,
            hook,
            exc_info=True,
        )
        names = [m.name for m in ext.metrics if m.per_gpu == (hook == "gpu_families")]
        for name in names or [f"{type(ext).__name__}.{hook}"]:
            dropped[name] += 1
        return []


def _with_pod_labels(metric: Metric, ext: Extension) -> Metric:
    """Add namespace/pod/container labels to every sample of a per-GPU family (NVGPU_POD_LABELS).

    A GPU held by exactly one container gets its names; an unassigned or shared GPU (time-slicing:
    several pods on one UUID) gets empty values — join ``nvgpu_gpu_pod_info`` for those. A series of
    one MIG device (``mig_uuid``) gets the container holding that MIG device; the parent GPU's own
    series get none (MIG pods hold instances, not the GPU).
    """
    first = metric.samples[0].labels if metric.samples else {}
    if "uuid" not in first or "pod" in first:  # not per GPU, or already per pod (pod info, per-pod/process usage)
        return metric
    samples = []
    for s in metric.samples:
        ns, pod, container = ext.gpu_labels(s.labels.get("mig_uuid") or s.labels["uuid"])
        samples.append(s._replace(labels={**s.labels, "namespace": ns, "pod": pod, "container": container}))
    metric.samples = samples
    return metric


def render(state: ServedState) -> Rendered:
    """Both encodings of the current state."""
    bag = _Families()
    gpu, failed = gpu_families(state)
    bag.add(gpu)
    bag.add(selfmetrics.families(state, failed))
    for ext in state.active_extensions():
        bag.add(_guarded(ext, "self_families", ext.self_families, state.render_errors))
    errors = RENDER_ERRORS.family()
    for family, count in sorted(state.render_errors.items()):
        errors.add_labels([family], count)
    bag.add([errors.always()])
    return Rendered(bag, state.render_errors)
