"""On real GPUs: GPM profiling, throttle time, power scope, fabric state, and their cost.

Run on a machine with one or two H200s (PyTorch installed; the project installed with
``pip install --no-deps --no-build-isolation -e .``)::

    NVGPU_HW_OUT=$OUT/hw python3 -m pytest -q -p no:cacheprovider tests/hardware/test_profiling.py -rs

Skips cleanly without a GPU (and the PyTorch parts without PyTorch; the NVLink part without two
peer-connected GPUs). About 1.5 minutes. Writes under ``$NVGPU_HW_OUT`` (when set):

- ``gpm_idle.json``: every GPM series of the exporter per GPU with the GPUs idle (expected about 0);
- ``gpm_matmul.json``: the same under a bf16 8192x8192 matmul loop on every GPU (expected SM
  activity > 0.8, tensor > 0.6), with utilization, power by scope and the increase of each
  clock-event-reason time counter over the load window;
- ``gpm_nvlink.json`` (two GPUs): a 1 GiB cuda:0 -> cuda:1 copy loop between two idle moments; the
  increase of the GPM NVLink byte counter against the NVLink byte counters (fields 138/139, all
  links, read by this test) and the bytes the loop copied (expected within 5 %). The exporter runs
  with ``nvlink_throughput`` off, as on H20 / 580: only then does it ask GPM for NVLink traffic
;
- ``cost.json``: per GPU, medians of 20 calls, measured in this process with pynvml:
  nvmlGpmSampleGet, nvmlGpmMetricsGet for the gpm feature's 9 metrics, gpm_pipes' 7 and both
  (16), the throttle-time field call (11 fields) against 8 nvmlDeviceGetViolationStatus calls,
  the power-scope field call, nvmlDeviceGetGpuFabricInfoV; and the exporter's own
  nvgpu_feature_duration_seconds per feature (all GPUs, one sample);
- ``scope_fabric_ecc.json``: power by scope from the exporter and from fields 185/186 for scopes
  0-2, the energy counter's rate against GPU power over the window (which scope the energy covers),
  fabric state/status/health (v3), ECC mode current/pending, the driver and binding versions.

The exporter runs as README says (``python -m exporter``, real NVML, 1 s sample interval,
``NVGPU_FEATURE_GPM_PIPES=on``, ``NVGPU_FEATURE_NVLINK_THROUGHPUT=off``) for the whole module.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from exporter_proc import Exporter, Scrape

from tests.hardware.conftest import GPU_COUNT

INTERVAL = 1.0
GPM_GAUGES = (
    "nvgpu_gpm_graphics_activity_ratio",
    "nvgpu_gpm_sm_activity_ratio",
    "nvgpu_gpm_sm_occupancy_ratio",
    "nvgpu_gpm_tensor_activity_ratio",
    "nvgpu_gpm_dram_bandwidth_ratio",
)
GPM_COUNTERS = (
    "nvgpu_gpm_pcie_transmit_bytes_total",
    "nvgpu_gpm_pcie_receive_bytes_total",
    "nvgpu_gpm_nvlink_transmit_bytes_total",
    "nvgpu_gpm_nvlink_receive_bytes_total",
)
GPM_IDS = (1, 2, 3, 5, 10, 20, 21, 60, 61)  # exporter/common/collectors/gpm.py
PIPE_IDS = (7, 9, 8, 6, 11, 12, 13)  # exporter/common/collectors/gpm_pipes.py
THROTTLE_FIELDS = (74, 75, 76, 77, 78, 79, 80, 81, 269, 270, 271)
VIOLATION_POLICIES = (0, 1, 2, 3, 4, 5, 10, 11)


def _record(name: str, data: object) -> None:
    out = os.environ.get("NVGPU_HW_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, f"{name}.json").write_text(json.dumps(data, indent=1, default=str))


@pytest.fixture(scope="module")
def exp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exporter]:
    tmp = tmp_path_factory.mktemp("profiling")
    env = {"NVGPU_NVML_BACKEND": "nvml", "NVGPU_FEATURE_GPM_PIPES": "on", "NVGPU_FEATURE_NVLINK_THROUGHPUT": "off"}
    with Exporter(None, tmp, env=env, interval=INTERVAL) as e:
        e.wait_for(
            lambda s: s.value("nvgpu_up") == 1.0 and len(s.find("nvgpu_gpm_sm_activity_ratio")) == GPU_COUNT,
            timeout=60,
            what="GPM series for every GPU",
        )
        yield e
        assert e.terminate() == 0


def _gpus(scrape: Scrape) -> list[str]:
    return sorted({s.labels["gpu"] for s in scrape.find("nvgpu_gpu_info")}, key=int)


def _per_gpu(scrape: Scrape, gpu: str) -> dict[str, Any]:
    """Every GPM, utilization, power and throttle series of one GPU, by name (and label)."""
    out: dict[str, Any] = {}
    for s in scrape.samples:
        if s.labels.get("gpu") != gpu:
            continue
        if s.name.startswith(("nvgpu_gpm_", "nvgpu_gpu_utilization", "nvgpu_memory_copy_utilization")) or (
            "power_usage_watts" in s.name
        ):
            extra = s.labels.get("pipe")
            out[s.name + (f"{{pipe={extra}}}" if extra else "")] = s.value
        elif s.name == "nvgpu_clock_event_reason_seconds_total":
            out.setdefault("clock_event_reason_seconds", {})[s.labels["reason"]] = s.value
    return out


def _fresh(exp: Exporter, after: float) -> Scrape:
    """A scrape whose sample started at least one full interval after ``after`` (a whole GPM window)."""
    return exp.wait_for(
        lambda s: (s.value("nvgpu_last_sample_timestamp_seconds") or 0) >= after + INTERVAL,
        timeout=30,
        what="a sample after the load started",
    )


def _cuda_to_nvml(torch: Any, scrape: Scrape) -> dict[int, str]:
    bus = {s.labels["pci_bus_id"].lower()[-12:]: s.labels["gpu"] for s in scrape.find("nvgpu_gpu_info")}
    out = {}
    for dev in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(dev)
        key = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        out[dev] = bus[key[-12:]]
    return out


class _Loop:
    """Run ``body(stop)`` in one thread per argument until stopped."""

    def __init__(self, body: Callable[[Any, threading.Event], None], args: list[Any]) -> None:
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

        def run(arg: Any) -> None:
            try:
                body(arg, self.stop)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)

        self.threads = [threading.Thread(target=run, args=(a,), daemon=True) for a in args]

    def __enter__(self) -> _Loop:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        assert not self.errors, self.errors


# -- 1. idle -----------------------------------------------------------------------------------------


def test_gpm_idle_reads_about_zero(exp: Exporter) -> None:
    time.sleep(3 * INTERVAL)
    scrape = exp.scrape()
    rows = {gpu: _per_gpu(scrape, gpu) for gpu in _gpus(scrape)}
    _record("gpm_idle", rows)
    for gpu, row in rows.items():
        for name in GPM_GAUGES:
            assert row[name] < 0.05, (gpu, name, row[name])
        pipes = {k: v for k, v in row.items() if k.startswith("nvgpu_gpm_pipe_activity_ratio")}
        assert len(pipes) == 7 and all(v < 0.05 for v in pipes.values()), (gpu, pipes)


# -- 2. matmul -----------------------------------------------------------------------------------------


def test_gpm_under_a_matmul_load(exp: Exporter) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    n = torch.cuda.device_count()

    def matmul(dev: int, stop: threading.Event) -> None:
        a = torch.randn(8192, 8192, device=f"cuda:{dev}", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=f"cuda:{dev}", dtype=torch.bfloat16)
        while not stop.is_set():
            for _ in range(8):
                a @ b  # noqa: B018 - the work is the point
            torch.cuda.synchronize(dev)

    with _Loop(matmul, list(range(n))):
        time.sleep(4.0)  # ramp up clocks and power
        start = time.time()
        before = _fresh(exp, start)
        time.sleep(6.0)
        after = exp.scrape()
    window = (after.value("nvgpu_last_sample_timestamp_seconds") or 0) - (
        before.value("nvgpu_last_sample_timestamp_seconds") or 0
    )
    rows = {}
    for gpu in _gpus(after):
        row = _per_gpu(after, gpu)
        b = _per_gpu(before, gpu).get("clock_event_reason_seconds", {})
        row["clock_event_reason_share_of_window"] = {
            reason: (v - b.get(reason, 0.0)) / window for reason, v in row.get("clock_event_reason_seconds", {}).items()
        }
        rows[gpu] = row
    _record("gpm_matmul", {"window_s": window, "gpus": rows})
    for gpu, row in rows.items():
        assert row["nvgpu_gpm_sm_activity_ratio"] > 0.8, (gpu, row)
        assert row["nvgpu_gpm_tensor_activity_ratio"] > 0.6, (gpu, row)


# -- 3. NVLink: GPM against the byte counters ------------------------------------------------------------


def _sum(scrape: Scrape, name: str, gpu: str) -> float:
    return sum(s.value for s in scrape.find(name, gpu=gpu))


@pytest.mark.skipif(GPU_COUNT < 2, reason="needs two NVLink-connected GPUs")
def _nvlink_kib(gpus: list[str]) -> dict[str, dict[int, int]]:
    """Fields 138/139 with the all-links scope, read in this process: GPU -> field -> KiB."""
    from exporter.worker.nvml.backend import RealNvml

    nvml = RealNvml()
    nvml.nvmlInit()
    try:
        out = {}
        for gpu in gpus:
            handle = nvml.nvmlDeviceGetHandleByIndex(int(gpu))
            entries = nvml.field_values(handle, [(138, 0xFFFFFFFF), (139, 0xFFFFFFFF)])
            assert all(e.code == 0 for e in entries), entries
            out[gpu] = {e.field_id: int(e.value) for e in entries}
        return out
    finally:
        nvml.nvmlShutdown()


def test_gpm_nvlink_agrees_with_the_nvlink_counters(exp: Exporter) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2 or not torch.cuda.can_device_access_peer(0, 1):
        pytest.skip("no peer access between cuda:0 and cuda:1")
    nvml = _cuda_to_nvml(torch, exp.scrape())
    src, dst = nvml[0], nvml[1]
    copied = [0]

    def copy(_: int, stop: threading.Event) -> None:
        chunk = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
        target = torch.empty_like(chunk, device="cuda:1")
        while not stop.is_set():
            target.copy_(chunk)
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
            copied[0] += chunk.numel()

    # Idle before and after the copy: GPM's windows (between the exporter's samples) and the field
    # counters (read here) then see the same traffic whatever their phase.
    before = _fresh(exp, time.time())
    fields_before = _nvlink_kib([src, dst])
    with _Loop(copy, [0]):
        time.sleep(8.0)
    time.sleep(1.0)
    after = _fresh(exp, time.time())
    fields_after = _nvlink_kib([src, dst])
    window = (after.value("nvgpu_last_sample_timestamp_seconds") or 0) - (
        before.value("nvgpu_last_sample_timestamp_seconds") or 0
    )
    result: dict[str, Any] = {"src_gpu": src, "dst_gpu": dst, "window_s": window}
    for label, gpu, gpm_name, field_id in (
        ("src_tx", src, "nvgpu_gpm_nvlink_transmit_bytes_total", 138),
        ("dst_rx", dst, "nvgpu_gpm_nvlink_receive_bytes_total", 139),
        ("dst_tx", dst, "nvgpu_gpm_nvlink_transmit_bytes_total", 138),
        ("src_rx", src, "nvgpu_gpm_nvlink_receive_bytes_total", 139),
    ):
        g = _sum(after, gpm_name, gpu) - _sum(before, gpm_name, gpu)
        f = (fields_after[gpu][field_id] - fields_before[gpu][field_id]) * 1024
        result[label] = {"gpm_bytes": g, "field_bytes": f, "ratio": g / f if f else None}
    result["copied_bytes"] = copied[0]
    _record("gpm_nvlink", result)
    # The copy may show as the source's TX and destination's RX, or the reverse (reads): take the
    # direction with the data, as tests/hardware/test_real_gpu.py does.
    tx = max((result["src_tx"], result["dst_tx"]), key=lambda r: r["field_bytes"])
    rx = max((result["dst_rx"], result["src_rx"]), key=lambda r: r["field_bytes"])
    for r in (tx, rx):
        assert r["field_bytes"] > 1 << 30, result
        assert abs(r["gpm_bytes"] - r["field_bytes"]) <= 0.05 * r["field_bytes"], result


# -- 4. cost ------------------------------------------------------------------------------------------------


def _median_ms(fn: Callable[[], Any], n: int = 20) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


_REAL: list[Any] = []


def _field_call(handle: Any, pairs: list[tuple[int, int]]) -> list[tuple[int, int | float | None]]:
    """The exporter's own field-value call (sentinel-filled, one longer, each entry decoded)."""
    if not _REAL:
        from exporter.worker.nvml.backend import RealNvml

        _REAL.append(RealNvml())
    return [(e.code, e.value) for e in _REAL[0].field_values(handle, pairs)]


