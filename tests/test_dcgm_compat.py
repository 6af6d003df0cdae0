"""The compatibility rule sets, in a real Prometheus on the real exporter.

A real Prometheus scrapes two exporters over TLS with a client certificate and basic auth: h200x2
with `details` and `gpm_pipes` on (target gpu-node-1) and h200x2-mig with default settings
(gpu-node-2, GPU 0 in MIG mode). It loads deploy/prometheus/dcgm-compat/rules.yaml (dcgm-exporter's
names), deploy/prometheus/nvidia-smi-compat/rules.yaml (nvidia_gpu_exporter's names) and the
published rule sets of tests/fixtures/compat/ (written in our own words from their sources: the GPU
Operator's recording rules, a cloud provider's DCGM alerts, downstream users' alerts and dashboards,
nvidia_gpu_exporter's chart and dashboard), and answers one query per panel of dcgm-exporter's
Grafana dashboard (grafana/dcgm-exporter-dashboard.json, Grafana ID 12239). Every published rule
evaluates without error and every expression has data.

Also: the recording rules pass promtool (check and unit tests), the PrometheusRules are their
generated copies, the Xid rules are generated from the Xid catalog, and docs/migrating-from-dcgm.md
maps every field of dcgm-exporter's default-counters.csv and every name the rules record, and what
it says is and is not exported holds for the live scrape.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from exporter_proc import ROOT, Exporter, load_scenario, write_scenario
from prometheus_proc import running_prometheus
from tls_material import PASSWORD, USER, Material, bcrypt_hash, make_material
from waiting import wait_until

from exporter.supervisor.xid import classify, load_catalog

yaml = pytest.importorskip("yaml")

PROM = ROOT / "deploy" / "prometheus"
COMPAT = PROM / "dcgm-compat"
RULES = COMPAT / "rules.yaml"
CRD = COMPAT / "prometheusrule.yaml"
SMI = PROM / "nvidia-smi-compat"
SMI_RULES = SMI / "rules.yaml"
SMI_CRD = SMI / "prometheusrule.yaml"
FIXTURES = ROOT / "tests" / "fixtures" / "compat"
MIGRATING = ROOT / "docs" / "migrating-from-dcgm.md"
DATA_TIMEOUT_S = 60.0
NODE_A = "gpu-node-1"  # h200x2, details and gpm_pipes on, Xid 79 on GPU 1
NODE_B = "gpu-node-2"  # h200x2-mig, default settings, GPU 0 in MIG mode, Xid 94 on GPU 1
UUIDS_B = ("GPU-5e1f0c2a-7b3d-4c8e-9a6f-1d2e3f4a5b6c", "GPU-6f2a1d3b-8c4e-4d9f-8b7a-2e3f4a5b6c7d")

# The enabled lines of dcgm-exporter's etc/default-counters.csv (NVIDIA/dcgm-exporter, main,
# 2026): field names only.
DEFAULT_FIELDS = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DRIVER_VERSION",
    # the profiling fields the default file enables where DCGM supports them
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
    # The optional lines shops alert on (FB_TOTAL, the throttle durations; DCGM 4's *_NS)
    "DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS", "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS",
)  # fmt: skip

HOST = f'Hostname=~"{NODE_A}"'
SELECT = f'{HOST}, gpu=~"0|1"'


@dataclass(frozen=True)
class Panel:
    """One panel of dcgm-exporter's dashboard and the query we use for it."""

    title: str
    expr: str


