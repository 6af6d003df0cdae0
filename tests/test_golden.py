"""Golden expositions: whole-text comparison, and a lint of every golden.

``tests/golden/<name>.snapshot.json`` holds what a real worker sent for a golden scenario at
scenario time 0 (``tests/golden/capture.py``). The test feeds those messages to a real
:class:`exporter.supervisor.supervisor.Supervisor` (with the supervisor-side integrations attached, as
``cli.serve`` does), renders the exposition and compares it with ``tests/golden/<name>.prom``.

Regenerate after an intended change, then review the diff like code::

    UPDATE_GOLDEN=1 python -m pytest -q tests/test_golden.py

(re-captures the fixtures from the real worker and rewrites the ``.prom`` files).

The lint checks every golden against docs/design.md "Names" and docs/metrics.md: the ``nvgpu_``
namespace, ``_total`` exactly on counters, base units only, the labels each metric may carry,
that every documented metric appears in some golden (or is listed in ``NOT_YET_EMITTED`` with a
reason), that every emitted metric is documented, that every metric a dashboard or alert rule uses
is in a golden, and ``promtool check metrics``.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from goldens import DOCS, GOLDEN, GOLDENS, Doc, Family

from exporter.app import build_supervisor
from exporter.common import fileio
from exporter.common.breadcrumb import Breadcrumb
from exporter.common.snapshot import InitFailed
from exporter.common.snapshotdecode import decode_message
from exporter.config import Config
from exporter.supervisor import exposition, procmetrics, selfmetrics
from exporter.supervisor.http.httpedge import HttpEdge
from exporter.supervisor.kernel_xid import KernelXid
from exporter.supervisor.pods import PodAttribution
from exporter.supervisor.policy import Outcome
from exporter.supervisor.stuck import StuckDetector
from exporter.supervisor.supervisor import Supervisor
from guards import features as gf
from guards import featuretable

ROOT = Path(__file__).resolve().parent.parent
UPDATE = os.environ.get("UPDATE_GOLDEN", "") not in ("", "0")
NAMESPACES = ("nvgpu_", "process_")  # ours, and the standard process collector's (exporter/supervisor/procmetrics.py)
PLACEHOLDER_VERSION = "0.0.0"

# Documented metrics no golden shows yet, each with the reason. Keep this short.
NOT_YET_EMITTED: dict[str, str] = {
    "nvgpu_confidential_computing_protected_memory_total_bytes": "CC on with details: no golden (tests/test_c2c.py)",
    "nvgpu_confidential_computing_protected_memory_used_bytes": "CC on with details: no golden (tests/test_c2c.py)",
}

BASE_UNITS = ("bytes", "seconds", "celsius", "watts", "joules", "hertz", "ratio")
NON_BASE_UNIT = re.compile(
    r"_(kib|mib|gib|kb|mb|gb|kilobytes|megabytes|percent|percentage|pct|khz|mhz|ghz|mw|milliwatts|kw|mj|"
    r"millijoules|kj|ms|msec|milliseconds|us|usec|microseconds|ns|nanoseconds|minutes|hours|days|"
    r"fahrenheit|kelvin|celcius|degrees|volts|millivolts|amps|amperes|rpm)(?=_|$)"
)


# -- building a golden --------------------------------------------------------------------------------


def golden_names() -> list[str]:
    return sorted(p.name[: -len(".snapshot.json")] for p in GOLDEN.glob("*.snapshot.json"))


def _extension(sup: Supervisor, kind: type[Any]) -> Any:
    ext = sup.state.extension(kind)
    assert ext is not None, f"the default extensions do not include {kind.__name__}"
    return ext


def _before_worker(sup: Supervisor) -> None:
    """An earlier worker whose nvmlInit failed (the driver was not loaded yet at boot)."""
    sup.handle(InitFailed(9, "DRIVER_NOT_LOADED", "DRIVER_NOT_LOADED: Driver Not Loaded", "580.159.04"))


def _supervisor_side_faults(sup: Supervisor, fixture: dict[str, Any]) -> None:
    """State the worker cannot send: a crash (quarantined), the kernel log, pods on GPU 0 (one with a
    name that cannot be encoded: its series is dropped and counted), a contained supervisor error."""
    hello = next(m for m in fixture["messages"] if m["type"] == "hello")
    uuid0 = next(g["uuid"] for g in hello["gpus"] if g["index"] == 0)
    crumb = Breadcrumb("nvlink", "nvmlDeviceGetNvLinkErrorCounter", uuid0, 1_699_999_990.0, True)
    sup.account(Outcome("crash", -11, 11, crumb, 42.0, True, ""))
    _extension(sup, KernelXid).up = True
    pods = _extension(sup, PodAttribution)
    pods.up = True
    pods.assignments = {
        uuid0: (
            SimpleNamespace(namespace="ml", pod="train-0", container="trainer"),
            SimpleNamespace(namespace="ml", pod="bad-\udc80", container="trainer"),
        )
    }
    try:
        raise OSError(24, "Too many open files")  # what a failed spawn looks like
    except OSError:
        sup.state.count_error("lifecycle", "starting a worker")
    edge = _extension(sup, HttpEdge)  # a web config in force, a few refusals
    edge.open, edge.max_connections = 3, 1024
    edge.dropped.update({"header_timeout": 1, "tls_handshake": 2, "evicted": 5})
    edge.denied.update({"unauthorized": 4, "failed_logins": 1})
    edge.watcher = SimpleNamespace(last_reload_ok=False, last_reload_time=1_699_999_000.0)
    sup.state.worker.pid = 4242  # the worker's process_* series
    # A kernel-log Xid 13 naming its process, which the worker mapped to a pod.
    sup.state.record_xid("0", uuid0, 13, 1_699_999_995.0, "kernel log", 31337, "python3")
    sup.state.xids.attribute_pod(31337, "0f0e0d0c-0b0a-4908-8706-050403020100", "ml", "train-0", "trainer")


def _supervisor_side_pods(sup: Supervisor, fixture: dict[str, Any]) -> None:
    """Golden 'processes': the kubelet's holders (two pods time-slice GPU 0, two MPS clients GPU 1)."""
    hello = next(m for m in fixture["messages"] if m["type"] == "hello")
    uuid = {g["index"]: g["uuid"] for g in hello["gpus"]}
    pods = _extension(sup, PodAttribution)
    pods.up = True

    def ref(namespace: str, pod: str, container: str) -> SimpleNamespace:
        return SimpleNamespace(namespace=namespace, pod=pod, container=container)

    pods.assignments = {
        uuid[0]: (ref("ml", "notebook-1", "jupyter"), ref("research", "notebook-2", "jupyter")),
        uuid[1]: (ref("batch", "infer-0", "server"), ref("batch", "infer-1", "server")),
    }


