"""Self-check of the modules a process actually imported, and of the binding against the driver.

Incident (docs/design.md, "Why it exists"): an upgrade that ``pip show`` reported as done was
not what ran, because the image's working directory held an old copy of the package and Python
imported that one (``python -c`` and ``python -m`` put the current directory first on
``sys.path``). Installed-package metadata alone cannot see this; only the running module's
``__file__`` and ``__version__`` tell the truth. So for each critical module this module compares
what the process imported (or would import) with what the distribution says it installed:

* the module's file and ``__version__``;
* the distribution's version and whether the file is one of the distribution's installed files
  (``RECORD``), editable installs included (PEP 610 ``direct_url.json``, ``.pth`` path entries,
  setuptools' ``__editable___*_finder.py`` mappings);
* shadowing: a file outside the distribution, in the current directory or in a ``sys.path`` entry
  that comes before the distribution's location;
* distributions known to install the same top-level module (``pynvml`` from gpuopenanalytics).

Everything here returns data; ``exporter/common/selfcheck.py`` turns it into logs, metrics and exit codes.
Standard library only, like the whole package.

Sources: docs/design.md ("Self-check"); nvidia-ml-py's version scheme (PyPI nvidia-ml-py); the
deprecated ``pynvml`` distribution (gpuopenanalytics/pynvml, whose 12.0 depends on nvidia-ml-py);
binding/driver compatibility (NVIDIA/go-nvml README: the latest bindings work with any
``libnvidia-ml.so``, newer functions answer FUNCTION_NOT_FOUND); PEP 610, PEP 660.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from urllib.parse import unquote, urlparse

from guards.known_issues import parse_release, parse_version

__all__ = [
    "CRITICAL_MODULES",
    "NOTE_PREFIX",
    "ModuleReport",
    "SelfCheckResult",
    "check_binding_against_driver",
    "check_process_struct",
    "inspect_module",
    "run_checks",
]

CRITICAL_MODULES: Mapping[str, str] = MappingProxyType(
    {
        "exporter": "nvgpu-exporter",
        "guards": "nvgpu-exporter",
        "pynvml": "nvidia-ml-py",
        "prometheus_client": "prometheus-client",
        "aiohttp": "aiohttp",
        "psutil": "psutil",
    }
)
"""Top-level module -> the distribution that must provide it."""

NOTE_PREFIX = "note: "
"""Prefix of informational findings of `check_binding_against_driver` (not failures)."""

# Module -> other distributions that install the same top-level module, with the advice.
# The gpuopenanalytics `pynvml` distribution is deprecated (its 13.0.1 says so) and, like
# nvidia-ml-py, installs a top-level `pynvml`; which one wins depends on install order.
_CONFLICTING_DISTRIBUTIONS: Mapping[str, tuple[tuple[str, str], ...]] = MappingProxyType(
    {
        "pynvml": (
            (
                "pynvml",
                "both pynvml and nvidia-ml-py install a top-level pynvml; keep only nvidia-ml-py",
            ),
        ),
    }
)

# Binding branches whose field-id constants 251-253 are the clock-event-reason durations, while
# 580+ drivers (and 13.580.82+ bindings) serve power-smoothing fields there (nvidia-ml-py 12.575.51
# against 13.580.82; measured on 580.159.04: 251-268 power smoothing, 269-271 the durations).
_RENUMBERED_FIELDS_SINCE = 580
_OLD_FIELD_NUMBERING_FROM = 575

# Drivers that write a 32-byte nvmlProcessInfo_v3_t (with usedGpuCcProtectedMemory) through the
# _v3 process-list calls without a version bump, while nvidia-ml-py reads 24-byte records:
# 535.43.02 up to (not including) 535.104.05 (XuehaiPan/nvitop PRs #79, #89 and #94).
_PROCESS_STRUCT_32_BYTES_FROM = (535, 43)
_PROCESS_STRUCT_32_BYTES_UNTIL = (535, 104)


@dataclass(frozen=True)
class ModuleReport:
    """What one module is in this process, compared with its distribution.

    Attributes:
        module: Top-level module name, e.g. ``"pynvml"``.
        imported: True when the module was already in ``sys.modules`` (what runs); False when
            it was located with ``importlib.util.find_spec`` without importing it (what would
            be imported now).
        path: Absolute path of the module's file (``__init__.py`` for a package), or ``None``
            when it has none or cannot be found.
        version: The module's ``__version__`` (only for imported modules that have one).
        distribution: The distribution that must provide the module, e.g. ``"nvidia-ml-py"``.
        distribution_version: Its installed version per ``importlib.metadata``; ``None`` when
            not installed.
        file_in_distribution: True when ``path`` is one of the distribution's installed files
            or lies in its editable project; False when not; ``None`` when unknown (not
            installed, no file, or no ``RECORD``).
        shadowed_by: ``path`` when that file shadows the installed distribution (outside its
            files, in the current directory or an earlier ``sys.path`` entry); else ``None``.
        problems: Human messages, empty when the module is healthy.
    """

    module: str
    imported: bool
    path: str | None
    version: str | None
    distribution: str
    distribution_version: str | None
    file_in_distribution: bool | None
    shadowed_by: str | None
    problems: tuple[str, ...]


@dataclass(frozen=True)
class SelfCheckResult:
    """Self-check of one process.

    Attributes:
        process: Which process ran the check, e.g. ``"supervisor"`` or ``"worker"``.
        reports: One `ModuleReport` per checked module, in the order given.
        problems: Every failure, module problems first, then binding-vs-driver problems.
        notes: Informational findings that are not failures (binding newer than the driver).
    """

    process: str
    reports: tuple[ModuleReport, ...]
    problems: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when there is no problem (notes do not count)."""
        return not self.problems