# One query per panel (both published revisions of the dashboard: the older one plots
# DCGM_FI_DEV_GPU_UTIL under "GPU Utilization", the newer one DCGM_FI_PROF_GR_ENGINE_ACTIVE).
PANELS = (
    Panel("GPU Temperature", f"max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP{{{SELECT}}})"),
    Panel("GPU Avg. Temp", f"avg(DCGM_FI_DEV_GPU_TEMP{{{SELECT}}})"),
    Panel("GPU Power Usage", f"max by (Hostname, gpu, UUID) (DCGM_FI_DEV_POWER_USAGE{{{SELECT}}})"),
    Panel("GPU Power Total", f"sum(max by (gpu) (DCGM_FI_DEV_POWER_USAGE{{{SELECT}}}))"),
    Panel("GPU SM Clocks", f"max by (Hostname, UUID, gpu) (DCGM_FI_DEV_SM_CLOCK{{{SELECT}}} * 1e6)"),
    Panel("GPU Utilization", f"max by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL{{{SELECT}}})"),
    Panel("GPU Utilization (DCP)", f"max by (Hostname, gpu) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{SELECT}}})"),
    Panel("Tensor Core Utilization", f"max by (Hostname, gpu) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{SELECT}}})"),
    Panel("GPU Framebuffer Mem Used", f"max by (Hostname, gpu) (DCGM_FI_DEV_FB_USED{{{SELECT}}})"),
    # the dashboard's variables
    Panel("$Hostname", "count by (Hostname) (DCGM_FI_DEV_FB_FREE)"),
    Panel("$gpu", f"count by (gpu) (DCGM_FI_DEV_FB_FREE{{{HOST}}})"),
)


def _records(path: Path, prefix: str) -> list[str]:
    data = yaml.safe_load(path.read_text())
    return [r["record"] for g in data["groups"] for r in g["rules"] if r.get("record", "").startswith(prefix)]


def recorded_names() -> list[str]:
    return _records(RULES, "DCGM_")


