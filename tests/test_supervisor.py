"""Supervisor parts without a worker: the pure restart policy, killing an unkillable (D-state)
process, quarantine accounting through the supervisor, and extensions following the feature states."""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.app import build_supervisor
from exporter.common import logs
from exporter.common.breadcrumb import Breadcrumb
from exporter.common.collectors.base import SystemInfo
from exporter.common.snapshot import Hello, InitFailed, Snapshot
from exporter.config import Config
from exporter.supervisor import unavailable
from exporter.supervisor.extensions import Extension
from exporter.supervisor.policy import Outcome, RestartPolicy
from exporter.supervisor.quarantine import QuarantineStore
from exporter.supervisor.served import ServedState
from exporter.supervisor.supervisor import Supervisor
from exporter.supervisor.workerproc import WorkerProcess
from guards import features as gf
from guards.features import FeatureState, Reason


class Unkillable:
    """A process stuck in the kernel: signals are accepted, nothing happens."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode = None
        self.signals: list[int] = []

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)


def _config(tmp_path: Path, **kw: object) -> Config:
    return Config.from_env(
        {
            "NVGPU_STATE_FILE": str(tmp_path / "state.json"),
            "NVGPU_RESTART_BACKOFF_SECONDS": "1",
            "NVGPU_RESTART_BACKOFF_MAX_SECONDS": "8",
            **{k: str(v) for k, v in kw.items()},
        }
    )


CRUMB = Breadcrumb("temperature", "nvmlDeviceGetTemperatureV", "GPU-x", 0.0, True)


def _policy(**kw: float) -> RestartPolicy:
    return RestartPolicy(kw.get("initial", 1.0), kw.get("max", 8.0), kw.get("healthy", 30.0), {"temperature"})


def _out(reason: str = "crash", lifetime: float = 0.5, reaped: bool = True, crumb: Breadcrumb | None = None) -> Outcome:
    return Outcome(
        reason, -11 if reason == "crash" else None, 11 if reason == "crash" else 0, crumb, lifetime, reaped, ""
    )


def test_backoff_doubles_and_is_bounded() -> None:
    policy = _policy()
    delays = [policy.decide(_out(), unreaped=0, had_snapshot=False, new_quarantine=False).delay_s for _ in range(6)]
    assert delays == [1, 2, 4, 8, 8, 8]


def test_backoff_never_overflows() -> None:
    """2 ** (n - 1) stopped converting to float after 1,025 consecutive failures."""
    policy = _policy(initial=0.001, max=60.0)
    for _ in range(5000):
        delay = policy.decide(_out("nvml_error"), unreaped=0, had_snapshot=False, new_quarantine=False).delay_s
    assert delay == 60.0


@pytest.mark.parametrize(
    ("lifetime", "had_snapshot", "new_quarantine", "want"),
    [
        (31.0, True, False, 1.0),  # lived long after delivering samples: a fresh start
        (31.0, False, False, 2.0),  # lived long but never sampled: keeps backing off
        (0.5, False, True, 1.0),  # its cause was just quarantined: retry at once
        (0.5, True, False, 2.0),
    ],
)
def test_backoff_resets(lifetime: float, had_snapshot: bool, new_quarantine: bool, want: float) -> None:
    policy = _policy()
    policy.decide(_out(), unreaped=0, had_snapshot=False, new_quarantine=False)
    got = policy.decide(_out(lifetime=lifetime), unreaped=0, had_snapshot=had_snapshot, new_quarantine=new_quarantine)
    assert got.delay_s == want


def test_quarantine_candidates() -> None:
    policy = _policy()
    assert policy.quarantine_candidate(_out("crash", crumb=CRUMB)) == ("temperature", "nvmlDeviceGetTemperatureV")
    assert policy.quarantine_candidate(_out("hang", crumb=CRUMB)) == ("temperature", "nvmlDeviceGetTemperatureV")
    assert policy.quarantine_candidate(_out("exit", crumb=CRUMB)) is None  # exited by itself: not a crash
    assert policy.quarantine_candidate(_out("crash")) is None  # no breadcrumb: nothing to blame
    other = Breadcrumb("init", "nvmlInit", "", 0.0, True)
    assert policy.quarantine_candidate(_out("crash", crumb=other)) is None  # not a quarantinable feature


def test_unreapable_hangs_stop_respawning() -> None:
    policy = _policy()
    first = policy.decide(_out("hang", reaped=False, crumb=CRUMB), unreaped=1, had_snapshot=True, new_quarantine=False)
    assert not first.stop_respawn  # one unreaped worker is allowed
    second = policy.decide(_out("hang", reaped=False, crumb=CRUMB), unreaped=1, had_snapshot=True, new_quarantine=False)
    assert second.stop_respawn  # the replacement hung unreapably in the same place
    other = _policy()
    assert other.decide(_out("hang", reaped=False), unreaped=2, had_snapshot=True, new_quarantine=False).stop_respawn


def test_kill_reports_a_process_that_survives_sigkill(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("exporter.supervisor.workerproc.KILL_GRACE_S", 0.01)
    monkeypatch.setattr("exporter.supervisor.workerproc.REAP_WAIT_S", 0.01)
    worker = WorkerProcess({}, None, lambda msg: None, (1.0, 1.0), proc_state_fn=lambda pid: "D")  # type: ignore[arg-type]

    async def scenario() -> None:
        never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        stuck = Unkillable(101)
        worker.proc = stuck  # type: ignore[assignment]
        assert await worker.kill(never) is False
        assert stuck.signals == [signal.SIGTERM, signal.SIGKILL]
        never.cancel()

    asyncio.run(scenario())


def test_account_counts_and_quarantine_beats_explicit_on(tmp_path: Path) -> None:
    sup = build_supervisor(_config(tmp_path, NVGPU_FEATURE_NVLINK_THROUGHPUT="on", NVGPU_QUARANTINE_AFTER=2))
    crumb = Breadcrumb("nvlink_throughput", "nvmlDeviceGetFieldValues", "GPU-x", 0.0, True)
    state = sup.state.feature_states()["nvlink_throughput"]
    assert (state.enabled, state.reason) == (True, Reason.ENV)
    delays = [sup.account(Outcome("crash", -11, 11, crumb, 1.0, True, "")) for _ in range(2)]
    assert delays == [1.0, 1.0]  # the second crash quarantined the cause: the backoff starts over
    assert sup.state.worker.restarts["crash"] == 2
    assert sup.state.worker.crashes[("nvlink_throughput", "nvmlDeviceGetFieldValues")] == 2
    state = sup.state.feature_states()["nvlink_throughput"]
    assert state.enabled is False and state.reason is Reason.QUARANTINED
    assert "nvmlDeviceGetFieldValues" in state.detail
    # the state file carries it to the next exporter process
    again = build_supervisor(_config(tmp_path, NVGPU_FEATURE_NVLINK_THROUGHPUT="on"))
    assert again.state.feature_states()["nvlink_throughput"].reason is Reason.QUARANTINED
    sup.close()
    again.close()


def test_the_quarantine_warning_ends_with_a_command_that_clears_it_and_a_reload_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The hint is a whole shell command naming the state file in use, with no field after it; pasted
    (as ``python -m exporter``) it clears the quarantine; a quarantine read back at start is logged."""
    state_dir = tmp_path / "state dir"  # a space: the command quotes the path
    state_dir.mkdir()
    state_file = str(state_dir / "state.json")
    config = _config(tmp_path, NVGPU_QUARANTINE_AFTER=1, NVGPU_STATE_FILE=state_file)
    sup = build_supervisor(config)
    crumb = Breadcrumb("nvlink_throughput", "nvmlDeviceGetFieldValues", "GPU-x", 0.0, True)
    with caplog.at_level(logging.WARNING):
        sup.account(Outcome("crash", -11, 11, crumb, 1.0, True, ""))
    (record,) = [r for r in caplog.records if "QUARANTINED" in r.getMessage()]
    command = f"nvgpu-exporter quarantine --state-file '{state_file}' --clear nvlink_throughput"
    assert record.getMessage().endswith(": " + command), record.getMessage()
    assert logs.TextFormatter().format(record).endswith(command)  # no key=value after it
    sup.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = build_supervisor(config)
    reloaded = [r.getMessage() for r in caplog.records if "read back from the state file" in r.getMessage()]
    assert len(reloaded) == 1 and reloaded[0].endswith(command) and state_file in reloaded[0], reloaded
    again.close()
    argv = shlex.split(command)
    assert argv[0] == "nvgpu-exporter"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", *argv[1:]], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "cleared: nvlink_throughput" in proc.stdout, proc
    assert QuarantineStore(state_file, 1, 600, 86400).details() == {}


