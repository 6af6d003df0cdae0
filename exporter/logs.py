"""Logging set-up (text or JSON lines) and log-once for anything that could repeat every sample."""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from typing import Any

_once_lock = threading.Lock()
_once_keys: set[tuple[str, ...]] = set()

# Attributes of a LogRecord that are not user-supplied extras.
_STD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, plus every ``extra=`` field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


# Line breaks and other control characters (tab excepted), C1 controls and the Unicode line and
# paragraph separators: what could end or disguise a line of a text log.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 256 else f"\\u{ord(char):04x}")


def one_line(text: str) -> str:
    """``text`` with every character that could break a log line escaped (``\\n``, ``\\r``,
    ``\\xNN``, ``\\uNNNN``), so a driver string holding a newline cannot split a record or
    forge the next one. Tabs are kept; backslashes are not escaped (the text stays readable)."""
    return _CONTROL.sub(_escape, text)


class TextFormatter(logging.Formatter):
    """``time level logger: message key=value …`` on one line (:func:`one_line`); only a traceback
    or a worker's stack (the ``stack`` extra) follows on the next lines."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(
            one_line(f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}")
            for k, v in vars(record).items()
            if k not in _STD_ATTRS and not k.startswith("_") and k != "stack"
        )
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"{ts}Z {record.levelname:<7} {record.name}: {one_line(record.getMessage())}"
        if extras:
            line += f" {extras}"
        stack = getattr(record, "stack", None)
        if stack:
            line += "\n" + str(stack)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(level: str, fmt: str, stream: Any = None) -> None:
    """Configure the root logger once for this process.

    Args:
        level: DEBUG, INFO, WARNING or ERROR.
        fmt: ``"text"`` or ``"json"``.
        stream: defaults to stderr.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def log_once(logger: logging.Logger, level: int, key: tuple[str, ...], msg: str, *args: Any, **kw: Any) -> bool:
    """Log ``msg`` only the first time ``key`` is seen in this process; True if it was logged."""
    with _once_lock:
        if key in _once_keys:
            return False
        _once_keys.add(key)
    logger.log(level, msg, *args, **kw)
    return True
