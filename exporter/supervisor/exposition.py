"""Render the exposition once per state change; ``/metrics`` serves the bytes from memory.

:func:`render` builds fresh metric families from the :class:`~exporter.supervisor.served.ServedState`: per-GPU
families from the snapshot when it is younger than the stale bound (collectors, then the
supervisor-owned ``device_up`` and Xid/event counters, then extensions), and the self-metrics that
survive worker restarts (:mod:`exporter.supervisor.selfmetrics`, then extensions). It writes them as
Prometheus text 0.0.4 at once (:mod:`exporter.supervisor.textformat`); the OpenMetrics 1.0.0 body,
whose sample lines are the same bytes under other headers, and gzip bodies are made on first
request and kept with the rendering. A collector whose ``families()`` raises loses only the GPU that
made it raise; that feature's ``nvgpu_feature_success`` becomes 0. A family dropped because building
it raised, like a series that cannot be encoded, is counted in ``nvgpu_render_errors_total{family}``
and logged once.

Given a :class:`RenderCache` (the :class:`~exporter.supervisor.http.web.Renderer` keeps one), each
collector's written lines are kept per feature with the readings they were made from, and reused
while every GPU's reading of that feature is equal to those (and the system versions are the same):
``families()`` is pure, so equal readings give equal bytes. Only features whose readings changed are
rendered again (at a 1 s interval on an idle GPU, about one feature in three). The GPUs' state, the
counters, the extensions and the self-metrics are built every time, and written again only when
their rows differ from the last rendering's. A feature whose rendering failed or a family that
dropped a series is never kept (its errors are counted on every rendering, as without a cache), nor
is a collector's while pod labels are added to the GPU series (``NVGPU_POD_LABELS``).
"""

from __future__ import annotations

import collections
import functools
import gzip
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.common import collectors, plausibility
from exporter.common.logs import log_once
from exporter.common.metric import Family, GpuKey, MetricDef
from exporter.supervisor import apis, selfmetrics, textformat

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
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
    """A bag of families that merges families of the same name (rows appended to the first)."""

    def __init__(self) -> None:
        self._by_name: dict[str, Family] = {}

    def add(self, families: Iterable[Family]) -> None:
        for fam in families:
            have = self._by_name.get(fam.spec.name)
            if have is None:
                self._by_name[fam.spec.name] = fam
            else:
                have.rows.extend(fam.rows)

    def collect(self) -> Iterator[Family]:
        return iter(self._by_name.values())


@dataclass
class _Part:
    """One family of the exposition: its headers (text, OpenMetrics) and its sample lines, in pieces
    (a family that several sources add, e.g. per-GPU and per-MIG-device series, has several)."""

    text_header: bytes
    om_header: bytes
    lines: list[bytes]


class _Exposition:
    """The families of one rendering in order, written as they are added; a family added again
    under the same name gets its lines appended (one header). Series that cannot be encoded are
    counted in :attr:`pending` and added to the render-error counter after the counter's own
    family is written (as it always was: a rendering shows the drops of the renderings before it).

    Args:
        written: the lines of each family of the last rendering with the rows they were written
            from (:attr:`RenderCache.written`), reused for a family whose rows are equal; None: none.
    """

    def __init__(self, written: dict[tuple[str, int], tuple[list[Any], tuple[str, ...], bytes]] | None = None) -> None:
        self.parts: dict[str, _Part] = {}
        self.pending: collections.Counter[str] = collections.Counter()
        self._written = written
        self._seen: collections.Counter[str] = collections.Counter()

    def add(self, families: Iterable[Family]) -> None:
        for fam in families:
            self.add_lines(fam.spec, fam.labels, self._lines(fam))

    def _lines(self, fam: Family) -> bytes:
        if self._written is None:
            return textformat.encode_lines(fam, self.pending)
        key = (fam.spec.name, self._seen[fam.spec.name])  # the n-th family of this name in the rendering
        self._seen[fam.spec.name] += 1
        have = self._written.get(key)
        if have is not None and have[1] == fam.labels and have[0] == fam.rows:
            return have[2]
        drops = collections.Counter[str]()
        lines = textformat.encode_lines(fam, drops)
        if drops:  # counted on every rendering: never kept
            self.pending.update(drops)
            self._written.pop(key, None)
        else:
            self._written[key] = (fam.rows, fam.labels, lines)
        return lines

    def add_lines(self, spec: MetricDef, labels: tuple[str, ...], lines: bytes) -> None:
        part = self.parts.get(spec.name)
        if part is None:
            plan = textformat.plan(spec, labels)
            self.parts[spec.name] = _Part(plan.text_header, plan.om_header, [lines])
        else:
            part.lines.append(lines)


