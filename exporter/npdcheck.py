"""``nvgpu-exporter npd-check``: a node-problem-detector custom plugin on the exporter's verdicts.

node-problem-detector's custom plugin monitor runs a program and reads its exit status and the
first line of its standard output (kubernetes/node-problem-detector,
``pkg/custompluginmonitor/types``: status ``0`` OK, ``1`` NonOK, ``2`` Unknown; the output is cut
to ``max_output_length``, 80 by default; the plugin is killed after its ``timeout``, 5 s by
default). This check asks the local exporter's ``/api/v1/verdicts`` (docs/verdicts.md) with its own
timeout below NPD's and answers:

- ``1`` (NonOK) when any GPU's verdict is at least ``--min-verdict`` (default ``stop_scheduling``:
  ``stop_scheduling``, ``reset_gpu`` or ``reboot_node``; ``--min-verdict reboot_node`` for a
  condition that means "this node needs a reboot");
- ``2`` (Unknown) when the exporter cannot tell: not reachable, an answer it cannot read, a schema
  it does not know, no GPU verdict yet, or ``fix_exporter`` (the exporter's own pod is wrong: the
  node may be healthy, and a NonOK condition would have it drained for the exporter's fault);
- ``0`` (OK) otherwise (``ok``, ``watch``, ``unknown`` below the bar).

Standard library only and nothing of the exporter's own runtime: it runs inside NPD's container.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from typing import Any

OK, NON_OK, UNKNOWN = 0, 1, 2
MAX_OUTPUT = 80  # NPD's default max_output_length
SCHEMA_VERSION = 1
RANK = {"ok": 0, "unknown": 0, "watch": 1, "stop_scheduling": 2, "reset_gpu": 3, "reboot_node": 4}


def evaluate(doc: Any, min_verdict: str) -> tuple[int, str]:
    """(exit status, message) for a verdicts document (see the module docstring)."""
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        version = doc.get("schema_version") if isinstance(doc, dict) else None
        return UNKNOWN, f"nvgpu verdicts: schema {version!r}, expected {SCHEMA_VERSION}"
    gpus = doc.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        return UNKNOWN, "nvgpu: no GPU verdict yet"
    bar = RANK[min_verdict]
    problems = [g for g in gpus if isinstance(g, dict) and RANK.get(str(g.get("verdict")), -1) >= bar]
    if problems:
        worst = max(problems, key=lambda g: RANK.get(str(g.get("verdict")), 0))
        others = f" +{len(problems) - 1} GPU(s)" if len(problems) > 1 else ""
        return NON_OK, f"GPU {worst.get('gpu')} {worst.get('verdict')}: {worst.get('cause')}{others}"
    blind = [g for g in gpus if isinstance(g, dict) and g.get("verdict") == "fix_exporter"]
    if blind:
        hidden = ",".join(str(g.get("gpu")) for g in blind)
        return UNKNOWN, f"exporter cannot see GPU {hidden}: {blind[0].get('cause')} (fix the exporter pod)"
    watched = [g for g in gpus if isinstance(g, dict) and g.get("verdict") == "watch"]
    if watched:
        return OK, f"GPUs ok; watch GPU {','.join(str(g.get('gpu')) for g in watched)}"
    return OK, f"{len(gpus)} GPU(s) ok"


def fetch(url: str, timeout_s: float) -> Any:
    """The document at ``url`` (JSON).

    Raises:
        OSError: not reachable, timed out, or not a 200 answer.
        ValueError: not JSON.
    """
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - a local http(s) URL
        if response.status != 200:
            raise OSError(f"HTTP {response.status}")
        return json.loads(response.read(1 << 22).decode("utf-8"))


def run(url: str, timeout_s: float, min_verdict: str, max_output: int = MAX_OUTPUT) -> int:
    """Query, print one line (cut to ``max_output``), return the NPD exit status."""
    try:
        code, message = evaluate(fetch(url, timeout_s), min_verdict)
    except (OSError, ValueError, urllib.error.URLError) as exc:
        code, message = UNKNOWN, f"nvgpu-exporter not answering at {url}: {exc}"
    if len(message) > max_output:
        message = message[: max_output - 1] + "…"
    print(message)
    sys.stdout.flush()
    return code
