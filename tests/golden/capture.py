"""Capture what a real worker sends for a golden scenario, at scenario time 0, as a JSON fixture.

``python tests/golden/capture.py NAME`` (or ``UPDATE_GOLDEN=1 pytest tests/test_golden.py``) runs
the real ``exporter.worker`` module in a child process on the golden's scenario, with the fake
NVML's clock pinned to scenario time 0 (so cycles, ramps and sequences give their first values and
field-value timestamps are fixed), reads its protocol lines from the message pipe, and writes
``tests/golden/NAME.snapshot.json``. The test renders that fixture through a real Supervisor and
compares the exposition with ``tests/golden/NAME.prom``.

What varies from run to run or machine to machine is normalised: timestamps and durations
(fixed values), the worker's pid, module paths and third-party versions (placeholders). The first
snapshot is skipped (its call count includes one-off discovery and it may race the event thread's
registration); the next ``snapshots`` are kept.

Goldens:

- ``h200x1``, ``h200x2``, ``h200x8``: the shipped H200 scenarios as they are, default settings
  (``tests/test_series_budget.py`` counts their series per GPU against the budget).
- ``detailed``: h200x2 with the switches that add per-GPU series on (``details``, ``nvlink_links``)
  and link 5 of GPU 0 counting replay errors.
- ``faults``: h200x2 with a fan-cooled GPU 0 whose power reading fails (UNKNOWN), GPU 1 lost
  (GPU_IS_LOST), ecc switched off and kernel_xid switched on by env, two NVML events on GPU 0 (Xid 79,
  double-bit ECC) and GPU 0 showing the stuck-context signature (100 % busy, no memory, no
  processes: its one record comes back with pid and memory swapped and is dropped), link 3 of GPU 0
  counting recovery errors (its own series by default), nvlink_throughput off (GPM's NVLink
  bytes then) and GPU 0's memory temperature reading 4294967295 °C (dropped and counted in
  ``nvgpu_readings_dropped_total``). The test adds
  the supervisor-side state a worker cannot send: a worker crash in nvlink (quarantined after one
  crash), a readable kernel log and a kubelet pod holding GPU 0.
- ``processes``: h200x2 with two pods time-slicing GPU 0 (plus a graphics process outside any pod)
  and two MPS clients on GPU 1 (plus the MPS server in the control daemon's pod), per-process
  series on with a cap of 2, and a fake /proc and /var/log/containers naming them. The test adds
  the kubelet's holders.
- ``h200x2-mig``: the shipped MIG scenario: GPU 0 in MIG mode with a 3g.71gb, a 2g.35gb
  split into two compute instances and two 1g.18gb GPU instances, GPU 1 with MIG off. The test adds
  the kubelet's holders: MIG devices by UUID and in the pre-R470 form, one MIG UUID no GPU has, an
  index-strategy id, and a whole GPU.
- ``a100x2-r535``, ``l40sx2-r550``, ``h100x2-r550``, ``gh200x1-r570``, ``b200x2-r570``,
  ``gb200x2-r580``: the shipped scenarios of other generations and driver branches as they are,
  default settings (``tests/test_series_budget.py`` counts them too; ``tests/test_generations.py``
  checks them against docs/capabilities.json).
- ``gh200``: a Grace Hopper module (h200x1 with GPU power 300 W, module power 650 W, energy rising at
  650 W): the power scopes in separate families; ``gpm_pipes`` switched on.

Every golden reads /proc and /var/log/containers from a temporary directory (empty unless the
golden builds a fake one), never from the capturing machine.
"""

from __future__ import annotations

import copy
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SCENARIOS = ROOT / "exporter" / "common" / "scenarios"

T0 = 1_700_000_000.0  # Unix time of scenario time 0 in every fixture
INTERVAL_S = 0.5
PLACEHOLDER_VERSION = "0.0.0"


def _h200x2() -> tuple[dict[str, Any], dict[str, str]]:
    return json.loads((SCENARIOS / "h200x2.json").read_text()), {}


