"""exporter.config: strict parsing of NVGPU_* variables and flags, every problem reported at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.checks import environment_problems, state_file_problem
from exporter.config import Config
from exporter.settings import SETTINGS
from exporter.settingvalues import DEFAULT_PORT, ConfigError, parse_listen_address
from guards import features as gf
from guards import featuretable

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "exporter" / "common" / "scenarios" / "h200x2.json"


def problems(environ: dict[str, str], flags: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        Config.from_env(environ, flags)
    assert str(info.value) == "\n".join(info.value.problems)
    return info.value.problems


def test_defaults() -> None:
    config = Config.from_env({})
    assert config.listen_address == ("", DEFAULT_PORT)
    assert config.interval_s == 5.0
    assert config.stale_s == 15.0  # three intervals
    assert config.sample_deadline_s == 10.0  # two intervals, at least 10 s
    assert config.nvml_backend == "nvml"
    assert config.log_level == "INFO" and config.log_format == "text"
    assert config.pod_labels is False
    assert set(config.feature_modes) == set(featuretable.FEATURES)
    assert set(config.feature_modes.values()) == {gf.Mode.AUTO}


def test_derived_bounds_follow_the_interval() -> None:
    config = Config.from_env({"NVGPU_SAMPLE_INTERVAL_SECONDS": "8"})
    assert config.stale_s == 24.0 and config.sample_deadline_s == 16.0
    config = Config.from_env({"NVGPU_SAMPLE_INTERVAL_SECONDS": "0.5", "NVGPU_STALE_AFTER_SECONDS": "2"})
    assert config.stale_s == 2.0 and config.sample_deadline_s == 10.0


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("NVGPU_POD_LABELS", "ture"),
        ("NVGPU_POD_LABELS", ""),
        ("NVGPU_POD_LABELS", "2"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "5x"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "5 s"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "s"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "-5s"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "0s"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "50ms"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "2h"),
        ("NVGPU_RESTART_BACKOFF_SECONDS", "1d"),
        ("NVGPU_UNHEALTHY_AFTER_SECONDS", "-1m"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "0"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "-1"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "nan"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", "inf"),
        ("NVGPU_SAMPLE_INTERVAL_SECONDS", ""),
        ("NVGPU_QUARANTINE_AFTER", "0"),
        ("NVGPU_QUARANTINE_AFTER", "3.0"),
        ("NVGPU_QUARANTINE_AFTER", "three"),
        ("NVGPU_STUCK_MEMORY_BYTES", "-1"),
        ("NVGPU_STUCK_MEMORY_BYTES", "64MiB"),
        ("NVGPU_STUCK_UTILIZATION_RATIO", "0"),
        ("NVGPU_STUCK_UTILIZATION_RATIO", "99"),
        ("NVGPU_LOG_FORMAT", "jsn"),
        ("NVGPU_REENUMERATE_SECONDS", "0.5"),
        ("NVGPU_REENUMERATE_SECONDS", "a minute"),
        ("NVGPU_EXPECTED_GPUS", "-1"),
        ("NVGPU_EXPECTED_GPUS", "four"),
        ("NVGPU_LOG_LEVEL", "verbose"),
        ("NVGPU_LOG_LEVEL", "warnings"),
        ("NVGPU_LOG_LEVEL", "critical"),
        ("NVGPU_LOG_FORMAT", "logfmtt"),
        ("NVGPU_DRA_RESOURCESLICES", "maybe"),
        ("NVGPU_LISTEN_ADDRESS", ":9400,:9400"),
        ("NVGPU_LISTEN_ADDRESS", ":9400,"),
        ("NVGPU_SELFCHECK", "on"),
        ("NVGPU_NVML_BACKEND", "cuda"),
        ("NVGPU_NVML_BACKEND", "fake:"),
        ("NVGPU_NVML_BACKEND", "fake:/no/such/file.json"),
        ("NVGPU_LISTEN_ADDRESS", "9400"),
        ("NVGPU_FEATURE_FAN", "ture"),
        ("NVGPU_FEATURE_FAN", ""),
        ("NVGPU_PROCESS_SERIES_PER_GPU", "0"),
        ("NVGPU_PROCESS_SERIES_PER_GPU", "1001"),
        ("NVGPU_PROCESS_SERIES_PER_GPU", "sixteen"),
        ("NVGPU_FEATURE_PROCESS_USAGE", "yes"),
        ("NVGPU_NVML_BACKEND", "fake:h200x3"),
        ("NVGPU_WEB_TELEMETRY_PATH", "metrics"),
        ("NVGPU_WEB_TELEMETRY_PATH", "/"),
        ("NVGPU_WEB_TELEMETRY_PATH", "/healthz"),
        ("NVGPU_WEB_TELEMETRY_PATH", "/a b"),
        ("NVGPU_WEB_TELEMETRY_PATH", "/metrics?x=1"),
        ("NVGPU_WEB_TELEMETRY_PATH", "//metrics"),
        ("NVGPU_WEB_MAX_CONNECTIONS", "0"),
        ("NVGPU_WEB_KEEPALIVE_TIMEOUT_SECONDS", "0"),
        ("NVGPU_WEB_KEEPALIVE_TIMEOUT_SECONDS", "1e9"),
        ("NVGPU_WEB_HEADER_TIMEOUT_SECONDS", "nan"),
        ("NVGPU_WEB_PROBES_WITHOUT_AUTH", "maybe"),
        ("NVGPU_WEB_CONFIG_FILE", "/no/such/web.yml"),
        ("NVGPU_RECURRENCE_WINDOW_SECONDS", "0"),
        ("NVGPU_RECURRENCE_WINDOW_SECONDS", "an hour"),
    ],
)
def test_strict_values_are_errors_naming_variable_and_value(var: str, value: str) -> None:
    found = problems({var: value})
    assert len(found) == 1, found
    assert found[0].startswith(f"{var}={value!r}"), found[0]


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("true", True),
        ("TRUE", True),
        (" yes ", True),
        ("1", True),
        ("on", True),
        ("false", False),
        ("0", False),
        ("No", False),
        ("off", False),
    ],
)
def test_bool_spellings(value: str, want: bool) -> None:
    assert Config.from_env({"NVGPU_POD_LABELS": value}).pod_labels is want


def test_case_insensitive_choices() -> None:
    config = Config.from_env({"NVGPU_LOG_LEVEL": "debug", "NVGPU_LOG_FORMAT": "JSON", "NVGPU_FEATURE_FAN": " OFF "})
    assert config.log_level == "DEBUG" and config.log_format == "json"
    assert config.feature_modes["fan"] is gf.Mode.OFF


def test_every_problem_reported_at_once() -> None:
    environ = {
        "NVGPU_SAMPLE_INTERVAL_SECONDS": "fast",
        "NVGPU_LOG_FORMAT": "jsn",
        "NVGPU_POD_LABELS": "ture",
        "NVGPU_LISTEN_ADDRESS": "::1:9400",
        "NVGPU_FEATURE_NVLINK_THROUGHPUT": "disabled",
        "NVGPU_SAMPLE_INTERVAL_SECOND": "5",
        "NVGPU_RESTART_BACKOFF_SECONDS": "10",
        "NVGPU_RESTART_BACKOFF_MAX_SECONDS": "5",
    }
    found = problems(environ)
    assert len(found) == 7, found
    for needle in (
        "NVGPU_SAMPLE_INTERVAL_SECONDS='fast'",
        "NVGPU_LOG_FORMAT='jsn'",
        "NVGPU_POD_LABELS='ture'",
        "NVGPU_LISTEN_ADDRESS='::1:9400'",
        "NVGPU_FEATURE_NVLINK_THROUGHPUT='disabled'",
        "NVGPU_SAMPLE_INTERVAL_SECOND: unknown variable",
        "NVGPU_RESTART_BACKOFF_MAX_SECONDS must be at least",
    ):
        assert sum(needle in p for p in found) == 1, (needle, found)


def test_stale_bound_below_interval() -> None:
    found = problems({"NVGPU_SAMPLE_INTERVAL_SECONDS": "10", "NVGPU_STALE_AFTER_SECONDS": "5"})
    assert found == ["NVGPU_STALE_AFTER_SECONDS=5.0: must be at least the sample interval (10.0)"]


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("NVGPU_SAMPLE_INTERVAL_SECOND", "NVGPU_SAMPLE_INTERVAL_SECONDS"),
        ("NVGPU_LISTEN_ADRESS", "NVGPU_LISTEN_ADDRESS"),
        ("NVGPU_STALE_AFTER", "NVGPU_STALE_AFTER_SECONDS"),
        ("NVGPU_LOGLEVEL", "NVGPU_LOG_LEVEL"),
    ],
)
def test_unknown_variable_with_suggestion(typo: str, meant: str) -> None:
    assert problems({typo: "1"}) == [f"{typo}: unknown variable; did you mean {meant}?"]


def test_unknown_feature_switch_with_suggestion() -> None:
    found = problems({"NVGPU_FEATURE_NVLNK_THROUGHPUT": "off"})
    assert len(found) == 1 and "did you mean NVGPU_FEATURE_NVLINK_THROUGHPUT" in found[0], found


@pytest.mark.parametrize("typo", ["NVGPU_FEATURES_NVLINK", "NVGPU_FEATURE"])
def test_feature_prefix_typo_reported_once(typo: str) -> None:
    found = problems({typo: "on"})
    assert len(found) == 1, found
    assert "did you mean NVGPU_FEATURE_" in found[0]


def test_internal_variables_are_not_unknown() -> None:
    internal = {
        "NVGPU_FAKE_EPOCH": "1",
        "NVGPU_WORKER_CONFIG": "{}",
        "NVGPU_WORKER_FD": "3",
        "NVGPU_BREADCRUMB_FD": "4",
    }
    assert Config.from_env(internal) == Config.from_env({})


def test_other_variables_ignored() -> None:
    others = {"PATH": "/bin", "NVIDIA_VISIBLE_DEVICES": "all", "nvgpu_lowercase": "x"}
    assert Config.from_env(others) == Config.from_env({})


def test_flags_override_env() -> None:
    environ = {
        "NVGPU_SAMPLE_INTERVAL_SECONDS": "not a number",
        "NVGPU_LOG_LEVEL": "ERROR",
        "NVGPU_LISTEN_ADDRESS": "127.0.0.1:1",
    }
    config = Config.from_env(environ, {"interval_s": "2", "log_level": "debug", "listen_addresses": "[::1]:9400"})
    assert config.interval_s == 2.0 and config.stale_s == 6.0
    assert config.log_level == "DEBUG"
    assert config.listen_address == ("::1", 9400)


def test_bad_flag_is_named_by_its_flag() -> None:
    found = problems({"NVGPU_SAMPLE_INTERVAL_SECONDS": "5"}, {"interval_s": "soon"})
    assert found == [
        "--sample-interval='soon': expected a duration: seconds as a number (5, 0.5) or with a unit "
        "(500ms, 5s, 2m, 1h30m)"
    ]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2", 2.0), ("1.5", 1.5), ("1s", 1.0), ("1500ms", 1.5), ("2m", 120.0), ("1h", 3600.0), ("1m30s", 90.0)],
)
def test_every_duration_setting_takes_seconds_or_a_go_duration(text: str, seconds: float) -> None:
    """Every *_SECONDS setting takes Go's spelling, as the Prometheus tools do, and plain numbers."""
    durations = [s for s in SETTINGS if s.env.endswith("_SECONDS")]
    assert len(durations) == 19 and all(s.attr.endswith("_s") for s in durations)
    for s in durations:
        assert s.parse(s.env, text) == seconds, s.env


