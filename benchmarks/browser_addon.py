"""The browser add-on per architecture: build time (cold and warm), tree size, and the
size of the same tree in other packings.

Cold: the add-on's cache entry for the current build id is set aside first (the
downloaded .debs and the builder images stay: they are shared inputs), so the build
unpacks, assembles and compresses for real; warm: the same call again (an unchanged
build id). Then the tree read back with the standard library (the time the runtime's
unpack will take, without writing) and packed other ways for comparison: gzip -6, and
xz at preset 6 in the same independent pieces as the artifact.
Usage: .venv/bin/python benchmarks/browser_addon.py [--arch amd64 --arch arm64] [--out DIR]
"""

from __future__ import annotations

import argparse
import gzip
import io
import lzma
import shutil
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sandbox_tools.artifacts import ArtifactKind
from sandbox_tools.build_containers.addon import build_addon, built_addon_cache
from sandbox_tools.build_containers.records import addon_build_id
from sandbox_tools.build_containers.tree_archive import XZ_PIECE
from sandbox_tools.platforms import Arch, parse_arches
from sandbox_tools.sandboxes.containers import ContainerPolicy
from sandbox_tools.sandboxes.engines import docker_client
from sandbox_tools.sandboxes.images import RootfsStore

ROOTS, CONTAINERS = RootfsStore.from_cascade(), ContainerPolicy.from_cascade()


def _timed_build(arch: Arch, out: Path, cold: bool) -> tuple[float, Path]:
    cached = built_addon_cache(
        ArtifactKind.BROWSER, addon_build_id(ArtifactKind.BROWSER, arch), ROOTS
    )
    aside = cached.with_suffix(".aside")
    if cold and cached.exists():
        cached.replace(aside)
    for stale in out.glob("*"):
        stale.unlink()
    try:
        started = time.monotonic()
        record = build_addon(
            docker_client(), ArtifactKind.BROWSER, arch, out, lambda _: None, ROOTS, CONTAINERS
        )
        return time.monotonic() - started, out / record.name
    finally:
        if aside.exists():
            aside.unlink()


def _plain_tar(artifact: Path) -> tuple[bytes, float, int]:
    """The uncompressed tar, the seconds `tarfile` took to read every member, tree bytes."""
    started = time.monotonic()
    tree = 0
    with tarfile.open(artifact, mode="r:xz") as tar:
        for member in tar:
            handle = tar.extractfile(member) if member.isfile() else None
            if handle is not None:
                tree += len(handle.read())
    seconds = time.monotonic() - started
    with lzma.open(artifact) as plain:
        return plain.read(), seconds, tree


def _xz_pieces(data: bytes, preset: int) -> int:
    pieces = [data[at : at + XZ_PIECE] for at in range(0, len(data), XZ_PIECE)]
    with ThreadPoolExecutor() as pool:
        return sum(len(p) for p in pool.map(lambda b: lzma.compress(b, preset=preset), pieces))


def _gzip(data: bytes, level: int) -> int:
    sink = io.BytesIO()
    with gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=level, mtime=0) as handle:
        handle.write(data)
    return len(sink.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", help="amd64, arm64 (default: both)")
    parser.add_argument("--out", type=Path, help="where the artifacts go (default: a temp dir)")
    args = parser.parse_args()
    arches = parse_arches(args.arch) if args.arch else list(Arch)
    console = Console()
    builds = Table(title="browser add-on: build")
    for column in ("arch", "cold build", "warm build", "tree", "tar.xz (the artifact)"):
        builds.add_column(column)
    packings = Table(title="browser add-on: the same tree packed other ways")
    for column in ("arch", "packing", "size", "pack time"):
        packings.add_column(column)
    out_root = args.out or Path(tempfile.mkdtemp(prefix="browser-bench-"))
    for arch in arches:
        out = out_root / arch.value
        out.mkdir(parents=True, exist_ok=True)
        cold, artifact = _timed_build(arch, out, cold=True)
        warm, _ = _timed_build(arch, out, cold=False)
        plain, read_seconds, tree = _plain_tar(artifact)
        size = artifact.stat().st_size
        builds.add_row(
            arch.value, f"{cold:.0f} s", f"{warm:.1f} s", f"{tree / 2**20:.0f} MiB",
            f"{size / 1e6:.1f} MB",
        )  # fmt: skip
        packings.add_row(arch.value, "tar (none)", f"{len(plain) / 1e6:.1f} MB", "")
        packings.add_row(arch.value, "tar.xz preset 9 (the artifact)", f"{size / 1e6:.1f} MB", "")
        for name, pack, level in (
            ("tar.xz preset 6, same pieces", _xz_pieces, 6),
            ("tar.gz -6", _gzip, 6),
        ):
            started = time.monotonic()
            packed = pack(plain, level)
            packings.add_row(
                arch.value, name, f"{packed / 1e6:.1f} MB", f"{time.monotonic() - started:.0f} s"
            )
        packings.add_row(
            arch.value, "read back by tarfile + lzma (no writes)", "", f"{read_seconds:.1f} s"
        )
    console.print(builds)
    console.print(packings)
    if args.out is None:
        shutil.rmtree(out_root, ignore_errors=True)


if __name__ == "__main__":
    main()
