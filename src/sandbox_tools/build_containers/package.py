"""Packing the portable artifact: static launcher + compressed tree + trailer.

Layout (little-endian; resources/launcher.c reads it):
    [launcher ELF][payload][trailer: 72 bytes]
    payload = blocks of [u32 raw length][u32 compressed length][LZ4 block]
    archive (uncompressed) = entries of
        u8 type ('D' dir, 'F' file, 'L' symlink), u32 mode, u16 path length, path,
        u64 content length, u64 CRC-32 of the content, content
    trailer = b"SBXTPAY1", u64 payload offset, u64 payload size, u64 archive size,
              u64 archive CRC-32, 32 bytes tree id (ASCII hex)
Entries are sorted and carry no timestamps or owners, so the same tree gives the
same bytes.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import lz4.block

from sandbox_tools.artifacts import atomic_output

TRAILER_MAGIC = b"SBXTPAY1"
TRAILER = struct.Struct("<8sQQQQ32s")
ENTRY_HEADER = struct.Struct("<cIH")
ENTRY_SIZES = struct.Struct("<QQ")
BLOCK_HEADER = struct.Struct("<II")
BLOCK_SIZE = 4 * 1024 * 1024


def checksum(data: bytes) -> int:
    # The launcher's check of what it unpacked and wrote; authenticity is the SHA-256 of
    # the whole artifact, verified before it ever runs.
    return zlib.crc32(data)


def _entry(kind: bytes, mode: int, path: str, content: bytes) -> bytes:
    name = path.encode()
    return (
        ENTRY_HEADER.pack(kind, mode, len(name))
        + name
        + ENTRY_SIZES.pack(len(content), checksum(content))
        + content
    )


def build_archive(tree: Path) -> bytes:
    parts: list[bytes] = []
    for directory, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        base = Path(directory)
        for name in sorted(dirnames + filenames):
            path = base / name
            relative = path.relative_to(tree).as_posix()
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                parts.append(_entry(b"L", 0o777, relative, os.readlink(path).encode()))
            elif stat.S_ISDIR(info.st_mode):
                parts.append(_entry(b"D", 0o755, relative, b""))
            elif stat.S_ISREG(info.st_mode):
                mode = 0o755 if info.st_mode & 0o111 else 0o644  # readable by every user
                parts.append(_entry(b"F", mode, relative, path.read_bytes()))
    return b"".join(parts)


def compress(archive: bytes) -> bytes:
    blocks = []
    for start in range(0, len(archive), BLOCK_SIZE):
        raw = archive[start : start + BLOCK_SIZE]
        packed = lz4.block.compress(raw, mode="high_compression", compression=12, store_size=False)
        blocks.append(BLOCK_HEADER.pack(len(raw), len(packed)) + packed)
    return b"".join(blocks)


METADATA_ENTRY = ".sandbox-tools.json"  # sorts first: the first compressed block holds it


def pack_portable(
    launcher: Path,
    tree: Path,
    tree_id: str,
    output: Path,
    metadata: dict[str, str] | None = None,
) -> None:
    """Write the single-file artifact, whole or not at all.

    `metadata` (build id, version, platform, format) becomes the archive's first entry,
    so `read_metadata` answers from the first compressed block without unpacking the rest.
    """
    if len(tree_id) != 32:
        raise ValueError("tree id must be 32 hex characters")
    archive = build_archive(tree)
    if metadata is not None:
        document = json.dumps(metadata, sort_keys=True).encode()
        archive = _entry(b"F", 0o644, METADATA_ENTRY, document) + archive
    payload = compress(archive)
    head = launcher.read_bytes()
    trailer = TRAILER.pack(
        TRAILER_MAGIC,
        len(head),
        len(payload),
        len(archive),
        checksum(archive),
        tree_id.encode("ascii"),
    )
    with atomic_output(output, 0o755) as handle:
        handle.write(head)
        handle.write(payload)
        handle.write(trailer)


# -- the reader: what `tools validate --static` looks into --------------------------------

MAX_ARCHIVE = 512 * 1024 * 1024


class PayloadError(ValueError):
    """The artifact's payload cannot be read back as the packer wrote it."""


