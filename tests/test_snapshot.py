"""exporter.common.snapshot: the typed contract between worker and supervisor, decoded once on receipt."""

from __future__ import annotations

import json
from typing import Any

import pytest

from exporter.common import collectors, protocol
from exporter.common.collectors import clocks, ecc, fan, gpm, identity, nvlink, power, processes
from exporter.common.collectors.base import SystemInfo
from exporter.common.decode import decode_dataclass
from exporter.common.protocol import ProtocolError
from exporter.common.snapshot import Bye, FeatureStat, GpuSample, Hello, InitFailed, NvmlEvent, Snapshot
from exporter.common.snapshotdecode import decode_message
from guards.features import FeatureState, Reason

READINGS: dict[str, object] = {
    "identity": identity.Reading("NVIDIA H200", "00000000:00:06.0", "1654", 9),
    "power": power.Reading(85000, 700000, 2445309),
    "fan": fan.Reading((40, 42)),
    "clocks": clocks.Reading({"sm": 1980}, {"sm": 1980}, 0, 1),
    "ecc": ecc.Reading(True, False, {"corrected": 0}, {"uncorrected": 2}),
    "gpm": gpm.Reading({2: 89.8, 5: 82.7}, {61: 1.5e9}),
    "nvlink": nvlink.Reading(17, {"replay": 3}, {0: 1, 17: 0}, {"0/replay": 3}),
    "processes": processes.Reading(
        2,
        None,
        dropped={"pid_zero": 3},
        functions={"compute": "nvmlDeviceGetComputeRunningProcesses_v2"},
        fallbacks={"compute": "records_invalid"},
        processes={4242: (1 << 30, 50, None, 0, 0)},
        labels={4242: ("python3", "ml", "train-0", "main")},
        other=(3, None, 10, 1, 0, 0),
        pods={"7c1d0f3a-4e2b-4a7e-9c1d-0123456789ab": (1 << 30, 50, 1)},
        pod_names={"7c1d0f3a-4e2b-4a7e-9c1d-0123456789ab": ("ml", "train-0")},
        sources={"proc": 1, "container_logs": 0},
    ),
}


def snapshot() -> Snapshot:
    return Snapshot(
        ts=1_700_000_000.5,
        duration_s=0.01,
        system=SystemInfo("580.159.04", "13.580.159.04", "13.0", "13.610.43"),
        gpus=(
            GpuSample(
                0,
                "GPU-a",
                "up",
                READINGS,
                1_700_000_000.5,
                unsupported=("fan",),
                apis=(("memory", "nvmlDeviceGetMemoryInfo", "1", "function_not_found"),),
            ),
            GpuSample(
                1,
                "GPU-b",
                "hung",
                {},
                None,
                "nvmlDeviceGetPowerUsage (power) did not return",
                (),
                "power",
                "nvmlDeviceGetPowerUsage",
            ),
            GpuSample(2, "", "lost"),
        ),
        features={"power": FeatureStat(True, 0.001), "fan": FeatureStat(False, 0.002)},
        feature_states={"fan": FeatureState("fan", False, Reason.UNSUPPORTED, "no GPU supports it")},
        errors={("power", "UNKNOWN"): 2},
        calls=42,
        events_enabled={"GPU-a": True},
    )


def roundtrip(snap: Snapshot) -> Any:
    line = protocol.encode("snapshot", **snap.to_wire())
    return decode_message(protocol.decode(line))


def test_round_trip_is_exact() -> None:
    """What the worker builds is what the supervisor reads: int-keyed dicts, tuples, enums."""
    snap = snapshot()
    assert roundtrip(snap) == snap


def test_typed_access_by_reading_class() -> None:
    got = roundtrip(snapshot())
    gpu = got.gpus[0]
    assert gpu.reading(nvlink.Reading).link_up == {0: 1, 17: 0}  # JSON's "0" keys are ints again
    assert gpu.reading(fan.Reading).speeds_percent == (40, 42)
    assert gpu.reading(power.Reading).usage_mw == 85000
    assert got.gpus[1].reading(power.Reading) is None


