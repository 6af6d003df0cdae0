"""The timeline store: order by sequence number, bounds under a flood, its file kept and checked."""

from __future__ import annotations

import calendar
import json
import logging
import os
import threading
from pathlib import Path

import pytest

from exporter.supervisor import timelinedoc, timelineevents
from exporter.supervisor.timeline import NODE, Timeline
from exporter.supervisor.timelinefile import FILE_VERSION, path_beside, read_bounded

U = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(100)]
T0 = 1_796_000_000.0


class Wall:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def test_events_are_ordered_by_sequence_number_not_by_a_wall_clock_that_stepped_back() -> None:
    wall = Wall()
    tl = Timeline("", "boot-1", wall)
    tl.add("xid", U[0], "Xid 13", {"xid": 13}, gpu="0")
    wall.now -= 3600  # the clock steps back an hour
    tl.add("verdict", U[0], "ok -> watch", {"to": "watch"}, gpu="0")
    tl.add("quarantine", NODE, "nvlink_throughput")
    events = tl.events()
    assert [e.kind for e in events] == ["xid", "verdict", "quarantine"]
    assert [e.seq for e in events] == [1, 2, 3] and events[1].ts < events[0].ts
    assert [e.kind for e in tl.events([U[0]])] == ["xid", "verdict"]
    assert [e.kind for e in tl.events(since=T0 - 1)] == ["xid"]
    assert tl.events()[0].boot_id == "boot-1"


def test_a_repeat_within_the_window_is_counted_on_the_event_others_are_not() -> None:
    wall = Wall()
    tl = Timeline("", wall=wall)
    first = tl.add("xid", U[0], "Xid 13", {"xid": 13, "pid": 1}, key=(13, 1))
    wall.now += 10
    again = tl.add("xid", U[0], "Xid 13", {"xid": 13, "pid": 1}, key=(13, 1))
    other = tl.add("xid", U[0], "Xid 13", {"xid": 13, "pid": 2}, key=(13, 2))
    wall.now += timelineevents.COALESCE_S + 1
    later = tl.add("xid", U[0], "Xid 13", {"xid": 13, "pid": 1}, key=(13, 1))
    assert again is first and first.count == 2 and first.last_ts == T0 + 10
    assert other is not first and later is not first
    assert len(tl.lanes[U[0]].events) == 3
    assert first.to_json()["last_time"].startswith("2026-")


def test_a_flood_of_one_kind_evicts_itself_never_the_rare_verdict_or_quarantine() -> None:
    tl = Timeline("")
    tl.add("verdict", U[0], "ok -> reset_gpu", {"to": "reset_gpu"})
    tl.add("quarantine", U[0], "nvlink_throughput")
    for pid in range(20_000):  # distinct processes: nothing coalesces
        tl.add("xid", U[0], f"Xid 13 by pid {pid}", {"xid": 13, "pid": pid}, key=(13, pid))
    lane = tl.lanes[U[0]]
    assert len(lane.events) == timelineevents.EVENTS_PER_LANE
    assert {e.kind for e in lane.events} == {"verdict", "quarantine", "xid"}
    assert lane.evicted == 20_002 - timelineevents.EVENTS_PER_LANE
    assert lane.events[-1].data["pid"] == 19_999  # the newest are kept
    assert tl.next_seq == 20_003


def test_the_whole_timeline_stays_within_its_bytes_and_lanes(tmp_path: Path) -> None:
    tl = Timeline(str(tmp_path / "timeline.json"))
    tl.path = ""  # build it in memory, then write once
    big = "x" * 10_000
    for n in range(40_000):
        tl.add("xid", U[n % 100], big, {"text": big, "list": list(range(100)), **{f"k{i}": i for i in range(50)}})
    assert len(tl.lanes) <= timelineevents.LANES_MAX and tl.lanes_dropped > 0
    for lane in tl.lanes.values():
        assert len(lane.events) <= timelineevents.EVENTS_PER_LANE
        for e in lane.events:
            assert len(e.summary) <= 2 * timelineevents.TEXT_MAX
            assert len(e.data) <= timelineevents.DATA_KEYS_MAX
            assert len(json.dumps(e.to_file())) <= timelineevents.EVENT_MAX_BYTES
    tl.path = str(tmp_path / "timeline.json")
    tl.save()
    assert os.path.getsize(tl.path) <= timelineevents.FILE_MAX_BYTES