def _realpath(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def _cwd() -> str | None:
    try:
        return _realpath(os.getcwd())
    except OSError:  # the working directory was removed
        return None


def _is_within(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives (Windows) or mixed relative/absolute
        return False


def _path_entry(module: str, path: str) -> str:
    """Return the sys.path entry a module file was found under (``X`` for ``X/pkg/__init__.py``)."""
    entry = os.path.dirname(path)
    if os.path.basename(path).split(".")[0] == "__init__":
        entry = os.path.dirname(entry)
    for _ in range(module.count(".")):
        entry = os.path.dirname(entry)
    return entry


def _sys_path_index(directory: str) -> int | None:
    cwd = _cwd()
    for index, raw in enumerate(sys.path):
        if not isinstance(raw, (str, os.PathLike)):
            continue
        entry = os.fspath(raw)
        if entry == "":
            if cwd == directory:
                return index
            continue
        if _realpath(entry) == directory:
            return index
    return None


def _locate(name: str) -> tuple[bool, str | None, str | None, list[str]]:
    """Return ``(imported, path, __version__, problems)`` without importing ``name``."""
    problems: list[str] = []
    module = sys.modules.get(name)
    if module is not None:
        file = getattr(module, "__file__", None)
        raw_version = getattr(module, "__version__", None)
        version = None if raw_version is None else str(raw_version)
        path = os.path.abspath(file) if isinstance(file, str) else None
        return True, path, version, problems
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        problems.append(f"module {name} cannot be located: {exc}")
        return False, None, None, problems
    if spec is None:
        problems.append(f"module {name} is not importable: no such module on sys.path")
        return False, None, None, problems
    if spec.has_location and spec.origin is not None:
        return False, os.path.abspath(spec.origin), None, problems
    return False, None, None, problems


def _file_in_files(dist: importlib.metadata.Distribution, path: str) -> bool | None:
    files = dist.files
    if files is None:
        return None
    target = _realpath(path)
    base = os.path.basename(path)
    for item in files:
        if item.name == base and _realpath(os.fspath(item.locate())) == target:
            return True
    return False


def _pth_directories(text: str, site_dir: str) -> list[str]:
    # Same rules as site.addpackage: skip comments and import lines, join relative entries.
    directories = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or line.startswith(("import ", "import\t")):
            continue
        directories.append(os.path.join(site_dir, line))
    return directories


def _finder_mapping(text: str) -> list[str]:
    # setuptools >= 64 editable finder: `MAPPING: dict[str, str] = {'pkg': '/project/pkg'}`.
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if not any(isinstance(t, ast.Name) and t.id == "MAPPING" for t in targets):
            continue
        try:
            mapping = ast.literal_eval(value)
        except ValueError:
            return []
        if isinstance(mapping, dict):
            return [v for v in mapping.values() if isinstance(v, str)]
    return []


def _editable_roots(dist: importlib.metadata.Distribution) -> tuple[str, ...]:
    """Directories whose files belong to ``dist`` through an editable install."""
    roots: list[str] = []
    direct_url = dist.read_text("direct_url.json")
    if direct_url:
        try:
            info = json.loads(direct_url)
        except json.JSONDecodeError:
            info = None
        if isinstance(info, dict):
            dir_info, url = info.get("dir_info"), info.get("url")
            if (
                isinstance(dir_info, dict)
                and dir_info.get("editable") is True
                and isinstance(url, str)
                and url.startswith("file:")
            ):
                roots.append(unquote(urlparse(url).path))
    for item in dist.files or ():
        is_pth = item.suffix == ".pth"
        is_finder = item.name.startswith("__editable__") and item.name.endswith("_finder.py")
        if not (is_pth or is_finder):
            continue
        item_path = os.fspath(item.locate())
        try:
            with open(item_path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError):
            continue
        if is_finder:
            roots.extend(_finder_mapping(text))
            continue
        site_dir = _realpath(os.path.dirname(item_path))
        for directory in _pth_directories(text, site_dir):
            # A .pth entry at or above its own site directory (".", "/", or a project that
            # holds the virtualenv) would claim every installed file; direct_url.json covers
            # the project case for PEP 660 installs.
            if not _is_within(site_dir, _realpath(directory)):
                roots.append(directory)
    return tuple(_realpath(root) for root in roots)


def _same_version(module_version: str, dist_version: str) -> bool:
    if module_version.strip() == dist_version.strip():
        return True
    try:
        left, right = parse_version(module_version), parse_version(dist_version)
    except ValueError:
        return False
    width = max(len(left), len(right))
    return left + (0,) * (width - len(left)) == right + (0,) * (width - len(right))


def _installed(distribution: str) -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def inspect_module(name: str, distribution: str) -> ModuleReport:
    """Compare one module of this process with the distribution that must provide it.

    A module already in ``sys.modules`` is inspected as imported (its ``__file__`` and
    ``__version__``); otherwise it is located with ``importlib.util.find_spec`` and NOT imported
    (for a dotted name, ``find_spec`` imports the parent package).

    Problems reported (each a human message naming the module):

    * the module cannot be found;
    * the distribution is not installed;
    * shadowing: the file is not one of the distribution's files and lives in the current
      working directory or in a ``sys.path`` entry before the distribution's location:
      ``"module X imported from <path>, which shadows <dist> <ver> installed at <location>"``;
    * the file is not one of the distribution's files (without shadowing evidence);
    * ``__version__`` differs from the installed distribution version (a stale copy);
    * a conflicting distribution is installed (``pynvml`` next to ``nvidia-ml-py``).

    Args:
        name: Top-level module name, e.g. ``"pynvml"``.
        distribution: Distribution that must provide it, e.g. ``"nvidia-ml-py"``.

    Returns:
        The `ModuleReport`; never raises for a missing or broken installation (that is a
        problem in the report).
    """
    imported, path, version, problems = _locate(name)
    verb = "imported from" if imported else "would be imported from"
    dist = _installed(distribution)
    dist_version: str | None = None
    file_in_distribution: bool | None = None
    shadowed_by: str | None = None
    if dist is None:
        where = f"; module {verb} {path}" if path else ""
        problems.append(f"module {name}: distribution {distribution} is not installed{where}")
    else:
        dist_version = dist.version or None
        location = _realpath(str(dist.locate_file("")))
        if path is not None:
            file_in_distribution = _file_in_files(dist, path)
            if file_in_distribution is not True:
                target = _realpath(path)
                if any(_is_within(target, root) for root in _editable_roots(dist)):
                    file_in_distribution = True
        if path is not None and file_in_distribution is not True:
            entry = _realpath(_path_entry(name, path))
            entry_index = _sys_path_index(entry)
            location_index = _sys_path_index(location)
            in_cwd = entry == _cwd()
            before = entry_index is not None and (location_index is None or entry_index < location_index)
            if file_in_distribution is None and entry == location:
                pass  # no RECORD to check, but it sits where the distribution is installed
            elif in_cwd or before:
                shadowed_by = path
                problems.append(
                    f"module {name} {verb} {path}, which shadows {distribution} {dist_version} installed at {location}"
                )
            elif file_in_distribution is False:
                problems.append(
                    f"module {name} {verb} {path}, which is not a file of {distribution} "
                    f"{dist_version} (installed at {location})"
                )
        if version is not None and dist_version is not None:
            if not _same_version(version, dist_version):
                problems.append(
                    f"module {name} has __version__ {version} but the installed {distribution} "
                    f"is {dist_version}: the imported copy ({path}) is stale or from another "
                    "installation"
                )
    for other, advice in _CONFLICTING_DISTRIBUTIONS.get(name, ()):
        if other == distribution:
            continue
        conflict = _installed(other)
        if conflict is not None:
            conflict_location = _realpath(str(conflict.locate_file("")))
            problems.append(f"{advice} ({other} {conflict.version} is installed at {conflict_location})")
    return ModuleReport(
        module=name,
        imported=imported,
        path=path,
        version=version,
        distribution=distribution,
        distribution_version=dist_version,
        file_in_distribution=file_in_distribution,
        shadowed_by=shadowed_by,
        problems=tuple(problems),
    )


def check_binding_against_driver(binding_version: str, driver_version: str) -> list[str]:
    """Compare the nvidia-ml-py binding's driver branch with the running driver's branch.

    nvidia-ml-py versions are ``<CUDA major>.<driver branch>.<minor>`` of the NVML header they
    were generated from (``12.575.51``, ``13.580.82``); driver versions are
    ``<branch>.<minor>.<patch>`` (``580.159.04``).

    Args:
        binding_version: Installed nvidia-ml-py version (PEP 440 suffixes are tolerated).
        driver_version: ``nvmlSystemGetDriverVersion()``.

    Returns:
        ``[]`` when the branches are equal. A problem when the binding's branch is older
        (missing functions and field ids; for 575-era bindings on a 580+ driver also the
        renumbered field ids 251-253). One informational message
        starting with `NOTE_PREFIX` when the binding is newer (new functions answer
        FUNCTION_NOT_FOUND, new field ids INVALID_ARGUMENT; §8.3): supported, not a failure.

    Raises:
        ValueError: Either string is not a version of the expected form; the message names it.
    """
    binding = parse_release(binding_version)
    if len(binding) < 2:
        raise ValueError(
            f"nvidia-ml-py version {binding_version!r} is not <cuda major>.<driver branch>"
            "[.<minor>] (expected e.g. '12.575.51')"
        )
    binding_branch, driver_branch = binding[1], parse_version(driver_version)[0]
    prefix = f"bindings generated for branch {binding_branch} on a {driver_branch} driver: "
    if binding_branch < driver_branch:
        message = prefix + f"functions and field ids added since {binding_branch} are missing"
        if _OLD_FIELD_NUMBERING_FROM <= binding_branch < _RENUMBERED_FIELDS_SINCE <= driver_branch:
            message += f", field ids 251-253 changed meaning in {_RENUMBERED_FIELDS_SINCE}"
        return [message]
    if binding_branch > driver_branch:
        message = (
            NOTE_PREFIX + prefix + f"functions added after {driver_branch} may answer FUNCTION_NOT_FOUND and newer "
            "field ids INVALID_ARGUMENT"
        )
        if _OLD_FIELD_NUMBERING_FROM <= driver_branch < _RENUMBERED_FIELDS_SINCE <= binding_branch:
            message += (
                f"; field ids 251-253 follow the {_RENUMBERED_FIELDS_SINCE} numbering in these "
                f"bindings, not the driver's"
            )
        return [message]
    return []


def check_process_struct(binding_version: str, driver_version: str) -> list[str]:
    """Name the process-record struct mismatch between nvidia-ml-py and drivers 535.43-535.103.

    Those drivers write 32-byte records through ``nvmlDeviceGet{Compute,Graphics,MPSCompute}
    RunningProcesses_v3``; nvidia-ml-py decodes 24-byte ones, so from the second record on pid
    and memory come from the wrong offsets (pids 0 and 4294967295, memory read from a pid).

    Args:
        binding_version: installed nvidia-ml-py version (only named in the message).
        driver_version: ``nvmlSystemGetDriverVersion()``.

    Returns:
        ``[problem]`` for an affected driver, else ``[]``.

    Raises:
        ValueError: ``driver_version`` is not a dotted numeric version; the message names it.
    """
    driver = parse_version(driver_version)
    if not (_PROCESS_STRUCT_32_BYTES_FROM <= driver[:2] < _PROCESS_STRUCT_32_BYTES_UNTIL):
        return []
    return [
        f"process struct mismatch: driver {driver_version} writes 32-byte process records through "
        f"nvmlDeviceGet*RunningProcesses_v3 while nvidia-ml-py {binding_version} reads 24-byte ones, so pid "
        "and memory scramble from the second record on (drivers 535.43 up to 535.104.05); the exporter "
        "drops implausible records and reads _v2 instead (nvgpu_nvml_api_info); "
        "upgrade the driver to 535.104.05 or later"
    ]


def run_checks(
    process: str,
    modules: Mapping[str, str] = CRITICAL_MODULES,
    *,
    driver_version: str | None = None,
) -> SelfCheckResult:
    """Run the self-check of this process.

    Args:
        process: Name of the process for reports and metrics (``"supervisor"``, ``"worker"``).
        modules: Module -> distribution to check; defaults to `CRITICAL_MODULES`.
        driver_version: ``nvmlSystemGetDriverVersion()`` when known (worker, after init); the
            installed nvidia-ml-py version is then checked against it with
            `check_binding_against_driver`.

    Returns:
        `SelfCheckResult` with one report per module (in ``modules`` order), every problem,
        and informational notes. Never raises: unparseable versions become problems.
    """
    reports = tuple(inspect_module(name, dist) for name, dist in modules.items())
    problems = [problem for report in reports for problem in report.problems]
    notes: list[str] = []
    if driver_version is not None:
        binding = next((r.distribution_version for r in reports if r.distribution == "nvidia-ml-py"), None)
        if binding is None:
            installed = _installed("nvidia-ml-py")
            binding = installed.version if installed is not None else None
        if binding is None:
            problems.append(f"cannot compare the binding with driver {driver_version}: nvidia-ml-py is not installed")
        else:
            try:
                findings = check_binding_against_driver(binding, driver_version)
                findings += check_process_struct(binding, driver_version)
            except ValueError as exc:
                findings = [str(exc)]
            for finding in findings:
                (notes if finding.startswith(NOTE_PREFIX) else problems).append(finding)
    return SelfCheckResult(process=process, reports=reports, problems=tuple(problems), notes=tuple(notes))
