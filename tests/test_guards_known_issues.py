"""Tests for guards.known_issues: version parsing, the rule table, matching and validation."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from guards.features import Mode, Reason, parse_feature_env, resolve
from guards.known_issues import (
    DEFAULT_PATH,
    KnownIssue,
    VersionRange,
    load_known_issues,
    match_known_issues,
    parse_release,
    parse_version,
)

INCIDENT_ID = "h20-580-nvlink-throughput-heap-corruption"


def shipped_rows() -> list[dict[str, Any]]:
    with open(DEFAULT_PATH, encoding="utf-8") as handle:
        rows: list[dict[str, Any]] = json.load(handle)
    return rows


def write_table(tmp_path: Path, rows: list[Any]) -> Path:
    path = tmp_path / "known_issues.json"
    path.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return path


# --- versions -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("580.126.20", (580, 126, 20)),
        ("580.159.04", (580, 159, 4)),
        ("580", (580,)),
        (" 535.104.05\n", (535, 104, 5)),
    ],
)
def test_parse_version(text: str, expected: tuple[int, ...]) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "580.126.20-custom", "580..1", "r582_49", "580."])
def test_parse_version_rejects_odd_strings_naming_them(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_version(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12.575.51", (12, 575, 51)),
        ("13.580.82.post1", (13, 580, 82)),
        ("0.1.0.dev3+g1234abc", (0, 1, 0)),
        ("2.0rc1", (2, 0)),
    ],
)
def test_parse_release(text: str, expected: tuple[int, ...]) -> None:
    assert parse_release(text) == expected


def test_parse_release_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="'twelve'"):
        parse_release("twelve")


@pytest.mark.parametrize(
    ("version", "inside"),
    [
        ("580", True),
        ("580.0.0", True),
        ("580.126.20", True),
        ("580.159.04", True),
        ("579.99", False),
        ("575.57.08", False),
        ("581", False),
        ("581.0.1", False),
        ("590.44.01", False),
    ],
)
def test_prefix_semantics(version: str, inside: bool) -> None:
    assert VersionRange("580", "581").contains(parse_version(version)) is inside


def test_bounds_name_a_prefix() -> None:
    branch_126 = VersionRange(min="580.126", max_exclusive="580.127")
    assert branch_126.contains((580, 126, 20))
    assert branch_126.contains((580, 126))
    assert not branch_126.contains((580, 127, 1))
    assert not branch_126.contains((580, 95, 5))
    assert VersionRange().contains((1,))
    assert VersionRange(max_exclusive="580.126").contains((580, 95, 5))
    assert not VersionRange(max_exclusive="580.126").contains((580, 126, 20))


# --- the shipped table and the incident rule ----------------------------------------------------


def test_shipped_table_loads_and_holds_the_incident_rule() -> None:
    rules = load_known_issues()
    assert rules == load_known_issues(DEFAULT_PATH)
    rule = rules[0]
    assert rule.id == INCIDENT_ID
    assert rule.feature == "nvlink_throughput"
    assert rule.driver == VersionRange("580", "581")
    assert rule.nvidia_ml_py is None
    for text in ("double free or corruption", "139", "nvmlDeviceGetFieldValues", "106 of 108"):
        assert text in rule.reason
    assert "NVGPU_FEATURE_NVLINK_THROUGHPUT=on" in rule.reference


@pytest.mark.parametrize(
    ("model", "matches"),
    [
        ("NVIDIA H20", True),
        ("NVIDIA H20-3e", True),
        ("NVIDIA H20-3e 141GB", True),
        ("NVIDIA H20 96GB HBM3", True),
        ("nvidia h20", True),
        ("NVIDIA H200", False),
        ("NVIDIA H200 NVL", False),
        ("NVIDIA H20X", False),
        ("NVIDIA H100 80GB HBM3", False),
        ("NVIDIA GeForce RTX 4090", False),
    ],
)
def test_incident_rule_models(model: str, matches: bool) -> None:
    rule = load_known_issues()[0]
    assert rule.matches_model(model) is matches
    found = match_known_issues([rule], gpu_models=[model], driver_version="580.126.20", binding_version="12.575.51")
    assert ("nvlink_throughput" in found) is matches


@pytest.mark.parametrize(
    ("driver", "matches"),
    [
        ("580.126.20", True),
        ("580.126.09", True),
        ("580.159.04", True),
        ("580.65.06", True),
        ("575.57.08", False),
        ("570.172.08", False),
        ("590.44.01", False),
        ("581.1", False),
    ],
)
def test_incident_rule_driver_range(driver: str, matches: bool) -> None:
    found = match_known_issues(
        load_known_issues(),
        gpu_models=["NVIDIA H20"],
        driver_version=driver,
        binding_version="13.580.82",
    )
    assert ("nvlink_throughput" in found) is matches


def test_any_gpu_of_the_node_matching_is_enough() -> None:
    found = match_known_issues(
        load_known_issues(),
        gpu_models=(m for m in ["NVIDIA H200", "NVIDIA H20-3e"]),
        driver_version="580.126.20",
        binding_version=None,
    )
    detail = found["nvlink_throughput"]
    assert detail.endswith(f"; rule {INCIDENT_ID})")
    assert "docs/design.md, first incident" in detail
    assert detail.startswith("native heap corruption")


def test_nothing_matches_on_h200_nodes() -> None:
    assert (
        match_known_issues(
            load_known_issues(),
            gpu_models=["NVIDIA H200"] * 8,
            driver_version="580.126.20",
            binding_version="12.575.51",
        )
        == {}
    )


@pytest.mark.parametrize("driver", ["580.126.20-grid", "", "garbled\ud800", "r580"])
def test_odd_driver_string_fails_safe_and_says_so(driver: str) -> None:
    """An unparsable driver version used to leave every rule "not evaluated", silently
    dropping the H20/580 guard. Now the rule applies when the model matches, and says why."""
    said: list[str] = []
    hits = match_known_issues(
        load_known_issues(),
        gpu_models=["NVIDIA H20"],
        driver_version=driver,
        binding_version=None,
        on_unparsable=said.append,
    )
    assert "nvlink_throughput" in hits and "applied to be safe" in hits["nvlink_throughput"]
    assert len(said) == 1 and repr(driver) in said[0]
    other = match_known_issues(
        load_known_issues(), gpu_models=["NVIDIA H200"], driver_version=driver, binding_version=None
    )
    assert other == {}  # the model still has to match


# --- data-only extension ------------------------------------------------------------------------


def test_new_row_in_a_json_file_works_without_code_change(tmp_path: Path) -> None:
    rows = shipped_rows() + [
        {
            "id": "early-535-v3-process-struct",
            "feature": "processes",
            "gpu_models": ["NVIDIA H100*", "NVIDIA A100*"],
            "driver": {"min": "535.43", "max_exclusive": "535.104"},
            "reason": "_v3 process list returns a 32-byte struct; pid and memory read scrambled",
            "reference": "XuehaiPan/nvitop PR #89; override with NVGPU_FEATURE_PROCESSES=on",
        }
    ]
    rules = load_known_issues(str(write_table(tmp_path, rows)))
    assert [r.id for r in rules] == [INCIDENT_ID, "early-535-v3-process-struct"]
    found = match_known_issues(
        rules,
        gpu_models=["NVIDIA H100 80GB HBM3"],
        driver_version="535.86.10",
        binding_version="12.535.161",
    )
    assert list(found) == ["processes"]
    states = resolve(parse_feature_env({})[0], known_issues=found)
    assert (states["processes"].enabled, states["processes"].reason) == (
        False,
        Reason.KNOWN_ISSUE,
    )
    assert states["nvlink_throughput"].enabled
    for fixed in ("535.104.05", "535.43", "535.42.9"):
        hit = match_known_issues(
            rules, gpu_models=["NVIDIA A100-SXM4-80GB"], driver_version=fixed, binding_version=None
        )
        assert ("processes" in hit) is (fixed == "535.43")


@pytest.mark.parametrize(
    ("binding", "matches"),
    [
        ("12.575.51", True),
        ("12.575.51.post1", True),
        ("12.570.172", False),
        ("13.580.82", False),
        (None, True),  # unknown binding: safety first, the rule applies
    ],
)
def test_binding_range(tmp_path: Path, binding: str | None, matches: bool) -> None:
    row = copy.deepcopy(shipped_rows()[0])
    row["nvidia_ml_py"] = {"min": "12.575", "max_exclusive": "13"}
    rules = load_known_issues(str(write_table(tmp_path, [row])))
    assert rules[0].nvidia_ml_py == VersionRange("12.575", "13")
    found = match_known_issues(rules, gpu_models=["NVIDIA H20"], driver_version="580.126.20", binding_version=binding)
    assert ("nvlink_throughput" in found) is matches


def test_operator_override_after_a_fix() -> None:
    found = match_known_issues(
        load_known_issues(),
        gpu_models=["NVIDIA H20"],
        driver_version="580.126.20",
        binding_version="12.575.51",
    )
    auto = resolve({}, known_issues=found)["nvlink_throughput"]
    assert (auto.enabled, auto.reason) == (False, Reason.KNOWN_ISSUE)
    forced = resolve({"nvlink_throughput": Mode.ON}, known_issues=found)["nvlink_throughput"]
    assert (forced.enabled, forced.reason) == (True, Reason.ENV)


def test_several_rules_for_one_feature_are_joined() -> None:
    rules = [
        KnownIssue("a", "fan", ("*",), VersionRange(), None, "first", "ref-a"),
        KnownIssue("b", "fan", ("NVIDIA*",), VersionRange("500"), None, "second", "ref-b"),
        KnownIssue("c", "fan", ("Tesla*",), VersionRange(), None, "third", "ref-c"),
    ]
    found = match_known_issues(rules, gpu_models=["NVIDIA L4"], driver_version="550.1", binding_version=None)
    assert found == {"fan": "first (ref-a; rule a); second (ref-b; rule b)"}


# --- validation ---------------------------------------------------------------------------------


def _mutate(row: dict[str, Any], change: str) -> Any:
    if change == "not_an_object":
        return ["NVIDIA H20"]
    if change.startswith("del:"):
        del row[change[4:]]
        return row
    key, _, value = change.partition("=")
    target = row
    *parents, leaf = key.split(".")
    for parent in parents:
        target = target[parent]
    target[leaf] = json.loads(value)
    return row


@pytest.mark.parametrize(
    ("change", "field", "expected"),
    [
        ("del:feature", "'feature'", "missing"),
        ('feature="nvlink_thruput"', "'feature'", "expected one of identity"),
        ('feature=["nvlink"]', "'feature'", "expected one of identity"),
        ('gpu_models="NVIDIA H20"', "'gpu_models'", "non-empty list"),
        ("gpu_models=[]", "'gpu_models'", "non-empty list"),
        ("driver.min=580", "'driver.min'", 'such as "580"'),
        ('driver.max_exclusive="581.x"', "'driver.max_exclusive'", "dot-separated numbers"),
        ('driver={"min": "581", "max_exclusive": "580"}', "'driver'", "empty range"),
        ('driver="580"', "'driver'", '"max_exclusive"'),
        ('driver.max="581"', "'driver'", "unknown key"),
        ('nvidia_ml_py={"min": "12.x"}', "'nvidia_ml_py.min'", "dot-separated"),
        ('reason=""', "'reason'", "non-empty string"),
        ('referenc="x"', "unknown field(s) ['referenc']", "allowed"),
        ("not_an_object", "", "expected an object"),
    ],
)
def test_bad_row_names_file_row_and_field(tmp_path: Path, change: str, field: str, expected: str) -> None:
    good = shipped_rows()[0]
    bad = _mutate(copy.deepcopy(good), change)
    if isinstance(bad, dict):
        bad["id"] = "second"
    path = write_table(tmp_path, [good, bad])
    with pytest.raises(ValueError) as info:
        load_known_issues(str(path))
    message = str(info.value)
    assert f"{path}: row 1" in message
    assert field in message
    assert expected in message
    assert "row 0" not in message


def test_duplicate_id_is_an_error(tmp_path: Path) -> None:
    row = shipped_rows()[0]
    path = write_table(tmp_path, [row, row])
    with pytest.raises(ValueError, match=r"row 1 \(id '.*'\): field 'id': duplicate of row 0"):
        load_known_issues(str(path))


def test_every_problem_of_the_file_is_listed(tmp_path: Path) -> None:
    good = shipped_rows()[0]
    one = dict(good, id="one", feature="nope")
    two = dict(good, id="two", driver={"min": "x"})
    path = write_table(tmp_path, [one, good, two])
    with pytest.raises(ValueError) as info:
        load_known_issues(str(path))
    message = str(info.value)
    assert "row 0 (id 'one'): field 'feature'" in message
    assert "row 2 (id 'two'): field 'driver.min'" in message


def test_invalid_json_and_wrong_top_level(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('[{"id": "x",}]', encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.json: not valid JSON: .* line 1"):
        load_known_issues(str(path))
    path.write_text('{"rules": []}', encoding="utf-8")
    with pytest.raises(ValueError, match="expected a JSON list"):
        load_known_issues(str(path))


def test_missing_file_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        load_known_issues(str(tmp_path / "absent.json"))
