"""Issue 30: the supervisor's work per sample, in process, and prototype (b): incremental rendering.

Not product code. Feeds real worker lines (``bench/capture.py``: the h200x8 fake scenario, 1 s
apart) through the supervisor's own code, as ``exporter/supervisor/workerproc.py`` and
``exporter/supervisor/http/web.py`` do:
``protocol.decode`` (JSON) -> ``snapshotdecode.decode_message`` -> ``Supervisor.handle`` -> one
``exposition.render``, and measures each step in CPU time of this process (``time.process_time``,
best and median of ``--repeat`` passes over the captured snapshots; the machine is shared). The
render is split further: per-GPU families (``exposition.gpu_families``: collectors' ``families()``,
GPU health, Xids, extensions), self-metrics (``selfmetrics.families``, with ``process_*`` read by
psutil for this process and a live stand-in worker), and the text encoding (``prometheus_client``
``generate_latest`` family by family, ``exposition._encode``).

What changes from one sample to the next (``--changes``): per GPU and feature, whether the decoded
reading equals the previous sample's, and in the text exposition, the share of sample lines (and
of bytes) that differ from the previous rendering's.

Prototype (b), two steps, each checked byte for byte against ``exposition.render`` on every
captured snapshot:

1. ``fast``: the same families, encoded by :func:`encode_text` instead of ``generate_latest``. Our
   metric and label names are declared once (``MetricDef``) and valid, so the per-sample label-name
   validation and escaping that ``generate_latest`` repeats for every sample is done once per name;
   label values are escaped only when they hold a backslash, quote or newline; values go through
   ``prometheus_client``'s own ``floatToGoString``. Anything unusual (an invalid name, OpenMetrics
   ``_created``/``_gsum`` samples, a value that does not encode) goes to ``generate_latest`` as today.
2. ``cached``: as ``fast``, and each collector's families are rendered per GPU and kept as bytes,
   keyed by (feature, GPU labels); the bytes are reused while the GPU's reading of that feature is
   equal (``==`` on the frozen dataclass) to the one they were made from and the system versions
   are the same; the families are assembled in the order ``exposition.render`` gives them. Only the
   readings that changed are rendered again; GPU health, Xids, extensions and the self-metrics are
   rendered every time (they are small, or change: ``process_*``).

``python bench/proto_render.py [--lines FILE] [--repeat 5] [--json OUT] [--cprofile N]``
(``--cprofile N``: the top N functions of the whole supervisor path under cProfile, by own time.)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import dataclasses
import functools
import io
import json
import math
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import capture  # noqa: E402
from prometheus_client.core import Metric  # noqa: E402
from prometheus_client.utils import floatToGoString  # noqa: E402
from prometheus_client.validation import _is_valid_legacy_labelname, _is_valid_legacy_metric_name  # noqa: E402

from exporter.app import build_supervisor  # noqa: E402
from exporter.common import collectors, protocol, snapshot, snapshotdecode  # noqa: E402
from exporter.common.metric import GpuKey  # noqa: E402
from exporter.config import Config  # noqa: E402
from exporter.supervisor import exposition, selfmetrics  # noqa: E402

# -- the harness: the supervisor's code on captured lines ------------------------------------------


class Harness:
    """A :class:`Supervisor` (default extensions, no state file) fed captured worker lines."""

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines
        config = Config.from_env({"NVGPU_STATE_FILE": "", "NVGPU_SAMPLE_INTERVAL_SECONDS": "1"})
        self.sup = build_supervisor(config)
        self.state = self.sup.state
        self.state.changed = lambda: None  # type: ignore[method-assign]  # rendering is measured apart
        # a live process in the worker's place, so process_* is read as in the exporter
        self.standin = subprocess.Popen(["sleep", "3600"])
        for ln in lines:
            msg = snapshotdecode.decode_message(protocol.decode(ln))
            if not isinstance(msg, snapshot.Snapshot):
                self.sup.handle(msg)
        self.state.worker.pid = self.standin.pid
        self.snap_lines = capture.snapshots(lines)
        self.dicts = [protocol.decode(ln) for ln in self.snap_lines]
        self.snaps = [snapshotdecode.decode_message(d) for d in self.dicts]

    def close(self) -> None:
        self.standin.kill()
        self.standin.wait()

    def apply(self, snap: snapshot.Snapshot) -> None:
        self.sup.handle(snap)
        self.state.last_mono = time.monotonic()  # as if it had just arrived (fresh)


def cpu_per_item(fn: Callable[[Any], Any], items: list[Any], repeat: int) -> dict[str, float]:
    """CPU ms per item of ``fn`` over ``items`` (best and median of ``repeat`` passes)."""
    rounds = []
    for _ in range(repeat):
        t0 = time.process_time()
        for x in items:
            fn(x)
        rounds.append((time.process_time() - t0) / len(items))
    return {"best_ms": round(1000 * min(rounds), 4), "median_ms": round(1000 * statistics.median(rounds), 4)}


def steps(h: Harness, repeat: int) -> dict[str, Any]:
    """CPU per sample of each step of the supervisor's path (today's code)."""

    def handle_and_time(i: int) -> None:
        h.apply(h.snaps[i])

    idx = list(range(len(h.snaps)))
    out: dict[str, Any] = {}
    out["json (protocol.decode)"] = cpu_per_item(protocol.decode, h.snap_lines, repeat)
    out["typed decode (snapshotdecode.decode_message)"] = cpu_per_item(snapshotdecode.decode_message, h.dicts, repeat)
    out["apply (Supervisor.handle)"] = cpu_per_item(handle_and_time, idx, repeat)

    def gpu_fams(i: int) -> None:
        h.apply(h.snaps[i])
        exposition.gpu_families(h.state)

    def self_fams(i: int) -> None:
        selfmetrics.families(h.state, set())

    metrics_per_snap = []
    for s in h.snaps:
        h.apply(s)
        bag = exposition._Families()
        gpu, failed = exposition.gpu_families(h.state)
        bag.add(gpu)
        bag.add(selfmetrics.families(h.state, failed))
        metrics_per_snap.append(list(bag.collect()))

    def encode(i: int) -> None:
        exposition._encode(metrics_per_snap[i], False, collections.Counter())

    def render(i: int) -> None:
        h.apply(h.snaps[i])
        exposition.render(h.state)

    apply_only = cpu_per_item(handle_and_time, idx, repeat)
    g = cpu_per_item(gpu_fams, idx, repeat)
    out["render: per-GPU families (gpu_families)"] = {k: round(v - apply_only[k], 4) for k, v in g.items()}
    out["render: self-metrics (selfmetrics.families)"] = cpu_per_item(self_fams, idx, repeat)
    out["render: text encoding (generate_latest per family)"] = cpu_per_item(encode, idx, repeat)
    r = cpu_per_item(render, idx, repeat)
    out["render: whole (exposition.render)"] = {k: round(v - apply_only[k], 4) for k, v in r.items()}
    return out


def cprofile_top(h: Harness, top: int) -> list[dict[str, Any]]:
    """cProfile of the whole path (decode, apply, render) over the snapshots, by own time."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3):
        for ln in h.snap_lines:
            msg = snapshotdecode.decode_message(protocol.decode(ln))
            h.apply(msg)  # type: ignore[arg-type]
            exposition.render(h.state)
    prof.disable()
    stream = io.StringIO()
    stats = pstats.Stats(prof, stream=stream)
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    rows = []
    for (path, line, func), (_cc, nc, tt, ct, _callers) in sorted(
        stats.stats.items(),
        key=lambda kv: -kv[1][2],  # type: ignore[attr-defined]
    )[:top]:
        short = path.split("site-packages/")[-1].split(str(capture.ROOT) + "/")[-1]
        rows.append(
            {
                "function": f"{func} ({short}:{line})",
                "calls_per_sample": round(nc / (3 * len(h.snap_lines)), 1),
                "own_percent": round(100 * tt / total, 1),
                "cumulative_percent": round(100 * ct / total, 1),
            }
        )
    return rows


