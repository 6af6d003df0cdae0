"""The native library self-check: which ``libnvidia-ml.so`` the worker mapped, and whose it is.

The Python self-check (:mod:`guards.versions`) proves which ``pynvml`` ran; this proves which NVML
library it loaded, the way the crash incident was settled by reading the pod's ``/proc/1/maps``.
The worker reads its own ``/proc/self/maps`` (the mapped file, and ``(deleted)`` when the file was
replaced on disk since) and ``/proc/self/mountinfo`` (whether the file comes from the container
image or is bind-mounted from the host, as the NVIDIA container toolkit mounts each host driver
library), and compares three versions: the library file's (its name,
``libnvidia-ml.so.580.95.05``), NVML's own (``nvmlSystemGetNVMLVersion``, ``13.580.95.05``: CUDA
major, then the driver version) and the loaded kernel module's (``/proc/driver/nvidia/version``).

Which side moved decides the owner:

- the library is the image's (it lies on the container's root file system or in a Python
  package) and its version differs from the kernel module: the image bundles its own NVML; the
  fix is the image (fault domain ``exporter``);
- the library is the host's and differs from the kernel module (or was replaced on disk under the
  running worker): the host driver was upgraded under a loaded module; only a driver reload or a
  reboot cures it (fault domain ``driver``).

Standard library only: the worker gathers (:func:`inspect`), both processes read the result.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from exporter.common import fileio

LIBRARY = "libnvidia-ml.so"
PROC_MAPS = "/proc/self/maps"
PROC_MOUNTINFO = "/proc/self/mountinfo"
PROC_VIEW_MAX_BYTES = 4 << 20  # /proc/self/maps or mountinfo: a few hundred KiB in a busy pod
# Where a host driver's libnvidia-ml.so is found from inside a pod: the distribution's library
# directories (the NVIDIA container toolkit mounts the host's files there), GKE's /usr/local/nvidia,
# and the GPU operator's driver container root (/run/nvidia/driver).
HOST_LIBRARY_GLOBS = (
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.*",
    "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.*",
    "/usr/lib64/libnvidia-ml.so.*",
    "/usr/local/nvidia/lib64/libnvidia-ml.so.*",
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.*",
    "/run/nvidia/driver/usr/lib64/libnvidia-ml.so.*",
)
# File systems a container's root is built from: a file on one of them came with the image.
IMAGE_FILESYSTEMS = frozenset({"overlay", "aufs", "fuse-overlayfs", "zfs-overlay"})
_VERSION_IN_NAME = re.compile(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)*)$")
_PYTHON_TREE = re.compile(r"/(site|dist)-packages/")

ORIGINS = ("host", "image", "unknown", "none")
"""``host``: bind-mounted from outside the image; ``image``: part of the container image (or a
Python package); ``unknown``: no mount table to tell; ``none``: no library mapped."""
STATES = ("ok", "image_library", "driver_upgraded", "library_missing", "unknown")
"""The check's finding: ``ok``; ``image_library``: the library is not the host's (the image bundles
one) while the host's is visible or the versions differ; ``driver_upgraded``: the host's library
differs from the loaded kernel module (or was replaced on disk under the worker);
``library_missing``: no NVML library could be loaded although a kernel module is loaded;
``unknown``: nothing to compare (no kernel module visible, no library mapped, no GPU node)."""


@dataclass(frozen=True)
class ProcView:
    """What the worker reads about itself, injectable (the fake backend presents its own).

    Attributes:
        maps: the text of ``/proc/self/maps`` ("" if unreadable).
        mountinfo: the text of ``/proc/self/mountinfo`` ("" if unreadable).
        host_libraries: ``libnvidia-ml.so.<version>`` files found at :data:`HOST_LIBRARY_GLOBS`.
    """

    maps: str
    mountinfo: str
    host_libraries: tuple[str, ...] = ()


@dataclass(frozen=True)
class NativeLibrary:
    """The native library check's result (sent in the worker's ``hello``, ``init_failed`` and
    ``native`` messages).

    Attributes:
        path: the mapped ``libnvidia-ml.so`` file as ``/proc/self/maps`` names it, "" if none.
        realpath: the same with symbolic links resolved.
        deleted: the mapped file was replaced or removed on disk since it was mapped.
        file_version: the version in the file's name, "" if it has none.
        nvml_version: ``nvmlSystemGetNVMLVersion``, "" if NVML did not answer.
        kernel_module_version: ``/proc/driver/nvidia/version``'s module version, "" if none.
        origin: one of :data:`ORIGINS`.
        evidence: why the origin and state were decided, in words.
        host_libraries: host driver libraries visible to the worker.
        state: one of :data:`STATES`.
        message: what to do, in one line ("" when ``ok``).
    """

    path: str = ""
    realpath: str = ""
    deleted: bool = False
    file_version: str = ""
    nvml_version: str = ""
    kernel_module_version: str = ""
    origin: str = "none"
    evidence: str = ""
    host_libraries: tuple[str, ...] = field(default_factory=tuple)
    state: str = "unknown"
    message: str = ""

    @property
    def library_version(self) -> str:
        """The library's driver version: from its file name, else from NVML's version (its CUDA
        major dropped: ``13.580.95.05`` -> ``580.95.05``)."""
        if self.file_version:
            return self.file_version
        return nvml_driver_part(self.nvml_version)

    @property
    def problem(self) -> bool:
        """The state is a fault (``image_library``, ``driver_upgraded``, ``library_missing``)."""
        return self.state not in ("ok", "unknown")

    @property
    def refused_by_strict(self) -> bool:
        """``NVGPU_SELFCHECK=strict`` refuses it: the library is the image's while the host's is visible."""
        return self.origin == "image" and bool(self.host_libraries)

    @property
    def domain(self) -> str:
        """The fault domain the state belongs to: ``exporter``, ``driver`` or "" (none)."""
        return {"image_library": "exporter", "library_missing": "exporter", "driver_upgraded": "driver"}.get(
            self.state, ""
        )


def describe(lib: NativeLibrary) -> str:
    """One line: the library, its origin and versions, the state and what to do."""
    head = (
        f"libnvidia-ml {lib.library_version or '?'} at {lib.realpath or lib.path or 'none'} ({lib.origin}"
        f"{', replaced on disk' if lib.deleted else ''}); kernel module {lib.kernel_module_version or 'none'}; "
        f"NVML {lib.nvml_version or '?'}: {lib.state}"
    )
    return head + (f": {lib.message}" if lib.message else "")


def nvml_driver_part(nvml_version: str) -> str:
    """``13.580.95.05`` -> ``580.95.05`` (NVML prefixes the CUDA major); other forms unchanged."""
    parts = nvml_version.split(".")
    return ".".join(parts[1:]) if len(parts) >= 3 else nvml_version


def mapped_library(maps: str) -> tuple[str, bool]:
    """The ``libnvidia-ml.so`` file in ``/proc/self/maps`` text: (path, deleted); ("", False) if none.

    A maps line is ``address perms offset dev inode pathname``; a file replaced since it was mapped
    ends in `` (deleted)`` (proc(5)).
    """
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        deleted = path.endswith(" (deleted)")
        if deleted:
            path = path[: -len(" (deleted)")]
        if LIBRARY in path.rsplit("/", 1)[-1]:
            return path, deleted
    return "", False


@dataclass(frozen=True)
class Mount:
    """One ``/proc/self/mountinfo`` line's mount point, root in its source file system, and type."""

    mount_point: str
    root: str
    fstype: str


