"""Feature switches and effective feature state (the registry is :mod:`guards.featuretable`).

A *feature* is a named group of NVML queries (docs/design.md, "Features and guards"). Every feature has
a default, an environment switch ``NVGPU_FEATURE_<NAME>=auto|on|off`` and an effective state that
is exported as ``nvgpu_feature_enabled{feature, reason}`` (docs/metrics.md).

Precedence used by `resolve` (first matching row wins; safety first)::

    mode  quarantined  unsupported  known issue | enabled  reason
    off   any          any          any         | no       env          operator said off
    on    yes          any          any         | no       quarantined  crash evidence beats ON
    auto  yes          any          any         | no       quarantined
    on    no           yes          any         | no       unsupported  no GPU can answer it
    auto  no           yes          any         | no       unsupported
    on    no           no           any         | yes      env          documented override of a
                                                                         known-issue rule
    auto  no           no           yes         | no       known_issue
    auto  no           no           no          | default  default

Why this order:

* ``off`` is always honoured: turning a query off can never crash anything.
* Quarantine is evidence that the worker on *this* node died inside this feature. An explicit
  ``on`` does not override it: the operator's ``on`` was written before that evidence existed, and
  re-enabling a feature that kills the worker only brings the crash loop back. Quarantine is lifted
  by the supervisor's own quarantine handling (state file / ``quarantine`` command), not by env.
* Unsupported means no GPU on the node implements the feature; ``on`` cannot change hardware.
* ``on`` beats a known-issue rule: that is the documented override once a driver or binding fix
  lands (e.g. ``NVGPU_FEATURE_NVLINK_THROUGHPUT=on``; known_issues.json cites it per rule).
* ``auto`` means: on unless a known-issue rule applies, then the feature's default.

Sources: docs/design.md ("Features and guards", "Why it exists"), docs/metrics.md (which feature
owns which metric and its NVML source), nvml.h (function names).
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from guards.featuretable import FEATURES

__all__ = [
    "ENV_PREFIX",
    "FeatureState",
    "Mode",
    "Reason",
    "env_var",
    "parse_feature_env",
    "resolve",
]

ENV_PREFIX = "NVGPU_FEATURE_"
"""Prefix of the per-feature environment switches; the suffix is the upper-case feature name."""


class Mode(str, enum.Enum):
    """Operator's setting of ``NVGPU_FEATURE_<NAME>``."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class Reason(str, enum.Enum):
    """Why a feature is in its effective state; the ``reason`` label of nvgpu_feature_enabled."""

    DEFAULT = "default"
    ENV = "env"
    KNOWN_ISSUE = "known_issue"
    QUARANTINED = "quarantined"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class FeatureState:
    """Effective state of one feature.

    Attributes:
        feature: Feature name (a key of `FEATURES`).
        enabled: Whether the worker may run the feature's queries.
        reason: Which precedence row decided (see the module docstring).
        detail: Human explanation for logs, e.g. the known-issue reason and reference.
    """

    feature: str
    enabled: bool
    reason: Reason
    detail: str


_ACCEPTED = ", ".join(mode.value for mode in Mode)
_NO_DETAILS: Mapping[str, str] = MappingProxyType({})


def env_var(feature: str) -> str:
    """Return the environment variable that switches ``feature``.

    Args:
        feature: A feature name, e.g. ``"nvlink_throughput"``.

    Returns:
        ``"NVGPU_FEATURE_NVLINK_THROUGHPUT"``. The name is not checked against `FEATURES`.
    """
    return ENV_PREFIX + feature.upper()


