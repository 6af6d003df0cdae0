"""Machine checks: what this machine would refuse at run time, said before anything starts.

:meth:`exporter.config.Config.from_env` checks each value on its own; these check the values
against the machine (without taking the port or writing the state file), for ``--check-config``
and the start-up log, beside :mod:`exporter.common.selfcheck`, which checks the imported modules.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import tempfile
from typing import TYPE_CHECKING

from exporter.common import fileio

if TYPE_CHECKING:
    from exporter.config import Config

__all__ = ["environment_problems", "kernel_log_problems", "state_file_problem"]


def environment_problems(config: Config) -> list[str]:
    """What this machine would refuse at run time, for ``--check-config`` (and the start-up log).

    Parsing (:meth:`exporter.config.Config.from_env`) checks values; this checks them against the machine, without
    taking the port or writing the state file: every listen address must be one of this machine's
    (a bind to port 0), and the state file's directory must take a new file (a temporary file is
    created there and removed; a missing directory is judged by the nearest existing parent).

    Returns:
        One line per problem, each naming the variable; empty when all is well.
    """
    problems = []
    for host, port in config.listen_addresses:
        if not host:
            continue
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
        except OSError as exc:
            what = "is not an address of this machine" if exc.errno == errno.EADDRNOTAVAIL else "cannot be bound"
            problems.append(f"NVGPU_LISTEN_ADDRESS={host}:{port}: {host} {what} ({exc.strerror or exc})")
    why = state_file_problem(config.state_file)
    if why:
        problems.append(
            f"NVGPU_STATE_FILE={config.state_file}: {why}; a quarantine would not survive a restart "
            "(mount a writable volume there, e.g. an emptyDir, or set NVGPU_STATE_FILE='' to keep it in memory)"
        )
    problems.extend(kernel_log_problems(config))
    return problems


def kernel_log_problems(config: Config) -> list[str]:
    """What is wrong with the kernel log and its cursor when ``kernel_xid`` is on: the log must
    be ``/dev/kmsg`` (character device 1:11) or a regular text file, the cursor (when it exists) a
    regular file. A missing kernel log is not a problem (the feature is then unsupported, said at
    run time). Answered within :data:`exporter.common.fileio.DEFAULT_DEADLINE_S`."""
    from guards.features import Mode
    from guards.featuretable import FEATURES

    mode = config.feature_modes.get("kernel_xid", Mode.AUTO)
    if mode == Mode.OFF or (mode == Mode.AUTO and not FEATURES["kernel_xid"].default):
        return []
    cursor = config.kmsg_cursor_file or (
        os.path.join(os.path.dirname(config.state_file), "kmsg-cursor.json") if config.state_file else ""
    )
    named = "NVGPU_KMSG_CURSOR_FILE" if config.kmsg_cursor_file else "the kernel-log cursor (next to NVGPU_STATE_FILE)"

    def look() -> list[str]:
        out = []
        why = _kind_problem(config.kmsg_path, (fileio.KMSG_DEVICE,))
        if why:
            out.append(f"NVGPU_KMSG_PATH={config.kmsg_path}: {why}; expected /dev/kmsg or a regular text file")
        why = _kind_problem(cursor, ()) if cursor else None
        if why:
            out.append(
                f"{named} {cursor}: {why}; remove it (it is rewritten) or point NVGPU_KMSG_CURSOR_FILE elsewhere"
            )
        return out

    try:
        return fileio.default_runner().call(look, deadline_s=fileio.DEFAULT_DEADLINE_S)
    except fileio.TimedOut:
        return [f"NVGPU_KMSG_PATH={config.kmsg_path}: no answer within {fileio.DEFAULT_DEADLINE_S:g} s (a hung mount?)"]


def _kind_problem(path: str, devices: tuple[tuple[int, int], ...]) -> str | None:
    """Why ``path`` (when it exists) is not a regular file or one of ``devices``, else None."""
    try:
        fd, _st = fileio.open_checked(path, 1 << 62, devices=devices)
    except fileio.FileRefused as exc:
        return None if exc.errno in (errno.ENOENT, errno.EACCES, errno.EPERM) else exc.detail
    os.close(fd)
    return None


def state_file_problem(path: str) -> str | None:
    """Why the quarantine state file could not be used, or None ("" path: memory only, fine).

    A path that exists must be a regular file (a FIFO would hang whoever opens it; a device node
    such as ``/dev/null`` would be replaced by a JSON file at the first quarantine: memory only is
    ``NVGPU_STATE_FILE=''``), and its directory must take a new file. Answered within
    :data:`exporter.common.fileio.DEFAULT_DEADLINE_S` (a directory on a hung mount is a problem,
    not a wait).
    """
    if not path:
        return None
    try:
        return fileio.default_runner().call(_state_file_problem, path, deadline_s=fileio.DEFAULT_DEADLINE_S)
    except fileio.TimedOut:
        return f"no answer within {fileio.DEFAULT_DEADLINE_S:g} s (a hung mount?)"


def _state_file_problem(path: str) -> str | None:
    target = os.path.abspath(path)
    try:
        st = os.lstat(target)
    except (FileNotFoundError, NotADirectoryError):  # judged by its directory below
        pass
    except (OSError, ValueError) as exc:
        return f"cannot be looked at ({getattr(exc, 'strerror', None) or exc})"
    else:
        if stat.S_ISDIR(st.st_mode):
            return "is a directory"
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            return f"is {fileio.describe_stat(st)}, not a regular file (it would never be written)"
        if stat.S_ISLNK(st.st_mode):
            try:
                fd, _st = fileio.open_checked(target, 1 << 20)
                os.close(fd)
            except fileio.FileRefused as exc:
                if exc.errno != errno.ENOENT:  # a dangling link is replaced by the first save
                    return f"{exc.detail} (it is a symbolic link)"
    directory = os.path.dirname(target)
    probe = directory
    while not os.path.isdir(probe):
        if os.path.exists(probe):
            return f"{probe} is not a directory"
        probe = os.path.dirname(probe)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".nvgpu-check-", dir=probe)
    except OSError as exc:
        return f"{probe} does not take new files ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(tmp)
    return None
