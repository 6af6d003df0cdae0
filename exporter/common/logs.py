"""Logging set-up (text or JSON lines), log-once, and the worker's records written again by the supervisor.

JSON (``NVGPU_LOG_FORMAT=json``, the DaemonSet's setting): every line on stderr is one JSON object
with ``time`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``msg``, then every ``extra=``
field (``exc``/``stack`` carry a traceback as one string). The worker always logs JSON to its stderr
pipe; the supervisor parses each line and logs it again through :func:`reemit` in the configured
format, and wraps what the worker writes outside logging (a ``Fatal Python error`` report, a
traceback, a C library's message) into records (``exporter/supervisor/workerproc.py``), so the process's
stderr is one stream of records whatever the format.

Text: ``time level logger: message key=value …``, one line per record; a line break inside the
message or a value (a driver string) is written as ``\\n`` so it cannot forge a second record. A
traceback (``exc_info``, ``stack=``) follows on its own lines.

logfmt (``NVGPU_LOG_FORMAT=logfmt``, the format of Prometheus's own exporters, nvidia_gpu_exporter's
chart default): one line of ``key=value`` pairs per record, ``time`` (RFC 3339, milliseconds),
``level`` (``debug``, ``info``, ``warn``, ``error`` as promslog writes them), ``logger``, ``msg``,
then every field; a traceback is the quoted value of ``exc`` or
``stack``. The quoting is go-logfmt's (github.com/go-logfmt/logfmt ``encode.go``, which go-kit/log
writes with) and matches what ``log/slog``'s TextHandler (promslog) needs: a value is quoted when
it is empty or holds a space, ``=``, ``"``, a control character or anything not printable; inside
quotes ``\\`` and ``"`` are escaped, ``\\n`` ``\\r`` ``\\t`` named, other control and
non-printable characters written ``\\u00XX``; the value ``null`` is quoted (bare ``null`` is a
nil); a key loses the characters a key cannot hold (space, ``=``, ``"``, controls).
"""

from __future__ import annotations

import collections
import datetime
import json
import logging
import re
import sys
import threading
from collections.abc import Mapping
from typing import Any

_once_lock = threading.Lock()
_once_keys: set[tuple[str, ...]] = set()

# Attributes of a LogRecord that are not user-supplied extras.
_STD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
MULTILINE = ("stack", "exc")  # fields that carry a traceback: kept multi-line in text mode
ONCE_FIELD = "once"  # set on log-once records, so the supervisor can keep "once" across workers


def rfc3339(ts: float) -> str:
    """``2026-11-30T05:22:01.123Z`` for a Unix time."""
    dt = datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def parse_rfc3339(text: str) -> float:
    """The Unix time of an RFC 3339 timestamp as :func:`rfc3339` writes it (``Z`` or an offset).

    Raises:
        ValueError: not such a timestamp.
    """
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STD_ATTRS and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, msg, plus every ``extra=`` field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": rfc3339(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_extras(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)  # ASCII: safe on any stderr encoding


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
        parts = []
        for k, v in _extras(record).items():
            if k in MULTILINE or k == ONCE_FIELD:
                continue
            quoted = isinstance(v, str) and (" " in v or not v)
            parts.append(f"{k}={one_line(repr(v) if quoted else str(v))}")
        ts = rfc3339(record.created)
        line = f"{ts} {record.levelname:<7} {record.name}: {one_line(record.getMessage())}"
        if parts:
            line += " " + " ".join(parts)
        for key in MULTILINE:
            block = getattr(record, key, None)
            if block:
                line += "\n" + str(block).rstrip("\n")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _logfmt_key(key: str) -> str:
    return "".join(c for c in key if c > " " and c not in '="\x7f' and c.isprintable())


