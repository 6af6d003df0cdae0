"""What ``--version`` prints: version, revision, branch and build date, as the Prometheus exporters do.

prometheus/common's ``version.Print`` writes ``<program>, version <v> (branch: <b>, revision: <r>)``
and then ``build user``, ``build date``, ``go version``, ``platform`` and ``tags`` lines; this is the
same shape with ``python version`` for ``go version``. The revision and the date are baked at
build time: the release recipe (``release/release.py build``) and the image build (the Dockerfile's
``REVISION`` and ``CREATED`` arguments) write :data:`FILE` into the package before the wheel is
made. Run from a git checkout (an editable install) without that file, the revision and branch are
read from ``.git`` (``HEAD`` and the ref it names, loose or packed: a few small files, no ``git``
process); what cannot be known is ``unknown``. Standard library only.
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

from exporter import __version__

__all__ = ["FILE", "BuildInfo", "read", "version_text", "write"]

PACKAGE = Path(__file__).resolve().parent
FILE = PACKAGE / "build_info.json"  # not in git (.gitignore): written by a build, shipped in the wheel
UNKNOWN = "unknown"


@dataclass(frozen=True)
class BuildInfo:
    """Where this copy of the exporter came from.

    Attributes:
        version: ``exporter.__version__``.
        revision: the git commit it was built from, or ``unknown``.
        branch: the git branch, or ``unknown`` (``HEAD`` for a detached checkout).
        date: when it was built (RFC 3339), or ``unknown``.
        user: who built it, or ``unknown``.
    """

    version: str = __version__
    revision: str = UNKNOWN
    branch: str = UNKNOWN
    date: str = UNKNOWN
    user: str = UNKNOWN


def write(revision: str, date: str, branch: str = UNKNOWN, user: str = UNKNOWN, target: Path = FILE) -> None:
    """Bake the build's revision and date into the package (before the wheel is built)."""
    target.write_text(
        json.dumps({"revision": revision, "branch": branch, "date": date, "user": user}, indent=2) + "\n",
        encoding="utf-8",
    )


def read(package: Path = PACKAGE) -> BuildInfo:
    """The baked :data:`FILE`, else what a git checkout around ``package`` says, else ``unknown``."""
    baked = package / FILE.name
    try:
        data = json.loads(baked.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if isinstance(data, dict):
        fields = {k: str(data[k]) for k in ("revision", "branch", "date", "user") if data.get(k)}
        return BuildInfo(**fields)
    revision, branch = _git(package.parent)
    return BuildInfo(revision=revision, branch=branch)


def _git(root: Path) -> tuple[str, str]:
    """(revision, branch) of the checkout at ``root``, read from its files; ``unknown`` where not."""
    gitdir = root / ".git"
    try:
        if gitdir.is_file():  # a worktree or submodule: "gitdir: <path>"
            text = gitdir.read_text(encoding="utf-8").strip()
            if not text.startswith("gitdir:"):
                return UNKNOWN, UNKNOWN
            gitdir = (root / text[len("gitdir:") :].strip()).resolve()
        head = (gitdir / "HEAD").read_text(encoding="utf-8").strip()
    except OSError:
        return UNKNOWN, UNKNOWN
    if not head.startswith("ref:"):
        return (head if _is_sha(head) else UNKNOWN), "HEAD"
    ref = head[len("ref:") :].strip()
    branch = ref.removeprefix("refs/heads/")
    common = gitdir
    try:
        common = (gitdir / (gitdir / "commondir").read_text(encoding="utf-8").strip()).resolve()
    except OSError:
        pass
    for where in dict.fromkeys((gitdir, common)):
        try:
            sha = (where / ref).read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if _is_sha(sha):
            return sha, branch
    try:
        packed = (common / "packed-refs").read_text(encoding="utf-8")
    except OSError:
        return UNKNOWN, branch
    for line in packed.splitlines():
        sha, _, name = line.partition(" ")
        if name == ref and _is_sha(sha):
            return sha, branch
    return UNKNOWN, branch


def _is_sha(text: str) -> bool:
    return len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text)


def version_text(info: BuildInfo | None = None, program: str = "nvgpu-exporter") -> str:
    """The ``--version`` text (no trailing newline)."""
    info = info or read()
    machine = platform.machine().lower().replace("x86_64", "amd64").replace("aarch64", "arm64")
    return "\n".join(
        (
            f"{program}, version {info.version} (branch: {info.branch}, revision: {info.revision})",
            f"  build user:       {info.user}",
            f"  build date:       {info.date}",
            f"  python version:   {platform.python_version()} ({sys.implementation.name})",
            f"  platform:         {sys.platform}/{machine or UNKNOWN}",
            f"  package:          {PACKAGE}",
        )
    )