def parse_feature_env(environ: Mapping[str, str]) -> tuple[dict[str, Mode], list[str]]:
    """Read every ``NVGPU_FEATURE_<NAME>`` switch from an environment mapping.

    Values are ``auto``, ``on`` or ``off``, case-insensitive, surrounding whitespace ignored. An
    empty value is an error (not "unset"), like any other value outside those three. Any variable
    whose name starts with ``NVGPU_FEATURE`` but is not one of the valid switches is an error
    naming the closest valid variable (typos such as ``NVGPU_FEATURES_NVLINK`` included).

    Args:
        environ: Environment, e.g. ``os.environ``; other variables are ignored.

    Returns:
        ``(modes, errors)``: ``modes`` maps every name in `FEATURES` (registry order) to its
        `Mode`, ``Mode.AUTO`` when unset or invalid; ``errors`` is one human message per problem,
        sorted by variable name, empty when all is well. Never raises for bad input: the caller
        reports all problems at once (docs/design.md, "Failure model": "bad config / env" exits 2).
    """
    modes: dict[str, Mode] = dict.fromkeys(FEATURES, Mode.AUTO)
    errors: list[str] = []
    valid_vars = {env_var(name): name for name in FEATURES}
    for key in sorted(environ):
        if not key.upper().startswith(ENV_PREFIX.rstrip("_")):
            continue
        name = valid_vars.get(key)
        if name is None:
            errors.append(_unknown_variable_message(key, list(valid_vars)))
            continue
        raw = environ[key]
        try:
            modes[name] = Mode(raw.strip().lower())
        except ValueError:
            errors.append(f"{key}={raw!r}: invalid value; accepted values are {_ACCEPTED}")
    return modes, errors


def _unknown_variable_message(key: str, valid_vars: list[str]) -> str:
    if key.upper() in valid_vars:
        suggestion: str | None = key.upper()
    else:
        close = difflib.get_close_matches(key.upper(), valid_vars, n=1, cutoff=0.6)
        suggestion = close[0] if close else None
    hint = f"; did you mean {suggestion}?" if suggestion else ""
    return f"{key}: unknown feature switch{hint} (valid: {', '.join(valid_vars)}; values {_ACCEPTED})"


def resolve(
    modes: Mapping[str, Mode],
    *,
    known_issues: Mapping[str, str] = _NO_DETAILS,
    quarantined: Mapping[str, str] = _NO_DETAILS,
    unsupported: Mapping[str, str] = _NO_DETAILS,
) -> dict[str, FeatureState]:
    """Decide the effective state of every feature (precedence: see the module docstring).

    Args:
        modes: Feature name -> `Mode`, as returned by `parse_feature_env`; a feature missing
            from it counts as ``Mode.AUTO``.
        known_issues: Feature name -> detail for known-issue rules that match this node
            (`guards.known_issues.match_known_issues`).
        quarantined: Feature name -> detail (crash evidence: signal, function, count, since)
            for features the supervisor quarantined on this node.
        unsupported: Feature name -> detail for features no GPU on this node supports.

    Returns:
        Feature name -> `FeatureState`, one entry per feature in `FEATURES` order.

    Raises:
        ValueError: A key of any argument is not a feature name (a misspelled quarantine entry
            must not silently leave a crashing feature enabled); all unknown names are listed.
    """
    unknown = sorted(
        {
            name
            for mapping in (modes, known_issues, quarantined, unsupported)
            for name in mapping
            if name not in FEATURES
        }
    )
    if unknown:
        raise ValueError(f"unknown feature name(s) {', '.join(unknown)}; valid: {', '.join(FEATURES)}")
    states: dict[str, FeatureState] = {}
    for name, feature in FEATURES.items():
        mode = Mode(modes.get(name, Mode.AUTO))
        var = env_var(name)
        state: FeatureState
        if mode is Mode.OFF:
            state = FeatureState(name, False, Reason.ENV, f"{var}=off")
        elif name in quarantined:
            detail = quarantined[name]
            if mode is Mode.ON:
                detail += f" ({var}=on is ignored while the feature is quarantined)"
            state = FeatureState(name, False, Reason.QUARANTINED, detail)
        elif name in unsupported:
            state = FeatureState(name, False, Reason.UNSUPPORTED, unsupported[name])
        elif mode is Mode.ON:
            detail = f"{var}=on"
            if name in known_issues:
                detail += f" overrides known issue: {known_issues[name]}"
            state = FeatureState(name, True, Reason.ENV, detail)
        elif name in known_issues:
            state = FeatureState(name, False, Reason.KNOWN_ISSUE, known_issues[name])
        elif feature.default:
            state = FeatureState(name, True, Reason.DEFAULT, "on by default")
        else:
            state = FeatureState(name, False, Reason.DEFAULT, f"off by default; enable with {var}=on")
        states[name] = state
    return states