def _h200x1() -> tuple[dict[str, Any], dict[str, str]]:
    return json.loads((SCENARIOS / "h200x1.json").read_text()), {}


def _h200x8() -> tuple[dict[str, Any], dict[str, str]]:
    return json.loads((SCENARIOS / "h200x8.json").read_text()), {}


def _link_errors(gpu: dict[str, Any], link: int, counter: int, field: int, count: int) -> None:
    """``count`` errors of one kind on one link, as both the per-call counter and its field report it."""
    gpu["values"][f"nvmlDeviceGetNvLinkErrorCounter:{link},{counter}"] = count
    gpu["fields"][f"{field}:{link}"] = count


def _detailed() -> tuple[dict[str, Any], dict[str, str]]:
    """Every switch that adds per-GPU series on (details, nvlink_links), with link 5 of
    GPU 0 replaying."""
    scenario, _ = _h200x2()
    scenario["description"] = "golden 'detailed': h200x2 with details and nvlink_links on, link 5 of GPU 0 replaying"
    _link_errors(scenario["gpus"][0], 5, 0, 161, 12)
    return scenario, {"details": "on", "nvlink_links": "on"}


def _faults() -> tuple[dict[str, Any], dict[str, str]]:
    scenario, _ = _h200x2()
    scenario["description"] = "golden 'faults': h200x2 with fans, a failing power reading, a lost GPU, events"
    g0 = scenario["gpus"][0]["values"]
    g0["nvmlDeviceGetNumFans"] = 2  # a fan-cooled board, to exercise the fan family
    g0["nvmlDeviceGetFanSpeed_v2:0"] = 45
    g0["nvmlDeviceGetFanSpeed_v2:1"] = 47
    g0["nvmlDeviceGetPowerUsage"] = {"error": "UNKNOWN"}  # transient: counted, sample omitted
    g0["nvmlDeviceGetUtilizationRates"] = {"gpu": 100, "memory": 0}  # stuck-context signature
    g0["nvmlDeviceGetMemoryInfo"] = {"total": 150754820096, "reserved": 644939776, "free": 150109880320, "used": 0}
    g0.update({f"nvmlGpmMetricsGet:{m}": 0.0 for m in (2, 3, 5, 10)})  # GPM: no SM works on the wedged GPU
    g0["nvmlGpmMetricsGet:1"] = 100.0
    scenario["faults"] = [
        {"function": "nvmlDeviceGetUtilizationRates", "gpu": 1, "action": "error", "error": "GPU_IS_LOST"}
    ]
    _link_errors(scenario["gpus"][0], 3, 1, 162, 2)  # an erroring link's own series by default
    # HBM temperature read as NVML_VALUE_NOT_AVAILABLE: not exported, counted as implausible
    scenario["gpus"][0]["fields"]["82"] = 4294967295
    scenario["events"] = [
        {"at_s": 0, "gpu": 0, "event_type": "XidCriticalError", "data": 79},
        {"at_s": 0, "gpu": 0, "event_type": "DoubleBitEccError"},
    ]
    swapped = {"struct": "swapped", "records": [_rec(9980, 6498025472)]}  # pid/memory swapped
    for fn in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"):
        g0[fn] = swapped
    return scenario, {"ecc": "off", "kernel_xid": "on", "nvlink_throughput": "off"}


def _gh200() -> tuple[dict[str, Any], dict[str, str]]:
    """Power scope: a Grace Hopper module whose GPU draws 300 W and whole module 650 W,
    with the energy counter rising at the module's 650 W (synthetic: no Grace module was measured);
    GPM pipe activity switched on."""
    scenario = json.loads((SCENARIOS / "h200x1.json").read_text())
    scenario["description"] = "golden 'gh200': h200x1 as a Grace Hopper module (GPU 300 W, module 650 W), gpm_pipes on"
    g = scenario["gpus"][0]
    g["name"] = "NVIDIA GH200 480GB"
    g["values"]["nvmlDeviceGetPowerUsage"] = 300_000
    g["values"]["nvmlDeviceGetTotalEnergyConsumption"] = {"ramp": 2_461_760, "per_s": 650_000}
    g["fields"]["185:0"] = 300_000
    g["fields"]["185:1"] = 650_000
    return scenario, {"gpm_pipes": "on"}