def _gpm_cost(pynvml: Any, h: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"gpm_supported": pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice}
    s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    try:
        pynvml.nvmlGpmSampleGet(h, s1)
        time.sleep(0.2)
        row["gpm_sample_get_ms"] = _median_ms(lambda: pynvml.nvmlGpmSampleGet(h, s2))

        def metrics(ids: tuple[int, ...]) -> Any:
            req = pynvml.c_nvmlGpmMetricsGet_t()
            req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(ids)
            req.sample1, req.sample2 = s1, s2
            for k, m in enumerate(ids):
                req.metrics[k].metricId = m
            return pynvml.nvmlGpmMetricsGet(req)

        row["gpm_metrics_get_gpm_9_ms"] = _median_ms(lambda: metrics(GPM_IDS))
        row["gpm_metrics_get_pipes_7_ms"] = _median_ms(lambda: metrics(PIPE_IDS))
        row["gpm_metrics_get_both_16_ms"] = _median_ms(lambda: metrics(GPM_IDS + PIPE_IDS))
        got = metrics(GPM_IDS + PIPE_IDS)
        row["gpm_values"] = {
            int(got.metrics[k].metricId): [int(got.metrics[k].nvmlReturn), float(got.metrics[k].value)]
            for k in range(got.numMetrics)
        }
    finally:
        pynvml.nvmlGpmSampleFree(s1)
        pynvml.nvmlGpmSampleFree(s2)
    return row


