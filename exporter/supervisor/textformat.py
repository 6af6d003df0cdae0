"""The exposition formats, written from our own families: Prometheus text 0.0.4 and OpenMetrics 1.0.0.

Every family is a :class:`~exporter.common.metric.Family` of one :class:`~exporter.common.metric.MetricDef`
(a gauge, or a counter whose name ends in ``_total``), so what the general encoders of
client_python check and escape for every sample is known once per declaration here: the names are
valid (``tests/test_metric_defs.py``), the HELP/TYPE header and the label order (sorted by label
name, as both formats' writers sort) are made once per declaration and label set
(:func:`plan`). Per sample only what can vary is done: a label value is escaped when it holds a
backslash, a double quote or a newline; the value is written by :func:`format_value`.

The two formats differ only in the header (OpenMetrics names a counter without ``_total`` and
escapes ``"`` in HELP) and in the closing ``# EOF``; the sample lines are the same bytes, so one
family's lines (:func:`encode_lines`) serve both. The output is byte for byte what
prometheus_client's ``generate_latest`` (both formats) writes for the same families
(``tests/test_textformat.py``, the goldens, ``promtool check metrics``).

A sample that cannot be encoded (a label value that is not text, or text that is not valid
UTF-8, such as a driver string with a lone surrogate) is left out and counted by family name (as
client_python names it: a counter without ``_total``) in the ``dropped`` counter the caller gives
(``nvgpu_render_errors_total``), and logged once.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass

from exporter.common.logs import log_once
from exporter.common.metric import Family, MetricDef

log = logging.getLogger("exporter.supervisor.exposition")

__all__ = ["EOF", "Plan", "encode", "encode_lines", "family_name", "format_value", "plan"]

EOF = b"# EOF\n"


def format_value(value: float) -> str:
    """A sample value as the Prometheus text formats write it (Go's shortest ``%g`` form).

    ``NaN``, ``+Inf``, ``-Inf``; otherwise Python's shortest round-trip form, except that a positive
    number with more than six digits before the point is written with an exponent of at least two
    digits (``1.048576e+06``), as Go's ``strconv.FormatFloat(v, 'g', -1, 64)`` does there.
    """
    if value != value:
        return "NaN"
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    text = repr(value)
    point = text.find(".")
    if point > 6 and value > 0:
        digits = (text[:point] + text[point + 1 :]).rstrip("0")
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{mantissa}e+{point - 1:02d}"
    return text


def family_name(spec: MetricDef) -> str:
    """The family's name as the OpenMetrics header (and client_python) gives it: a counter without ``_total``."""
    return spec.name[: -len("_total")] if spec.counter else spec.name


def _help(text: str, openmetrics: bool) -> str:
    text = text.replace("\\", r"\\").replace("\n", r"\n")
    return text.replace('"', r"\"") if openmetrics else text


@dataclass(frozen=True)
class Plan:
    """How one family with one set of label names is written.

    Attributes:
        text_header: ``# HELP`` and ``# TYPE`` lines of the text format.
        om_header: the same in OpenMetrics.
        prefix: the sample name.
        order: (position in a row's label values, ``name="``) in the order the labels are written.
    """

    text_header: bytes
    om_header: bytes
    prefix: str
    order: tuple[tuple[int, str], ...]


# id(declaration) -> (the declaration, kept so that its id is not reused; label names -> plan):
# hashing a MetricDef hashes all its fields, once per family per rendering otherwise.
_PLANS: dict[int, tuple[MetricDef, dict[tuple[str, ...], Plan]]] = {}


def plan(spec: MetricDef, labels: tuple[str, ...]) -> Plan:
    """The :class:`Plan` of ``spec`` with label names ``labels`` (made once)."""
    entry = _PLANS.get(id(spec))
    if entry is None or entry[0] is not spec:
        entry = _PLANS[id(spec)] = (spec, {})
    have = entry[1].get(labels)
    if have is None:
        kind = "counter" if spec.counter else "gauge"
        base = family_name(spec)
        text = f"# HELP {spec.name} {_help(spec.help, False)}\n# TYPE {spec.name} {kind}\n"
        om = f"# HELP {base} {_help(spec.help, True)}\n# TYPE {base} {kind}\n"
        order = tuple((i, f'{name}="') for i, name in sorted(enumerate(labels), key=lambda x: x[1]))
        have = entry[1][labels] = Plan(text.encode(), om.encode(), spec.name, order)
    return have


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _line(prefix: str, order: tuple[tuple[int, str], ...], values: tuple[str, ...], value: float) -> str:
    if len(values) < len(order):  # fewer values than names: the first ones only (the supervisor's process_* rows)
        order = tuple((i, n) for i, n in order if i < len(values))
    if not order:
        return f"{prefix} {format_value(value)}\n"
    inner = ",".join([f'{name}{_escape(values[i])}"' for i, name in order])
    return f"{prefix}{{{inner}}} {format_value(value)}\n"


def encode_lines(fam: Family, dropped: collections.Counter[str]) -> bytes:
    """The sample lines of one family (no header), the same in both formats; a sample that cannot
    be encoded is left out and counted in ``dropped`` (see the module docstring)."""
    p = plan(fam.spec, fam.labels)
    prefix, order = p.prefix, p.order
    try:
        return "".join([_line(prefix, order, values, value) for values, value in fam.rows]).encode()
    except (UnicodeEncodeError, TypeError, AttributeError):
        pass
    keep = []
    for values, value in fam.rows:
        try:
            keep.append(_line(prefix, order, values, value).encode())
        except (UnicodeEncodeError, TypeError, AttributeError):
            name = family_name(fam.spec)
            dropped[name] += 1
            log_once(log, logging.ERROR, ("encode", name), "family %s cannot be encoded", name, exc_info=True)
    return b"".join(keep)


def encode(
    families: Iterable[Family], openmetrics: bool = False, dropped: collections.Counter[str] | None = None
) -> bytes:
    """Whole families (header and lines) in one format; OpenMetrics ends with ``# EOF``."""
    counts = dropped if dropped is not None else collections.Counter()
    parts = []
    for fam in families:
        p = plan(fam.spec, fam.labels)
        parts.append(p.om_header if openmetrics else p.text_header)
        parts.append(encode_lines(fam, counts))
    if openmetrics:
        parts.append(EOF)
    return b"".join(parts)
