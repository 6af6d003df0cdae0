"""Crash quarantine: a feature in flight at crashes or hangs that keep coming is switched off.

A fault on one GPU stays that GPU's: a hang or crash in a call on a GPU that can be left out (the
worker stops calling a hung GPU; the next worker does not attach a crashed one; a probe retries
either, :mod:`exporter.supervisor.gpuhealth`) is *contained* and never switches the feature off
on the healthy GPUs, however often it repeats. A feature is quarantined node-wide when, within the
window, it was in flight at faults on two different GPUs (a crash that follows a feature from GPU
to GPU is the feature's fault, not one GPU's: the incident, the NVLink throughput query crashed on
every H20), or at ``threshold`` faults that were not contained (no GPU named, or the only GPU left
to sample). Only the worker's own faults and the calls that did not return are counted: a worker
killed from outside or by the OOM killer is not (:mod:`exporter.supervisor.deaths`).

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

Time: the window and the TTL are decided on the monotonic clock, so a wall-clock step (forwards or
back by an hour) neither expires a quarantine early nor keeps it late, nor moves a crash in or out
of the window. The file keeps wall times (``since``, ``until``, each crash's time: what is shown)
and, beside them, the same instants on CLOCK_MONOTONIC (``until_mono``, each crash's fifth value)
with the boot id (``/proc/sys/kernel/random/boot_id``): CLOCK_MONOTONIC is one clock for every
process of a boot, so after a container restart the monotonic instants decide exactly. After a
reboot only the wall times are left: a quarantine then lasts until ``until`` but at most the TTL
from the moment it is loaded, and a crash counts at most ``window`` old, never from the future.

Nothing here blocks the supervisor: the file is opened without blocking and must be a regular file
(:mod:`exporter.common.fileio`; a FIFO at that path would otherwise hang the start and the
``quarantine`` command), and it is read and written on a thread of its own within a deadline (a
state file on a hung mount costs its persistence, not the process). A path that holds something
other than a regular file (a FIFO, a directory, a device node such as ``/dev/null``) is refused:
``--check-config`` says so, and the running exporter keeps its quarantines in memory and never
replaces that node with a file. To keep quarantines in memory only, set ``NVGPU_STATE_FILE=''``.
"""

from __future__ import annotations

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
from typing import Any, NamedTuple

from exporter.common import fileio

log = logging.getLogger(__name__)
STATE_VERSION = 2  # 2: monotonic instants and the boot id beside the wall times (1 is read too)
READABLE_VERSIONS = (1, 2)
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
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


