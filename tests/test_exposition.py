"""exporter.supervisor.exposition: rendering from the served state, content negotiation, gzip.

The state is a real :class:`exporter.supervisor.served.ServedState` (no worker) fed a snapshot message in the
shape the worker sends (``readings`` are collectors' Reading dataclasses as JSON), decoded as the
supervisor decodes it.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from exporter_proc import Scrape
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from exporter.common import collectors
from exporter.common.collectors import identity, power, temperature, utilization
from exporter.common.snapshotdecode import decode_message
from exporter.config import Config
from exporter.supervisor import exposition
from exporter.supervisor.extensions import Extension
from exporter.supervisor.quarantine import QuarantineStore
from exporter.supervisor.served import ServedState

UUIDS = [
    "GPU-00000000-0000-0000-0000-000000000000",
    "GPU-11111111-1111-1111-1111-111111111111",
    "GPU-22222222-2222-2222-2222-222222222222",
]


def _readings(i: int) -> dict[str, Any]:
    return {
        "identity": collectors.to_json(identity.Reading("NVIDIA H200", f"00000000:00:0{6 + i}.0", f"16545240{i}", 9)),
        "utilization": collectors.to_json(utilization.Reading(10 * i, 5 * i, 0, 0)),
        "power": collectors.to_json(power.Reading(85000 + i, 700000, 2445309 + i)),
        "temperature": collectors.to_json(temperature.Reading(34 + i, 37 + i)),
    }


def snapshot(**overrides: Any) -> dict[str, Any]:
    """A three-GPU snapshot as the worker sends it; every feature succeeded."""
    gpus = [
        {"index": i, "uuid": u, "state": "up", "readings": _readings(i), "sampled_at": 1_700_000_000.0}
        for i, u in enumerate(UUIDS)
    ]
    snap = {
        "type": "snapshot",
        "v": 1,
        "ts": 1_700_000_000.0,
        "duration_s": 0.01,
        "system": {
            "driver_version": "580.159.04",
            "nvml_version": "13.580.159.04",
            "cuda_driver_version": "13.0",
            "nvidia_ml_py_version": "13.580.82",
        },
        "gpus": gpus,
        "features": {
            f: {"success": 1, "duration_s": 0.001} for f in ("identity", "utilization", "power", "temperature")
        },
        "feature_states": {},
        "errors": [],
        "calls": 42,
        "events_enabled": {},
    }
    snap.update(overrides)
    return snap


@pytest.fixture
def sup() -> Iterator[ServedState]:
    yield ServedState(Config(state_file=""), QuarantineStore("", 3, 600.0, 86400.0), [])


def load(sup: ServedState, snap: dict[str, Any], age_s: float = 0.0) -> None:
    sup.nvml_up = True
    sup.apply_snapshot(decode_message(snap))  # type: ignore[arg-type]
    sup.last_mono = time.monotonic() - age_s


def render(sup: ServedState) -> Scrape:
    rendered = exposition.render(sup)
    parse_openmetrics(rendered.openmetrics.decode())  # both encodings stay valid
    return Scrape(rendered.text.decode())


def success(scrape: Scrape) -> dict[str, float]:
    return {s.labels["feature"]: s.value for s in scrape.find("nvgpu_feature_success")}


def test_all_gpus_and_families(sup: ServedState) -> None:
    load(sup, snapshot())
    scrape = render(sup)
    for i, uuid in enumerate(UUIDS):
        assert scrape.value("nvgpu_device_up", gpu=str(i), uuid=uuid) == 1.0
        assert scrape.value("nvgpu_power_usage_watts", gpu=str(i)) == (85000 + i) / 1000
        assert scrape.value("nvgpu_energy_consumption_joules_total", gpu=str(i)) == (2445309 + i) / 1000
        assert scrape.value("nvgpu_gpu_utilization_ratio", gpu=str(i)) == i / 10
        info = scrape.find("nvgpu_gpu_info", gpu=str(i))[0].labels
        assert info["architecture"] == "hopper" and info["driver_version"] == "580.159.04"
    assert scrape.value("nvgpu_up") == 1.0
    assert success(scrape) == {"identity": 1.0, "utilization": 1.0, "power": 1.0, "temperature": 1.0}


def test_one_gpu_raising_in_families_costs_only_that_gpu(sup: ServedState) -> None:
    """GPU 1's power reading holds a string: power.families() raises on it. Every other GPU keeps
    its power series, GPU 1 keeps every other family, and power's success becomes 0."""
    snap = snapshot()
    snap["gpus"][1]["readings"]["power"]["usage_mw"] = "abc"
    with pytest.raises(TypeError):
        list(power.families([(None, power.Reading("abc", 1, 1))]))  # type: ignore[arg-type,list-item]  # the premise
    load(sup, snap)
    scrape = render(sup)
    for gpu in ("0", "2"):
        for name in ("nvgpu_power_usage_watts", "nvgpu_power_limit_watts", "nvgpu_energy_consumption_joules_total"):
            assert scrape.value(name, gpu=gpu) is not None, (name, gpu)
    assert scrape.value("nvgpu_power_usage_watts", gpu="1") is None
    for name in (
        "nvgpu_gpu_info",
        "nvgpu_gpu_utilization_ratio",
        "nvgpu_gpu_temperature_celsius",
        "nvgpu_memory_temperature_celsius",
        "nvgpu_device_up",
    ):
        assert {s.labels["gpu"] for s in scrape.find(name)} == {"0", "1", "2"}, name
    assert success(scrape) == {"identity": 1.0, "utilization": 1.0, "power": 0.0, "temperature": 1.0}
    assert scrape.value("nvgpu_up") == 1.0


