"""What README and docs/ say about series counts and metric names is what a live exporter serves.

The real exporter (supervisor and worker) runs on the shipped fake scenarios, with the defaults and
with each switch the docs count; every series count the docs state is a row of ``COUNTS`` (the
exact phrase, and how to count it in the scrape), and every ``nvgpu_*`` name the docs write is a
family some live scrape carries (or a prefix of one). A count in the docs that no row holds fails
(``test_every_series_count_in_the_docs_is_checked``): a new number needs a row, or a place in
``MEASURED`` when it is a dated measurement of the past that says so where it stands.
"""

from __future__ import annotations

import functools
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from exporter_proc import SCENARIOS, Exporter, load_scenario
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import Config
from exporter.supervisor import xids

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# The live runs: (scenario, extra environment).
RUNS: dict[str, tuple[str, dict[str, str]]] = {
    "h200x8": ("h200x8", {}),
    "h200x2": ("h200x2", {}),
    "h200x8 details": ("h200x8", {"NVGPU_FEATURE_DETAILS": "on"}),
    "h200x8 nvlink_links": ("h200x8", {"NVGPU_FEATURE_NVLINK_LINKS": "on"}),
    "h200x2 gpm_pipes, process_usage": (
        "h200x2",
        {"NVGPU_FEATURE_GPM_PIPES": "on", "NVGPU_FEATURE_PROCESS_USAGE": "on"},
    ),
    "h200x2-mig": ("h200x2-mig", {}),
    "h200x2-xid79": ("h200x2-xid79", {}),
    # the one shipped scenario with confidential computing on: its protected memory needs details
    "h100x2-r550 details": ("h100x2-r550", {"NVGPU_FEATURE_DETAILS": "on"}),
}


@dataclass(frozen=True)
class Series:
    name: str
    labels: dict[str, str]


PODS = "h200x8, one pod per GPU"


@functools.cache
def scrape(run: str) -> tuple[Series, ...]:
    """The series of one live scrape, after the second sample (for PODS: once every GPU has its pod)."""
    if run == PODS:
        return _scrape_with_pods()
    scenario, env = RUNS[run]
    with tempfile.TemporaryDirectory() as tmp:
        exporter = Exporter(SCENARIOS / f"{scenario}.json", Path(tmp), env=env)
        try:
            text = exporter.wait_samples(2).text
        finally:
            exporter.terminate()
    return _series(text)


def _series(text: str) -> tuple[Series, ...]:
    return tuple(Series(s.name, dict(s.labels)) for f in text_string_to_metric_families(text) for s in f.samples)


def _scrape_with_pods() -> tuple[Series, ...]:
    """h200x8 with a kubelet (tests/fake_kubelet.py on a real gRPC server) that gives each GPU one pod."""
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    from fake_kubelet import FakeKubelet

    from exporter.supervisor.podresources.v1 import api_pb2, api_pb2_grpc

    uuids = [gpu["uuid"] for gpu in load_scenario("h200x8")["gpus"]]
    pods = [
        api_pb2.PodResources(
            namespace="ml",
            name=f"trainer-{i}",
            containers=[
                api_pb2.ContainerResources(
                    name="main", devices=[api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[u])]
                )
            ],
        )
        for i, u in enumerate(uuids)
    ]
    with tempfile.TemporaryDirectory(prefix="podres-", dir="/tmp") as sock_dir, tempfile.TemporaryDirectory() as tmp:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(FakeKubelet(pods), server)
        socket_path = f"{sock_dir}/kubelet.sock"
        assert server.add_insecure_port(f"unix://{socket_path}") != 0
        server.start()
        env = {"NVGPU_POD_RESOURCES_SOCKET": socket_path, "NVGPU_POD_REFRESH_SECONDS": "0.5"}
        exporter = Exporter(SCENARIOS / "h200x8.json", Path(tmp), env=env)
        try:
            text = exporter.wait_for(
                lambda s: len(s.find("nvgpu_gpu_pod_info")) == len(uuids), what="a pod on every GPU"
            ).text
            text = exporter.wait_samples(2).text
        finally:
            exporter.terminate()
            server.stop(grace=None).wait(5)
    return _series(text)


def pod_extra_per_gpu() -> float:
    return (sum("uuid" in s.labels for s in scrape(PODS)) - sum("uuid" in s.labels for s in scrape("h200x8"))) / 8


def pod_extra_node() -> int:
    return node(PODS) - node("h200x8")


def per_gpu(run: str) -> float:
    series = scrape(run)
    gpus = {s.labels["uuid"] for s in series if "uuid" in s.labels}
    return sum("uuid" in s.labels for s in series) / len(gpus)


def node(run: str) -> int:
    return sum("uuid" not in s.labels for s in scrape(run))


def total(run: str) -> int:
    return len(scrape(run))


def fleet(run: str) -> int:
    return 1000 * total(run)