def _logfmt_escape(char: str) -> str:
    named = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    if char in named:
        return named[char]
    code = ord(char)
    if code > 0xFFFF:  # a non-printable astral character: a UTF-16 surrogate pair, as JSON writes it
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def logfmt_value(value: Any) -> str:
    """One logfmt value: bare when it can be, else quoted and escaped (see the module docstring)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if text == "null":
        return '"null"'
    if text and all(c > " " and c not in '="\x7f' and c.isprintable() for c in text):
        return text
    body = "".join(c if c.isprintable() and c not in '\\"' else _logfmt_escape(c) for c in text)
    return f'"{body}"'


# promslog's level names (debug, info, warn, error), which log pipelines built for Prometheus's tools match on
_LOGFMT_LEVELS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn", logging.ERROR: "error"}


class LogfmtFormatter(logging.Formatter):
    """``time=… level=… logger=… msg=… key=value …``: one logfmt line per record, a traceback included."""

    def format(self, record: logging.LogRecord) -> str:
        pairs: list[tuple[str, Any]] = [
            ("time", rfc3339(record.created)),
            ("level", _LOGFMT_LEVELS.get(record.levelno, record.levelname.lower())),
            ("logger", record.name),
            ("msg", record.getMessage()),
        ]
        pairs += [(k, v) for k, v in _extras(record).items() if k != ONCE_FIELD]
        if record.exc_info:
            pairs.append(("exc", self.formatException(record.exc_info)))
        out = []
        for key, value in pairs:
            name = _logfmt_key(str(key))
            if name:
                out.append(f"{name}={logfmt_value(value)}")
        return " ".join(out)


def setup(level: str, fmt: str, stream: Any = None) -> None:
    """Configure the root logger once for this process.

    Args:
        level: DEBUG, INFO, WARNING or ERROR.
        fmt: ``"text"``, ``"logfmt"`` or ``"json"``.
        stream: defaults to stderr.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    formatters: dict[str, type[logging.Formatter]] = {"json": JsonFormatter, "logfmt": LogfmtFormatter}
    handler.setFormatter(formatters.get(fmt, TextFormatter)())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)  # a library's warnings.warn() becomes a record, not a raw stderr line


def log_once(logger: logging.Logger, level: int, key: tuple[str, ...], msg: str, *args: Any, **kw: Any) -> bool:
    """Log ``msg`` only the first time ``key`` is seen in this process; True if it was logged.

    The record carries ``once: true``: a worker's INFO records marked so are written once per
    exporter, not once per worker (:class:`WorkerLogRelay`).
    """
    with _once_lock:
        if key in _once_keys:
            return False
        _once_keys.add(key)
    extra = dict(kw.pop("extra", None) or {})
    extra[ONCE_FIELD] = True
    logger.log(level, msg, *args, extra=extra, **kw)
    return True


_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR}
_LEVELS["CRITICAL"] = logging.CRITICAL


class WorkerLogRelay:
    """Writes a worker's log records again in the supervisor's format.

    Records keep the worker's logger name, level, time and fields, and gain ``worker_pid``. An
    INFO (or DEBUG) record the worker logged once (``once: true``) is written only
    the first time any worker logs it: "fan unsupported" on an H200 is said once per exporter, not
    once per worker restart. Warnings and errors are written every time: a fault that outlives a
    restart should say so.

    Args:
        max_remembered: once-records remembered (oldest forgotten first).
    """

    def __init__(self, max_remembered: int = 4096) -> None:
        self.max_remembered = max_remembered
        self._seen: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()

    def relay(self, data: Mapping[str, Any], pid: int | None) -> bool:
        """Log one parsed worker record; False when it was dropped as already said.

        Args:
            data: the worker's JSON object (``time``, ``level``, ``logger``, ``msg``, fields).
            pid: the worker's PID.
        """
        level = _LEVELS.get(str(data.get("level", "")).upper(), logging.WARNING)
        name = str(data.get("logger") or "exporter.worker")
        msg = str(data.get("msg", ""))
        if data.get(ONCE_FIELD) is True and level <= logging.INFO:
            seen = (name, msg)
            if seen in self._seen:
                return False
            self._seen[seen] = None
            if len(self._seen) > self.max_remembered:
                self._seen.popitem(last=False)
        logger = logging.getLogger(name)
        if not logger.isEnabledFor(level):
            return False
        record = logger.makeRecord(name, level, "(worker)", 0, msg, (), None)
        try:
            record.created = parse_rfc3339(str(data["time"]))
        except (KeyError, ValueError, OverflowError, OSError):
            pass
        for key, value in data.items():
            if key in ("time", "level", "logger", "msg") or key in _STD_ATTRS or key.startswith("_"):
                continue
            setattr(record, key, value)
        record.worker_pid = pid
        logger.handle(record)
        return True