def _fixed_process_stats(pid: int) -> procmetrics.ProcStats:
    """Stand-in numbers for the process_* families (real ones change every run)."""
    if pid == 4242:
        return procmetrics.ProcStats(12.5, 95_000_000, 900_000_000, 1_699_999_940.0, 21, 1_048_576)
    return procmetrics.ProcStats(3.25, 52_000_000, 600_000_000, 1_699_999_900.0, 17, 1_048_576)


def _supervisor_side_mig_pods(sup: Supervisor, fixture: dict[str, Any]) -> None:
    """Golden 'h200x2-mig': the kubelet's holders of MIG devices of GPU 0 (by MIG UUID, and
    one in the pre-R470 MIG-GPU-<uuid>/<gi>/<ci> form), a MIG UUID no GPU has, a device id of the
    index strategy, and GPU 1 whole."""
    hello = next(m for m in fixture["messages"] if m["type"] == "hello")
    uuid = {g["index"]: g["uuid"] for g in hello["gpus"]}
    snap = next(m for m in fixture["messages"] if m["type"] == "snapshot")
    devices = snap["gpus"][0]["readings"]["mig"]["devices"]
    by_gi = {(d["gpu_instance_id"], d["compute_instance_id"]): d["uuid"] for d in devices}
    pods = _extension(sup, PodAttribution)
    pods.up = True

    def ref(namespace: str, pod: str, container: str) -> SimpleNamespace:
        return SimpleNamespace(namespace=namespace, pod=pod, container=container)

    pods.assignments = {
        by_gi[(2, 0)]: (ref("ml", "train-3g", "trainer"),),
        f"MIG-{uuid[0]}/3/1": (ref("infer", "small-1", "server"),),
        by_gi[(10, 0)]: (ref("infer", "tiny-0", "server"),),
        "MIG-00000000-0000-5000-8000-000000000000": (ref("infer", "gone-0", "server"),),
        uuid[1]: (ref("ml", "full-gpu-0", "trainer"),),
    }
    pods.unparsed = {"0:3": (ref("legacy", "index-strategy-0", "app"),)}