# -- what changes between samples -------------------------------------------------------------------


def changes(h: Harness) -> dict[str, Any]:
    """Share of readings equal to the previous sample's, and of exposition lines that differ."""
    same: collections.Counter[str] = collections.Counter()
    seen: collections.Counter[str] = collections.Counter()
    prev: snapshot.Snapshot | None = None
    for s in h.snaps:
        if prev is not None:
            for g, pg in zip(s.gpus, prev.gpus, strict=True):
                for feature, reading in g.readings.items():
                    seen[feature] += 1
                    same[feature] += reading == pg.readings.get(feature)
        prev = s
    texts = []
    for s in h.snaps:
        h.apply(s)
        texts.append(exposition.render(h.state).text)
    changed_lines = total_lines = changed_bytes = total_bytes = 0
    per_gpu_changed = per_gpu_total = 0
    for a, b in zip(texts, texts[1:], strict=False):
        old = set(a.splitlines())
        for ln in b.splitlines():
            if ln.startswith(b"#"):
                continue
            total_lines += 1
            total_bytes += len(ln) + 1
            gpu_line = b'uuid="' in ln
            per_gpu_total += gpu_line
            if ln not in old:
                changed_lines += 1
                changed_bytes += len(ln) + 1
                per_gpu_changed += gpu_line
    return {
        "readings_equal_to_previous_sample": {
            f: f"{same[f]}/{seen[f]}" for f in sorted(seen, key=lambda f: same[f] / seen[f])
        },
        "readings_equal_share": round(sum(same.values()) / sum(seen.values()), 3),
        "sample_lines_changed_share": round(changed_lines / total_lines, 3),
        "sample_bytes_changed_share": round(changed_bytes / total_bytes, 3),
        "per_gpu_lines_changed_share": round(per_gpu_changed / per_gpu_total, 3),
        "sample_lines_per_exposition": total_lines // max(1, len(texts) - 1),
        "exposition_bytes": len(texts[-1]),
    }


