"""Install the NVLink throughput guard next to the installed nvitop.

Copies ``nvitop_nvlink_guard.py`` and ``nvitop_nvlink_guard.pth`` (from this script's directory)
into the site-packages directory that holds the ``nvitop`` distribution, and byte-compiles the
module so that a read-only image does not compile it at every start. The Dockerfile runs this;
so does ``tests/test_nvitop_fix.py``, with the interpreter of a fresh virtual environment.

Usage: ``python install_guard.py [--site-dir DIR]``. Exit status 0 on success, 1 when nvitop is
not installed or its directory is not one of this interpreter's site directories (a ``.pth`` file
anywhere else is never read).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import py_compile
import shutil
import site
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = ("nvitop_nvlink_guard.py", "nvitop_nvlink_guard.pth")


def site_dirs() -> list[str]:
    """Return the real paths of the directories whose ``.pth`` files this interpreter reads."""
    dirs: list[str] = []
    getsitepackages = getattr(site, "getsitepackages", None)  # absent in old virtualenvs
    if getsitepackages is not None:
        dirs.extend(getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    paths = sysconfig.get_paths()
    dirs.extend([paths["purelib"], paths["platlib"]])
    seen: list[str] = []
    for entry in dirs:
        real = os.path.realpath(entry)
        if real not in seen:
            seen.append(real)
    return seen


def nvitop_site_dir() -> str:
    """Return the site directory that holds the installed ``nvitop`` distribution.

    Raises:
        importlib.metadata.PackageNotFoundError: nvitop is not installed.
    """
    dist = importlib.metadata.distribution("nvitop")
    return os.path.realpath(str(dist.locate_file("")))


def main(argv: list[str] | None = None) -> int:
    """Copy the guard files; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site-dir", help="target directory (default: where nvitop is installed)")
    args = parser.parse_args(argv)

    if args.site_dir:
        target = os.path.realpath(args.site_dir)
    else:
        try:
            target = nvitop_site_dir()
        except importlib.metadata.PackageNotFoundError:
            print("install_guard: nvitop is not installed for", sys.executable, file=sys.stderr)
            return 1
    if target not in site_dirs():
        print(
            f"install_guard: {target} is not a site directory of {sys.executable} "
            f"({', '.join(site_dirs())}); a .pth file there would never be read",
            file=sys.stderr,
        )
        return 1
    for name in FILES:
        dest = os.path.join(target, name)
        shutil.copyfile(os.path.join(HERE, name), dest)
        os.chmod(dest, 0o644)
        print(f"install_guard: installed {dest}")
    py_compile.compile(
        os.path.join(target, FILES[0]),
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
