"""Crash quarantine: a feature in flight at crashes or hangs that keep coming is switched off.

A feature is quarantined when it was in flight at ``threshold`` worker crashes or hangs within the
window, or at crashes on two different GPUs within it: a crash that follows a feature from GPU to
GPU is the feature's fault, not one GPU's (the incident: the NVLink throughput query crashed on
every H20), so switching the feature off node-wide is the smallest cure that contains it.

State lives in a JSON file (``NVGPU_STATE_FILE``; the DaemonSet mounts an emptyDir there) so a
container restart does not walk back into the crash loop. A quarantine expires after a TTL
(default 24 h) so a fixed driver gets retried. Precedence (see guards.features.resolve): a
quarantine beats an explicit ``NVGPU_FEATURE_<NAME>=on`` — the crash is evidence from this node,
an ``on`` is a prediction. To retry before the TTL, clear it:
``nvgpu-exporter quarantine --state-file <file> --clear <feature>`` (:func:`clear_command` writes
it with the file in use; or delete the state file) and restart the pod. A quarantine read back from
the file at start is logged (:func:`log_reloaded`): a feature that is off for a reason from before
this process must say so.

The file is never a reason not to start: every value read from it is checked (known feature,
finite times, ``since <= until``, ``until`` no later than now + the TTL bound), bad entries are
dropped with one log line, and a file that is not ours at all counts as empty. Writes are atomic
(``mkstemp`` in the same directory, then ``os.replace``, which never writes through a symlink at
the target name) and a failed write removes its temporary file.

Nothing here blocks the supervisor: the file is opened without blocking and must be a regular file
(:mod:`exporter.common.fileio`; a FIFO at that path would otherwise hang the start and the
``quarantine`` command), and it is read and written on a thread of its own within a deadline (a
state file on a hung mount costs its persistence, not the process). A path that holds something
other than a regular file (a FIFO, a directory, a device node such as ``/dev/null``) is refused:
``--check-config`` says so, and the running exporter keeps its quarantines in memory and never
replaces that node with a file. To keep quarantines in memory only, set ``NVGPU_STATE_FILE=''``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import math
import os
import shlex
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from exporter.common import fileio

log = logging.getLogger(__name__)
STATE_VERSION = 1
MAX_TTL_S = 10 * 365 * 86400.0  # NVGPU_QUARANTINE_TTL_SECONDS is bounded by this (config.py)
MAX_FILE_BYTES = 1 << 20
IO_DEADLINE_S = 5.0  # reading or writing the state file (a hung mount: the thread is abandoned)
HISTORY_MAX = 1000  # crashes kept in the window; more than this is a crash loop already quarantined


def _utc(ts: float) -> str:
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
    except (OverflowError, OSError, ValueError):
        return f"{ts:.0f} (Unix time)"


@dataclass(frozen=True)
class Quarantine:
    """One quarantined feature.

    Attributes:
        feature: feature name.
        function: NVML function in flight at the last crash.
        since: Unix time it was quarantined.
        until: Unix time it expires.
        crashes: crashes/hangs counted in the window.
    """

    feature: str
    function: str
    since: float
    until: float
    crashes: int

    def detail(self) -> str:
        """Human text for metrics, logs and the status page."""
        return (
            f"{self.crashes} worker crashes/hangs in {self.function} since {_utc(self.since)}; "
            f"expires {_utc(self.until)}"
        )


def _finite(value: Any) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond any float (JSON allows 400 digits)
        return False


class QuarantineStore:
    """Crash history and quarantines, persisted to ``path`` ("" keeps them in memory only).

    Args:
        path: state file.
        threshold: crashes within ``window_s`` that quarantine a feature.
        window_s: counting window, seconds.
        ttl_s: quarantine lifetime, seconds.
        clock: time source (tests).
        features: valid feature names (entries for others are dropped on load).
        on_error: called from an except block with (component, doing) when a save raised something
            unexpected (the supervisor counts it as component ``state``); None: logged once here.
    """

    def __init__(
        self,
        path: str,
        threshold: int,
        window_s: float,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
        features: frozenset[str] | None = None,
        on_error: Callable[[str, str], None] | None = None,
    ) -> None:
        from guards.features import FEATURES

        self.path = path
        self.threshold = threshold
        self.window_s = window_s
        self.ttl_s = min(ttl_s, MAX_TTL_S)
        self.clock = clock
        self.features = features if features is not None else frozenset(FEATURES)
        self.history: list[tuple[float, str, str, str]] = []  # (time, feature, function, gpu uuid)
        self.active: dict[str, Quarantine] = {}
        self.load_error: str | None = None  # why an existing state file could not be read at all
        self.dropped: list[str] = []  # entries of the file that were not valid
        self._save_warned = False
        self.on_error = on_error  # the quarantine stays in memory either way
        self.refused: str | None = None  # the path is not a regular file: never read or replaced
        self._io = fileio.Runner("nvgpu-state-file", IO_DEADLINE_S)
        self._generation = 0  # of the last save asked for
        self._written = 0  # of the last save that reached the file
        self._write_lock = threading.Lock()
        self._load()

    # -- file ------------------------------------------------------------------------------------

    def _load(self) -> None:
        if not self.path:
            return
        try:
            raw = fileio.read_file(self.path, MAX_FILE_BYTES, deadline_s=IO_DEADLINE_S, runner=self._io)
            data = json.loads(raw.decode("utf-8"), parse_constant=lambda c: float("nan"))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"version {data.get('version')!r}, expected {STATE_VERSION}")
        except fileio.FileRefused as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):  # not there (yet): the start-up check says why
                return
            if exc.reason == "not_regular":
                self.refused = exc.detail
            fileio.count_failure("state_file", exc)
            log.error("state file %s unreadable (%s); starting with no quarantine", self.path, exc.detail)
            self.load_error = exc.detail
            return
        except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deeply
            fileio.count_failure("state_file", exc)
            log.error("state file %s unreadable (%s); starting with no quarantine", self.path, exc)
            self.load_error = str(exc)
            return
        self.history = [h for h in map(self._history_entry, _list(data.get("history"))) if h is not None]
        quarantine = data.get("quarantine")
        for feature, body in quarantine.items() if isinstance(quarantine, dict) else ():
            q = self._quarantine_entry(feature, body)
            if q is not None:
                self.active[feature] = q
        if self.dropped:
            log.warning(
                "state file %s: dropped %d invalid entr%s (%s); the rest is kept",
                self.path,
                len(self.dropped),
                "y" if len(self.dropped) == 1 else "ies",
                "; ".join(self.dropped[:5]),
            )
        self.expire()

    def _history_entry(self, entry: Any) -> tuple[float, str, str, str] | None:
        if isinstance(entry, list) and len(entry) in (3, 4) and all(isinstance(x, str) for x in entry[1:]):
            t, feature, function, *rest = entry
            if _finite(t) and feature in self.features:
                return (float(t), feature, function, rest[0] if rest else "")
        self.dropped.append(f"history entry {str(entry)[:80]}")
        return None

    def _quarantine_entry(self, feature: str, body: Any) -> Quarantine | None:
        now = self.clock()
        try:
            if feature not in self.features:
                raise ValueError("unknown feature")
            if not isinstance(body, dict) or set(body) != {"feature", "function", "since", "until", "crashes"}:
                raise ValueError("not a quarantine object")
            q = Quarantine(**body)
            if q.feature != feature or not isinstance(q.function, str):
                raise ValueError("feature or function")
            if not (_finite(q.since) and _finite(q.until) and q.since <= q.until <= now + MAX_TTL_S):
                raise ValueError(f"since/until out of range ({q.since!r}, {q.until!r})")
            if not isinstance(q.crashes, int) or isinstance(q.crashes, bool) or q.crashes < 0:
                raise ValueError("crashes")
            return q
        except (TypeError, ValueError) as exc:
            self.dropped.append(f"quarantine {feature!r}: {exc}")
            return None

    def save(self, wait: bool | None = None) -> None:
        """Write the state atomically on the state file's own thread; errors are logged once, not
        raised.

        Args:
            wait: wait for the write (at most :data:`IO_DEADLINE_S`); None (the default) waits
                unless called on a running event loop, which is never held up by the file.
        """
        if not self.path or self.refused is not None:
            return
        data: dict[str, Any] = {
            "version": STATE_VERSION,
            "history": [list(h) for h in self.history],
            "quarantine": {k: asdict(v) for k, v in self.active.items()},
        }
        self._generation += 1
        if wait is None:
            wait = not _on_event_loop()
        future = self._io.submit(self._write, data, self._generation)
        if not wait:
            return
        try:
            future.result(timeout=IO_DEADLINE_S)
        except Exception:  # noqa: BLE001 - a timeout: the write goes on (or not) on its own thread
            self._io.give_up(future)
            self._warn_once(f"no answer within {IO_DEADLINE_S:g} s (a hung mount?)")

    def _warn_once(self, why: object) -> None:
        if not self._save_warned:
            log.warning("cannot write state file %s (%s); quarantine will not survive a restart", self.path, why)
            self._save_warned = True

    def _write(self, data: dict[str, Any], generation: int) -> None:
        """On the state file's thread: write ``data`` unless a later save already reached the file."""
        tmp = None
        try:
            try:
                st = os.lstat(self.path)
            except FileNotFoundError:
                pass
            else:
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    refused = f"is {fileio.describe_stat(st)}, not a regular file"
                    self.refused = refused
                    fileio.count_failure("state_file", fileio.FileRefused(self.path, "not_regular", refused))
                    self._warn_once(
                        f"{refused}: it is not replaced; set NVGPU_STATE_FILE='' to keep quarantines in memory"
                    )
                    return
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".state-", dir=directory)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh)
            with self._write_lock:
                if generation < self._written:
                    return  # a thread stuck on a hung mount came back after a newer save
                os.replace(tmp, self.path)
                self._written = generation
            tmp = None
        except (OSError, ValueError) as exc:
            self._warn_once(exc)
        except Exception:  # noqa: BLE001 - our own bug: the quarantine holds in memory, counted
            if self.on_error is not None:
                self.on_error("state", "writing the state file")
            else:
                self._warn_once("unexpected error")
                log.exception("cannot write state file %s", self.path)
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    # -- decisions -------------------------------------------------------------------------------

    def expire(self) -> list[str]:
        """Drop expired quarantines and old history; returns the features released."""
        now = self.clock()
        released = [f for f, q in self.active.items() if q.until <= now]
        for f in released:
            del self.active[f]
            log.warning("quarantine of feature %s expired; it will be sampled again", f)
        self.history = [h for h in self.history if now - h[0] <= self.window_s][-HISTORY_MAX:]
        return released

    def record(self, feature: str, function: str, uuid: str = "") -> Quarantine | None:
        """Count a crash/hang in ``feature`` (on GPU ``uuid``, if known); returns the new quarantine
        if this one tipped it (the threshold, or a second GPU crashing in the same feature)."""
        now = self.clock()
        self.expire()
        self.history.append((now, feature, function, uuid))
        mine = [h for h in self.history if h[1] == feature]
        gpus = {h[3] for h in mine if h[3]}
        new = None
        if (len(mine) >= self.threshold or len(gpus) >= 2) and feature not in self.active:
            new = Quarantine(feature, function, now, now + self.ttl_s, len(mine))
            self.active[feature] = new
        self.save()
        return new

    def clear(self, feature: str | None = None) -> list[str]:
        """Remove one quarantine (or all) and its history; returns the features cleared.

        The file is written only when something changed.
        """
        cleared = [f for f in self.active if feature in (None, f)]
        history = [h for h in self.history if feature not in (None, h[1])]
        if not cleared and len(history) == len(self.history):
            return []
        for f in cleared:
            del self.active[f]
        self.history = history
        self.save()
        return cleared

    def writable(self) -> str | None:
        """None if the state file's directory can take the file, else why not (checked at start)."""
        if not self.path:
            return None
        directory = os.path.dirname(os.path.abspath(self.path)) or "."
        probe = directory
        while not os.path.exists(probe):
            probe = os.path.dirname(probe)
        if not os.access(probe, os.W_OK | os.X_OK):
            return f"{probe} is not writable"
        return None

    def details(self) -> dict[str, str]:
        """feature -> human detail of each active quarantine."""
        self.expire()
        return {f: q.detail() for f, q in self.active.items()}


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def clear_command(path: str, feature: str) -> str:
    """The shell command that clears ``feature``'s quarantine in the state file ``path``, whole and
    quoted, to paste as it is: ``nvgpu-exporter quarantine --state-file /var/lib/nvgpu-exporter/state.json
    --clear nvlink_throughput``."""
    return f"nvgpu-exporter quarantine --state-file {shlex.quote(path)} --clear {shlex.quote(feature)}"


def retry_hint(path: str, feature: str) -> str:
    """How to retry a quarantined feature before it expires; ends with the command to paste (no
    state file: a restart forgets the quarantine)."""
    if not path:
        return "NVGPU_STATE_FILE is empty, so the quarantine is in memory only: restart the exporter to retry it"
    return f"to retry it earlier, clear it and restart the exporter: {clear_command(path, feature)}"


def log_reloaded(store: QuarantineStore) -> None:
    """One WARNING per quarantine read back from the state file at start (each says until when, and
    ends with the command that clears it)."""
    for feature, q in sorted(store.active.items()):
        log.warning(
            "feature %s is quarantined, read back from the state file %s (%s); it stays off, whatever "
            "NVGPU_FEATURE_%s says, until it expires; %s",
            feature,
            store.path,
            q.detail(),
            feature.upper(),
            retry_hint(store.path, feature),
        )


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