# -- prototype (b) ---------------------------------------------------------------------------------

_HEADERS: dict[tuple[str, str, str], bytes] = {}
_LABELS_OK: dict[tuple[str, ...], bool] = {}
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")


def _header(metric: Metric) -> bytes | None:
    key = (metric.name, metric.type, metric.documentation)
    have = _HEADERS.get(key)
    if have is None:
        mname, mtype = metric.name, metric.type
        if mtype not in ("counter", "gauge") or not _is_valid_legacy_metric_name(mname):
            return None
        if mtype == "counter":
            mname += "_total"
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        have = _HEADERS[key] = f"# HELP {mname} {doc}\n# TYPE {mname} {mtype}\n".encode()
    return have


def _escape(v: str) -> str:
    if "\\" in v or '"' in v or "\n" in v:
        return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return v


def encode_samples(metric: Metric) -> bytes | None:
    """The sample lines of one family as ``generate_latest`` writes them, or None (use it instead)."""
    out = []
    for s in metric.samples:
        if s.timestamp is not None or s.name.endswith(_OM_SUFFIXES) or not _is_valid_legacy_metric_name(s.name):
            return None
        labels = s.labels
        if labels:
            names = tuple(sorted(labels))
            ok = _LABELS_OK.get(names)
            if ok is None:
                ok = _LABELS_OK[names] = all(_is_valid_legacy_labelname(n) for n in names)
            if not ok:
                return None
            inner = ",".join([f'{n}="{_escape(labels[n])}"' for n in names])
            out.append(f"{s.name}{{{inner}}} {floatToGoString(s.value)}\n")
        else:
            out.append(f"{s.name} {floatToGoString(s.value)}\n")
    try:
        return "".join(out).encode("utf-8")
    except UnicodeEncodeError:
        return None


def encode_family(metric: Metric, dropped: collections.Counter[str]) -> bytes:
    """One family; anything the fast path does not handle goes to today's ``_encode``."""
    head = _header(metric)
    body = encode_samples(metric) if head is not None else None
    if head is None or body is None:
        return exposition._encode([metric], False, dropped)
    return head + body