def test_identity_raising_for_one_gpu(sup: ServedState) -> None:
    """An unhashable architecture makes identity.families() raise for GPU 2 only."""
    snap = snapshot()
    snap["gpus"][2]["readings"]["identity"]["architecture"] = [9]
    load(sup, snap)
    scrape = render(sup)
    assert {s.labels["gpu"] for s in scrape.find("nvgpu_gpu_info")} == {"0", "1"}
    assert {s.labels["gpu"] for s in scrape.find("nvgpu_power_usage_watts")} == {"0", "1", "2"}
    assert success(scrape)["identity"] == 0.0


def test_reading_of_another_shape_fails_that_feature_only(sup: ServedState) -> None:
    """A reading that does not fit the Reading dataclass (a worker of another version)."""
    snap = snapshot()
    snap["gpus"][0]["readings"]["temperature"]["fahrenheit"] = 93
    load(sup, snap)
    scrape = render(sup)
    assert {s.labels["gpu"] for s in scrape.find("nvgpu_gpu_temperature_celsius")} == {"1", "2"}
    assert success(scrape)["temperature"] == 0.0
    assert success(scrape)["power"] == 1.0


def test_worker_reported_failure_kept(sup: ServedState) -> None:
    snap = snapshot()
    snap["features"]["utilization"]["success"] = 0
    load(sup, snap)
    assert success(render(sup))["utilization"] == 0.0


def test_stale_snapshot_drops_readings_keeps_identity_state_and_self_metrics(sup: ServedState) -> None:
    """Readings older than the stale bound go; what the supervisor owns stays: the GPUs'
    identity, their state (now unknown: no fresh sample), Xid counters."""
    load(sup, snapshot(), age_s=sup.config.stale_s + 1)
    sup.xids.record_xid("1", UUIDS[1], 79, 1_700_000_000.0, "NVML event")
    scrape = render(sup)
    assert not scrape.find("nvgpu_power_usage_watts") and not scrape.find("nvgpu_gpu_utilization_ratio")
    assert {s.labels["gpu"] for s in scrape.find("nvgpu_gpu_info")} == {"0", "1", "2"}
    for i, uuid in enumerate(UUIDS):
        assert scrape.value("nvgpu_device_up", gpu=str(i), uuid=uuid) == 0.0
        assert scrape.value("nvgpu_device_state", gpu=str(i), state="unknown") == 1.0
    assert scrape.value("nvgpu_xid_errors_total", gpu="1", xid="79") == 1.0
    assert scrape.value("nvgpu_up") == 0.0
    assert scrape.value("nvgpu_last_sample_timestamp_seconds") == 1_700_000_000.0  # the age stays visible
    assert not scrape.find("nvgpu_feature_success")
    assert scrape.find("nvgpu_worker_restarts_total")


def test_no_snapshot_yet(sup: ServedState) -> None:
    scrape = render(sup)
    assert scrape.value("nvgpu_up") == 0.0
    assert scrape.value("nvgpu_last_sample_timestamp_seconds") is None
    assert not scrape.gpus()


def test_lost_gpu_and_gpu_without_uuid(sup: ServedState) -> None:
    """A lost GPU keeps only device_up 0; a GPU whose handle lookup failed before its UUID was read
    gets device_up 0 with an empty uuid."""
    snap = snapshot()
    snap["gpus"][1] = {"index": 1, "uuid": UUIDS[1], "state": "lost", "readings": {}}
    snap["gpus"][2] = {"index": 2, "uuid": "", "state": "lost", "readings": {}}
    load(sup, snap)
    scrape = render(sup)
    assert scrape.value("nvgpu_device_up", gpu="1", uuid=UUIDS[1]) == 0.0
    assert scrape.value("nvgpu_device_up", gpu="2", uuid="") == 0.0
    for gpu in ("1", "2"):
        assert scrape.value("nvgpu_device_state", gpu=gpu, state="lost") == 1.0
        assert {s.name for s in scrape.samples if s.labels.get("gpu") == gpu} == {
            "nvgpu_device_up",
            "nvgpu_device_state",
        }


