"""Xid catalog: what each NVIDIA Xid code means for operations, kept as data.

`catalog.json` beside this module holds, per Xid code, a class (``application``, ``driver``,
``memory`` ...), a default severity, a short meaning in our own words, an action bucket, NVIDIA's
immediate resolution bucket where the NVIDIA catalog gives one, and the public sources it rests on.
The alert rules in ``deploy/prometheus/rules.yaml`` and the status page are derived from, or checked
against, this one file (``tests/test_alert_rules.py``).

Standard library only: the supervisor and the guards may import this before any third-party
module is known to be healthy.

Sources: NVIDIA's Xid catalog for Ampere and newer
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) and the other pages named in
the ``sources`` table of ``catalog.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import types
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Final, Literal, get_args

__all__ = [
    "ACTIONS",
    "CLASSES",
    "SEVERITIES",
    "UNKNOWN_CLASS",
    "CatalogError",
    "Source",
    "XidInfo",
    "classify",
    "codes_of_class",
    "codes_of_severity",
    "load_catalog",
    "parse_catalog",
    "promql_regex",
]

XidClass = Literal[
    "application",
    "driver",
    "firmware",
    "memory",
    "nvlink",
    "bus",
    "hardware",
    "engine",
    "meta",
    "unknown",
]
Severity = Literal["info", "warning", "critical"]
Action = Literal["none", "restart_job", "investigate", "cordon", "reset_gpu", "reboot_node", "repair"]

CLASSES: Final[tuple[str, ...]] = get_args(XidClass)
"""Every class a catalog entry may have.

