"""exporter.supervisor.exposition's RenderCache: a rendering from kept lines is the rendering without.

A served state (no worker) is fed the real h200x8 snapshot and variations of it, decoded as the
supervisor decodes them (one SnapshotDecoder, so repeated readings are the same objects); after each
one, a rendering with the cache must be byte for byte the rendering without it, in both formats,
and only the features whose readings changed are rendered again.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from exporter.common.collectors import temperature
from exporter.common.snapshot import Snapshot
from exporter.common.snapshotdecode import SnapshotDecoder
from exporter.config import Config
from exporter.supervisor import exposition, procmetrics
from exporter.supervisor.extensions import Extension
from exporter.supervisor.quarantine import QuarantineStore
from exporter.supervisor.served import ServedState

GOLDEN = Path(__file__).resolve().parent / "golden"
BASE: dict[str, Any] = next(
    m for m in json.loads((GOLDEN / "h200x8.snapshot.json").read_text())["messages"] if m["type"] == "snapshot"
)
FEATURES = sorted(BASE["gpus"][0]["readings"])


def _stats(pid: int) -> procmetrics.ProcStats:
    return procmetrics.ProcStats(1.0, 2, 3, 4.0, 5, 6)  # process_* would move between two renderings


@pytest.fixture
def state() -> Iterator[ServedState]:
    st = ServedState(Config(state_file=""), QuarantineStore("", 3, 600.0, 86400.0), [])
    st.nvml_up = True
    # process_* and the sample's age would move between two renderings
    with mock.patch.object(procmetrics, "read", _stats), mock.patch.object(ServedState, "sample_age", lambda _: 0.5):
        yield st


def feed(st: ServedState, decoder: SnapshotDecoder, msg: dict[str, Any]) -> None:
    snap = decoder.decode_message(copy.deepcopy(msg))
    assert isinstance(snap, Snapshot)
    st.apply_snapshot(snap)
    st.last_mono = time.monotonic()


def same(st: ServedState, cache: exposition.RenderCache) -> None:
    cached, fresh = exposition.render(st, cache), exposition.render(st)
    assert cached.text == fresh.text
    assert cached.openmetrics == fresh.openmetrics
    assert cached.body(False, True) == fresh.body(False, True)


def bump(msg: dict[str, Any], gpu: int, feature: str, field: str, by: int = 1) -> dict[str, Any]:
    out = copy.deepcopy(msg)
    out["gpus"][gpu]["readings"][feature][field] += by
    return out


def test_kept_lines_give_the_same_bytes_and_only_changed_features_are_rendered(state: ServedState) -> None:
    decoder, cache = SnapshotDecoder(), exposition.RenderCache()
    feed(state, decoder, BASE)
    same(state, cache)
    assert cache.rendered == len(FEATURES) and cache.reused == 0
    msg = bump(BASE, 3, "power", "energy_mj", 1234)
    msg = bump(msg, 5, "temperature", "gpu_celsius")
    feed(state, decoder, msg)
    same(state, cache)
    assert cache.rendered == len(FEATURES) + 2  # power and temperature again, nothing else
    assert cache.reused == len(FEATURES) - 2
    feed(state, decoder, msg)  # the same readings again
    same(state, cache)
    assert cache.rendered == len(FEATURES) + 2


def test_a_gpu_that_goes_stale_or_down_changes_what_is_kept(state: ServedState) -> None:
    decoder, cache = SnapshotDecoder(), exposition.RenderCache()
    feed(state, decoder, BASE)
    same(state, cache)
    down = copy.deepcopy(BASE)
    down["gpus"][2]["state"], down["gpus"][2]["detail"] = "lost", "GPU_IS_LOST"
    feed(state, decoder, down)
    same(state, cache)
    assert 'gpu="2"' not in exposition.render(state, cache).text.decode().split("nvgpu_power_usage_watts")[2]
    feed(state, decoder, BASE)
    same(state, cache)
    state.last_mono = time.monotonic() - 60  # stale: only identity and the supervisor's own series
    same(state, cache)


def test_versions_are_part_of_what_lines_are_made_from(state: ServedState) -> None:
    decoder, cache = SnapshotDecoder(), exposition.RenderCache()
    feed(state, decoder, BASE)
    same(state, cache)
    msg = copy.deepcopy(BASE)
    msg["system"]["driver_version"] = "590.1"
    feed(state, decoder, msg)
    same(state, cache)
    assert cache.reused == 0


def test_a_feature_that_fails_to_render_is_never_kept(state: ServedState) -> None:
    decoder, cache = SnapshotDecoder(), exposition.RenderCache()
    feed(state, decoder, BASE)
    real = temperature.families

    def odd(samples: Any, system: Any) -> Any:
        if any(key.gpu == "1" for key, _ in samples):
            raise ValueError("an odd reading")
        return real(samples, system)

    with mock.patch.object(temperature, "families", odd):
        for n in (1, 2):
            exposition.render(state, cache)
            assert state.render_errors["nvgpu_gpu_temperature_celsius"] == n  # GPU 1 fails: counted on every rendering
    same(state, cache)


def test_a_series_that_cannot_be_encoded_is_counted_every_time(state: ServedState) -> None:
    decoder, cache = SnapshotDecoder(), exposition.RenderCache()
    msg = copy.deepcopy(BASE)
    msg["gpus"][4]["readings"]["identity"]["name"] = "H200 \udc80"
    feed(state, decoder, msg)
    for n in (1, 2, 3):
        exposition.render(state, cache)
        assert state.render_errors["nvgpu_gpu_info"] == n


class Relabel(Extension):
    relabels_gpus = True

    def __init__(self) -> None:
        self.pods: dict[str, tuple[str, str, str]] = {}

    def gpu_labels(self, uuid: str) -> tuple[str, str, str]:
        return self.pods.get(uuid, ("", "", ""))


def test_pod_labels_are_never_taken_from_kept_lines() -> None:
    ext = Relabel()
    st = ServedState(Config(state_file=""), QuarantineStore("", 3, 600.0, 86400.0), [ext])
    st.nvml_up = True
    decoder, cache = SnapshotDecoder(), exposition.RenderCache()
    with mock.patch.object(procmetrics, "read", _stats), mock.patch.object(ServedState, "sample_age", lambda _: 0.5):
        feed(st, decoder, BASE)
        same(st, cache)
        ext.pods[BASE["gpus"][0]["uuid"]] = ("ml", "train-0", "main")
        same(st, cache)
        assert 'pod="train-0"' in exposition.render(st, cache).text.decode()
    assert cache.rendered == cache.reused == 0


def test_a_family_of_the_supervisor_that_cannot_be_encoded_is_counted_every_time(state: ServedState) -> None:
    """nvgpu_build_info carries the driver version: a lone surrogate there drops that series on
    every rendering (its lines are never kept), while the families around it are reused."""
    decoder, cache = SnapshotDecoder(), exposition.RenderCache()
    msg = copy.deepcopy(BASE)
    msg["system"]["driver_version"] = "580.\udc80"
    feed(state, decoder, msg)
    for n in (1, 2, 3):
        text = exposition.render(state, cache).text
        assert state.render_errors["nvgpu_build_info"] == n
        assert b"nvgpu_build_info{" not in text and b"nvgpu_up 1.0" in text
    assert ("nvgpu_up", 0) in cache.written and ("nvgpu_build_info", 0) not in cache.written