def encode_text(metrics: Iterable[Metric], dropped: collections.Counter[str]) -> bytes:
    return b"".join([encode_family(m, dropped) for m in metrics])


def render_fast(state: Any) -> bytes:
    """``exposition.render(state).text`` with :func:`encode_text` (same families)."""
    bag = exposition._Families()
    gpu, failed = exposition.gpu_families(state)
    bag.add(gpu)
    bag.add(selfmetrics.families(state, failed))
    for ext in state.extensions:
        bag.add(exposition._guarded(ext, "self_families", ext.self_families, state.render_errors))
    errors = exposition.RENDER_ERRORS.family()
    for family, count in sorted(state.render_errors.items()):
        errors.add_labels([family], count)
    bag.add([errors.always()])
    return encode_text(bag.collect(), state.render_errors)


def _head(m: Any) -> bytes | None:
    """The HELP/TYPE lines of a family (a prometheus_client Metric or a DirectFamily)."""
    if isinstance(m, DirectFamily):
        return _plan(m.spec)[0]
    return _header(m)


def _body(m: Any) -> bytes | None:
    """The sample lines of a family, None where the fast path does not apply."""
    if isinstance(m, DirectFamily):
        return encode_direct(m, collections.Counter(), header=False)
    return encode_samples(m)


@dataclasses.dataclass
class _Chunk:
    reading: Any
    system: Any
    families: list[tuple[Metric, bytes]]  # (family without samples needed for the header, sample lines)


