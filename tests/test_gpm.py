"""GPM profiling: exporter.common.collectors.gpm and gpm_pipes on the fake backend, and the
real-binding path of DeviceClient.gpm_metrics against pynvml's own structures.

The fake answers GPM as pynvml shapes it (docs/scenarios.md), on an injected scenario clock, so
windows, values over time and the byte integration are exact here.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import pynvml
import pytest
from fake_device import DEFAULT_ON, Clock, device, devices, fake_of, render, wire

from exporter.common.breadcrumb import BreadcrumbWriter
from exporter.common.collectors import gpm, gpm_pipes, nvlink_throughput
from exporter.worker.nvml import structs
from exporter.worker.nvml.backend import RealNvml
from exporter.worker.nvml.client import DeviceClient, NvmlClient

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def h200x2() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "examples" / "scenarios" / "h200x2.json").read_text())
    return data


def gpm_gpu(**metrics: Any) -> dict[str, Any]:
    """A GPU with GPM supported and the given metric values (key: metric id as text)."""
    values: dict[str, Any] = {"nvmlGpmQueryDeviceSupport": {"isSupportedDevice": 1}}
    values.update({f"nvmlGpmMetricsGet:{k}": v for k, v in metrics.items()})
    return {"values": values}


# nvlink_throughput off: GPM is asked for NVLink traffic too (as on H20 / 580, where a known issue
# switches the field counters off)
GPM_ALL = DEFAULT_ON - {"nvlink_throughput"}
DEFAULT = {"1": 50.0, "2": 40.0, "3": 10.0, "5": 30.0, "10": 20.0, "20": 2.0, "21": 4.0, "60": 8.0, "61": 16.0}


# -- the window ------------------------------------------------------------------------------------


def test_first_sample_gives_nothing_then_each_reading_covers_the_last_interval(tmp_path: Path) -> None:
    clock = Clock(0.0)
    dev = device(tmp_path, gpm_gpu(**DEFAULT), clock, GPM_ALL)
    assert gpm.read(dev) is None  # one sample: no window yet
    clock.t = 5.0
    r = gpm.read(dev)
    assert r is not None
    assert r.activity_percent == {1: 50.0, 2: 40.0, 3: 10.0, 5: 30.0, 10: 20.0}
    # MiB/s x 5 s window, in bytes
    assert r.transferred_bytes == {20: 2 * MIB * 5, 21: 4 * MIB * 5, 61: 16 * MIB * 5, 60: 8 * MIB * 5}
    clock.t = 7.0
    r2 = gpm.read(dev)
    assert r2 is not None and r2.transferred_bytes[61] == 16 * MIB * 7  # summed over windows
    fams = render("gpm", [(dev, r2)])
    key = ("0", dev.uuid)
    assert fams["nvgpu_gpm_sm_activity_ratio"] == {key: 0.4}
    assert fams["nvgpu_gpm_graphics_activity_ratio"] == {key: 0.5}
    assert fams["nvgpu_gpm_sm_occupancy_ratio"] == {key: 0.1}
    assert fams["nvgpu_gpm_tensor_activity_ratio"] == {key: 0.3}
    assert fams["nvgpu_gpm_dram_bandwidth_ratio"] == {key: 0.2}
    assert fams["nvgpu_gpm_nvlink_transmit_bytes_total"] == {key: 16 * MIB * 7}
    assert fams["nvgpu_gpm_nvlink_receive_bytes_total"] == {key: 8 * MIB * 7}
    assert fams["nvgpu_gpm_pcie_transmit_bytes_total"] == {key: 2 * MIB * 7}
    assert fams["nvgpu_gpm_pcie_receive_bytes_total"] == {key: 4 * MIB * 7}
    counts = fake_of(dev).call_counts()
    assert counts["nvmlGpmSampleAlloc"] == 2 and counts["nvmlGpmQueryDeviceSupport"] == 1
    assert counts["nvmlGpmSampleGet"] == 3 and counts["nvmlGpmMetricsGet"] == 2


def test_values_follow_the_scenario_over_time(tmp_path: Path) -> None:
    """h200x2 cycles idle -> loaded -> capped -> cooling every 5 s; GPM follows the load."""
    clock = Clock(0.0)
    dev = devices(tmp_path, h200x2(), clock)[0]
    seen = {}
    for t in (0.0, 2.5, 7.5, 12.5, 17.5, 22.5):
        clock.t = t
        r = gpm.read(dev)
        if r is not None:
            seen[t] = r.activity_percent[gpm.SM_UTIL]
    assert seen == {2.5: 0.0, 7.5: 89.8, 12.5: 89.8, 17.5: 0.0, 22.5: 0.0}


def test_gpm_nvlink_bytes_equal_the_nvlink_byte_counters_on_the_fake(tmp_path: Path) -> None:
    """The fake's version of the hardware check: over the same window, GPM's integrated NVLink
    bytes equal the per-link field counters (138/139) summed, in both directions."""
    clock = Clock(3.0)
    gpu0 = devices(tmp_path, h200x2(), clock, DEFAULT_ON - {"nvlink_throughput"})[0]  # GPM asks NVLink only then
    gpm.read(gpu0)
    first_fields = nvlink_throughput.read(gpu0)
    first = None
    for t in (4.0, 9.5, 15.0, 31.25):
        clock.t = t
        r = gpm.read(gpu0)
        assert r is not None
        if first is None:
            first = r
        fields = nvlink_throughput.read(gpu0)
    assert first is not None and r is not None and first_fields is not None and fields is not None
    assert fields.tx_kib is not None and first_fields.tx_kib is not None
    assert fields.rx_kib is not None and first_fields.rx_kib is not None
    gpm_tx = r.transferred_bytes[gpm.NVLINK_TOTAL_TX_PER_SEC]
    field_tx = (fields.tx_kib - first_fields.tx_kib) * 1024
    gpm_rx = r.transferred_bytes[gpm.NVLINK_TOTAL_RX_PER_SEC]
    field_rx = (fields.rx_kib - first_fields.rx_kib) * 1024
    assert field_tx > 0 and field_rx > 0
    assert gpm_tx == pytest.approx(field_tx, rel=1e-3)  # field counters are whole KiB per link
    assert gpm_rx == pytest.approx(field_rx, rel=1e-3)
    assert gpm_tx == pytest.approx(4 * gpm_rx)  # h200x2: GPU 0 sends 1000, receives 250 KiB/s per link


def test_nvlink_traffic_is_asked_of_gpm_only_while_nvlink_throughput_is_off(tmp_path: Path) -> None:
    """With the field counters on, GPM's NVLink bytes would be the same numbers twice."""
    nvlink_ids = {gpm.NVLINK_TOTAL_TX_PER_SEC, gpm.NVLINK_TOTAL_RX_PER_SEC}
    for switches, asked in ((DEFAULT_ON, False), (DEFAULT_ON - {"nvlink_throughput"}, True)):
        clock = Clock(3.0)
        gpu0 = devices(tmp_path, h200x2(), clock, switches)[0]
        gpm.read(gpu0)
        clock.t = 8.0
        r = gpm.read(gpu0)
        assert r is not None
        assert (nvlink_ids <= set(r.transferred_bytes)) is asked, switches
        assert set(gpm.metric_ids(gpu0)) & nvlink_ids == (nvlink_ids if asked else set())
        families = render("gpm", [(gpu0, r)])
        assert ("nvgpu_gpm_nvlink_transmit_bytes_total" in families) is asked


