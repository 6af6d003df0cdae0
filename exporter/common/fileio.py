"""Files an operator names: opened without blocking, checked, bounded, and read with a deadline.

Every file the exporter reads because a setting names it (the web config and the certificates,
keys and client CA it names, the state file, the kernel log and its cursor, a scenario) and the
``/proc`` files of other processes go through here:

- :func:`read_bytes` opens with ``O_NONBLOCK`` (``open(2)`` of a FIFO then returns at once instead
  of waiting for a writer), checks with ``fstat`` that it opened a regular file (or one of the
  character devices the caller names, such as ``/dev/kmsg``, char 1:11 in the kernel's
  ``Documentation/admin-guide/devices.txt``), and reads at most ``max_bytes`` (``/proc`` files
  report size 0, so the bound is on what is read, not on ``st_size`` alone). Anything else is a
  :class:`FileRefused` naming the path and what it is: a FIFO, a directory, a device node, a
  socket, a symbolic-link loop, too large.
- ``O_NONBLOCK`` does not help where the kernel itself waits: ``open``, ``stat`` or ``read`` on a
  hung NFS or FUSE mount sleep uninterruptibly. :class:`Runner` runs such calls on its own daemon
  thread and waits for them at most a deadline; a thread still stuck then is abandoned (never
  joined, so neither the event loop nor SIGTERM waits for it) and counted, and a new thread takes
  the next call. :func:`read_file` is :func:`read_bytes` through a runner.

Failures are counted per input and reason in :data:`FAILURES` (the supervisor exports them as
``nvgpu_file_read_failures_total``); the caller keeps its previous good state and logs once.

Standard library only (the scenario check and the worker use it).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import errno
import os
import stat
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

__all__ = [
    "FAILURES",
    "KMSG_DEVICE",
    "REASONS",
    "FileRefused",
    "Runner",
    "TimedOut",
    "count_failure",
    "describe_kind",
    "describe_stat",
    "open_checked",
    "read_bytes",
    "read_file",
]

T = TypeVar("T")

# /dev/kmsg: character device 1:11 (Linux Documentation/admin-guide/devices.txt, "Memory devices").
KMSG_DEVICE: Final = (1, 11)
DEFAULT_DEADLINE_S: Final = 5.0
# Why a file was refused: not a regular file (or an allowed device), larger than the bound, no
# answer within the deadline (a hung mount), any other error (missing, permission, a NUL in the path).
REASONS: Final = ("not_regular", "too_large", "timeout", "error")

_lock = threading.Lock()
FAILURES: collections.Counter[tuple[str, str]] = collections.Counter()
"""(input, reason) -> failures of this process since it started (see :func:`count_failure`)."""


class FileRefused(Exception):
    """A file that cannot be used as it stands.

    Attributes:
        path: the path as given.
        reason: one of :data:`REASONS`.
        detail: what is wrong, in words (``is a FIFO, not a regular file``).
        errno: the OS error number when opening failed, else None.
    """

    def __init__(self, path: str, reason: str, detail: str, err: int | None = None) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.reason = reason
        self.detail = detail
        self.errno = err


class TimedOut(Exception):
    """A call through a :class:`Runner` did not return within its deadline (it was abandoned)."""


def count_failure(input_name: str, exc: BaseException) -> None:
    """Count one failure of ``input_name`` (``web_config``, ``state_file`` …) by its reason: the
    ``reason`` attribute of ``exc`` when it is one of :data:`REASONS` (:class:`FileRefused`), else
    ``timeout`` for :class:`TimedOut` and ``error`` for the rest."""
    reason = getattr(exc, "reason", None)
    if reason not in REASONS:
        reason = "timeout" if isinstance(exc, TimedOut) else "error"
    with _lock:
        FAILURES[(input_name, reason)] += 1


def describe_kind(mode: int) -> str:
    """What a file of ``st_mode`` is, in words: ``a FIFO``, ``a directory`` …"""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def describe_stat(st: os.stat_result) -> str:
    """What ``st`` is, with the device numbers of a device node: ``a character device 1:3``."""
    what = describe_kind(st.st_mode)
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        what += f" {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    return what


def _open_error(path: str, exc: OSError) -> FileRefused:
    if exc.errno == errno.ELOOP:
        return FileRefused(path, "error", "too many levels of symbolic links (a link loop?)")
    if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing without a reader
        return FileRefused(path, "not_regular", "is not a regular file (a socket?)")
    if exc.errno == errno.ENOENT:
        return FileRefused(path, "error", "does not exist", exc.errno)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return FileRefused(path, "error", "is not readable by this user", exc.errno)
    return FileRefused(path, "error", f"cannot be opened: {exc.strerror or exc}", exc.errno)


def open_checked(
    path: str, max_bytes: int, *, devices: Collection[tuple[int, int]] = (), follow: bool = True
) -> tuple[int, os.stat_result]:
    """Open ``path`` read-only without blocking on a FIFO and check what it is.

    Args:
        path: the file.
        max_bytes: a regular file larger than this is refused.
        devices: (major, minor) of character devices accepted besides regular files.
        follow: follow a symbolic link at the last component (False: ``O_NOFOLLOW``).

    Returns:
        (descriptor, its ``fstat``); the caller closes the descriptor. It is non-blocking.

    Raises:
        FileRefused: cannot be opened, is not a regular file (nor one of ``devices``), or is
            larger than ``max_bytes``.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except ValueError:  # a NUL in the path
        raise FileRefused(path, "error", "the path holds a NUL byte") from None
    except OSError as exc:
        raise _open_error(path, exc) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            if st.st_size > max_bytes:
                raise FileRefused(path, "too_large", f"is {st.st_size} bytes, larger than {max_bytes}")
        elif stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) in devices:
            pass
        else:
            raise FileRefused(path, "not_regular", f"is {describe_stat(st)}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_bytes(path: str, max_bytes: int, *, follow: bool = True) -> bytes:
    """The content of the regular file ``path``, at most ``max_bytes`` (in the caller's thread).

    Raises:
        FileRefused: see :func:`open_checked`; also when more than ``max_bytes`` can be read (a
            ``/proc`` file reports size 0) or a read fails.
    """
    fd, _st = open_checked(path, max_bytes, follow=follow)
    try:
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            try:
                chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            except BlockingIOError:  # not for a regular file; say so rather than spin
                raise FileRefused(path, "not_regular", "would block on read") from None
            except OSError as exc:
                raise FileRefused(path, "error", f"read failed: {exc.strerror or exc}") from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise FileRefused(path, "too_large", f"holds more than {max_bytes} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


# -- calls with a deadline -----------------------------------------------------------------------


@dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: concurrent.futures.Future[Any]
    deadline_s: float | None


@dataclass(eq=False)
class _Worker:
    thread: threading.Thread | None = None
    job: _Job | None = None
    started: float = 0.0
    abandoned: bool = False
    jobs: collections.deque[_Job] = field(default_factory=collections.deque)


class Runner:
    """Runs blocking calls one at a time on a daemon thread of its own, each within a deadline.

    A call that has run longer than its deadline when its caller gives up (or when the next call
    is submitted) is abandoned: its future fails with :class:`TimedOut`, its thread is left to
    finish on its own (it is a daemon: never joined, it holds up neither the event loop nor the
    end of the process), and a new thread takes the calls that follow. At most ``max_stuck``
    abandoned threads may be stuck at once; past that, calls fail at once with
    :class:`TimedOut` until one comes back.

    Args:
        name: thread name, and the start of every :class:`TimedOut` message.
        deadline_s: default deadline of a call; None: calls are never abandoned (bcrypt: slow,
            but never stuck).
        max_stuck: abandoned threads allowed at once.
        clock: monotonic clock.

    Attributes:
        abandoned: calls abandoned since the runner was made.
    """

    def __init__(
        self,
        name: str,
        deadline_s: float | None = DEFAULT_DEADLINE_S,
        max_stuck: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.deadline_s = deadline_s
        self.max_stuck = max_stuck
        self.clock = clock
        self.abandoned = 0
        self._stuck = 0
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._worker: _Worker | None = None

    @property
    def stuck(self) -> int:
        """Abandoned threads still inside their call."""
        return self._stuck

    def submit(self, fn: Callable[..., T], *args: Any, deadline_s: float | None = None) -> concurrent.futures.Future[T]:
        """Queue ``fn(*args)``; never blocks. The future fails with :class:`TimedOut` when the call
        is abandoned or too many threads are stuck."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        job = _Job(fn, args, future, self.deadline_s if deadline_s is None else deadline_s)
        with self._lock:
            self._expire_locked()
            worker = self._worker
            if worker is None:
                if self._stuck >= self.max_stuck:
                    future.set_exception(TimedOut(f"{self.name}: {self._stuck} earlier calls are still stuck"))
                    return future
                worker = self._start_locked()
            worker.jobs.append(job)
            self._wake.notify_all()
        return future

    def write_behind(self, fn: Callable[..., Any], *args: Any, wait: bool | None = None) -> str | None:
        """Queue the write ``fn(*args)`` (it reports its own failures) and, when ``wait`` (None: when
        not called on an event loop, which must never wait on a file), wait for it at most the
        deadline. Returns why it did not end in time (it goes on, or not, on its own thread), else None.
        """
        if wait is None:
            wait = not on_event_loop()
        future = self.submit(fn, *args)
        if not wait:
            return None
        try:
            future.result(timeout=self.deadline_s)
        except Exception:  # noqa: BLE001 - a timeout: the write goes on (or not) on its own thread
            self.give_up(future)
            within = "in time" if self.deadline_s is None else f"within {self.deadline_s:g} s"
            return f"no answer {within} (a hung mount?)"
        return None

    def call(self, fn: Callable[..., T], *args: Any, deadline_s: float | None = None) -> T:
        """``fn(*args)`` on the runner's thread; waits at most the deadline.

        Raises:
            TimedOut: no answer within the deadline (the call is abandoned), or too many stuck.
            Exception: whatever ``fn`` raised.
        """
        limit = self.deadline_s if deadline_s is None else deadline_s
        future = self.submit(fn, *args, deadline_s=limit)
        try:
            return future.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            self.give_up(future)
            raise TimedOut(f"{self.name}: no answer within {limit:g} s") from None

    async def acall(self, fn: Callable[..., T], *args: Any, deadline_s: float | None = None) -> T:
        """:meth:`call` for the event loop: awaits the call without blocking the loop."""
        import asyncio  # the supervisor's; the worker calls through call() only

        limit = self.deadline_s if deadline_s is None else deadline_s
        future = self.submit(fn, *args, deadline_s=limit)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), limit)
        except asyncio.TimeoutError:
            self.give_up(future)
            raise TimedOut(f"{self.name}: no answer within {limit:g} s") from None

    def give_up(self, future: concurrent.futures.Future[Any]) -> None:
        """The caller stops waiting for ``future``: cancel it if it has not started, abandon its
        thread if it is running."""
        if future.cancel():
            return
        with self._lock:
            worker = self._worker
            if worker is not None and worker.job is not None and worker.job.future is future:
                self._abandon_locked(worker)

    # -- the thread ---------------------------------------------------------------------------

    def _start_locked(self) -> _Worker:
        worker = _Worker()
        thread = threading.Thread(target=self._loop, args=(worker,), name=self.name, daemon=True)
        worker.thread = thread
        self._worker = worker
        thread.start()
        return worker

    def _expire_locked(self) -> None:
        worker = self._worker
        if worker is None or worker.job is None or worker.job.deadline_s is None:
            return
        if self.clock() - worker.started > worker.job.deadline_s:
            self._abandon_locked(worker)

    def _abandon_locked(self, worker: _Worker) -> None:
        if worker.abandoned:
            return
        worker.abandoned = True
        self._stuck += 1
        self.abandoned += 1
        job = worker.job
        if job is not None:
            _settle(job.future, exc=TimedOut(f"{self.name}: no answer within {job.deadline_s or 0:g} s; abandoned"))
        pending = worker.jobs
        self._worker = None
        if pending:
            if self._stuck < self.max_stuck:
                fresh = self._start_locked()
                fresh.jobs = pending
            else:
                while pending:
                    _settle(pending.popleft().future, exc=TimedOut(f"{self.name}: {self._stuck} calls stuck"))
        worker.jobs = collections.deque()
        self._wake.notify_all()

    def _loop(self, worker: _Worker) -> None:
        while True:
            with self._lock:
                while not worker.jobs and not worker.abandoned:
                    self._wake.wait()
                if worker.abandoned:
                    return
                job = worker.jobs.popleft()
                if not job.future.set_running_or_notify_cancel():
                    continue
                worker.job, worker.started = job, self.clock()
            try:
                result = job.fn(*job.args)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                _settle(job.future, exc=exc)
            else:
                _settle(job.future, result=result)
            with self._lock:
                worker.job = None
                if worker.abandoned:  # came back after its caller gave up
                    self._stuck -= 1
                    return


def _settle(future: concurrent.futures.Future[Any], result: Any = None, exc: BaseException | None = None) -> None:
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:  # settled already (abandoned, then came back)
        pass


_default: Runner | None = None
_default_lock = threading.Lock()


def default_runner() -> Runner:
    """The process's runner for file reads (made on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Runner("nvgpu-file-io")
        return _default


def read_file(
    path: str, max_bytes: int, *, deadline_s: float = DEFAULT_DEADLINE_S, runner: Runner | None = None
) -> bytes:
    """:func:`read_bytes` on a runner's thread, waiting at most ``deadline_s``.

    Raises:
        FileRefused: see :func:`read_bytes`; reason ``timeout`` when no answer came in time (a
            hung mount: the thread is abandoned).
    """
    try:
        return (runner or default_runner()).call(read_bytes, path, max_bytes, deadline_s=deadline_s)
    except TimedOut:
        raise FileRefused(path, "timeout", f"no answer within {deadline_s:g} s (a hung mount?)") from None


def on_event_loop() -> bool:
    """Whether the caller runs on an asyncio event loop (where no call may wait on a file)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
