"""``promtool check metrics`` on a live scrape of the real exporter (h200x2 scenario).

The goldens are checked by tests/test_golden.py; this checks what the running process serves,
after a few samples and with the NVML event thread registered. Skips when promtool is absent
(``apt-get install prometheus`` provides it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from exporter_proc import SCENARIOS, Exporter

PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")


def promtool_check(body: bytes) -> subprocess.CompletedProcess[bytes]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=60)


@pytest.mark.parametrize(
    ("env", "links"),
    [({}, 0), ({"NVGPU_FEATURE_DETAILS": "on", "NVGPU_FEATURE_NVLINK_LINKS": "on"}, 36)],
    ids=["default", "details_and_nvlink_links"],
)
def test_promtool_accepts_live_scrape(tmp_path: Path, env: dict[str, str], links: int) -> None:
    with Exporter(SCENARIOS / "h200x2.json", tmp_path, env=env) as exp:
        exp.wait_for(
            lambda s: (
                s.value("nvgpu_up") == 1.0
                and s.find("nvgpu_events_enabled", gpu="1")
                and len(s.find("nvgpu_nvlink_transmit_bytes_total")) == 2
                and len(s.find("nvgpu_nvlink_link_transmit_bytes_total")) == links
            ),
            what="a complete sample",
        )
        status, headers, body = exp.get("/metrics", headers={"Accept": "text/plain"})
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        proc = promtool_check(body)
        assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
            proc.returncode,
            proc.stdout.decode(),
            proc.stderr.decode(),
        )
        assert exp.terminate() == 0


def test_promtool_itself_rejects_a_bad_exposition() -> None:
    """The check can fail: promtool flags a counter without _total and a non-base unit."""
    bad = (
        b"# HELP nvgpu_memory_used_mib used\n# TYPE nvgpu_memory_used_mib gauge\nnvgpu_memory_used_mib 1\n"
        b"# HELP nvgpu_replays replays\n# TYPE nvgpu_replays counter\nnvgpu_replays 1\n"
    )
    proc = promtool_check(bad)
    out = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode != 0 and "_total" in out, out