def per_s(run: str) -> int:
    """Samples per second for 1,000 such nodes at the shipped scrape interval of 15 s, to 100."""
    return round(fleet(run) / 15 / 100) * 100


def links_of(run: str) -> float:
    """Series per NVLink link with nvlink_links on: the per-link families of one link."""
    series = [s for s in scrape(run) if "link" in s.labels]
    keys = {(s.labels["uuid"], s.labels["link"]) for s in series}
    return len(series) / len(keys)


def extra_per_gpu(run: str, base: str = "h200x8") -> float:
    return per_gpu(run) - per_gpu(base)


def family_per_gpu(run: str, family: str) -> float:
    return sum(s.name == family for s in scrape(run)) / len(
        {s.labels["uuid"] for s in scrape(run) if "uuid" in s.labels}
    )


def pipes(run: str) -> float:
    return sum(s.name.startswith("nvgpu_gpm_pipe") for s in scrape(run)) / 2


def _n(text: str) -> int:
    return int(text.replace(",", ""))


@dataclass(frozen=True)
class Count:
    """A series count stated in a doc: the file, the exact phrase, the number in it and how to count it live."""

    file: str
    phrase: str
    number: str
    count: Callable[[], float]


COUNTS = (
    Count("docs/kubernetes.md", "**640 series** with the defaults", "640", lambda: total("h200x8")),
    Count("docs/kubernetes.md", "with the defaults: 64 per GPU and 128 for the node", "64", lambda: per_gpu("h200x8")),
    Count("docs/kubernetes.md", "with the defaults: 64 per GPU and 128 for the node", "128", lambda: node("h200x8")),
    Count("docs/kubernetes.md", "| default | 640,000", "640,000", lambda: fleet("h200x8")),
    Count("docs/kubernetes.md", "| 42,700 (", "42,700", lambda: per_s("h200x8")),
    Count("docs/kubernetes.md", "Pod attribution adds 1 series per GPU with one pod per GPU", "1", pod_extra_per_gpu),
    Count("docs/kubernetes.md", "and 4 for the node", "4", pod_extra_node),
    Count("docs/kubernetes.md", "(12,000 more with one pod per GPU)", "12,000",
          lambda: 1000 * (8 * pod_extra_per_gpu() + pod_extra_node())),
    Count("docs/kubernetes.md", "(800 more)", "800",
          lambda: round(1000 * (8 * pod_extra_per_gpu() + pod_extra_node()) / 15 / 100) * 100),
    Count("docs/kubernetes.md", "| `NVGPU_FEATURE_DETAILS=on` | 913,000 | 60,900 |", "913,000",
          lambda: fleet("h200x8 details")),
    Count("docs/kubernetes.md", "| `NVGPU_FEATURE_DETAILS=on` | 913,000 | 60,900 |", "60,900",
          lambda: per_s("h200x8 details")),
    Count("docs/kubernetes.md", "| `NVGPU_FEATURE_NVLINK_LINKS=on` | 1,648,000 | 109,900 |", "1,648,000",
          lambda: fleet("h200x8 nvlink_links")),
    Count("docs/kubernetes.md", "| `NVGPU_FEATURE_NVLINK_LINKS=on` | 1,648,000 | 109,900 |", "109,900",
          lambda: per_s("h200x8 nvlink_links")),
    Count("docs/kubernetes.md", "Two-GPU nodes: 256 series per scrape (64 per GPU, 128 for the node), 256,000",
          "256", lambda: total("h200x2")),
    Count("docs/kubernetes.md", "Two-GPU nodes: 256 series per scrape (64 per GPU, 128 for the node), 256,000",
          "128", lambda: node("h200x2")),
    Count("docs/kubernetes.md", "256,000 for 1,000 nodes,\n17,100 samples/s", "17,100", lambda: per_s("h200x2")),
    Count("docs/kubernetes.md", "The node's own 128 series", "128", lambda: node("h200x2")),
    Count("docs/metrics.md", "Series per GPU**: 64 by default on the H200 scenarios", "64", lambda: per_gpu("h200x8")),
    Count("docs/metrics.md", "the series beyond the budget, about 34 more per GPU", "34",
          lambda: extra_per_gpu("h200x8 details")),
    Count("docs/metrics.md", "7 series per link", "7", lambda: links_of("h200x8 nvlink_links")),
    Count("README.md", "every NVLink link's series, 7 per link", "7", lambda: links_of("h200x8 nvlink_links")),
    Count("README.md", "the series beyond the default 64 per GPU, about 34 more", "64",
          lambda: per_gpu("h200x8")),
    Count("README.md", "the series beyond the default 64 per GPU, about 34 more", "34",
          lambda: extra_per_gpu("h200x8 details")),
    Count("README.md", "pipe, seven more series per GPU", "seven", lambda: pipes("h200x2 gpm_pipes, process_usage")),
    Count("docs/migrating-from-dcgm.md", "(off by default: 7 more series per GPU", "7",
          lambda: pipes("h200x2 gpm_pipes, process_usage")),
    Count("docs/performance.md", "`nvgpu_gpu_health_verdict` (1 series per GPU", "1",
          lambda: family_per_gpu("h200x8", "nvgpu_gpu_health_verdict")),
    Count("docs/performance.md", "(1 series per GPU, 64 in all", "64", lambda: per_gpu("h200x8")),
    # bounds that follow from the code or a setting: the Xid process ring, NVGPU_PROCESS_SERIES_PER_GPU
    # processes and pid="other"
    Count("docs/metrics.md", "at most 5 series per GPU", "5", lambda: xids.RECENT_PER_GPU),
    Count("docs/kubernetes.md", "stays at 17 series per family and GPU", "17",
          lambda: Config.from_env({}).process_series_per_gpu + 1),
)  # fmt: skip

