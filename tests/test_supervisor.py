"""Supervisor policy without a worker: unkillable (D-state) workers, backoff, feature states."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from exporter.breadcrumb import Breadcrumb
from exporter.config import Config
from exporter.supervisor import Outcome, Supervisor


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


def test_unreapable_worker_is_reported_and_respawning_stops_on_a_second(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("exporter.supervisor.KILL_GRACE_S", 0.01)
    monkeypatch.setattr("exporter.supervisor.REAP_WAIT_S", 0.01)
    sup = Supervisor(_config(tmp_path), proc_state_fn=lambda pid: "D")
    crumb = Breadcrumb("temperature", "nvmlDeviceGetTemperatureV", "GPU-x", 0.0, True)

    async def scenario() -> None:
        never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        first = Unkillable(101)
        assert await sup._kill(first, never) is False  # type: ignore[arg-type]
        assert first.signals == [signal.SIGTERM, signal.SIGKILL]
        sup._account(Outcome("hang", None, 0, crumb, 12.0, False, ""))
        assert sup.worker_stuck and not sup.respawn_stopped  # one unreaped worker is allowed
        second = Unkillable(102)
        assert await sup._kill(second, never) is False  # type: ignore[arg-type]
        sup._account(Outcome("hang", None, 0, crumb, 12.0, False, ""))
        assert sup.respawn_stopped and sup.worker_stuck
        never.cancel()

    asyncio.run(scenario())
    sup.close()


def test_backoff_doubles_and_is_bounded(tmp_path: Path) -> None:
    sup = Supervisor(_config(tmp_path))
    delays = [sup._account(Outcome("crash", -11, 11, None, 0.5, True, "")) for _ in range(6)]
    assert delays == [1, 2, 4, 8, 8, 8]
    assert sup.restarts["crash"] == 6 and sup.crashes[("unknown", "unknown")] == 6
    sup.close()


def test_quarantine_beats_explicit_on(tmp_path: Path) -> None:
    sup = Supervisor(_config(tmp_path, NVGPU_FEATURE_NVLINK_THROUGHPUT="on", NVGPU_QUARANTINE_AFTER=2))
    crumb = Breadcrumb("nvlink_throughput", "nvmlDeviceGetFieldValues", "GPU-x", 0.0, True)
    assert (
        sup.feature_states()["nvlink_throughput"] == {"enabled": True, "reason": "env", "detail": ""}
        or sup.feature_states()["nvlink_throughput"]["reason"] == "env"
    )
    for _ in range(2):
        sup._account(Outcome("crash", -11, 11, crumb, 1.0, True, ""))
    state = sup.feature_states()["nvlink_throughput"]
    assert state["enabled"] is False and state["reason"] == "quarantined"
    assert "nvmlDeviceGetFieldValues" in state["detail"]
    # the state file carries it to the next exporter process
    again = Supervisor(_config(tmp_path, NVGPU_FEATURE_NVLINK_THROUGHPUT="on"))
    assert again.feature_states()["nvlink_throughput"]["reason"] == "quarantined"
    sup.close()
    again.close()