@pytest.mark.parametrize(
    ("feature", "field", "value"),
    [
        ("power", "usage_mw", "abc"),  # a driver string where an integer belongs
        ("power", "usage_mw", True),  # a bool is not an int here
        ("power", "usage_mw", 1.5),
        ("fan", "speeds_percent", [40, "x"]),
        ("nvlink", "link_up", {"zero": 1}),  # a link index that is not an integer
        ("identity", "architecture", [9]),
    ],
)
def test_a_reading_that_does_not_fit_costs_only_that_reading(feature: str, field: str, value: object) -> None:
    wire = snapshot().to_wire()
    wire["gpus"][0]["readings"][feature][field] = value
    got = decode_message(json.loads(protocol.encode("snapshot", **wire)))
    assert isinstance(got, Snapshot)
    assert feature not in got.gpus[0].readings and got.undecodable == {feature}
    assert set(got.gpus[0].readings) == set(READINGS) - {feature}


def test_a_renamed_reading_field_is_named() -> None:
    """The point of the typed contract: a rename fails here, with the field, not in a golden."""
    wire = snapshot().to_wire()
    data = wire["gpus"][0]["readings"]["power"]
    data["usage_milliwatts"] = data.pop("usage_mw")
    with pytest.raises(ValueError, match=r"usage_milliwatts"):
        decode_dataclass(power.Reading, data, "power")
    with pytest.raises(ValueError, match=r"missing field 'usage_mw'"):
        decode_dataclass(power.Reading, {"limit_mw": 1, "energy_mj": 2}, "power")


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        ({"type": "snapshot", "gpus": {}}, "snapshot.gpus"),
        ({"type": "snapshot", "ts": "now", "duration_s": 0, "gpus": []}, "snapshot.ts"),
        ({"type": "snapshot", "ts": 1, "duration_s": 0, "gpus": [{"index": "0", "uuid": "u", "state": "up"}]}, "index"),
        (
            {"type": "snapshot", "ts": 1, "duration_s": 0, "gpus": [{"index": 0, "uuid": "u", "state": "sleepy"}]},
            "state",
        ),
        ({"type": "snapshot", "ts": 1, "duration_s": 0, "gpus": [], "system": {"driver": "580"}}, "driver"),
        (
            {"type": "snapshot", "ts": 1, "duration_s": 0, "gpus": [], "feature_states": {"x": {"reason": "maybe"}}},
            "feature_states",
        ),
        ({"type": "event", "ts": 1, "gpu": None, "uuid": "u", "event_type": "xid", "xid": "79"}, "xid"),
        ({"type": "gossip"}, "unknown message type"),
    ],
)
def test_malformed_messages_are_protocol_errors(msg: dict[str, Any], match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_message(msg)


def test_other_messages() -> None:
    hello = decode_message(
        {"type": "hello", "pid": 7, "system": {"driver_version": "580"}, "gpus": [{"index": 0, "uuid": "GPU-a"}]}
    )
    assert hello == Hello(7, SystemInfo(driver_version="580"), ((0, "GPU-a", ""),), {})
    assert decode_message(
        {"type": "init_failed", "code": 9, "error": "DRIVER_NOT_LOADED", "message": "m"}
    ) == InitFailed(9, "DRIVER_NOT_LOADED", "m")
    event = {"type": "event", "v": 1, "ts": 1.0, "gpu": 0, "uuid": "GPU-a", "event_type": "xid", "xid": 79}
    assert decode_message(event) == NvmlEvent(1.0, 0, "GPU-a", "xid", 79)
    assert decode_message({"type": "bye", "nvml_shutdown": True}) == Bye(True)


def test_every_collector_reading_can_be_decoded() -> None:
    """Each Reading's annotations are ones the decoder knows (a new field type must be taught)."""
    for feature, c in collectors.COLLECTORS.items():
        fields = c.Reading.__dataclass_fields__
        blank = {name: None for name in fields}
        try:
            decode_dataclass(c.Reading, blank, feature)
        except ValueError as exc:  # a non-optional field rejects None: fine, but never "no decoder"
            assert "no decoder" not in str(exc), exc