def test_the_no_gpu_hint_ends_with_the_demo_command_and_no_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unavailable, "nvidia_present", lambda: False)
    state = build_supervisor(Config.from_env({"NVGPU_STATE_FILE": ""})).state
    failed = InitFailed(12, "LIBRARY_NOT_FOUND", "libnvidia-ml.so.1: not found")
    text = unavailable.record(state, failed, 600)
    assert text.endswith(": " + unavailable.DEMO_COMMAND), text
    assert shlex.split(unavailable.DEMO_COMMAND)[1:] == ["--nvml-backend", "fake:h200x2"]


def test_extension_override_and_quarantine_order(tmp_path: Path) -> None:
    """An extension's override (kernel log unreadable) shows, and a quarantine still wins over it."""
    sup = build_supervisor(_config(tmp_path, NVGPU_QUARANTINE_AFTER=1))
    sup.state.set_feature_state(FeatureState("events", False, Reason.UNSUPPORTED, "no event support"))
    assert sup.state.feature_states()["events"].reason is Reason.UNSUPPORTED
    sup.account(Outcome("crash", -11, 11, Breadcrumb("events", "nvmlEventSetWait_v2", "", 0.0, True), 1.0, True, ""))
    assert sup.state.feature_states()["events"].reason is Reason.QUARANTINED
    sup.close()


