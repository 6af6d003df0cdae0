"""exporter.supervisor.xid.dedupe: an Xid reported by both NVML and the kernel log counts once."""

from __future__ import annotations

import pytest

from exporter.supervisor.xid.dedupe import XidDeduplicator, XidSighting, dedupe


def test_dedup_drops_kernel_copy_of_an_nvml_event() -> None:
    dedup = XidDeduplicator(window_s=5)
    assert dedup.offer_nvml("GPU-a", 79, 1000.0)
    assert not dedup.offer_kernel("GPU-a", 79, 998.2)
    assert dedup.offer_kernel("GPU-a", 79, 1000.5)  # the NVML report is already paired
    assert dedup.offer_kernel("GPU-b", 79, 1000.0)  # another GPU
    assert dedup.offer_kernel("GPU-a", 48, 1000.0)  # another Xid
    assert dedup.duplicates == 1


def test_dedup_either_order_and_outside_window() -> None:
    dedup = XidDeduplicator(window_s=5)
    assert dedup.offer_kernel("GPU-a", 13, 100.0)
    assert not dedup.offer_nvml("GPU-a", 13, 103.0)
    assert dedup.offer_nvml("GPU-a", 13, 200.0)
    assert dedup.offer_kernel("GPU-a", 13, 206.0)


def test_dedup_is_one_to_one_for_bursts() -> None:
    dedup = XidDeduplicator(window_s=5)
    counted = [dedup.offer_nvml("GPU-a", 13, 10.0 + i * 0.01) for i in range(3)]
    counted += [dedup.offer_kernel("GPU-a", 13, 10.0 + i * 0.01) for i in range(4)]
    assert counted == [True, True, True, False, False, False, True]


def test_dedup_forgets_after_retention() -> None:
    dedup = XidDeduplicator(window_s=5, retention_s=60)
    assert dedup.offer_nvml("GPU-a", 13, 0.0)
    assert dedup.offer_nvml("GPU-b", 31, 100.0)  # moves time on, prunes GPU-a's report
    assert dedup.offer_kernel("GPU-a", 13, 4.0)


def test_dedup_rejects_bad_window() -> None:
    with pytest.raises(ValueError):
        XidDeduplicator(window_s=10, retention_s=5)


def test_batch_dedupe() -> None:
    nvml = [XidSighting("GPU-a", 13, 100.0), XidSighting("GPU-a", 43, 101.0)]
    kernel = [
        XidSighting("GPU-a", 13, 99.9),
        XidSighting("GPU-a", 31, 100.0),
        XidSighting("GPU-a", 43, 130.0),
        XidSighting("GPU-a", 43, 100.8),
    ]
    assert dedupe(nvml, kernel) == [
        XidSighting("GPU-a", 31, 100.0),
        XidSighting("GPU-a", 43, 130.0),
    ]