def test_go_durations_through_the_environment_and_the_flags() -> None:
    config = Config.from_env({"NVGPU_QUARANTINE_WINDOW_SECONDS": "1h30m"}, {"interval_s": "500ms"})
    assert config.interval_s == 0.5 and config.quarantine_window_s == 5400.0 and config.stale_s == 1.5


def test_zero_switches_off_in_either_spelling() -> None:
    for text in ("0", "0.0", "0s", "0ms"):
        assert Config.from_env({"NVGPU_UNHEALTHY_AFTER_SECONDS": text}).unhealthy_after_s == 0.0


@pytest.mark.parametrize(
    ("text", "level"),
    [("debug", "DEBUG"), ("info", "INFO"), ("warn", "WARNING"), ("WARN", "WARNING"), ("warning", "WARNING"),
     ("Warning", "WARNING"), ("error", "ERROR"), ("ERROR", "ERROR")],
)  # fmt: skip
def test_log_levels_take_promslogs_and_pythons_names(text: str, level: str) -> None:
    assert Config.from_env({"NVGPU_LOG_LEVEL": text}).log_level == level
    assert Config.from_env({}, {"log_level": text}).log_level == level


def test_log_formats() -> None:
    for fmt in ("text", "logfmt", "json", "LOGFMT"):
        assert Config.from_env({"NVGPU_LOG_FORMAT": fmt}).log_format == fmt.lower()


