"""Every dashboard panel query and every rule expression, against a real Prometheus.

Debian's ``prometheus`` scrapes the real exporter (supervisor + worker on the fake backend) through
a file-based service discovery target, every second. The scenario is h200x2 (two NVLink-connected
H200s whose values change over time, plus an H200 in MIG mode and a GH200) with the fault states
some panels exist to show: GPU 1 busy with nothing on it (the stuck-context signature), Xids from
NVML events and the kernel log, a worker segfault that quarantines a feature, and pods from a fake
kubelet (a real gRPC server).

After at least three scrapes every panel query must parse and return data, every variable query
must list values, and every rule expression must parse; Prometheus must evaluate the rule file
without errors. A metric renamed in the exporter leaves a panel without data and fails here.

Everything runs twice: with the default series, and with every switch that adds per-GPU
series on (``details``, ``nvlink_links``). A query of a series only a switch adds may be empty in the
default mode (:data:`SWITCHED_ONLY`, each with its reason) and must have data in the other.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from exporter_proc import ROOT, Exporter, load_scenario, write_scenario
from fakeproc import Container, make_container_logs, make_proc
from prometheus_proc import running_prometheus
from waiting import wait_until

sys.path.insert(0, str(ROOT))
from dashboards.queries import Query, panel_queries, variable_queries  # noqa: E402

pytestmark = pytest.mark.slow

RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
UUID0 = "GPU-ef65bf38-0ae6-479b-9ebc-46c6463961e6"
UUID1 = "GPU-094221fd-19f9-1561-7ef8-949bb0d57826"
UUID2 = "GPU-2a7c4e10-5b3d-4f6e-8a9b-0c1d2e3f4a5b"  # a third GPU, in MIG mode
UUID3 = "GPU-6d1e0b2c-7a4f-4c3e-9b8a-1f2e3d4c5b6a"  # a fourth, on a Grace module (GH200)
QUARANTINED = "pcie"  # the feature the scenario crashes in; no panel needs its metrics
TRAINER_PID = 4242
TRAINER = Container("ml", "trainer-0", "main")  # the kubelet's pod on GPU 0, as /proc names it

# Panels allowed to return no data, with the reason. Everything else must show data: panels that
# by design show only fault states get them from the scenario below.
NO_DATA_ALLOWED: dict[tuple[str, str], str] = {}

try:  # pod attribution needs grpcio (the `kubernetes` extra, installed in CI)
    import grpc
    from fake_kubelet import FakeKubelet

    from exporter.supervisor.podresources.v1 import api_pb2, api_pb2_grpc
except ImportError as exc:  # grpcio missing: fake_kubelet and the stubs need it
    grpc = None
    NO_DATA_ALLOWED[("NVIDIA GPU fleet (nvgpu-exporter)", "Pods on each GPU")] = (
        f"pod attribution needs grpcio (pip install -e '.[kubernetes]'): {exc}"
    )

DATA_TIMEOUT_S = 60.0

# The two modes the dashboards and rules must work in: the default series, and every switch on.
MODES: dict[str, dict[str, str]] = {
    "default": {},
    "detailed": {"NVGPU_FEATURE_DETAILS": "on", "NVGPU_FEATURE_NVLINK_LINKS": "on"},
}
# (dashboard, panel, refId) of queries that read only a series a switch adds: empty by default.
SWITCHED_ONLY: dict[tuple[str, str, str], str] = {
    ("NVIDIA GPU fleet (nvgpu-exporter)", "ECC error counters", "B"): (
        "the lifetime column: nvgpu_ecc_aggregate_errors_total needs NVGPU_FEATURE_DETAILS=on"
    ),
}
ERRORING_LINK = "2"  # GPU 0's link with replay errors: its own series in both modes


def _scenario() -> dict[str, Any]:
    """h200x2 plus the fault states the fault-only panels exist to show."""
    data = load_scenario("h200x2")
    data["description"] = (
        "tests/test_prometheus_e2e.py: h200x2 with GPU 1 stuck, Xids, a quarantined feature, an NVML error"
    )
    gpu1 = data["gpus"][1]["values"]
    # The second incident: busy, nothing in memory, no processes (h200x2 lists none already).
    gpu1["nvmlDeviceGetUtilizationRates"] = {"gpu": 100, "memory": 0}
    gpu1["nvmlDeviceGetMemoryInfo"] = {"total": 150754820096, "reserved": 644939776, "free": 150109880320, "used": 0}
    gpu1["nvmlDeviceGetComputeRunningProcesses_v3"] = []
    # GPM: the engine looks active, no SM does any work.
    gpu1.update({f"nvmlGpmMetricsGet:{m}": 0.0 for m in (2, 3, 5, 10)})
    gpu1["nvmlGpmMetricsGet:1"] = 100.0
    # A transient NVML error on every sample: nvgpu_nvml_errors_total{feature="power",error="UNKNOWN"}
    # (a call made by default: the performance state, used before the series budget, needs details now).
    gpu1["nvmlDeviceGetEnforcedPowerLimit"] = {"error": "UNKNOWN"}
    # GPU 0 runs one process of the kubelet's pod trainer-0 (per-pod usage); GPU 1's one
    # record comes back with pid and memory swapped (dropped and counted: still no process).
    gpu0 = data["gpus"][0]["values"]
    gpu0["nvmlDeviceGetComputeRunningProcesses_v3"] = [
        {"pid": TRAINER_PID, "usedGpuMemory": 3 << 30, "gpuInstanceId": 4294967295, "computeInstanceId": 4294967295}
    ]
    gpu0["nvmlDeviceGetProcessUtilization"] = {"per_process": {"smUtil": 60, "memUtil": 20}}
    swapped = {"struct": "swapped", "records": [{"pid": 9980, "usedGpuMemory": 6498025472}]}
    gpu1["nvmlDeviceGetComputeRunningProcesses_v3"] = gpu1["nvmlDeviceGetComputeRunningProcesses_v2"] = swapped
    # Link 2 of GPU 0 replays (the per-call counter and its field agree).
    gpu0[f"nvmlDeviceGetNvLinkErrorCounter:{ERRORING_LINK},0"] = 5
    data["gpus"][0]["fields"][f"161:{ERRORING_LINK}"] = 5
    # GPU 2 is h200x2-mig's GPU 0 (MIG mode, mixed profiles) under its own identity, so the
    # MIG panels have data and the GPU panels show a MIG GPU next to ordinary ones.
    mig_gpu = load_scenario("h200x2-mig")["gpus"][0]
    mig_gpu.update(uuid=UUID2, serial="1654524012999", pci_bus_id="00000000:00:08.0", minor_number=2)
    data["gpus"].append(mig_gpu)
    # GPU 3 is the shipped GH200 (a Grace module): module power, its limit, the energy counter in the
    # module's family, NVLink-C2C, so the panels that show them by scope have data.
    grace = load_scenario("gh200x1-r570")["gpus"][0]
    grace.update(uuid=UUID3, serial="1654524013333", pci_bus_id="00000000:00:09.0", minor_number=3)
    data["gpus"].append(grace)
    # Xid 43 through NVML events, after the restarted worker registered (scenario time).
    data["events"] = [{"at_s": 6, "gpu": 1, "event_type": "XidCriticalError", "data": 43}]
    # The worker segfaults in the PCIe replay counter query of every GPU until the feature is
    # quarantined: the first crash leaves its GPU out (contained to it), the second, on another GPU,
    # quarantines pcie node-wide and brings the first GPU back at once.
    data["faults"] = [
        {
            "function": "nvmlDeviceGetPcieReplayCounter",
            "action": "segfault",
            "comment": "quarantines the pcie feature (a crash on two different GPUs)",
        }
    ]
    return data


KERNEL_LOG = (
    "6,100,5000000,-;NVRM: Xid (PCI:0000:00:07): 13, pid=4242, name=python3, "
    "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)\n"
    "6,101,5000100,-;NVRM: Xid (PCI:0000:00:07): 31, pid=4242, name=python3, Ch 00000008, intr 00000000. MMU Fault\n"
)


@dataclass
class Stack:
    mode: str
    base: str
    exporter: Exporter
    prometheus: subprocess.Popen[bytes]
    log: Path
    rules_loaded: bool

    def api(self, path: str, **params: str) -> dict[str, Any]:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return dict(json.load(resp))
        except urllib.error.HTTPError as exc:  # 400/422 carry a JSON body with the parse error
            return dict(json.loads(exc.read() or b"{}") or {"status": "error", "error": f"HTTP {exc.code}"})

    def query(self, expr: str) -> dict[str, Any]:
        return self.api("/api/v1/query", query=expr)

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def _wait(pred: Any, timeout: float, what: str, stack: Stack | None = None) -> Any:
    logs = (lambda: f"prometheus log:\n{stack.logs()}") if stack else None
    return wait_until(pred, timeout, what, logs, every=0.25)


def _fake_kubelet(directory: Path) -> Any:
    """A real gRPC PodResourcesLister on a unix socket: one pod per GPU of the scenario."""
    assert grpc is not None

    def pod(namespace: str, name: str, container: str, uuid: str, resource: str = "nvidia.com/gpu") -> Any:
        devices = api_pb2.ContainerDevices(resource_name=resource, device_ids=[uuid])
        return api_pb2.PodResources(
            namespace=namespace, name=name, containers=[api_pb2.ContainerResources(name=container, devices=[devices])]
        )

    mig_gpu = load_scenario("h200x2-mig")["gpus"][0]
    mig_device = mig_gpu["mig"]["layouts"][0]["instances"][0]["uuid"]  # GPU 2's 3g.71gb
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(
        FakeKubelet(
            [
                pod("ml", "trainer-0", "main", UUID0),
                pod("ml", "stuck-job-1", "main", UUID1),
                pod("ml", "mig-trainer-0", "main", mig_device, "nvidia.com/mig-3g.71gb"),
            ]
        ),
        server,
    )
    path = str(directory / "kubelet.sock")
    assert server.add_insecure_port(f"unix://{path}") != 0
    server.start()
    return server, path


@pytest.fixture(scope="module", params=sorted(MODES))
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Debian's `prometheus` binary is not installed (apt-get install prometheus; .ci/run installs it)")
    tmp = tmp_path_factory.mktemp("prom-e2e")
    kmsg = tmp / "kern.log"
    kmsg.write_text(KERNEL_LOG)
    env = {
        "NVGPU_STUCK_AFTER_SECONDS": "1",
        "NVGPU_QUARANTINE_AFTER": "1",
        "NVGPU_FEATURE_KERNEL_XID": "on",
        "NVGPU_FEATURE_GPM_PIPES": "on",  # the Pipe activity panel (off by default)
        "NVGPU_KMSG_PATH": str(kmsg),
        "NVGPU_KMSG_CURSOR_FILE": str(tmp / "kmsg-cursor.json"),
        # per-pod usage: a host /proc (hostPID) with the trainer's process, and the kubelet's log names
        "NVGPU_PROC_PATH": str(make_proc(tmp / "proc", {TRAINER_PID: ("python3", TRAINER)})),
        "NVGPU_CONTAINER_LOG_DIR": str(make_container_logs(tmp / "containers", [TRAINER])),
        **MODES[request.param],
    }
    server = None
    sock_dir = Path(tempfile.mkdtemp(prefix="e2e-kubelet-", dir="/tmp"))  # unix socket paths are short
    if grpc is not None:
        server, sock = _fake_kubelet(sock_dir)
        env.update(NVGPU_POD_RESOURCES_SOCKET=sock, NVGPU_POD_REFRESH_SECONDS="1")
    exporter = Exporter(write_scenario(tmp, _scenario()), tmp, env=env, interval=0.5)
    try:
        targets = tmp / "targets.json"
        targets.write_text(
            json.dumps([{"targets": [f"127.0.0.1:{exporter.port}"], "labels": {"cluster": "e2e", "node": "node-a"}}])
        )
        rules_loaded = RULES.exists()
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)] if rules_loaded else [],
            "scrape_configs": [
                {"job_name": "nvgpu-exporter", "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}]}
            ],
        }
        with running_prometheus(binary, tmp, config) as prom:
            st = Stack(request.param, prom.base, exporter, prom.process, prom.log, rules_loaded)
            # At least three scrapes of the exporter.
            _wait(
                lambda: st.query('count_over_time(up{job="nvgpu-exporter"}[1m]) >= 3')["data"]["result"],
                30,
                "three scrapes of the exporter",
                st,
            )
            yield st
    finally:
        exporter.__exit__(None, None, None)
        if server is not None:
            server.stop(grace=None).wait(5)
        shutil.rmtree(sock_dir, ignore_errors=True)


def _describe(q: Query, answer: dict[str, Any]) -> str:
    why = f"{answer.get('errorType', '')} {answer.get('error', 'no data')}"
    return f"{q.dashboard} / {q.panel} [{q.ref_id}]: {why}\n  {q.expr}"


def test_every_panel_query_parses_and_returns_data(stack: Stack) -> None:
    all_queries = list(panel_queries())
    assert len(all_queries) >= 40, "fewer panel queries than the dashboards have: is dashboards/queries.py broken?"
    unparsed: list[str] = []
    pending = {q for q in all_queries if (q.dashboard, q.panel) not in NO_DATA_ALLOWED}
    if stack.mode == "default":
        pending = {q for q in pending if (q.dashboard, q.panel, q.ref_id) not in SWITCHED_ONLY}
    deadline = time.monotonic() + DATA_TIMEOUT_S
    last: dict[Query, dict[str, Any]] = {}
    for q in all_queries:  # every query parses, allowlisted ones included
        answer = stack.query(q.expr)
        last[q] = answer
        if answer.get("status") != "success":
            unparsed.append(_describe(q, answer))
    assert not unparsed, "queries Prometheus rejects:\n" + "\n".join(unparsed)
    # Fault states (Xid 43 at scenario time 6 s, the stuck signature, pods) arrive over a few seconds.
    while True:
        for q in sorted(pending):
            last[q] = stack.query(q.expr)
            if last[q].get("status") == "success" and last[q]["data"]["result"]:
                pending.discard(q)
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert not pending, (
        f"panel queries without data after {DATA_TIMEOUT_S:.0f} s:\n"
        + "\n".join(_describe(q, last[q]) for q in sorted(pending))
        + f"\nexporter log:\n{stack.exporter.logs()[-3000:]}"
    )


def test_no_data_allowlist_names_real_panels() -> None:
    panels = {(q.dashboard, q.panel) for q in panel_queries()}
    assert set(NO_DATA_ALLOWED) <= panels, set(NO_DATA_ALLOWED) - panels
    refs = {(q.dashboard, q.panel, q.ref_id) for q in panel_queries()}
    assert set(SWITCHED_ONLY) <= refs, set(SWITCHED_ONLY) - refs


def test_nvlink_series_follow_the_mode(stack: Stack) -> None:
    """Per-GPU NVLink totals in both modes; per-link series of the erroring link only by
    default, of every link with nvlink_links on."""

    pair = f'uuid=~"{UUID0}|{UUID1}"'  # the NVLink pair; GPU 2 is the MIG GPU

    def links(expr: str) -> set[tuple[str, str]]:
        result = stack.query(f"{expr}{{{pair}}}")["data"]["result"]
        return {(r["metric"]["uuid"], r["metric"]["link"]) for r in result}

    totals = _wait(
        lambda: stack.query(f'nvgpu_nvlink_errors_total{{error_type="replay", {pair}}}')["data"]["result"],
        DATA_TIMEOUT_S,
        "per-GPU NVLink error totals",
        stack,
    )
    assert {r["metric"]["uuid"]: float(r["value"][1]) for r in totals} == {UUID0: 5.0, UUID1: 0.0}
    per_link = links("nvgpu_nvlink_link_errors_total")
    if stack.mode == "default":
        assert per_link == {(UUID0, ERRORING_LINK)}
        assert not stack.query(f"nvgpu_nvlink_link_transmit_bytes_total{{{pair}}}")["data"]["result"]
    else:
        assert per_link == {(u, str(link)) for u in (UUID0, UUID1) for link in range(18)}
        assert len(links("nvgpu_nvlink_link_transmit_bytes_total")) == 36


def test_variable_queries_list_values(stack: Stack) -> None:
    variables = list(variable_queries())
    assert {v.variable for v in variables} >= {"cluster", "node", "instance", "gpu", "job"}
    empty = []
    for v in variables:
        answer = stack.query(v.expr)
        values = {r["metric"].get(v.label, "") for r in answer.get("data", {}).get("result", [])} - {""}
        if answer.get("status") != "success" or not values:
            empty.append(f"{v.dashboard} / ${v.variable}: {v.expr} -> {answer}")
    assert not empty, "\n".join(empty)
    gpus = stack.query(next(v.expr for v in variables if v.variable == "gpu"))["data"]["result"]
    assert {r["metric"]["uuid"] for r in gpus} == {UUID0, UUID1, UUID2, UUID3}


def test_fault_states_reach_prometheus(stack: Stack) -> None:
    """The scenario's fault states, checked by value, so the data above is the data we meant."""

    def values(expr: str) -> dict[str, float]:
        result = stack.query(expr)["data"]["result"]
        return {json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in result}

    stuck = _wait(lambda: values("nvgpu_stuck_context_suspected == 1"), DATA_TIMEOUT_S, "the stuck signature", stack)
    assert [json.loads(k)["uuid"] for k in stuck] == [UUID1]
    quarantined = values('nvgpu_feature_enabled{reason="quarantined"}')
    assert [json.loads(k)["feature"] for k in quarantined] == [QUARANTINED]
    crashes = values("nvgpu_worker_crashes_total")
    assert {json.loads(k)["feature"] for k in crashes} == {QUARANTINED}
    gpu1_xids = f'nvgpu_xid_errors_total{{uuid="{UUID1}"}}'
    xids = _wait(
        lambda: (lambda v: v if len(v) == 3 else None)(values(gpu1_xids)),
        DATA_TIMEOUT_S,
        "Xids 13 and 31 (kernel log) and 43 (NVML event) on GPU 1",
        stack,
    )
    assert sorted(json.loads(k)["xid"] for k in xids) == ["13", "31", "43"]
    assert not values(f'nvgpu_xid_errors_total{{uuid="{UUID0}"}}')


