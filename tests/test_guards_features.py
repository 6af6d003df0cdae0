"""Tests for guards.features: registry, NVGPU_FEATURE_* parsing and the precedence of resolve()."""

from __future__ import annotations

import ast
import inspect
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from guards.features import (
    ENV_PREFIX,
    FeatureState,
    Mode,
    Reason,
    env_var,
    parse_feature_env,
    resolve,
)
from guards.featuretable import FEATURES, Feature

REPO = Path(__file__).resolve().parents[1]
GUARDS = REPO / "guards"

EXPECTED_NAMES = [
    "identity",
    "mig",
    "utilization",
    "memory",
    "power",
    "temperature",
    "fan",
    "clocks",
    "throttle_time",
    "pcie",
    "ecc",
    "remapped_rows",
    "nvlink",
    "nvlink_throughput",
    "c2c",
    "nvlink_links",
    "details",
    "fabric",
    "confidential_computing",
    "gpm",
    "gpm_pipes",
    "processes",
    "process_usage",
    "events",
    "kernel_xid",
    "pod_attribution",
]


# --- registry ---------------------------------------------------------------------------------


def test_registry_has_exactly_the_documented_features_in_order() -> None:
    assert list(FEATURES) == EXPECTED_NAMES
    assert all(isinstance(f, Feature) and f.name == key for key, f in FEATURES.items())


def test_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        FEATURES["new"] = FEATURES["fan"]  # type: ignore[index]


def test_only_the_documented_switches_are_off_by_default() -> None:
    off = [name for name, f in FEATURES.items() if not f.default]
    assert sorted(off) == ["details", "gpm_pipes", "kernel_xid", "nvlink_links", "process_usage"]
    assert "60 per GPU" in FEATURES["details"].description  # the default series budget
    assert "/dev/kmsg" in FEATURES["kernel_xid"].description
    assert "seven more series per GPU" in FEATURES["gpm_pipes"].description  # high cardinality: a switch
    assert "NVGPU_PROCESS_SERIES_PER_GPU" in FEATURES["process_usage"].description


def test_every_nvml_function_exists_in_the_installed_binding() -> None:
    pynvml = pytest.importorskip("pynvml")
    missing = [
        f"{f.name}: {fn}"
        for f in FEATURES.values()
        for fn in f.nvml_functions
        if not callable(getattr(pynvml, fn, None))
    ]
    assert missing == []


def test_incident_feature_names_its_query() -> None:
    nvlink_throughput = FEATURES["nvlink_throughput"]
    assert nvlink_throughput.nvml_functions == ("nvmlDeviceGetFieldValues",)
    for text in ("NVML_FI_DEV_NVLINK_LINK_COUNT (91)", "THROUGHPUT_DATA_TX/RX", "(138/139"):
        assert text in nvlink_throughput.description
    assert FEATURES["nvlink"].nvml_functions == (
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetNvLinkErrorCounter",
    )
    assert FEATURES["processes"].nvml_functions[:2] == (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
    )
    assert "nvmlDeviceGetProcessUtilization" in FEATURES["processes"].nvml_functions
    assert FEATURES["process_usage"].nvml_functions == ()
    assert FEATURES["nvlink_links"].nvml_functions == FEATURES["details"].nvml_functions == ()
    assert FEATURES["events"].nvml_functions == (
        "nvmlEventSetCreate",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlDeviceRegisterEvents",
        "nvmlEventSetWait_v2",
    )
    assert FEATURES["kernel_xid"].nvml_functions == ()
    assert FEATURES["pod_attribution"].nvml_functions == ()


def test_metrics_reference_names_exactly_the_registered_features() -> None:
    """The feature column of docs/metrics.md's per-GPU table names exactly the registry."""
    text = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    per_gpu = text.split("## Per GPU", 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    for line in per_gpu.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 5 and cells[1].startswith("`nvgpu_"):
            for part in cells[4].split(","):
                part = part.strip()
                if part and not part.startswith("("):
                    named.add(part)
    assert named, "metrics.md table not parsed"
    assert named == set(FEATURES)


def test_env_var_name() -> None:
    assert env_var("nvlink_throughput") == "NVGPU_FEATURE_NVLINK_THROUGHPUT"
    assert ENV_PREFIX == "NVGPU_FEATURE_"


# --- standard library only ----------------------------------------------------------------------


def test_guards_sources_import_only_the_standard_library() -> None:
    stdlib = set(sys.stdlib_module_names) | {"__future__", "guards"}
    offenders = []
    for source in sorted(GUARDS.glob("*.py")):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [f"{source.name}: {n}" for n in names if n.split(".")[0] not in stdlib]
    assert offenders == []


def test_importing_guards_loads_no_third_party_module() -> None:
    script = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import guards, guards.features, guards.known_issues, guards.versions\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names) - {'guards'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"


# --- parse_feature_env --------------------------------------------------------------------------


def test_empty_environment_gives_auto_for_every_feature() -> None:
    modes, errors = parse_feature_env({"PATH": "/bin", "NVGPU_DEBUG": "true"})
    assert errors == []
    assert list(modes) == EXPECTED_NAMES
    assert set(modes.values()) == {Mode.AUTO}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("on", Mode.ON),
        ("On", Mode.ON),
        (" off ", Mode.OFF),
        ("OFF\n", Mode.OFF),
        ("AUTO", Mode.AUTO),
        ("auto", Mode.AUTO),
    ],
)
def test_accepted_values(raw: str, expected: Mode) -> None:
    modes, errors = parse_feature_env({"NVGPU_FEATURE_NVLINK_THROUGHPUT": raw})
    assert errors == []
    assert modes["nvlink_throughput"] is expected
    assert modes["nvlink"] is Mode.AUTO