def smi_names() -> list[str]:
    return _records(SMI_RULES, "nvidia_smi_")


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- static checks ---------------------------------------------------------------------------------


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("rule_set", [COMPAT, SMI], ids=["dcgm-compat", "nvidia-smi-compat"])
def test_promtool_checks_the_rules_and_their_unit_tests(rule_set: Path) -> None:
    proc = _promtool("check", "rules", str(rule_set / "rules.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tests = sorted((rule_set / "tests").glob("*.yaml"))
    assert tests
    proc = _promtool("test", "rules", *map(str, tests))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_checks_the_published_fixtures() -> None:
    files = sorted(FIXTURES.glob("*.yaml"))
    assert len(files) >= 7, files
    proc = _promtool("check", "rules", *map(str, files))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("rule_set", "rules", "crd"), [("dcgm-compat", RULES, CRD), ("nvidia-smi-compat", SMI_RULES, SMI_CRD)]
)
def test_prometheusrule_is_the_generated_copy(rule_set: str, rules: Path, crd: Path) -> None:
    gen = _load(PROM / "gen_prometheusrule.py", "gen_prometheusrule")
    assert gen.render(rules.read_text(), rule_set) == crd.read_text(), (
        f"run: python deploy/prometheus/gen_prometheusrule.py --set {rule_set}"
    )
    assert (crd.parent / "kustomization.yaml").read_text().count("prometheusrule.yaml") == 1


def test_xid_rules_are_generated_from_the_catalog() -> None:
    """The Xid block of rules.yaml is what deploy/prometheus/gen_dcgm_xid_rules.py writes from the
    catalog now, one err_msg per catalog code (plus 0), PromQL-quoted."""
    gen = _load(PROM / "gen_dcgm_xid_rules.py", "gen_dcgm_xid_rules")
    text = RULES.read_text()
    assert gen.splice(text) == text, "run: python deploy/prometheus/gen_dcgm_xid_rules.py"
    block = text[text.index(gen.BEGIN) : text.index(gen.END)]
    codes = [int(c) for c in re.findall(r'"err_code", "(\d+)"', block)]
    assert codes == [0, *sorted(load_catalog())]
    assert gen.promql_string('a "b" $1 \\') == '"a \\"b\\" $$1 \\\\"'
    with pytest.raises(ValueError):
        gen.promql_string("two\nlines")


def test_every_rule_reads_only_documented_metrics() -> None:
    documented = set(re.findall(r"`(nvgpu_[a-z_]+)`", (ROOT / "docs" / "metrics.md").read_text()))
    for path in (RULES, SMI_RULES):
        for name in re.findall(r"\b(nvgpu_[a-z_]+)\b", path.read_text()):
            assert name in documented, (path.name, name)


def _doc_rows() -> dict[str, str]:
    rows = {}
    for line in MIGRATING.read_text().splitlines():
        m = re.match(r"\| `(DCGM_FI_[A-Z0-9_]+)` \|(.*)", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def test_migration_doc_maps_every_default_field_and_every_recorded_name() -> None:
    rows = _doc_rows()
    missing = [f for f in DEFAULT_FIELDS if f not in rows]
    assert not missing, f"docs/migrating-from-dcgm.md does not map: {missing}"
    for name in recorded_names():
        assert name in rows, f"{name} is recorded but not in docs/migrating-from-dcgm.md"
        assert rows[name].rstrip(" |").rsplit("|", 1)[-1].strip().startswith("yes"), (name, rows[name])
    waits = [f for f, rest in rows.items() if re.search(r"\bpending\b", rest, re.I) or "not yet" in rest]
    assert not waits, f"a field waits: {waits}"
    for field, rest in rows.items():
        assert rest.strip(" |"), f"{field}: empty row"


def test_migration_doc_maps_every_nvidia_smi_name() -> None:
    text = MIGRATING.read_text()
    section = text[text.index("## From nvidia_gpu_exporter") :]
    missing = [name for name in smi_names() if f"`{name}`" not in section]
    assert not missing, f"recorded but not in the guide's nvidia_gpu_exporter section: {missing}"


def test_every_dashboard_panel_reads_recorded_names() -> None:
    recorded = set(recorded_names())
    for panel in PANELS:
        names = set(re.findall(r"\b(DCGM_FI_[A-Z0-9_]+)\b", panel.expr))
        assert names and names <= recorded, (panel.title, names - recorded)
    assert not re.search(r"(?<![A-Z_])PENDING", RULES.read_text()), "a placeholder rule"


# -- a real Prometheus over TLS + basic auth ------------------------------------------------------


@dataclass
class Stack:
    base: str
    exporters: dict[str, Exporter]  # node label -> exporter
    prometheus: subprocess.Popen[bytes]
    log: Path

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        url = f"{self.base}/api/v1/query?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return dict(json.load(resp))
        except urllib.error.HTTPError as exc:
            return dict(json.loads(exc.read() or b"{}") or {"status": "error", "error": f"HTTP {exc.code}"})

    def result(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        answer = self.query(expr, at)
        assert answer.get("status") == "success", (expr, answer)
        return list(answer["data"]["result"])

    def rules(self) -> list[dict[str, Any]]:
        """Every rule group Prometheus has loaded, each with its ``file``."""
        with urllib.request.urlopen(f"{self.base}/api/v1/rules", timeout=10) as resp:
            return list(json.load(resp)["data"]["groups"])

    def logs(self) -> str:
        exporters = "\n".join(f"exporter {n}:\n{e.logs()[-2000:]}" for n, e in self.exporters.items())
        return f"prometheus log:\n{self.log.read_text(errors='replace')[-3000:]}\n{exporters}"


def _wait(pred: Any, timeout: float, what: str, stack: Stack) -> Any:
    return wait_until(pred, timeout, what, stack.logs)


def _scenarios() -> dict[str, tuple[dict[str, Any], dict[str, str]]]:
    """node -> (scenario, env) of the two exporters."""
    a = load_scenario("h200x2")
    a["description"] = "tests/test_dcgm_compat.py: h200x2, Xid 79 on GPU 1, a fan on GPU 0, the recovery action field"
    a["events"] = [{"at_s": 2, "gpu": 1, "event_type": "XidCriticalError", "data": 79}]
    g0 = a["gpus"][0]["values"]
    g0["nvmlDeviceGetNumFans"] = 1  # nvidia_gpu_exporter's dashboards plot fan speed
    g0["nvmlDeviceGetFanSpeed_v2:0"] = 40
    for gpu in a["gpus"]:
        gpu["fields"]["230:0"] = 0  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: none
    b = load_scenario("h200x2-mig")
    b["description"] = "tests/test_dcgm_compat.py: h200x2-mig, Xid 94 on GPU 1"
    b["events"] = [{"at_s": 2, "gpu": 1, "event_type": "XidCriticalError", "data": 94}]
    for gpu, uuid in zip(b["gpus"], UUIDS_B, strict=True):  # two hosts never share a GPU
        gpu.update(uuid=uuid, serial=gpu["serial"] + "9", pci_bus_id=gpu["pci_bus_id"].replace(":00:0", ":00:1"))
    # gpm_pipes on A: the DCGM_FI_PROF_PIPE_FP*_ACTIVE rules read it (off by default); details on A for
    # the names recorded from `details` series. B runs the defaults.
    return {
        NODE_A: (a, {"NVGPU_FEATURE_GPM_PIPES": "on", "NVGPU_FEATURE_DETAILS": "on"}),
        NODE_B: (b, {}),
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Debian's `prometheus` binary is not installed (apt-get install prometheus)")
    tmp = tmp_path_factory.mktemp("dcgm-compat")
    tls: Material = make_material(tmp / "tls")
    web = tmp / "web-config.yml"
    web.write_text(
        "tls_server_config:\n"
        f"  cert_file: {tls.path('server.crt')}\n"
        f"  key_file: {tls.path('server.key')}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {tls.path('ca.crt')}\n"
        "  client_allowed_sans: [prometheus.monitoring.svc]\n"
        f"basic_auth_users:\n  {USER}: {bcrypt_hash()}\n"
    )
    (tmp / "password").write_text(PASSWORD)
    exporters: dict[str, Exporter] = {}
    try:
        for node, (data, env) in _scenarios().items():
            home = tmp / node
            home.mkdir()
            exporters[node] = Exporter(
                write_scenario(home, data), home, env={"NVGPU_WEB_CONFIG_FILE": str(web), **env}, interval=0.5
            )
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [str(RULES), str(SMI_RULES), *map(str, sorted(FIXTURES.glob("*.yaml")))],
            "scrape_configs": [
                {
                    "job_name": "nvgpu-exporter",
                    "scheme": "https",
                    "tls_config": {
                        "ca_file": tls.path("ca.crt"),
                        "cert_file": tls.path("client.crt"),
                        "key_file": tls.path("client.key"),
                    },
                    "basic_auth": {"username": USER, "password_file": str(tmp / "password")},
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{e.port}"], "labels": {"node": node}} for node, e in exporters.items()
                    ],
                }
            ],
        }
        with running_prometheus(binary, tmp, config) as prom:
            yield Stack(prom.base, exporters, prom.process, prom.log)
    finally:
        for exporter in exporters.values():
            exporter.__exit__(None, None, None)


def test_prometheus_scrapes_over_tls_with_basic_auth(stack: Stack) -> None:
    """Target up == 1 with tls_config (CA + client certificate) and basic_auth."""
    _wait(
        lambda: len(stack.result('count_over_time(up{job="nvgpu-exporter"}[1m]) >= 3')) == 2,
        DATA_TIMEOUT_S,
        "three scrapes of both targets",
        stack,
    )
    assert [r["value"][1] for r in stack.result('up{job="nvgpu-exporter"}')] == ["1", "1"]
    assert {r["value"][1] for r in stack.result("min_over_time(up[1m])")} == {"1"}
    # ... and what it scraped is the exporters', GPUs included
    assert len(stack.result("nvgpu_gpu_info")) == 4


def test_every_dashboard_panel_query_returns_data(stack: Stack) -> None:
    rejected = [
        f"{p.title}: {stack.query(p.expr).get('error')}" for p in PANELS if stack.query(p.expr)["status"] != "success"
    ]
    assert not rejected, rejected
    waiting = set(PANELS)
    deadline = time.monotonic() + DATA_TIMEOUT_S
    while waiting and time.monotonic() < deadline:
        waiting = {p for p in waiting if not stack.query(p.expr)["data"]["result"]}
        time.sleep(1)
    assert not waiting, [f"{p.title}: {p.expr}" for p in waiting]
    hosts = stack.result("count by (Hostname) (DCGM_FI_DEV_FB_FREE)")
    assert sorted(h["metric"]["Hostname"] for h in hosts) == [NODE_A, NODE_B]


# Names recorded from `details` series (off by default): no data on the default exporter
# (gpu-node-2); docs/migrating-from-dcgm.md says so in their rows.
NEEDS_DETAILS = {
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "DCGM_FI_DEV_RELIABILITY_VIOLATION",
    "DCGM_FI_DEV_TOTAL_APP_CLOCKS_VIOLATION",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST_NS",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
}
NEEDS_GPM_PIPES = {"DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_PIPE_FP16_ACTIVE"}
DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "hostname", "pci_bus_id", "DCGM_FI_DRIVER_VERSION")


def test_names_that_need_details_say_so() -> None:
    rows = _doc_rows()
    for name in NEEDS_DETAILS:
        assert "NVGPU_FEATURE_DETAILS=on" in rows[name] and "with details" in rows[name], name
    for name in NEEDS_GPM_PIPES:
        assert "NVGPU_FEATURE_GPM_PIPES=on" in rows[name] and "gpm_pipes" in rows[name], name
    assert NEEDS_DETAILS | NEEDS_GPM_PIPES <= set(recorded_names())


def _wait_for_names(stack: Stack, names: list[str], what: str) -> dict[str, list[dict[str, Any]]]:
    waiting = set(names)
    deadline = time.monotonic() + DATA_TIMEOUT_S
    answers: dict[str, list[dict[str, Any]]] = {}
    while waiting and time.monotonic() < deadline:
        for name in sorted(waiting):
            answers[name] = stack.result(name)
            if answers[name]:
                waiting.discard(name)
        time.sleep(1)
    assert not waiting, f"{what} without data: {sorted(waiting)}\n{stack.logs()}"
    return answers


def test_every_recorded_dcgm_name_has_data_with_dcgm_labels(stack: Stack) -> None:
    answers = _wait_for_names(stack, recorded_names(), "recorded DCGM names")
    for name, result in answers.items():
        for series in result:
            labels = series["metric"]
            for label in DCGM_LABELS:
                assert labels.get(label), (name, label, labels)
            assert labels["device"] == f"nvidia{labels['gpu']}" and labels["UUID"] == labels["uuid"]
            if "gpu_instance_id" in labels:  # a GPU instance of a MIG GPU: dcgm-exporter's MIG labels
                assert (labels["GPU_I_ID"], labels["GPU_I_PROFILE"]) == (
                    labels["gpu_instance_id"],
                    labels["mig_profile"],
                )
    # the switched names have no data on the exporter with the default settings
    default = {r["metric"]["__name__"] for r in stack.result(f'{{__name__=~"DCGM_.+", Hostname="{NODE_B}"}}')}
    assert default and not default & (NEEDS_DETAILS | NEEDS_GPM_PIPES), default & (NEEDS_DETAILS | NEEDS_GPM_PIPES)
    xid = {r["metric"]["gpu"]: r["value"][1] for r in stack.result(f'DCGM_FI_DEV_XID_ERRORS{{Hostname="{NODE_A}"}}')}
    assert xid.get("0") == "0"
    _wait(
        lambda: stack.result(f'DCGM_FI_DEV_XID_ERRORS{{Hostname="{NODE_A}", gpu="1"}} == 79'),
        DATA_TIMEOUT_S,
        "the last Xid (79) on GPU 1",
        stack,
    )


def test_xid_series_carry_err_code_and_the_catalog_meaning(stack: Stack) -> None:
    """dcgm-exporter 4.x's err_code (the value) and err_msg, from exporter/supervisor/xid/catalog.json: "No Error"
    before an Xid, the catalog's meaning for 79 and 94."""
    messages = {r["metric"]["err_code"]: r["metric"]["err_msg"] for r in stack.result("nvgpu:dcgm_xid_messages")}
    assert messages == {"0": "No Error", **{str(c): info.meaning for c, info in load_catalog().items()}}
    last = _wait(
        lambda: (lambda r: r if {s["value"][1] for s in r} >= {"0", "79", "94"} else None)(
            stack.result("DCGM_FI_DEV_XID_ERRORS")
        ),
        DATA_TIMEOUT_S,
        "Xid 79 and 94",
        stack,
    )
    assert len(last) == 4, last  # one per GPU, whatever its code
    for series in last:
        labels, value = series["metric"], series["value"][1]
        assert labels["err_code"] == value, series
        assert labels["err_msg"] == ("No Error" if value == "0" else classify(int(value)).meaning), series


def test_mig_gpu_instances_have_dcgm_labels(stack: Stack) -> None:
    """On the MIG GPU, the framebuffer and profiling names are per GPU instance (GPU_I_ID,
    GPU_I_PROFILE), as dcgm-exporter reports them, and have no whole-GPU series."""
    mig = f'Hostname="{NODE_B}", gpu="0"'
    native = {
        (r["metric"]["gpu_instance_id"], r["metric"]["mig_profile"]): float(r["value"][1])
        for r in stack.result(f'nvgpu_mig_memory_used_bytes{{node="{NODE_B}", gpu="0"}}')
    }
    assert set(native) == {("2", "3g.71gb"), ("3", "2g.35gb"), ("9", "1g.18gb"), ("10", "1g.18gb")}, native
    for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_PROF_SM_ACTIVE"):
        got = _wait(lambda n=name: stack.result(f"{n}{{{mig}}}"), DATA_TIMEOUT_S, f"{name} on the MIG GPU", stack)
        assert {(r["metric"].get("GPU_I_ID"), r["metric"].get("GPU_I_PROFILE")) for r in got} == set(native), got
    used = {r["metric"]["GPU_I_ID"]: float(r["value"][1]) for r in stack.result(f"DCGM_FI_DEV_FB_USED{{{mig}}}")}
    assert used == {gi: v / 2**20 for (gi, _p), v in native.items()}
    total = stack.result(f'sum(DCGM_FI_DEV_FB_TOTAL{{{mig}}}) / sum(nvgpu_mig_memory_total_bytes{{node="{NODE_B}"}})')
    assert float(total[0]["value"][1]) == pytest.approx(2**-20)
    assert stack.result(f"DCGM_FI_DEV_MIG_MODE{{{mig}}}")[0]["value"][1] == "1"


def test_throttle_durations_are_nanoseconds(stack: Stack) -> None:
    """DCGM's violation and *_NS fields are ns (dcgm_fields.h; dcgm-exporter#589): the recorded value is
    the exporter's seconds counter x 1e9, for every reason each name maps."""
    pairs = {
        "DCGM_FI_DEV_POWER_VIOLATION": "sw_power_cap",
        "DCGM_FI_DEV_THERMAL_VIOLATION": "thermal",
        "DCGM_FI_DEV_TOTAL_BASE_CLOCKS_VIOLATION": "total_base_clocks",
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION": "low_utilization",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS": "sw_power_cap",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS": "hw_thermal_slowdown",
    }
    checked = 0
    for name, reason in pairs.items():
        for recorded in stack.result(f'{name}{{Hostname="{NODE_A}"}}'):
            # the exporter's counter as the rule saw it, at the recorded sample's instant (a scrape
            # appended just after the rule ran can be newer: the last few samples are candidates)
            at, value = recorded["value"][0], float(recorded["value"][1])
            uuid = recorded["metric"]["uuid"]
            (raw,) = stack.result(
                f'nvgpu_clock_event_reason_seconds_total{{node="{NODE_A}", uuid="{uuid}", reason="{reason}"}}[3s]', at
            )
            seen = [float(v) * 1e9 for _t, v in raw["values"]]
            assert any(value == pytest.approx(v, rel=1e-9, abs=1e-3) for v in seen), (name, value, seen)
            checked += value > 0
    assert checked >= 2, "no counter above 0 to compare: the scenario's low_utilization/total_base_clocks grow"


def test_the_rules_evaluate_without_errors(stack: Stack) -> None:
    files = {str(RULES): RULES, str(SMI_RULES): SMI_RULES, **{str(f): f for f in FIXTURES.glob("*.yaml")}}
    expected = {
        name: sum(len(g["rules"]) for g in yaml.safe_load(path.read_text())["groups"]) for name, path in files.items()
    }

    def evaluated() -> dict[str, list[dict[str, Any]]] | None:
        by_file: dict[str, list[dict[str, Any]]] = {}
        for group in stack.rules():
            by_file.setdefault(group["file"], []).extend(group["rules"])
        done = {f: len(r) for f, r in by_file.items()} == expected
        return by_file if done and all(r.get("health") != "unknown" for rs in by_file.values() for r in rs) else None

    by_file = _wait(evaluated, 30, f"{sum(expected.values())} rules evaluated", stack)
    bad = [f"{Path(f).name}: {r['name']}: {r.get('lastError')}" for f, rs in by_file.items() for r in rs]
    bad = [b for b, r in zip(bad, [r for rs in by_file.values() for r in rs], strict=True) if r.get("health") != "ok"]
    assert bad == []


def test_profiling_names_have_dcgm_units(stack: Stack) -> None:
    """The DCGM_FI_PROF_* rules on the real exporter's GPM series: activity a ratio 0-1 (not percent),
    traffic in bytes/s (not MiB/s). The h200x2 scenario cycles idle and loaded every 5 s: graphics
    activity 0 and 0.936, PCIe transmit 0.2 and 6.5 MiB/s, receive 0.07 and 18.8 MiB/s (GPM values
    measured on an H200 on 2026-11-30, as the scenario file says)."""
    a = f'Hostname="{NODE_A}"'
    busiest = _wait(
        lambda: stack.result(f"max_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{a}}}[1m]) > 0.5"),
        DATA_TIMEOUT_S,
        "a loaded phase in DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        stack,
    )
    assert all(float(r["value"][1]) == pytest.approx(0.936) for r in busiest), busiest
    for name in ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                 "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_ACTIVE"):  # fmt: skip
        values = [float(r["value"][1]) for r in stack.result(f"max_over_time({name}{{{a}}}[5m])")]
        assert len(values) == 2 and all(0 <= v <= 1 for v in values), (name, values)
    # rate() over a minute the series only partly covers reads low: wait for a whole minute of scrapes
    _wait(
        lambda: (
            len(stack.result(f'count_over_time(nvgpu_gpm_pcie_transmit_bytes_total{{node="{NODE_A}"}}[1m]) >= 50')) == 2
        ),
        DATA_TIMEOUT_S + 30,
        "a minute of GPM PCIe counters",
        stack,
    )
    mib = 1 << 20
    for name, low, high in (("DCGM_FI_PROF_PCIE_TX_BYTES", 0.2, 6.5), ("DCGM_FI_PROF_PCIE_RX_BYTES", 0.07, 18.8)):
        values = [float(r["value"][1]) for r in stack.result(f"{name}{{{a}}}")]
        assert len(values) == 2, (name, values)
        assert all(0.9 * low * mib <= v <= 1.1 * high * mib for v in values), (name, values)


