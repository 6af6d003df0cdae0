"""The default series per GPU stay within the budget on the H200 scenarios.

Counts the golden expositions of the shipped scenarios (``tests/golden/h200x1.prom``, ``h200x2``,
``h200x8``: default settings, rendered by a real supervisor from what a real worker sent;
``tests/test_golden.py`` keeps them equal to what the exporter renders now). A series per GPU is
one that carries a ``uuid`` label. When the default grows past :data:`BUDGET`, the failure names
the families and their counts, largest first: move a family behind a switch (``details``,
``nvlink_links``) or make its case with numbers in docs/performance.md and name it in
:data:`EARNS_ITS_PLACE`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.common import collectors

GOLDEN = Path(__file__).resolve().parent / "golden"
BUDGET = 60
SCENARIOS = ("h200x1", "h200x2", "h200x8")
# Families allowed beyond the budget, each with the case docs/performance.md makes for it.
EARNS_ITS_PLACE: dict[str, str] = {
    "nvgpu_gpu_health_verdict": "one series per GPU: the answer to 'what do I do with this GPU now', which the "
    "shipped alerts key on instead of re-deriving it from a dozen families",
}


def per_gpu(name: str) -> tuple[int, Counter[str]]:
    """(GPUs, family -> series per GPU summed over GPUs) of golden ``name``."""
    families: Counter[str] = Counter()
    uuids: set[str] = set()
    for fam in text_string_to_metric_families((GOLDEN / f"{name}.prom").read_text()):
        family = fam.name + "_total" if fam.type == "counter" else fam.name
        for sample in fam.samples:
            if "uuid" in sample.labels:
                uuids.add(sample.labels["uuid"])
                families[family] += 1
    return len(uuids), families


def _feature(family: str) -> str:
    for feature, collector in collectors.COLLECTORS.items():
        if any(spec.name == family for spec in collector.METRICS):
            return feature
    return "(always)"


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_golden_is_the_default(name: str) -> None:
    fixture = json.loads((GOLDEN / f"{name}.snapshot.json").read_text())
    assert fixture["modes"] == {}, f"golden {name} must be captured with default settings"


@pytest.mark.parametrize("name", SCENARIOS)
def test_default_series_per_gpu_within_budget(name: str) -> None:
    gpus, families = per_gpu(name)
    assert gpus == int(name[-1])
    counted = {f: n for f, n in families.items() if f not in EARNS_ITS_PLACE}
    total = sum(counted.values())
    if total > BUDGET * gpus:
        table = "\n".join(f"  {n / gpus:5.1f}  {family}  ({_feature(family)})" for family, n in families.most_common())
        pytest.fail(
            f"{name}: {total / gpus:.1f} default series per GPU, budget {BUDGET}. Per GPU, by "
            f"family (feature):\n{table}\nMove a family behind a switch (details, nvlink_links) or make its "
            "case in docs/performance.md and name it in EARNS_ITS_PLACE."
        )


def test_exemptions_name_real_families_with_a_reason() -> None:
    from exporter.supervisor import verdicts

    declared = {spec.name for c in collectors.COLLECTORS.values() for spec in c.METRICS} | {
        spec.name for spec in verdicts.METRICS
    }
    for family, reason in EARNS_ITS_PLACE.items():
        assert family in declared and reason.strip(), family


def test_per_link_nvlink_series_are_not_default() -> None:
    """18 links x 7 series per GPU were most of a node's series: by default only per-GPU totals (and
    the links that have errors, none in the shipped scenarios)."""
    for name in ("h200x2", "h200x8"):
        _, families = per_gpu(name)
        assert not [f for f in families if f.startswith("nvgpu_nvlink_link_")], name
        gpus, _ = per_gpu(name)
        for family in (
            "nvgpu_nvlink_links_up",
            "nvgpu_nvlink_transmit_bytes_total",
            "nvgpu_nvlink_receive_bytes_total",
        ):
            assert families[family] == gpus, (name, family)
        assert families["nvgpu_nvlink_errors_total"] == 4 * gpus  # replay, recovery, crc_flit, crc_data


def test_the_switches_add_what_they_say() -> None:
    """The golden with every switch on (details, nvlink_links) holds the series the default leaves out."""
    gpus, default = per_gpu("h200x2")
    _, detailed = per_gpu("detailed")
    added = {f: (detailed[f] - default.get(f, 0)) // gpus for f in detailed if detailed[f] > default.get(f, 0)}
    assert added.pop("nvgpu_nvlink_link_errors_total") == 18 * 4
    assert added.pop("nvgpu_nvlink_link_up") == 18
    assert added.pop("nvgpu_nvlink_link_transmit_bytes_total") == 18
    assert added.pop("nvgpu_nvlink_link_receive_bytes_total") == 18
    assert added == {
        "nvgpu_clock_event_reason_active": 9,
        "nvgpu_clock_event_reason_seconds_total": 5,
        "nvgpu_clock_hertz": 2,
        "nvgpu_clock_max_hertz": 3,
        "nvgpu_performance_state": 1,
        "nvgpu_memory_free_bytes": 1,
        "nvgpu_bar1_memory_used_bytes": 1,
        "nvgpu_bar1_memory_total_bytes": 1,
        "nvgpu_ecc_aggregate_errors_total": 2,
        "nvgpu_pcie_link_max_generation": 1,
        "nvgpu_pcie_link_max_width": 1,
        "nvgpu_encoder_utilization_ratio": 1,
        "nvgpu_decoder_utilization_ratio": 1,
        "nvgpu_nvlink_links": 1,
    }