def test_an_extension_follows_the_workers_decision_about_its_feature(tmp_path: Path) -> None:
    """Built while the provisional view has pod_attribution on; once the worker decides it off (a
    known-issue rule only the worker can match) the extension gets no snapshot, no Xid and no render
    call, and its own finding (no kubelet socket: unsupported) does not hide the worker's reason."""

    class Pods(Extension):
        feature = "pod_attribution"

        def __init__(self) -> None:
            self.snapshots = 0

        def on_snapshot(self, snapshot: Snapshot) -> None:
            self.snapshots += 1

    config = _config(tmp_path)
    ext = Pods()
    state = ServedState(config, QuarantineStore("", 3, 600.0, 86400.0), [ext])
    sup = Supervisor(config, state)
    state.set_feature_state(FeatureState("pod_attribution", False, Reason.UNSUPPORTED, "no kubelet socket"))
    assert state.active_extensions() == [ext]
    assert state.feature_states()["pod_attribution"].reason is Reason.UNSUPPORTED  # the provisional view
    decided = gf.resolve(config.feature_modes, known_issues={"pod_attribution": "a crash (rule r1)"})
    snap = Snapshot(0.0, 0.0, SystemInfo(), (), {}, decided, {}, 0, {})

    async def scenario() -> None:
        sup.handle(Hello(pid=1, system=SystemInfo(), gpus=(), feature_states=decided))
        sup.handle(snap)

    asyncio.run(scenario())
    assert state.active_extensions() == [] and ext.snapshots == 0
    shown = state.feature_states()["pod_attribution"]
    assert (shown.enabled, shown.reason, shown.detail) == (False, Reason.KNOWN_ISSUE, "a crash (rule r1)")
    assert not state.component_errors
    sup.close()


def test_feature_states_are_resolved_in_two_places_only() -> None:
    """guards.features.resolve: the worker's decision (sampler.py) and the supervisor's provisional
    view before it (served.py), nowhere else (there were four, with three different inputs)."""
    import ast

    root = Path(__file__).resolve().parent.parent
    sites = []
    for path in sorted((root / "exporter").rglob("*.py")):
        tree = ast.parse(path.read_text())
        modules, functions = set(), set()  # names bound to guards.features, and to its resolve
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "guards":
                modules.update(a.asname or a.name for a in node.names if a.name == "features")
            elif isinstance(node, ast.ImportFrom) and node.module == "guards.features":
                functions.update(a.asname or a.name for a in node.names if a.name == "resolve")
            elif isinstance(node, ast.Import):
                modules.update(a.asname or a.name for a in node.names if a.name == "guards.features")
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if (isinstance(f, ast.Name) and f.id in functions) or (
                isinstance(f, ast.Attribute) and f.attr == "resolve" and ast.unparse(f.value) in modules
            ):
                sites.append(f"{path.relative_to(root)}:{node.lineno}")
    assert sorted(site.split(":")[0] for site in sites) == [
        "exporter/supervisor/served.py",
        "exporter/worker/sampler.py",
    ], sites


def test_without_new_samples_the_age_of_the_last_one_is_rendered_again_and_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot goes stale, then the exposition is rendered again every STALE_RENDER_S until the
    next snapshot: nvgpu_last_sample_age_seconds keeps growing in what /metrics serves."""
    from exporter.supervisor import supervisor as sup_mod

    monkeypatch.setattr(sup_mod, "STALE_RENDER_S", 0.05)
    sup = build_supervisor(_config(tmp_path, NVGPU_SAMPLE_INTERVAL_SECONDS="0.1", NVGPU_STALE_AFTER_SECONDS="0.1"))
    renders: list[float | None] = []
    sup.state.subscribe(lambda: renders.append(sup.state.sample_age()))

    async def run() -> None:
        sup.handle(Snapshot(1_800_000_000.0, 0.01, SystemInfo(), (), {}, {}, {}, 0, {}))
        await asyncio.sleep(0.5)  # no snapshot for 0.5 s: letting time pass is the point

    try:
        asyncio.run(run())
    finally:
        sup.close()
    ages = [a for a in renders if a is not None]
    assert len(ages) >= 5, ages  # the snapshot, going stale, then again and again
    assert ages == sorted(ages) and ages[-1] > 0.3