def test_mig_instances_reach_prometheus(stack: Stack) -> None:
    """GPU 2's MIG devices under their GPU, its pod placed on its instance, no device-wide
    utilization for it, and no stuck alert state for it."""

    def result(expr: str) -> list[dict[str, Any]]:
        return list(stack.query(expr)["data"]["result"])

    info = _wait(lambda: result("nvgpu_mig_instance_info"), DATA_TIMEOUT_S, "MIG devices", stack)
    assert {r["metric"]["uuid"] for r in info} == {UUID2} and len(info) == 5
    assert not result(f'nvgpu_gpu_utilization_ratio{{uuid="{UUID2}"}}')
    assert result(f'nvgpu_gpu_feature_unsupported{{uuid="{UUID2}", feature="utilization"}}')
    assert not result(f'nvgpu_stuck_context_suspected{{uuid="{UUID2}"}}')
    if grpc is not None:
        pods = _wait(lambda: result('nvgpu_gpu_pod_info{pod="mig-trainer-0"}'), DATA_TIMEOUT_S, "the MIG pod", stack)
        assert [(r["metric"]["uuid"], r["metric"]["gpu_instance_id"], r["metric"]["mig_profile"]) for r in pods] == [
            (UUID2, "2", "3g.71gb")
        ]
        unmapped = result("sum(nvgpu_pod_attribution_unmapped_devices)")
        assert [float(r["value"][1]) for r in unmapped] == [0.0]