class CachedRenderer:
    """Prototype (b) step 2: collectors' families kept as bytes while their readings are unchanged.

    Args:
        granularity: ``"gpu"``: one block per (feature, GPU), rendered again when that GPU's reading
            changed; ``"feature"``: one block per feature (every GPU), rendered again when any GPU's
            reading of it changed.
    """

    def __init__(self, granularity: str = "gpu", direct: bool = False) -> None:
        self.granularity = granularity
        self.direct = direct  # families as DirectFamily (step 3) instead of prometheus_client objects
        self.features: dict[str, _Chunk] = {}
        self.cache: dict[tuple[str, GpuKey], _Chunk] = {}
        self.not_per_gpu: set[str] = set()  # features whose families are not one block per GPU
        self.rendered = self.reused = 0

    def _chunk(self, feature: str, key: GpuKey, reading: Any, system: Any) -> _Chunk | None:
        have = self.cache.get((feature, key))
        if (
            have is not None
            and (have.system is system or have.system == system)
            and (have.reading is reading or have.reading == reading)
        ):
            self.reused += 1
            return have
        collector = collectors.COLLECTORS[feature]
        try:
            metrics = list(collector.families([(key, reading)], system))
        except Exception:  # noqa: BLE001 - today's containment path decides
            return None
        fams = []
        for m in metrics:
            body = _body(m) if _head(m) is not None else None
            if body is None:
                return None
            fams.append((m, body))
        if any("uuid" not in smp.labels for m, _ in fams for smp in m.samples):
            self.not_per_gpu.add(feature)  # a node-level family (e.g. the process API in use): not split
            return None
        chunk = self.cache[(feature, key)] = _Chunk(reading, system, fams)
        self.rendered += 1
        return chunk

    def _feature_chunk(self, feature: str, samples: list[tuple[GpuKey, Any]], system: Any) -> _Chunk | None:
        have = self.features.get(feature)
        if have is not None and (have.system is system or have.system == system) and have.reading == samples:
            self.reused += 1
            return have
        try:
            metrics = list(collectors.COLLECTORS[feature].families(samples, system))
        except Exception:  # noqa: BLE001 - today's containment path decides
            return None
        fams = []
        for m in metrics:
            body = _body(m) if _head(m) is not None else None
            if body is None:
                return None
            fams.append((m, body))
        chunk = self.features[feature] = _Chunk(samples, system, fams)
        self.rendered += 1
        return chunk

    def render(self, state: Any) -> bytes:
        if not self.direct:
            return self._render(state)
        import exporter.common.metric as metric_mod

        saved = metric_mod.Family
        metric_mod.Family = DirectFamily  # type: ignore[misc, assignment]
        try:
            return self._render(state)
        finally:
            metric_mod.Family = saved  # type: ignore[misc]

    def _render(self, state: Any) -> bytes:
        if any(e.relabels_gpus for e in state.extensions):
            return render_fast(state)  # pod labels: not cached in this prototype
        # name -> [header bytes, body parts]; insertion order is the exposition's family order
        out: dict[str, list[Any]] = {}

        def add_metrics(metrics: Iterable[Metric]) -> None:
            for m in metrics:
                part = out.get(m.name)
                if part is None:
                    head = _head(m)
                    body = _body(m) if head is not None else None
                    if head is None or body is None:
                        return_to_today.append(m.name)
                        out[m.name] = [b"", [exposition._encode([m], False, state.render_errors)]]
                    else:
                        out[m.name] = [head, [body]]
                else:
                    body = _body(m)
                    if body is None:
                        raise NotImplementedError("merge of an unusual family")
                    part[1].append(body)

        return_to_today: list[str] = []
        add_metrics(state.health.families(state.fresh_snapshot() is not None))
        snap = state.last
        failed: set[str] = set()
        if snap is not None:
            fresh = {g.index for g in state.fresh_gpus() if g.up}
            by_feature: dict[str, list[tuple[GpuKey, Any]]] = {}
            for g in snap.gpus:
                key = GpuKey(str(g.index), g.uuid)
                for feature, reading in g.readings.items():
                    if g.index in fresh or feature == "identity":
                        by_feature.setdefault(feature, []).append((key, reading))
            for feature, samples in by_feature.items():
                if self.granularity == "feature":
                    chunks = [self._feature_chunk(feature, samples, snap.system)]
                elif feature in self.not_per_gpu:
                    chunks = [None]
                else:
                    chunks = [self._chunk(feature, key, reading, snap.system) for key, reading in samples]
                if any(c is None for c in chunks):  # today's path, with its containment
                    bag = exposition._Families()
                    if not exposition._render_feature(bag, feature, samples, snap, state.render_errors):
                        failed.add(feature)
                    add_metrics(bag.collect())
                    continue
                for c in chunks:
                    for m, body in c.families:  # type: ignore[union-attr]
                        part = out.get(m.name)
                        if part is None:
                            out[m.name] = [_head(m), [body]]
                        else:
                            part[1].append(body)
        live = [g.uuid for g in state.fresh_gpus() if g.up]
        add_metrics(state.xids.families(live, state.gpu_index))
        for ext in state.extensions:
            if snap is not None:
                call = functools.partial(ext.gpu_families, snap)
                add_metrics(exposition._guarded(ext, "gpu_families", call, state.render_errors))
        add_metrics(selfmetrics.families(state, failed))
        for ext in state.extensions:
            add_metrics(exposition._guarded(ext, "self_families", ext.self_families, state.render_errors))
        errors = exposition.RENDER_ERRORS.family()
        for family, count in sorted(state.render_errors.items()):
            errors.add_labels([family], count)
        add_metrics([errors.always()])
        return b"".join([head + b"".join(parts) for head, parts in out.values()])


# -- prototype (b) step 3: families that write their own lines (no prometheus_client objects) -------


class DirectFamily:
    """Stand-in for :class:`exporter.common.metric.Family` that keeps (label values, value) rows and is
    encoded by :func:`encode_direct`; same interface (``add``, ``add_labels``, ``done``, ``always``)
    and, for the bag that merges families of one name, ``name`` and ``samples``."""

    __slots__ = ("spec", "name", "samples")

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.name = spec.name[: -len("_total")] if spec.counter else spec.name  # as CounterMetricFamily
        self.samples: list[tuple[tuple[str, ...], float]] = []

    def add(self, key: GpuKey, value: float | int | bool | None, *extra: str) -> None:
        if value is None:
            return
        self.samples.append(((key.gpu, key.uuid, *extra), float(value)))

    def add_labels(self, labels: Any, value: float | int | bool | None) -> None:
        if value is None or not math.isfinite(float(value)):
            return
        self.samples.append((tuple(labels), float(value)))

    def done(self) -> Iterable[DirectFamily]:
        if self.samples:
            yield self

    def always(self) -> DirectFamily:
        return self


