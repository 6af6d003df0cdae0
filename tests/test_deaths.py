"""Who ended a worker, and what is counted against the NVML call in flight (exporter/supervisor/deaths.py,
quarantine.py's containment rule, probes.py's answer, gpuhealth.py's backoff after a relapse)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from fuzzing import worker_deaths
from hypothesis import given

from exporter.common import protocol
from exporter.common.snapshot import GpuSample, Snapshot, SystemInfo
from exporter.supervisor import deaths
from exporter.supervisor.gpuhealth import GpuHealth, GpuRecord
from exporter.supervisor.probes import answered, probe_samples
from exporter.supervisor.quarantine import QuarantineStore

GPU0, GPU1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"


@given(worker_deaths())
def test_only_a_self_inflicted_death_is_blamed_on_the_call_in_flight(death: dict[str, object]) -> None:
    """Property over every signal and origin: a death is counted against the call in flight
    (``crash`` or ``hang``) exactly when the worker faulted itself or the supervisor killed it for
    its deadline; an outside signal or the OOM killer never is, even when an unrelated OOM kill
    coincides; the origin the record names is the true one."""
    origin = death["origin"]
    got = deaths.classify(
        death["returncode"],  # type: ignore[arg-type]
        deadline_kill=bool(death["deadline_kill"]),
        stopping=bool(death["stopping"]),
        oom_rose=bool(death["oom_rose"]),
    )
    blamed = got.reason in deaths.ATTRIBUTED
    assert blamed == (origin == "self" or bool(death["deadline_kill"])), (death, got)
    assert got.self_inflicted == (origin == "self"), (death, got)
    if origin == "outside":
        sig = -int(death["returncode"])  # type: ignore[call-overload]
        expected = ("oom", "oom_killer") if sig == signal.SIGKILL and death["oom_rose"] else ("killed", "outside")
        assert (got.reason, got.signal_from) == expected
    elif origin == "oom_killer":
        assert (got.reason, got.signal_from) == ("oom", "oom_killer")
    elif origin == "supervisor":
        assert got.signal_from == "supervisor" and got.reason in ("hang", "stopped")
    elif origin == "self":
        assert (got.reason, got.signal_from) == ("crash", "self")
    else:
        assert got.signal_from == "" and got.reason in ("exit", "nvml_error", "stopped")


def test_exit_codes() -> None:
    assert deaths.classify(protocol.EXIT_NVML_FATAL, deadline_kill=False, stopping=False, oom_rose=True).reason == (
        "nvml_error"
    )
    assert deaths.classify(0, deadline_kill=False, stopping=False, oom_rose=False) == deaths.Death("exit", "")
    assert deaths.classify(None, deadline_kill=True, stopping=False, oom_rose=False).reason == "hang"


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_oom_count_of_the_containers_cgroup_v2_then_v1_then_the_node(tmp_path: Path) -> None:
    """cgroup v2: ``memory.events`` of the process's cgroup; v1: ``memory.oom_control``; neither:
    the node's ``/proc/vmstat``; none readable: no source, and no death is ever taken for OOM."""
    v2 = tmp_path / "v2"
    _tree(
        v2,
        {
            "/proc/self/cgroup": "0::/kubepods/pod1/ctr\n",
            "/sys/fs/cgroup/kubepods/pod1/ctr/memory.events": "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n",
            "/proc/vmstat": "nr_free_pages 1\noom_kill 40\n",
        },
    )
    oom = deaths.OomKills(str(v2))
    assert (oom.scope, oom.read()) == ("container", 2)
    before = oom.read()
    assert not oom.rose(before)
    (v2 / "sys/fs/cgroup/kubepods/pod1/ctr/memory.events").write_text("oom 3\noom_kill 3\n")
    assert oom.rose(before)
    v1 = tmp_path / "v1"
    _tree(
        v1,
        {
            "/proc/self/cgroup": "12:memory:/docker/abc\n0::/\n",
            "/sys/fs/cgroup/memory/docker/abc/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n",
        },
    )
    assert (deaths.OomKills(str(v1)).scope, deaths.OomKills(str(v1)).read()) == ("container", 5)
    node = tmp_path / "node"
    _tree(node, {"/proc/self/cgroup": "0::/\n", "/proc/vmstat": "pgfault 9\noom_kill 7\n"})
    assert (deaths.OomKills(str(node)).scope, deaths.OomKills(str(node)).read()) == ("node", 7)
    none = deaths.OomKills(str(tmp_path / "empty"))
    assert none.source == "" and none.read() is None and not none.rose(None) and not none.rose(0)


# -- a fault on one GPU stays that GPU's -------------------------------------------------------------


