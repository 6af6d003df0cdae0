"""The collector registry and the feature registry name the same features, and every collector
has the shape base.Collector describes (mypy --strict checks the types in test_lint.py)."""

from __future__ import annotations

import dataclasses

import pytest

from exporter import collectors
from guards.features import FEATURES


def test_collectors_and_non_collectors_are_exactly_the_features() -> None:
    assert set(collectors.COLLECTORS).isdisjoint(collectors.NOT_COLLECTORS)
    assert set(collectors.COLLECTORS) | set(collectors.NOT_COLLECTORS) == set(FEATURES)


def test_sampling_order_follows_the_feature_registry() -> None:
    """Identity first (labels before anything else), then the registry's order."""
    order = [f for f in FEATURES if f in collectors.COLLECTORS]
    assert list(collectors.COLLECTORS) == order and order[0] == "identity"


@pytest.mark.parametrize("feature", sorted(collectors.COLLECTORS))
def test_collector_shape(feature: str) -> None:
    c = collectors.COLLECTORS[feature]
    assert c.FEATURE == feature
    assert dataclasses.is_dataclass(c.Reading) and c.Reading.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert collectors.feature_of(c.Reading) == feature
    assert c.METRICS, f"{feature} declares no metric family"
    assert FEATURES[feature].nvml_functions, f"{feature}: the feature registry names no NVML function"
