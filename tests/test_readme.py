"""README's configuration table and scenario list against the code, so a user reading README finds
every setting with its flag and every shipped demo (found by a new-user walk-through: four flags and
a shipped scenario were missing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.settings import SETTINGS
from exporter.settingvalues import Setting

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
ROWS = [line.split("|") for line in README.splitlines() if line.startswith("| `NVGPU_")]
SHIPPED = sorted(p.stem for p in (REPO / "exporter" / "common" / "scenarios").glob("*.json"))


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.env)
def test_every_setting_has_a_readme_row_with_its_flag(setting: Setting) -> None:
    env, flag = setting.env, setting.flag
    rows = [cells for cells in ROWS if f"`{env}`" in cells[1]]
    assert rows, f"README's configuration table has no row naming `{env}`"
    if flag:
        assert f"`{flag}`" in rows[0][2], f"README's row for `{env}` does not give its flag `{flag}`"


def test_every_shipped_scenario_is_listed_in_readme_and_in_the_flag_help() -> None:
    assert SHIPPED, "no shipped scenario found"
    listed = next(line for line in README.splitlines() if line.startswith("Shipped scenarios:"))
    backend = next(s for s in SETTINGS if s.env == "NVGPU_NVML_BACKEND")
    for name in SHIPPED:
        assert f"`{name}`" in listed, f"README's 'Shipped scenarios' line lacks `{name}`"
        assert name in backend.help, f"--nvml-backend's help lacks the shipped scenario {name}"
