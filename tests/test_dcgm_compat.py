"""Issue 16 points 1 and 4: a real Prometheus scrapes the exporter over TLS with a client
certificate and basic auth, loads the dcgm-exporter compatibility rules, and answers one PromQL
query per panel of dcgm-exporter's published Grafana dashboard (grafana/dcgm-exporter-dashboard.json,
Grafana ID 12239), written here in our own words against dcgm-exporter's names.

Also: the recording rules pass promtool (check and unit tests), the PrometheusRule is their
generated copy, and docs/migrating-from-dcgm.md maps every field of dcgm-exporter's
default-counters.csv and every name the rules record.
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
from typing import Any

import pytest
from exporter_proc import ROOT, Exporter, load_scenario, write_scenario
from prometheus_proc import running_prometheus
from tls_material import PASSWORD, USER, Material, bcrypt_hash, make_material
from waiting import wait_until

yaml = pytest.importorskip("yaml")

COMPAT = ROOT / "deploy" / "prometheus" / "dcgm-compat"
RULES = COMPAT / "rules.yaml"
CRD = COMPAT / "prometheusrule.yaml"
MIGRATING = ROOT / "docs" / "migrating-from-dcgm.md"
DATA_TIMEOUT_S = 60.0

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
)  # fmt: skip

HOST = 'Hostname=~"gpu-node-1"'
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


def recorded_names() -> list[str]:
    data = yaml.safe_load(RULES.read_text())
    return [r["record"] for g in data["groups"] for r in g["rules"] if r["record"].startswith("DCGM_")]


# -- static checks ---------------------------------------------------------------------------------


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, check=False)


def test_promtool_checks_the_rules_and_their_unit_tests() -> None:
    proc = _promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tests = sorted((COMPAT / "tests").glob("*.yaml"))
    assert tests
    proc = _promtool("test", "rules", *map(str, tests))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_prometheusrule_is_the_generated_copy() -> None:
    spec = importlib.util.spec_from_file_location("gen", ROOT / "deploy" / "prometheus" / "gen_prometheusrule.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.render(RULES.read_text(), "dcgm-compat") == CRD.read_text(), (
        "run: python deploy/prometheus/gen_prometheusrule.py --set dcgm-compat"
    )


def test_every_rule_reads_only_documented_metrics() -> None:
    documented = set(re.findall(r"`(nvgpu_[a-z_]+)`", (ROOT / "docs" / "metrics.md").read_text()))
    for name in re.findall(r"\b(nvgpu_[a-z_]+)\b", RULES.read_text()):
        assert name in documented, name


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
    assert not [f for f, rest in rows.items() if "pending" in rest.lower() or "not yet" in rest], "a field waits"
    for field, rest in rows.items():
        assert rest.strip(" |"), f"{field}: empty row"


def test_every_dashboard_panel_reads_recorded_names() -> None:
    recorded = set(recorded_names())
    for panel in PANELS:
        names = set(re.findall(r"\b(DCGM_FI_[A-Z0-9_]+)\b", panel.expr))
        assert names and names <= recorded, (panel.title, names - recorded)
    assert "PENDING" not in RULES.read_text()


# -- a real Prometheus over TLS + basic auth ------------------------------------------------------


@dataclass
class Stack:
    base: str
    exporter: Exporter
    prometheus: subprocess.Popen[bytes]
    log: Path

    def query(self, expr: str) -> dict[str, Any]:
        url = f"{self.base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return dict(json.load(resp))
        except urllib.error.HTTPError as exc:
            return dict(json.loads(exc.read() or b"{}") or {"status": "error", "error": f"HTTP {exc.code}"})

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def _wait(pred: Any, timeout: float, what: str, stack: Stack) -> Any:
    return wait_until(
        pred,
        timeout,
        what,
        lambda: f"prometheus log:\n{stack.logs()}\nexporter log:\n{stack.exporter.logs()[-3000:]}",
        every=0.25,
    )


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
    data = load_scenario("h200x2")
    data["events"] = [{"at_s": 2, "gpu": 1, "event_type": "XidCriticalError", "data": 79}]
    # gpm_pipes on: the DCGM_FI_PROF_PIPE_FP*_ACTIVE rules read it (off by default)
    env = {"NVGPU_WEB_CONFIG_FILE": str(web), "NVGPU_FEATURE_GPM_PIPES": "on"}
    exporter = Exporter(write_scenario(tmp, data), tmp, env=env, interval=0.5)
    try:
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
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
                    "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"], "labels": {"node": "gpu-node-1"}}],
                }
            ],
        }
        with running_prometheus(binary, tmp, config) as prom:
            yield Stack(prom.base, exporter, prom.process, prom.log)
    finally:
        exporter.__exit__(None, None, None)


def test_prometheus_scrapes_over_tls_with_basic_auth(stack: Stack) -> None:
    """Target up == 1 with tls_config (CA + client certificate) and basic_auth."""
    _wait(
        lambda: stack.query('count_over_time(up{job="nvgpu-exporter"}[1m]) >= 3')["data"]["result"],
        DATA_TIMEOUT_S,
        "three scrapes",
        stack,
    )
    result = stack.query('up{job="nvgpu-exporter"}')["data"]["result"]
    assert [r["value"][1] for r in result] == ["1"], result
    assert stack.query("min_over_time(up[1m])")["data"]["result"][0]["value"][1] == "1"
    # ... and what it scraped is the exporter's, GPUs included
    assert len(stack.query("nvgpu_gpu_info")["data"]["result"]) == 2


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
    hosts = stack.query("count by (Hostname) (DCGM_FI_DEV_FB_FREE)")["data"]["result"]
    assert [h["metric"]["Hostname"] for h in hosts] == ["gpu-node-1"]


# Names recorded from `details` series (off by default, issue 17): no data with the default settings
# the stack runs; docs/migrating-from-dcgm.md says so in their rows.
NEEDS_DETAILS = {
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
}


def test_names_that_need_details_say_so() -> None:
    rows = _doc_rows()
    for name in NEEDS_DETAILS:
        assert "NVGPU_FEATURE_DETAILS=on" in rows[name] and "with details" in rows[name], name
    assert NEEDS_DETAILS <= set(recorded_names())


def test_every_recorded_dcgm_name_has_data_with_dcgm_labels(stack: Stack) -> None:
    names = recorded_names()
    waiting = set(names) - NEEDS_DETAILS
    deadline = time.monotonic() + DATA_TIMEOUT_S
    answers: dict[str, list[dict[str, Any]]] = {}
    while waiting and time.monotonic() < deadline:
        for name in sorted(waiting):
            answers[name] = stack.query(name)["data"]["result"]
            if answers[name]:
                waiting.discard(name)
        time.sleep(1)
    assert not waiting, sorted(waiting)
    for name, result in answers.items():
        for series in result:
            labels = series["metric"]
            for label in ("gpu", "UUID", "device", "modelName", "Hostname", "hostname", "pci_bus_id"):
                assert labels.get(label), (name, label, labels)
            assert labels["device"] == f"nvidia{labels['gpu']}" and labels["UUID"] == labels["uuid"]
    xid = {r["metric"]["gpu"]: r["value"][1] for r in stack.query("DCGM_FI_DEV_XID_ERRORS")["data"]["result"]}
    assert xid.get("0") == "0"
    _wait(
        lambda: stack.query('DCGM_FI_DEV_XID_ERRORS{gpu="1"} == 79')["data"]["result"],
        DATA_TIMEOUT_S,
        "the last Xid (79) on GPU 1",
        stack,
    )


def test_the_rules_evaluate_without_errors(stack: Stack) -> None:
    expected = len(yaml.safe_load(RULES.read_text())["groups"][0]["rules"])

    def evaluated() -> list[dict[str, Any]] | None:
        with urllib.request.urlopen(f"{stack.base}/api/v1/rules", timeout=10) as resp:
            groups = json.load(resp)["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if len(rules) == expected and all(r.get("health") != "unknown" for r in rules) else None

    rules = _wait(evaluated, 30, f"{expected} rules evaluated", stack)
    assert [f"{r['name']}: {r.get('lastError')}" for r in rules if r.get("health") != "ok"] == []


def test_profiling_names_have_dcgm_units(stack: Stack) -> None:
    """The DCGM_FI_PROF_* rules on the real exporter's GPM series: activity a ratio 0-1 (not percent),
    traffic in bytes/s (not MiB/s). The h200x2 scenario cycles idle and loaded every 5 s: graphics
    activity 0 and 0.936, PCIe transmit 0.2 and 6.5 MiB/s, receive 0.07 and 18.8 MiB/s (GPM values
    from ../shared/reference/h200/2026-11-30/gpm*.json)."""
    busiest = _wait(
        lambda: [
            r
            for r in stack.query("max_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE[1m]) > 0.5")["data"]["result"]
            if r["metric"].get("Hostname") == "gpu-node-1"
        ],
        DATA_TIMEOUT_S,
        "a loaded phase in DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        stack,
    )
    assert all(float(r["value"][1]) == pytest.approx(0.936) for r in busiest), busiest
    for name in ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                 "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_ACTIVE"):  # fmt: skip
        values = [float(r["value"][1]) for r in stack.query(f"max_over_time({name}[5m])")["data"]["result"]]
        assert len(values) == 2 and all(0 <= v <= 1 for v in values), (name, values)
    # rate() over a minute the series only partly covers reads low: wait for a whole minute of scrapes
    _wait(
        lambda: (
            len(stack.query("count_over_time(nvgpu_gpm_pcie_transmit_bytes_total[1m]) >= 50")["data"]["result"]) == 2
        ),
        DATA_TIMEOUT_S + 30,
        "a minute of GPM PCIe counters",
        stack,
    )
    mib = 1 << 20
    for name, low, high in (("DCGM_FI_PROF_PCIE_TX_BYTES", 0.2, 6.5), ("DCGM_FI_PROF_PCIE_RX_BYTES", 0.07, 18.8)):
        values = [float(r["value"][1]) for r in stack.query(name)["data"]["result"]]
        assert len(values) == 2, (name, values)
        assert all(0.9 * low * mib <= v <= 1.1 * high * mib for v in values), (name, values)