def test_a_failed_sample_keeps_the_older_one_and_the_next_window_spans_both(tmp_path: Path) -> None:
    clock = Clock(0.0)
    scenario = {
        "faults": [{"function": "nvmlGpmSampleGet", "calls": [3], "action": "error", "error": "UNKNOWN"}],
        "gpus": [{"uuid": "GPU-1", **gpm_gpu(**DEFAULT)}],
    }
    dev = devices(tmp_path, scenario, clock, GPM_ALL)[0]
    gpm.read(dev)
    clock.t = 1.0
    assert gpm.read(dev) is not None
    clock.t = 2.0
    assert gpm.read(dev) is None  # call 3 fails: counted, nothing read
    assert dev.client.errors[("gpm", "UNKNOWN")] == 1
    clock.t = 3.0
    r = gpm.read(dev)
    assert r is not None
    assert r.transferred_bytes[gpm.NVLINK_TOTAL_TX_PER_SEC] == 16 * MIB * 3  # no gap in the counter


def test_a_failed_metrics_call_keeps_the_older_sample(tmp_path: Path) -> None:
    clock = Clock(0.0)
    scenario = {
        "faults": [{"function": "nvmlGpmMetricsGet", "calls": [1], "action": "error", "error": "UNKNOWN"}],
        "gpus": [{"uuid": "GPU-1", **gpm_gpu(**DEFAULT)}],
    }
    dev = devices(tmp_path, scenario, clock)[0]
    gpm.read(dev)
    clock.t = 2.0
    assert gpm.read(dev) is None
    clock.t = 4.0
    r = gpm.read(dev)
    assert r is not None and r.transferred_bytes[gpm.PCIE_TX_PER_SEC] == 2 * MIB * 4


