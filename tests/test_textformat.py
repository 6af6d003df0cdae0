"""exporter.supervisor.textformat: our encoder writes what prometheus_client's writes, byte for byte.

The reference is prometheus_client itself (a test dependency here): ``generate_latest`` of the text
format and of OpenMetrics on the same families, with the old containment (a family that cannot be
encoded is encoded sample by sample and the samples that fail are dropped and counted). Generated
families use every real declaration (``MetricDef``) with label values that need escaping or cannot
be encoded, and values at the edges of the float format (the goldens' OpenMetrics bodies are
checked in tests/test_golden.py).
"""

from __future__ import annotations

import collections
import copy
import importlib
import pkgutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import exposition as client_text
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as client_om
from prometheus_client.utils import floatToGoString

import exporter
from exporter.common.metric import Family, MetricDef
from exporter.supervisor import textformat

GOLDEN = Path(__file__).resolve().parent / "golden"


def declarations() -> list[MetricDef]:
    found: dict[str, MetricDef] = {}
    for info in pkgutil.walk_packages(exporter.__path__, "exporter."):
        if ".worker" in info.name or info.name.endswith(("__main__", ".cli")) or "podresources.v1" in info.name:
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, MetricDef):
                found[value.name] = value
    return sorted(found.values(), key=lambda d: d.name)


DECLARATIONS = declarations()

VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**20), 10**20).map(float),
    st.sampled_from([0.0, -0.0, 1e6, 999999.0, 1234567.0, 1.048576e6, 1e21, 1e22, 123456789012345.0, 5e-324, 1e-7]),
)
LABEL_VALUES = st.one_of(
    st.text(max_size=12),
    st.sampled_from(['a"b', "a\\b", "a\nb", '\\"\n', "", "\udc80", "ünïcode", "GPU-0000"]),
)


def reference(metrics: list[Metric], openmetrics: bool) -> tuple[bytes, collections.Counter[str]]:
    """prometheus_client's writers, a family that fails retried sample by sample (the old containment)."""
    dropped: collections.Counter[str] = collections.Counter()

    class One:
        def __init__(self, m: Metric) -> None:
            self.m = m

        def collect(self) -> Any:
            yield self.m

    def generate(m: Metric) -> bytes:
        if openmetrics:
            out: bytes = client_om.generate_latest(One(m))  # type: ignore[no-untyped-call]
            return out[: -len(textformat.EOF)]
        return client_text.generate_latest(One(m))  # type: ignore[arg-type]

    parts = []
    for m in metrics:
        try:
            parts.append(generate(m))
            continue
        except Exception:  # noqa: BLE001
            pass
        keep = []
        for sample in m.samples:
            probe = copy.copy(m)
            probe.samples = [sample]
            try:
                generate(probe)
                keep.append(sample)
            except Exception:  # noqa: BLE001
                dropped[m.name] += 1
        probe = copy.copy(m)
        probe.samples = keep
        parts.append(generate(probe))
    if openmetrics:
        parts.append(textformat.EOF)
    return b"".join(parts), dropped


def to_client(fam: Family) -> Metric:
    cls = CounterMetricFamily if fam.spec.counter else GaugeMetricFamily
    m = cls(fam.spec.name, fam.spec.help, labels=list(fam.labels))
    for values, value in fam.rows:
        m.add_metric(list(values), value)
    return m


@st.composite
def families(draw: st.DrawFn) -> list[Family]:
    out = []
    for spec in draw(st.lists(st.sampled_from(DECLARATIONS), min_size=1, max_size=4, unique_by=lambda d: d.name)):
        fam = spec.family()
        for _ in range(draw(st.integers(0, 4))):
            n = len(fam.labels) if draw(st.integers(0, 9)) else draw(st.integers(0, len(fam.labels)))
            fam.rows.append((tuple(draw(st.lists(LABEL_VALUES, min_size=n, max_size=n))), draw(VALUES)))
        out.append(fam)
    return out


@given(st.one_of(VALUES, st.floats(), st.floats(min_value=1e5, max_value=1e17)))
def test_values_are_written_as_prometheus_client_writes_them(value: float) -> None:
    assert textformat.format_value(value) == floatToGoString(value)


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
@given(fams=families())
def test_families_are_written_as_prometheus_client_writes_them(openmetrics: bool, fams: list[Family]) -> None:
    want, want_dropped = reference([to_client(f) for f in fams], openmetrics)
    dropped: collections.Counter[str] = collections.Counter()
    assert textformat.encode(fams, openmetrics, dropped) == want
    assert dropped == want_dropped


def test_a_value_that_is_not_text_drops_only_its_series() -> None:
    fam = MetricDef("nvgpu_test_things", "Things", ("thing",)).family()
    fam.rows += [(("GPU-0", "0", "a"), 1.0), (("GPU-0", "0", 7), 2.0), (("GPU-0", "0", "\udc80"), 3.0)]  # type: ignore[list-item]
    dropped: collections.Counter[str] = collections.Counter()
    text = textformat.encode([fam], dropped=dropped)
    assert text.endswith(b'nvgpu_test_things{gpu="GPU-0",thing="a",uuid="0"} 1.0\n')
    assert dropped == {"nvgpu_test_things": 2}
    counter = MetricDef("nvgpu_test_things_total", "Things", ("thing",)).family()
    counter.rows.append((("GPU-0", "0", "\udc80"), 1.0))
    textformat.encode([counter], dropped=dropped)
    assert dropped["nvgpu_test_things"] == 3  # a counter's family is named without _total, as client_python names it