# -- golden "processes" ------------------------------------------------------------------

GIB = 1 << 30


def _rec(pid: int, mem: int) -> dict[str, Any]:
    return {"pid": pid, "usedGpuMemory": mem, "gpuInstanceId": 4294967295, "computeInstanceId": 4294967295}


def _util(pid: int, sm: int, mem: int) -> dict[str, Any]:
    return {"pid": pid, "smUtil": sm, "memUtil": mem, "encUtil": 0, "decUtil": 0}


def _pod_containers() -> dict[str, Any]:
    sys.path.insert(0, str(HERE.parent))
    from fakeproc import Container

    return {
        "a": Container("ml", "notebook-1", "jupyter"),
        "b": Container("research", "notebook-2", "jupyter"),
        "c": Container("batch", "infer-0", "server"),
        "d": Container("batch", "infer-1", "server"),
        "daemon": Container("gpu-operator", "nvidia-device-plugin-mps-control-daemon-x7k2p", "mps-control-daemon"),
    }


def _processes() -> tuple[dict[str, Any], dict[str, str]]:
    scenario, _ = _h200x2()
    scenario["description"] = "golden 'processes': pods time-slicing GPU 0, MPS clients on GPU 1"
    g0, g1 = (g["values"] for g in scenario["gpus"])
    g0["nvmlDeviceGetComputeRunningProcesses_v3"] = [_rec(101, 3 * GIB), _rec(201, 7 * GIB)]
    g0["nvmlDeviceGetGraphicsRunningProcesses_v3"] = [_rec(301, 256 << 20)]
    g0["nvmlDeviceGetProcessUtilization"] = [_util(101, 10, 2), _util(201, 80, 30)]
    g1["nvmlDeviceGetComputeRunningProcesses_v3"] = [_rec(500, 512 << 20)]
    g1["nvmlDeviceGetMPSComputeRunningProcesses_v3"] = [_rec(601, 2 * GIB), _rec(602, 4 * GIB)]
    g1["nvmlDeviceGetProcessUtilization"] = [_util(601, 30, 5), _util(602, 40, 6)]
    return scenario, {"process_usage": "on"}


def _processes_host(tmp: Path) -> dict[str, Any]:
    """A fake /proc (hostPID) and /var/log/containers for the 'processes' golden."""
    from fakeproc import make_container_logs, make_proc

    c = _pod_containers()
    proc = make_proc(
        tmp / "proc",
        {
            101: ("python3", c["a"]),
            201: ("python", c["b"]),
            301: ("Xorg", None),
            500: ("nvidia-cuda-mps", c["daemon"]),
            601: ("tritonserver", c["c"]),
            602: ("tritonserver", c["d"]),
        },
    )
    logs = make_container_logs(tmp / "containers", list(c.values()))
    return {"proc_path": str(proc), "container_log_dir": str(logs), "process_series_per_gpu": 2}


def _h200x2_mig() -> tuple[dict[str, Any], dict[str, str]]:
    """The shipped MIG scenario as it is (GPU 0 in MIG mode with mixed profiles, GPU 1 not)."""
    return json.loads((SCENARIOS / "h200x2-mig.json").read_text()), {}


# The shipped scenarios of other GPU generations and driver branches (docs/scenarios.md, "Other
# generations"), each as it is with default settings: a golden per generation.
GENERATION_SCENARIOS = ("a100x2-r535", "l40sx2-r550", "h100x2-r550", "gh200x1-r570", "b200x2-r570", "gb200x2-r580")