class Crash(NamedTuple):
    """One crash or hang counted toward a quarantine.

    Attributes:
        t: Unix time (shown; all that decides after a reboot).
        feature: the feature in flight.
        function: the NVML function in flight.
        uuid: the GPU's UUID (its PCI bus id without one), "" when not per GPU.
        mono: CLOCK_MONOTONIC at the crash: the window is measured on it.
        contained: the GPU was left out for it (counts only toward the two-GPU rule).
    """

    t: float
    feature: str
    function: str
    uuid: str
    mono: float
    contained: bool = False


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """This boot's id ("" where the kernel does not say: then monotonic instants are never reused)."""
    try:
        return fileio.read_bytes(path, 64).decode("ascii", "replace").strip()
    except (OSError, fileio.FileRefused):  # absent, not a regular file, too long
        return ""


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
        clock: wall clock: the times shown and kept for after a reboot; default ``time.time`` (tests).
        features: valid feature names (entries for others are dropped on load).
        on_error: called from an except block with (component, doing) when a save raised something
            unexpected (the supervisor counts it as component ``state``); None: logged once here.
        mono: the clock the window and the TTL are decided on; default ``time.monotonic`` (with an
            injected ``clock`` and no ``mono``, that clock: tests that move one clock).
        boot_id: this boot's id (default: read from the kernel); monotonic instants in the file are
            used only when it matches.
    """

    def __init__(
        self,
        path: str,
        threshold: int,
        window_s: float,
        ttl_s: float,
        clock: Callable[[], float] | None = None,
        features: frozenset[str] | None = None,
        on_error: Callable[[str, str], None] | None = None,
        mono: Callable[[], float] | None = None,
        boot_id: str | None = None,
    ) -> None:
        from guards.featuretable import FEATURES

        self.path = path
        self.threshold = threshold
        self.window_s = window_s
        self.ttl_s = min(ttl_s, MAX_TTL_S)
        self.clock: Callable[[], float] = clock if clock is not None else lambda: time.time()
        self.mono: Callable[[], float] = mono if mono is not None else clock if clock is not None else time.monotonic
        self.boot_id = read_boot_id() if boot_id is None else boot_id
        self.features = features if features is not None else frozenset(FEATURES)
        self.history: list[Crash] = []
        self.active: dict[str, Quarantine] = {}
        self.until_mono: dict[str, float] = {}  # feature -> when its quarantine ends, on self.mono
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
            if data.get("version") not in READABLE_VERSIONS:
                raise ValueError(f"version {data.get('version')!r}, expected one of {READABLE_VERSIONS}")
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
        same_boot = bool(self.boot_id) and data.get("boot_id") == self.boot_id
        wall, mono = self.clock(), self.mono()
        entries = (self._history_entry(h, same_boot, wall, mono) for h in _list(data.get("history")))
        self.history = [h for h in entries if h is not None]
        quarantine = data.get("quarantine")
        for feature, body in quarantine.items() if isinstance(quarantine, dict) else ():
            q = self._quarantine_entry(feature, body)
            if q is not None:
                self.active[feature] = q
                self.until_mono[feature] = self._until_mono(q, body, same_boot, wall, mono)
        if self.dropped:
            log.warning(
                "state file %s: dropped %d invalid entr%s (%s); the rest is kept",
                self.path,
                len(self.dropped),
                "y" if len(self.dropped) == 1 else "ies",
                "; ".join(self.dropped[:5]),
            )
        self.expire()

    def _history_entry(self, entry: Any, same_boot: bool, wall: float, mono: float) -> Crash | None:
        """A crash of the file: ``[time, feature, function(, uuid(, monotonic(, contained)))]``. Its
        monotonic instant is the file's when the boot is the same, else derived from its wall age
        (at most the window old, never in the future)."""
        if isinstance(entry, list) and len(entry) in (3, 4, 5, 6) and all(isinstance(x, str) for x in entry[1:4]):
            t, feature, function, *rest = entry
            contained = rest[2] if len(rest) > 2 else False
            if _finite(t) and feature in self.features and isinstance(contained, bool):
                uuid = rest[0] if rest else ""
                stored: Any = rest[1] if len(rest) > 1 else None
                if same_boot and _finite(stored) and stored <= mono:
                    at = float(stored)
                else:
                    at = mono - min(max(wall - float(t), 0.0), self.window_s)
                return Crash(float(t), feature, function, uuid, at, contained)
        self.dropped.append(f"history entry {str(entry)[:80]}")
        return None

    def _until_mono(self, q: Quarantine, body: dict[str, Any], same_boot: bool, wall: float, mono: float) -> float:
        """When a loaded quarantine ends on the monotonic clock: the file's instant on the same boot
        (at most the TTL from now), else ``until`` by the wall clock, at most the TTL from now."""
        stored: Any = body.get("until_mono")
        if same_boot and _finite(stored):
            return min(float(stored), mono + self.ttl_s)
        return mono + min(max(q.until - wall, 0.0), self.ttl_s)

    def _quarantine_entry(self, feature: str, body: Any) -> Quarantine | None:
        now = self.clock()
        try:
            if feature not in self.features:
                raise ValueError("unknown feature")
            keys = {"feature", "function", "since", "until", "crashes"}
            if not isinstance(body, dict) or not keys <= set(body) <= keys | {"until_mono"}:
                raise ValueError("not a quarantine object")
            q = Quarantine(**{k: body[k] for k in keys})
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
            "boot_id": self.boot_id,
            "history": [list(h) for h in self.history],
            "quarantine": {k: {**asdict(v), "until_mono": self.until_mono[k]} for k, v in self.active.items()},
        }
        self._generation += 1
        late = self._io.write_behind(self._write, data, self._generation, wait=wait)
        if late is not None:
            self._warn_once(late)

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
        """Drop expired quarantines and old history (both by the monotonic clock); returns the
        features released."""
        mono = self.mono()
        released = [f for f in self.active if self.until_mono.get(f, mono) <= mono]
        for f in released:
            del self.active[f]
            self.until_mono.pop(f, None)
            log.warning("quarantine of feature %s expired; it will be sampled again", f)
        self.history = [h for h in self.history if mono - h.mono <= self.window_s][-HISTORY_MAX:]
        return released

    def record(self, feature: str, function: str, uuid: str = "", contained: bool = False) -> Quarantine | None:
        """Count a crash/hang in ``feature`` (on GPU ``uuid``: its UUID, or PCI bus id without one;
        ``contained``: that GPU is left out for it); returns the new quarantine if this one tipped
        it (a second GPU faulting in the same feature, or the threshold of faults not contained)."""
        now, mono = self.clock(), self.mono()
        self.expire()
        self.history.append(Crash(now, feature, function, uuid, mono, contained and bool(uuid)))
        mine = [h for h in self.history if h.feature == feature]
        gpus = {h.uuid for h in mine if h.uuid}
        loose = [h for h in mine if not h.contained]
        new = None
        if (len(loose) >= self.threshold or len(gpus) >= 2) and feature not in self.active:
            new = Quarantine(feature, function, now, now + self.ttl_s, len(mine))
            self.active[feature] = new
            self.until_mono[feature] = mono + self.ttl_s
        self.save()
        return new

    def clear(self, feature: str | None = None) -> list[str]:
        """Remove one quarantine (or all) and its history; returns the features cleared.

        The file is written only when something changed.
        """
        cleared = [f for f in self.active if feature in (None, f)]
        history = [h for h in self.history if feature not in (None, h.feature)]
        if not cleared and len(history) == len(self.history):
            return []
        for f in cleared:
            del self.active[f]
            self.until_mono.pop(f, None)
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
