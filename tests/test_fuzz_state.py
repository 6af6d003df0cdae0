"""Property tests (Hypothesis) of the quarantine state file: whatever it holds, the store
loads (bad entries dropped, a file that is not ours counted as empty), every value it keeps is one
the supervisor can compute with, it goes on recording and saving, and what it saves loads back the
same. The issue's own examples run on the real exporter and the ``quarantine`` command."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from exporter_proc import SCENARIOS, Exporter
from fuzzing import HOSTILE_TEXT, JSON_VALUES, NUMBERS, TEXT, bounded_memory
from hypothesis import given
from hypothesis import strategies as st

from exporter.supervisor.quarantine import MAX_TTL_S, QuarantineStore
from guards.featuretable import FEATURES

NOW = 1_800_000_000.0
FEATURE = st.one_of(st.sampled_from(sorted(FEATURES)), TEXT)
TIME = st.one_of(st.floats(min_value=NOW - 1e6, max_value=NOW + 1e6), NUMBERS, TEXT)
QUARANTINE = st.fixed_dictionaries(
    {"feature": FEATURE, "function": st.one_of(TEXT, JSON_VALUES), "since": TIME, "until": TIME},
    optional={"crashes": st.one_of(st.integers(min_value=-2, max_value=10), NUMBERS, JSON_VALUES), "extra": TEXT},
)
HISTORY = st.one_of(
    st.tuples(TIME, FEATURE, TEXT).map(list),
    st.tuples(TIME, FEATURE, TEXT, TEXT).map(list),
    st.tuples(TIME, FEATURE, TEXT, TEXT, TIME).map(list),
    JSON_VALUES,
)
STATE = st.fixed_dictionaries(
    {
        "version": st.one_of(st.sampled_from([1, 2]), JSON_VALUES),
        "history": st.one_of(st.lists(HISTORY, max_size=8), JSON_VALUES),
        "quarantine": st.one_of(st.dictionaries(FEATURE, st.one_of(QUARANTINE, JSON_VALUES), max_size=4), JSON_VALUES),
    },
    optional={"boot_id": st.one_of(st.just("boot-a"), TEXT, JSON_VALUES)},
)
FILES = st.one_of(
    STATE.map(lambda d: json.dumps(d).encode()), JSON_VALUES.map(lambda v: json.dumps(v).encode()), HOSTILE_TEXT
)


def _finite(x: Any) -> bool:
    return isinstance(x, float) and math.isfinite(x) or (isinstance(x, int) and not isinstance(x, bool))


def _store(path: Path) -> QuarantineStore:
    return QuarantineStore(str(path), 3, 600.0, 86400.0, clock=lambda: NOW, boot_id="boot-a")


@given(content=FILES)
def test_any_state_file_loads_into_values_that_compute(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.json"
        path.write_bytes(content)
        with bounded_memory():
            store = _store(path)
            details = store.details()
        if store.load_error is not None:
            assert not store.active and not store.history
        for feature, q in store.active.items():
            assert feature in FEATURES and q.feature == feature and isinstance(q.function, str)
            assert _finite(q.since) and _finite(q.until) and q.since <= q.until <= NOW + MAX_TTL_S
            assert isinstance(q.crashes, int) and q.crashes >= 0
            assert isinstance(details[feature], str)
        for t, feature, function, uuid, mono, contained in store.history:
            assert _finite(t) and feature in FEATURES and isinstance(function, str) and isinstance(uuid, str)
            assert isinstance(contained, bool)
            assert _finite(mono) and NOW - 600.0 <= mono <= NOW  # on the store's clock, within the window
        for feature, until in store.until_mono.items():
            assert feature in store.active and NOW <= until <= NOW + 86400.0  # never beyond the TTL
        # it goes on working: a crash is recorded and saved, and the saved file loads back the same
        store.record("fan", "nvmlDeviceGetFanSpeed_v2", "GPU-1")
        again = _store(path)
        assert again.load_error is None and not again.dropped
        assert again.active == store.active and again.history == store.history
        assert os.listdir(tmp) == ["state.json"]  # no temporary file left behind


ISSUE_FILES = {
    "until NaN": {"until": "NaN"},
    "until a string": {"until": '"tomorrow"'},
    "until 1e300": {"until": "1e300"},
    "until 1e17 (the TTL of the issue)": {"until": "1e17"},
    "since a string": {"since": '"yesterday"'},
    "a 400-digit integer": {"until": "1" + "0" * 400},
    "an unknown feature": {"feature": '"nvlink_thruput"'},
}


def _issue_file(change: dict[str, str]) -> str:
    body = {"feature": '"nvlink_throughput"', "function": '"f"', "since": "1800000000", "until": "1800086400"}
    body.update(change)
    feature = body["feature"]
    inner = ", ".join(f'"{k}": {v}' for k, v in body.items())
    return f'{{"version": 1, "history": [], "quarantine": {{{feature}: {{{inner}, "crashes": 3}}}}}}'


@pytest.mark.parametrize("name", sorted(ISSUE_FILES))
def test_issue_state_files_never_stop_the_quarantine_command(tmp_path: Path, name: str) -> None:
    """The issue: each of these made every start exit 1, and ``nvgpu-exporter quarantine`` too."""
    state = tmp_path / "state.json"
    state.write_text(_issue_file(ISSUE_FILES[name]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--state-file", str(state), "quarantine"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "no feature is quarantined" in proc.stdout, proc.stdout + proc.stderr


def test_issue_state_files_never_stop_the_exporter(tmp_path: Path) -> None:
    """A quarantine until NaN and a history entry with a 400-digit time (OverflowError in
    math.isfinite before): the exporter starts, says once what it dropped, serves, and quarantines
    nothing."""
    data = _issue_file(ISSUE_FILES["until NaN"]).replace('"history": []', f'"history": [[{"9" * 400}, "fan", "f"]]')
    (tmp_path / "state.json").write_text(data)
    with Exporter(SCENARIOS / "h200x1.json", tmp_path) as exp:
        scrape = exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0, what="serving")
        assert not scrape.find("nvgpu_feature_enabled", reason="quarantined")
        assert exp.get("/healthz")[0] == 200
        dropped = [r for r in exp.log_records() if "dropped" in r.get("msg", "") and "state file" in r.get("msg", "")]
        assert len(dropped) == 1 and "2 invalid entries" in dropped[0]["msg"], dropped
        assert exp.terminate() == 0


def test_ttl_beyond_ten_years_is_capped_and_the_third_crash_survives(tmp_path: Path) -> None:
    """The issue: NVGPU_QUARANTINE_TTL_SECONDS=1e17 crashed the supervisor at the third crash
    (gmtime overflow) after writing until 1e17, and every start after that exited 1. Config refuses
    the value (tests/test_check_config_bounds.py); the store caps it too, whoever builds one."""
    path = tmp_path / "state.json"
    store = QuarantineStore(str(path), 3, 600.0, 1e17, clock=lambda: NOW)
    for _ in range(3):
        new = store.record("nvlink_throughput", "nvmlDeviceGetFieldValues")
    assert new is not None and new.until == NOW + MAX_TTL_S
    assert new.detail().endswith("expires 2037-01-12T08:00:00Z")
    assert _store(path).active == store.active


@pytest.mark.parametrize("how", ["target is a directory", "writer raises"])
def test_failed_save_leaves_no_temporary_file(tmp_path: Path, how: str) -> None:
    path = tmp_path / "state.json"
    if how == "target is a directory":
        path.mkdir()  # os.replace fails with IsADirectoryError after the temporary file was written
    store = _store(path)
    errors: list[str] = []
    store.on_error = lambda component, doing: errors.append(component)
    if how == "writer raises":
        import exporter.supervisor.quarantine as q

        real = q.json
        q.json = type("J", (), {"dump": staticmethod(lambda *a, **k: 1 / 0), "loads": json.loads})  # type: ignore[assignment]
        try:
            for _ in range(5):
                store.record("fan", "f")
        finally:
            q.json = real
        assert errors == ["state"] * 5
    else:
        for _ in range(5):
            store.record("fan", "f")
        assert errors == []  # an OSError is the environment's: logged once, not a bug
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == (["state.json"] if how == "target is a directory" else [])  # no .state-* file
    assert len(store.history) == 5


# -- clock steps: the wall clock never decides ------------------------------------------------

WALL_STEP = st.one_of(st.sampled_from([3600.0, -3600.0]), st.floats(min_value=-86400.0, max_value=86400.0))
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("crash"), st.sampled_from(["fan", "power"]), st.sampled_from(["", "GPU-a", "GPU-b"])),
        st.tuples(st.just("wait"), st.floats(min_value=0.0, max_value=2000.0)),
        st.tuples(st.just("step"), WALL_STEP),
        st.tuples(st.just("restart")),
    ),
    max_size=30,
)


@given(events=EVENTS)
def test_wall_clock_steps_change_no_quarantine_decision(events: list[tuple[Any, ...]]) -> None:
    """Two stores see the same crashes at the same monotonic times; one's wall clock also steps
    (forwards and back, by an hour or anything up to a day) and both restart now and then (same boot).
    Every crash gets the same answer and the same features are quarantined at every point."""
    with tempfile.TemporaryDirectory() as tmp:
        mono, offsets = [10_000.0], {"steady": NOW, "stepped": NOW}

        def make(name: str) -> QuarantineStore:
            return QuarantineStore(
                str(Path(tmp) / f"{name}.json"),
                2,
                600.0,
                3600.0,
                clock=lambda: mono[0] + offsets[name] - 10_000.0,
                mono=lambda: mono[0],
                boot_id="boot-a",
            )

        stores = {name: make(name) for name in offsets}
        for event in events:
            if event[0] == "crash":
                got = {name: s.record(event[1], "f", event[2]) is not None for name, s in stores.items()}
                assert got["steady"] == got["stepped"], event
            elif event[0] == "wait":
                mono[0] += event[1]
            elif event[0] == "step":
                offsets["stepped"] += event[1]
            else:
                stores = {name: make(name) for name in offsets}
            assert set(stores["steady"].details()) == set(stores["stepped"].details())
            assert [h.feature for h in stores["steady"].history] == [h.feature for h in stores["stepped"].history]