application: the program's own fault (the device plugin's ignore list). driver: the NVIDIA kernel
driver or the command stream it builds. firmware: GPU micro-controllers and the GSP. memory: ECC,
row remapping, memory capacity. nvlink: NVLink and its fabric. bus: PCIe and CPU-GPU links.
hardware: board, power and other physical faults. engine: copy, video, JPEG and optical-flow
engine exceptions. meta: messages about other Xids or tests. unknown: a code we cannot place.
"""
SEVERITIES: Final[tuple[str, ...]] = get_args(Severity)
"""Default severities, least to most urgent: info (record), warning (look), critical (isolate)."""
ACTIONS: Final[tuple[str, ...]] = get_args(Action)
"""Action buckets, mildest first; docs/runbook.md says what each one means in practice."""
UNKNOWN_CLASS: Final = "unknown"
_UNKNOWN_SEVERITY: Final = "warning"
_MAX_XID: Final = 999  # NVML reports an undecodable Xid as 999 (nvml-events source).

_ENTRY_FIELDS: Final = {
    "mnemonic": True,
    "class": True,
    "severity": True,
    "action": True,
    "nvidia_action": True,
    "meaning": True,
    "sources": True,
    "note": False,
}
_TOP_FIELDS: Final = {"version", "description", "sources", "codes"}
_CODE_RE: Final = re.compile(r"[1-9][0-9]{0,2}")
_SOURCE_KEY_RE: Final = re.compile(r"[a-z0-9][a-z0-9-]*")


class CatalogError(ValueError):
    """The catalog JSON is malformed; the message names the code and the field."""


@dataclasses.dataclass(frozen=True)
class Source:
    """A public document a catalog entry rests on.

    Attributes:
        key: short name used inside ``catalog.json`` (``nvidia-xid-catalog``).
        title: what the document is.
        url: where it is.
    """

    key: str
    title: str
    url: str


@dataclasses.dataclass(frozen=True)
class XidInfo:
    """What one Xid code means for operations.

    Attributes:
        xid: the Xid number (1..999; 999 is NVML's "unknown Xid").
        mnemonic: NVIDIA's symbolic name of the code, or ``UNKNOWN``.
        xid_class: one of `CLASSES`.
        severity: default severity, one of `SEVERITIES`.
        action: recommended action bucket, one of `ACTIONS`.
        meaning: one sentence in our own words.
        nvidia_action: NVIDIA's immediate resolution bucket (``RESTART_APP``, ``RESET_GPU`` ...)
            when the NVIDIA catalog gives one, else None.
        sources: the documents this entry rests on.
        note: why we deviate from a source or how the code interacts with others, if anything.
        known: False for a code that is not in the catalog (`classify` made it up).
    """

    xid: int
    mnemonic: str
    xid_class: str
    severity: str
    action: str
    meaning: str
    nvidia_action: str | None = None
    sources: tuple[Source, ...] = ()
    note: str | None = None
    known: bool = True


def _fail(where: str, field: str, problem: str) -> CatalogError:
    return CatalogError(f"{where}: field {field!r}: {problem}")


def _text(obj: Mapping[str, object], where: str, field: str, *, optional: bool = False) -> str:
    value = obj.get(field)
    if value is None and optional:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise _fail(where, field, f"expected a non-empty string, got {value!r}")
    if value != value.strip():
        raise _fail(where, field, "leading or trailing whitespace")
    return value


def _choice(obj: Mapping[str, object], where: str, field: str, allowed: tuple[str, ...]) -> str:
    value = obj.get(field)
    if value not in allowed:
        raise _fail(where, field, f"expected one of {', '.join(allowed)}, got {value!r}")
    assert isinstance(value, str)
    return value


def _check_keys(obj: Mapping[str, object], where: str, fields: Mapping[str, bool]) -> None:
    unknown = sorted(set(obj) - set(fields))
    if unknown:
        raise _fail(where, unknown[0], f"unknown field (allowed: {', '.join(fields)})")
    for name, required in fields.items():
        if required and name not in obj:
            raise _fail(where, name, "missing")


def _parse_sources(raw: object) -> dict[str, Source]:
    if not isinstance(raw, dict) or not raw:
        raise _fail("catalog", "sources", "expected a non-empty object of source key -> {title, url}")
    sources: dict[str, Source] = {}
    for key, body in raw.items():
        where = f"source {key!r}"
        if not _SOURCE_KEY_RE.fullmatch(key):
            raise _fail(where, "key", "expected lower-case letters, digits and dashes")
        if not isinstance(body, dict):
            raise _fail(where, "body", f"expected an object, got {type(body).__name__}")
        _check_keys(body, where, {"title": True, "url": True})
        url = _text(body, where, "url")
        if not url.startswith("https://"):
            raise _fail(where, "url", f"expected an https:// URL, got {url!r}")
        sources[key] = Source(key=key, title=_text(body, where, "title"), url=url)
    return sources


def _parse_entry(code: str, raw: object, sources: Mapping[str, Source]) -> XidInfo:
    where = f"xid {code}"
    if not isinstance(raw, dict):
        raise _fail(where, "entry", f"expected an object, got {type(raw).__name__}")
    _check_keys(raw, where, _ENTRY_FIELDS)
    nvidia_action = raw.get("nvidia_action")
    if nvidia_action is not None and (
        not isinstance(nvidia_action, str) or not re.fullmatch(r"[A-Z][A-Z0-9_]*", nvidia_action)
    ):
        raise _fail(where, "nvidia_action", f"expected null or an upper-case name, got {nvidia_action!r}")
    refs = raw.get("sources")
    if not isinstance(refs, list) or not refs:
        raise _fail(where, "sources", f"expected a non-empty list of source keys, got {refs!r}")
    resolved: list[Source] = []
    for ref in refs:
        if not isinstance(ref, str) or ref not in sources:
            raise _fail(where, "sources", f"unknown source key {ref!r} (known: {', '.join(sources)})")
        if any(s.key == ref for s in resolved):
            raise _fail(where, "sources", f"source {ref!r} listed twice")
        resolved.append(sources[ref])
    xid = int(code)
    xid_class = _choice(raw, where, "class", CLASSES)
    if (xid_class == UNKNOWN_CLASS) != (xid == _MAX_XID):
        raise _fail(where, "class", "class 'unknown' is reserved for 999, NVML's unknown Xid")
    meaning = _text(raw, where, "meaning")
    if len(meaning) > 240:
        raise _fail(where, "meaning", f"keep it short: {len(meaning)} characters, at most 240")
    return XidInfo(
        xid=xid,
        mnemonic=_text(raw, where, "mnemonic"),
        xid_class=xid_class,
        severity=_choice(raw, where, "severity", SEVERITIES),
        action=_choice(raw, where, "action", ACTIONS),
        meaning=meaning,
        nvidia_action=nvidia_action,
        sources=tuple(resolved),
        note=_text(raw, where, "note", optional=True) or None,
    )


def parse_catalog(data: object) -> Mapping[int, XidInfo]:
    """Validates decoded catalog JSON strictly and builds the code -> entry mapping.

    Args:
        data: the decoded JSON document (``{"version": 1, "description", "sources", "codes"}``).

    Returns:
        A read-only mapping from Xid number to `XidInfo`, in ascending code order.

    Raises:
        CatalogError: on any unknown or missing field, wrong type, value outside the allowed set,
            undefined source key or code that is not a decimal number in 1..999; the message
            names the code and the field.
    """
    if not isinstance(data, dict):
        raise _fail("catalog", "document", f"expected an object, got {type(data).__name__}")
    unknown = sorted(set(data) - _TOP_FIELDS)
    if unknown:
        raise _fail("catalog", unknown[0], "unknown top-level field")
    if data.get("version") != 1:
        raise _fail("catalog", "version", f"expected 1, got {data.get('version')!r}")
    sources = _parse_sources(data.get("sources"))
    codes = data.get("codes")
    if not isinstance(codes, dict) or not codes:
        raise _fail("catalog", "codes", "expected a non-empty object of code -> entry")
    entries: dict[int, XidInfo] = {}
    for code in codes:
        if not isinstance(code, str) or not _CODE_RE.fullmatch(code):
            raise _fail(f"xid {code!r}", "code", "expected a decimal number 1..999 without leading zeros")
    for code in sorted(codes, key=int):
        entries[int(code)] = _parse_entry(code, codes[code], sources)
    return types.MappingProxyType(entries)


@functools.lru_cache(maxsize=8)
def _load(path: Path | None) -> Mapping[int, XidInfo]:
    if path is None:
        text = resources.files(__name__).joinpath("catalog.json").read_text(encoding="utf-8")
        where = "exporter/supervisor/xid/catalog.json"
    else:
        text = path.read_text(encoding="utf-8")
        where = str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CatalogError(f"{where}: not valid JSON: {exc}") from exc
    return parse_catalog(data)


def load_catalog(path: str | Path | None = None) -> Mapping[int, XidInfo]:
    """Loads and validates the Xid catalog (cached per path).

    Args:
        path: a catalog file to read instead of the packaged ``exporter/supervisor/xid/catalog.json``.

    Returns:
        Read-only mapping from Xid number to `XidInfo`.

    Raises:
        CatalogError: the file is not valid JSON or fails validation (see `parse_catalog`).
        OSError: the file cannot be read.
    """
    return _load(Path(path) if path is not None else None)


def classify(xid: int, catalog: Mapping[int, XidInfo] | None = None) -> XidInfo:
    """Returns what a code means; codes missing from the catalog get class ``unknown``.

    Args:
        xid: the Xid number as NVML or the kernel log reported it.
        catalog: a catalog from `load_catalog`; the packaged one when None.

    Returns:
        The catalog entry, or an entry with class ``unknown``, severity ``warning``, action
        ``investigate`` and ``known=False`` for codes the catalog does not list.
    """
    table = load_catalog() if catalog is None else catalog
    info = table.get(xid)
    if info is not None:
        return info
    return XidInfo(
        xid=xid,
        mnemonic="UNKNOWN",
        xid_class=UNKNOWN_CLASS,
        severity=_UNKNOWN_SEVERITY,
        action="investigate",
        meaning="Not in our catalog: look the code up in NVIDIA's Xid catalog for this driver.",
        known=False,
    )


def codes_of_class(cls: str, catalog: Mapping[int, XidInfo] | None = None) -> tuple[int, ...]:
    """Lists the catalog's codes of one class, ascending.

    Args:
        cls: one of `CLASSES`.
        catalog: a catalog from `load_catalog`; the packaged one when None.

    Returns:
        The codes whose class is ``cls`` (may be empty).

    Raises:
        ValueError: ``cls`` is not a known class.
    """
    if cls not in CLASSES:
        raise ValueError(f"unknown Xid class {cls!r}; known: {', '.join(CLASSES)}")
    table = load_catalog() if catalog is None else catalog
    return tuple(sorted(code for code, info in table.items() if info.xid_class == cls))


def codes_of_severity(severity: str, catalog: Mapping[int, XidInfo] | None = None) -> tuple[int, ...]:
    """Lists the catalog's codes with one default severity, ascending.

    Args:
        severity: one of `SEVERITIES`.
        catalog: a catalog from `load_catalog`; the packaged one when None.

    Returns:
        The codes whose default severity is ``severity``.

    Raises:
        ValueError: ``severity`` is not a known severity.
    """
    if severity not in SEVERITIES:
        raise ValueError(f"unknown severity {severity!r}; known: {', '.join(SEVERITIES)}")
    table = load_catalog() if catalog is None else catalog
    return tuple(sorted(code for code, info in table.items() if info.severity == severity))


def promql_regex(codes: Iterable[int]) -> str:
    """Renders codes as the alternation PromQL label matchers use (``13|31|43``).

    Args:
        codes: Xid numbers; order and duplicates do not matter.

    Returns:
        The sorted codes joined by ``|`` (PromQL anchors regex matchers at both ends).
    """
    return "|".join(str(code) for code in sorted(set(codes)))