# Counts that are dated measurements of the past, said so where they stand (a benchmark's result
# file, an issue's before/after): (file, phrase).
MEASURED = {
    ("docs/kubernetes.md", "before the series budget of 2026-11-30 (per-link NVLink, everything) | 1,774,000"),
    ("docs/performance.md", "(568 series)"),
    ("docs/performance.md", "1,637 series"),
    ("docs/reliability.md", "1,368 series-pairs"),
}
_COUNT = re.compile(r"(?<![\w.,-])(\d[\d,]*|seven|about \d+)\**(?= (?:more )?series\b| series-pairs)")


def _text(file: str) -> str:
    return (ROOT / file).read_text(encoding="utf-8")


@pytest.mark.integration  # the counts are taken from live exporters (through scrape())
@pytest.mark.parametrize("claim", COUNTS, ids=lambda c: f"{c.file}:{c.number}:{c.phrase[:40]}")
def test_a_series_count_in_the_docs_is_what_a_live_scrape_counts(claim: Count) -> None:
    assert claim.phrase in _text(claim.file), f"{claim.file} no longer says {claim.phrase!r}: update COUNTS"
    assert claim.number in claim.phrase
    want = float(_n(claim.number)) if claim.number[0].isdigit() else 7.0
    got = claim.count()
    if claim.phrase.find("about " + claim.number) >= 0:
        assert abs(got - want) <= 0.1 * want, (claim, got)
    else:
        assert got == want, (claim, got)


def test_every_series_count_in_the_docs_is_checked() -> None:
    """Each "<number> series" / "per GPU" / "per link" a doc states is in COUNTS or MEASURED."""
    unchecked = []
    for path in DOCS:
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        phrases = [c.phrase for c in COUNTS if c.file == rel] + [p for f, p in MEASURED if f == rel]
        covered = [(m.start(), m.end()) for p in phrases for m in re.finditer(re.escape(p), text)]
        for m in _COUNT.finditer(text):
            if not any(a <= m.start() < b for a, b in covered):
                line = text[: m.start()].count("\n") + 1
                unchecked.append(f"{rel}:{line}: {text[max(0, m.start() - 40) : m.end() + 20]!r}")
    assert not unchecked, "series counts no test checks:\n" + "\n".join(unchecked)


# Names the docs write that are not metric families: the wheel's file name.
NOT_METRICS = {
    "nvgpu_exporter": "the wheel's distribution name (nvgpu_exporter-<version>-py3-none-any.whl)",
    "nvgpu_memory_utilization_ratio": "the name nvgpu_memory_copy_utilization_ratio had until 2026-11-30",
}


def _golden_names() -> set[str]:
    """The series names of the golden expositions: the real renderer on snapshots of states a
    healthy fake does not reach by itself (faults, processes, a fan, GPM NVLink bytes); the golden
    test holds them equal to what the exporter renders."""
    names = set()
    for path in (ROOT / "tests" / "golden").glob("*.prom"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line and not line.startswith("#"):
                names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


@pytest.mark.integration
def test_every_metric_name_in_the_docs_is_served_live() -> None:
    """Each name is served by a live exporter on a fake scenario; the names that only a fault state
    carries (an Xid, a crash, an NVML error, a process, a fan) are held by the goldens instead, and
    the test says which those are, so the list stays short."""
    served = {s.name for run in [*RUNS, PODS] for s in scrape(run)}
    golden_only = _golden_names() - served
    served |= golden_only
    families = served | {re.sub(r"_(total|bucket|count|sum|created)$", "", n) for n in served}
    missing = []
    for path in DOCS:
        for m in re.finditer(r"(?<![\w:])nvgpu_[a-z0-9_]+", path.read_text(encoding="utf-8")):
            name = m.group()
            if name in NOT_METRICS or name in families:
                continue
            if name.endswith("_") and any(f.startswith(name) for f in families):
                continue  # a prefix: nvgpu_mig_*
            missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, "names in the docs that no live scrape serves:\n" + "\n".join(sorted(set(missing)))
    assert len(golden_only) <= 45, sorted(golden_only)  # a fault state's families: do not let it grow unseen
