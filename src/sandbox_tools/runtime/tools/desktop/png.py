"""Screenshots as PNG, with the pointer drawn in, from packed RGB (standard library only).

The model sees where its pointer is, as in inspect's screenshots (`scrot -p`): X's
GetImage never holds the cursor, so a small arrow is drawn at the pointer's place. PNG
is the format every provider's computer use takes; zlib at level 6 made a 1366 x 768
desktop about 40 KB (a plain colour background and a few windows).
"""

from __future__ import annotations

import struct
import zlib

# The arrow, row by row: "#" black outline, "." white fill, the tip at the top left.
POINTER = (
    "#",
    "##",
    "#.#",
    "#..#",
    "#...#",
    "#....#",
    "#.....#",
    "#......#",
    "#.......#",
    "#........#",
    "#.....#####",
    "#..#..#",
    "#.# #..#",
    "##  #..#",
    "#    #..#",
    "     #..#",
    "      ##",
)
COMPRESSION = 6


def draw_pointer(rgb: bytearray, width: int, height: int, x: int, y: int) -> None:
    """The arrow drawn into `rgb` (packed, `width` pixels a row) with its tip at (x, y),
    cut at the screen's edges."""
    for row, line in enumerate(POINTER):
        for column, mark in enumerate(line):
            px, py = x + column, y + row
            if mark == " " or not (0 <= px < width and 0 <= py < height):
                continue
            offset = (py * width + px) * 3
            rgb[offset : offset + 3] = b"\0\0\0" if mark == "#" else b"\xff\xff\xff"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def encode(rgb: bytes, width: int, height: int) -> bytes:
    """An 8-bit RGB PNG of `rgb` (packed, row after row), no filter: rows of a desktop
    are mostly runs that zlib finds without one."""
    if len(rgb) != width * height * 3 or width < 1 or height < 1:
        raise ValueError(f"{len(rgb)} bytes are not a {width} x {height} RGB image")
    row = width * 3
    raw = b"".join(b"\0" + rgb[start : start + row] for start in range(0, len(rgb), row))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw, COMPRESSION))
        + _chunk(b"IEND", b"")
    )
