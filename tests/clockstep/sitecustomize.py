"""Step the wall clock of a real process from outside (tests/test_integration_clock.py).

Python imports ``sitecustomize`` at start-up from the path; the test puts this directory on
``PYTHONPATH`` for the exporter, whose worker processes inherit it, and names a file in
``CLOCK_STEP_FILE``. A daemon thread reads the file every 50 ms: its content is a number of
seconds added to ``time.time()`` and ``time.time_ns()`` from then on, so both processes see one wall
clock step while they run, as on a node whose clock NTP or an operator sets. The monotonic clock is
not touched. Nothing of the product knows about this file.
"""

from __future__ import annotations

import os
import threading
import time

_PATH = os.environ.get("CLOCK_STEP_FILE")

if _PATH:
    _real_time, _real_time_ns = time.time, time.time_ns
    _offset = [0.0]

    def _stepped() -> float:
        return _real_time() + _offset[0]

    def _stepped_ns() -> int:
        return _real_time_ns() + int(_offset[0] * 1e9)

    def _follow(path: str) -> None:
        while True:
            try:
                with open(path, encoding="ascii") as fh:
                    _offset[0] = float(fh.read().strip() or 0.0)
            except (OSError, ValueError):
                pass
            time.sleep(0.05)

    time.time = _stepped  # type: ignore[assignment]
    time.time_ns = _stepped_ns  # type: ignore[assignment]
    threading.Thread(target=_follow, args=(_PATH,), name="clock-step", daemon=True).start()
