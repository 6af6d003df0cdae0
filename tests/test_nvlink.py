"""NVLink error counters through one batched field-value call, per-GPU totals by default,
per-link series for the links with errors (kept), every link with ``nvlink_links``; NVLink bytes per
GPU through the all-links scope."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_device import DEFAULT_ON, DETAILS, Clock, device, fake_of, render

from exporter.common.collectors import nvlink, nvlink_throughput
from exporter.worker.nvml.client import DeviceClient

LINKS = 4
CRC_DATA = (7, 0, 3, 9)  # per link, counter 3: every healthy link may count some (H200 pair: 25-375)
T0 = 1.0  # a field value stamped at time 0 reads as never written (exporter/worker/nvml/backend.py): start at 1 s
KEY = ("0", "GPU-00000000-0000-0000-0000-0000000000aa")


def nvlink_gpu(**extra_fields: Any) -> dict[str, Any]:
    """A GPU with 4 links, all up; replay, recovery and flit CRC 0 by call and by field; data CRC by call."""
    values: dict[str, Any] = {"nvmlDeviceGetNvLinkState": 1, "nvmlDeviceGetNvLinkErrorCounter": 0}
    for link, count in enumerate(CRC_DATA):
        values[f"nvmlDeviceGetNvLinkErrorCounter:{link},3"] = count
    fields: dict[str, Any] = {f"{fid}:{link}": 0 for fid in (161, 162, 163) for link in range(LINKS)}
    fields.update({"91": LINKS, f"138:{0xFFFFFFFF}": {"ramp": 0, "per_s": 400}, f"139:{0xFFFFFFFF}": 40})
    fields.update({f"138:{link}": {"ramp": 0, "per_s": 100} for link in range(LINKS)})
    fields.update({f"139:{link}": 10 for link in range(LINKS)})
    fields.update(extra_fields)
    return {"values": values, "fields": fields, "nvlink_link_count": LINKS}


def calls(dev: DeviceClient, function: str) -> int:
    return fake_of(dev).call_counts().get(function, 0)


def test_batched_every_sample_data_crc_by_call_every_30_s(tmp_path: Path) -> None:
    clock = Clock(T0)
    dev = device(tmp_path, nvlink_gpu(), clock)
    r = nvlink.read(dev)
    assert r == nvlink.Reading(LINKS, {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 19}, {}, {})
    # 4 links x 3 fields in one call; the NVLink5 fields in a call of their own, once (NOT_SUPPORTED on Hopper)
    assert calls(dev, "nvmlDeviceGetFieldValues") == 2
    assert calls(dev, "nvmlDeviceGetNvLinkErrorCounter") == LINKS  # data CRC only: the fields serve the rest
    for t in (5.0, 10.0, 30.0):
        clock.t = t
        assert nvlink.read(dev) == r  # data CRC's last values in between
    assert calls(dev, "nvmlDeviceGetFieldValues") == 5
    assert calls(dev, "nvmlDeviceGetNvLinkErrorCounter") == LINKS
    clock.t = 31.0
    nvlink.read(dev)
    assert calls(dev, "nvmlDeviceGetNvLinkErrorCounter") == 2 * LINKS
    fams = render("nvlink", [(dev, r)])
    assert fams["nvgpu_nvlink_links_up"] == {KEY: 4.0}
    assert fams["nvgpu_nvlink_errors_total"] == {
        (*KEY, "replay"): 0.0,
        (*KEY, "recovery"): 0.0,
        (*KEY, "crc_flit"): 0.0,
        (*KEY, "crc_data"): 19.0,
    }
    assert "nvgpu_nvlink_link_up" not in fams and "nvgpu_nvlink_link_errors_total" not in fams


def test_a_link_with_errors_gets_its_series_and_keeps_them(tmp_path: Path) -> None:
    """Replay errors on link 2 from t = 10 s; at t = 20 s the counters are reset (nvidia-smi nvlink -r):
    link 2's series stay, at 0, so they neither appear late nor vanish."""
    clock = Clock(T0)
    replay = {"sequence": [{"until_s": 10, "value": 0}, {"until_s": 20, "value": 6}, {"value": 0}]}
    dev = device(tmp_path, nvlink_gpu(**{"161:2": replay}), clock)
    assert nvlink.read(dev).link_errors == {}  # type: ignore[union-attr]
    clock.t = 10.0
    r = nvlink.read(dev)
    assert r is not None and r.errors["replay"] == 6
    assert r.link_up == {2: 1}
    assert r.link_errors == {"2/replay": 6, "2/recovery": 0, "2/crc_flit": 0, "2/crc_data": 3}
    fams = render("nvlink", [(dev, r)])
    assert fams["nvgpu_nvlink_link_errors_total"][(*KEY, "2", "replay")] == 6.0
    assert fams["nvgpu_nvlink_link_up"] == {(*KEY, "2"): 1.0}
    clock.t = 20.0
    r = nvlink.read(dev)
    assert r is not None and r.link_errors["2/replay"] == 0 and r.link_up == {2: 1}
    # data CRC alone selects no link: every link of a healthy H200 pair counts some
    assert set(r.link_up) == {2}