_PLANS: dict[Any, tuple[bytes, str, list[tuple[int, str]]]] = {}


def _plan(spec: Any) -> tuple[bytes, str, list[tuple[int, str]]]:
    """Header, sample name and label order (sorted by name, as generate_latest) of one MetricDef."""
    have = _PLANS.get(spec)
    if have is None:
        kind = "counter" if spec.counter else "gauge"
        doc = spec.help.replace("\\", r"\\").replace("\n", r"\n")
        head = f"# HELP {spec.name} {doc}\n# TYPE {spec.name} {kind}\n".encode()
        order = sorted(enumerate(spec.all_labels), key=lambda x: x[1])
        have = _PLANS[spec] = (head, spec.name, order)
    return have


def encode_direct(fam: DirectFamily, dropped: collections.Counter[str], header: bool = True) -> bytes:
    """One family's text: header and one line per row (label values escaped only when needed)."""
    head, name, order = _plan(fam.spec)
    head = head if header else b""
    n_labels = len(order)
    lines = []
    for labels, value in fam.samples:
        if len(labels) == n_labels:
            inner = ",".join([f'{ln}="{_escape(labels[i])}"' for i, ln in order])
        else:  # fewer values than names: as prometheus_client's zip (the supervisor's process_* rows)
            have = dict(zip(fam.spec.all_labels, labels, strict=False))
            inner = ",".join([f'{ln}="{_escape(have[ln])}"' for _, ln in order if ln in have])
        v = floatToGoString(value)
        lines.append(f"{name}{{{inner}}} {v}\n" if inner else f"{name} {v}\n")
    try:
        return head + "".join(lines).encode("utf-8")
    except UnicodeEncodeError:  # today's containment: keep the lines that encode, count the others
        keep = []
        for ln in lines:
            try:
                keep.append(ln.encode("utf-8"))
            except UnicodeEncodeError:
                dropped[fam.name] += 1
        return head + b"".join(keep)


def render_direct(state: Any) -> bytes:
    """``exposition.render(state).text`` with :class:`DirectFamily` for every ``MetricDef.family()``."""
    import exporter.common.metric as metric_mod

    saved = metric_mod.Family
    metric_mod.Family = DirectFamily  # type: ignore[misc, assignment]
    try:
        if any(e.relabels_gpus for e in state.extensions):
            raise NotImplementedError("pod labels: not in this prototype")
        bag = exposition._Families()
        gpu, failed = exposition.gpu_families(state)
        bag.add(gpu)
        bag.add(selfmetrics.families(state, failed))
        for ext in state.extensions:
            bag.add(exposition._guarded(ext, "self_families", ext.self_families, state.render_errors))
        errors = exposition.RENDER_ERRORS.family()
        for family, count in sorted(state.render_errors.items()):
            errors.add_labels([family], count)
        bag.add([errors.always()])
        return b"".join([encode_direct(m, state.render_errors) for m in bag.collect()])  # type: ignore[arg-type]
    finally:
        metric_mod.Family = saved  # type: ignore[misc]


def _no_ts(text: bytes) -> list[bytes]:
    """Lines of an exposition without the ones that move between two renderings of one state."""
    moving = (b"process_", b"nvgpu_http_")
    return [ln for ln in text.splitlines() if not ln.startswith(moving)]