def mounts(mountinfo: str) -> list[Mount]:
    """Parse ``/proc/self/mountinfo`` (proc(5): ``id parent maj:min root mountpoint opts [optional...] -
    fstype source superopts``); lines that do not fit are skipped. Octal escapes (``\\040``) decoded."""
    out = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if len(fields) < sep + 2 or len(fields) < 5:
            continue
        out.append(Mount(_unescape(fields[4]), _unescape(fields[3]), fields[sep + 1]))
    return out


def _unescape(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def mount_of(path: str, table: Iterable[Mount]) -> Mount | None:
    """The mount a path lies on: the longest mount point that is the path or a directory above it
    (the last such mount wins when several stack on one point)."""
    best: Mount | None = None
    for m in table:
        point = m.mount_point.rstrip("/") or "/"
        if path == point or point == "/" or path.startswith(point + "/"):
            if best is None or len(point) >= len(best.mount_point.rstrip("/") or "/"):
                best = m
    return best


def origin_of(realpath: str, mountinfo: str) -> tuple[str, str]:
    """(origin, evidence) of a library file from the mount table (see :data:`ORIGINS`)."""
    if not realpath:
        return "none", "no libnvidia-ml.so is mapped"
    if _PYTHON_TREE.search(realpath):
        return "image", f"{realpath} lies inside a Python package tree, shipped with the image"
    table = mounts(mountinfo)
    if not table:
        return "unknown", "no mount table to tell the image's files from the host's"
    m = mount_of(realpath, table)
    if m is None:
        return "unknown", f"{realpath} lies on no mount of the mount table"
    if m.mount_point == "/" and m.fstype in IMAGE_FILESYSTEMS:
        return "image", f"{realpath} lies on the container's root file system ({m.fstype}): it came with the image"
    if m.mount_point == "/":
        return "host", f"{realpath} lies on a root file system of type {m.fstype}, not a container image"
    return "host", f"{realpath} is on a mount at {m.mount_point} ({m.fstype}, {m.root} of its source): from the host"


def inspect(
    view: ProcView,
    kernel_module_version: str,
    nvml_version: str,
    resolve: Callable[[str], str] = lambda p: p,
    init_error: str = "",
) -> NativeLibrary:
    """The check, from what the worker read about itself.

    Args:
        view: ``/proc/self/maps``, ``/proc/self/mountinfo`` and the host libraries found.
        kernel_module_version: the loaded module's version, "" if none is loaded.
        nvml_version: ``nvmlSystemGetNVMLVersion``'s answer, "" if NVML did not answer.
        resolve: symbolic links -> file (``os.path.realpath`` for the real process).
        init_error: the NVML error name of a failed ``nvmlInit`` ("" if it succeeded).

    Returns:
        The :class:`NativeLibrary` with its state and the line that says what to do.
    """
    path, deleted = mapped_library(view.maps)
    real = resolve(path) if path else ""
    origin, evidence = origin_of(real, view.mountinfo)
    lib = NativeLibrary(
        path=path,
        realpath=real,
        deleted=deleted,
        file_version=file_version(real) or file_version(path),
        nvml_version=nvml_version,
        kernel_module_version=kernel_module_version,
        origin=origin,
        evidence=evidence,
        host_libraries=tuple(h for h in view.host_libraries if h not in (path, real)),
    )
    state, message = _judge(lib, init_error)
    return NativeLibrary(**{**lib.__dict__, "state": state, "message": message})


def _judge(lib: NativeLibrary, init_error: str) -> tuple[str, str]:
    kernel, version = lib.kernel_module_version, lib.library_version
    others = [h for h in lib.host_libraries if h != lib.realpath]
    if not lib.path:
        if kernel and init_error == "LIBRARY_NOT_FOUND":
            return "library_missing", (
                f"no libnvidia-ml.so could be loaded although kernel module {kernel} is loaded: mount the host "
                f"driver's libnvidia-ml.so.{kernel} into the pod (runtimeClassName nvidia / the NVIDIA container "
                "toolkit, or a hostPath of the driver's library directory)"
            )
        return "unknown", ""
    if lib.origin == "image" and ((kernel and version and version != kernel) or others):
        versions = f"version {version or '?'} against kernel module {kernel or '?'}"
        host = f"; the host's is visible at {others[0]}" if others else ""
        return "image_library", (
            f"the exporter runs on {lib.realpath} from its own image ({versions}){host}: fix the image (remove the "
            "bundled libnvidia-ml.so, let the NVIDIA container toolkit mount the host's)"
        )
    if not kernel or not version:
        return "unknown", ""
    if version != kernel:
        return "driver_upgraded", (
            f"the host's NVML library {lib.realpath} is {version} but the loaded kernel module is {kernel}: the host "
            "driver was upgraded under a running node; reload the NVIDIA driver or reboot the node (restarting the "
            "exporter does not help)"
        )
    newer = [h for h in others if file_version(h) not in ("", kernel)]
    if lib.deleted and newer:
        return "driver_upgraded", (
            f"{lib.path} was replaced on disk under the running worker and the host now has {newer[0]} while the "
            f"loaded kernel module is {kernel}: the host driver was upgraded under a running node; new CUDA "
            "processes fail until the NVIDIA driver is reloaded or the node rebooted"
        )
    return "ok", ""


def file_version(path: str) -> str:
    """The version in a library file's name (``libnvidia-ml.so.580.95.05`` -> ``580.95.05``), "" if none."""
    m = _VERSION_IN_NAME.search(path)
    return m.group(1) if m else ""


def read_proc_view(
    maps_path: str = PROC_MAPS, mountinfo_path: str = PROC_MOUNTINFO, globs: Iterable[str] = HOST_LIBRARY_GLOBS
) -> ProcView:
    """The real process's view of itself (unreadable files read as ""; each opened without
    blocking and read whole up to 4 MiB, :func:`exporter.common.fileio.read_bytes`: a table cut
    short would name the wrong mount, so a larger one reads as "" too)."""
    import glob

    def text(path: str) -> str:
        try:
            return fileio.read_bytes(path, PROC_VIEW_MAX_BYTES).decode("utf-8", "replace")
        except fileio.FileRefused:
            return ""

    found = sorted({p for g in globs for p in glob.glob(g) if _VERSION_IN_NAME.search(p)})
    return ProcView(text(maps_path), text(mountinfo_path), tuple(found))