def test_every_link_with_nvlink_links(tmp_path: Path) -> None:
    dev = device(tmp_path, nvlink_gpu(), Clock(T0), DEFAULT_ON | {"nvlink_links"})
    r = nvlink.read(dev)
    assert r is not None and r.link_up == dict.fromkeys(range(LINKS), 1)
    assert len(r.link_errors) == 4 * LINKS and r.link_errors["3/crc_data"] == 9
    fams = render("nvlink", [(dev, r)])
    assert len(fams["nvgpu_nvlink_link_errors_total"]) == 16 and len(fams["nvgpu_nvlink_link_up"]) == 4


@pytest.mark.parametrize(
    "fields",
    [
        {f"{fid}:{link}": {"error": "NOT_SUPPORTED"} for fid in (161, 162, 163) for link in range(LINKS)},
        {},  # not listed: the fake answers default_field_error (NOT_SUPPORTED) for the entry
    ],
    ids=["not_supported", "unlisted"],
)
def test_per_call_where_the_driver_lacks_the_fields(tmp_path: Path, fields: dict[str, Any]) -> None:
    """Blackwell and newer (nvml.h: 161-163 "unsupported for Blackwell+"): every counter by call, every
    30 s, and the field entries are not asked again."""
    clock = Clock(T0)
    gpu = nvlink_gpu()
    for fid in (161, 162, 163):
        for link in range(LINKS):
            del gpu["fields"][f"{fid}:{link}"]
    gpu["fields"].update(fields)
    gpu["values"]["nvmlDeviceGetNvLinkErrorCounter:1,1"] = 2  # a recovery on link 1
    dev = device(tmp_path, gpu, clock)
    r = nvlink.read(dev)
    assert r is not None and r.errors == {"replay": 0, "recovery": 2, "crc_flit": 0, "crc_data": 19}
    assert r.link_up == {1: 1}
    assert calls(dev, "nvmlDeviceGetNvLinkErrorCounter") == 4 * LINKS
    clock.t = 5.0
    assert nvlink.read(dev) == r
    assert calls(dev, "nvmlDeviceGetFieldValues") == 2  # every entry unsupported (and NVLink5's): not asked again
    assert calls(dev, "nvmlDeviceGetNvLinkErrorCounter") == 4 * LINKS


def test_recovery_has_one_source_per_link_when_field_215_and_the_call_both_answer(tmp_path: Path) -> None:
    """Blackwell: 162 unsupported, so the per-call DL recovery counter is read, and field 215 answers
    too. The counter of link 1 comes from 215 alone (documented for NVLink5): the call's 40 never
    reaches the series, and the call is not made again for recovery."""
    clock = Clock(T0)
    gpu = nvlink_gpu(**{f"215:{link}": 0 for link in range(LINKS)})
    for fid in (161, 162, 163):
        for link in range(LINKS):
            del gpu["fields"][f"{fid}:{link}"]
    gpu["fields"]["215:1"] = {"sequence": [{"until_s": 20, "value": 5}, {"value": 6}]}
    gpu["values"]["nvmlDeviceGetNvLinkErrorCounter:1,1"] = 40  # another counter's idea of recovery
    dev = device(tmp_path, gpu, clock)
    seen = []
    for t in (T0, 5.0, 25.0, 35.0):
        clock.t = t
        r = nvlink.read(dev)
        assert r is not None
        seen.append((r.errors["recovery"], r.link_errors["1/recovery"]))
    assert seen == [(5, 5), (5, 5), (6, 6), (6, 6)]
    assert dev.state_of(nvlink.LinkCounters).recovery_from == dict.fromkeys(range(LINKS), nvlink.RECOVERY_NVLINK5)
    assert calls(dev, "nvmlDeviceGetNvLinkErrorCounter") == 4 * LINKS + 3 * LINKS  # the second slow read: no recovery


