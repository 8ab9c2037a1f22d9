"""A tree as one deterministic tar + xz, and read back: the browser add-on's packing.

Standard library only: the builder container runs it (copied in with the ELF reader),
`tools validate --static` reads what it wrote, and the runtime will unpack it with
`tarfile` and `lzma` alone. Members are sorted, owned by nobody, of one mtime and mode
0644 or 0755; no links, devices or absolute paths. The tar is compressed in pieces of
XZ_PIECE bytes, each one complete .xz stream, side by side on every core, and the
streams are concatenated (the xz format allows it; `lzma` and `tarfile` read them as one),
so the bytes do not depend on the number of cores.
"""

from __future__ import annotations

import io
import lzma
import os
import tarfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

XZ_PRESET = 9  # 64 MiB dictionary: ~1 % smaller than preset 6 here (benchmarks/browser_addon.py)
XZ_PIECE = 64 << 20
EPOCH = 315532800  # 1980-01-01: the same mtime for every member


def _member(name: str, size: int, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, mode, EPOCH
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_archive(files: dict[str, str], documents: dict[str, bytes], output: str) -> None:
    """`files` (tree path -> file to copy) and `documents` (tree path -> bytes) as
    `output`, a tar.xz written whole or not at all."""
    plain = output + ".tar"
    with tarfile.open(plain, mode="w", format=tarfile.PAX_FORMAT) as tar:
        directories = sorted({d for p in [*files, *documents] for d in ancestors(p)})
        for directory in directories:
            info = _member(directory, 0, 0o755)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name in sorted([*files, *documents]):
            if name in documents:
                data = documents[name]
                tar.addfile(_member(name, len(data), 0o644), io.BytesIO(data))
                continue
            source = files[name]
            mode = 0o755 if os.access(source, os.X_OK) or is_elf_path(source) else 0o644
            with open(source, "rb") as handle:
                tar.addfile(_member(name, os.path.getsize(source), mode), handle)

    def pieces() -> Iterator[bytes]:
        with open(plain, "rb") as handle:
            yield from iter(lambda: handle.read(XZ_PIECE), b"")

    def compress(piece: bytes) -> bytes:
        return lzma.compress(piece, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=XZ_PRESET)

    partial = output + ".partial"
    with open(partial, "wb") as sink, ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for packed in pool.map(compress, pieces()):  # lzma releases the GIL
            sink.write(packed)
    os.unlink(plain)
    os.replace(partial, output)


def ancestors(path: str) -> list[str]:
    """Every directory above a member: "lib/nss/x" -> ["lib", "lib/nss"]."""
    parts = path.split("/")[:-1]
    return ["/".join(parts[: n + 1]) for n in range(len(parts))]


def is_elf_path(path: str) -> bool:
    with open(path, "rb") as handle:
        return handle.read(4) == b"\x7fELF"


def read_archive(path: str) -> Iterator[tuple[tarfile.TarInfo, bytes]]:
    """Every member with its content (empty for directories), in archive order."""
    with tarfile.open(path, mode="r:xz") as tar:
        for member in tar:
            handle = tar.extractfile(member) if member.isfile() else None
            yield member, handle.read() if handle is not None else b""
