"""examples/nvitop-exporter-fix: the .pth NVLink guard and verify.py in a real virtual environment.

A fresh venv gets nvitop, nvitop-exporter and nvidia-ml-py from PyPI at the versions the Dockerfile
pins, then the guard is installed with the Dockerfile's own ``install_guard.py``. No GPU is needed:
nvitop imports without NVML, and the guard's effect is checked at the class level, on a ``Device``
made with ``object.__new__`` whose NVML entry points are replaced by trip-wires.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

FIX_DIR = Path(__file__).resolve().parents[1] / "examples" / "nvitop-exporter-fix"
DOCKERFILE = FIX_DIR / "Dockerfile"
GUARD_ENV = "NVITOP_NVLINK_THROUGHPUT_GUARD"

# Runs inside the venv. Prints one JSON object on stdout.
PROBE = textwrap.dedent(
    """
    import json
    import sys

    lazy = {
        "guard_loaded_at_start": "nvitop_nvlink_guard" in sys.modules,
        "nvitop_loaded_at_start": any(m.split(".")[0] == "nvitop" for m in sys.modules),
    }

    import nvitop
    import nvitop.api.libnvml as libnvml
    import pynvml
    from nvitop import Device

    import nvitop_nvlink_guard as guard

    nvml_calls = []

    def tripwire(name):
        def call(*args, **kwargs):
            nvml_calls.append(name)
            raise RuntimeError("NVML reached through " + name)
        return call

    for name in ("nvmlQuery", "nvmlQueryFieldValues"):
        setattr(libnvml, name, tripwire("libnvml." + name))
    for name in ("nvmlInit", "nvmlDeviceGetFieldValues"):
        setattr(pynvml, name, tripwire("pynvml." + name))

    # A device that *would* query NVML: a handle and 18 links (H20/H200 SXM), no NVML behind it.
    armed = object.__new__(Device)
    armed._handle = object()
    armed._nvlink_link_count = 18
    armed._nvlink_throughput_counters = None
    # What nvitop itself answers for a GPU without NVLink (no handle -> no links), computed with
    # the original methods (``__wrapped__`` when guarded).
    bare = object.__new__(Device)
    bare._handle = None
    bare._nvlink_link_count = None
    bare._nvlink_throughput_counters = None

    methods = {}
    for name in guard.GUARDED_METHODS:
        func = getattr(Device, name)
        original = getattr(func, "__wrapped__", func) if guard.is_guarded(func) else func
        entry = {"guarded": guard.is_guarded(func), "module": getattr(original, "__module__", "")}
        before = len(nvml_calls)
        try:
            entry["result"] = repr(getattr(armed, name)())
        except RuntimeError as exc:
            entry["result"] = "raised: " + str(exc)
        entry["touched_nvml"] = len(nvml_calls) > before
        entry["reference"] = repr(original(bare))
        methods[name] = entry

    print(json.dumps({
        **lazy,
        "nvitop_file": nvitop.__file__,
        "active": guard.STATE.active,
        "enabled": guard.STATE.enabled,
        "invalid": guard.STATE.invalid,
        "patched": guard.STATE.patched,
        "methods": methods,
    }))
    """
)


@dataclass(frozen=True)
class Venv:
    """The prepared virtual environment."""

    python: Path
    site_packages: Path
    probe: Path


def dockerfile_pins() -> dict[str, str]:
    """Return the ``ARG NAME=value`` defaults of the Dockerfile."""
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), flags=re.MULTILINE))


def clean_env(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for child processes: none of the host's Python or guard settings leak in."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "NVITOP_", "VIRTUAL_ENV", "PIP_"))
    }
    env.update(PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.update(overrides or {})
    return env


def run(
    argv: list[str | Path],
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run a child process and capture its output as text."""
    return subprocess.run(
        [str(arg) for arg in argv],
        cwd=cwd,
        env=clean_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh venv with the Dockerfile's pins from PyPI and the guard installed as it does."""
    root = tmp_path_factory.mktemp("nvitop-fix")
    created = run([sys.executable, "-m", "venv", root / "venv"], cwd=root)
    assert created.returncode == 0, created.stderr
    python = root / "venv" / "bin" / "python"
    pins = dockerfile_pins()
    installed = run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-cache-dir",
            f"nvitop=={pins['NVITOP_VERSION']}",
            f"nvitop-exporter=={pins['NVITOP_EXPORTER_VERSION']}",
            f"nvidia-ml-py=={pins['NVIDIA_ML_PY_VERSION']}",
        ],
        cwd=root,
        timeout=300,
    )
    assert installed.returncode == 0, f"pip install failed:\n{installed.stdout}\n{installed.stderr}"
    guard = run([python, FIX_DIR / "install_guard.py"], cwd=Path("/"))
    assert guard.returncode == 0, guard.stderr
    site = Path(
        run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            cwd=root,
        ).stdout.strip()
    )
    assert (site / "nvitop_nvlink_guard.pth").is_file()
    probe_dir = root / "probe"
    probe_dir.mkdir()
    probe = probe_dir / "probe.py"
    probe.write_text(PROBE)
    return Venv(python=python, site_packages=site, probe=probe)