def test_the_file_keeps_events_lanes_and_the_next_sequence_number_across_a_restart(tmp_path: Path) -> None:
    path = path_beside(str(tmp_path / "state.json"))
    assert path == str(tmp_path / "timeline.json")
    tl = Timeline(path, "boot-1")
    tl.add("xid", U[0], "Xid 43", {"xid": 43, "pid": 4242, "process": "python3"}, gpu="0")
    tl.lane(U[0]).identity.update(index="0", pci_bus_id="00000000:00:06.0")
    tl.lane(U[0]).last["verdict"] = ["reset_gpu", "gpu", "stuck_context"]
    tl.meta["driver_version"] = "580.159.04"
    tl.set_extra("recovery", {"x": 1})
    back = Timeline(path, "boot-1")
    assert back.load_error is None and back.dropped == []
    assert [(e.seq, e.kind, e.data["pid"]) for e in back.events()] == [(1, "xid", 4242)]
    assert back.lanes[U[0]].identity["pci_bus_id"] == "00000000:00:06.0"
    assert back.lanes[U[0]].last["verdict"] == ["reset_gpu", "gpu", "stuck_context"]
    assert back.meta["driver_version"] == "580.159.04" and back.extra == {"recovery": {"x": 1}}
    assert back.add("verdict", U[0], "x").seq == 2
    assert back.find_lane("0") is back.lanes[U[0]] and back.find_lane("00000000:00:06.0") is back.lanes[U[0]]


def _file(tmp_path: Path, events: list[object], **top: object) -> str:
    path = tmp_path / "timeline.json"
    data = {"version": FILE_VERSION, "next_seq": 1, "meta": {}, "extra": {}, "lanes": {U[0]: {"events": events}}}
    data.update(top)
    path.write_text(json.dumps(data))
    return str(path)