def render_golden(name: str, openmetrics: bool = False) -> str:
    """The exposition of golden ``name`` from its fixture (text 0.0.4, or OpenMetrics 1.0)."""
    fixture = json.loads((GOLDEN / f"{name}.snapshot.json").read_text())
    modes = {
        **dict.fromkeys(featuretable.FEATURES, gf.Mode.AUTO),
        **{k: gf.Mode(v) for k, v in fixture["modes"].items()},
    }
    config = Config(
        state_file="",
        interval_s=0.5,
        stale_s=1.5,
        stuck_after_s=0.5,
        quarantine_after=1,
        feature_modes=modes,
        kmsg_path="/nonexistent/kmsg",
        pod_resources_socket="/nonexistent/kubelet.sock",
    )

    async def build() -> str:
        sup = build_supervisor(config)  # the extensions attached, not run: no kernel log or kubelet here
        state = sup.state
        state.verdicts.wall = lambda: 1_700_000_000.0  # the verdicts' since-timestamps: fixed like the others
        try:
            state.python_version = PLACEHOLDER_VERSION
            state.selfchecks = {"supervisor": decode_message({"type": "selfcheck", **fixture["supervisor_selfcheck"]})}
            if name == "faults":
                _before_worker(sup)
            # Replayed messages arrive as far apart as they were taken: every monotonic clock that
            # decides (the stuck signature's hold, the Xid windows) runs on the fixture's times.
            arrival = [1_700_000_000.0]
            stuck = _extension(sup, StuckDetector)
            if stuck is not None:
                stuck.clock = lambda: arrival[0]
            state.verdicts.clock = state.xids.clock = state.xids.wall = lambda: arrival[0]
            for msg in fixture["messages"]:
                arrival[0] = float(msg.get("ts", arrival[0])) if msg["type"] == "snapshot" else arrival[0]
                sup.handle(decode_message(msg))
            state.worker.started_at = 1_699_999_940.0
            if name == "faults":
                _supervisor_side_faults(sup, fixture)
            if name == "processes":
                _supervisor_side_pods(sup, fixture)
            if name == "h200x2-mig":
                _supervisor_side_mig_pods(sup, fixture)
            # file reads are counted per process: the faults golden shows one refused web config reload
            file_failures = {("web_config", "not_regular"): 1} if name == "faults" else {}
            state.verdicts.update(state)  # after the supervisor-side state added above
            with (
                mock.patch.object(selfmetrics, "__version__", PLACEHOLDER_VERSION),
                mock.patch.object(procmetrics, "read", _fixed_process_stats),
                mock.patch.object(state, "sample_age", lambda: 0.25),  # rendered a moment after the last sample
                mock.patch.dict(fileio.FAILURES, file_failures, clear=True),
            ):
                exposition.render(state)  # the first rendering counts what it had to drop
                rendered = exposition.render(state)
                return (rendered.openmetrics if openmetrics else rendered.text).decode()
        finally:
            sup.close()

    return asyncio.run(build())


@pytest.fixture(scope="module", autouse=True)
def update_goldens() -> None:
    if not UPDATE:
        return
    import importlib.util

    spec = importlib.util.spec_from_file_location("golden_capture", GOLDEN / "capture.py")
    assert spec and spec.loader
    capture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(capture)
    for name in sorted(capture.GOLDENS):
        capture.capture(name)
        (GOLDEN / f"{name}.prom").write_text(render_golden(name))


@pytest.mark.parametrize("name", golden_names())
def test_golden_exposition(name: str) -> None:
    want = (GOLDEN / f"{name}.prom").read_text()
    got = render_golden(name)
    if got != want:
        diff = "".join(
            difflib.unified_diff(want.splitlines(True), got.splitlines(True), f"{name}.prom", "rendered", n=1)
        )
        pytest.fail(f"exposition differs from tests/golden/{name}.prom (UPDATE_GOLDEN=1 to accept):\n{diff[:6000]}")


# -- what a golden and docs/metrics.md say --------------------------------------------------------


def all_families() -> list[tuple[str, Family]]:
    return [(g, fam) for g, fams in sorted(GOLDENS.items()) for fam in fams.values()]


def test_goldens_and_docs_present() -> None:
    assert {"h200x2", "faults", "processes", "h200x2-mig"} <= set(GOLDENS), "run UPDATE_GOLDEN=1 to create the goldens"
    assert len(DOCS) > 50


