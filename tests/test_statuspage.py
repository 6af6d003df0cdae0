"""The status page at ``/``, rendered by the real exporter and read by headless Chromium.

The browser tests run the real exporter on h200x2-nvlink-crash.json (two H200s; the NVLink
throughput query segfaults the worker) with NVGPU_QUARANTINE_AFTER=1, so nvlink_throughput is
quarantined after the first crash. Chromium (Debian's `chromium`) dumps the DOM it built and takes
a screenshot (the reference pictures in docs/ are tests/test_statuspage_layout.py's).

The unit tests render the page from a stand-in supervisor for the states a live exporter rarely
shows (no fresh sample, a section that fails, hostile text).
"""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from exporter_proc import SCENARIOS, Exporter, load_scenario, write_scenario
from pngs import png_info

from exporter.common.snapshot import Snapshot, SystemInfo
from exporter.config import Config
from exporter.supervisor import statuspage
from exporter.supervisor.quarantine import QuarantineStore
from exporter.supervisor.served import ServedState
from exporter.supervisor.stuck import StuckDetector, _GpuState
from exporter.supervisor.xids import XidCount
from guards.features import FeatureState, Reason
from guards.versions import SelfCheckResult

UUID0 = "GPU-ef65bf38-0ae6-479b-9ebc-46c6463961e6"
UUID1 = "GPU-094221fd-19f9-1561-7ef8-949bb0d57826"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's `chromium` is not installed (apt-get install chromium; .ci/run installs it)"
)


# -- DOM reading ------------------------------------------------------------------------------


