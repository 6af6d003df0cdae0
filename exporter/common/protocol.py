"""Messages between the worker and the supervisor: versioned JSON lines on a pipe.

Worker -> supervisor, one JSON object per line, each with ``"v": PROTOCOL_VERSION`` and ``"type"``:

- ``hello``: the worker started; NVML versions, GPUs, feature states, self-check result.
- ``snapshot``: one sample of every GPU and feature, with its Unix timestamp ``ts``.
- ``event``: an NVML event (Xid, ECC, …) with its arrival time.
- ``init_failed``: ``nvmlInit`` failed; the worker exits with ``EXIT_NVML_FATAL`` after it.
- ``bye``: orderly shutdown finished (``nvml_shutdown`` says whether ``nvmlShutdown`` ran).

Supervisor -> worker: the worker's standard input. ``{"type": "shutdown"}`` or end of file asks
it to stop sampling, drain the call in flight and exit 0.

A supervisor refuses lines whose version it does not know, so a stale worker found on the path
(a different installed copy) is reported rather than misread.
"""

from __future__ import annotations

import json
from typing import Any

PROTOCOL_VERSION = 1

# Process exit codes.
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2  # bad configuration: nothing started
EXIT_SELFCHECK = 3  # strict self-check refused to start
EXIT_NVML_FATAL = 4  # worker: NVML unusable (init failed, driver gone); supervisor retries


class ProtocolError(ValueError):
    """A line that is not a valid message of a known version."""


def encode(kind: str, **fields: Any) -> bytes:
    """One message as a JSON line (UTF-8, newline-terminated, no NaN)."""
    fields["v"] = PROTOCOL_VERSION
    fields["type"] = kind
    return json.dumps(fields, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """Parse one line.

    Raises:
        ProtocolError: not JSON, not an object, or an unknown protocol version.
    """
    try:
        msg = json.loads(line)
    except ValueError as exc:
        raise ProtocolError(f"worker sent a line that is not JSON: {line[:200]!r}") from exc
    if not isinstance(msg, dict) or "type" not in msg:
        raise ProtocolError(f"worker sent a message without a type: {line[:200]!r}")
    if msg.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(
            f"worker speaks protocol version {msg.get('v')!r}, this supervisor {PROTOCOL_VERSION}:"
            " a different copy of the exporter was imported by the worker (run `nvgpu-exporter"
            " selfcheck`)"
        )
    return msg