def _other_cost(pynvml: Any, h: Any) -> dict[str, Any]:
    row: dict[str, Any] = {}
    pairs = [(f, 0) for f in THROTTLE_FIELDS]
    row["throttle_fields_11_ms"] = _median_ms(lambda: _field_call(h, pairs))
    row["throttle_fields"] = dict(zip(THROTTLE_FIELDS, _field_call(h, pairs), strict=True))

    def violations() -> list[int | str]:
        out: list[int | str] = []
        for policy in VIOLATION_POLICIES:
            try:
                out.append(int(pynvml.nvmlDeviceGetViolationStatus(h, policy).violationTime))
            except pynvml.NVMLError as exc:
                out.append(f"error {exc.value}")
        return out

    row["violation_status_8_calls_ms"] = _median_ms(violations)
    row["violation_status_ns"] = dict(zip(VIOLATION_POLICIES, violations(), strict=True))
    scoped = [(185, 1), (185, 2)]
    row["power_scope_fields_ms"] = _median_ms(lambda: _field_call(h, scoped))
    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    try:
        row["fabric_info_v3_ms"] = _median_ms(lambda: pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info)))
    except pynvml.NVMLError as exc:
        row["fabric_info_v3_ms"] = f"error {exc.value}"
    return row


def test_cost_per_gpu(exp: Exporter) -> None:
    pynvml = pytest.importorskip("pynvml")
    pynvml.nvmlInit()
    try:
        rows = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            rows.append({"index": i, **_gpm_cost(pynvml, h), **_other_cost(pynvml, h)})
    finally:
        pynvml.nvmlShutdown()
    scrape = exp.scrape()
    durations = {s.labels["feature"]: s.value for s in scrape.find("nvgpu_feature_duration_seconds")}
    _record(
        "cost",
        {
            "gpus": rows,
            "exporter_feature_duration_seconds_all_gpus": durations,
            "exporter_sample_duration_seconds": scrape.value("nvgpu_sample_duration_seconds"),
            "gpu_count": GPU_COUNT,
        },
    )
    for row in rows:
        assert row["gpm_supported"] == 1
        assert all(code == 0 for code, _ in row["throttle_fields"].values()), row["throttle_fields"]
    assert {"gpm", "gpm_pipes", "throttle_time", "power"} <= set(durations)


