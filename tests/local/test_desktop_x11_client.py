"""The runtime's X11 client (runtime/tools/desktop/x11.py) against servers that answer
what a real one would not: the display may be the agent's (it can take a display number
first), so whatever it sends is checked, bounded and refused with a reason, never a
traceback, a hang or a huge allocation. A real Xvfb: tests/integration/test_desktop_x11.py."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox_tools.runtime.tools.desktop.png import draw_pointer, encode
from sandbox_tools.runtime.tools.desktop.x11 import Display, X11Error

COOKIE = bytes(range(16))
Answer = Callable[[socket.socket], None]


def setup_reply(
    width: int = 4,
    height: int = 2,
    bits: int = 32,
    byte_order: int = 0,
    masks: tuple[int, int, int] = (0xFF0000, 0xFF00, 0xFF),
) -> bytes:
    """A success answer to the connection setup: one screen of depth 24, one visual."""
    vendor = b"test"
    visual = struct.pack("<IBBHIII4x", 0x21, 4, 8, 256, *masks)
    depth = struct.pack("<BxH4x", 24, 1) + visual
    screen = (
        struct.pack("<IIIII", 0x100, 0, 0xFFFFFF, 0, 0)
        + struct.pack("<HHHHHH", width, height, 300, 200, 1, 1)
        + struct.pack("<IBBBB", 0x21, 0, 0, 24, 1)
        + depth
    )
    body = (
        struct.pack("<IIII", 1, 0x200000, 0x1FFFFF, 0)
        + struct.pack("<HHBBBBBBBB4x", len(vendor), 0xFFFF, 1, 1, byte_order, 0, 32, 32, 8, 255)
        + vendor
        + struct.pack("<BBB5x", 24, bits, 32)
        + screen
    )
    return struct.pack("<BxHHH", 1, 11, 0, len(body) // 4) + body


def reply(sequence: int, data: bytes, extra: bytes = b"\0" * 24) -> bytes:
    return struct.pack("<BBHI", 1, 24, sequence, len(data) // 4) + extra + data


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[Answer], Display]]:
    """A one-connection X server on display :7 in tmp_path that reads the client's setup
    and then does what the test's `answer` says; a Display connected to it."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "X7"))
    listener.listen()
    threads: list[threading.Thread] = []

    def start(answer: Answer) -> Display:
        def run() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.recv(1024)  # the setup request (12 bytes and the cookie)
                answer(connection)
                with contextlib.suppress(OSError):  # a client that gave up may reset it
                    connection.recv(1024)  # until the client is done with it

        threads.append(threading.Thread(target=run, daemon=True))
        threads[-1].start()
        return Display(7, COOKIE, timeout=2, socket_dir=str(tmp_path))

    yield start
    listener.close()


def test_the_servers_refusal_is_said_with_its_reason(serve: Callable[[Answer], Display]) -> None:
    reason = b"Authorization required, but no authorization protocol specified"
    padded = reason + b"\0" * (-len(reason) % 4)
    refusal = struct.pack("<BBHHH", 0, len(reason), 11, 0, len(padded) // 4) + padded
    with pytest.raises(X11Error, match="refused the connection: Authorization required"):
        serve(lambda c: c.sendall(refusal))


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        pytest.param(struct.pack("<BxHHH", 1, 11, 0, 0xFFFF), "the display closed", id="cut"),
        pytest.param(setup_reply()[:60], "closed the connection", id="short-body"),
        pytest.param(
            struct.pack("<BxHHH", 1, 11, 0, 2) + b"\0" * 8, "cut short", id="nonsense-body"
        ),
        pytest.param(setup_reply(bits=16), "only 8 bits a colour", id="16-bit"),
        pytest.param(
            setup_reply(masks=(0xF800, 0x7E0, 0x1F)), "only 8 bits a colour", id="565-masks"
        ),
        pytest.param(b"", "did not answer", id="silence"),
    ],
)
def test_a_setup_answer_we_cannot_use_is_refused(
    serve: Callable[[Answer], Display], answer: bytes, reason: str
) -> None:
    def send(connection: socket.socket) -> None:
        connection.sendall(answer)
        if answer and reason != "did not answer":
            connection.shutdown(socket.SHUT_WR)

    with pytest.raises(X11Error, match=reason):
        serve(send)


def test_the_screen_and_the_pointer_are_read_in_either_byte_order(
    serve: Callable[[Answer], Display],
) -> None:
    """Pixels of 32 bits: a server that sends its least significant byte first puts blue
    first; one that sends the most significant first puts its padding first."""
    for byte_order, pixel in ((0, b"\x30\x20\x10\x00"), (1, b"\x00\x10\x20\x30")):

        def answer(
            connection: socket.socket, byte_order: int = byte_order, pixel: bytes = pixel
        ) -> None:
            connection.sendall(setup_reply(byte_order=byte_order))
            connection.recv(64)  # QueryPointer
            pointer = struct.pack("<IIhhhhH6x", 0x100, 0, 3, 1, 3, 1, 0)
            connection.sendall(struct.pack("<BBHI", 1, 1, 1, 0) + pointer)
            connection.recv(64)  # GetImage
            connection.sendall(reply(2, pixel * 8, struct.pack("<I20x", 0x21)))

        with serve(answer) as display:
            assert (display.screen.width, display.screen.height) == (4, 2)
            assert display.pointer() == (3, 1)
            assert display.image() == bytes.fromhex("102030") * 8


@pytest.mark.parametrize(
    ("image_answer", "reason"),
    [
        pytest.param(struct.pack("<BBH28x", 0, 8, 2), "X error 8", id="x-error"),
        pytest.param(reply(9, b"\0" * 32), "out of turn", id="out-of-turn"),
        pytest.param(struct.pack("<BBHI24x", 1, 24, 2, 1 << 30), "bytes long", id="four-gigabytes"),
        pytest.param(reply(2, b"\0" * 8), "bytes for a", id="too-few-pixels"),
    ],
)
def test_an_image_answer_we_cannot_use_is_refused_unread(
    serve: Callable[[Answer], Display], image_answer: bytes, reason: str
) -> None:
    def answer(connection: socket.socket) -> None:
        connection.sendall(setup_reply())
        connection.recv(64)  # QueryPointer
        connection.sendall(struct.pack("<BBHI", 1, 1, 1, 0) + b"\0" * 24)
        connection.recv(64)  # GetImage
        connection.sendall(image_answer)

    with serve(answer) as display:
        display.pointer()
        with pytest.raises(X11Error, match=reason):
            display.image()


def test_a_png_holds_the_pixels_and_the_pointer_is_cut_at_the_edges() -> None:
    rgb = bytearray(b"\x10\x20\x30" * 6)
    draw_pointer(rgb, 3, 2, 2, 1)  # the tip in the last pixel: the rest is off screen
    assert rgb[-3:] == b"\0\0\0" and rgb[:-3] == b"\x10\x20\x30" * 5
    png = encode(bytes(rgb), 3, 2)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png.endswith(b"IEND\xaeB`\x82")
    with pytest.raises(ValueError, match="not a 2 x 2 RGB image"):
        encode(bytes(rgb), 2, 2)