def prototype(h: Harness, repeat: int) -> dict[str, Any]:
    """Byte-identity on every snapshot, then CPU per sample of today's render, fast and cached."""
    by_gpu, by_feature = CachedRenderer("gpu"), CachedRenderer("feature")
    direct_cached = CachedRenderer("feature", direct=True)
    identical = {"fast": 0, "cached per GPU": 0, "cached per feature": 0, "direct": 0, "direct + cached per feature": 0}
    for s in h.snaps:
        h.apply(s)
        today = exposition.render(h.state).text
        identical["fast"] += _no_ts(render_fast(h.state)) == _no_ts(today)
        identical["cached per GPU"] += _no_ts(by_gpu.render(h.state)) == _no_ts(today)
        identical["cached per feature"] += _no_ts(by_feature.render(h.state)) == _no_ts(today)
        identical["direct"] += _no_ts(render_direct(h.state)) == _no_ts(today)
        identical["direct + cached per feature"] += _no_ts(direct_cached.render(h.state)) == _no_ts(today)
    idx = list(range(len(h.snaps)))

    def today(i: int) -> None:
        h.apply(h.snaps[i])
        exposition.render(h.state)

    def fast(i: int) -> None:
        h.apply(h.snaps[i])
        render_fast(h.state)

    gpu_cache, feature_cache = CachedRenderer("gpu"), CachedRenderer("feature")

    def per_gpu(i: int) -> None:
        h.apply(h.snaps[i])
        gpu_cache.render(h.state)

    both = CachedRenderer("feature", direct=True)

    def direct_and_cache(i: int) -> None:
        h.apply(h.snaps[i])
        both.render(h.state)

    def direct(i: int) -> None:
        h.apply(h.snaps[i])
        render_direct(h.state)

    def per_feature(i: int) -> None:
        h.apply(h.snaps[i])
        feature_cache.render(h.state)

    metrics_per_snap = []
    for s in h.snaps:
        h.apply(s)
        bag = exposition._Families()
        gpu, failed = exposition.gpu_families(h.state)
        bag.add(gpu)
        bag.add(selfmetrics.families(h.state, failed))
        metrics_per_snap.append(list(bag.collect()))

    def apply_only(i: int) -> None:
        h.apply(h.snaps[i])

    base = cpu_per_item(apply_only, idx, repeat)
    res = {}
    for name, fn in (
        ("today (exposition.render)", today),
        ("fast encoder", fast),
        ("fast + cache per GPU", per_gpu),
        ("fast + cache per feature", per_feature),
        ("direct families (no prometheus_client objects)", direct),
        ("direct + cache per feature", direct_and_cache),
    ):
        t = cpu_per_item(fn, idx, repeat)
        res[name] = {k: round(v - base[k], 4) for k, v in t.items()}
    res["encoding alone, today (_encode)"] = cpu_per_item(
        lambda i: exposition._encode(metrics_per_snap[i], False, collections.Counter()), idx, repeat
    )
    res["encoding alone, fast (encode_text)"] = cpu_per_item(
        lambda i: encode_text(metrics_per_snap[i], collections.Counter()), idx, repeat
    )
    return {
        "snapshots": len(h.snaps),
        "byte_identical_to_today": identical,
        "render_cpu_ms_per_sample": res,
        "cache_blocks": {
            "per GPU": {
                "rendered": gpu_cache.rendered,
                "reused": gpu_cache.reused,
                "not split": sorted(gpu_cache.not_per_gpu),
            },
            "per feature": {"rendered": feature_cache.rendered, "reused": feature_cache.reused},
        },
        "note": "identity compared without process_* and nvgpu_http_* lines (they move between two renderings)",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="the supervisor's work per sample, and prototype (b)")
    p.add_argument("--lines", help="worker lines captured by bench/capture.py (default: capture 20 now)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--cprofile", type=int, default=0, metavar="N")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)
    lines = capture.load_or_capture(args.lines, 20)

    async def run() -> dict[str, Any]:  # the supervisor schedules timers on a running loop
        h = Harness(lines)
        try:
            res: dict[str, Any] = {"steps_cpu_ms_per_sample": steps(h, args.repeat)}
            res["changes"] = changes(h)
            res["prototype_b"] = prototype(h, args.repeat)
            if args.cprofile:
                res["cprofile_top"] = cprofile_top(h, args.cprofile)
            return res
        finally:
            h.close()

    res = asyncio.run(run())
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