def _rules() -> list[dict[str, Any]]:
    yaml = pytest.importorskip("yaml", reason="PyYAML (requirements-ci.txt) parses the rule file")
    data = yaml.safe_load(RULES.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def test_every_rule_expression_parses(stack: Stack) -> None:
    assert RULES.exists(), f"{RULES.relative_to(ROOT)} is missing"
    rules = _rules()
    assert rules, "the rule file has no rules"
    bad = []
    for rule in rules:
        answer = stack.query(rule["expr"])
        if answer.get("status") != "success":
            bad.append(f"{rule.get('alert') or rule.get('record')}: {answer.get('error')}\n  {rule['expr']}")
    assert not bad, "rule expressions Prometheus rejects:\n" + "\n".join(bad)


def test_prometheus_evaluates_the_rule_file_without_errors(stack: Stack) -> None:
    assert stack.rules_loaded, f"{RULES.relative_to(ROOT)} was not loaded by Prometheus"
    expected = len(_rules())

    def evaluated() -> list[dict[str, Any]] | None:
        groups = stack.api("/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if len(rules) == expected and all(r.get("health") != "unknown" for r in rules) else None

    rules = _wait(evaluated, 30, f"Prometheus to load and evaluate {expected} rules", stack)
    failing = [f"{r['name']}: {r.get('lastError')}" for r in rules if r.get("health") != "ok"]
    assert not failing, "\n".join(failing)


def test_worker_selfcheck_reaches_prometheus(stack: Stack) -> None:
    """docs/design.md ("Self-check"): the worker's self-check matters most (it imports pynvml); the health
    dashboard shows it."""
    failures = stack.query('nvgpu_selfcheck_failures{process="worker"}')["data"]["result"]
    assert failures, 'no nvgpu_selfcheck_failures{process="worker"}: the worker\'s self-check does not reach /metrics'
    modules = stack.query('nvgpu_module_info{process="worker", module="pynvml"}')["data"]["result"]
    assert len(modules) == 1 and modules[0]["metric"]["distribution"] == "nvidia-ml-py", modules


def test_per_pod_usage_reaches_prometheus(stack: Stack) -> None:
    """The per-pod panel's numbers are the scenario's, and the swapped record was dropped."""

    def by_pod(expr: str) -> dict[str, float]:
        result = stack.query(expr)["data"]["result"]
        return {r["metric"].get("pod", ""): float(r["value"][1]) for r in result}

    mem = _wait(lambda: by_pod("nvgpu_pod_memory_used_bytes"), DATA_TIMEOUT_S, "per-pod memory", stack)
    assert mem["trainer-0"] == 3 << 30
    assert by_pod("nvgpu_pod_sm_utilization_ratio")["trainer-0"] == pytest.approx(0.6)
    if grpc is not None:  # the kubelet's other holder runs nothing: 0, not absent (processes are visible)
        assert _wait(lambda: by_pod("nvgpu_pod_memory_used_bytes").get("stuck-job-1") == 0, DATA_TIMEOUT_S, "idle pod")
    dropped = stack.query(f'nvgpu_process_records_dropped_total{{uuid="{UUID1}"}}')["data"]["result"]
    assert [r["metric"]["reason"] for r in dropped] == ["pid_above_max"]
