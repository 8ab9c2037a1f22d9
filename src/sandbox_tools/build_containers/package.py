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

import os
import stat
import struct
import zlib
from pathlib import Path

import lz4.block

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


def pack_portable(launcher: Path, tree: Path, tree_id: str, output: Path) -> None:
    """Write the single-file artifact atomically (temp file, then rename)."""
    if len(tree_id) != 32:
        raise ValueError("tree id must be 32 hex characters")
    archive = build_archive(tree)
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
    partial = output.with_name(output.name + ".partial")
    with partial.open("wb") as handle:
        handle.write(head)
        handle.write(payload)
        handle.write(trailer)
    partial.chmod(0o755)
    partial.replace(output)