@pytest.mark.parametrize("raw", ["ture", "yes", "1", "true", "disabled", ""])
def test_bad_value_names_variable_value_and_accepted_values(raw: str) -> None:
    modes, errors = parse_feature_env({"NVGPU_FEATURE_PROCESSES": raw})
    assert len(errors) == 1
    assert "NVGPU_FEATURE_PROCESSES" in errors[0]
    assert repr(raw) in errors[0]
    assert "auto, on, off" in errors[0]
    assert modes["processes"] is Mode.AUTO


@pytest.mark.parametrize(
    ("variable", "suggestion"),
    [
        ("NVGPU_FEATURE_NVLINK_THRUGHPUT", "NVGPU_FEATURE_NVLINK_THROUGHPUT"),
        ("NVGPU_FEATURE_PROCESS", "NVGPU_FEATURE_PROCESSES"),
        ("NVGPU_FEATURE_REMAPPED_ROW", "NVGPU_FEATURE_REMAPPED_ROWS"),
        ("NVGPU_FEATURE_nvlink", "NVGPU_FEATURE_NVLINK"),
        ("NVGPU_FEATURES_ECC", "NVGPU_FEATURE_ECC"),
        ("NVGPU_FEATURE_KERNELXID", "NVGPU_FEATURE_KERNEL_XID"),
    ],
)
def test_unknown_feature_suggests_closest_variable(variable: str, suggestion: str) -> None:
    modes, errors = parse_feature_env({variable: "off"})
    assert len(errors) == 1
    assert errors[0].startswith(f"{variable}: unknown feature switch")
    assert f"did you mean {suggestion}?" in errors[0]
    assert set(modes.values()) == {Mode.AUTO}


def test_unknown_feature_without_close_match_lists_valid_variables() -> None:
    _, errors = parse_feature_env({"NVGPU_FEATURE_QQQQQQQQQQQQQQQQQQQQQ": "on"})
    assert len(errors) == 1
    assert "did you mean" not in errors[0]
    assert "NVGPU_FEATURE_NVLINK_THROUGHPUT" in errors[0]


def test_all_problems_are_returned_together_and_valid_switches_still_apply() -> None:
    environ = {
        "NVGPU_FEATURE_NVLINK_THROUGHPUT": "ture",
        "NVGPU_FEATURE_NVLNK": "off",
        "NVGPU_FEATURE_FAN": "1",
        "NVGPU_FEATURE_ECC": "off",
        "NVGPU_FEATURE_KERNEL_XID": "On",
    }
    modes, errors = parse_feature_env(environ)
    assert len(errors) == 3
    assert [e.split(":")[0].split("=")[0] for e in errors] == sorted(
        ["NVGPU_FEATURE_NVLINK_THROUGHPUT", "NVGPU_FEATURE_NVLNK", "NVGPU_FEATURE_FAN"]
    )
    assert modes["ecc"] is Mode.OFF
    assert modes["kernel_xid"] is Mode.ON


# --- resolve ------------------------------------------------------------------------------------

QUAR = "worker died by SIGSEGV 3 times in nvmlDeviceGetFieldValues"
UNSUP = "no GPU on this node supports it"
KNOWN = "heap corruption (docs/design.md; rule h20)"


