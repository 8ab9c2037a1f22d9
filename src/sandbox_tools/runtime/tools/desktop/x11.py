"""The few X11 requests the desktop needs from its display, spoken by the runtime itself.

A screenshot is the screen's pixels (GetImage) and where the pointer is (QueryPointer);
taking them over the display's socket needs no program of the image's and none of the
add-on's (inspect's computer tool runs scrot and ImageMagick for it), and costs one
round trip each. Standard library only, as the whole runtime.

The connection authenticates with the display's MIT-MAGIC-COOKIE-1: the desktop's X
server runs with a cookie, never open to every client (`-ac`), since its socket's
abstract name is reachable from the whole network namespace. Everything the server
sends is checked before it is used (lengths, the screen's format), and a refusal is an
X11Error with the server's own reason.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

# Requests and their answers (the core protocol, X11R7.7's "X Window System Protocol").
GET_IMAGE = 73
QUERY_POINTER = 38
Z_PIXMAP = 2
ALL_PLANES = 0xFFFFFFFF
COOKIE_AUTH = b"MIT-MAGIC-COOKIE-1"
# The most a connection setup reply or an image may hold: a 16384 x 16384 screen.
MAX_SETUP_BYTES = 1 << 20
MAX_IMAGE_BYTES = 8192 * 8192 * 4
SOCKET_DIR = "/tmp/.X11-unix"  # where a display's socket is, as every X client looks


class X11Error(Exception):
    """The display refused, failed or answered something we cannot use; says which."""


@dataclass(frozen=True)
class Screen:
    """The first screen of a display, as its connection setup describes it."""

    root: int
    width: int
    height: int
    depth: int
    bits_per_pixel: int
    scanline_pad: int
    red_mask: int
    green_mask: int
    blue_mask: int
    lsb_first: bool  # the image byte order: least significant byte first


def _pad(length: int) -> int:
    return -length % 4


class Display:
    """One connection to display `:N` of this machine, authenticated with `cookie`; any
    failure, refusal or answer we cannot use is an X11Error."""

    def __init__(
        self, display: int, cookie: bytes, timeout: float = 10.0, socket_dir: str = SOCKET_DIR
    ) -> None:
        if not 0 <= display < 10000:
            raise X11Error(f"display :{display} is not a display number")
        if len(cookie) != 16:
            raise X11Error("an MIT-MAGIC-COOKIE-1 has 16 bytes")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._sock.settimeout(timeout)
        self._sequence = 0
        try:
            self._sock.connect(f"{socket_dir}/X{display}")
            self.screen = self._setup(cookie)
        except OSError as exc:
            self._sock.close()
            raise X11Error(f"cannot reach display :{display}: {exc}") from None
        except X11Error:
            self._sock.close()
            raise

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Display:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _read(self, count: int) -> bytes:
        data = bytearray()
        while len(data) < count:
            try:
                chunk = self._sock.recv(min(count - len(data), 1 << 20))
            except OSError as exc:  # the timeout too: a display that stopped answering
                raise X11Error(f"the display did not answer: {exc}") from None
            if not chunk:
                raise X11Error("the display closed the connection")
            data += chunk
        return bytes(data)

    def _send(self, request: bytes) -> None:
        try:
            self._sock.sendall(request)
        except OSError as exc:
            raise X11Error(f"the display did not take a request: {exc}") from None

    def _setup(self, cookie: bytes) -> Screen:
        request = (
            struct.pack("<BxHHHHxx", ord("l"), 11, 0, len(COOKIE_AUTH), len(cookie))
            + COOKIE_AUTH
            + b"\0" * _pad(len(COOKIE_AUTH))
            + cookie
            + b"\0" * _pad(len(cookie))
        )
        self._send(request)
        status, reason_length, _, _, extra = struct.unpack("<BBHHH", self._read(8))
        if extra * 4 > MAX_SETUP_BYTES:
            raise X11Error(f"the display's setup answer is {extra * 4} bytes long")
        body = self._read(extra * 4)
        if status != 1:
            said = body[: reason_length if status == 0 else len(body)].rstrip(b"\0")
            reason = said.decode("ascii", "replace").strip() or "no reason given"
            raise X11Error(f"the display refused the connection: {reason}")
        return _first_screen(body)

    def _reply(self, request: bytes, limit: int) -> tuple[bytes, bytes]:
        """Send one request and read its reply: (the 32-byte header, the rest)."""
        self._sequence = (self._sequence + 1) & 0xFFFF
        self._send(request)
        while True:
            header = self._read(32)
            kind, detail, sequence = struct.unpack_from("<BBH", header)
            if kind == 0:  # an error
                raise X11Error(f"the display answered with X error {detail}")
            if kind != 1:
                continue  # an event: none is selected, but the server may send some
            if sequence != self._sequence:
                raise X11Error("the display answered out of turn")
            (length,) = struct.unpack_from("<I", header, 4)
            if length * 4 > limit:
                raise X11Error(f"the display's answer is {length * 4} bytes long")
            return header, self._read(length * 4)

    def pointer(self) -> tuple[int, int]:
        """Where the pointer is on the screen."""
        request = struct.pack("<BxHI", QUERY_POINTER, 2, self.screen.root)
        header, _ = self._reply(request, 0)
        x, y = struct.unpack_from("<hh", header, 16)
        return x, y

    def image(self) -> bytes:
        """The whole screen as packed RGB, three bytes a pixel, row after row."""
        screen = self.screen
        request = struct.pack(
            "<BBHIhhHHI",
            GET_IMAGE,
            Z_PIXMAP,
            5,
            screen.root,
            0,
            0,
            screen.width,
            screen.height,
            ALL_PLANES,
        )
        stride = (
            (screen.width * screen.bits_per_pixel + screen.scanline_pad - 1)
            // (screen.scanline_pad)
            * screen.scanline_pad
            // 8
        )
        _, data = self._reply(request, MAX_IMAGE_BYTES)
        if len(data) < stride * screen.height:
            raise X11Error(f"the display sent {len(data)} bytes for a {stride}-byte-row image")
        return to_rgb(data, screen, stride)


def _first_screen(body: bytes) -> Screen:
    """The first screen of a connection setup's answer, in a format we can read: 24 or 32
    bits a pixel, 8 bits a colour (what Xvfb and every true-colour server give)."""
    try:
        (vendor_length,) = struct.unpack_from("<H", body, 16)
        screens, formats, byte_order = struct.unpack_from("<BBB", body, 20)
        offset = 32 + vendor_length + _pad(vendor_length)
        pixmap_formats = {}
        for _ in range(formats):
            depth, bits, pad = struct.unpack_from("<BBB", body, offset)
            pixmap_formats[depth] = (bits, pad)
            offset += 8
        if screens < 1:
            raise X11Error("the display has no screen")
        (root,) = struct.unpack_from("<I", body, offset)
        width, height = struct.unpack_from("<HH", body, offset + 20)
        (root_visual,) = struct.unpack_from("<I", body, offset + 32)
        root_depth, depths = struct.unpack_from("<BB", body, offset + 38)
        offset += 40
        masks = None
        for _ in range(depths):
            _, visuals = struct.unpack_from("<BxH", body, offset)
            offset += 8
            for _ in range(visuals):
                visual, _, _, _, red, green, blue = struct.unpack_from("<IBBHIII", body, offset)
                if visual == root_visual:
                    masks = (red, green, blue)
                offset += 24
    except struct.error:
        raise X11Error("the display's setup answer is cut short") from None
    if masks is None or root_depth not in pixmap_formats:
        raise X11Error("the display's screen has no visual or pixmap format of its own")
    bits, pad = pixmap_formats[root_depth]
    if (
        bits not in (24, 32)
        or pad not in (8, 16, 32)
        or sorted(masks)
        != [
            0xFF,
            0xFF00,
            0xFF0000,
        ]
    ):
        raise X11Error(
            f"the display's screen has {bits} bits a pixel with colour masks "
            f"{[hex(m) for m in masks]}; only 8 bits a colour are read"
        )
    return Screen(root, width, height, root_depth, bits, pad, *masks, lsb_first=byte_order == 0)


def to_rgb(data: bytes, screen: Screen, stride: int) -> bytes:
    """Packed RGB from a ZPixmap's rows: each colour's byte picked by its mask, every
    row at once (a pixel at a time took half a second for a 1366 x 768 screen)."""
    step = screen.bits_per_pixel // 8
    row_bytes = screen.width * step
    pixels = (
        data
        if stride == row_bytes
        else b"".join(data[row * stride : row * stride + row_bytes] for row in range(screen.height))
    )[: row_bytes * screen.height]
    rgb = bytearray(screen.width * screen.height * 3)
    for channel, mask in enumerate((screen.red_mask, screen.green_mask, screen.blue_mask)):
        significance = mask.bit_length() // 8 - 1  # 0 for 0xff, 1 for 0xff00, 2 for ...
        index = significance if screen.lsb_first else step - 1 - significance
        rgb[channel::3] = pixels[index::step]
    return bytes(rgb)
