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
from sandbox_tools.artifacts import RECORD_SCHEMA, ArtifactFormat
from sandbox_tools.platforms import Arch
from sandbox_tools.recipes import RootfsRecipe

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # src/sandbox_tools


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
        digest.update(hashlib.sha256(path.read_bytes()).digest())
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