class Rendered:
    """One rendering: the text format eagerly; OpenMetrics and gzip bodies on first request, kept.

    Args:
        parts: the families in order (headers and sample lines).
    """

    def __init__(self, parts: list[_Part]) -> None:
        self._parts = parts
        self.text: bytes = b"".join([b"".join([p.text_header, *p.lines]) for p in parts])
        self._openmetrics: bytes | None = None
        self._gzip: dict[bool, bytes] = {}

    @property
    def openmetrics(self) -> bytes:
        """OpenMetrics 1.0.0 body (ends with ``# EOF``)."""
        if self._openmetrics is None:
            self._openmetrics = b"".join([b"".join([p.om_header, *p.lines]) for p in self._parts]) + textformat.EOF
        return self._openmetrics

    def body(self, openmetrics: bool, gzipped: bool) -> bytes:
        """The body for a format, compressed if asked."""
        raw = self.openmetrics if openmetrics else self.text
        if not gzipped:
            return raw
        if openmetrics not in self._gzip:
            self._gzip[openmetrics] = gzip.compress(raw, compresslevel=6, mtime=0)
        return self._gzip[openmetrics]


@dataclass
class _Kept:
    """One feature's lines and what they were made from."""

    samples: list[tuple[GpuKey, Any]]
    system: SystemInfo
    families: list[tuple[MetricDef, tuple[str, ...], bytes]]


class RenderCache:
    """Each collector's written lines per feature, kept while its readings are unchanged (see the
    module docstring). One per renderer; :func:`render` reads and updates it.

    Attributes:
        reused: features taken from the cache since it was made.
        rendered: features rendered (and kept) since it was made.
    """

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}
        self.written: dict[tuple[str, int], tuple[list[Any], tuple[str, ...], bytes]] = {}
        """The other families' lines, by (name, n-th of that name), with the rows they were written from."""
        self.reused = 0
        self.rendered = 0

    def lookup(self, feature: str, samples: list[tuple[GpuKey, Any]], system: SystemInfo) -> _Kept | None:
        have = self._kept.get(feature)
        if have is not None and have.samples == samples and (have.system is system or have.system == system):
            self.reused += 1
            return have
        return None

    def keep(self, feature: str, kept: _Kept) -> None:
        self._kept[feature] = kept
        self.rendered += 1

    def forget(self, feature: str) -> None:
        self._kept.pop(feature, None)


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


def _by_feature(state: ServedState, snap: Snapshot) -> dict[str, list[tuple[GpuKey, Any]]]:
    """Readings to render, by feature: every GPU that is up with fresh readings; identity always."""
    fresh = {g.key for g in state.fresh_gpus() if g.up}  # a GPU that is not up has no readings
    by_feature: dict[str, list[tuple[GpuKey, Any]]] = {}
    for g in snap.gpus:
        key = GpuKey(str(g.index), g.uuid)
        for feature, reading in g.readings.items():
            if g.key in fresh or feature == "identity":  # identity is static: never dropped
                by_feature.setdefault(feature, []).append((key, reading))
    return by_feature


def gpu_families(state: ServedState) -> tuple[list[Family], set[str]]:
    """Per-GPU families; returns (families, features whose rendering failed).

    What the supervisor owns is rendered whatever the age of the readings: the GPUs' state
    (``exporter.supervisor.gpuhealth``), their identity, Xid and event counters, and the extensions' families
    (stuck signature, pods). Readings are rendered only for GPUs whose readings are younger than the
    stale bound.
    """
    bag = _Families()
    bag.add(state.health.families(state.fresh_snapshot() is not None, _count_views(state)))
    bag.add(state.verdicts.families())
    snap = state.last
    failed: set[str] = set()
    if snap is not None:
        for feature, samples in _by_feature(state, snap).items():
            if not _render_feature(bag, feature, samples, snap, state.render_errors):
                failed.add(feature)
    _supervisor_gpu_families(bag.add, state, snap)
    families = list(bag.collect())
    labelers = [e for e in state.active_extensions() if e.relabels_gpus]
    for ext in labelers:
        families = [_with_pod_labels(f, ext) for f in families]
    return families, failed


def _count_views(state: ServedState) -> dict[str, int]:
    """The ``nvgpu_gpus`` views the active extensions know (the device plugin's: pod attribution)."""
    views: dict[str, int] = {}
    for ext in state.active_extensions():
        try:
            views.update(ext.gpu_count_views())
        except Exception:  # noqa: BLE001 - an extension's bug costs only its views, never the rendering
            log_once(
                log,
                logging.ERROR,
                ("extension", type(ext).__name__, "gpu_count_views"),
                "%s.gpu_count_views failed; its nvgpu_gpus views are left out of this rendering",
                type(ext).__name__,
                exc_info=True,
            )
            state.render_errors[f"{type(ext).__name__}.gpu_count_views"] += 1
    return views