def _shipped(name: str) -> Callable[[], tuple[dict[str, Any], dict[str, str]]]:
    def load() -> tuple[dict[str, Any], dict[str, str]]:
        scenario = json.loads((SCENARIOS / f"{name}.json").read_text())
        # the golden is scenario time 0: events later in the scenario (GB200's Xids) never arrive there
        scenario["events"] = [e for e in scenario.get("events", []) if e["at_s"] <= 0]
        return scenario, {}

    return load


GOLDENS: dict[str, Callable[[], tuple[dict[str, Any], dict[str, str]]]] = {
    "h200x1": _h200x1,
    "h200x2": _h200x2,
    "h200x8": _h200x8,
    "detailed": _detailed,
    "faults": _faults,
    "gh200": _gh200,
    "processes": _processes,
    "h200x2-mig": _h200x2_mig,
    **{name: _shipped(name) for name in GENERATION_SCENARIOS},
}
SNAPSHOTS = {
    "h200x1": 1,
    "h200x2": 1,
    "h200x8": 1,
    "detailed": 1,
    "faults": 2,
    "gh200": 1,
    "processes": 1,
    "h200x2-mig": 1,
    **dict.fromkeys(GENERATION_SCENARIOS, 1),
}
# Per golden: Config fields for the node around the worker (fake /proc and container logs).
HOSTS: dict[str, Callable[[Path], dict[str, Any]]] = {"processes": _processes_host}


def fixture_path(name: str) -> Path:
    return HERE / f"{name}.snapshot.json"


# -- normalisation ---------------------------------------------------------------------------------


def _site_dirs() -> list[str]:
    import site
    import sysconfig

    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    return sorted((d for d in dirs if d), key=len, reverse=True)


def _norm_path(path: str | None) -> str | None:
    if not path:
        return path
    for d in _site_dirs():
        if path.startswith(d + os.sep):
            return "<site-packages>/" + path[len(d) + 1 :]
    if path.startswith(str(ROOT) + os.sep):
        return "<repo>/" + path[len(str(ROOT)) + 1 :]
    return re.sub(r"^.*/(site|dist)-packages/", "<site-packages>/", path)