class Dom(HTMLParser):
    """Elements with their attributes and the text inside them (enough to query a small page)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[dict[str, Any]] = []
        self._open: list[dict[str, Any]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = {"tag": tag, "attrs": {k: v or "" for k, v in attrs}, "text": ""}
        self.elements.append(el)
        if tag not in ("meta", "link", "br", "img", "input"):
            self._open.append(el)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i]["tag"] == tag:
                del self._open[i:]
                break

    def handle_data(self, data: str) -> None:
        for el in self._open:
            el["text"] += data

    def find(self, tag: str, **attrs: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.elements
            if e["tag"] == tag and all(e["attrs"].get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]

    def one(self, tag: str, **attrs: str) -> dict[str, Any]:
        found = self.find(tag, **attrs)
        assert len(found) == 1, f"<{tag} {attrs}> found {len(found)} times"
        return found[0]


def chromium(url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.glob('chromium-profile-*')))}"
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        *extra,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


# -- the real exporter in a real browser ------------------------------------------------------


@pytest.fixture(scope="module")
def crashing_exporter(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("statuspage")
    with Exporter(SCENARIOS / "h200x2-nvlink-crash.json", tmp, env={"NVGPU_QUARANTINE_AFTER": "1"}) as exp:
        exp.wait_for(
            lambda s: (
                s.value("nvgpu_feature_enabled", feature="nvlink_throughput", reason="quarantined") == 0.0
                and s.value("nvgpu_up") == 1.0
                and s.gpus() == {"0", "1"}
            ),
            timeout=40,
            what="nvlink_throughput quarantined",
        )
        yield exp


@needs_chromium
def test_dom_shows_both_gpus_and_the_quarantine(crashing_exporter: Exporter, tmp_path: Path) -> None:
    res = chromium(crashing_exporter.base + "/", tmp_path, "--dump-dom")
    assert res.returncode == 0, res.stderr[-3000:]
    dom = Dom(res.stdout)
    assert dom.one("title")["text"] == "nvgpu-exporter"
    # One row per GPU, named by UUID, with its model and live values.
    for index, uuid in (("0", UUID0), ("1", UUID1)):
        row = dom.one("tr", data_uuid=uuid)
        assert uuid in row["text"] and "NVIDIA H200" in row["text"] and "up" in row["text"], row["text"]
        assert " W / 700 W" in row["text"] and "°C" in row["text"] and "GiB" in row["text"], row["text"]
        assert row["text"].lstrip().startswith(index)
    assert len(dom.find("tr", data_uuid=UUID0) + dom.find("tr", data_uuid=UUID1)) == 2
    # The quarantined feature stands out: its row, its badge, and a banner above everything.
    row = dom.one("tr", data_feature="nvlink_throughput")
    assert row["attrs"]["data-reason"] == "quarantined" and row["attrs"]["class"] == "bad"
    assert "QUARANTINED" in row["text"] and "nvmlDeviceGetFieldValues" in row["text"], row["text"]
    banner = dom.one("div", id="quarantine-alert")
    assert "1 feature quarantined" in banner["text"] and "nvlink_throughput" in banner["text"]
    others = [
        e for e in dom.find("tr") if "data-feature" in e["attrs"] and e["attrs"]["data-feature"] != "nvlink_throughput"
    ]
    assert others and all(e["attrs"]["data-reason"] != "quarantined" for e in others)
    assert dom.one("tr", data_feature="utilization")["attrs"]["data-reason"] == "default"
    # Worker: the crash is counted against the feature and function in flight.
    worker = dom.one("table", id="worker")["text"]
    assert (
        "crash: 2" in worker  # one per GPU: the first contained to its GPU, the second quarantines
        and "nvlink_throughput in nvmlDeviceGetFieldValues: 2" in worker
        and "SIGSEGV (11)" in worker
    )
    # Self-check of both processes, build info and the links.
    assert dom.one("tr", data_process="supervisor")["text"].count("ok") >= 1
    build = dom.one("dl", id="build")["text"]
    assert "580.159.04" in build and "nvidia-ml-py" in build
    assert {a["attrs"]["href"] for a in dom.find("a")} >= {"/metrics", "/healthz", "/readyz"}


@needs_chromium
def test_screenshot_is_a_real_picture_of_the_page(crashing_exporter: Exporter, tmp_path: Path) -> None:
    shot = tmp_path / "statuspage.png"
    res = chromium(
        crashing_exporter.base + "/", tmp_path, f"--screenshot={shot}", "--window-size=1400,1000", "--hide-scrollbars"
    )
    assert res.returncode == 0 and shot.exists(), res.stderr[-3000:]
    width, height, distinct_lines = png_info(shot.read_bytes())
    assert (width, height) == (1400, 1000)
    assert distinct_lines > 100, f"only {distinct_lines} distinct scanlines: a blank or error page?"


def test_page_answers_while_the_worker_hangs_in_nvml(tmp_path: Path) -> None:
    """GPU 0's power call hangs for good: the page answers, shows GPU 0 HUNG with the call that hung,
    and GPU 1 with fresh values."""
    data = load_scenario("h200x2")
    data["faults"] = [
        {"function": "nvmlDeviceGetPowerUsage", "gpu": 0, "from_s": 2, "action": "hang", "ignore_sigterm": True}
    ]
    env = {"NVGPU_SAMPLE_DEADLINE_SECONDS": "2", "NVGPU_GPU_RETRY_SECONDS": "600"}
    with Exporter(write_scenario(tmp_path, data), tmp_path, env=env) as exp:
        exp.wait_for(lambda s: s.value("nvgpu_up") == 1.0)
        exp.wait_for(lambda s: s.value("nvgpu_device_state", gpu="0", state="hung") == 1.0, timeout=20, what="hung")
        status, headers, body = exp.get("/", timeout=3)
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        dom = Dom(body.decode())
        row0, row1 = dom.one("tr", data_uuid=UUID0), dom.one("tr", data_uuid=UUID1)
        assert "HUNG" in row0["text"] and "nvmlDeviceGetPowerUsage" in row0["text"] and "probe in" in row0["text"]
        assert row1["attrs"]["data-state"] == "up" and " W" in row1["text"]


# -- unit: states a live exporter rarely shows ------------------------------------------------


def stand_in() -> ServedState:
    """A real served state with what a live exporter rarely shows at once: no fresh sample, known
    GPUs, Xids on GPU 1 and its stuck signature holding."""
    import time

    stuck = StuckDetector(0.99, 64 << 20, 60.0)
    stuck.gpus[UUID1] = _GpuState(since=1_699_999_900.0, holding=True, evaluable=True, index="1", uuid=UUID1)
    state = ServedState(Config(state_file=""), QuarantineStore("", 3, 600.0, 86400.0), [stuck])
    state.system = SystemInfo("580.159.04", "13.580.159.04", "", "13.580.82")
    state.python_version = "3.11.7"
    state.health.on_hello([(0, UUID0, ""), (1, UUID1, "")])
    state.xids.xids = {
        (UUID1, 43): XidCount(1, 1_700_000_000.0, "1"),
        (UUID1, 13): XidCount(2, 1_699_999_000.0, "1"),
    }
    state.selfchecks = {"supervisor": SelfCheckResult("supervisor", (), ())}
    state.worker.pid, state.worker.started_at = 42, 1_700_000_000.0
    state.last = Snapshot(1_700_000_000.0, 0.01, state.system, (), {}, {}, {}, 0, {})
    state.last_mono = time.monotonic() - 40.0
    return state


def test_without_a_fresh_sample_known_gpus_and_xids_still_show() -> None:
    dom = Dom(statuspage.render(stand_in()))
    assert "No fresh NVML sample" in dom.one("section", id="gpus-section")["text"]
    assert "no fresh sample" in dom.one("tr", data_uuid=UUID0)["text"]
    row = dom.one("tr", data_uuid=UUID1)
    assert row["attrs"]["class"] == "bad" and "STUCK" in row["text"]
    # The last Xid (by time) with the catalog's class and meaning, and the total.
    assert "Xid 43" in row["text"] and "application" in row["text"] and "3 Xids in total" in row["text"]
    assert "channel" in row["text"].lower()
    assert "not ready" in dom.one("span", id="ready")["text"]
    # The worker never reported a self-check: said so, not silently missing.
    assert "not reported" in dom.one("tr", data_process="worker")["text"]


def test_hostile_text_is_escaped_and_a_broken_section_stays_local() -> None:
    state = stand_in()
    state.set_feature_state(FeatureState("nvlink_throughput", False, Reason.QUARANTINED, "<script>alert(1)</script>"))
    state.selfchecks = {"supervisor": SelfCheckResult("supervisor", (), ("shadowed by <b>./exporter</b>",))}

    def broken(uuid: str) -> bool:
        raise RuntimeError("detector gone")

    stuck = state.extension(StuckDetector)
    assert stuck is not None
    stuck.suspected = broken  # type: ignore[method-assign]
    page = statuspage.render(state)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "shadowed by &lt;b&gt;./exporter&lt;/b&gt;" in page
    dom = Dom(page)
    assert "could not be rendered: RuntimeError: detector gone" in dom.one("section", id="gpus-section")["text"]
    assert "QUARANTINED" in dom.one("tr", data_feature="nvlink_throughput")["text"]
    assert "FAILED" in dom.one("tr", data_process="supervisor")["text"]
