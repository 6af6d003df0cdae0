"""The collector registry and the feature registry name the same features, and every collector
has the shape base.Collector describes (mypy --strict checks the types in test_lint.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from fake_device import Clock, devices

from exporter.common import collectors, scenarios
from exporter.common.collectors import gpm, process_reads
from exporter.common.gpustate import GpuState, Lifetime
from exporter.worker import process_attribution as attribution
from exporter.worker.nvml.client import DeviceClient
from guards.featuretable import FEATURES


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


def test_the_sampling_order_runs_each_collector_after_what_it_needs() -> None:
    assert collectors.order_problems(collectors.COLLECTORS.values()) == []
    assert {f for f, c in collectors.COLLECTORS.items() if c.NEEDS} == {"utilization", "gpm", "gpm_pipes"}


def test_an_order_that_breaks_a_need_is_named() -> None:
    order = list(collectors.COLLECTORS.values())
    mig, utilization = collectors.COLLECTORS["mig"], collectors.COLLECTORS["utilization"]
    order.remove(mig)
    order.append(mig)
    problems = collectors.order_problems(order)
    assert "utilization needs mig sampled before it, but mig comes later" in problems and len(problems) == 3
    assert collectors.order_problems([utilization]) == ["utilization needs mig, which is not a collector here"]


# gpm.take keeps every GPM window in gpm's state classes, each feature's under its own key: gpm_pipes
# uses the machinery, not gpm's data, so the two have no order between them.
SHARED_MACHINERY = {gpm.Windows, gpm.Unavailable}


def _sample_everything(tmp_path: Path, reading: list[str]) -> None:
    """Every collector, every feature on, three passes over h200x2-mig (GPU 0 in MIG mode, GPU 1
    not), in the registry's order; ``reading[0]`` names the collector being read."""
    scenario = json.loads(scenarios.path("h200x2-mig").read_text())
    clock = Clock()
    devs = devices(tmp_path, scenario, clock, switches=set(FEATURES))
    for t in range(3):
        clock.t = float(t)
        for dev in devs:
            for feature, c in collectors.COLLECTORS.items():
                reading[0] = feature
                c.read(dev)


def test_a_collector_that_reads_another_collectors_state_needs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state class another collector's module declares is that collector's data: the reader names
    it in NEEDS; and every NEEDS is used."""
    owner = {c.__name__: f for f, c in collectors.COLLECTORS.items()}  # type: ignore[attr-defined]
    owner[process_reads.__name__] = process_reads.FEATURE  # the processes collector's worker side
    reached: dict[str, set[str]] = {f: set() for f in collectors.COLLECTORS}
    reading = [""]
    real = DeviceClient.state_of

    def spy(dev: DeviceClient, kind: type[GpuState]) -> GpuState:
        if kind not in SHARED_MACHINERY and owner.get(kind.__module__, reading[0]) != reading[0]:
            reached[reading[0]].add(owner[kind.__module__])
        return real(dev, kind)

    monkeypatch.setattr(DeviceClient, "state_of", spy)
    _sample_everything(tmp_path, reading)
    assert reached == {f: set(c.NEEDS) for f, c in collectors.COLLECTORS.items()}


def test_sampling_leaves_every_collector_modules_globals_as_they_were(tmp_path: Path) -> None:
    """Per-GPU state lives in the device client's states: a module-level dict, list or set that a
    read fills would be a second home (shared by every GPU, outliving the test that filled it)."""
    modules = [*collectors.COLLECTORS.values(), attribution, process_reads]

    def containers() -> dict[str, str]:
        return {
            f"{m.__name__}.{name}": repr(value)  # type: ignore[attr-defined]
            for m in modules
            for name, value in vars(m).items()
            if isinstance(value, (dict, list, set))
        }

    before = containers()
    _sample_everything(tmp_path, [""])
    assert containers() == before and any(name.endswith(".VARIANTS") for name in before)


def _state_classes() -> list[type[GpuState]]:
    return [kind for kind in GpuState.__subclasses__() if kind.__module__.startswith("exporter.common.collectors.")]


@pytest.mark.parametrize("kind", _state_classes(), ids=lambda k: f"{k.__module__.rsplit('.', 1)[-1]}.{k.__name__}")
def test_every_state_class_is_a_mutable_dataclass_that_builds_empty(kind: type[GpuState]) -> None:
    assert dataclasses.is_dataclass(kind) and not kind.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert isinstance(kind.LIFETIME, Lifetime)
    assert isinstance(kind(), kind)
