"""The processes collector on the fake backend, in-process: validation and struct fallback, the
last-seen timestamp, the per-process cap, churn, per-pod sums from a fake /proc, rendering.

The worker subprocess runs the same code in tests/test_process_usage.py; here the device client is
built directly so that NVML calls, caches and log lines can be inspected.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fakeproc import CONTAINER_PID_NS, Container, make_container_logs, make_proc
from prometheus_client.parser import text_string_to_metric_families

from exporter.common import plausibility
from exporter.common.breadcrumb import BreadcrumbWriter
from exporter.common.collectors import process_reads, processes
from exporter.common.logs import _once_keys
from exporter.common.metric import GpuKey
from exporter.common.workerconfig import CollectorOptions, ProcessOptions
from exporter.worker.nvml.backend import FakeBackend
from exporter.worker.nvml.client import ApiChoices, DeviceClient, NvmlClient

UUID = "GPU-820f4b2d-da15-c9b7-3ba6-c396976ca722"
TOTAL = 150_754_820_096
NOT_MIG = 0xFFFFFFFF
V3, V2 = process_reads.VARIANTS["compute"]
UTIL = process_reads.UTILIZATION_FUNCTION


def rec(pid: int, mem: int | None = 1 << 30) -> dict[str, Any]:
    return {"pid": pid, "usedGpuMemory": mem, "gpuInstanceId": NOT_MIG, "computeInstanceId": NOT_MIG}


TRUTH = [rec(1184, 3 << 30), rec(16040, 7 << 30), rec(16041, (1 << 30) + 0x1234), rec(16042, 512 << 20)]


class Gpu:
    """A fake GPU behind a real NvmlClient/DeviceClient, recording the utilization timestamps asked."""

    def __init__(self, tmp_path: Path, values: dict[str, Any], options: dict[str, Any] | None = None, **top: Any):
        tmp_path.mkdir(parents=True, exist_ok=True)
        path = tmp_path / "scenario.json"
        values = {"nvmlDeviceGetMemoryInfo": {"total": TOTAL, "free": TOTAL, "used": 0}, **values}
        path.write_text(json.dumps({"gpus": [{"uuid": UUID, "values": values}], **top}))
        self.backend = FakeBackend(str(path))
        self.asked: list[int] = []
        real = self.backend._fake.nvmlDeviceGetProcessUtilization

        def recording(handle: Any, ts: int) -> Any:
            self.asked.append(ts)
            return real(handle, ts)

        self.backend._fake.nvmlDeviceGetProcessUtilization = recording  # type: ignore[method-assign]
        # options: ProcessOptions fields, and per_process / per_pod for the switches the worker
        # would have on (process_usage / pod_attribution in dev.enabled)
        opts = {
            "proc_path": str(tmp_path / "no-proc"),
            "container_log_dir": str(tmp_path / "no-logs"),
            **(options or {}),
        }
        switches = {
            processes.PROCESS_USAGE: opts.pop("per_process", False),
            processes.POD_ATTRIBUTION: opts.pop("per_pod", False),
        }
        self.client = NvmlClient(
            self.backend, BreadcrumbWriter(None), options=CollectorOptions(processes=ProcessOptions(**opts))
        )
        self.client.raw("t", "nvmlInit", "")
        self.dev = DeviceClient(self.client, 0, UUID, self.client.raw("t", "nvmlDeviceGetHandleByIndex", "", 0))
        self.dev.enabled = frozenset(name for name, on in switches.items() if on)

    def read(self) -> processes.Reading:
        r = processes.read(self.dev)
        assert r is not None
        return r

    def calls(self, fn: str) -> int:
        return int(self.backend._fake.call_counts().get(fn, 0))


@pytest.fixture
def fresh_log_once() -> None:
    """For a test that counts log lines: forget what earlier tests logged once."""
    _once_keys.clear()


@pytest.mark.usefixtures("fresh_log_once")
def test_r535_misread_v3_falls_back_to_v2_for_good(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    gpu = Gpu(tmp_path, {V3: {"struct": "r535_v3", "records": TRUTH}, V2: TRUTH})
    with caplog.at_level(logging.WARNING):
        first = gpu.read()
        second = gpu.read()
    assert first.count == 4 and first.memory_used_bytes == sum(r["usedGpuMemory"] for r in TRUTH)
    assert first.functions["compute"] == V2 and first.fallbacks == {"compute": "records_invalid"}
    assert set(first.dropped) and set(first.dropped) <= {"pid_zero", "pid_not_available", "pid_above_max", "malformed"}
    assert second.dropped == first.dropped  # _v3 is not asked again: nothing new dropped
    assert gpu.calls(V3) == 1 and gpu.calls(V2) == 2
    warnings = [r for r in caplog.records if "failed validation" in r.getMessage()]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert V3 in text and V2 in text and "nvidia-ml-py 13." in text and "driver 580.159.04" in text
    assert "535.43-535.86" in text


@pytest.mark.usefixtures("fresh_log_once")
def test_swapped_records_without_a_clean_alternative_are_dropped_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = {"struct": "swapped", "records": [rec(9980, 6_498_025_472)]}
    gpu = Gpu(tmp_path, {V3: spec, V2: spec})
    with caplog.at_level(logging.WARNING):
        readings = [gpu.read() for _ in range(3)]
    assert [r.count for r in readings] == [0, 0, 0]
    # counted once per sample: _v2 is tried each time but only the list in use counts
    assert [r.dropped for r in readings] == [{"pid_above_max": n} for n in (1, 2, 3)]
    assert gpu.calls(V3) == 3 and gpu.calls(V2) == 3
    assert readings[0].functions["compute"] == V3 and not readings[0].fallbacks
    assert len([r for r in caplog.records if "failed validation" in r.getMessage()]) == 1


def test_missing_v3_symbol_uses_v2_and_says_why(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path, {V2: TRUTH[:1]}, missing_functions=[V3])
    r = gpu.read()
    assert r.count == 1 and r.functions["compute"] == V2 and r.fallbacks == {"compute": "function_not_found"}
    assert gpu.dev.state_of(ApiChoices).calls["compute_processes"] == (V2, "", "function_not_found")


def test_memory_above_the_gpu_total_is_dropped(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path, {V3: [rec(10, TOTAL + 1), rec(11, 5)]})
    r = gpu.read()
    assert r.count == 1 and r.memory_used_bytes == 5 and r.dropped == {"memory_above_total": 1}


def test_compute_list_error_gives_no_reading(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path, {V3: {"error": "UNKNOWN"}})
    assert processes.read(gpu.dev) is None
    assert gpu.client.errors[("processes", "UNKNOWN")] == 1


def test_utilization_asks_for_samples_newer_than_the_last_seen(tmp_path: Path) -> None:
    samples = [
        {"pid": 1184, "timeStamp": 1_000, "smUtil": 90, "memUtil": 20, "encUtil": 0, "decUtil": 0},
        {"pid": 1184, "timeStamp": 2_000, "smUtil": 95, "memUtil": 21, "encUtil": 1, "decUtil": 2},
    ]
    gpu = Gpu(tmp_path, {V3: TRUTH[:2], UTIL: samples}, {"per_process": True})
    first = gpu.read()
    assert first.processes[1184] == (3 << 30, 95, 21, 1, 2)  # the latest sample
    assert first.processes[16040] == (7 << 30, 0, 0, 0, 0)  # no sample: idle since the last read
    second = gpu.read()  # nothing newer than 2000: NOT_FOUND, which is "idle", not an error
    assert second.processes[1184] == (3 << 30, 0, 0, 0, 0)
    assert gpu.asked == [0, 2000]
    assert not gpu.client.errors
    assert second.functions["utilization"] == UTIL


def test_utilization_unsupported_is_asked_once_and_leaves_utilization_unknown(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path, {V3: TRUTH[:1], UTIL: {"error": "NOT_SUPPORTED"}}, {"per_process": True})
    for _ in range(3):
        r = gpu.read()
    assert r.processes[1184] == (3 << 30, None, None, None, None)
    assert "utilization" not in r.functions and gpu.asked == [0]


def test_utilization_is_not_asked_when_nothing_needs_it(tmp_path: Path) -> None:
    """Default options (no per-process series, no pod found for any process): 2.7 ms per GPU saved."""
    gpu = Gpu(tmp_path, {V3: TRUTH, UTIL: {"per_process": {"smUtil": 5}}}, {"per_pod": True})
    gpu.read()
    gpu2 = Gpu(tmp_path / "b", {V3: [], UTIL: {"per_process": {"smUtil": 5}}}, {"per_process": True})
    gpu2.read()
    assert gpu.asked == [] and gpu2.asked == []


def test_the_cap_keeps_the_largest_processes_and_sums_the_rest(tmp_path: Path) -> None:
    procs = [rec(1000 + i, (i + 1) << 20) for i in range(40)]
    gpu = Gpu(
        tmp_path,
        {V3: procs, UTIL: {"per_process": {"smUtil": 2, "memUtil": 1}}},
        {"per_process": True, "series_per_gpu": 16},
    )
    r = gpu.read()
    assert sorted(r.processes) == list(range(1024, 1040))  # the 16 largest
    n = 24
    assert r.other == (n, sum((i + 1) << 20 for i in range(n)), 2 * n, n, 0, 0)
    assert set(r.labels) == set(r.processes)


def test_churning_processes_stay_bounded(tmp_path: Path) -> None:
    """1000 short-lived processes over 10 s of scenario time, read 200 times: each reading holds at
    most the cap plus one summed row, and nothing the collector keeps grows with churn."""
    clock = [0.0]
    spec = {"churn": {"first_pid": 20000, "per_s": 100, "lifetime_s": 0.5, "used_bytes": 1 << 20, "count": 1000}}
    gpu = Gpu(
        tmp_path,
        {V3: spec, UTIL: {"per_process": {"smUtil": 1}}},
        {"per_process": True, "per_pod": True, "series_per_gpu": 8},
    )
    gpu.backend._fake._scenario_clock = lambda: clock[0]
    seen: set[int] = set()
    for step in range(200):
        clock[0] = step * 0.05
        r = gpu.read()
        assert len(r.processes) <= 8 and len(r.labels) <= 8
        assert r.other is None or r.other[0] == r.count - 8
        seen.update(r.processes)
    assert len(seen) > 100  # the series really churned
    state = gpu.dev.state_of(process_reads.State)
    assert len(state.dropped) == 0 and len(state.start) == 0
    assert state.host is not None and len(state.host.logs) == 0


def test_per_pod_sums_on_a_time_sliced_gpu(tmp_path: Path) -> None:
    """Two pods share the GPU (time-slicing); the sidecar of one and a host daemon also show up."""
    a, a_side, b = (
        Container("ml", "notebook-1", "jupyter"),
        Container("ml", "notebook-1", "sidecar"),
        Container("research", "notebook-2", "jupyter"),
    )
    proc = make_proc(
        tmp_path / "proc", {101: ("python3", a), 102: ("python3", a_side), 201: ("python", b), 301: ("Xorg", None)}
    )
    logs = make_container_logs(tmp_path / "containers", [a, a_side, b])
    values = {
        V3: [rec(101, 3 << 30), rec(201, 7 << 30), rec(301, 1 << 20)],
        "nvmlDeviceGetGraphicsRunningProcesses_v3": [rec(102, 1 << 30), rec(301, 1 << 20)],
        UTIL: [
            {"pid": 101, "smUtil": 10, "memUtil": 1, "encUtil": 0, "decUtil": 0},
            {"pid": 102, "smUtil": 5, "memUtil": 1, "encUtil": 0, "decUtil": 0},
            {"pid": 201, "smUtil": 80, "memUtil": 30, "encUtil": 0, "decUtil": 0},
        ],
    }
    gpu = Gpu(
        tmp_path, values, {"per_pod": True, "per_process": True, "proc_path": str(proc), "container_log_dir": str(logs)}
    )
    r = gpu.read()
    assert r.pods == {a.uid: (4 << 30, 15, 2), b.uid: (7 << 30, 80, 1)}
    assert r.pod_names == {a.uid: ("ml", "notebook-1"), b.uid: ("research", "notebook-2")}
    assert r.sources == {"proc": 1, "container_logs": 1}
    assert r.labels[101] == ("python3", "ml", "notebook-1", "jupyter")
    assert r.labels[102] == ("python3", "ml", "notebook-1", "sidecar")
    assert r.labels[301] == ("Xorg", "", "", "")
    assert r.count == 3  # compute list only, as before


def test_without_host_pid_nothing_resolves(tmp_path: Path) -> None:
    """The exporter's own PID namespace: NVML's pids are not in /proc, no pod, no utilization call."""
    proc = make_proc(tmp_path / "proc", {}, pid_namespace=CONTAINER_PID_NS)
    gpu = Gpu(tmp_path, {V3: TRUTH, UTIL: {"per_process": {"smUtil": 5}}}, {"per_pod": True, "proc_path": str(proc)})
    r = gpu.read()
    assert r.pods == {} and r.sources == {"proc": 0, "container_logs": 0} and gpu.asked == []


def test_families_render_every_series_with_its_labels(tmp_path: Path) -> None:
    proc = make_proc(tmp_path / "proc", {1184: ("python3", Container("ml", "train-0", "main"))})
    logs = make_container_logs(tmp_path / "containers", [Container("ml", "train-0", "main")])
    procs = [rec(1184, 3 << 30), *[rec(2000 + i, 1 << 20) for i in range(3)], rec(0)]
    gpu = Gpu(
        tmp_path,
        {V3: procs, UTIL: {"per_process": {"smUtil": 50, "memUtil": 10}}},
        {"per_process": True, "series_per_gpu": 2, "proc_path": str(proc), "container_log_dir": str(logs)},
    )
    r = gpu.read()
    from exporter.supervisor import textformat

    text = textformat.encode(processes.families([(GpuKey("0", UUID), r)], None)).decode()  # type: ignore[arg-type]
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    mem = {s.labels["pid"]: (s.labels, s.value) for s in fams["nvgpu_process_memory_used_bytes"].samples}
    assert mem["1184"][0] == {
        "gpu": "0",
        "uuid": UUID,
        "pid": "1184",
        "process": "python3",
        "namespace": "ml",
        "pod": "train-0",
        "container": "main",
    }
    assert mem["other"][1] == 2 << 20 and set(mem) == {"1184", "2000", "other"}
    sm = {s.labels["pid"]: s.value for s in fams["nvgpu_process_sm_utilization_ratio"].samples}
    assert sm == {"1184": 0.5, "2000": 0.5, "other": 1.0}
    dropped = fams["nvgpu_process_records_dropped"].samples
    # the pid-0 record, and the utilization sample the fake derives from it
    assert [(s.labels["reason"], s.value) for s in dropped] == [("pid_zero", 2.0)]
    assert "nvgpu_process_api_info" not in fams  # which variant answered: nvgpu_nvml_api_info (test_apis.py)


@pytest.mark.usefixtures("fresh_log_once")
def test_a_pid_that_resolves_to_the_exporters_own_pod_is_not_attributed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An old driver reporting host PIDs to a container without hostPID: host pid 7 is, in the
    container's namespace, one of the exporter's own processes. It must not become the exporter's
    pod's GPU usage."""
    exporter = Container("nvgpu-exporter", "nvgpu-exporter-x2k4f", "nvgpu-exporter")
    proc = make_proc(tmp_path / "proc", {7: ("python3", exporter)}, pid_namespace=CONTAINER_PID_NS, own=exporter)
    gpu = Gpu(tmp_path, {V3: [rec(7, 5 << 30)]}, {"per_pod": True, "per_process": True, "proc_path": str(proc)})
    with caplog.at_level(logging.WARNING):
        r = gpu.read()
        gpu.read()
    assert r.count == 1 and r.pods == {} and r.labels[7] == ("", "", "", "")
    assert len([x for x in caplog.records if "exporter's own pod" in x.getMessage()]) == 1