def probe(venv: Venv, guard_value: str | None = None) -> tuple[dict[str, Any], str]:
    """Run the probe from ``/``, ``GUARD_ENV`` set when given; return its report and stderr."""
    env = None if guard_value is None else {GUARD_ENV: guard_value}
    result = run([venv.python, venv.probe], cwd=Path("/"), env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def test_dockerfile_recipe() -> None:
    """Pins >= 1.7.1, runs from /, verifies at build time, starts python -m in exec form."""
    text = DOCKERFILE.read_text()
    pins = dockerfile_pins()
    for name in ("NVITOP_VERSION", "NVITOP_EXPORTER_VERSION"):
        assert tuple(int(p) for p in pins[name].split(".")) >= (1, 7, 1), name
    assert re.search(r"^ARG BASE_IMAGE$", text, flags=re.MULTILINE)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, flags=re.MULTILINE)
    assert re.search(r"^WORKDIR /$", text, flags=re.MULTILINE)
    assert "RUN python /opt/nvitop-fix/install_guard.py" in text
    assert "RUN python /opt/nvitop-fix/verify.py" in text
    assert text.index("WORKDIR /") < text.index("RUN python /opt/nvitop-fix/verify.py")
    assert re.search(r'^ENTRYPOINT \["python", "-m", "nvitop_exporter"\]$', text, flags=re.MULTILINE)
    assert re.search(r"^CMD \[", text, flags=re.MULTILINE)