def test_per_call_when_the_field_value_call_itself_is_unsupported(tmp_path: Path) -> None:
    clock = Clock(T0)
    dev = device(
        tmp_path,
        nvlink_gpu(),
        clock,
        faults=[{"function": "nvmlDeviceGetFieldValues", "action": "error", "error": "NOT_SUPPORTED"}],
    )
    r = nvlink.read(dev)
    assert r is not None and r.errors["crc_data"] == 19 and r.errors["replay"] == 0
    assert calls(dev, "nvmlDeviceGetNvLinkErrorCounter") == 4 * LINKS
    clock.t = 5.0
    nvlink.read(dev)
    assert calls(dev, "nvmlDeviceGetFieldValues") == 1  # the whole call is not made again


def test_a_link_that_fails_once_does_not_make_the_total_look_reset(tmp_path: Path) -> None:
    clock = Clock(T0)
    flaky = {"sequence": [{"until_s": 5, "value": 4}, {"until_s": 10, "value": {"error": "UNKNOWN"}}, {"value": 5}]}
    dev = device(tmp_path, nvlink_gpu(**{"162:0": flaky}), clock)
    totals = []
    for t in (1.0, 5.0, 10.0):
        clock.t = t
        r = nvlink.read(dev)
        assert r is not None
        totals.append(r.errors["recovery"])
    assert totals == [4, 4, 5]  # link 0's last value stands in while it does not answer
    assert dev.client.errors[("nvlink", "UNKNOWN")] == 1


def test_no_links_no_reading(tmp_path: Path) -> None:
    dev = device(tmp_path, {"values": {}}, Clock(T0))
    assert nvlink.read(dev) is None
    assert nvlink_throughput.read(dev) is None


# -- bytes ------------------------------------------------------------------------------------------


def test_bytes_per_gpu_through_the_all_links_scope(tmp_path: Path) -> None:
    clock = Clock(2.0)
    dev = device(tmp_path, nvlink_gpu(), clock)
    r = nvlink_throughput.read(dev)
    assert r == nvlink_throughput.Reading(None, 800, 40, {}, {})  # 400 KiB/s x 2 s; link count only with details
    fams = render("nvlink_throughput", [(dev, r)])
    assert fams == {
        "nvgpu_nvlink_transmit_bytes_total": {KEY: 800 * 1024.0},
        "nvgpu_nvlink_receive_bytes_total": {KEY: 40 * 1024.0},
    }
    dev = device(tmp_path, nvlink_gpu(), clock, DETAILS)
    assert nvlink_throughput.read(dev) == nvlink_throughput.Reading(LINKS, 800, 40, {}, {})


def test_bytes_summed_per_link_where_the_driver_refuses_the_all_links_scope(tmp_path: Path) -> None:
    clock = Clock(2.0)
    gpu = nvlink_gpu(
        **{f"138:{0xFFFFFFFF}": {"error": "NOT_SUPPORTED"}, f"139:{0xFFFFFFFF}": {"error": "NOT_SUPPORTED"}}
    )
    gpu["fields"]["138:1"] = {"sequence": [{"until_s": 3, "value": 200}, {"value": {"error": "UNKNOWN"}}]}
    dev = device(tmp_path, gpu, clock)
    r = nvlink_throughput.read(dev)
    assert r == nvlink_throughput.Reading(None, 800, 40, {}, {})  # 4 links x 200 KiB
    clock.t = 4.0
    r = nvlink_throughput.read(dev)
    assert r is not None and r.tx_kib == 3 * 400 + 200  # link 1's last value while it does not answer


def test_bytes_of_every_link_with_nvlink_links(tmp_path: Path) -> None:
    dev = device(tmp_path, nvlink_gpu(), Clock(2.0), DEFAULT_ON | {"nvlink_links"})
    r = nvlink_throughput.read(dev)
    assert r is not None and r.link_tx_kib == dict.fromkeys(range(LINKS), 200) and r.tx_kib == 800
    fams = render("nvlink_throughput", [(dev, r)])
    assert len(fams["nvgpu_nvlink_link_transmit_bytes_total"]) == LINKS
    assert fams["nvgpu_nvlink_transmit_bytes_total"] == {KEY: 800 * 1024.0}


# -- NVLink5 (Blackwell): NVML_FI_DEV_NVLINK_COUNT_* ----------------------------------------------