# -- absent, never NaN -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        {},  # an old driver: NOT_SUPPORTED
        {"nvmlGpmQueryDeviceSupport": {"isSupportedDevice": 0}},  # pre-Hopper
        {"nvmlGpmQueryDeviceSupport": {"isSupportedDevice": 1}, "nvmlDeviceGetMigMode": [1, 1]},  # MIG on
    ],
    ids=["not_supported", "not_a_gpm_device", "mig_enabled"],
)
def test_unsupported_gpu_reads_nothing_and_is_not_asked_again(tmp_path: Path, values: dict[str, Any]) -> None:
    clock = Clock(0.0)
    dev = device(tmp_path, {"values": {**values, "nvmlGpmMetricsGet": 50.0}}, clock)
    for t in range(4):
        clock.t = float(t)
        assert gpm.read(dev) is None
    assert "gpm" in dev.feature_unsupported and "gpm" not in dev.feature_ok
    counts = fake_of(dev).call_counts()
    assert counts.get("nvmlGpmQueryDeviceSupport") == 1
    assert "nvmlGpmSampleAlloc" not in counts and "nvmlGpmSampleGet" not in counts
    assert render("gpm", [(dev, None)]) == {}


def test_a_metric_the_gpu_does_not_support_is_absent_and_not_asked_again(tmp_path: Path) -> None:
    clock = Clock(0.0)
    metrics = {**DEFAULT, "3": {"error": "NOT_SUPPORTED"}}
    del metrics["60"]  # no value at all: NOT_SUPPORTED too
    dev = device(tmp_path, gpm_gpu(**metrics), clock, GPM_ALL)
    gpm.read(dev)
    clock.t = 1.0
    r = gpm.read(dev)
    assert r is not None and gpm.SM_OCCUPANCY not in r.activity_percent
    assert gpm.NVLINK_TOTAL_RX_PER_SEC not in r.transferred_bytes
    assert ("gpm_metric", 3) in dev.unsupported and ("gpm_metric", 60) in dev.unsupported
    fams = render("gpm", [(dev, r)])
    assert "nvgpu_gpm_sm_occupancy_ratio" not in fams and "nvgpu_gpm_nvlink_receive_bytes_total" not in fams
    assert fams["nvgpu_gpm_sm_activity_ratio"] == {("0", dev.uuid): 0.4}


def test_sampling_that_stops_being_supported_frees_the_buffers(tmp_path: Path) -> None:
    clock = Clock(0.0)
    gpu = gpm_gpu(**DEFAULT)
    gpu["values"]["nvmlGpmSampleGet"] = {
        "sequence": [{"until_s": 2, "value": 0}, {"value": {"error": "NOT_SUPPORTED"}}]
    }
    dev = device(tmp_path, gpu, clock)
    gpm.read(dev)
    clock.t = 1.0
    assert gpm.read(dev) is not None
    assert len(fake_of(dev)._gpm_samples) == 2
    clock.t = 3.0
    assert gpm.read(dev) is None
    assert fake_of(dev)._gpm_samples == {}  # both freed (a second free would abort the fake)
    clock.t = 4.0
    assert gpm.read(dev) is None
    assert fake_of(dev).call_counts()["nvmlGpmSampleGet"] == 3
    assert "gpm" in dev.feature_unsupported and "gpm" not in dev.feature_ok