def test_several_listen_addresses() -> None:
    config = Config.from_env({"NVGPU_LISTEN_ADDRESS": "127.0.0.1:9400, [::1]:9400,:19400"})
    assert config.listen_addresses == (("127.0.0.1", 9400), ("::1", 9400), ("", 19400))
    assert config.listen_address == ("127.0.0.1", 9400)
    assert "NVGPU_LISTEN_ADDRESS=127.0.0.1:9400,[::1]:9400,:19400" in config.describe()


def test_every_setting_has_env_flag_and_help() -> None:
    for s in SETTINGS:
        assert s.env.startswith("NVGPU_") and s.flag.startswith("--") and s.help
        if s.attr.endswith("_s"):
            assert s.env.endswith("_SECONDS"), s.env  # durations carry the unit in the name


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (":9400", ("", 9400)),
        ("127.0.0.1:9400", ("127.0.0.1", 9400)),
        ("0.0.0.0:1", ("0.0.0.0", 1)),
        ("127.0.0.1:65535", ("127.0.0.1", 65535)),
        ("[::1]:9400", ("::1", 9400)),
        ("[::]:19400", ("::", 19400)),
        ("[fe80::1%eth0]:9400", ("fe80::1%eth0", 9400)),
        (" :9400 ", ("", 9400)),
    ],
)
def test_listen_address_forms(text: str, want: tuple[str, int]) -> None:
    assert parse_listen_address("NVGPU_LISTEN_ADDRESS", text) == want


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("9400", "expected host:port"),
        ("localhost", "expected host:port"),
        ("", "expected host:port"),
        ("::1:9400", "in brackets"),
        ("::1", "in brackets"),
        ("[zz]:9400", "not an IPv6 address"),
        ("[127.0.0.1]:9400", "not an IPv6 address"),
        ("127.0.0.1:0", "port must be 1-65535"),
        ("127.0.0.1:65536", "port must be 1-65535"),
        ("127.0.0.1:", "port must be 1-65535"),
        ("127.0.0.1:http", "port must be 1-65535"),
        ("[::1]:-1", "port must be 1-65535"),
        # These passed the parser and failed at bind (exit 1); host names are not resolved
        ("256.1.1.1:19400", "not an IP address"),
        ("localhost:19400", "host names are not resolved"),
        ("gpu-node-1.example:19400", "host names are not resolved"),
        ("1.2.3:19400", "not an IP address"),
        ("01.2.3.4:19400", "not an IP address"),
    ],
)
def test_listen_address_errors(text: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_listen_address("NVGPU_LISTEN_ADDRESS", text)
    assert str(info.value).startswith(f"NVGPU_LISTEN_ADDRESS={text.strip()!r}") and says in str(info.value)


def test_fake_backend_path_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "s.json").write_text('{"gpus": []}')
    monkeypatch.chdir(tmp_path)
    assert Config.from_env({"NVGPU_NVML_BACKEND": "fake:s.json"}).nvml_backend == f"fake:{tmp_path / 's.json'}"


