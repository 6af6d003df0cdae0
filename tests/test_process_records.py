"""exporter.worker.process_records: every drop reason, the sentinel rules, merging across lists, samples."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from exporter.common.scenarios.records import misaligned_r535, swapped
from exporter.worker.process_records import (
    NOT_AVAILABLE_U32,
    NOT_AVAILABLE_U64,
    REASONS,
    STRUCTURAL,
    ProcessRecord,
    merge,
    structural,
    validate_records,
    validate_samples,
)

TOTAL = 150_754_820_096  # H200 memory total (nvml_probe_1gpu.json)
PID_MAX = 4_194_304


def rec(pid: Any, mem: Any = 1 << 30, gi: Any = NOT_AVAILABLE_U32, ci: Any = NOT_AVAILABLE_U32) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, usedGpuMemory=mem, gpuInstanceId=gi, computeInstanceId=ci)


def check(*records: Any, total: int | None = TOTAL) -> tuple[list[ProcessRecord], Counter[str]]:
    drops: Counter[str] = Counter()
    return validate_records(records, "compute", pid_max=PID_MAX, memory_total=total, drops=drops), drops


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (rec(0), "pid_zero"),
        (rec(NOT_AVAILABLE_U32), "pid_not_available"),
        (rec(PID_MAX), "pid_above_max"),
        (rec(6_498_025_472, 9980), "pid_above_max"),  # the issue's swapped record
        (rec(1234, TOTAL + 1), "memory_above_total"),
        (rec(-5), "malformed"),
        (rec("1234"), "malformed"),
        (rec(True), "malformed"),
        (rec(1234, -1), "malformed"),
        (rec(1234, "1 GiB"), "malformed"),
        (rec(1234, gi=3_221_225_472), "malformed"),  # an instance id read from a memory field
        (rec(1234, ci=None), "malformed"),
    ],
)
def test_each_reason_drops_the_record(record: SimpleNamespace, reason: str) -> None:
    kept, drops = check(record)
    assert kept == [] and drops == Counter({reason: 1})
    assert reason in STRUCTURAL


def test_not_available_memory_keeps_the_process_with_unknown_memory() -> None:
    kept, drops = check(rec(101, None), rec(102, NOT_AVAILABLE_U64), rec(103, 1 << 30))
    assert [(r.pid, r.memory_bytes) for r in kept] == [(101, None), (102, None), (103, 1 << 30)]
    assert drops == Counter({"memory_not_available": 2})
    assert structural(drops) == {}


def test_memory_bound_without_a_known_total_is_8_eib() -> None:
    assert check(rec(1, 1 << 62), total=None)[0][0].memory_bytes == 1 << 62
    assert check(rec(1, (1 << 63) + 1), total=None)[1] == Counter({"memory_above_total": 1})


def test_duplicates_in_one_list_keep_the_first() -> None:
    kept, drops = check(rec(7, 100), rec(7, 200), rec(7, 300, gi=1, ci=0))
    assert [(r.pid, r.memory_bytes, r.gpu_instance_id) for r in kept] == [(7, 100, None), (7, 300, 1)]
    assert drops == Counter({"duplicate": 1})


def test_mig_instance_ids_are_kept_and_0xffffffff_means_mig_off() -> None:
    kept, _ = check(rec(9, gi=3, ci=0), rec(10))
    assert [(r.gpu_instance_id, r.compute_instance_id) for r in kept] == [(3, 0), (None, None)]


def test_the_issue_misaligned_pids_are_all_dropped_except_the_real_one() -> None:
    """The PIDs of the issue's report (1184, 0, 4294967295, 4294967295, 16040, 0): only 1184 and
    16040 can be processes; the zeros and the 32-bit sentinels are dropped by reason."""
    pids = [1184, 0, NOT_AVAILABLE_U32, NOT_AVAILABLE_U32, 16040, 0, 0, NOT_AVAILABLE_U32]
    kept, drops = check(*(rec(p) for p in pids))
    assert [r.pid for r in kept] == [1184, 16040]
    assert drops == Counter({"pid_zero": 3, "pid_not_available": 3})


def test_a_real_r535_misread_list_fails_structurally() -> None:
    """Records written as the 32-byte struct and read as 24-byte ones (the fake does it with
    ctypes): the first record survives, the rest are dropped with structural reasons."""
    truth = [rec(1184, 3 << 30), rec(16040, 7 << 30), rec(16041, 1 << 30), rec(16042, 512 << 20)]
    kept, drops = check(*misaligned_r535(truth))
    assert kept[0] == ProcessRecord(1184, 3 << 30)
    assert structural(drops), drops
    assert 16040 not in [r.pid for r in kept]


def test_swapped_pid_and_memory_are_dropped() -> None:
    kept, drops = check(*swapped([rec(9980, 6_498_025_472)]))
    assert kept == [] and drops == Counter({"pid_above_max": 1})


def test_merge_takes_the_larger_memory_and_unites_kinds() -> None:
    compute = [ProcessRecord(5, 100, kinds=("compute",)), ProcessRecord(6, None, kinds=("compute",))]
    graphics = [ProcessRecord(5, 300, kinds=("graphics",)), ProcessRecord(6, 50, kinds=("graphics",))]
    mps = [ProcessRecord(8, 10, kinds=("mps",))]
    got = merge([compute, graphics, mps])
    assert [(r.pid, r.memory_bytes, r.kinds) for r in got] == [
        (5, 300, ("compute", "graphics")),
        (6, 50, ("compute", "graphics")),
        (8, 10, ("mps",)),
    ]


def sample(pid: Any, ts: Any = 10, sm: Any = 50, mem: Any = 5, enc: Any = 0, dec: Any = 0) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm, memUtil=mem, encUtil=enc, decUtil=dec)


def test_samples_keep_the_latest_per_pid_and_drop_bad_ones() -> None:
    drops: Counter[str] = Counter()
    got = validate_samples(
        [sample(1, 10, 20), sample(1, 30, 90), sample(1, 20, 40), sample(0), sample(2, sm=101), sample(3, ts=None)],
        pid_max=PID_MAX,
        drops=drops,
    )
    assert list(got) == [1] and got[1].sm == 90 and got[1].timestamp_us == 30
    assert drops == Counter({"pid_zero": 1, "utilization_out_of_range": 1, "malformed": 1})


def test_reasons_are_documented() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `nvgpu_process_records_dropped_total`"))
    assert all(reason in row for reason in REASONS)
