"""Xids carry their process and pod: the kernel log's pid= and name=, the worker's PID -> pod answer,
and the NVML event matched to the kernel record of the same Xid (counted once, attributed once)."""

from __future__ import annotations

from exporter.supervisor.xids import RECENT_PER_GPU, XidLedger

UUID = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
T0 = 1_700_000_000.0


def new_ledger() -> XidLedger:
    """A ledger whose monotonic and wall clocks agree (no step): an Xid's monotonic time is its Unix
    time, so the windows below can be given in Unix time."""
    return XidLedger(clock=lambda: T0 + 10_000.0, wall=lambda: T0 + 10_000.0)


def samples(ledger: XidLedger, name: str, now: float = T0 + 60) -> list[tuple[dict[str, str], float]]:
    fams = {m.name: m for m in ledger.families([UUID], {UUID: "0"}, now=now)}
    return [(dict(s.labels), s.value) for s in fams[name].samples]


def test_a_kernel_log_xid_keeps_its_process_and_the_worker_adds_the_pod() -> None:
    ledger = new_ledger()
    ledger.record_xid("0", UUID, 13, T0, "kernel log", 4242, "python3")
    assert ledger.attribute_pod(4242, "uid-1", "team-a", "train-0", "main")
    assert not ledger.attribute_pod(4242, "uid-1", "team-a", "train-0", "main")  # once
    ((labels, value),) = samples(ledger, "nvgpu_xid_process_last_timestamp_seconds")
    assert labels == {
        "gpu": "0",
        "uuid": UUID,
        "xid": "13",
        "pid": "4242",
        "process": "python3",
        "namespace": "team-a",
        "pod": "train-0",
    }
    assert value == T0
    assert ledger.recent(UUID)[0].who == "python3 (pid 4242) in team-a/train-0"


def test_an_nvml_event_gets_the_process_of_the_kernel_record_of_the_same_xid() -> None:
    ledger = new_ledger()
    ledger.record_xid("0", UUID, 31, T0, "NVML event")
    assert ledger.application_processes(UUID, T0 + 1) == 0  # no PID: cannot tell processes apart
    assert ledger.attribute(UUID, 31, T0 + 2, 77, "a.out") is not None
    assert ledger.attribute(UUID, 31, T0 + 2, 78, "b.out") is None  # that record is attributed already
    assert sum(c.count for c in ledger.xids.values()) == 1
    assert ledger.application_processes(UUID, T0 + 3) == 1
    assert ledger.attribute(UUID, 13, T0 + 2, 77, "a.out") is None  # another Xid code: no match


def test_distinct_processes_are_counted_in_the_window_only() -> None:
    ledger = new_ledger()
    ledger.record_xid("0", UUID, 13, T0, "kernel log", 1, "a")
    ledger.record_xid("0", UUID, 13, T0 + 60, "kernel log", 1, "a")
    assert ledger.application_processes(UUID, T0 + 61) == 1  # one process twice
    ledger.record_xid("0", UUID, 13, T0 + 120, "kernel log", 2, "b")
    assert ledger.application_processes(UUID, T0 + 121) == 2
    assert ledger.application_processes(UUID, T0 + 120 + 1801) == 0
    ledger.record_xid("0", UUID, 79, T0 + 130, "kernel log", 3, "c")  # not an application Xid
    assert ledger.application_processes(UUID, T0 + 131) == 2
    assert samples(ledger, "nvgpu_xid_application_processes", now=T0 + 131) == [({"gpu": "0", "uuid": UUID}, 2.0)]


def test_the_recent_records_are_bounded_per_gpu() -> None:
    ledger = new_ledger()
    for i in range(RECENT_PER_GPU + 7):
        ledger.record_xid("0", UUID, 13, T0 + i, "kernel log", 100 + i, "p")
    assert len(ledger.recent(UUID)) == RECENT_PER_GPU
    assert len(samples(ledger, "nvgpu_xid_process_last_timestamp_seconds")) == RECENT_PER_GPU
    assert ledger.application_processes(UUID, T0 + 20) == RECENT_PER_GPU + 7  # the window keeps its own
