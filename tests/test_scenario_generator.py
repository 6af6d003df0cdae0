"""The shipped scenarios are what examples/scenarios/generate.py builds, and valid."""

from __future__ import annotations

import subprocess
import sys

from exporter_proc import ROOT


def test_committed_scenarios_are_fresh_generations() -> None:
    proc = subprocess.run(
        [sys.executable, "examples/scenarios/generate.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