# -- 5. power scope, fabric, ECC mode ------------------------------------------------------------------------


def test_power_scope_fabric_and_ecc(exp: Exporter) -> None:
    pynvml = pytest.importorskip("pynvml")
    first = exp.scrape()
    time.sleep(10.0)
    last = exp.scrape()
    window = (last.value("nvgpu_last_sample_timestamp_seconds") or 0) - (
        first.value("nvgpu_last_sample_timestamp_seconds") or 0
    )
    pynvml.nvmlInit()
    try:
        direct = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            fields = {
                f"{fid}:{scope}": list(_field_call(h, [(fid, scope)])[0]) for fid in (185, 186) for scope in (0, 1, 2)
            }
            info = pynvml.c_nvmlGpuFabricInfo_v3_t()
            try:
                pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
                fabric: Any = {
                    "state": info.state,
                    "status": info.status,
                    "cliqueId": info.cliqueId,
                    "healthMask": info.healthMask,
                    "healthSummary": info.healthSummary,
                }
            except pynvml.NVMLError as exc:
                fabric = f"error {exc.value}"
            direct.append(
                {
                    "index": i,
                    "power_fields_185_186_by_scope": fields,
                    "power_usage_mw": pynvml.nvmlDeviceGetPowerUsage(h),
                    "fabric_v3": fabric,
                    "ecc_mode": list(pynvml.nvmlDeviceGetEccMode(h)),
                }
            )
        versions = {
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "nvml": pynvml.nvmlSystemGetNVMLVersion(),
            "nvidia_ml_py": metadata.version("nvidia-ml-py"),
        }
    finally:
        pynvml.nvmlShutdown()
    rows = {}
    for gpu in _gpus(last):
        e0 = first.value("nvgpu_energy_consumption_joules_total", gpu=gpu) or 0.0
        e1 = last.value("nvgpu_energy_consumption_joules_total", gpu=gpu) or 0.0
        rows[gpu] = {
            "power_usage_watts": last.value("nvgpu_power_usage_watts", gpu=gpu),
            "memory_power_usage_watts": last.value("nvgpu_memory_power_usage_watts", gpu=gpu),
            "module_power_usage_watts": last.value("nvgpu_module_power_usage_watts", gpu=gpu),
            "energy_rate_watts_over_window": (e1 - e0) / window if window else None,
            "fabric_state": last.value("nvgpu_fabric_state", gpu=gpu),
            "fabric_status": last.value("nvgpu_fabric_status", gpu=gpu),
            "ecc_enabled": last.value("nvgpu_ecc_enabled", gpu=gpu),
            "ecc_pending_enabled": last.value("nvgpu_ecc_pending_enabled", gpu=gpu),
        }
    _record("scope_fabric_ecc", {"window_s": window, "exporter": rows, "direct": direct, "versions": versions})
    for gpu, row in rows.items():
        assert row["module_power_usage_watts"] is None, (gpu, row)  # x86 H200: no module scope (measured)
        assert row["memory_power_usage_watts"] is not None and row["memory_power_usage_watts"] > 0, (gpu, row)
        if row["fabric_state"] is not None:
            assert row["fabric_state"] in (1.0, 2.0, 3.0), row
