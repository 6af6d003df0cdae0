"""Machine checks: what this machine would refuse at run time, said before anything starts.

:meth:`exporter.config.Config.from_env` checks each value on its own; these check the values
against the machine (without taking the port or writing the state file), for ``--check-config``
and the start-up log, beside :mod:`exporter.common.selfcheck`, which checks the imported modules.
"""

from __future__ import annotations

import errno
import os
import socket
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exporter.config import Config

__all__ = ["environment_problems", "state_file_problem"]


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
    return problems


def state_file_problem(path: str) -> str | None:
    """Why the quarantine state file could not be written, or None ("" path: memory only, fine)."""
    if not path:
        return None
    target = os.path.abspath(path)
    if os.path.isdir(target):
        return "is a directory"
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
