"""Property tests (Hypothesis) of scenario files: ``load_scenario`` answers a clear
ScenarioError (naming the file) or a valid scenario, never another exception, and reads a bounded
amount of memory whatever the file holds. Inputs are the shipped scenarios with random values
replaced, keys removed or added, and files that are not JSON or nest past the decoder's limit."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any

from exporter_proc import SCENARIOS
from fuzzing import HOSTILE_TEXT, JSON_VALUES, TEXT, bounded_memory
from hypothesis import given
from hypothesis import strategies as st

from exporter.common.scenarios import scenario
from exporter.common.scenarios.scenario import ScenarioError, load_scenario

SHIPPED = {p.stem: json.loads(p.read_text()) for p in sorted(SCENARIOS.glob("*.json"))}
BASES = ["h200x1", "h200x2-xid79", "h200x2-nvlink-crash"]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


PATHS = {name: _paths(SHIPPED[name]) for name in BASES}


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A shipped scenario with one to three random changes at random places."""
    name = draw(st.sampled_from(BASES))
    data = copy.deepcopy(SHIPPED[name])
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(PATHS[name]))
        parent: Any = data
        try:
            for key in path[:-1]:
                parent = parent[key]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change removed it
        if not path:
            data = draw(JSON_VALUES)
            continue
        key = path[-1]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        try:
            if action == "replace":
                parent[key] = draw(JSON_VALUES)
            elif action == "delete":
                del parent[key]
            elif isinstance(parent, dict):
                parent[draw(TEXT)] = draw(JSON_VALUES)
            elif isinstance(parent, list):
                parent.insert(key, draw(JSON_VALUES))
        except (KeyError, IndexError, TypeError):
            continue
    return json.dumps(data).encode()


@given(content=st.one_of(mutated(), HOSTILE_TEXT, JSON_VALUES.map(lambda v: json.dumps(v).encode())))
def test_load_scenario_answers_a_scenario_or_a_clear_error(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scenario.json"
        path.write_bytes(content)
        try:
            with bounded_memory():
                data = load_scenario(str(path))
        except ScenarioError as exc:
            assert str(exc).startswith(f"scenario {path}")
            return
    assert isinstance(data, dict) and isinstance(data.get("gpus", []), list)
    json.dumps(data)  # what the worker will be handed is plain JSON


def test_every_shipped_scenario_survives_the_mutation_harness() -> None:
    """The property's premise: unmutated, every base scenario is valid."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in BASES:
            path = Path(tmp) / f"{name}.json"
            path.write_text(json.dumps(SHIPPED[name]))
            assert load_scenario(str(path))["gpus"]


def test_oversized_scenario_is_refused_without_reading_it_whole() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.json"
        with path.open("wb") as fh:
            fh.truncate(scenario.MAX_BYTES * 4)  # 64 MiB of zeros, sparse
        with bounded_memory(scenario.MAX_BYTES + (4 << 20)):
            try:
                load_scenario(str(path))
            except ScenarioError as exc:
                assert "larger than 16 MiB" in str(exc)
            else:
                raise AssertionError("accepted a 64 MiB scenario")
