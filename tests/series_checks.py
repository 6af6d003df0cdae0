"""Checks of a whole exposition that MIG makes necessary: no series twice, no MIG instance
counted as a GPU (used by test_mig.py on the golden and test_integration_mig.py on the real
exporter)."""

from __future__ import annotations

from collections import Counter

from prometheus_client.parser import text_string_to_metric_families


def duplicate_series(text: str) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """Series (name and label set) that appear more than once in an exposition."""
    seen: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            seen[(s.name, tuple(sorted(s.labels.items())))] += 1
    return [k for k, n in seen.items() if n > 1]


def instance_problems(text: str) -> list[str]:
    """Ways MIG instances could be counted twice: a MIG UUID as a GPU's ``uuid``, instance labels
    on a per-GPU family, a GPU instance's series more than once."""
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("uuid", "").startswith("MIG-"):
                out.append(f"{s.name}: a MIG device exported as a GPU {s.labels}")
            is_mig = s.name.startswith("nvgpu_mig_") or s.name == "nvgpu_gpu_pod_info"
            if not is_mig and {"gpu_instance_id", "mig_uuid"} & set(s.labels):
                out.append(f"{s.name}: instance labels on a per-GPU family {s.labels}")
    return out
