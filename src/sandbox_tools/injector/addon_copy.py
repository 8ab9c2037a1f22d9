"""An add-on on the host: its archive decompressed once for sandboxes whose bytes are
cheap, and its tree unpacked once for the containers we make to mount read-only.

xz decompression on one core in the sandbox was most of a browser's first call (about
7 of 8 s); the bytes themselves cross a local engine's exec stream at about 300 MiB/s.
So where the engine runs on this host (`Sandbox.bytes_are_cheap`) the add-on travels as
its plain tar, decompressed here once per archive and kept in the cache beside a small
record: `tar/<archive sha256>.tar` and `tar/<archive sha256>.json`. The containers we
make on a local engine (docker_sdk, the MCP gateway) get the tree itself instead,
unpacked once into `tree/` and mounted read-only (`browser_mount`): nothing is sent.

The copy is made from the located archive in one pass, which checks on the way that the
archive has the pinned SHA-256 and that the tar unpacks to the pinned tree digest; a
copy that fails either is never kept. The copy is a cache, not a pin: the sandbox checks
the tree it unpacked against the pinned tree digest on every install, so a copy changed
on the host afterwards fails there (and `forget_if_changed`
drops it, so the next call makes it again). No digest is computed on the host when a
copy exists.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import lzma
import mmap
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sandbox_tools.artifacts import (
    Artifact,
    ArtifactFormat,
    ArtifactKind,
    atomic_output,
    atomic_write,
    sha256_of,
)
from sandbox_tools.cache import cache_root, one_builder
from sandbox_tools.errors import SandboxInjectionError, SandboxToolsError
from sandbox_tools.injector.acquire import present_artifact
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.platforms import Arch
from sandbox_tools.runtime.addons import (
    PLAIN,
    AddonError,
    Readable,
    TreeDigest,
    algorithm_of,
    digest_of_archive,
    install,
)
from sandbox_tools.runtime.paths import ADDON_MOUNT_ROOT
from sandbox_tools.settings import load_settings

__all__ = [
    "ADDONS_ON_HOST",
    "AddonMount",
    "PlainCopy",
    "addon_tree",
    "addons_on_host",
    "browser_mount",
    "forget_if_changed",
    "mapped",
    "mount_target",
    "plain_copy",
]

# Where in the cache the add-ons on the host are (InjectionOptions.addons_on_host).
ADDONS_ON_HOST = "addons"


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlainCopy:
    """The plain tar of an add-on archive on the host, and what the sandbox checks it by."""

    path: Path
    sha256: str
    size: int


def _paths(artifact: Artifact, directory: Path) -> tuple[Path, Path]:
    return directory / f"{artifact.sha256}.tar", directory / f"{artifact.sha256}.json"


def _recorded(artifact: Artifact, directory: Path) -> PlainCopy | None:
    """The copy the record describes, if the record is whole and the file has its size."""
    tar, record = _paths(artifact, directory)
    try:
        said = json.loads(record.read_text())
        sha256, size = said["sha256"], said["size"]
        if not (isinstance(sha256, str) and isinstance(size, int)) or said["tree"] != (
            artifact.tree.digest if artifact.tree else None
        ):
            return None
        if tar.stat().st_size != size:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return PlainCopy(tar, sha256, size)


@functools.lru_cache(maxsize=2)
def mapped(path: Path, size: int, mtime_ns: int) -> memoryview:
    """A plain copy's bytes as a read-only view of the file, shared by every sandbox it
    is sent to: reading its 310 MB into this process cost 0.15-0.5 s of fresh pages on the
    first copied call (the page cache holds them already). The key changes when the file
    does; a copy is replaced by a rename, never changed in place, so the mapped inode
    stays whole (the sandbox checks the tree it unpacks against the pin either way)."""
    with path.open("rb") as handle:
        if os.fstat(handle.fileno()).st_size != size:
            raise OSError(f"{path} changed while it was opened")
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        return memoryview(mmap.mmap(handle.fileno(), size, flags=flags, prot=mmap.PROT_READ))


def plain_copy(artifact: Artifact, directory: Path) -> PlainCopy:
    """The plain tar of `artifact` (a located tar.xz add-on with a tree digest) in
    `directory`, made now if there is none; one maker per host at a time."""
    tree = _pinned_tree(artifact)
    found = _recorded(artifact, directory)
    if found is not None:
        return found
    tar, record = _paths(artifact, directory)
    with one_builder(tar):
        found = _recorded(artifact, directory)
        if found is not None:
            return found
        # What a maker killed half-way left (the lock is ours: nobody writes them now).
        for left in directory.glob(f".{tar.name}.*.partial"):
            left.unlink(missing_ok=True)
        made = _make(artifact, tar)
        atomic_write(
            record, json.dumps({"sha256": made.sha256, "size": made.size, "tree": tree.digest})
        )
        return made


def _make(artifact: Artifact, tar: Path) -> PlainCopy:
    """Decompress the archive into `tar`, checked against the record on the way (a copy
    that fails a check never appears at `tar`)."""
    tree = _pinned_tree(artifact)
    tar.parent.mkdir(parents=True, exist_ok=True)
    with (
        atomic_output(tar) as out,
        artifact.located.open("rb") as raw,
        lzma.LZMAFile(packed := Hashing(raw)) as unpacked,  # type: ignore[arg-type]
    ):
        # The archive's bytes are hashed as read (`packed`, as pinned); the tar that
        # comes out of xz is hashed and written out while its tree is digested.
        plain = Hashing(unpacked, sink=out)
        try:
            found = digest_of_archive(plain, PLAIN, algorithm_of(tree.digest))
        except (AddonError, OSError, EOFError, ValueError) as exc:
            raise _refused(artifact, f"it cannot be read: {exc}") from None
        while packed.read(1 << 20):
            pass
        if packed.digest.hexdigest() != artifact.sha256:
            raise _refused(artifact, f"its SHA-256 is {packed.digest.hexdigest()}")
        if found.digest != tree.digest:
            raise _refused(artifact, f"it unpacks to the tree {found.digest}")
    log.info("decompressed %s for engines on this host: %s", artifact.name, tar)
    return PlainCopy(tar, plain.digest.hexdigest(), plain.size)


def _pinned_tree(artifact: Artifact) -> TreeDigest:
    """The tree digest of an add-on archive's record; ValueError for anything else."""
    if artifact.format is not ArtifactFormat.TAR_XZ or artifact.tree is None:
        raise ValueError(f"{artifact.name} is not an add-on archive with a tree digest")
    return artifact.tree


