"""CONTRIBUTING.md stays true: every path and test it names exists, and the checklist steps that
no other test guarded have a guard here (README names every feature, a setting's default is the
Config's, a scenario value kind is validated, interpreted and documented)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pynvml
import pytest

from exporter.common.scenarios import scenario, spec
from exporter.config import Config
from exporter.settings import SETTINGS
from exporter.settingvalues import Setting
from exporter.worker.fakenvml.binding import FakeNvml
from guards.featuretable import FEATURES

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
# `path` or `path::test_name` in backticks; a path has a directory part or is a top-level file
NAMED = sorted(set(re.findall(r"`((?:[\w.-]+/)+[\w.<>-]+\.(?:py|md|json)|[A-Z]\w+\.md)(?:::(\w+))?`", PAGE)))


def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def test_the_page_names_paths_and_tests() -> None:
    assert len(NAMED) > 40 and sum(1 for _, test in NAMED if test) > 30, NAMED


@pytest.mark.parametrize(("path", "test"), NAMED, ids=lambda v: v or "-")
def test_every_path_and_test_the_page_names_exists(path: str, test: str) -> None:
    if "<" in path:  # a pattern such as exporter/common/collectors/<domain>.py: its directory exists
        assert (ROOT / path.split("<", 1)[0]).is_dir(), path
        return
    assert (ROOT / path).is_file(), f"CONTRIBUTING.md names {path}, which is not in the repository"
    if test:
        assert test in _defined(ROOT / path), f"CONTRIBUTING.md names {path}::{test}, which is not defined there"


# -- "new collector", step 7 ------------------------------------------------------------------------


def test_readme_names_every_feature() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Features, guards and quarantine", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in FEATURES if f"`{name}`" not in section]
    assert not missing, f"README's 'Features, guards and quarantine' does not name {missing}"


# -- "new setting", step 1 --------------------------------------------------------------------------


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.default], ids=lambda s: s.env)
def test_every_settings_default_is_the_configs_default(setting: Setting) -> None:
    """The default --help and README show (``Setting.default``) is the one the exporter runs with."""
    assert setting.parse(setting.env, setting.default) == getattr(Config.from_env({}), setting.attr)


# -- "new scenario value kind", step 4 ----------------------------------------------------------------

# One valid example of each kind, under a call it makes sense for.
EXAMPLES: dict[str, tuple[str, Any]] = {
    "cycle": ("nvmlDeviceGetPowerUsage", {"cycle": [100_000, 200_000], "step_s": 1}),
    "ramp": ("nvmlDeviceGetTotalEnergyConsumption", {"ramp": 5, "per_s": 2}),
    "sequence": ("nvmlDeviceGetPowerUsage", {"sequence": [{"until_s": 1, "value": 3}, {"value": 4}]}),
    "error": ("nvmlDeviceGetPowerUsage", {"error": "NOT_SUPPORTED"}),
    "integral": ("nvmlDeviceGetPcieReplayCounter", {"integral": {"cycle": [0, 1], "step_s": 1}, "scale": 1000}),
    "struct": (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        {"struct": "swapped", "records": [{"pid": 5, "usedGpuMemory": 7}]},
    ),
    "churn": (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        {"churn": {"first_pid": 20000, "per_s": 10, "lifetime_s": 1, "used_bytes": 1, "count": 3}},
    ),
    "per_process": ("nvmlDeviceGetProcessUtilization", {"per_process": {"smUtil": 60}}),
}
# The kinds the validator and the fake know: one class each in exporter/common/scenarios/spec.py.
KINDS = sorted(kind.KEY for kind in spec.KINDS)


def test_every_kind_has_an_example_here() -> None:
    assert sorted(EXAMPLES) == KINDS, "give the new kind an example in EXAMPLES (tests/test_contributing.py)"


def spec_of(path: Path, function: str) -> Any:
    return json.loads(path.read_text())["gpus"][0]["values"][function]


@pytest.mark.parametrize("kind", KINDS)
def test_every_scenario_value_kind_is_validated_interpreted_and_documented(kind: str, tmp_path: Path) -> None:
    function, example = EXAMPLES[kind]
    path = tmp_path / "kind.json"
    path.write_text(json.dumps({"gpus": [{"uuid": "GPU-kind", "values": {function: example}}]}))
    scenario.validate(str(path), json.loads(path.read_text()))  # the validator accepts it
    fake = FakeNvml(str(path), epoch=0.0, clock=lambda: 1.5)
    fake.nvmlInit()
    built = spec.parse(spec_of(path, function), "here")
    assert type(built).KEY == kind, f"spec.parse does not build the {kind!r} class from {example}"
    try:
        getattr(fake, function)(fake.nvmlDeviceGetHandleByIndex(0))  # the fake answers through it
    except (pynvml.NVMLError, TypeError):
        pass  # an error kind raises as NVML would; a per-process call wants more arguments
    docs = (ROOT / "docs" / "scenarios.md").read_text(encoding="utf-8")
    assert f'{{"{kind}"' in docs, f"docs/scenarios.md does not show the {kind!r} kind"