@dataclass(frozen=True)
class Claim:
    """One row of the guide's "What is exported" table."""

    what: str
    series: tuple[str, ...]
    field: str
    exported: str  # "yes", "with `details`" or "no"


def exported_claims() -> list[Claim]:
    text = MIGRATING.read_text()
    section = text[text.index("## What is exported") :]
    section = section[: section.index("\n## ", 1)]
    claims = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("what", "---"):
            continue
        names = tuple(re.findall(r"`(nvgpu_[a-z0-9_]+)`", cells[1]))
        (field,) = re.findall(r"`(DCGM_FI_[A-Z0-9_]+)`", cells[2])
        claims.append(Claim(cells[0], names, field, cells[3]))
    return claims


def test_the_guide_says_what_is_exported_as_a_live_scrape_shows(stack: Stack) -> None:
    """docs/migrating-from-dcgm.md, "What is exported": "yes" rows are in the default exporter's
    scrape (h200x2-mig, default settings), "with `details`" rows only in the one with details on,
    "no" rows have no series and no compatibility rule."""
    claims = exported_claims()
    assert {c.exported for c in claims} == {"yes", "with `details`", "no"} and len(claims) >= 10, claims
    _wait(lambda: stack.result(f'nvgpu_mig_gpm_sm_activity_ratio{{node="{NODE_B}"}}'), DATA_TIMEOUT_S, "GPM", stack)

    def names(node: str) -> set[str]:
        return {r["metric"]["__name__"] for r in stack.result(f'group by (__name__) ({{node="{node}"}})')}

    default, detailed = names(NODE_B), names(NODE_A)
    recorded = set(recorded_names())
    for c in claims:
        if c.exported == "no":
            assert not c.series and c.field not in recorded, c
            continue
        assert c.series and c.field in recorded, c
        if c.exported == "yes":
            assert set(c.series) <= default, (c, set(c.series) - default)
        else:
            assert set(c.series) <= detailed and not set(c.series) & default, c
    stale = ("not exported", "no per-instance", "none as durations", "not exported yet")
    assert not [s for s in stale if s in MIGRATING.read_text()], "a stale statement is back"


