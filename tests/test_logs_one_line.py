"""Text-format logs keep one record on one line whatever a driver string holds."""

from __future__ import annotations

import logging
import sys

import pytest

from exporter.common.logs import TextFormatter, one_line


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "NVIDIA H200\n2026-01-01T00:00:00Z ERROR forged: record",
            "NVIDIA H200\\n2026-01-01T00:00:00Z ERROR forged: record",
        ),
        ("a\r\nb", "a\\r\\nb"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("nel\x85ls\u2028ps\u2029", "nel\\x85ls\\u2028ps\\u2029"),
        ("tab\tkept, ünïcode kept", "tab\tkept, ünïcode kept"),
        ("\x00\x7f", "\\x00\\x7f"),
    ],
)
def test_one_line(text: str, expected: str) -> None:
    assert one_line(text) == expected


def _format(record: logging.LogRecord) -> str:
    return TextFormatter().format(record)


def test_message_and_extras_with_newlines_stay_on_one_line() -> None:
    record = logging.LogRecord(
        "exporter.supervisor", logging.INFO, __file__, 1, "worker ready: driver %s", ("580\nX",), None
    )
    record.name_of_gpu = "H200\nfake"  # an extra without a space
    record.detail = "two words\nand a line"  # an extra with a space (repr'd)
    out = _format(record)
    assert "\n" not in out
    assert "driver 580\\nX" in out and "name_of_gpu=H200\\nfake" in out and "detail='two words\\nand a line'" in out


def test_traceback_and_worker_stack_still_follow_on_their_own_lines() -> None:
    try:
        raise RuntimeError("bad\nvalue")
    except RuntimeError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed: %s", ("a\nb",), exc_info)
    record.stack = "Fatal Python error: Segmentation fault\n  File x"
    first, *rest = _format(record).split("\n")
    assert first.endswith("failed: a\\nb")
    assert rest[0] == "Fatal Python error: Segmentation fault" and rest[2].startswith("Traceback")
