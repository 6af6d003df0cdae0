"""Tests for guards.versions: real shadowing, real distributions on disk, binding vs driver.

The shadowing tests reproduce the incident: a stale copy of a package in the working directory of
``python -c`` (which puts the current directory first on ``sys.path``) is what the process imports,
while the installed distribution says otherwise. Every case runs a real interpreter in a
subprocess against real files; nothing is mocked.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from guards.versions import (
    CRITICAL_MODULES,
    NOTE_PREFIX,
    ModuleReport,
    SelfCheckResult,
    check_binding_against_driver,
    check_process_struct,
    inspect_module,
    run_checks,
)

REPO = Path(__file__).resolve().parents[1]

_SCRIPT = """
import dataclasses, json, sys
import guards.versions as v
{imports}
report = v.inspect_module({module!r}, {dist!r})
out = dataclasses.asdict(report)
out["in_sys_modules_after"] = {module!r} in sys.modules
print(json.dumps(out))
"""


def inspect_in_subprocess(
    module: str,
    dist: str,
    *,
    cwd: Path,
    extra_path: tuple[Path, ...] = (),
    import_first: bool = True,
    site_dirs: tuple[Path, ...] = (),
) -> dict[str, Any]:
    """Run ``python -c`` in ``cwd`` and return inspect_module's report as a dict.

    ``python -c`` puts '' (the working directory) first on sys.path, exactly like the incident.
    ``site_dirs`` are added with site.addsitedir, so their .pth files are processed as in a real
    site-packages directory.
    """
    lines = [f"import site; site.addsitedir({str(d)!r})" for d in site_dirs]
    if import_first:
        lines.append(f"import {module}")
    script = _SCRIPT.format(imports="\n".join(lines), module=module, dist=dist)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *map(str, extra_path)])
    env.pop("PYTHONSAFEPATH", None)  # keep '' first on sys.path, as in the incident
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def same_file(a: str | None, b: Path) -> bool:
    return a is not None and os.path.realpath(a) == os.path.realpath(b)


def make_distribution(
    site: Path,
    name: str,
    version: str,
    files: dict[str, str],
    *,
    direct_url: dict[str, Any] | None = None,
) -> Path:
    """Write a real installed distribution (dist-info with METADATA and RECORD) into ``site``."""
    site.mkdir(parents=True, exist_ok=True)
    dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    record = []
    for relative, content in files.items():
        target = site / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        record.append(f"{relative},,")
    if direct_url is not None:
        (dist_info / "direct_url.json").write_text(json.dumps(direct_url), encoding="utf-8")
        record.append(f"{dist_info.name}/direct_url.json,,")
    record += [f"{dist_info.name}/METADATA,,", f"{dist_info.name}/RECORD,,"]
    (dist_info / "RECORD").write_text("\n".join(record) + "\n", encoding="utf-8")
    return dist_info


# --- pynvml: the real installed binding ---------------------------------------------------------

PYNVML_DIST = "nvidia-ml-py"


@pytest.fixture(scope="module")
def installed_pynvml() -> Path:
    pytest.importorskip("pynvml")
    files = importlib.metadata.files(PYNVML_DIST) or []
    path = next(Path(str(f.locate())) for f in files if f.name == "pynvml.py")
    return path


def test_stale_pynvml_in_working_directory_is_flagged_as_shadowing(tmp_path: Path, installed_pynvml: Path) -> None:
    stale = tmp_path / "pynvml.py"
    stale.write_text("# stale copy left in the image's working directory\n", encoding="utf-8")
    report = inspect_in_subprocess("pynvml", PYNVML_DIST, cwd=tmp_path)
    assert report["imported"] is True
    assert same_file(report["path"], stale)
    assert same_file(report["shadowed_by"], stale)
    assert report["file_in_distribution"] is False
    assert report["distribution_version"] == importlib.metadata.version(PYNVML_DIST)
    shadow = [p for p in report["problems"] if "shadows" in p]
    assert len(shadow) == 1
    assert shadow[0].startswith(f"module pynvml imported from {report['path']}, which shadows ")
    assert f"nvidia-ml-py {report['distribution_version']} installed at " in shadow[0]
    assert os.path.realpath(installed_pynvml.parent) in shadow[0]


def test_stale_pynvml_is_found_without_importing_it(tmp_path: Path) -> None:
    stale = tmp_path / "pynvml.py"
    stale.write_text("raise SystemExit('must not be imported')\n", encoding="utf-8")
    report = inspect_in_subprocess("pynvml", PYNVML_DIST, cwd=tmp_path, import_first=False)
    assert report["imported"] is False
    assert report["in_sys_modules_after"] is False
    assert same_file(report["shadowed_by"], stale)
    assert any(p.startswith("module pynvml would be imported from") for p in report["problems"])


def test_installed_pynvml_is_clean(tmp_path: Path, installed_pynvml: Path) -> None:
    report = inspect_in_subprocess("pynvml", PYNVML_DIST, cwd=tmp_path)
    assert report["imported"] is True
    assert same_file(report["path"], installed_pynvml)
    assert report["file_in_distribution"] is True
    assert report["shadowed_by"] is None
    assert report["problems"] == []


def test_in_process_report_for_the_installed_binding(installed_pynvml: Path) -> None:
    importlib.import_module("pynvml")  # so that the report is about what runs

    report = inspect_module("pynvml", PYNVML_DIST)
    assert isinstance(report, ModuleReport)
    assert report.imported is True
    assert same_file(report.path, installed_pynvml)
    assert report.file_in_distribution is True
    assert report.problems == ()


def test_deprecated_pynvml_distribution_next_to_nvidia_ml_py(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_distribution(site, "pynvml", "11.5.0", {"pynvml_utils/__init__.py": ""})
    work = tmp_path / "work"
    work.mkdir()
    report = inspect_in_subprocess("pynvml", PYNVML_DIST, cwd=work, extra_path=(site,))
    conflict = [p for p in report["problems"] if "keep only" in p]
    assert len(conflict) == 1
    assert conflict[0].startswith("both pynvml and nvidia-ml-py install a top-level pynvml; keep only nvidia-ml-py")
    assert "pynvml 11.5.0" in conflict[0]


# --- a package of our own: stale copy with a __version__ ----------------------------------------


def test_stale_package_copy_with_old_version(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_distribution(site, "fake-exporter", "0.1.0", {"fakeexporter/__init__.py": '__version__ = "0.1.0"\n'})
    work = tmp_path / "app"
    (work / "fakeexporter").mkdir(parents=True)
    stale = work / "fakeexporter" / "__init__.py"
    stale.write_text('__version__ = "0.0.9"\n', encoding="utf-8")

    report = inspect_in_subprocess("fakeexporter", "fake-exporter", cwd=work, extra_path=(site,))
    assert report["version"] == "0.0.9"
    assert report["distribution_version"] == "0.1.0"
    assert same_file(report["shadowed_by"], stale)
    assert report["file_in_distribution"] is False
    problems = report["problems"]
    assert len(problems) == 2
    assert "shadows fake-exporter 0.1.0" in problems[0]
    assert "has __version__ 0.0.9 but the installed fake-exporter is 0.1.0" in problems[1]

    # Same interpreter, working directory without the stale copy: clean.
    clean = inspect_in_subprocess("fakeexporter", "fake-exporter", cwd=tmp_path, extra_path=(site,))
    assert same_file(clean["path"], site / "fakeexporter" / "__init__.py")
    assert clean["version"] == "0.1.0"
    assert clean["file_in_distribution"] is True
    assert clean["problems"] == []


def test_earlier_sys_path_entry_shadows(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_distribution(site, "fakemod", "1.0", {"fakemod.py": ""})
    early = tmp_path / "vendored"
    early.mkdir()
    (early / "fakemod.py").write_text("", encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    report = inspect_in_subprocess("fakemod", "fakemod", cwd=work, extra_path=(early, site))
    assert same_file(report["shadowed_by"], early / "fakemod.py")
    assert "shadows fakemod 1.0" in report["problems"][0]


def test_version_mismatch_without_shadowing(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_distribution(site, "fakever", "2.0.0", {"fakever.py": '__version__ = "1.9.0"\n'})
    report = inspect_in_subprocess("fakever", "fakever", cwd=tmp_path, extra_path=(site,))
    assert report["shadowed_by"] is None
    assert report["file_in_distribution"] is True
    assert report["problems"] == [
        f"module fakever has __version__ 1.9.0 but the installed fakever is 2.0.0: the imported "
        f"copy ({report['path']}) is stale or from another installation"
    ]


def test_equal_versions_with_different_spelling_are_fine(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_distribution(site, "fakezero", "1.0", {"fakezero.py": '__version__ = "1.0.0"\n'})
    report = inspect_in_subprocess("fakezero", "fakezero", cwd=tmp_path, extra_path=(site,))
    assert report["problems"] == []


# --- editable installs --------------------------------------------------------------------------


def _project(tmp_path: Path, package: str) -> Path:
    project = tmp_path / "project"
    (project / package).mkdir(parents=True)
    (project / package / "__init__.py").write_text('__version__ = "0.1.0"\n', encoding="utf-8")
    return project


def test_editable_install_via_direct_url(tmp_path: Path) -> None:
    project = _project(tmp_path, "fakeedit")
    site = tmp_path / "site"
    make_distribution(
        site,
        "fakeedit",
        "0.1.0",
        {},
        direct_url={"url": project.as_uri(), "dir_info": {"editable": True}},
    )
    work = tmp_path / "work"
    work.mkdir()
    report = inspect_in_subprocess("fakeedit", "fakeedit", cwd=work, extra_path=(project, site))
    assert same_file(report["path"], project / "fakeedit" / "__init__.py")
    assert report["file_in_distribution"] is True
    assert report["problems"] == []

    # A stale copy in the working directory still shadows the editable project.
    (work / "fakeedit").mkdir()
    (work / "fakeedit" / "__init__.py").write_text('__version__ = "0.0.1"\n', encoding="utf-8")
    stale = inspect_in_subprocess("fakeedit", "fakeedit", cwd=work, extra_path=(project, site))
    assert same_file(stale["shadowed_by"], work / "fakeedit" / "__init__.py")


def test_editable_project_holding_its_virtualenv_run_from_the_project(tmp_path: Path) -> None:
    project = _project(tmp_path, "fakevenv")
    site = project / ".venv" / "site-packages"
    make_distribution(
        site,
        "fakevenv",
        "0.1.0",
        {"__editable__.fakevenv-0.1.0.pth": f"{project}\n"},
        direct_url={"url": project.as_uri(), "dir_info": {"editable": True}},
    )
    # cwd = project root: '' comes first and finds the editable project itself, not a stale copy.
    report = inspect_in_subprocess("fakevenv", "fakevenv", cwd=project, site_dirs=(site,))
    assert same_file(report["path"], project / "fakevenv" / "__init__.py")
    assert report["file_in_distribution"] is True
    assert report["problems"] == []


def test_pth_entry_above_site_directory_claims_nothing(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_distribution(site, "fakedot", "1.0", {"fakedot.pth": ".\n"})
    (site / "fakedot.py").write_text("", encoding="utf-8")  # not in RECORD
    work = tmp_path / "work"
    work.mkdir()
    report = inspect_in_subprocess("fakedot", "fakedot", cwd=work, site_dirs=(site,))
    assert report["file_in_distribution"] is False
    assert report["shadowed_by"] is None
    assert report["problems"] == [
        f"module fakedot imported from {report['path']}, which is not a file of fakedot 1.0 "
        f"(installed at {os.path.realpath(site)})"
    ]


def test_non_editable_direct_url_does_not_claim_the_project(tmp_path: Path) -> None:
    project = _project(tmp_path, "fakecopy")
    site = tmp_path / "site"
    make_distribution(
        site,
        "fakecopy",
        "0.1.0",
        {},
        direct_url={"url": project.as_uri(), "dir_info": {}},
    )
    report = inspect_in_subprocess("fakecopy", "fakecopy", cwd=tmp_path / "project", extra_path=(site,))
    assert report["file_in_distribution"] is False
    assert report["shadowed_by"] is not None


def test_editable_install_via_pth_file(tmp_path: Path) -> None:
    project = _project(tmp_path, "fakepth")
    site = tmp_path / "site"
    make_distribution(site, "fakepth", "0.1.0", {"__editable__.fakepth-0.1.0.pth": f"{project}\n"})
    work = tmp_path / "work"
    work.mkdir()
    report = inspect_in_subprocess("fakepth", "fakepth", cwd=work, site_dirs=(site,))
    assert same_file(report["path"], project / "fakepth" / "__init__.py")
    assert report["file_in_distribution"] is True
    assert report["problems"] == []


def test_editable_install_via_setuptools_finder(tmp_path: Path) -> None:
    project = _project(tmp_path, "fakefind")
    site = tmp_path / "site"
    finder = (
        "import sys\n"
        f"MAPPING: dict[str, str] = {{'fakefind': {str(project / 'fakefind')!r}}}\n"
        "NAMESPACES: dict[str, list[str]] = {}\n"
    )
    make_distribution(
        site,
        "fakefind",
        "0.1.0",
        {
            "__editable___fakefind_0_1_0_finder.py": finder,
            "__editable__.fakefind-0.1.0.pth": "import __editable___fakefind_0_1_0_finder\n",
        },
    )
    work = tmp_path / "work"
    work.mkdir()
    report = inspect_in_subprocess("fakefind", "fakefind", cwd=work, extra_path=(site, project))
    assert report["file_in_distribution"] is True
    assert report["problems"] == []


# --- missing pieces -----------------------------------------------------------------------------


def test_distribution_not_installed() -> None:
    report = inspect_module("json", "no-such-distribution-xyz")
    assert report.imported is True
    assert report.distribution_version is None
    assert report.file_in_distribution is None
    assert report.problems == (
        f"module json: distribution no-such-distribution-xyz is not installed; module imported from {report.path}",
    )


def test_module_not_found() -> None:
    report = inspect_module("no_such_module_xyz", "psutil")
    assert report.imported is False
    assert report.path is None
    assert report.problems[0] == ("module no_such_module_xyz is not importable: no such module on sys.path")


# --- run_checks ---------------------------------------------------------------------------------


def test_run_checks_reports_every_critical_module_in_order() -> None:
    result = run_checks("supervisor")
    assert isinstance(result, SelfCheckResult)
    assert result.process == "supervisor"
    assert [r.module for r in result.reports] == list(CRITICAL_MODULES)
    assert [r.distribution for r in result.reports] == list(CRITICAL_MODULES.values())
    assert result.problems == tuple(p for r in result.reports for p in r.problems)
    assert result.ok is (not result.problems)


def test_run_checks_with_driver_version(tmp_path: Path) -> None:
    pytest.importorskip("pynvml")
    binding = importlib.metadata.version(PYNVML_DIST)
    result = run_checks("worker", {"pynvml": PYNVML_DIST}, driver_version="580.159.04")
    expected = check_binding_against_driver(binding, "580.159.04")
    assert list(result.notes) + [p for p in result.problems if "bindings" in p] == expected
    bad = run_checks("worker", {"pynvml": PYNVML_DIST}, driver_version="580.x")
    assert any("'580.x'" in p for p in bad.problems)


def test_critical_modules_table() -> None:
    assert dict(CRITICAL_MODULES) == {
        "exporter": "nvgpu-exporter",
        "guards": "nvgpu-exporter",
        "pynvml": "nvidia-ml-py",
        "prometheus_client": "prometheus-client",
        "aiohttp": "aiohttp",
        "psutil": "psutil",
    }


# --- binding vs driver --------------------------------------------------------------------------


def test_575_bindings_on_580_driver() -> None:
    assert check_binding_against_driver("12.575.51", "580.159.04") == [
        "bindings generated for branch 575 on a 580 driver: functions and field ids added since "
        "575 are missing, field ids 251-253 changed meaning in 580"
    ]


def test_535_bindings_on_580_driver() -> None:
    (problem,) = check_binding_against_driver("12.535.161", "580.126.20")
    assert problem.startswith("bindings generated for branch 535 on a 580 driver")
    assert "251-253" not in problem
    assert problem.endswith("functions and field ids added since 535 are missing")


@pytest.mark.parametrize(
    ("binding", "driver"),
    [("13.580.82", "580.159.04"), ("13.580.126", "580.126.20"), ("12.535.161.post1", "535.104.05")],
)
def test_same_branch_is_clean(binding: str, driver: str) -> None:
    assert check_binding_against_driver(binding, driver) == []


def test_newer_bindings_give_a_note() -> None:
    (note,) = check_binding_against_driver("13.615.71", "580.159.04")
    assert note.startswith(NOTE_PREFIX + "bindings generated for branch 615 on a 580 driver")
    assert "FUNCTION_NOT_FOUND" in note
    (note575,) = check_binding_against_driver("13.580.82", "575.57.08")
    assert note575.startswith(NOTE_PREFIX)
    assert "251-253" in note575


@pytest.mark.parametrize(
    ("binding", "driver", "named"),
    [
        ("twelve", "580.159.04", "'twelve'"),
        ("12", "580.159.04", "'12'"),
        ("12.575.51", "580.159.04-custom", "'580.159.04-custom'"),
        ("12.575.51", "", "''"),
    ],
)
def test_bad_version_strings_raise_naming_the_input(binding: str, driver: str, named: str) -> None:
    with pytest.raises(ValueError) as info:
        check_binding_against_driver(binding, driver)
    assert named in str(info.value)


# --- process struct ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("driver", "affected"),
    [
        ("535.43.02", True),
        ("535.54.03", True),
        ("535.86.10", True),
        ("535.98", True),
        ("535.104.05", False),
        ("535.42.9", False),
        ("530.30.02", False),
        ("580.159.04", False),
    ],
)
def test_process_struct_mismatch_is_named_for_early_535_drivers(driver: str, affected: bool) -> None:
    found = check_process_struct("12.535.161", driver)
    assert bool(found) is affected
    if affected:
        (problem,) = found
        assert problem.startswith("process struct mismatch: driver " + driver)
        assert "nvidia-ml-py 12.535.161" in problem and "_v3" in problem and "535.104.05" in problem


def test_run_checks_names_the_process_struct_mismatch() -> None:
    pytest.importorskip("pynvml")
    result = run_checks("worker", {"pynvml": PYNVML_DIST}, driver_version="535.86.10")
    assert [p for p in result.problems if p.startswith("process struct mismatch")]
    clean = run_checks("worker", {"pynvml": PYNVML_DIST}, driver_version="580.159.04")
    assert not [p for p in clean.problems if "process struct" in p]
