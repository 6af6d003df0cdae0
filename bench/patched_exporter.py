"""Issue 30: the exporter with prototypes (a) and (b) patched in from bench/, to measure them live.

Not product code, and nothing in ``exporter/`` changes: this launcher runs ``exporter.cli.main()``
in its own process after replacing, in memory,

* ``exporter.supervisor.workerproc.decode_message`` (the supervisor's one decode of each worker line) by
  prototype (a)'s compiled decoder with the reading memo (``bench/proto_decode.py: MemoDecoder``);
* ``exporter.supervisor.exposition.render`` (what ``exporter.supervisor.http.web.Renderer`` calls per
  change) by prototype (b)'s renderer: families written directly and kept per feature while their readings are equal
  (``bench/proto_render.py: CachedRenderer("feature", direct=True)``). Its text body is the one
  checked byte for byte against today's render; the OpenMetrics body, asked for rarely, is made
  by today's code on first request.

``BENCH_PROTOTYPES=a`` or ``=b`` patches one of the two (default ``a,b``; not ``NVGPU_*``: the
exporter refuses unknown variables of its own prefix). The worker is today's
(spawned as usual). ``python bench/sample_cost.py --launcher bench/patched_exporter.py`` measures
it exactly as it measures ``python -m exporter``.
"""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class _Rendered:
    """What ``exporter.supervisor.http.web`` reads from a rendering: ``text``, ``openmetrics``, ``body()``."""

    def __init__(self, text: bytes, state: Any) -> None:
        self.text = text
        self._state = state
        self._openmetrics: bytes | None = None
        self._gzip: dict[bool, bytes] = {}

    @property
    def openmetrics(self) -> bytes:
        if self._openmetrics is None:
            self._openmetrics = _TODAY(self._state).openmetrics
        return self._openmetrics

    def body(self, openmetrics: bool, gzipped: bool) -> bytes:
        raw = self.openmetrics if openmetrics else self.text
        if not gzipped:
            return raw
        if openmetrics not in self._gzip:
            self._gzip[openmetrics] = gzip.compress(raw, compresslevel=6, mtime=0)
        return self._gzip[openmetrics]


_TODAY: Any = None


def patch(which: set[str]) -> None:
    global _TODAY
    from exporter.supervisor import exposition, workerproc

    if "a" in which:
        import proto_decode

        memo = proto_decode.MemoDecoder()
        workerproc.decode_message = memo.decode_message  # type: ignore[assignment]
    if "b" in which:
        import proto_render

        renderer = proto_render.CachedRenderer("feature", direct=True)
        _TODAY = exposition.render

        def render(state: Any) -> Any:
            return _Rendered(renderer.render(state), state)

        exposition.render = render  # type: ignore[assignment]


def main() -> int:
    which = {w.strip() for w in os.environ.get("BENCH_PROTOTYPES", "a,b").split(",") if w.strip()}
    patch(which)
    from exporter import cli

    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