def test_non_finite_values_are_not_exported(tmp_path: Path) -> None:
    clock = Clock(0.0)
    dev = device(tmp_path, gpm_gpu(**DEFAULT), clock)
    gpm.read(dev)

    original = dev.client.backend._fake.nvmlGpmMetricsGet

    def with_nan(request: Any) -> Any:
        out = original(request)
        out.metrics[0].value = float("nan")
        return out

    dev.client.backend._fake.nvmlGpmMetricsGet = with_nan
    clock.t = 1.0
    r = gpm.read(dev)
    assert r is not None and gpm.GRAPHICS_UTIL not in r.activity_percent and gpm.SM_UTIL in r.activity_percent
    assert dev.client.errors[("gpm", "NOT_FINITE")] == 1


def test_a_gpu_waits_a_bounded_time_for_another_gpus_metrics_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvmlGpmMetricsGet runs one thread at a time (GPM_METRICS_LOCK); a thread stuck inside it must
    cost another GPU only that sample's GPM metrics (counted), never its sampling, and the next
    sample after the lock frees reads normally."""
    monkeypatch.setattr(structs, "GPM_METRICS_WAIT_S", 0.05)
    clock = Clock(0.0)
    dev = device(tmp_path, gpm_gpu(**DEFAULT), clock)
    gpm.read(dev)
    calls: list[Any] = []
    original = dev.client.backend._fake.nvmlGpmMetricsGet

    def counted(request: Any) -> Any:
        calls.append(request)
        return original(request)

    dev.client.backend._fake.nvmlGpmMetricsGet = counted
    clock.t = 1.0
    assert structs.GPM_METRICS_LOCK.acquire(timeout=1)  # another GPU's thread inside the call
    try:
        skipped = gpm.read(dev)
    finally:
        structs.GPM_METRICS_LOCK.release()
    assert calls == [] and dev.client.errors[("gpm", "GPM_LOCK_WAIT")] == 1
    assert skipped is None or not skipped.activity_percent
    clock.t = 2.0
    r = gpm.read(dev)
    assert len(calls) == 1 and r is not None and gpm.SM_UTIL in r.activity_percent


# -- gpm_pipes ---------------------------------------------------------------------------------------


def test_pipes_have_their_own_buffers_and_a_pipe_label(tmp_path: Path) -> None:
    clock = Clock(0.0)
    scenario = h200x2()
    dev = devices(tmp_path, scenario, clock)[0]
    assert gpm_pipes.read(dev) is None and gpm.read(dev) is None
    clock.t = 7.5  # loaded phase
    pipes, core = gpm_pipes.read(dev), gpm.read(dev)
    assert pipes is not None and core is not None
    assert len(fake_of(dev)._gpm_samples) == 4  # two per feature
    fams = render("gpm_pipes", [(dev, pipes)])
    by_pipe = {labels[2]: v for labels, v in fams["nvgpu_gpm_pipe_activity_ratio"].items()}
    assert by_pipe == pytest.approx({"hmma": 0.827, "imma": 0, "dmma": 0, "dfma": 0, "fp64": 0, "fp32": 0, "fp16": 0})
    assert set(fams) == {"nvgpu_gpm_pipe_activity_ratio"}


def test_reading_survives_the_wire(tmp_path: Path) -> None:
    clock = Clock(0.0)
    dev = device(tmp_path, gpm_gpu(**DEFAULT), clock)
    gpm.read(dev)
    clock.t = 1.0
    r = gpm.read(dev)
    assert wire(r) == r


# -- the real binding's structures, without a GPU -----------------------------------------------------


class _FakeLibrary:
    """Stands in for libnvidia-ml through pynvml's function-pointer lookup: C callbacks that read and
    write the very structures pynvml passes (layout, version field, by-reference passing)."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, int, list[int]]] = []
        self.fabric_versions: list[int] = []
        self._keep: list[Any] = []

    def metrics_get(self, address: int) -> int:
        request = ctypes.cast(address, ctypes.POINTER(pynvml.c_nvmlGpmMetricsGet_t)).contents
        ids = [int(request.metrics[i].metricId) for i in range(request.numMetrics)]
        self.requests.append((int(request.version), int(request.numMetrics), ids))
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION or not request.sample1 or not request.sample2:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        for i, metric_id in enumerate(ids):
            entry = request.metrics[i]
            if metric_id == 3:
                entry.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                entry.nvmlReturn, entry.value = pynvml.NVML_SUCCESS, metric_id * 1.5
        return pynvml.NVML_SUCCESS

    def fabric(self, device: int, address: int) -> int:
        version = ctypes.cast(address, ctypes.POINTER(ctypes.c_uint)).contents.value
        self.fabric_versions.append(version)
        if version >> 24 == 3:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH  # a driver that knows only v2
        info = ctypes.cast(address, ctypes.POINTER(pynvml.c_nvmlGpuFabricInfo_v2_t)).contents
        info.state, info.status = pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, 0
        return pynvml.NVML_SUCCESS

    def lookup(self, name: str) -> Any:
        if name == "nvmlGpmMetricsGet":
            fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(self.metrics_get)
        elif name == "nvmlDeviceGetGpuFabricInfoV":
            fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(self.fabric)
        else:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        self._keep.append(fn)
        return fn


