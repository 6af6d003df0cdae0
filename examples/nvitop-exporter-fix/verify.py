"""Check what ``python -m nvitop_exporter`` would really import here, not what ``pip show`` says.

In the incident an upgrade reported done by ``pip show`` never ran: the image's working directory
held an old copy of the package, and ``python -m`` put that directory first on ``sys.path``. This
script imports the modules the same way, from the current working directory, and prints for each
one the ``__version__`` and ``__file__`` of the module actually imported and the installed
distribution's version. It fails (exit status 1) when:

- a module cannot be imported;
- a module's file is not inside this interpreter's site-packages (a copy in the working directory
  or in an earlier ``sys.path`` entry shadows the installed one), naming the file;
- a module's file is not one of its distribution's installed files (e.g. ``pynvml`` not from
  ``nvidia-ml-py``), or the module's ``__version__`` differs from the distribution's version;
- a version is below the expected minimum;
- the NVLink throughput guard is not in the expected state (by default: the state that
  ``NVITOP_NVLINK_THROUGHPUT_GUARD`` asks for, i.e. active unless it is ``off``).

Minimums come from flags or environment variables (flag wins):
``--min-nvitop`` / ``NVITOP_FIX_MIN_NVITOP`` (default 1.7.1: the first release with the atexit
shutdown fix), ``--min-nvitop-exporter`` / ``NVITOP_FIX_MIN_NVITOP_EXPORTER`` (1.7.1),
``--min-nvidia-ml-py`` / ``NVITOP_FIX_MIN_NVIDIA_ML_PY`` (13.580.65: the first binding generated
for the 580 driver branch). ``--expect-guard on|off|auto`` / ``NVITOP_FIX_EXPECT_GUARD``.

Run it where the exporter runs: at image build time (the Dockerfile does) and inside the pod:
``kubectl exec POD -- python /opt/nvitop-fix/verify.py``. Exit status: 0 all good, 1 a check
failed, 2 bad usage. It does not initialise NVML.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import re
import site
import sys
import sysconfig
from typing import Any

GUARD_ENV = "NVITOP_NVLINK_THROUGHPUT_GUARD"

# module -> distribution that must own its file
MODULES: tuple[tuple[str, str | None], ...] = (
    ("nvitop", "nvitop"),
    ("nvitop_exporter", "nvitop-exporter"),
    ("pynvml", "nvidia-ml-py"),
    ("nvitop_nvlink_guard", None),
)
DEFAULT_MINIMUMS = {"nvitop": "1.7.1", "nvitop-exporter": "1.7.1", "nvidia-ml-py": "13.580.65"}


def emulate_python_m_path() -> None:
    """Make ``sys.path[0]`` what ``python -m nvitop_exporter`` started here would have.

    Running ``python verify.py`` puts the script's directory first; ``python -m`` puts the current
    working directory first instead, unless ``-P`` / ``PYTHONSAFEPATH`` (3.11+) is in effect.
    """
    script_dir = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.realpath(sys.path[0] or ".") == os.path.realpath(script_dir):
        del sys.path[0]
    if not getattr(sys.flags, "safe_path", False):
        sys.path.insert(0, os.getcwd())


def release(version: str) -> tuple[int, ...]:
    """Return the numeric release part of a version string (``"1.7.2.dev3"`` -> ``(1, 7, 2)``).

    Raises:
        ValueError: the string does not start with a number.
    """
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if match is None:
        raise ValueError(f"cannot parse version {version!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def at_least(version: str, minimum: str) -> bool:
    """Compare release parts, padding the shorter one with zeros."""
    have, want = release(version), release(minimum)
    width = max(len(have), len(want))
    return have + (0,) * (width - len(have)) >= want + (0,) * (width - len(want))


def site_dirs() -> list[str]:
    """Return the real paths of this interpreter's site-packages directories."""
    dirs: list[str] = []
    getsitepackages = getattr(site, "getsitepackages", None)
    if getsitepackages is not None:
        dirs.extend(getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    paths = sysconfig.get_paths()
    dirs.extend([paths["purelib"], paths["platlib"]])
    out: list[str] = []
    for entry in dirs:
        real = os.path.realpath(entry)
        if real not in out:
            out.append(real)
    return out


def inside(path: str, directory: str) -> bool:
    """True when ``path`` lies under ``directory`` (both real paths)."""
    try:
        return os.path.commonpath([path, directory]) == directory
    except ValueError:  # different drives
        return False


def check_module(name: str, dist_name: str | None, sites: list[str]) -> dict[str, Any]:
    """Import ``name`` and describe it: file, versions, ownership, and problems found."""
    info: dict[str, Any] = {"module": name, "distribution": dist_name, "problems": []}
    problems: list[str] = info["problems"]
    info["file"] = info["version"] = None
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - report any import failure, e.g. a broken copy
        problems.append(f"cannot import {name}: {type(exc).__name__}: {exc}")
    else:
        file = getattr(module, "__file__", None)
        info["file"] = os.path.realpath(file) if file else None
        info["version"] = getattr(module, "__version__", None)
        if info["file"] is None:
            problems.append(f"{name} has no __file__ (namespace package?): not the installed one")
        elif not any(inside(info["file"], d) for d in sites):
            problems.append(
                f"{name} was imported from {info['file']}, outside site-packages "
                f"({', '.join(sites)}): a copy in the working directory or an earlier sys.path "
                "entry shadows the installed package; remove it or change the working directory"
            )
    if dist_name is None:
        return info
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        problems.append(f"distribution {dist_name} is not installed")
        return info
    info["dist_version"] = dist.version
    if info["file"] is not None:
        owned = {os.path.realpath(str(dist.locate_file(f))) for f in dist.files or ()}
        if info["file"] not in owned:
            problems.append(f"{info['file']} is not a file of the installed {dist_name} {dist.version}")
    if info["version"] is not None and info["version"] != dist.version:
        problems.append(f"{name}.__version__ is {info['version']} but {dist_name} {dist.version} is installed")
    return info


def check_guard(expect: str) -> dict[str, Any]:
    """Describe the NVLink throughput guard in this process and compare it with ``expect``.

    Args:
        expect: ``on``, ``off``, or ``auto`` (what the environment variable asks for).
    """
    info: dict[str, Any] = {"problems": [], "env": os.environ.get(GUARD_ENV)}
    problems: list[str] = info["problems"]
    guard = sys.modules.get("nvitop_nvlink_guard")
    if guard is None:
        info["state"] = "not loaded"
        wanted = "on" if expect == "auto" else expect
        if wanted == "on":
            problems.append(
                "the guard module was not loaded at interpreter start: "
                "nvitop_nvlink_guard.pth is missing from site-packages (or python ran with -S)"
            )
        return info
    state = guard.STATE
    wanted = expect if expect != "auto" else ("on" if state.enabled else "off")
    device_module = sys.modules.get("nvitop.api.device")
    device_cls = getattr(device_module, "Device", None)
    guarded: list[str] = []
    unguarded: list[str] = []
    if device_cls is not None:
        for method in guard.GUARDED_METHODS:
            if hasattr(device_cls, method):
                target = guarded if guard.is_guarded(getattr(device_cls, method)) else unguarded
                target.append(method)
    info.update(
        enabled=state.enabled,
        invalid_env=state.invalid,
        guarded=guarded,
        unguarded=unguarded,
        error=state.error,
    )
    if device_cls is None:
        info["state"] = "unknown (nvitop.Device not importable)"
        problems.append("cannot check the guard: nvitop.Device was not imported")
    elif "nvlink_throughput" in guarded and not unguarded:
        info["state"] = "active"
    elif not guarded:
        info["state"] = "off" if not state.enabled else "NOT ACTIVE"
    else:
        info["state"] = "partial"
    if device_cls is not None and wanted == "on" and info["state"] != "active":
        detail = f" ({state.error})" if state.error else ""
        problems.append(f"guard expected on but is {info['state']}{detail}; unguarded: {', '.join(unguarded)}")
    if device_cls is not None and wanted == "off" and guarded:
        problems.append(f"guard expected off but patched: {', '.join(guarded)}")
    if state.invalid:
        problems.append(f"{GUARD_ENV}={info['env']!r} is invalid (use on or off); guard kept on")
    return info


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse flags; defaults come from the environment."""
    env = os.environ
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-nvitop", default=env.get("NVITOP_FIX_MIN_NVITOP", DEFAULT_MINIMUMS["nvitop"]))
    parser.add_argument(
        "--min-nvitop-exporter",
        default=env.get("NVITOP_FIX_MIN_NVITOP_EXPORTER", DEFAULT_MINIMUMS["nvitop-exporter"]),
    )
    parser.add_argument(
        "--min-nvidia-ml-py",
        default=env.get("NVITOP_FIX_MIN_NVIDIA_ML_PY", DEFAULT_MINIMUMS["nvidia-ml-py"]),
    )
    parser.add_argument(
        "--expect-guard",
        choices=("on", "off", "auto"),
        default=env.get("NVITOP_FIX_EXPECT_GUARD", "auto"),
        help="auto: whatever NVITOP_NVLINK_THROUGHPUT_GUARD asks for (default)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.expect_guard not in ("on", "off", "auto"):
        parser.error(f"NVITOP_FIX_EXPECT_GUARD={args.expect_guard!r}: use on, off or auto")
    for flag in ("min_nvitop", "min_nvitop_exporter", "min_nvidia_ml_py"):
        try:
            release(getattr(args, flag))
        except ValueError as exc:
            parser.error(f"--{flag.replace('_', '-')}: {exc}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run every check, print the report, and return the exit status."""
    args = parse_args(argv)
    emulate_python_m_path()
    sites = site_dirs()
    minimums = {
        "nvitop": args.min_nvitop,
        "nvitop-exporter": args.min_nvitop_exporter,
        "nvidia-ml-py": args.min_nvidia_ml_py,
    }
    modules = [check_module(name, dist, sites) for name, dist in MODULES]
    for info in modules:
        dist = info["distribution"]
        minimum = minimums.get(dist or "")
        for key in ("version", "dist_version"):
            value = info.get(key)
            if minimum is None or value is None:
                continue
            try:
                ok = at_least(value, minimum)
            except ValueError as exc:
                info["problems"].append(f"{info['module']}: {exc}")
                continue
            if not ok:
                what = f"{info['module']}.__version__" if key == "version" else dist
                info["problems"].append(f"{what} {value} is below the expected minimum {minimum} ({info['file']})")
    guard = check_guard(args.expect_guard)
    problems = [p for info in modules for p in info["problems"]] + guard["problems"]
    report = {
        "python": sys.executable,
        "python_version": sys.version.split()[0],
        "cwd": os.getcwd(),
        "sys_path_0": sys.path[0] if sys.path else None,
        "site_packages": sites,
        "modules": modules,
        "guard": guard,
        "minimums": minimums,
        "ok": not problems,
        "problems": problems,
    }
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print_text(report)
    return 0 if not problems else 1


def print_text(report: dict[str, Any]) -> None:
    """Print the report for a person; problems go to stderr as well."""
    print(f"python:              {report['python']} ({report['python_version']})")
    print(f"working directory:   {report['cwd']}")
    print(f"sys.path[0]:         {report['sys_path_0']}")
    print(f"site-packages:       {', '.join(report['site_packages'])}")
    for info in report["modules"]:
        version = info.get("version") or "-"
        dist = info["distribution"]
        owner = f"  [{dist} {info.get('dist_version', 'not installed')}]" if dist else ""
        print(f"{info['module'] + ':':<21}{version:<10} {info.get('file')}{owner}")
    guard = report["guard"]
    detail = f" ({len(guard.get('guarded', []))} methods patched)" if guard.get("guarded") else ""
    env = guard["env"]
    print(f"nvlink guard:        {guard['state']}{detail}; {GUARD_ENV}={env!r}")
    if report["ok"]:
        print("verify: OK")
        return
    for problem in report["problems"]:
        print(f"verify: FAIL: {problem}", file=sys.stderr)
    print(f"verify: FAILED ({len(report['problems'])} problem(s))")


if __name__ == "__main__":
    sys.exit(main())