class Hashing:
    """A read-only stream that hashes (SHA-256) and counts what is read through it, and
    copies it to `sink` if one is given."""

    def __init__(self, raw: Readable, sink: IO[bytes] | None = None) -> None:
        self.raw = raw
        self.sink = sink
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1, /) -> bytes:
        data = self.raw.read(size)
        self.digest.update(data)
        self.size += len(data)
        if self.sink is not None:
            self.sink.write(data)
        return data


def _refused(artifact: Artifact, why: str) -> SandboxInjectionError:
    return SandboxInjectionError(
        f"{artifact.name} at {artifact.located} is not the pinned add-on: {why}",
        remedy="Fetch or build it again (tools fetch --with-browser, tools build --with-browser).",
    )


def forget_if_changed(copy: PlainCopy) -> bool:
    """Drop `copy` if it no longer has the SHA-256 it was made with (changed on the host
    since; a sandbox's install from it failed): the next call makes it again from the
    pinned archive. Whether it was dropped."""
    try:
        same = sha256_of(copy.path) == copy.sha256
    except OSError:
        same = False
    if not same:
        for path in (copy.path, copy.path.with_suffix(".json")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        log.warning("dropped %s: it changed since it was made from its pinned archive", copy.path)
    return not same


def mount_target(kind: str, tree: TreeDigest) -> str:
    """Where a container we make sees the add-on of `tree`, by its digest."""
    return f"{ADDON_MOUNT_ROOT}/{kind}-{tree.digest.partition(':')[2][:16]}"


def addon_tree(artifact: Artifact, copies: Path, trees: Path) -> Path:
    """`artifact`'s tree unpacked on the host and checked against its pinned digest, by
    the runtime's own `install` (the same unpacking rules as in a sandbox), for mounting
    read-only into the containers we make; made once per tree, one maker at a time. A
    tree is only ever renamed into place whole and checked, so one that is there is one
    that passed."""
    tree = _pinned_tree(artifact)
    dest = trees / tree.digest.replace(":", "-")
    if dest.is_dir():
        return dest
    with one_builder(dest):
        if dest.is_dir():
            return dest
        for left in trees.glob(f".{dest.name}-*.partial"):  # a maker killed half-way
            shutil.rmtree(left, ignore_errors=True)
        copy = plain_copy(artifact, copies)
        try:
            with copy.path.open("rb") as handle:
                install(str(dest), tree.digest, tree.size, handle, PLAIN)
        except AddonError as exc:
            forget_if_changed(copy)
            raise _refused(artifact, str(exc)) from None
    log.info("unpacked %s for the containers made here: %s", artifact.name, dest)
    return dest


def addons_on_host(options: InjectionOptions) -> tuple[Path, Path]:
    """Where this host keeps add-ons' plain tars and their unpacked trees: under the
    options' directory, else the cache's."""
    root = options.addons_on_host or cache_root(load_settings()) / ADDONS_ON_HOST
    return root / "tar", root / "tree"


@dataclass(frozen=True)
class AddonMount:
    """A host directory for the engine to mount read-only at `target` in a container."""

    source: Path
    target: str


def browser_mount(arch: Arch, options: InjectionOptions) -> AddonMount | None:
    """The browser add-on's tree for a container we are about to make for `arch`, if the
    add-on is on this host already (in the wheel, fetched into the cache, or in dist/:
    nothing is downloaded or built for it); None otherwise, and the container's first
    browser call sends it. The first container of a host pays the unpacking (seconds),
    every later one nothing."""
    try:
        artifact = options.browser_artifact or present_artifact(
            arch, ArtifactFormat.TAR_XZ, options.sources, kind=ArtifactKind.BROWSER
        )
    except SandboxInjectionError as exc:
        log.debug("no browser add-on to mount for %s: %s", arch.platform, exc)
        return None
    if artifact.tree is None or artifact.platform != arch.platform:
        return None
    tree = addon_tree(artifact, *addons_on_host(options))
    return AddonMount(tree, mount_target("browser", artifact.tree))


def docker_addon_mounts(client: Any, image: str, options: InjectionOptions) -> list[Any]:
    """The docker SDK `mounts` for a container of `image` we are about to make: the
    browser add-on's checked tree, read-only, where the engine runs on this host (it
    reads the directory from this host's file system) and the add-on is here; else
    none. Making them never fails the container: a problem is logged, and the first
    browser call then sends the add-on as it would anyway."""
    import docker
    from docker.types import Mount

    from sandbox_tools.sandboxes.docker_api import engine_api

    if not engine_api(client).on_this_host:
        return []
    try:
        arch = Arch.parse(str(client.images.get(image).attrs.get("Architecture")))
        mount = browser_mount(arch, options)
    except (ValueError, OSError, SandboxToolsError, docker.errors.DockerException) as exc:
        log.warning("the browser add-on is not mounted into a container of %s: %s", image, exc)
        return []
    if mount is None:
        return []
    return [Mount(mount.target, str(mount.source), type="bind", read_only=True)]
