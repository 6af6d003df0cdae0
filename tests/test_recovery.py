"""Recovery is verified, not assumed: the watches from "asks for action" to "recovered at T" or "recurred"."""

from __future__ import annotations

import json
from pathlib import Path

from exporter.supervisor.recovery import RecoveryTracker
from exporter.supervisor.timeline import Timeline

U = "GPU-ef65bf38-0ae6-479b-9ebc-46c6463961e6"
T0 = 1_796_000_000.0
WINDOW = 60.0


class Clock:
    def __init__(self) -> None:
        self.mono, self.wall = 100.0, T0

    def advance(self, s: float) -> None:
        self.mono += s
        self.wall += s


def tracker(path: str = "", clock: Clock | None = None) -> tuple[RecoveryTracker, Clock]:
    c = clock or Clock()
    tl = Timeline(path, wall=lambda: c.wall)
    return RecoveryTracker(tl, WINDOW, lambda: c.mono, lambda: c.wall), c


def stuck_then_acted_on(r: RecoveryTracker, c: Clock, action: str = "exporter_restart") -> None:
    r.sample(U, "0", True, "reset_gpu", "stuck_context")
    c.advance(30)
    r.action(action, "the exporter was stopped and started again")
    c.advance(5)
    r.sample(U, "0", True, "unknown", "no_fresh_sample")  # no news: the first samples of a new worker
    r.sample(U, "0", True, "ok", "none")


def test_a_reset_that_holds_for_the_window_is_recovered_at_the_time_the_gpu_came_back() -> None:
    r, c = tracker()
    stuck_then_acted_on(r, c)
    w = r.latest(U)
    assert w is not None and w.state == "watching" and w.cleared is True and w.back_at == T0 + 35
    assert "watching for a recurrence until" in w.summary()
    c.advance(WINDOW - 1)
    r.sample(U, "0", True, "ok", "none")
    assert w.state == "watching"
    c.advance(1)
    r.sample(U, "0", True, "ok", "none")
    assert w.state == "recovered"
    assert w.summary().startswith("recovered at 2026-") and "exporter restart" in w.summary()
    kinds = [e.data["state"] for e in r.timeline.events(kinds=["recovery"])]
    assert kinds == ["open", "pending", "watching", "recovered"]


def test_an_xid_after_the_gpu_came_back_is_a_recurrence_one_from_before_is_not() -> None:
    r, c = tracker()
    stuck_then_acted_on(r, c)
    r.xid(U, "0", 43, T0 + 10)  # the kernel log's history, read again: before it came back
    assert r.latest(U).state == "watching"  # type: ignore[union-attr]
    c.advance(3)
    r.xid(U, "0", 43, c.wall)
    w = r.latest(U)
    assert w is not None and w.state == "recurred" and w.recurred_by.startswith("Xid 43 at ")
    assert w.summary().startswith("recurred at ")


def test_the_stuck_signature_again_without_xid_43_is_the_same_signature_recurring() -> None:
    r, c = tracker()
    stuck_then_acted_on(r, c)
    r.fault_raised(U, "0", "busy_and_empty", "watch")
    assert r.latest(U).state == "recurred"  # type: ignore[union-attr]
    assert "busy_and_empty raised again" in r.latest(U).recurred_by  # type: ignore[union-attr]


def test_an_unrelated_fault_is_no_recurrence_but_a_verdict_that_asks_for_action_again_is() -> None:
    r, c = tracker()
    stuck_then_acted_on(r, c)
    r.fault_raised(U, "0", "driver_xid", "watch")
    assert r.latest(U).state == "watching"  # type: ignore[union-attr]
    r.sample(U, "0", True, "stop_scheduling", "fabric_not_registered")
    assert r.latest(U).state == "recurred"  # type: ignore[union-attr]