def test_no_nan_and_no_value_for_missing_readings(sup: ServedState) -> None:
    snap = snapshot()
    snap["gpus"][0]["readings"]["power"] = collectors.to_json(power.Reading(None, 700000, None))
    load(sup, snap)
    text = exposition.render(sup).text.decode()
    assert "NaN" not in text and "nan" not in text.lower().replace("nanos", "")
    scrape = Scrape(text)
    assert scrape.value("nvgpu_power_usage_watts", gpu="0") is None
    assert scrape.value("nvgpu_power_limit_watts", gpu="0") == 700.0


@dataclasses.dataclass
class _Case:
    accept: str | None
    openmetrics: bool


NEGOTIATION = {
    "none": _Case(None, False),
    "empty": _Case("", False),
    "text": _Case("text/plain", False),
    "text_0.0.4": _Case("text/plain;version=0.0.4", False),
    "any": _Case("*/*", False),
    "prometheus3": _Case(
        "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
        "application/openmetrics-text;version=0.0.1;q=0.5,"
        "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
        "text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
        True,
    ),
    "prometheus2": _Case(
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
        "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        True,
    ),
    "om_0.0.1_only": _Case("application/openmetrics-text;version=0.0.1", False),
    "om_unversioned": _Case("application/openmetrics-text", True),
    "om_refused": _Case("application/openmetrics-text;q=0", False),
    "text_preferred": _Case("text/plain;q=0.9,application/openmetrics-text;version=1.0.0;q=0.5", False),
    "case_and_spaces": _Case(" Application/OpenMetrics-Text ; version=1.0.0 ; q=0.8 , text/plain ; q=0.2", True),
    "bad_q": _Case("application/openmetrics-text;q=abc,text/plain", False),
}


@pytest.mark.parametrize("name", sorted(NEGOTIATION))
def test_negotiate(name: str) -> None:
    case = NEGOTIATION[name]
    assert exposition.negotiate(case.accept) is case.openmetrics


def test_gzip_bodies_decompress_to_the_same_format(sup: ServedState) -> None:
    load(sup, snapshot())
    rendered = exposition.render(sup)
    assert rendered.openmetrics.endswith(b"# EOF\n") and b"# EOF" not in rendered.text
    for om in (False, True):
        plain = rendered.body(om, False)
        zipped = rendered.body(om, True)
        assert zipped[:2] == b"\x1f\x8b" and gzip.decompress(zipped) == plain
        assert rendered.body(om, True) is zipped  # compressed once per rendering


def test_pod_labels_on_per_gpu_series_when_switched_on(sup: ServedState) -> None:
    """NVGPU_POD_LABELS: a GPU held by one container carries its names; a shared or free GPU gets
    empty values (join nvgpu_gpu_pod_info for those); exporter-level series get none."""
    held = {UUIDS[0]: ("team-a", "train-0", "main"), UUIDS[1]: ("", "", "")}

    class Labels(Extension):
        relabels_gpus = True

        def gpu_labels(self, uuid: str) -> tuple[str, str, str]:
            return held.get(uuid, ("", "", ""))

    labels = Labels()
    sup.extensions.append(labels)
    load(sup, snapshot())
    scrape = render(sup)
    power0 = scrape.find("nvgpu_power_usage_watts", gpu="0")[0].labels
    assert (power0["namespace"], power0["pod"], power0["container"]) == ("team-a", "train-0", "main")
    power1 = scrape.find("nvgpu_power_usage_watts", gpu="1")[0].labels
    assert (power1["namespace"], power1["pod"], power1["container"]) == ("", "", "")
    assert "namespace" not in scrape.find("nvgpu_up")[0].labels
    labels.relabels_gpus = False
    assert "namespace" not in render(sup).find("nvgpu_power_usage_watts", gpu="0")[0].labels


def test_pod_labels_leave_per_pod_and_per_process_series_alone(sup: ServedState) -> None:
    """NVGPU_POD_LABELS must not overwrite the pod of a per-process series with the GPU's holder
    (on a shared GPU each process has its own pod)."""
    from exporter.common.collectors import processes

    class Labels(Extension):
        relabels_gpus = True

        def gpu_labels(self, uuid: str) -> tuple[str, str, str]:
            return ("team-a", "train-0", "main")

    sup.extensions.append(Labels())
    snap = snapshot()
    reading = processes.Reading(
        count=1,
        memory_used_bytes=1 << 30,
        processes={4242: (1 << 30, 50, 10, 0, 0)},
        labels={4242: ("python3", "team-b", "notebook-7", "jupyter")},
    )
    snap["gpus"][0]["readings"]["processes"] = collectors.to_json(reading)
    load(sup, json.loads(json.dumps(snap)))  # as the pipe carries it: JSON object keys are strings
    scrape = render(sup)
    proc = scrape.find("nvgpu_process_memory_used_bytes", gpu="0")[0].labels
    assert (proc["namespace"], proc["pod"], proc["container"]) == ("team-b", "notebook-7", "jupyter")
    count = scrape.find("nvgpu_compute_processes", gpu="0")[0].labels
    assert (count["namespace"], count["pod"]) == ("team-a", "train-0")