def lint_problems(fam: Family, docs: dict[str, Doc]) -> list[str]:
    """Everything wrong with one family by docs/design.md "Names" and docs/metrics.md; empty if fine."""
    name = fam.name
    out = []
    if not name.startswith(NAMESPACES):
        out.append(f"{name}: not in the nvgpu_ namespace (or the standard process_ names)")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        out.append(f"{name}: not snake_case")
    if not fam.help.strip():
        out.append(f"{name}: no HELP")
    if fam.type not in ("counter", "gauge"):
        out.append(f"{name}: type {fam.type}")
    if name.endswith("_total") != (fam.type == "counter"):
        out.append(f"{name}: _total must be on counters and only on counters ({fam.type})")
    stem = name[: -len("_total")] if name.endswith("_total") else name
    if stem.endswith("_total") or stem.endswith("_count"):
        out.append(f"{name}: doubled suffix")
    if NON_BASE_UNIT.search(stem):
        out.append(f"{name}: not a base unit ({NON_BASE_UNIT.search(stem).group(0)})")  # type: ignore[union-attr]
    tokens = stem.split("_")
    for unit in BASE_UNITS:
        if unit in tokens[1:] and tokens[-1] != unit:
            out.append(f"{name}: the unit {unit} must end the name (before _total)")
    if tokens[-1] == "joules" and fam.type != "counter":
        out.append(f"{name}: energy in joules is a counter (_joules_total)")
    if tokens[-1] == "ratio" and fam.type != "gauge":
        out.append(f"{name}: a ratio is a gauge")
    doc = docs.get(name)
    if doc is None:
        return [*out, f"{name}: emitted but not documented in docs/metrics.md"]
    if doc.type != fam.type:
        out.append(f"{name}: documented as {doc.type}, emitted as {fam.type}")
    for sample, labels, value in fam.samples:
        if sample != name:
            out.append(f"{name}: stray series {sample}")
        extra = set(labels) - doc.labels
        if extra:
            out.append(f"{name}: labels {sorted(extra)} not documented")
        if doc.per_gpu and not {"gpu", "uuid"} <= set(labels):
            out.append(f"{name}: per-GPU series without gpu/uuid {labels}")
        if doc.per_gpu and not re.fullmatch(r"\d+", labels.get("gpu", "")):
            out.append(f"{name}: gpu label {labels.get('gpu')!r} is not an NVML index")
        if not doc.per_gpu and {"gpu", "uuid"} & set(labels):
            out.append(f"{name}: exporter metric with gpu/uuid")
        if {"hostname", "instance", "job"} & set(labels):
            out.append(f"{name}: target label {sorted({'hostname', 'instance', 'job'} & set(labels))}")
        if not math.isfinite(value) or abs(value) >= 2**63:
            out.append(f"{name}: value {value} {labels}")
    return out


@pytest.mark.parametrize(("golden", "name"), [(g, f.name) for g, f in all_families()])
def test_lint_family(golden: str, name: str) -> None:
    assert lint_problems(GOLDENS[golden][name], DOCS) == []


_G = {"gpu": "0", "uuid": "GPU-x"}
BAD_FAMILIES = {
    "namespace": Family("gpu_temperature_celsius", "gauge", "h", [("gpu_temperature_celsius", _G, 1.0)]),
    "mib": Family("nvgpu_memory_used_mib", "gauge", "h", [("nvgpu_memory_used_mib", _G, 1.0)]),
    "percent": Family("nvgpu_gpu_utilization_percent", "gauge", "h", [("nvgpu_gpu_utilization_percent", _G, 1.0)]),
    "total_on_gauge": Family("nvgpu_power_total", "gauge", "h", [("nvgpu_power_total", _G, 1.0)]),
    "counter_without_total": Family(
        "nvgpu_pcie_replay_errors", "counter", "h", [("nvgpu_pcie_replay_errors", _G, 1.0)]
    ),
    "joules_gauge": Family("nvgpu_energy_joules", "gauge", "h", [("nvgpu_energy_joules", _G, 1.0)]),
    "unit_not_last": Family("nvgpu_bytes_memory_used", "gauge", "h", [("nvgpu_bytes_memory_used", _G, 1.0)]),
    "undocumented": Family("nvgpu_gpu_mood", "gauge", "h", [("nvgpu_gpu_mood", _G, 1.0)]),
    "no_help": Family("nvgpu_up", "gauge", "", [("nvgpu_up", {}, 1.0)]),
    "extra_label": Family(
        "nvgpu_power_usage_watts", "gauge", "h", [("nvgpu_power_usage_watts", {**_G, "hostname": "n1"}, 1.0)]
    ),
    "missing_uuid": Family("nvgpu_power_usage_watts", "gauge", "h", [("nvgpu_power_usage_watts", {"gpu": "0"}, 1.0)]),
    "gpu_on_self_metric": Family("nvgpu_up", "gauge", "h", [("nvgpu_up", _G, 1.0)]),
    "nan": Family("nvgpu_fan_speed_ratio", "gauge", "h", [("nvgpu_fan_speed_ratio", {**_G, "fan": "0"}, math.nan)]),
    "sentinel": Family(
        "nvgpu_compute_processes_memory_used_bytes",
        "gauge",
        "h",
        [("nvgpu_compute_processes_memory_used_bytes", _G, float(2**64 - 1))],
    ),
    "wrong_type": Family("nvgpu_ecc_errors_total", "gauge", "h", [("nvgpu_ecc_errors_total", _G, 1.0)]),
}