def test_the_drop_counter_and_the_fallback_survive_a_reprobe(tmp_path: Path) -> None:
    """A re-probe clears the device client's caches; the counter must not reset with it, and the
    struct fallback is a property of this binding and driver, kept for the worker's life."""
    gpu = Gpu(tmp_path, {V3: {"struct": "r535_v3", "records": TRUTH}, V2: TRUTH})
    first = gpu.read()
    gpu.dev.forget()  # a re-probe
    again = gpu.read()
    assert again.dropped == first.dropped and again.functions["compute"] == V2 and gpu.calls(V3) == 1


def test_the_drop_counter_and_the_fallback_survive_the_gpu_attached_again(tmp_path: Path) -> None:
    """A GPU lost and attached again gets a new device client (a new handle): the counter exported
    as counted since the worker started, and the fallback, carry over to it by UUID."""
    gpu = Gpu(tmp_path, {V3: {"struct": "r535_v3", "records": TRUTH}, V2: TRUTH})
    first = gpu.read()
    handle = gpu.client.raw("t", "nvmlDeviceGetHandleByIndex", "", 0)
    gpu.dev = DeviceClient(gpu.client, 0, UUID, handle, gpu.dev.states.reattached())
    again = gpu.read()
    assert again.dropped == first.dropped and again.functions["compute"] == V2 and gpu.calls(V3) == 1
    fresh = DeviceClient(gpu.client, 0, UUID, handle)  # another worker: nothing carried
    assert fresh.state_of(process_reads.State).dropped == Counter()