@dataclass(frozen=True)
class Trailer:
    payload_offset: int
    payload_size: int
    archive_size: int
    archive_crc: int
    tree_id: str


@dataclass(frozen=True)
class Entry:
    kind: str  # "D" directory, "F" file, "L" symlink (content: its target)
    mode: int
    path: str
    content: bytes


def read_trailer(data: bytes) -> Trailer:
    if len(data) < TRAILER.size:
        raise PayloadError("too short to carry a payload trailer")
    fields = TRAILER.unpack_from(data, len(data) - TRAILER.size)
    magic, offset, size, archive_size, crc, tree = fields
    if magic != TRAILER_MAGIC:
        raise PayloadError("no payload trailer")
    if offset + size + TRAILER.size != len(data) or archive_size > MAX_ARCHIVE:
        raise PayloadError("the trailer's offsets do not fit the file")
    return Trailer(offset, size, archive_size, crc, tree.decode("ascii", "replace"))


def _block_at(data: memoryview, position: int, room: int) -> tuple[bytes, int]:
    """The compressed block at `position`, decompressed, and where the next one starts."""
    try:
        raw, packed = BLOCK_HEADER.unpack_from(data, position)
        position += BLOCK_HEADER.size
        if raw > min(BLOCK_SIZE, room):
            raise PayloadError("a compressed block claims more than the archive holds")
        block = lz4.block.decompress(
            bytes(data[position : position + packed]), uncompressed_size=raw
        )
    except (struct.error, lz4.block.LZ4BlockError) as exc:
        raise PayloadError(f"bad compressed block ({exc})") from None
    return block, position + packed


def _entry_at(archive: bytes | bytearray, at: int) -> tuple[Entry, int]:
    """The archive entry at `at`, its CRC-32 checked, and where the next one starts."""
    try:
        raw_kind, mode, name_size = ENTRY_HEADER.unpack_from(archive, at)
        kind = raw_kind.decode()
        at += ENTRY_HEADER.size
        path = archive[at : at + name_size].decode()
        at += name_size
        size, crc = ENTRY_SIZES.unpack_from(archive, at)
        at += ENTRY_SIZES.size
    except (struct.error, UnicodeDecodeError) as exc:
        raise PayloadError(f"bad archive entry ({exc})") from None
    content = bytes(archive[at : at + size])
    if len(content) != size or checksum(content) != crc:
        raise PayloadError(f"{path}: content differs from its CRC-32")
    return Entry(kind, mode, path, content), at + size


def read_payload(data: bytes) -> tuple[Trailer, list[Entry]]:
    """Every entry of a portable artifact's tree, checked as the launcher checks them."""
    trailer = read_trailer(data)
    start = trailer.payload_offset
    payload = memoryview(data)[start : start + trailer.payload_size]
    archive = bytearray()
    position = 0
    while position < len(payload):
        block, position = _block_at(payload, position, trailer.archive_size - len(archive))
        archive += block
    if len(archive) != trailer.archive_size or checksum(bytes(archive)) != trailer.archive_crc:
        raise PayloadError("the archive's size or CRC-32 differs from the trailer's")
    entries: list[Entry] = []
    at = 0
    while at < len(archive):
        entry, at = _entry_at(archive, at)
        entries.append(entry)
    return trailer, entries


def read_metadata(data: bytes) -> dict[str, str] | None:
    """The metadata entry, from the first compressed block only; None if there is none."""
    trailer = read_trailer(data)
    block, _ = _block_at(memoryview(data), trailer.payload_offset, trailer.archive_size)
    entry, _ = _entry_at(block, 0)
    if entry.kind != "F" or entry.path != METADATA_ENTRY:
        return None
    content = entry.content
    try:
        document = json.loads(content)
    except ValueError:
        raise PayloadError("the metadata entry is not JSON") from None
    if not isinstance(document, dict):
        raise PayloadError("the metadata entry is not a JSON object")
    return {str(k): str(v) for k, v in document.items()}
