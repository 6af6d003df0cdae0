"""PNG checks for the screenshot tests, with the standard library only."""

from __future__ import annotations

import struct
import zlib


def png_info(data: bytes) -> tuple[int, int, int]:
    """(width, height, distinct scanlines) of an 8-bit RGB/RGBA PNG, read with the standard library."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height, color = 8, b"", 0, 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        crc = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])[0]
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind!r}"
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = 1 + width * (3 if color == 2 else 4)
    assert len(raw) == stride * height, "truncated image data"
    # Scanlines are filtered, so equal rows of a flat image still compress to identical bytes.
    lines = {raw[i * stride + 1 : (i + 1) * stride] for i in range(height)}
    return width, height, len(lines)