def test_forked_clients_keep_the_options(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path, {V3: TRUTH}, {"per_process": True})
    assert gpu.client.fork(3).options is gpu.client.options


@pytest.mark.usefixtures("fresh_log_once")
def test_a_sample_stamped_in_the_future_is_dropped_and_never_moves_the_last_seen(tmp_path: Path) -> None:
    """A future timeStamp passed back as lastSeenTimeStamp would make NVML return nothing newer ever
    again: the sample is dropped (counted), its process's utilization unknown this time, not 0."""
    future = int(time.time() * 1e6) + 3600 * 10**6
    samples = [
        {"pid": 1184, "timeStamp": future, "smUtil": 99, "memUtil": 1, "encUtil": 0, "decUtil": 0},
        {"pid": 16040, "smUtil": 40, "memUtil": 2, "encUtil": 0, "decUtil": 0},  # stamped now by the fake
    ]
    gpu = Gpu(tmp_path, {V3: TRUTH[:2], UTIL: samples}, {"per_process": True})
    first = gpu.read()
    assert first.processes[1184] == (3 << 30, None, None, None, None)
    assert first.processes[16040] == (7 << 30, 40, 2, 0, 0)
    assert first.dropped == {"timestamp_in_future": 1}
    gpu.read()
    assert 0 < gpu.asked[1] < future  # the next call asked for samples newer than the plausible one


def test_a_utilization_sample_for_a_pid_in_no_list_is_counted_not_used(tmp_path: Path) -> None:
    samples = [
        {"pid": 1184, "smUtil": 50, "memUtil": 1, "encUtil": 0, "decUtil": 0},
        {"pid": 4242, "smUtil": 70, "memUtil": 3, "encUtil": 0, "decUtil": 0},  # left between the two calls
        {"pid": 4243, "smUtil": 70, "memUtil": 3, "encUtil": 0, "decUtil": 0},
    ]
    gpu = Gpu(tmp_path, {V3: TRUTH[:1], UTIL: samples}, {"per_process": True})
    r = gpu.read()
    assert set(r.processes) == {1184} and r.other is None
    assert gpu.dev.state_of(plausibility.Dropped).by_feature() == {"processes": {"join_unmatched": 2}}