def normalise_selfcheck(result: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(result)
    for m in out.get("modules", []):
        m["path"] = _norm_path(m.get("path"))
        for key in ("version", "distribution_version"):
            if m.get(key):
                m[key] = PLACEHOLDER_VERSION
        if m.get("shadowed_by"):
            m["shadowed_by"] = _norm_path(m["shadowed_by"])
    return out


def _norm_system(system: dict[str, Any]) -> dict[str, Any]:
    system = dict(system)
    if system.get("nvidia_ml_py_version"):
        system["nvidia_ml_py_version"] = PLACEHOLDER_VERSION
    return system


def normalise(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    k = 0
    for msg in copy.deepcopy(messages):
        kind = msg["type"]
        if kind == "selfcheck":
            msg = {"v": msg["v"], "type": kind, **normalise_selfcheck(msg)}
        elif kind == "hello":
            msg["pid"] = 0
            msg["system"] = _norm_system(msg.get("system", {}))
        elif kind == "event":
            msg["ts"] = T0
        elif kind == "snapshot":
            msg["ts"] = T0 + k * INTERVAL_S
            k += 1
            msg["duration_s"] = 0.004
            msg["system"] = _norm_system(msg.get("system", {}))
            for f in msg["features"].values():
                f["duration_s"] = 0.0005
        out.append(msg)
    return out


# -- capture -------------------------------------------------------------------------------------------


def _child() -> None:
    """Run the real worker module with the fake's clock pinned at scenario time 0."""
    import runpy

    from exporter.worker.fakenvml import binding

    original = binding.FakeNvml.__init__

    def pinned(self: Any, path: str, epoch: float | None = None, clock: Any = None) -> None:
        original(self, path, epoch=T0, clock=lambda: T0)

    binding.FakeNvml.__init__ = pinned  # type: ignore[method-assign]
    runpy.run_module("exporter.worker", run_name="__main__", alter_sys=True)


def capture(name: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Run the worker on golden ``name``; returns the fixture (also written to disk)."""
    from exporter.common import selfcheck
    from exporter.common.workerconfig import ENV_VAR
    from exporter.config import Config
    from exporter.supervisor.workerproc import worker_config
    from guards import features as gf
    from guards import featuretable

    scenario, modes = GOLDENS[name]()
    keep = SNAPSHOTS[name]
    want_events = len(scenario.get("events", []))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.json"
        path.write_text(json.dumps(scenario))
        host = {"proc_path": str(Path(tmp) / "no-proc"), "container_log_dir": str(Path(tmp) / "no-containers")}
        if name in HOSTS:
            host.update(HOSTS[name](Path(tmp)))
        config = Config(
            nvml_backend=f"fake:{path}",
            interval_s=INTERVAL_S,
            feature_modes={
                **dict.fromkeys(featuretable.FEATURES, gf.Mode.AUTO),
                **{k: gf.Mode(v) for k, v in modes.items()},
            },
            log_level="ERROR",
            **host,
        )
        read_fd, write_fd = os.pipe()
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
        env.update({ENV_VAR: json.dumps(worker_config(config, {}).to_wire())}, NVGPU_WORKER_FD=str(write_fd))
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child"],
            env=env,
            pass_fds=(write_fd,),
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(ROOT),
        )
        os.close(write_fd)
        messages: list[dict[str, Any]] = []
        snapshots = events = 0
        buf = b""
        deadline = time.monotonic() + timeout_s
        try:
            while snapshots < keep + 1 or events < want_events:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(
                        f"worker gave {snapshots} snapshots, {events} events; stderr:\n"
                        f"{proc.stderr.read().decode() if proc.poll() is not None and proc.stderr else ''}"
                    )
                ready, _, _ = select.select([read_fd], [], [], 0.2)
                if not ready:
                    continue
                buf += os.read(read_fd, 1 << 20)
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    msg = json.loads(line)
                    if msg["type"] == "snapshot":
                        snapshots += 1
                        if snapshots == 1:
                            continue  # discovery calls; may race event registration
                        if snapshots > keep + 1:
                            continue
                    if msg["type"] == "event":
                        events += 1
                    messages.append(msg)
        finally:
            if proc.stdin:
                proc.stdin.write(b'{"type": "shutdown"}\n')
                proc.stdin.close()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            os.close(read_fd)
    snaps = [m for m in messages if m["type"] == "snapshot"]
    if scenario.get("events") and not all(m.get("events_enabled") for m in snaps):
        raise RuntimeError("event registration had not finished by the second snapshot; run again")
    # events first, then snapshots, so the fixture reads in the order a supervisor applies them
    order = {"selfcheck": 0, "hello": 1, "event": 2, "snapshot": 3}
    messages.sort(key=lambda m: order.get(m["type"], 9))
    # a golden records a healthy exporter: a self-check problem of the machine it was captured on (a
    # stale copy of the package shadowing this checkout, say) would be frozen into every golden
    checks = [selfcheck.to_dict(selfcheck.run_in_process("supervisor"))]
    checks += [m for m in messages if m["type"] == "selfcheck"]
    problems = [p for c in checks for p in c.get("problems", [])]
    if problems:
        raise RuntimeError(f"self-check problems in this environment, capture in a clean one: {problems}")
    fixture = {
        "comment": f"captured by tests/golden/capture.py from the real worker on golden {name!r} at scenario time 0",
        "golden": name,
        "modes": modes,
        "supervisor_selfcheck": normalise_selfcheck(selfcheck.to_dict(selfcheck.run_in_process("supervisor"))),
        "messages": normalise(messages),
    }
    fixture_path(name).write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    return fixture


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        _child()
    else:
        for arg in sys.argv[1:] or sorted(GOLDENS):
            capture(arg)
            print(f"wrote {fixture_path(arg)}")
