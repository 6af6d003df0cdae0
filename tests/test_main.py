"""``python -m exporter`` (exporter/__main__.py) is the ``nvgpu-exporter`` command: it exits with
what ``exporter.cli.main`` returns. (The real process runs in the integration tests.)"""

from __future__ import annotations

import runpy
from typing import Any

import pytest


def test_python_dash_m_exits_with_the_commands_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    def main(*args: Any) -> int:
        calls.append(args)
        return 7

    monkeypatch.setattr("exporter.cli.main", main)
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("exporter", run_name="__main__")
    assert exited.value.code == 7
    assert calls == [()]  # no arguments: argv is read by the command itself