def test_pins_are_consistent(venv: Venv) -> None:
    """The pinned nvidia-ml-py satisfies nvitop's own requirement (pip check)."""
    result = run([venv.python, "-m", "pip", "check"], cwd=Path("/"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_guard_active_by_default_and_lazy(venv: Venv) -> None:
    """Unset variable: every NVLink throughput method is replaced and never reaches NVML."""
    report, stderr = probe(venv)
    assert report["guard_loaded_at_start"] is True
    assert report["nvitop_loaded_at_start"] is False, "the .pth must not import nvitop"
    assert report["active"] is True
    methods = report["methods"]
    for name, entry in methods.items():
        assert entry["guarded"], name
        assert not entry["touched_nvml"], name
        assert entry["result"] == entry["reference"], name
    assert methods["nvlink_throughput"]["result"] == "[]"
    assert methods["nvlink_total_throughput"]["result"] == "ThroughputInfo(tx='N/A', rx='N/A')"
    assert methods["nvlink_total_tx_throughput"]["result"] == "'N/A'"
    active_lines = [line for line in stderr.splitlines() if "nvitop-nvlink-guard: active" in line]
    assert len(active_lines) == 1, stderr
    assert "WARNING" not in stderr


@pytest.mark.parametrize("value", ["off", "OFF", " off "])
def test_env_off_restores_original(venv: Venv, value: str) -> None:
    """``off``: nothing patched; the original really queries NVML (the trip-wire fires)."""
    report, stderr = probe(venv, value)
    assert report["active"] is False and report["enabled"] is False
    assert report["patched"] == []
    methods = report["methods"]
    for name, entry in methods.items():
        assert not entry["guarded"], name
        assert entry["module"] == "nvitop.api.device", name
    assert methods["nvlink_throughput"]["touched_nvml"] is True
    assert methods["nvlink_throughput"]["result"].startswith("raised: NVML reached through")
    assert "nvitop-nvlink-guard: off" in stderr
    assert "active" not in stderr and "WARNING" not in stderr


@pytest.mark.parametrize("value", ["on", "ON", ""])
def test_env_on_spellings(venv: Venv, value: str) -> None:
    """``on`` in any case, or empty, is the default: guarded, no warning."""
    report, stderr = probe(venv, value)
    assert report["active"] is True and report["invalid"] is False
    assert "WARNING" not in stderr


@pytest.mark.parametrize("value", ["false", "0", "disabled", "of"])
def test_invalid_value_keeps_guard_and_warns(venv: Venv, value: str) -> None:
    """Anything but on/off: a warning naming the value, and the guard stays on."""
    report, stderr = probe(venv, value)
    assert report["active"] is True and report["invalid"] is True
    methods = report["methods"]
    assert all(entry["guarded"] and not entry["touched_nvml"] for entry in methods.values())
    assert f"WARNING: {GUARD_ENV}={value!r} is not one of 'on', 'off'; keeping the guard ON" in (stderr)


def test_verify_passes_from_root(venv: Venv) -> None:
    """From ``/`` (the Dockerfile's WORKDIR) every module is the installed one."""
    pins = dockerfile_pins()
    result = run(
        [venv.python, FIX_DIR / "verify.py", "--json"],
        cwd=Path("/"),
        env={"NVITOP_FIX_MIN_NVIDIA_ML_PY": pins["NVIDIA_ML_PY_VERSION"]},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["cwd"] == "/"
    modules = {info["module"]: info for info in report["modules"]}
    assert modules["nvitop"]["version"] == pins["NVITOP_VERSION"]
    assert modules["nvitop_exporter"]["version"] == pins["NVITOP_EXPORTER_VERSION"]
    assert modules["pynvml"]["dist_version"] == pins["NVIDIA_ML_PY_VERSION"]
    for info in modules.values():
        assert Path(info["file"]).is_relative_to(venv.site_packages.resolve()), info
    assert report["guard"]["state"] == "active"

    text = run([venv.python, FIX_DIR / "verify.py"], cwd=Path("/"))
    assert text.returncode == 0, text.stdout + text.stderr
    assert "working directory:   /\n" in text.stdout
    assert re.search(r"^nvitop:\s+1\.7\.\d+\s+/", text.stdout, flags=re.MULTILINE)
    assert "verify: OK" in text.stdout


def test_verify_fails_on_shadowing_copy(venv: Venv, tmp_path: Path) -> None:
    """The incident: a stale ``nvitop/`` in the working directory is what Python imports."""
    stale = tmp_path / "nvitop" / "__init__.py"
    stale.parent.mkdir()
    stale.write_text('__version__ = "1.5.0"\n')
    result = run([venv.python, FIX_DIR / "verify.py"], cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"nvitop was imported from {stale.resolve()}, outside site-packages" in result.stderr
    assert "nvitop.__version__ 1.5.0 is below the expected minimum 1.7.1" in result.stderr
    assert "verify: FAILED" in result.stdout
    # pip's view disagrees with what runs, which is the point
    assert f"[nvitop {dockerfile_pins()['NVITOP_VERSION']}]" in result.stdout


def test_verify_fails_when_guard_expected_but_off(venv: Venv) -> None:
    """``--expect-guard on`` catches a pod where the guard was switched off or never loaded."""
    result = run(
        [venv.python, FIX_DIR / "verify.py", "--expect-guard", "on"],
        cwd=Path("/"),
        env={GUARD_ENV: "off"},
    )
    assert result.returncode == 1
    assert "guard expected on but is off" in result.stderr


def test_verify_fails_below_minimum(venv: Venv) -> None:
    """A minimum above what is installed fails and names the version."""
    result = run([venv.python, FIX_DIR / "verify.py", "--min-nvitop", "99.0"], cwd=Path("/"))
    assert result.returncode == 1
    assert "is below the expected minimum 99.0" in result.stderr
