"""Tests for the Xid catalog (exporter/supervisor/xid/catalog.json and its loader)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from exporter.supervisor.xid import (
    ACTIONS,
    CLASSES,
    SEVERITIES,
    CatalogError,
    XidInfo,
    classify,
    codes_of_class,
    codes_of_severity,
    load_catalog,
    parse_catalog,
    promql_regex,
)

CATALOG_PATH = Path(__file__).resolve().parents[1] / "exporter" / "supervisor" / "xid" / "catalog.json"

# Every code of NVIDIA's Xid catalog for Ampere and newer that operators meet on data-centre GPUs
# (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), plus NVML's "unknown Xid".
NOTES_CODES = (
    13, 31, 32, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120,
    140, 143, 144, 145, 146, 147, 148, 149, 150, 154, 155, 156, 157, 158, 999,
)  # fmt: skip
# Policy.
APPLICATION = (13, 31, 43, 45, 68, 109)
HARDWARE_CRITICAL = (48, 63, 64, 74, 79, 92, 94, 95, 119, 120)
DECIDED_CRITICAL = (140, 143, 155, 156, 157, 158)
NVLINK5 = (144, 145, 146, 147, 148, 149, 150)


def raw_catalog() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(CATALOG_PATH.read_text(encoding="utf-8"))
    return data


def test_covers_every_code_of_the_reference_notes() -> None:
    catalog = load_catalog()
    missing = [code for code in NOTES_CODES if code not in catalog]
    assert missing == []


def test_application_class_is_exactly_the_device_plugin_list_and_info() -> None:
    assert codes_of_class("application") == APPLICATION
    for code in APPLICATION:
        info = classify(code)
        assert (info.severity, info.action) == ("info", "restart_job")
        assert "k8s-device-plugin" in {s.key for s in info.sources}


@pytest.mark.parametrize("code", HARDWARE_CRITICAL + DECIDED_CRITICAL)
def test_hardware_class_codes_are_critical(code: int) -> None:
    info = classify(code)
    assert info.severity == "critical"
    assert info.xid_class not in ("application", "meta", "unknown")


@pytest.mark.parametrize("code", NVLINK5)
def test_nvlink5_codes_are_warnings_with_a_reason(code: int) -> None:
    info = classify(code)
    assert (info.xid_class, info.severity) == ("nvlink", "warning")
    assert info.note is not None and "recovery action" in info.note


def test_no_application_code_is_above_info_and_no_critical_code_is_application() -> None:
    critical = set(codes_of_severity("critical"))
    assert critical.isdisjoint(APPLICATION)
    assert set(codes_of_severity("info")) >= set(APPLICATION)


def test_codes_of_severity_partition_the_catalog() -> None:
    catalog = load_catalog()
    parts = [set(codes_of_severity(s)) for s in SEVERITIES]
    assert sum(len(p) for p in parts) == len(catalog)
    assert set().union(*parts) == set(catalog)


def test_every_entry_cites_a_source_and_deviations_explain_themselves() -> None:
    for code, info in load_catalog().items():
        assert info.sources, code
        assert all(s.url.startswith("https://") for s in info.sources), code
        assert info.meaning and info.meaning != info.mnemonic, code
        # Where we are stricter than NVIDIA's immediate bucket, the entry says why.
        if info.severity == "critical" and info.nvidia_action in ("IGNORE", "RESTART_APP"):
            assert info.note, f"xid {code} is critical against NVIDIA's {info.nvidia_action}"


def test_nvidia_catalog_is_cited_by_its_address() -> None:
    urls = {s.url for info in load_catalog().values() for s in info.sources}
    assert "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html" in urls


def test_classify_unknown_code() -> None:
    info = classify(4242)
    assert (info.xid, info.xid_class, info.severity, info.known) == (
        4242,
        "unknown",
        "warning",
        False,
    )


def test_classify_nvml_unknown_999_is_in_the_catalog() -> None:
    info = classify(999)
    assert (info.xid_class, info.severity, info.known) == ("unknown", "warning", True)
    assert codes_of_class("unknown") == (999,)


def test_entries_are_frozen_and_the_mapping_read_only() -> None:
    catalog = load_catalog()
    with pytest.raises(dataclasses.FrozenInstanceError):
        catalog[13].severity = "critical"  # type: ignore[misc]
    with pytest.raises(TypeError):
        catalog[13] = catalog[31]  # type: ignore[index]


def test_codes_of_class_rejects_unknown_class() -> None:
    with pytest.raises(ValueError, match="unknown Xid class 'hw'"):
        codes_of_class("hw")
    with pytest.raises(ValueError, match="unknown severity"):
        codes_of_severity("fatal")


def test_every_class_is_described_and_used_or_reserved() -> None:
    used = {info.xid_class for info in load_catalog().values()}
    assert used <= set(CLASSES)
    assert {info.action for info in load_catalog().values()} <= set(ACTIONS)


def test_promql_regex_sorts_and_dedupes() -> None:
    assert promql_regex([43, 13, 31, 13]) == "13|31|43"


def test_file_is_sorted_by_code() -> None:
    keys = list(raw_catalog()["codes"])
    assert keys == sorted(keys, key=int)


def test_load_catalog_from_path_and_cache(tmp_path: Path) -> None:
    path = tmp_path / "catalog.json"
    path.write_text(CATALOG_PATH.read_text(encoding="utf-8"), encoding="utf-8")
    loaded = load_catalog(path)
    assert loaded == load_catalog()
    assert load_catalog(path) is loaded


def test_load_catalog_names_the_file_on_bad_json(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{", encoding="utf-8")
    with pytest.raises(CatalogError, match="broken.json: not valid JSON"):
        load_catalog(path)


def _mutate(change: str) -> dict[str, Any]:
    data = copy.deepcopy(raw_catalog())
    entry = data["codes"]["13"]
    if change == "unknown field":
        entry["colour"] = "red"
    elif change == "missing field":
        del entry["severity"]
    elif change == "bad class":
        entry["class"] = "gpu"
    elif change == "bad severity":
        entry["severity"] = "high"
    elif change == "bad action":
        entry["action"] = "panic"
    elif change == "unknown source":
        entry["sources"] = ["nvidia-xid-catalog", "a-blog"]
    elif change == "empty sources":
        entry["sources"] = []
    elif change == "duplicate source":
        entry["sources"] = ["nvidia-xid-catalog", "nvidia-xid-catalog"]
    elif change == "lower-case nvidia action":
        entry["nvidia_action"] = "restart_app"
    elif change == "empty meaning":
        entry["meaning"] = ""
    elif change == "long meaning":
        entry["meaning"] = "x" * 241
    elif change == "padded mnemonic":
        entry["mnemonic"] = " GR "
    elif change == "unknown class outside 999":
        entry["class"] = "unknown"
    elif change == "note not a string":
        entry["note"] = 3
    else:  # pragma: no cover - test table and branches must agree
        raise AssertionError(change)
    return data


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ("unknown field", "colour"),
        ("missing field", "severity"),
        ("bad class", "class"),
        ("bad severity", "severity"),
        ("bad action", "action"),
        ("unknown source", "sources"),
        ("empty sources", "sources"),
        ("duplicate source", "sources"),
        ("lower-case nvidia action", "nvidia_action"),
        ("empty meaning", "meaning"),
        ("long meaning", "meaning"),
        ("padded mnemonic", "mnemonic"),
        ("unknown class outside 999", "class"),
        ("note not a string", "note"),
    ],
)
def test_strict_validation_names_code_and_field(change: str, field: str) -> None:
    with pytest.raises(CatalogError) as caught:
        parse_catalog(_mutate(change))
    assert str(caught.value).startswith(f"xid 13: field {field!r}:")


@pytest.mark.parametrize("code", ["013", "abc", "1000", "0", "-1"])
def test_strict_validation_of_codes(code: str) -> None:
    data = raw_catalog()
    data["codes"][code] = data["codes"].pop("13")
    with pytest.raises(CatalogError, match=f"xid '{code}': field 'code'"):
        parse_catalog(data)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(version=2), "field 'version'"),
        (lambda d: d.update(extra=1), "field 'extra': unknown top-level field"),
        (lambda d: d.update(codes={}), "field 'codes'"),
        (lambda d: d["sources"]["gpud"].update(url="http://example.org"), "source 'gpud'"),
        (lambda d: d["sources"].update({"Bad Key": {"title": "t", "url": "https://x"}}), "key"),
    ],
)
def test_strict_validation_of_the_document(change: Any, message: str) -> None:
    data = raw_catalog()
    change(data)
    with pytest.raises(CatalogError, match=message):
        parse_catalog(data)


def test_parse_catalog_rejects_non_objects() -> None:
    with pytest.raises(CatalogError, match="expected an object"):
        parse_catalog([])


def test_xidinfo_defaults() -> None:
    info = XidInfo(xid=1, mnemonic="M", xid_class="driver", severity="info", action="none", meaning="m")
    assert (info.known, info.sources, info.nvidia_action, info.note) == (True, (), None, None)


def test_docs_table_matches_the_catalog() -> None:
    expected = [
        f"| {code} | `{i.mnemonic}` | {i.xid_class} | {i.severity} | {i.action} "
        f"| {i.nvidia_action or '-'} | {i.meaning} |"
        for code, i in load_catalog().items()
    ]
    doc = (Path(__file__).resolve().parents[1] / "docs" / "xid.md").read_text(encoding="utf-8")
    rows = [line for line in doc.splitlines() if re.match(r"\| \d+ \|", line)]
    assert rows == expected, "docs/xid.md's table differs; expected rows:\n" + "\n".join(expected)