def test_each_bad_event_is_dropped_by_itself_and_the_rest_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = {"seq": 5, "ts": T0, "kind": "xid", "gpu": "0", "summary": "Xid 13", "data": {"xid": 13}, "boot_id": ""}
    bad = [
        {**good, "seq": 5},  # the same sequence number again
        {**good, "seq": -1},
        {**good, "seq": 6, "kind": "reboot_everything"},
        {**good, "seq": 7, "ts": "yesterday"},
        {**good, "seq": 8, "data": {"nested": {"a": 1}}},
        {**good, "seq": 9, "count": 0},
        {**good, "seq": 10, "summary": None},
        {**good, "seq": True},
        "not an event",
    ]
    with caplog.at_level(logging.WARNING):
        tl = Timeline(_file(tmp_path, [good, *bad], next_seq="x"))
    assert [e.seq for e in tl.events()] == [5]
    assert len(tl.dropped) == len(bad) and tl.next_seq == 6
    assert sum("dropped 9 invalid entries" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize(
    "content",
    [b"not json", b"[1, 2]", json.dumps({"version": 99}).encode(), b"[" * 100_000, b"\xff\xfe"],
)
def test_a_file_that_is_not_ours_counts_as_empty_and_says_why(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "timeline.json"
    path.write_bytes(content)
    tl = Timeline(str(path))
    assert tl.load_error and tl.events() == []
    tl.add("boot", NODE, "first sample")  # and it starts over, writing a good file
    assert Timeline(str(path)).events()[0].kind == "boot"


def test_a_fifo_a_symlink_or_a_huge_file_at_the_path_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text("{}")
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (timelineevents.FILE_MAX_BYTES + 1))
    results: dict[str, str | None] = {}

    def load() -> None:
        for p in (fifo, link, huge):
            results[p.name] = Timeline(str(p)).load_error

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    loader.join(10)
    assert not loader.is_alive(), "loading blocked"
    assert results["fifo.json"] == "is a FIFO, not a regular file"
    assert results["link.json"] and results["huge.json"] and "larger than" in results["huge.json"]
    with pytest.raises(ValueError, match="not a regular file"):
        read_bounded(str(fifo), 10)


def test_without_a_state_file_the_timeline_is_memory_only(tmp_path: Path) -> None:
    assert path_beside("") == ""
    tl = Timeline("")
    tl.add("boot", NODE, "first sample")
    tl.flush()
    assert list(tmp_path.iterdir()) == []


def test_a_write_that_fails_is_logged_once_and_never_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    tl = Timeline(str(blocker / "timeline.json"))  # its directory is a file
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            tl.add("boot", NODE, "first sample")
    assert sum("cannot write timeline file" in r.getMessage() for r in caplog.records) == 1
    assert len(tl.events()) == 3


def test_a_write_stuck_on_a_hung_mount_never_holds_the_event_loop_nor_overwrites_a_newer_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first write hangs (a hung mount); a save on the event loop returns at once, the later
    save reaches the file, and the stuck one, coming back late, leaves the newer content in place."""
    import asyncio

    from exporter.supervisor import timelinefile

    path = tmp_path / "timeline.json"
    tl = Timeline(str(path))
    real, hung, release = timelinefile.write_atomic, threading.Event(), threading.Event()

    def write(where: str, body: bytes) -> None:
        if not hung.is_set():
            hung.set()
            release.wait(30)  # the first write sleeps until the mount "comes back"
        real(where, body)

    monkeypatch.setattr(timelinefile, "write_atomic", write)
    monkeypatch.setattr(timelinefile, "IO_DEADLINE_S", 0.2)
    tl.add("boot", NODE, "first")  # off the loop: waits at most the deadline, then gives up on it
    assert hung.is_set()

    async def on_the_loop() -> None:
        tl.save()  # returns at once: the loop never waits for the file

    asyncio.run(asyncio.wait_for(on_the_loop(), 1.0))
    tl.add("boot", NODE, "second")
    release.set()
    tl.add("boot", NODE, "third")
    tl.flush()
    pause = threading.Event()
    for _ in range(50):
        summaries = [e.summary for e in Timeline(str(path)).events()]
        if summaries == ["first", "second", "third"]:
            break
        pause.wait(0.1)
    assert summaries == ["first", "second", "third"]


def test_an_unknown_kind_is_a_bug_of_the_caller() -> None:
    with pytest.raises(ValueError, match="unknown timeline event kind"):
        Timeline("").add("gossip", NODE, "x")


def test_the_query_filters_by_gpu_time_and_kind_and_names_a_bad_parameter() -> None:
    wall = Wall()
    tl = Timeline("", wall=wall)
    tl.lane(U[0]).identity.update(index="0", pci_bus_id="00000000:00:06.0")
    tl.add("xid", U[0], "Xid 13", gpu="0")
    wall.now += 7200
    tl.add("verdict", U[0], "ok -> watch", gpu="0")
    tl.add("quarantine", NODE, "q")
    q = timelinedoc.parse_query({"gpu": "0", "since": "1h"}, now=wall.now)
    doc = timelinedoc.document(tl, q)
    assert doc["schema_version"] == timelineevents.SCHEMA_VERSION
    assert [e["kind"] for e in doc["events"]] == ["verdict"] and doc["events"][0]["uuid"] == U[0]
    assert doc["lanes"][0]["pci_bus_id"] == "00000000:00:06.0"
    rfc = timelinedoc.parse_query({"until": "2026-11-30T00:00:00Z"})
    assert rfc.until == calendar.timegm((2026, 11, 30, 0, 0, 0))
    kinds = timelinedoc.document(tl, timelinedoc.parse_query({"kind": "xid,quarantine", "limit": "1"}))
    assert [e["kind"] for e in kinds["events"]] == ["quarantine"] and kinds["truncated"] is True
    for params, named in [
        ({"since": "last tuesday"}, "since="),
        ({"kind": "gossip"}, "kind='gossip'"),
        ({"limit": "0"}, "limit="),
        ({"gpus": "0"}, "unknown parameter 'gpus'"),
    ]:
        with pytest.raises(timelinedoc.QueryError, match=named):
            timelinedoc.parse_query(params)
    with pytest.raises(KeyError):
        timelinedoc.document(tl, timelinedoc.Query(gpu="7"))