@pytest.mark.parametrize("case", sorted(BAD_FAMILIES))
def test_lint_catches(case: str) -> None:
    assert lint_problems(BAD_FAMILIES[case], DOCS), case


def _label_value_params() -> list[str]:
    return [name for name, doc in sorted(DOCS.items()) if doc.values and any(name in fams for fams in GOLDENS.values())]


@pytest.mark.parametrize("name", _label_value_params())
def test_label_values_documented(name: str) -> None:
    doc = DOCS[name]
    for fams in GOLDENS.values():
        for _, labels, _ in fams[name].samples if name in fams else []:
            for label, allowed in doc.values.items():
                if label not in labels and name.startswith("process_"):
                    continue  # the supervisor's process_* series carry no label (docs/metrics.md)
                assert labels[label] in allowed, f"{name}{{{label}={labels[label]!r}}} not in {sorted(allowed)}"


def emitted() -> set[str]:
    return {name for fams in GOLDENS.values() for name, fam in fams.items() if fam.samples}


def test_every_documented_metric_in_a_golden() -> None:
    missing = set(DOCS) - emitted() - set(NOT_YET_EMITTED)
    assert not missing, (
        f"documented but in no golden (add to a golden or to NOT_YET_EMITTED with a reason): {sorted(missing)}"
    )
    stale = set(NOT_YET_EMITTED) & emitted()
    assert not stale, f"listed as not yet emitted but a golden has them now: {sorted(stale)}"
    assert set(NOT_YET_EMITTED) <= set(DOCS)


def _names_used_by_dashboards_and_rules() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for base in (ROOT / "dashboards", ROOT / "deploy" / "prometheus"):
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if path.suffix not in (".json", ".yaml", ".yml", ".py") or not path.is_file():
                continue
            for name in re.findall(r"(?<![A-Za-z0-9_:])nvgpu_[a-z0-9_]*[a-z0-9]", path.read_text(errors="replace")):
                used.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return used


def test_metrics_used_by_dashboards_and_rules_are_in_a_golden() -> None:
    used = _names_used_by_dashboards_and_rules()
    if not used:
        pytest.skip("no dashboards/ or deploy/prometheus/ in this checkout")
    missing = {name: sorted(paths) for name, paths in used.items() if name not in emitted()}
    assert not missing, f"used by dashboards/alerts but in no golden: {missing}"


@pytest.mark.parametrize("name", golden_names())
def test_golden_state_renders_strict_openmetrics(name: str) -> None:
    """The OpenMetrics encoding of each golden state passes the strict OpenMetrics parser and holds
    the same families as the text golden."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

    text = render_golden(name, openmetrics=True)
    assert text.endswith("# EOF\n")
    families = {f.name + ("_total" if f.type == "counter" else "") for f in parse_openmetrics(text)}
    assert families == set(GOLDENS[name])


# -- promtool -------------------------------------------------------------------------------------


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_promtool_check_metrics(name: str) -> None:
    assert PROMTOOL is not None
    text = (GOLDEN / f"{name}.prom").read_bytes()
    proc = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        proc.returncode,
        proc.stdout.decode(),
        proc.stderr.decode(),
    )


@pytest.mark.parametrize("name", golden_names())
def test_the_openmetrics_body_of_every_golden(name: str) -> None:
    """Our OpenMetrics body against prometheus_client's OpenMetrics writer fed with the parsed text golden."""
    from prometheus_client.openmetrics import exposition as client_om
    from prometheus_client.parser import text_string_to_metric_families

    parsed = list(text_string_to_metric_families((GOLDEN / f"{name}.prom").read_text()))

    class Parsed:
        def collect(self) -> list[Any]:
            return parsed

    got = render_golden(name, openmetrics=True).encode()
    assert got == client_om.generate_latest(Parsed())  # type: ignore[no-untyped-call]
    assert got.endswith(b"\n# EOF\n")
