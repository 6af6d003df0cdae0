"""docs/capabilities.json: the capability table's shape, which later tests and scenarios read.

Every feature of guards/featuretable.py has a cell per GPU generation and driver branch; every cell
says what each NVML call answers there and names its sources; only the H200 / R580 cells are
measured, and those cite a measurement. The same holds for the ``capabilities`` added inside features for the
newer generations (NVLink5 counters, fabric health, temperature thresholds, module power).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from guards.featuretable import FEATURES

ROOT = Path(__file__).resolve().parent.parent
TABLE_PATH = ROOT / "docs" / "capabilities.json"
DOC_PATH = ROOT / "docs" / "capabilities.md"

BRANCHES = ("R535", "R550", "R570", "R580", "R590")
ANSWERS = {
    "supported",
    "deprecated",
    "NOT_SUPPORTED",
    "FUNCTION_NOT_FOUND",
    "ARGUMENT_VERSION_MISMATCH",
    "INVALID_ARGUMENT",
    "NO_PERMISSION",
    "not_in_binding",
    "not_called",
    "absent",
    "unknown",
}
MISSING = {"FUNCTION_NOT_FOUND", "ARGUMENT_VERSION_MISMATCH", "not_in_binding"}
MEASURED_AT = ("hopper", "R580")


@pytest.fixture(scope="module")
def table() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
    return data


def _cells(table: dict[str, Any], section: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    return [
        (name, gen, branch, cell)
        for name, entry in table[section].items()
        for gen, branches in entry["cells"].items()
        for branch, cell in branches.items()
    ]


def test_table_names_the_five_branches_and_the_generations(table: dict[str, Any]) -> None:
    assert table["schema"] == 2
    assert tuple(table["branches"]) == BRANCHES
    architectures = {gen["architecture"] for gen in table["generations"].values()}
    assert {"Ampere", "Ada Lovelace", "Hopper", "Blackwell"} <= architectures
    products = " ".join(p for gen in table["generations"].values() for p in gen["products"])
    wanted = ("A100", "A30", "A10", "L40S", "L4", "H100", "H200", "H20", "GH200", "B200", "GB200", "RTX PRO 6000")
    for product in wanted:
        assert product in products, product


def test_every_feature_has_a_cell_per_generation_and_branch(table: dict[str, Any]) -> None:
    assert set(table["features"]) == set(FEATURES)
    for section in ("features", "capabilities"):
        for name, entry in table[section].items():
            assert set(entry["cells"]) == set(table["generations"]), (section, name)
            for gen, branches in entry["cells"].items():
                assert tuple(branches) == BRANCHES, (section, name, gen)


def test_cells_use_the_declared_statuses_answers_and_calls(table: dict[str, Any]) -> None:
    confidences = set(table["confidence"])
    for section in ("features", "capabilities"):
        for name, gen, branch, cell in _cells(table, section):
            where = (section, name, gen, branch)
            assert cell["status"] in table["statuses"], where
            assert cell.get("confidence", "documented") in confidences, where
            calls = table[section][name]["calls"]
            for call, answer in cell["answers"].items():
                assert call in calls, (*where, call)
                assert answer in ANSWERS, (*where, call, answer)
            for call in cell.get("uses", []):
                assert call in calls, (*where, call)


def test_every_cell_that_is_not_measured_names_a_source(table: dict[str, Any]) -> None:
    sources = table["sources"]
    for section in ("features", "capabilities"):
        for name, gen, branch, cell in _cells(table, section):
            where = (section, name, gen, branch)
            assert cell["sources"], where
            for source in cell["sources"]:
                assert source in sources, (*where, source)
            if not cell.get("measured", False):
                assert any(sources[s]["kind"] != "measurement" for s in cell["sources"]), where


def test_sources_point_somewhere_real(table: dict[str, Any]) -> None:
    for key, source in table["sources"].items():
        assert source["what"], key
        if "file" in source:
            assert (ROOT / source["file"]).exists(), (key, source["file"])
        else:
            assert source["url"].startswith("https://"), key


def test_only_the_h200_on_r580_is_measured_and_says_so(table: dict[str, Any]) -> None:
    sources = table["sources"]
    sections = ("features", "capabilities")
    measured = [(s, n, g, b) for s in sections for n, g, b, c in _cells(table, s) if c.get("measured")]
    assert measured, "the H200 / R580 measurements are marked"
    for section, name, gen, branch in measured:
        cell = table[section][name]["cells"][gen][branch]
        assert (gen, branch) == MEASURED_AT, (section, name, gen, branch)
        assert cell.get("confidence") == "measured", (section, name)
        assert any(sources[s]["kind"] == "measurement" for s in cell["sources"]), (section, name)
    for name in ("identity", "memory", "power", "temperature", "fan", "nvlink", "fabric", "gpm", "processes"):
        assert table["features"][name]["cells"]["hopper"]["R580"].get("measured"), name


def test_a_supported_cell_with_a_missing_call_names_its_fallback(table: dict[str, Any]) -> None:
    for name, gen, branch, cell in _cells(table, "features"):
        if cell["status"] != "supported" or not MISSING & set(cell["answers"].values()):
            continue
        assert cell.get("fallback") or table["features"][name]["fallback"], (name, gen, branch)


def test_branches_that_do_not_drive_a_gpu_are_not_applicable_everywhere(table: dict[str, Any]) -> None:
    for gen in ("blackwell", "blackwell_gb200", "blackwell_rtx"):
        for branch in ("R535", "R550"):
            for section in ("features", "capabilities"):
                for name, entry in table[section].items():
                    assert entry["cells"][gen][branch]["status"] == "not_applicable", (section, name, gen, branch)


def test_the_documented_fallbacks_are_in_the_table(table: dict[str, Any]) -> None:
    features = table["features"]
    temperature = features["temperature"]["cells"]["ampere_ga100"]
    assert temperature["R535"]["answers"]["nvmlDeviceGetTemperatureV"] == "FUNCTION_NOT_FOUND"
    assert "nvmlDeviceGetTemperatureV" not in temperature["R570"]["answers"]
    fabric = features["fabric"]["cells"]["hopper"]
    assert fabric["R535"]["answers"]["nvmlDeviceGetGpuFabricInfoV"] == "FUNCTION_NOT_FOUND"
    assert fabric["R550"]["answers"]["nvmlDeviceGetGpuFabricInfoV v3"] == "ARGUMENT_VERSION_MISMATCH"
    nvlink = features["nvlink"]["cells"]["blackwell_gb200"]["R580"]
    assert nvlink["status"] == "supported"  # through the NVLink5 counters
    assert nvlink["answers"]["field 161-163"] == "NOT_SUPPORTED"
    assert "NVML_FI_DEV_NVLINK_COUNT_" in table["features"]["nvlink"]["cells"]["blackwell_gb200"]["R580"]["fallback"]
    assert features["gpm"]["cells"]["ada"]["R580"]["status"] == "unsupported"


def test_the_document_explains_the_table() -> None:
    text = DOC_PATH.read_text(encoding="utf-8")
    for heading in ("## Capability table", "## NVML facts per generation", "## Scenario recipes"):
        assert heading in text, heading
    assert "docs/capabilities.json" in text


def test_the_json_is_what_its_generator_writes():
    """docs/capabilities.json is generated: a hand edit that the generator would undo fails here."""
    import subprocess
    import sys

    gen = Path(__file__).resolve().parent.parent / "docs" / "generate_capabilities.py"
    done = subprocess.run([sys.executable, str(gen), "--check"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
