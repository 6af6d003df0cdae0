"""Metric declarations: every family the exporter can emit is a :class:`MetricDef` constant.

A family is declared once, at module level, in the module that owns it, under its exact exported
name (counters with their ``_total``), so ``grep nvgpu_xid_errors_total exporter/`` lands on the
definition. ``docs/metrics.md`` names the module of each family; ``tests/test_metric_defs.py``
checks that the two agree. Rendering builds a fresh family per scrape state from the declaration
(client_python's custom-collector pattern): nothing is registered anywhere, nothing is global.

Counter names end in ``_total`` here and in the exposition; ``CounterMetricFamily`` takes the name
with or without the suffix and writes it once.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

GPU_LABELS = ("gpu", "uuid")


class GpuKey(NamedTuple):
    """Labels every per-GPU series carries: NVML index (as text) and UUID."""

    gpu: str
    uuid: str


@dataclass(frozen=True)
class MetricDef:
    """One metric family.

    Attributes:
        name: the exported name; a counter's name ends in ``_total`` (and only a counter's).
        help: HELP text; names the NVML source (function or field) where there is one.
        labels: labels beyond ``gpu``/``uuid`` (per-GPU families) or all labels (exporter families).
        per_gpu: the family's series carry ``gpu`` and ``uuid`` first.
    """

    name: str
    help: str
    labels: tuple[str, ...] = ()
    per_gpu: bool = True

    @property
    def counter(self) -> bool:
        """True for counters (the name ends in ``_total``)."""
        return self.name.endswith("_total")

    @functools.cached_property
    def all_labels(self) -> tuple[str, ...]:
        """Label names in exposition order."""
        return (*GPU_LABELS, *self.labels) if self.per_gpu else self.labels

    def family(self) -> Family:
        """A fresh, empty family to add samples to."""
        return Family(self)


class Sample(NamedTuple):
    """One series of a family, as a reader sees it (tests, the status page): name, labels, value."""

    name: str
    labels: dict[str, str]
    value: float


Row = tuple[tuple[str, ...], float]
"""Label values (in the order of :attr:`Family.labels`) and the value."""


class Family:
    """Samples of one :class:`MetricDef` for one rendering; adds nothing for a None value.

    Attributes:
        spec: the declaration.
        labels: the label names of :attr:`rows` (the declaration's; the pod labels add three).
        rows: (label values, value), in the order added.
    """

    __slots__ = ("spec", "labels", "rows")

    def __init__(self, spec: MetricDef, labels: tuple[str, ...] | None = None) -> None:
        self.spec = spec
        self.labels = spec.all_labels if labels is None else labels
        self.rows: list[Row] = []

    @property
    def name(self) -> str:
        """The exported name (a counter's with ``_total``)."""
        return self.spec.name

    def add(self, key: GpuKey, value: float | int | bool | None, *extra: str) -> None:
        """Add one per-GPU sample unless ``value`` is None."""
        if value is None:
            return
        self.rows.append(((key.gpu, key.uuid, *extra), float(value)))

    def add_labels(self, labels: Sequence[str], value: float | int | bool | None) -> None:
        """Add one sample with all label values given (exporter families); skips None and NaN."""
        if value is None or not math.isfinite(float(value)):
            return
        self.rows.append((tuple(labels), float(value)))

    def done(self) -> Iterable[Family]:
        """Yield the family if it holds any sample."""
        if self.rows:
            yield self

    def always(self) -> Family:
        """The family, even without samples (exporter families whose HELP/TYPE always show)."""
        return self

    @property
    def samples(self) -> list[Sample]:
        """The rows with their label names (a row with fewer values than names has only the first ones)."""
        return [
            Sample(self.spec.name, dict(zip(self.labels, values, strict=False)), value) for values, value in self.rows
        ]


def single(spec: MetricDef, value: float | int | bool | None, labels: Sequence[str] = ()) -> Family:
    """An exporter family with at most one sample (none when ``value`` is None or not finite)."""
    fam = spec.family()
    fam.add_labels(labels, value)
    return fam.always()