def test_a_signature_that_did_not_clear_after_the_action_recurred_at_once() -> None:
    r, c = tracker()
    r.sample(U, "0", True, "reset_gpu", "stuck_context")
    r.action("gpu_reset", "the GPU answers again after being lost", U, "0")
    r.sample(U, "0", False, "reset_gpu", "stuck_context")  # not answering: not back yet
    assert r.latest(U).state == "pending"  # type: ignore[union-attr]
    r.sample(U, "0", True, "reset_gpu", "stuck_context")
    w = r.latest(U)
    assert w is not None and w.state == "recurred" and w.cleared is False and "did not clear" in w.recurred_by


def test_an_exporter_restart_that_did_not_clear_the_signature_leaves_the_watch_open_not_recurred() -> None:
    r, c = tracker()
    r.sample(U, "0", True, "reset_gpu", "stuck_context")
    r.action("exporter_restart", "the exporter was stopped for 3 s and started again")
    c.advance(5)
    r.sample(U, "0", True, "reset_gpu", "stuck_context")  # an OOM-killed exporter cured nothing
    w = r.latest(U)
    assert w is not None and w.state == "open" and w.action == "" and not w.recurred_by
    assert [e.data["state"] for e in r.timeline.events(kinds=["recovery"])] == ["open", "pending", "open"]
    r.action("gpu_reset", "the GPU answers again after being lost", U, "0")
    r.action("exporter_restart", "the exporter restarted")  # does not replace the reset it waits on
    assert w.action == "gpu_reset"
    r.sample(U, "0", True, "reset_gpu", "stuck_context")
    assert w.state == "recurred" and "after gpu reset" in w.recurred_by


def test_a_fault_that_went_away_by_itself_is_watched_too() -> None:
    r, c = tracker()
    r.sample(U, "0", True, "stop_scheduling", "application_xids_several_processes")
    r.sample(U, "0", True, "watch", "application_xid")
    w = r.latest(U)
    assert w is not None and w.action == "cleared" and w.state == "watching"


def test_a_verdict_that_does_not_ask_for_action_opens_no_watch() -> None:
    r, _c = tracker()
    for verdict in ("ok", "watch", "unknown", "fix_exporter"):
        r.sample(U, "0", True, verdict, "x")
    assert r.latest(U) is None


def test_after_a_recurrence_the_next_action_is_checked_in_a_new_watch() -> None:
    r, c = tracker()
    stuck_then_acted_on(r, c)
    r.xid(U, "0", 43, c.wall + 1)
    r.sample(U, "0", True, "reboot_node", "stuck_context")  # still asking: a new watch
    r.action("reboot", "the node rebooted")
    c.advance(5)
    r.sample(U, "0", True, "ok", "none")
    assert [w.state for w in r.watches[U]] == ["recurred", "watching"]
    assert r.latest(U).action == "reboot"  # type: ignore[union-attr]


def test_the_watches_survive_a_restart_and_the_window_then_runs_on_the_wall_clock(tmp_path: Path) -> None:
    path = str(tmp_path / "timeline.json")
    r, c = tracker(path)
    stuck_then_acted_on(r, c)
    r.timeline.flush()
    c.mono = 5.0  # a new process: its monotonic clock starts elsewhere
    again, _ = tracker(path, c)
    w = again.latest(U)
    assert w is not None and w.state == "watching"
    again.action("exporter_restart", "the exporter restarted")  # does not restart a window already running
    assert w.state == "watching"
    c.advance(WINDOW)
    again.sample(U, "0", True, "ok", "none")
    assert w.state == "recovered"


def test_a_bad_watch_in_the_file_is_dropped_and_named(tmp_path: Path) -> None:
    path = tmp_path / "timeline.json"
    r, c = tracker(str(path))
    stuck_then_acted_on(r, c)
    r.timeline.flush()
    data = json.loads(path.read_text())
    data["extra"]["recovery"][U][0]["state"] = "fixed_by_magic"
    data["extra"]["recovery"]["GPU-other"] = [{"uuid": "GPU-other"}]
    path.write_text(json.dumps(data))
    again, _ = tracker(str(path))
    assert again.latest(U) is None and again.latest("GPU-other") is None
    assert any("recovery watch" in d for d in again.timeline.dropped)