def test_contained_faults_on_one_gpu_never_quarantine_the_feature(tmp_path: Path) -> None:
    """Ten hangs of GPU 0's temperature call, each contained (the GPU left out): no quarantine; the
    same fault on a second GPU quarantines the feature node-wide (the documented two-GPU rule)."""
    store = QuarantineStore(str(tmp_path / "s.json"), threshold=3, window_s=600, ttl_s=3600)
    for _ in range(10):
        assert store.record("temperature", "nvmlDeviceGetTemperatureV", GPU0, contained=True) is None
    assert store.details() == {}
    new = store.record("temperature", "nvmlDeviceGetTemperatureV", GPU1, contained=True)
    assert new is not None and new.crashes == 11
    entry = json.loads((tmp_path / "s.json").read_text())["history"][0]
    assert entry[3] == GPU0 and entry[5] is True
    reloaded = QuarantineStore(str(tmp_path / "s.json"), threshold=3, window_s=600, ttl_s=3600)
    assert all(h.contained for h in reloaded.history)


def test_faults_nothing_contains_reach_the_threshold(tmp_path: Path) -> None:
    """Not contained (no GPU named, or the only GPU left): the threshold quarantines, as before."""
    store = QuarantineStore("", threshold=3, window_s=600, ttl_s=3600)
    assert store.record("power", "nvmlDeviceGetPowerUsage", GPU0, contained=False) is None
    assert store.record("power", "nvmlDeviceGetPowerUsage", "") is None
    assert store.record("power", "nvmlDeviceGetPowerUsage", GPU0, contained=True) is None
    assert store.record("power", "nvmlDeviceGetPowerUsage", GPU0) is not None


def test_others_left_decides_containment() -> None:
    health = GpuHealth(30, 600)
    health.gpus = {GPU0: GpuRecord(0, GPU0), GPU1: GpuRecord(1, GPU1)}
    assert health.others_left(GPU0)
    health.gpus[GPU1].excluded = "crashed"
    assert not health.others_left(GPU0)
    assert health.excluded(GPU1) and not health.excluded(GPU0)


# -- a probe answers only with fresh readings -----------------------------------------------------


def test_a_probe_whose_call_is_still_in_flight_does_not_answer() -> None:
    """The issue's "answered a probe: readmitted" every ~37 s: one snapshot an interval after the
    start said ``up`` while the hung call was still in flight. Now every sample needs readings of
    its own pass and the probe must end with no call in flight."""
    n = probe_samples(1.0)
    assert n == 6 and probe_samples(0.5) == 11 and probe_samples(30.0) == 3
    fresh: list[tuple[str, float | None]] = [("up", 0.0)] * n  # (state, age of the readings)
    assert answered(fresh, n, clean_exit=True, max_age_s=0.5)[0]
    assert not answered(fresh, n, clean_exit=False, max_age_s=0.5)[0]  # nvmlShutdown skipped: a call in flight
    assert not answered([("up", None)] * n, n, clean_exit=True, max_age_s=0.5)[0]  # never any readings
    stale = [*fresh[:2], ("up", 1.0), *fresh[3:]]  # the previous pass's readings, an interval old
    assert "no fresh readings" in answered(stale, n, clean_exit=True, max_age_s=0.5)[1]
    assert not answered(fresh[:-1], n, clean_exit=True, max_age_s=0.5)[0]
    assert not answered([*fresh[:-1], ("hung", 0.0)], n, clean_exit=True, max_age_s=0.5)[0]


def _report(health: GpuHealth, state: str) -> list[GpuRecord]:
    gpu = GpuSample(0, GPU0, state, feature="temperature", function="nvmlDeviceGetTemperatureV")
    return health.on_snapshot(Snapshot(1_800_000_000.0, 0.0, SystemInfo(), (gpu,), {}, {}, {}, 0, {}))


def test_a_gpu_that_relapses_after_its_readmission_backs_off_further() -> None:
    """Readmitted, then hung again at once: the next probe waits twice as long (30, 60, 120 …),
    not 30 s again; up for the longest delay (600 s), its next hang starts over from the first."""
    now = [1000.0]
    health = GpuHealth(30, 600, clock=lambda: now[0])
    _report(health, "up")
    delays = []
    for _ in range(5):
        assert _report(health, "hung"), "a new hang is reported once"
        rec = health.gpus[GPU0]
        delays.append(rec.backoff_s)
        health.probe_done(rec, True, "6 samples with fresh readings")
        _report(health, "up")
        now[0] += 5
    assert delays == [30, 60, 120, 240, 480]
    now[0] += 600
    _report(health, "up")
    _report(health, "hung")
    assert health.gpus[GPU0].backoff_s == 30