def blackwell_gpu(recovery: Any = 0, **extra_fields: Any) -> dict[str, Any]:
    """4 NVLink5 links (a B200/GB200 has 18): fields 161-163, the per-call counters and 138/139 answer
    NOT_SUPPORTED; the NVLink5 error fields per link, link 2 counting ``recovery`` recovery events."""
    fields: dict[str, Any] = {"91": LINKS}
    for link in range(LINKS):
        for fid in (206, 207, 208, 209, 210, 211, 212, 214, 219):
            fields[f"{fid}:{link}"] = 0
        fields[f"215:{link}"] = recovery if link == 2 else 0
        fields[f"221:{link}"] = 40 + link  # symbol errors: corrected, every link has some
        fields[f"202:{link}"] = {"ramp": 0, "per_s": 1 << 20}
        fields[f"204:{link}"] = {"ramp": 0, "per_s": 1 << 19}
    fields.update(extra_fields)
    values: dict[str, Any] = {"nvmlDeviceGetNvLinkState": 1}  # no per-call error counter value: NOT_SUPPORTED
    return {"values": values, "fields": fields, "nvlink_link_count": LINKS}


def test_nvlink5_counters_under_the_same_families(tmp_path: Path) -> None:
    """Recovery events (215) are Hopper's ``recovery``; failed recoveries, effective and symbol errors
    are NVLink5's own error types; the replay and CRC types, which have no NVLink5 field, are absent."""
    clock = Clock(T0)
    dev = device(tmp_path, blackwell_gpu(recovery=505), clock)
    r = nvlink.read(dev)
    assert r is not None
    assert r.errors == {"recovery": 505, "recovery_failed": 0, "effective": 0, "symbol": 40 + 41 + 42 + 43}
    assert r.link_up == {2: 1}  # the link counting recoveries shows its own series
    assert r.link_errors == {"2/recovery": 505, "2/recovery_failed": 0, "2/effective": 0, "2/symbol": 42}
    assert "nvlink" in dev.feature_ok
    fams = render("nvlink", [(dev, r)])
    assert set(fams["nvgpu_nvlink_errors_total"]) == {
        (*KEY, "recovery"),
        (*KEY, "recovery_failed"),
        (*KEY, "effective"),
        (*KEY, "symbol"),
    }
    assert fams["nvgpu_nvlink_link_errors_total"][(*KEY, "2", "recovery")] == 505.0
    # the legacy fields answered NOT_SUPPORTED once: one field-value call per sample from now on
    before = calls(dev, "nvmlDeviceGetFieldValues")
    clock.t = 2.0
    nvlink.read(dev)
    assert calls(dev, "nvmlDeviceGetFieldValues") == before + 1


def test_nvlink5_packet_errors_with_details(tmp_path: Path) -> None:
    dev = device(tmp_path, blackwell_gpu(**{"208:1": 3}), Clock(T0), DETAILS)
    r = nvlink.read(dev)
    assert r is not None and r.errors["receive"] == 3 and r.errors["malformed_packet"] == 0
    assert set(r.errors) == set(nvlink.NVLINK5_FIELDS)


def test_links_without_any_error_counter_are_unsupported_not_healthy(tmp_path: Path) -> None:
    """The issue's GB200: link states answer, every error counter (legacy fields, per-call, NVLink5)
    answers NOT_SUPPORTED. No reading: the feature is unsupported on the GPU, not a success with no
    error series; it is asked again only at a re-probe."""
    gpu = blackwell_gpu()
    gpu["fields"] = {"91": LINKS}
    clock = Clock(T0)
    dev = device(tmp_path, gpu, clock)
    assert nvlink.read(dev) is None
    assert "nvlink" in dev.feature_unsupported and "nvlink" not in dev.feature_ok
    before = fake_of(dev).call_counts()
    clock.t = 40.0
    assert nvlink.read(dev) is None
    assert fake_of(dev).call_counts() == before
    dev.forget()
    assert nvlink.read(dev) is None
    assert fake_of(dev).call_counts()["nvmlDeviceGetNvLinkState"] > before["nvmlDeviceGetNvLinkState"]


def test_nvlink5_bytes_where_the_data_fields_are_unsupported(tmp_path: Path) -> None:
    """Fields 138/139 NOT_SUPPORTED on the NVLink5 GPU: the byte counters 202/204 per link, summed,
    in bytes, kept in whole KiB as the reading counts."""
    clock = Clock(T0)
    dev = device(tmp_path, blackwell_gpu(), clock)
    clock.t = 10.0
    r = nvlink_throughput.read(dev)
    assert r is not None
    assert r.tx_kib == LINKS * 10 * (1 << 20) // 1024 and r.rx_kib == LINKS * 10 * (1 << 19) // 1024
    fams = render("nvlink_throughput", [(dev, r)])
    assert fams["nvgpu_nvlink_transmit_bytes_total"] == {KEY: float(LINKS * 10 * (1 << 20))}
