"""Known-issue rules: turn a feature off on GPU models and driver/binding ranges known to break.

The rules are data (``known_issues.json`` beside this module, shipped as package data); adding a
row needs no code change. Each row::

    {
      "id": "h20-580-nvlink-throughput-heap-corruption",    unique, used in logs
      "feature": "nvlink_throughput",                       a key of guards.featuretable.FEATURES
      "gpu_models": ["NVIDIA H20", "NVIDIA H20-*"],         exact nvmlDeviceGetName values or
                                                            fnmatch globs, case-insensitive
      "driver": {"min": "580", "max_exclusive": "581"},     required object; either bound optional
      "nvidia_ml_py": {"min": "12.575"},                    optional; absent = any binding
      "reason": "...",                                      what breaks, with evidence
      "reference": "..."                                    where it is documented, how to override
    }

Version bounds use prefix semantics on numeric tuples: a bound names a whole branch or release
prefix, so ``"580" <= "580.126.20" < "581"`` and ``max_exclusive: "580.126"`` excludes every
580.126.x. A rule matches when ANY GPU on the node matches one of its models and the versions are
in range; the feature is then disabled for the whole node (features are node-wide switches), unless
the operator sets ``NVGPU_FEATURE_<NAME>=on`` (see guards.features).

Sources: docs/design.md ("Why it exists": the H20 / 580 crash); nvidia-ml-py's version scheme
``<CUDA major>.<driver branch>.<driver minor>`` (PyPI nvidia-ml-py), driver versions
``<branch>.<minor>.<patch>`` (``nvmlSystemGetDriverVersion``).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from guards.featuretable import FEATURES

__all__ = [
    "DEFAULT_PATH",
    "KnownIssue",
    "VersionRange",
    "load_known_issues",
    "match_known_issues",
    "parse_release",
    "parse_version",
]

DEFAULT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "known_issues.json")
"""The rule table shipped with the package."""

_NUMERIC_VERSION = re.compile(r"\d+(?:\.\d+)*")
# PEP 440 release segment followed by optional pre/post/dev/local parts, as in distribution
# versions ("12.535.161", "13.580.82.post1", "0.1.0.dev3+g1234").
_RELEASE_VERSION = re.compile(
    r"v?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview|post|rev|r|dev)[-_.]?\d*)*"
    r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?",
    re.IGNORECASE,
)
_ROW_KEYS = frozenset({"id", "feature", "gpu_models", "driver", "nvidia_ml_py", "reason", "reference"})
_REQUIRED_ROW_KEYS = ("id", "feature", "gpu_models", "driver", "reason", "reference")
_RANGE_KEYS = frozenset({"min", "max_exclusive"})
_RANGE_SHAPE = 'an object {"min": "<version>", "max_exclusive": "<version>"}, either key optional'


def parse_version(version: str) -> tuple[int, ...]:
    """Parse a dotted numeric version such as an NVIDIA driver version.

    Args:
        version: ``"580.126.20"``, ``"580.159.04"``, ``"580"``; surrounding whitespace ignored.

    Returns:
        The numeric components: ``(580, 126, 20)``, ``(580, 159, 4)``, ``(580,)``.

    Raises:
        ValueError: ``version`` is not a string of dot-separated decimal numbers (odd strings
            from a driver, ``"580.126.20-custom"``, ``""``); the message names the input.
    """
    if not isinstance(version, str) or not _NUMERIC_VERSION.fullmatch(version.strip()):
        raise ValueError(f"version {version!r} is not dot-separated decimal numbers (expected e.g. '580.126.20')")
    return tuple(int(part) for part in version.strip().split("."))


def parse_release(version: str) -> tuple[int, ...]:
    """Parse the numeric release of a Python distribution version (PEP 440 subset).

    Args:
        version: ``"13.580.82"``, ``"12.535.161.post1"``, ``"0.1.0.dev3+g1234"``.

    Returns:
        The release components: ``(13, 580, 82)``, ``(12, 535, 161)``, ``(0, 1, 0)``.

    Raises:
        ValueError: No numeric release segment in the expected place; the message names the
            input.
    """
    match = _RELEASE_VERSION.fullmatch(version.strip()) if isinstance(version, str) else None
    if match is None:
        raise ValueError(f"version {version!r} is not a release version (expected e.g. '12.575.51')")
    return parse_version(match.group("release"))


def _at_least(version: tuple[int, ...], bound: tuple[int, ...]) -> bool:
    return version[: len(bound)] >= bound


def _below(version: tuple[int, ...], bound: tuple[int, ...]) -> bool:
    return version[: len(bound)] < bound


@dataclass(frozen=True)
class VersionRange:
    """A half-open version range with prefix semantics; ``None`` bounds are open.

    Attributes:
        min: Inclusive lower bound (``"580"`` includes every 580.x), or ``None``.
        max_exclusive: Exclusive upper bound (``"581"`` excludes every 581.x), or ``None``.
    """

    min: str | None = None
    max_exclusive: str | None = None

    def contains(self, version: tuple[int, ...]) -> bool:
        """Tell whether a parsed version lies in the range.

        Args:
            version: Numeric components, from `parse_version` or `parse_release`.

        Returns:
            True when ``min <= version < max_exclusive`` comparing only as many leading
            components as the bound has.

        Raises:
            ValueError: A bound is not numeric (only for ranges built by hand; loaded rules are
                validated).
        """
        if self.min is not None and not _at_least(version, parse_version(self.min)):
            return False
        return self.max_exclusive is None or _below(version, parse_version(self.max_exclusive))

    def __str__(self) -> str:
        low = f">={self.min}" if self.min is not None else ""
        high = f"<{self.max_exclusive}" if self.max_exclusive is not None else ""
        return ",".join(part for part in (low, high) if part) or "any"


@dataclass(frozen=True)
class KnownIssue:
    """One row of the known-issue table (see the module docstring for the JSON shape).

    Attributes:
        id: Unique rule id, quoted in details and logs.
        feature: The feature the rule disables (a key of `guards.featuretable.FEATURES`).
        gpu_models: Exact NVML device names or fnmatch globs, compared case-insensitively.
        driver: Driver version range (``nvmlSystemGetDriverVersion``).
        nvidia_ml_py: nvidia-ml-py distribution version range, or ``None`` for any binding.
        reason: What breaks and the evidence.
        reference: Where it is documented and how to override.
    """

    id: str
    feature: str
    gpu_models: tuple[str, ...]
    driver: VersionRange
    nvidia_ml_py: VersionRange | None
    reason: str
    reference: str

    def matches_model(self, model: str) -> bool:
        """Tell whether an NVML device name matches one of the rule's models or globs.

        Args:
            model: ``nvmlDeviceGetName`` value, e.g. ``"NVIDIA H20-3e"``.

        Returns:
            True when any entry of `gpu_models` matches, case-insensitively.
        """
        name = model.strip().casefold()
        return any(fnmatch.fnmatchcase(name, pattern.casefold()) for pattern in self.gpu_models)


def _is_text(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _check_range(value: object, field: str, errors: list[str]) -> VersionRange:
    if not isinstance(value, dict):
        errors.append(f"field {field!r}: expected {_RANGE_SHAPE}, got {value!r}")
        return VersionRange()
    bad_keys = sorted(set(value) - _RANGE_KEYS)
    if bad_keys:
        errors.append(f"field {field!r}: unknown key(s) {bad_keys}; expected {_RANGE_SHAPE}")
    bounds: dict[str, str | None] = {"min": None, "max_exclusive": None}
    parsed: dict[str, tuple[int, ...]] = {}
    for key in ("min", "max_exclusive"):
        if key not in value:
            continue
        bound = value[key]
        try:
            parsed[key] = parse_version(bound)
        except ValueError:
            errors.append(
                f"field '{field}.{key}': expected a version string of dot-separated numbers "
                f'such as "580" or "580.126.20", got {bound!r}'
            )
            continue
        bounds[key] = bound.strip()
    if "min" in parsed and "max_exclusive" in parsed and parsed["min"] >= parsed["max_exclusive"]:
        errors.append(
            f"field {field!r}: empty range, min {bounds['min']!r} is not below "
            f"max_exclusive {bounds['max_exclusive']!r}"
        )
    return VersionRange(bounds["min"], bounds["max_exclusive"])


def _check_row(row: object, errors: list[str]) -> KnownIssue | None:
    if not isinstance(row, dict):
        errors.append(f"expected an object with keys {sorted(_ROW_KEYS)}, got {row!r}")
        return None
    unknown = sorted(set(row) - _ROW_KEYS)
    if unknown:
        errors.append(f"unknown field(s) {unknown}; allowed: {sorted(_ROW_KEYS)}")
    missing = [key for key in _REQUIRED_ROW_KEYS if key not in row]
    for key in missing:
        errors.append(f"field {key!r}: missing")
    for key in ("id", "reason", "reference"):
        if key in row and not _is_text(row[key]):
            errors.append(f"field {key!r}: expected a non-empty string, got {row[key]!r}")
    feature = row.get("feature")
    if "feature" in row and (not isinstance(feature, str) or feature not in FEATURES):
        errors.append(f"field 'feature': expected one of {', '.join(FEATURES)}, got {feature!r}")
    models = row.get("gpu_models")
    if "gpu_models" in row and (not isinstance(models, list) or not models or not all(_is_text(m) for m in models)):
        errors.append(
            "field 'gpu_models': expected a non-empty list of NVML device names or fnmatch "
            f'globs (e.g. ["NVIDIA H20", "NVIDIA H20-*"]), got {models!r}'
        )
    driver = _check_range(row.get("driver"), "driver", errors) if "driver" in row else None
    binding = _check_range(row["nvidia_ml_py"], "nvidia_ml_py", errors) if "nvidia_ml_py" in row else None
    if errors or driver is None or not isinstance(models, list):
        return None
    return KnownIssue(
        id=row["id"].strip(),
        feature=row["feature"],
        gpu_models=tuple(m.strip() for m in models),
        driver=driver,
        nvidia_ml_py=binding,
        reason=row["reason"].strip(),
        reference=row["reference"].strip(),
    )


def load_known_issues(path: str | None = None) -> tuple[KnownIssue, ...]:
    """Load and strictly validate a known-issue table.

    Args:
        path: JSON file holding a list of rows (module docstring); ``None`` loads `DEFAULT_PATH`.

    Returns:
        The rules in file order.

    Raises:
        OSError: The file cannot be read.
        ValueError: The file is not valid JSON, is not a list, or has bad rows. The message
            names the file and, per problem, the row index (0-based), the rule id when known,
            the field and the expected shape; every problem of the file is listed at once.
            Duplicate ids and feature names not in `guards.featuretable.FEATURES` are errors.
    """
    source = DEFAULT_PATH if path is None else path
    with open(source, encoding="utf-8") as handle:
        text = handle.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    if not isinstance(data, list):
        raise ValueError(f"{source}: expected a JSON list of rule objects, got {type(data).__name__}")
    problems: list[str] = []
    rules: list[KnownIssue] = []
    seen: dict[str, int] = {}
    for index, row in enumerate(data):
        row_errors: list[str] = []
        rule = _check_row(row, row_errors)
        label = f"row {index}"
        if isinstance(row, dict) and _is_text(row.get("id")):
            label += f" (id {row['id'].strip()!r})"
        if rule is not None and rule.id in seen:
            row_errors.append(f"field 'id': duplicate of row {seen[rule.id]}")
        problems.extend(f"{source}: {label}: {error}" for error in row_errors)
        if rule is not None and not row_errors:
            seen[rule.id] = index
            rules.append(rule)
    if problems:
        raise ValueError("invalid known-issue table:\n  " + "\n  ".join(problems))
    return tuple(rules)


def match_known_issues(
    rows: Iterable[KnownIssue],
    *,
    gpu_models: Iterable[str],
    driver_version: str,
    binding_version: str | None,
    on_unparsable: Callable[[str], None] | None = None,
) -> dict[str, str]:
    """Find the rules that apply to this node.

    Fails safe: a driver or binding version that cannot be parsed (an odd vendor suffix, a
    string the driver garbled) counts as inside every range, so a rule still applies when the GPU
    model matches; its detail says so. Dropping the H20/580 guard because a version string looked
    odd would walk back into the incident.

    Args:
        rows: Rules, e.g. from `load_known_issues`.
        gpu_models: ``nvmlDeviceGetName`` of every GPU on the node.
        driver_version: ``nvmlSystemGetDriverVersion``, e.g. ``"580.126.20"``.
        binding_version: Installed nvidia-ml-py version (``importlib.metadata``), e.g.
            ``"12.575.51"``; ``None`` when unknown (rules restricted to a binding range match).
        on_unparsable: called once with a message naming each version that cannot be parsed.

    Returns:
        Feature name -> detail ``"<reason> (<reference>; rule <id>)"`` for every rule where any
        GPU model matches and both versions are in range (or unknown); several rules for one
        feature are joined with ``"; "``. Empty when nothing applies.
    """
    models = tuple(gpu_models)
    notes: list[str] = []
    driver: tuple[int, ...] | None = None
    binding: tuple[int, ...] | None = None
    try:
        driver = parse_version(driver_version)
    except ValueError as exc:
        notes.append(f"driver {exc}; rules are applied as if the driver were in their range")
    if binding_version is not None:
        try:
            binding = parse_release(binding_version)
        except ValueError as exc:
            notes.append(f"nvidia-ml-py {exc}; rules are applied as if the binding were in their range")
    for note in notes:
        if on_unparsable is not None:
            on_unparsable(note)
    details: dict[str, list[str]] = {}
    for rule in rows:
        if not any(rule.matches_model(model) for model in models):
            continue
        if driver is not None and not rule.driver.contains(driver):
            continue
        if rule.nvidia_ml_py is not None and binding is not None:
            if not rule.nvidia_ml_py.contains(binding):
                continue
        unsure = " (version unreadable: applied to be safe)" if notes else ""
        details.setdefault(rule.feature, []).append(f"{rule.reason} ({rule.reference}; rule {rule.id}){unsure}")
    return {feature: "; ".join(parts) for feature, parts in details.items()}