@pytest.fixture
def real_device(monkeypatch: pytest.MonkeyPatch) -> tuple[DeviceClient, _FakeLibrary]:
    library = _FakeLibrary()
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", library.lookup)
    client = NvmlClient(RealNvml(), BreadcrumbWriter(None))
    return DeviceClient(client, 0, "GPU-real", ctypes.c_void_p(0x1234)), library


def test_real_binding_metrics_request_is_what_nvml_expects(real_device: tuple[DeviceClient, _FakeLibrary]) -> None:
    dev, library = real_device
    buffers = [ctypes.create_string_buffer(16) for _ in range(2)]
    s1, s2 = (ctypes.cast(b, pynvml.c_nvmlGpmSample_t) for b in buffers)
    got = structs.gpm_metrics(dev, "gpm", s1, s2, gpm.METRIC_IDS)
    assert library.requests == [(1, len(gpm.METRIC_IDS), list(gpm.METRIC_IDS))]
    assert got == {m: m * 1.5 for m in gpm.METRIC_IDS if m != 3}
    assert ("gpm_metric", 3) in dev.unsupported
    structs.gpm_metrics(dev, "gpm", s1, s2, gpm.METRIC_IDS)
    assert library.requests[1][2] == [m for m in gpm.METRIC_IDS if m != 3]  # not asked again


def test_real_binding_fabric_falls_back_to_v2_once(real_device: tuple[DeviceClient, _FakeLibrary]) -> None:
    dev, library = real_device
    from exporter.common.collectors import fabric

    r1, r2 = fabric.read(dev), fabric.read(dev)
    # our own struct layouts through pynvml's real wrapper and by-reference passing
    assert r1 == r2 == fabric.Reading(2, 0, 2, 0, "00000000-0000-0000-0000-000000000000", 0, None)
    assert library.fabric_versions == [
        pynvml.nvmlGpuFabricInfo_v3,
        pynvml.nvmlGpuFabricInfo_v2,
        pynvml.nvmlGpuFabricInfo_v2,
    ]


def test_metrics_are_computed_one_thread_at_a_time_on_the_real_exporter(tmp_path: Path) -> None:
    """The real library's nvmlGpmMetricsGet is not reentrant: two GPU threads inside it at once
    ended the worker with SIGSEGV on the H200 pair (docs/validation/2026-11-30-h200x2/
    gpm-concurrency.md). The fake crashes the same way; eight GPUs sampled every 0.2 s for a few
    seconds must neither crash nor lose a GPU, and every GPU gets its GPM ratios."""
    from exporter_proc import SCENARIOS, Exporter

    with Exporter(SCENARIOS / "h200x8.json", tmp_path, interval=0.2) as exp:
        first = exp.wait_for(
            lambda s: len(s.find("nvgpu_gpm_sm_activity_ratio")) == 8, timeout=30, what="GPM ratios on all 8 GPUs"
        )
        t0 = first.value("nvgpu_last_sample_timestamp_seconds") or 0.0
        last = exp.wait_for(
            lambda s: (s.value("nvgpu_last_sample_timestamp_seconds") or 0.0) > t0 + 3.0, timeout=30, what="3 s more"
        )
        assert sum(s.value for s in last.find("nvgpu_worker_restarts_total")) == 0, exp.logs()[-3000:]
        assert {s.labels["gpu"] for s in last.find("nvgpu_device_state", state="up") if s.value == 1.0} == {
            str(i) for i in range(8)
        }
        assert len(last.find("nvgpu_gpm_sm_activity_ratio")) == 8
        assert exp.terminate() == 0
