"""The status page in every fault state, in a real browser, at 1280 px and 1920 px: no horizontal overflow.

Each fault state is the real page (``statuspage.render``) of a real served state put into that
state: a quarantined feature, a stuck GPU with its last Xid, hung / crashed / lost GPUs, NVML
unavailable, a driver reload required, self-check problems, and all of them at once. Debian's
``chromium`` (``--headless --dump-dom``) loads each page with a small script appended that writes,
after layout, the document's ``scrollWidth`` and ``clientWidth`` and every element wider than its
box into the DOM, which the dump then carries (no DevTools client, no downloads). A screenshot per
width of the all-at-once state is the picture in docs (``NVGPU_UPDATE_SCREENSHOT=1`` writes
``docs/statuspage-1280.png`` and ``docs/statuspage-1920.png``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pngs import png_info

from exporter.common.collectors import identity, memory, power, temperature, utilization
from exporter.common.snapshot import GpuSample, Snapshot, SystemInfo
from exporter.config import Config
from exporter.supervisor import statuspage
from exporter.supervisor.gpuhealth import GpuRecord
from exporter.supervisor.quarantine import QuarantineStore
from exporter.supervisor.served import ServedState
from exporter.supervisor.stuck import StuckDetector, _GpuState
from exporter.supervisor.xids import XidCount
from guards.features import FeatureState, Reason
from guards.versions import SelfCheckResult

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's `chromium` is not installed (apt-get install chromium; .ci/run installs it)"
)
WIDTHS = (1280, 1920)
STATE_FILE = "/var/lib/nvgpu-exporter/state.json"
UUIDS = [f"GPU-{i:08x}-0ae6-479b-9ebc-46c6463961e{i}" for i in range(4)]

# Appended to the page: after layout, say how wide the document is and which elements overflow.
MEASURE = """<script>
addEventListener("load", () => {
  const d = document.documentElement, wide = [];
  for (const el of document.querySelectorAll("body *")) {
    const r = el.getBoundingClientRect();
    if (r.right > d.clientWidth + 0.5)
      wide.push(el.tagName + (el.id ? "#" + el.id : "") + " right=" + Math.round(r.right));
  }
  const out = document.createElement("pre");
  out.id = "layout";
  out.textContent = JSON.stringify({scrollWidth: d.scrollWidth, clientWidth: d.clientWidth, wide: wide.slice(0, 20)});
  document.body.appendChild(out);
});
</script>"""


def _gpu(index: int, util: int = 35) -> GpuSample:
    readings = {
        "identity": identity.Reading("NVIDIA H200", f"00000000:{0x18 + index:02X}:00.0", "1655123456789", 10),
        "utilization": utilization.Reading(util, 12, 0, 0),
        "memory": memory.Reading(150 << 30, 140 << 30, 10 << 30, 0, 256 << 30, 1 << 20),
        "temperature": temperature.Reading(41, 38),
        "power": power.Reading(412_000, 700_000, 9_000_000_000),
    }
    return GpuSample(index, UUIDS[index], "up", readings, time.time())


def healthy() -> ServedState:
    stuck = StuckDetector(0.99, 64 << 20, 60.0)
    state = ServedState(Config(state_file=STATE_FILE), QuarantineStore("", 3, 600.0, 86400.0), [stuck])
    state.system = SystemInfo("580.159.04", "13.580.159.04", "", "13.580.82")
    state.python_version = "3.12.7"
    sup = SelfCheckResult("supervisor", (), ())
    state.selfchecks = {"supervisor": sup, "worker": SelfCheckResult("worker", (), ())}
    state.worker.pid, state.worker.started_at = 4242, time.time() - 3600
    gpus = tuple(_gpu(i) for i in range(len(UUIDS)))
    state.health.on_snapshot(Snapshot(time.time(), 0.01, state.system, gpus, {}, {}, {}, 0, {}))
    state.last = Snapshot(time.time(), 0.01, state.system, gpus, {}, {}, {}, 0, {})
    state.last_mono = time.monotonic()
    return state


def quarantine(state: ServedState) -> None:
    detail = (
        "3 worker crashes/hangs in nvmlDeviceGetFieldValues since 2026-12-01T05:22:01Z; expires 2026-12-02T05:22:01Z"
    )
    state.set_feature_state(FeatureState("nvlink_throughput", False, Reason.QUARANTINED, detail))
    state.worker.crashes[("nvlink_throughput", "nvmlDeviceGetFieldValues")] = 3
    state.worker.restarts["crash"] = 3


def stuck_with_xid(state: ServedState) -> None:
    ext = state.extension(StuckDetector)
    assert ext is not None
    ext.gpus[UUIDS[1]] = _GpuState(
        since=time.time() - 600,
        holding=True,
        evaluable=True,
        since_mono=time.monotonic() - 600,
        index="1",
        uuid=UUIDS[1],
    )
    state.xids.xids = {  # by GPU UUID and Xid: the gpu label is the GPU's current index
        (UUIDS[1], 43): XidCount(1, time.time() - 60, "1", time.monotonic() - 60),
        (UUIDS[1], 13): XidCount(2, time.time() - 120, "1", time.monotonic() - 120),
        (UUIDS[2], 79): XidCount(1, time.time() - 30, "2", time.monotonic() - 30),
    }


def sick_gpus(state: ServedState) -> None:
    for index, kind, detail in (
        (1, "hung", "nvmlDeviceGetPowerUsage (power) did not return within 10 s"),
        (2, "lost", "GPU_IS_LOST: fell off the bus (Xid 79) at 00000000:1A:00.0"),
        (3, "crashed", "worker SIGSEGV in nvmlDeviceGetFieldValues (nvlink_throughput) on this GPU, twice"),
    ):
        rec = state.health.gpus.setdefault(UUIDS[index], GpuRecord(index, UUIDS[index]))  # by UUID
        rec.state, rec.detail = kind, detail
        if kind != "lost":
            rec.excluded, rec.next_probe = kind, time.monotonic() + 240


def nvml_unavailable(state: ServedState) -> None:
    state.nvml_up = False
    state.last_init_error = "NVML unavailable: nvmlInit_v2 failed: Unknown Error (NVML_ERROR_UNKNOWN)"
    state.nvml.last_error = "UNKNOWN"
    state.last_mono = time.monotonic() - 3600  # no fresh sample


def driver_reload(state: ServedState) -> None:
    nvml_unavailable(state)
    state.last_init_error = (
        "NVML unavailable: nvmlInit_v2 failed: RM has detected an NVML/RM version mismatch "
        "(NVML_ERROR_LIB_RM_VERSION_MISMATCH)"
    )
    state.nvml.last_error = "LIB_RM_VERSION_MISMATCH"
    state.nvml.kernel_module_version = "580.126.09"


def selfcheck_problems(state: ServedState) -> None:
    state.selfchecks["worker"] = SelfCheckResult(
        "worker",
        (),
        (
            "pynvml: /usr/local/lib/python3.12/site-packages/pynvml.py belongs to nvidia-ml-py 12.535.161, "
            "but 13.580.82 is installed",
            "exporter: shadowed by /app/exporter/__init__.py (the working directory) before "
            "/usr/local/lib/python3.12/site-packages/exporter/__init__.py",
        ),
    )


FAULTS: dict[str, list[Callable[[ServedState], None]]] = {
    "healthy": [],
    "quarantine": [quarantine],
    "stuck GPU with its last Xid": [stuck_with_xid],
    "hung, crashed and lost GPUs": [sick_gpus],
    "NVML unavailable": [nvml_unavailable],
    "driver reload required": [driver_reload],
    "self-check problems": [selfcheck_problems],
    "all at once": [quarantine, stuck_with_xid, sick_gpus, driver_reload, selfcheck_problems],
}


def page(fault: str) -> str:
    state = healthy()
    for apply in FAULTS[fault]:
        apply(state)
    return statuspage.render(state)


def chromium(url: str, tmp_path: Path, width: int, *extra: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    profile = tmp_path / f"profile-{width}-{len(list(tmp_path.glob('profile-*')))}"
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
        f"--user-data-dir={profile}", f"--window-size={width},1000", *extra, url,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_each_fault_state_shows_what_it_is() -> None:
    """The states are what their names say (the layout test below measures them)."""
    assert "QUARANTINED" in page("quarantine")
    assert f"nvgpu-exporter quarantine --state-file {STATE_FILE} --clear nvlink_throughput" in page("quarantine")
    assert "STUCK" in page("stuck GPU with its last Xid") and "Xid 43" in page("stuck GPU with its last Xid")
    sick = page("hung, crashed and lost GPUs")
    assert all(f'data-state="{s}"' in sick for s in ("hung", "lost", "crashed"))
    assert "NVML unavailable" in page("NVML unavailable")
    assert 'id="driver-reload-alert"' in page("driver reload required")
    assert 'id="driver-reload-alert"' not in page("NVML unavailable")
    assert "FAILED" in page("self-check problems")


@needs_chromium
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("fault", FAULTS)
def test_no_fault_state_overflows_horizontally(fault: str, width: int, tmp_path: Path) -> None:
    html_file = tmp_path / "status.html"
    html_file.write_text(page(fault).replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    res = chromium(html_file.as_uri(), tmp_path, width, "--dump-dom")
    assert res.returncode == 0, res.stderr[-3000:]
    m = re.search(r'<pre id="layout">(.*?)</pre>', res.stdout, re.S)
    assert m, f"the measuring script did not run:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
    layout = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert layout["clientWidth"] >= width - 20, layout  # the window is the width asked for
    assert layout["scrollWidth"] <= layout["clientWidth"], f"{fault} at {width} px overflows: {layout}"
    assert not layout["wide"], f"{fault} at {width} px: elements past the right edge: {layout['wide']}"


@needs_chromium
@pytest.mark.parametrize("width", WIDTHS)
def test_screenshot_of_every_fault_at_once(width: int, tmp_path: Path) -> None:
    html_file = tmp_path / "status.html"
    html_file.write_text(page("all at once"), encoding="utf-8")
    shot = tmp_path / f"statuspage-{width}.png"
    res = chromium(html_file.as_uri(), tmp_path, width, f"--screenshot={shot}")
    assert res.returncode == 0 and shot.exists(), res.stderr[-3000:]
    got_width, height, distinct = png_info(shot.read_bytes())
    assert (got_width, height) == (width, 1000) and distinct > 100
    if os.environ.get("NVGPU_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, ROOT / "docs" / f"statuspage-{width}.png")


@pytest.mark.parametrize("width", WIDTHS)
def test_committed_reference_screenshots_are_valid_pngs(width: int) -> None:
    got_width, height, distinct = png_info((ROOT / "docs" / f"statuspage-{width}.png").read_bytes())
    assert (got_width, height) == (width, 1000) and distinct > 100
