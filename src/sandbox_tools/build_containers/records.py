"""Build ids: what an artifact's bytes are made from (the record itself is in artifacts.py).

Build id = digest of everything that determines the artifact's bytes: the runtime's
sources, the locked build dependencies, the build recipe (launcher, freeze script,
packer), the builder image recipe, the format and the architecture. An unchanged
build id means there is nothing to build.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from sandbox_tools._version import __version__
from sandbox_tools.artifacts import RECORD_SCHEMA, ArtifactFormat, ArtifactKind
from sandbox_tools.build_containers.addon_recipes import ADDONS, BUILD_CONTAINERS, RECIPES
from sandbox_tools.platforms import Arch
from sandbox_tools.recipes import RootfsRecipe

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # src/sandbox_tools
# What each add-on's assemble.py imports of ours: the common assembly, the ELF reader,
# the packer and the (import-free) packages above them, copied into the builder as they are.
ASSEMBLER_IMPORTS = {
    "/src/sandbox_tools/__init__.py": _PACKAGE_ROOT / "__init__.py",
    "/src/sandbox_tools/_version.py": _PACKAGE_ROOT / "_version.py",
    "/src/sandbox_tools/build_containers/__init__.py": BUILD_CONTAINERS / "__init__.py",
    "/src/sandbox_tools/build_containers/debian_tree.py": BUILD_CONTAINERS / "debian_tree.py",
    "/src/sandbox_tools/build_containers/elf.py": BUILD_CONTAINERS / "elf.py",
    "/src/sandbox_tools/build_containers/tree_archive.py": BUILD_CONTAINERS / "tree_archive.py",
}
# An add-on's tree is assembled in the amd64 builder for both architectures (unpack,
# read ELF files, tar, xz: nothing under QEMU); what it compiles in the target's builder.
ASSEMBLY_ARCH = Arch.AMD64


def build_inputs(package_root: Path = _PACKAGE_ROOT) -> list[Path]:
    """Every file whose content goes into an artifact (sorted, for a stable digest)."""
    shared = [
        package_root / name
        for name in ("__init__.py", "_version.py", "protocol.py", "platforms.py")
    ]
    runtime = sorted((package_root / "runtime").rglob("*.py"))
    build_containers = package_root / "build_containers"
    recipe = sorted(p for p in (build_containers / "resources").iterdir() if p.is_file())
    packer = [build_containers / "package.py", build_containers / "builder.py"]
    return sorted({*shared, *runtime, *recipe, *packer})


# Each input's SHA-256 by path, with the size and modification time it was read at: the
# build id is computed on every injection (the probe's install tags, the acquisition),
# each time over every runtime source. A file is read again when either moved.
_DIGESTS: dict[Path, tuple[int, int, bytes]] = {}


def _input_digest(path: Path) -> bytes:
    info = path.stat()
    known = _DIGESTS.get(path)
    if known is not None and known[:2] == (info.st_size, info.st_mtime_ns):
        return known[2]
    digest = hashlib.sha256(path.read_bytes()).digest()
    _DIGESTS[path] = (info.st_size, info.st_mtime_ns, digest)
    return digest


def compute_build_id(
    arch: Arch, fmt: ArtifactFormat, builder_digest: str, package_root: Path = _PACKAGE_ROOT
) -> str:
    digest = hashlib.sha256()
    header = {
        "version": __version__,
        "arch": arch.value,
        "format": fmt.value,
        "builder": builder_digest,
        "schema": RECORD_SCHEMA,
    }
    digest.update(json.dumps(header, sort_keys=True).encode())
    for path in build_inputs(package_root):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(package_root).as_posix().encode() + b"\0")
        digest.update(_input_digest(path))
    return "sha256:" + digest.hexdigest()


def tree_id(build_id: str) -> str:
    """The 32-character id the launcher names its unpacked tree by."""
    return build_id.removeprefix("sha256:")[:32]


# The builder's root: its exact packages are pinned by builder-<arch>.lock (builder.py).
BUILDER_SUITE = "bookworm"
BUILDER_PACKAGES = (
    "python3",
    "python3-venv",
    "python3-dev",  # staticx's sdist build (arm64) compiles against Python headers
    "binutils",  # PyInstaller inspects ELF files with objdump
    "gcc",
    "musl-tools",  # the static launcher: musl-gcc -static
    "patchelf",  # staticx
    "scons",  # staticx's bootloader build from its sdist
)


def builder_recipe(arch: Arch) -> RootfsRecipe:
    return RootfsRecipe(suite=BUILDER_SUITE, arch=arch, include=BUILDER_PACKAGES)


def builder_lock_path(arch: Arch) -> Path:
    """The builder's exact package versions (written by builder.py's --update-lock)."""
    return BUILD_CONTAINERS / "resources" / f"builder-{arch.value}.lock"


def addon_build_inputs(kind: ArtifactKind) -> list[Path]:
    """Every file whose content goes into an add-on (sorted, for a stable digest)."""
    recipe = [p for p in ADDONS[kind].resources.iterdir() if p.is_file()]
    return sorted({*recipe, *ASSEMBLER_IMPORTS.values(), BUILD_CONTAINERS / "addon.py", RECIPES})


def addon_build_id(kind: ArtifactKind, arch: Arch) -> str:
    """An add-on's build id: its lock and recipe, and the builders that make it. Here,
    free of the Docker SDK, so that the injector can tell whether a local add-on is
    current without loading an engine client."""
    digest = hashlib.sha256()
    header = {
        "version": __version__,
        "kind": kind.value,
        "arch": arch.value,
        "format": ArtifactFormat.TAR_XZ.value,
        "schema": RECORD_SCHEMA,
        "builders": {
            a.value: hashlib.sha256(builder_lock_path(a).read_bytes()).hexdigest()
            for a in sorted({arch, ASSEMBLY_ARCH}, key=lambda a: a.value)
        },
    }
    digest.update(json.dumps(header, sort_keys=True).encode())
    for path in addon_build_inputs(kind):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(_PACKAGE_ROOT).as_posix().encode() + b"\0")
        digest.update(_input_digest(path))
    return "sha256:" + digest.hexdigest()
