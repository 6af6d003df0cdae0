"""Crash quarantine: a feature in flight at N crashes or hangs within a window is switched off.

State lives in a JSON file (``NVGPU_STATE_FILE``; the DaemonSet mounts an emptyDir there) so a
container restart does not walk back into the crash loop. A quarantine expires after a TTL
(default 24 h) so a fixed driver gets retried. Precedence (see guards.features.resolve): a
quarantine beats an explicit ``NVGPU_FEATURE_<NAME>=on`` — the crash is evidence from this node,
an ``on`` is a prediction. To retry before the TTL, clear it:
``nvgpu-exporter quarantine --clear <feature>`` (or delete the state file) and restart the pod.

The file is written atomically (temporary file + rename); an unreadable or corrupt file is logged
once and treated as empty rather than stopping the exporter.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger(__name__)
STATE_VERSION = 1


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
            f"{self.crashes} worker crashes/hangs in {self.function} since "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(self.since))}; expires "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(self.until))}"
        )


class QuarantineStore:
    """Crash history and quarantines, persisted to ``path`` ("" keeps them in memory only).

    Args:
        path: state file.
        threshold: crashes within ``window_s`` that quarantine a feature.
        window_s: counting window, seconds.
        ttl_s: quarantine lifetime, seconds.
        clock: time source (tests).
    """

    def __init__(
        self, path: str, threshold: int, window_s: float, ttl_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = path
        self.threshold = threshold
        self.window_s = window_s
        self.ttl_s = ttl_s
        self.clock = clock
        self.history: list[tuple[float, str, str]] = []  # (time, feature, function)
        self.active: dict[str, Quarantine] = {}
        self.load_error: str | None = None  # why an existing state file could not be read
        self._save_warned = False
        self._load()

    def _load(self) -> None:
        if not self.path or not os.path.exists(self.path):
            return
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"version {data.get('version')!r}, expected {STATE_VERSION}")
            self.history = [(float(t), str(f), str(fn)) for t, f, fn in data.get("history", [])]
            self.active = {k: Quarantine(**v) for k, v in data.get("quarantine", {}).items()}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.error("state file %s unreadable (%s); starting with no quarantine", self.path, exc)
            self.load_error = str(exc)
            self.history, self.active = [], {}
        self.expire()

    def save(self) -> None:
        """Write the state atomically; errors are logged, not raised."""
        if not self.path:
            return
        data: dict[str, Any] = {
            "version": STATE_VERSION,
            "history": [list(h) for h in self.history],
            "quarantine": {k: asdict(v) for k, v in self.active.items()},
        }
        try:
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".state-", dir=directory)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh)
            os.replace(tmp, self.path)
        except OSError as exc:
            if not self._save_warned:
                log.warning("cannot write state file %s (%s); quarantine will not survive a restart", self.path, exc)
                self._save_warned = True

    def expire(self) -> list[str]:
        """Drop expired quarantines and old history; returns the features released."""
        now = self.clock()
        released = [f for f, q in self.active.items() if q.until <= now]
        for f in released:
            del self.active[f]
            log.warning("quarantine of feature %s expired; it will be sampled again", f)
        self.history = [h for h in self.history if now - h[0] <= self.window_s]
        return released

    def record(self, feature: str, function: str) -> Quarantine | None:
        """Count a crash/hang in ``feature``; returns the new quarantine if this one tipped it."""
        now = self.clock()
        self.expire()
        self.history.append((now, feature, function))
        count = sum(1 for _, f, _ in self.history if f == feature)
        new = None
        if count >= self.threshold and feature not in self.active:
            new = Quarantine(feature, function, now, now + self.ttl_s, count)
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