def test_describe_round_trips() -> None:
    config = Config.from_env({"NVGPU_LISTEN_ADDRESS": "[::1]:9400", "NVGPU_FEATURE_FAN": "off"})
    lines = config.describe()
    assert "NVGPU_LISTEN_ADDRESS=[::1]:9400" in lines and "NVGPU_FEATURE_FAN=off" in lines
    environ = dict(line.split("=", 1) for line in lines)
    assert Config.from_env(environ) == config


# -- the command line ----------------------------------------------------------------------------


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NVGPU_")}
    clean.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "exporter", *args], env=clean, capture_output=True, text=True, timeout=60, cwd=str(ROOT)
    )


def test_check_config_lists_every_problem_and_exits_2() -> None:
    bad = {
        "NVGPU_SAMPLE_INTERVAL_SECONDS": "fast",
        "NVGPU_LOG_FORMAT": "jsn",
        "NVGPU_POD_LABELS": "ture",
        "NVGPU_LISTEN_ADDRESS": "::1:9400",
        "NVGPU_NVML_BACKEND": "fake:/no/such.json",
        "NVGPU_SAMPLE_INTERVAL_SECOND": "5",
    }
    proc = run_cli("--check-config", env=bad)
    assert proc.returncode == 2, proc
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert lines[0] == "nvgpu-exporter: 6 configuration problem(s):"
    listed = [line for line in lines[1:] if line.startswith("  - ")]
    assert len(listed) == 6, proc.stderr
    for var in bad:
        assert sum(line.startswith(f"  - {var}=") or line.startswith(f"  - {var}:") for line in listed) == 1, var
    assert "did you mean NVGPU_SAMPLE_INTERVAL_SECONDS?" in proc.stderr