@pytest.mark.parametrize(
    ("mode", "quarantined", "unsupported", "known", "enabled", "reason"),
    [
        # OFF always wins
        (Mode.OFF, False, False, False, False, Reason.ENV),
        (Mode.OFF, True, True, True, False, Reason.ENV),
        # quarantine beats everything else, explicit ON included
        (Mode.ON, True, False, False, False, Reason.QUARANTINED),
        (Mode.ON, True, True, True, False, Reason.QUARANTINED),
        (Mode.AUTO, True, False, False, False, Reason.QUARANTINED),
        (Mode.AUTO, True, True, True, False, Reason.QUARANTINED),
        # unsupported beats ON and known issues
        (Mode.ON, False, True, False, False, Reason.UNSUPPORTED),
        (Mode.AUTO, False, True, True, False, Reason.UNSUPPORTED),
        # ON overrides a known-issue rule (the documented override)
        (Mode.ON, False, False, True, True, Reason.ENV),
        (Mode.ON, False, False, False, True, Reason.ENV),
        # AUTO: known issue, else default
        (Mode.AUTO, False, False, True, False, Reason.KNOWN_ISSUE),
        (Mode.AUTO, False, False, False, True, Reason.DEFAULT),
    ],
)
def test_precedence_table(
    mode: Mode,
    quarantined: bool,
    unsupported: bool,
    known: bool,
    enabled: bool,
    reason: Reason,
) -> None:
    feature = "nvlink_throughput"
    states = resolve(
        {feature: mode},
        known_issues={feature: KNOWN} if known else {},
        quarantined={feature: QUAR} if quarantined else {},
        unsupported={feature: UNSUP} if unsupported else {},
    )
    state = states[feature]
    assert (state.enabled, state.reason) == (enabled, reason)
    assert state.feature == feature
    # other features are untouched
    assert states["nvlink"] == FeatureState("nvlink", True, Reason.DEFAULT, "on by default")


def test_precedence_invariants_over_every_combination() -> None:
    for mode, q, u, k in itertools.product(Mode, (False, True), (False, True), (False, True)):
        state = resolve(
            {"ecc": mode},
            known_issues={"ecc": KNOWN} if k else {},
            quarantined={"ecc": QUAR} if q else {},
            unsupported={"ecc": UNSUP} if u else {},
        )["ecc"]
        combo = (mode, q, u, k)
        if mode is Mode.OFF or q or u:
            assert not state.enabled, combo
        if q and mode is not Mode.OFF:
            assert state.reason is Reason.QUARANTINED, combo
        if mode is Mode.ON and not q and not u:
            assert state.enabled and state.reason is Reason.ENV, combo


def test_default_off_feature() -> None:
    states = resolve({})
    assert states["kernel_xid"].enabled is False
    assert states["kernel_xid"].reason is Reason.DEFAULT
    assert "NVGPU_FEATURE_KERNEL_XID=on" in states["kernel_xid"].detail
    on = resolve({"kernel_xid": Mode.ON})["kernel_xid"]
    assert (on.enabled, on.reason) == (True, Reason.ENV)


def test_details_explain_the_decision() -> None:
    states = resolve(
        {"nvlink_throughput": Mode.ON, "processes": Mode.ON, "fan": Mode.OFF},
        known_issues={"nvlink_throughput": KNOWN},
        quarantined={"processes": QUAR},
        unsupported={"ecc": UNSUP},
    )
    assert KNOWN in states["nvlink_throughput"].detail
    assert "NVGPU_FEATURE_NVLINK_THROUGHPUT=on overrides" in states["nvlink_throughput"].detail
    assert QUAR in states["processes"].detail
    assert "NVGPU_FEATURE_PROCESSES=on is ignored" in states["processes"].detail
    assert states["fan"].detail == "NVGPU_FEATURE_FAN=off"
    assert states["ecc"].detail == UNSUP


def test_resolve_covers_every_feature_in_order_and_missing_modes_are_auto() -> None:
    states = resolve({"fan": Mode.OFF})
    assert list(states) == EXPECTED_NAMES
    assert states["fan"].enabled is False
    off = ("fan", "kernel_xid", "gpm_pipes", "process_usage", "nvlink_links", "details")
    assert all(s.enabled for n, s in states.items() if n not in off)


def test_resolve_with_parsed_environment() -> None:
    modes, errors = parse_feature_env({"NVGPU_FEATURE_NVLINK_THROUGHPUT": "on"})
    assert errors == []
    state = resolve(modes, known_issues={"nvlink_throughput": KNOWN})["nvlink_throughput"]
    assert (state.enabled, state.reason) == (True, Reason.ENV)


def test_resolve_rejects_unknown_feature_names() -> None:
    with pytest.raises(ValueError, match="nvlink_thruput"):
        resolve({}, quarantined={"nvlink_thruput": QUAR})
    with pytest.raises(ValueError, match="bogus"):
        resolve({"bogus": Mode.ON})


def test_resolve_defaults_are_immutable() -> None:
    params = inspect.signature(resolve).parameters
    for name in ("known_issues", "quarantined", "unsupported"):
        default = params[name].default
        assert not isinstance(default, dict)
        with pytest.raises(TypeError):
            default["fan"] = "x"


def test_enum_values_are_the_metric_label_values() -> None:
    assert [r.value for r in Reason] == [
        "default",
        "env",
        "known_issue",
        "quarantined",
        "unsupported",
    ]
    assert [m.value for m in Mode] == ["auto", "on", "off"]
    assert Reason("known_issue") is Reason.KNOWN_ISSUE
    assert isinstance(Reason.KNOWN_ISSUE, str) and isinstance(Mode.ON, str)
