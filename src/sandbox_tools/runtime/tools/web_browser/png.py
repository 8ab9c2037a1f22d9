"""The size of a PNG from its header: pure, so a screenshot is checked before it is sent."""

from __future__ import annotations

import struct

SIGNATURE = b"\x89PNG\r\n\x1a\n"


class NotPng(ValueError):
    """The bytes do not start with a PNG signature and its IHDR chunk."""


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from the IHDR chunk, which a PNG must put first."""
    if len(png) < 24 or not png.startswith(SIGNATURE) or png[12:16] != b"IHDR":
        raise NotPng("not a PNG image")
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)