# -- nvidia_gpu_exporter's names -------------------------------------------------------------------


def test_every_recorded_nvidia_smi_name_has_data_in_its_label_form(stack: Stack) -> None:
    """Every nvidia_smi_* name has data; per-GPU series carry uuid without "GPU-" and no `gpu`."""
    answers = _wait_for_names(stack, smi_names(), "recorded nvidia_smi names")
    uuids = {r["metric"]["uuid"].removeprefix("GPU-") for r in stack.result("nvgpu_gpu_info")}
    for name, result in answers.items():
        for series in result:
            labels = series["metric"]
            assert "gpu" not in labels, (name, labels)
            if not name.startswith("nvidia_smi_last_collect"):
                assert labels.get("uuid") in uuids, (name, labels)
    info = {r["metric"]["uuid"]: r["metric"] for r in answers["nvidia_smi_gpu_info"]}
    assert len(info) == 4 and all(m["index"] in ("0", "1") and m["name"] == "NVIDIA H200" for m in info.values())


# -- the published rule sets (tests/fixtures/compat) ----------------------------------------------

_COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)(?!\s*bool\b)")


def with_bool(expr: str) -> str:
    """``expr`` with every comparison outside label matchers and strings turned into a ``bool`` one:
    an alert condition then has a sample (0 or 1) for every series it compares, firing or not."""
    out: list[str] = []
    i, depth, quote = 0, 0, ""
    while i < len(expr):
        c = expr[i]
        if quote:
            out.append(c)
            if c == "\\":
                out.append(expr[i + 1])
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'`":
            quote = c
            out.append(c)
        elif c == "{":
            depth += 1
            out.append(c)
        elif c == "}":
            depth -= 1
            out.append(c)
        elif depth == 0 and (m := _COMPARISON.match(expr, i)) and expr[i : i + 2] not in ("=~", "!~"):
            out.append(m.group(1) + " bool")
            i += len(m.group(1))
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def test_with_bool_rewrites_only_comparisons() -> None:
    assert with_bool('x{a!="b", c=~"d"} > 80') == 'x{a!="b", c=~"d"} > bool 80'
    assert with_bool("a == bool 1 or b < on (x) c") == "a == bool 1 or b < bool on (x) c"
    assert with_bool('label_replace(a, "p", "$1", "p", "^[0-9]+c\\\\.(.*)$") >= 2') == (
        'label_replace(a, "p", "$1", "p", "^[0-9]+c\\\\.(.*)$") >= bool 2'
    )