def test_bad_config_without_check_flag_also_exits_2_before_starting() -> None:
    proc = run_cli(env={"NVGPU_POD_LABELS": "ture", "NVGPU_LISTEN_ADDRESS": "127.0.0.1:1"})
    assert proc.returncode == 2
    assert "NVGPU_POD_LABELS='ture'" in proc.stderr and "listening" not in proc.stderr


def test_check_config_ok_prints_effective_settings() -> None:
    proc = run_cli(
        "--check-config",
        env={
            "NVGPU_NVML_BACKEND": f"fake:{SCENARIO}",
            "NVGPU_FEATURE_FAN": "off",
            "NVGPU_LISTEN_ADDRESS": "[::1]:9400",
        },
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "configuration ok:"
    assert "  NVGPU_LISTEN_ADDRESS=[::1]:9400" in proc.stdout.splitlines()
    assert f"  NVGPU_NVML_BACKEND=fake:{SCENARIO}" in proc.stdout.splitlines()
    assert "  NVGPU_FEATURE_FAN=off" in proc.stdout.splitlines()


def test_check_config_flags_override_env() -> None:
    proc = run_cli(
        "--check-config",
        "--sample-interval",
        "2",
        "--log-format",
        "json",
        env={"NVGPU_SAMPLE_INTERVAL_SECONDS": "fast", "NVGPU_LOG_FORMAT": "jsn"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "  NVGPU_SAMPLE_INTERVAL_SECONDS=2.0" in proc.stdout.splitlines()
    assert "  NVGPU_LOG_FORMAT=json" in proc.stdout.splitlines()
    proc = run_cli("--check-config", "--sample-interval", "soon")
    assert proc.returncode == 2 and "--sample-interval='soon'" in proc.stderr


def test_a_fake_backend_does_not_resolve_its_pids_in_this_machines_proc(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text('{"gpus": []}')
    fake = Config.from_env({"NVGPU_NVML_BACKEND": f"fake:{tmp_path / 's.json'}"})
    assert fake.proc_path == "" and fake.container_log_dir == ""
    chosen = Config.from_env({"NVGPU_NVML_BACKEND": f"fake:{tmp_path / 's.json'}", "NVGPU_PROC_PATH": "/tmp/p"})
    assert chosen.proc_path == "/tmp/p" and chosen.container_log_dir == ""
    assert Config.from_env({}).proc_path == "/proc"


# -- the HTTP edge: TLS, auth, connections ------------------------------------------------------


@pytest.mark.parametrize("name", ["h200x1", "h200x2", "h200x8", "h200x2-nvlink-crash", "h200x2-xid79"])
def test_shipped_scenario_by_name(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fake:<name>`` resolves to package data from any working directory (the no-GPU hint)."""
    monkeypatch.chdir(tmp_path)
    backend = Config.from_env({"NVGPU_NVML_BACKEND": f"fake:{name}"}).nvml_backend
    assert backend == f"fake:{ROOT / 'exporter' / 'common' / 'scenarios' / name}.json"


def test_unknown_scenario_name_lists_the_shipped_ones() -> None:
    (found,) = problems({"NVGPU_NVML_BACKEND": "fake:h200"})
    assert "no shipped scenario named 'h200'" in found and "h200x2-nvlink-crash" in found


def test_a_file_named_like_a_scenario_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "h200x2").write_text('{"gpus": []}')
    monkeypatch.chdir(tmp_path)
    assert Config.from_env({"NVGPU_NVML_BACKEND": "fake:h200x2"}).nvml_backend == f"fake:{tmp_path / 'h200x2'}"


def test_exporter_toolkit_flag_names_and_the_old_ones_agree() -> None:
    spelled = {s.attr: (s.flag, *s.aliases) for s in SETTINGS}
    assert spelled["listen_addresses"] == ("--web.listen-address", "--listen-address")
    assert spelled["log_level"] == ("--log.level", "--log-level")
    assert spelled["log_format"] == ("--log.format", "--log-format")
    assert spelled["web_config_file"][0] == "--web.config.file"
    assert spelled["telemetry_path"][0] == "--web.telemetry-path"


def test_new_web_defaults() -> None:
    config = Config.from_env({})
    assert config.web_config_file == "" and config.telemetry_path == "/metrics"
    assert config.web_probes_without_auth is True
    assert config.web_max_connections == 1024
    assert config.web_keepalive_s == 120.0 and config.web_header_timeout_s == 10.0


def test_environment_problems_name_the_variable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        config = Config.from_env(
            {"NVGPU_LISTEN_ADDRESS": "192.0.2.77:19400", "NVGPU_STATE_FILE": str(locked / "sub" / "state.json")}
        )
        found = environment_problems(config)
    finally:
        locked.chmod(0o700)
    if os.geteuid() == 0:  # root writes anywhere: only the address problem remains
        found.append("NVGPU_STATE_FILE=(root)")
    assert len(found) == 2, found
    assert found[0].startswith("NVGPU_LISTEN_ADDRESS=192.0.2.77:19400: 192.0.2.77 is not an address of this machine")
    assert found[1].startswith("NVGPU_STATE_FILE=")


def test_environment_is_fine_for_a_normal_setup(tmp_path: Path) -> None:
    config = Config.from_env({"NVGPU_LISTEN_ADDRESS": "127.0.0.1:19400", "NVGPU_STATE_FILE": str(tmp_path / "d" / "s")})
    assert environment_problems(config) == []
    assert not (tmp_path / "d").exists(), "the check must not create the directory"
    assert list(tmp_path.iterdir()) == [], "the probe file must be removed"


@pytest.mark.parametrize(
    ("case", "says"),
    [("directory", "is a directory"), ("parent-is-a-file", "is not a directory"), ("proc", "does not take new files")],
)
def test_state_file_problem(tmp_path: Path, case: str, says: str) -> None:
    path = tmp_path / "x"
    if case == "directory":
        path.mkdir()
    elif case == "parent-is-a-file":
        path.write_text("x")
        path = path / "state.json"
    else:
        path = Path("/proc/1/nonexistent/state.json")
    why = state_file_problem(str(path))
    assert why is not None and says in why, why


def test_help_shows_every_default_and_variable() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for s in SETTINGS:
        assert f"env {s.env}]" in text, s.env
        if s.default and "(default:" not in s.help:
            assert f"default: {s.default};" in text, s.attr
    assert "--web.listen-address HOST:PORT, --listen-address HOST:PORT" in text
    assert "fake:h200x2" in text


def test_old_flag_spelling_is_named_in_its_error() -> None:
    proc = run_cli("--check-config", "--listen-address", "localhost:1")
    assert proc.returncode == 2 and "--listen-address='localhost:1'" in proc.stderr
    proc = run_cli("--check-config", "--web.listen-address", "localhost:1")
    assert proc.returncode == 2 and "--web.listen-address='localhost:1'" in proc.stderr


def test_check_config_rejects_an_address_of_another_machine_and_an_unwritable_state_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = run_cli(
        "--check-config",
        env={"NVGPU_LISTEN_ADDRESS": "192.0.2.77:19400", "NVGPU_STATE_FILE": str(blocker / "state.json")},
    )
    assert proc.returncode == 2, proc
    assert "NVGPU_LISTEN_ADDRESS=192.0.2.77:19400" in proc.stderr and "not an address of this machine" in proc.stderr
    assert f"NVGPU_STATE_FILE={blocker / 'state.json'}" in proc.stderr and "is not a directory" in proc.stderr
