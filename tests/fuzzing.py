"""Shared by the property tests (``tests/test_fuzz_*.py``): Hypothesis profiles, a memory
bound, and JSON strategies that reach the corners parsers trip on.

Profiles (``HYPOTHESIS_PROFILE``): ``ci`` (default) keeps each property test to a few seconds on a
2-core machine, derandomized so a CI run is reproducible; ``long`` tries many more examples with
random seeds, for a soak run (``HYPOTHESIS_PROFILE=long python -m pytest -q tests/test_fuzz_*.py``,
recorded in docs/reliability.md). Neither writes an example database into the checkout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import tracemalloc
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

settings.register_profile(
    "ci",
    max_examples=150,
    deadline=None,  # no timed tests: a loaded CI machine must not fail a correct parser
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "long",
    max_examples=20_000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

MEMORY_LIMIT = 32 << 20


@contextlib.contextmanager
def bounded_memory(limit: int = MEMORY_LIMIT) -> Iterator[None]:
    """Fails when the Python allocations made inside exceed ``limit`` bytes at their peak."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1] - base
        assert peak < limit, f"peak allocation {peak} bytes, bound {limit}"
    finally:
        if started:
            tracemalloc.stop()


# Numbers where parsers break: huge integers (no float holds them), non-finite floats (JSON's
# NaN/Infinity extensions), negative zero, the 2**63 boundary, booleans (ints in Python).
NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.sampled_from([0, -1, 2**63 - 1, 2**63, 2**64, 10**308, 10**400, True, False]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e300, -1e300, 1e17, 5e-324, -0.0]),
)
TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", "\x00", "\udc80", "\n", "NaN", "Infinity", "1e400", "null", "../../etc/passwd"]),
)
SCALARS = st.one_of(st.none(), NUMBERS, TEXT)
JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(TEXT, inner, max_size=5)),
    max_leaves=25,
)
# Files that are not JSON at all, or JSON past the decoder's recursion limit.
HOSTILE_TEXT = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda n: b"[" * n, st.integers(min_value=900, max_value=50_000)),
    st.builds(lambda n: b'{"a":' * n, st.integers(min_value=900, max_value=20_000)),
    st.sampled_from([b"", b"\xff\xfe{}", b"{", b"NaN", b'{"version": 1, "history": [[1e400, "fan", "f"]]}']),
)


# -- kinds of file at a path a setting names ----------------------------------------------------------

# What an operator's path can turn out to be. "unreadable" is a file of mode 000 for an unprivileged
# user; root reads any mode, so there it is a path through a regular file (ENOTDIR), which no
# process can open either. "huge" is sparse: a terabyte that takes no disk.
FILE_KINDS = (
    "regular",
    "fifo",
    "device",
    "symlink_loop",
    "directory",
    "huge",
    "unreadable",
    "socket",
    "dangling_link",
    "missing",
)
file_kinds = st.sampled_from(FILE_KINDS)


def make_file_kind(directory: Any, kind: str, content: bytes = b"", name: str = "f") -> str:
    """A path of ``kind`` under ``directory`` (a ``pathlib.Path``), holding ``content`` when regular.

    The caller removes ``directory``; a socket's listener is closed at once (its path stays a socket).
    """
    import socket

    path = directory / name
    if kind == "regular":
        path.write_bytes(content)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":  # like /dev/zero (1:5): never runs dry, a reader that trusts it reads forever
        if os.geteuid() != 0:
            return "/dev/zero"  # nobody but root could replace it by mistake
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # root: a node of our own, not the machine's
    elif kind == "symlink_loop":
        os.symlink(path, path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":
        with open(path, "wb") as fh:
            fh.truncate(1 << 40)
    elif kind == "unreadable":
        path.write_bytes(content)
        if os.geteuid() == 0:
            return str(path / "inside")
        path.chmod(0)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(str(path))
    elif kind == "dangling_link":
        os.symlink(directory / "nowhere", path)
    else:
        assert kind == "missing", kind
    return str(path)


# -- signals from outside -----------------------------------------------------------------------------

# What ends a running exporter from outside, and when within a window it arrives.
STOP_SIGNALS = st.sampled_from(["SIGTERM", "SIGINT"])
signal_delays = st.floats(min_value=0.0, max_value=2.0, allow_nan=False)


# -- how a worker dies ---------------------------------------------------------------------------------

SELF_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL", "SIGFPE")  # a process's own fault
OUTSIDE_SIGNALS = ("SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGPIPE", "SIGALRM")


@st.composite
def worker_deaths(draw: Any) -> dict[str, Any]:
    """One worker death as the supervisor sees it: the return code (a signal, negative, or an exit
    code), and what it knows besides: it killed the worker for its deadline, it was stopping it, the
    kernel's OOM-kill count rose across the death. ``origin`` is who really ended it (``self``, a
    fault; ``outside``; ``oom_killer``, always SIGKILL; ``supervisor``; ``exit``)."""
    origin = draw(st.sampled_from(["self", "outside", "oom_killer", "supervisor", "exit"]))
    if origin == "self":
        returncode = -int(getattr(signal, draw(st.sampled_from(SELF_SIGNALS))))
    elif origin == "outside":
        returncode = -int(getattr(signal, draw(st.sampled_from(OUTSIDE_SIGNALS))))
    elif origin == "oom_killer":
        returncode = -int(signal.SIGKILL)
    elif origin == "supervisor":
        returncode = -int(draw(st.sampled_from([signal.SIGTERM, signal.SIGKILL])))
    else:
        returncode = draw(st.integers(min_value=0, max_value=255))
    supervisor = origin == "supervisor"
    return {
        "origin": origin,
        "returncode": returncode,
        "deadline_kill": supervisor and draw(st.booleans()),
        "stopping": supervisor or draw(st.booleans()) and origin == "exit",
        # an unrelated OOM kill elsewhere in the cgroup may coincide with any death
        "oom_rose": origin == "oom_killer" or draw(st.booleans()),
    }