def _published() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, rule)
        for path in sorted(FIXTURES.glob("*.yaml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def test_the_published_rule_sets_name_their_sources() -> None:
    readme = (FIXTURES / "README.md").read_text()
    for path in sorted(FIXTURES.glob("*.yaml")):
        assert path.read_text().startswith("# Source: "), path.name
        assert f"`{path.name}`" in readme, path.name
    names = {
        n for _f, r in _published() for n in re.findall(r"\b(DCGM_FI_[A-Z0-9_]+|nvidia_smi_[a-z0-9_]+)", r["expr"])
    }
    fallbacks = {n for n in names if n.startswith("nvidia_smi_clocks_throttle_reasons_")} | {
        "nvidia_smi_power_limit_watts"
    }
    unknown = names - set(recorded_names()) - set(smi_names()) - fallbacks
    assert not unknown, f"published rules read names no compatibility rule records: {sorted(unknown)}"


def test_every_published_expression_has_data(stack: Stack) -> None:
    """Every recording rule of the published sets records series, and every alert's condition (with
    `bool` comparisons) has data: the names they read are produced, with the labels they select."""
    published = _published()
    assert len(published) >= 60
    pending = {(f, r.get("record") or r["alert"]): r for f, r in published}
    last: dict[tuple[str, str], Any] = {}
    deadline = time.monotonic() + DATA_TIMEOUT_S
    while pending and time.monotonic() < deadline:
        for key, rule in sorted(pending.items()):
            expr = rule["record"] if "record" in rule else with_bool(rule["expr"])
            last[key] = stack.query(expr)
            if last[key].get("status") == "success" and last[key]["data"]["result"]:
                del pending[key]
        time.sleep(1)
    assert not pending, "published rules without data:\n" + "\n".join(
        f"{f} / {n}: {last.get((f, n))}\n  {with_bool(r['expr'])}" for (f, n), r in sorted(pending.items())
    )