def _supervisor_gpu_families(
    add: Callable[[Iterable[Family]], None], state: ServedState, snap: Snapshot | None
) -> None:
    """The per-GPU families that follow the collectors': the readings dropped as implausible, Xid
    and event counters, then extensions'."""
    if snap is not None:
        fresh = {g.key for g in state.fresh_gpus() if g.up}
        add(plausibility.families([(GpuKey(str(g.index), g.uuid), g.dropped) for g in snap.gpus if g.key in fresh]))
    live = [g.uuid for g in state.fresh_gpus() if g.up]
    add(apis.families(g for g in state.fresh_gpus() if g.up))
    add(state.xids.families(live, state.gpu_index, now=state.verdicts.clock()))
    for ext in state.active_extensions():
        if snap is not None:
            call = functools.partial(ext.gpu_families, snap)
            add(_guarded(ext, "gpu_families", call, state.render_errors))


def _cached_gpu_families(out: _Exposition, state: ServedState, cache: RenderCache) -> set[str]:
    """:func:`gpu_families` written into ``out``, each collector's lines from ``cache`` while its
    readings are unchanged; returns the features whose rendering failed."""
    out.add(state.health.families(state.fresh_snapshot() is not None, _count_views(state)))
    out.add(state.verdicts.families())
    snap = state.last
    failed: set[str] = set()
    if snap is not None:
        for feature, samples in _by_feature(state, snap).items():
            kept = cache.lookup(feature, samples, snap.system)
            if kept is None:
                bag = _Families()
                if not _render_feature(bag, feature, samples, snap, state.render_errors):
                    failed.add(feature)
                    cache.forget(feature)
                    out.add(bag.collect())
                    continue
                drops = collections.Counter[str]()
                written = [(f.spec, f.labels, textformat.encode_lines(f, drops)) for f in bag.collect()]
                if drops:
                    out.pending.update(drops)
                    cache.forget(feature)
                else:
                    kept = _Kept(samples, snap.system, written)
                    cache.keep(feature, kept)
                for spec, labels, lines in written:
                    out.add_lines(spec, labels, lines)
                continue
            for spec, labels, lines in kept.families:
                out.add_lines(spec, labels, lines)
    _supervisor_gpu_families(out.add, state, snap)
    return failed


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
    ext: Extension, hook: str, call: Callable[[], Iterable[Family]], dropped: collections.Counter[str]
) -> Iterable[Family]:
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


POD_LABELS = ("namespace", "pod", "container")


def _with_pod_labels(fam: Family, ext: Extension) -> Family:
    """Add namespace/pod/container labels to every sample of a per-GPU family (NVGPU_POD_LABELS).

    A GPU held by exactly one container gets its names; an unassigned or shared GPU (time-slicing:
    several pods on one UUID) gets empty values — join ``nvgpu_gpu_pod_info`` for those. A series of
    one MIG device (``mig_uuid``) gets the container holding that MIG device; the parent GPU's own
    series get none (MIG pods hold instances, not the GPU).
    """
    if not fam.rows or "uuid" not in fam.labels or "pod" in fam.labels:
        return fam  # nothing to label, not per GPU, or already per pod (pod info, per-pod/process usage)
    uuid_at = fam.labels.index("uuid")
    mig_at = fam.labels.index("mig_uuid") if "mig_uuid" in fam.labels else -1
    out = Family(fam.spec, (*fam.labels, *POD_LABELS))
    for values, value in fam.rows:
        holder = (values[mig_at] if 0 <= mig_at < len(values) else "") or values[uuid_at]
        out.rows.append(((*values, *ext.gpu_labels(holder)), value))
    return out


def render(state: ServedState, cache: RenderCache | None = None) -> Rendered:
    """Both encodings of the current state; ``cache``: see the module docstring."""
    out = _Exposition(cache.written if cache is not None else None)
    if cache is not None and not any(e.relabels_gpus for e in state.active_extensions()):
        failed = _cached_gpu_families(out, state, cache)
    else:
        gpu, failed = gpu_families(state)
        out.add(gpu)
    out.add(selfmetrics.families(state, failed))
    for ext in state.active_extensions():
        out.add(_guarded(ext, "self_families", ext.self_families, state.render_errors))
    errors = RENDER_ERRORS.family()
    for family, count in sorted(state.render_errors.items()):
        errors.add_labels([family], count)
    out.add([errors])
    state.render_errors.update(out.pending)
    return Rendered(list(out.parts.values()))
