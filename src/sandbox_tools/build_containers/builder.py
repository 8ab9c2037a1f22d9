"""The builder image: Debian bookworm with the distribution's python3 and a C toolchain.

The distribution's python3 matters: staticx rejects interpreters whose libpython
carries DT_RUNPATH (pyenv builds do), and glibc 2.36 is what the portable tree bundles.
"""

from __future__ import annotations

from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.images import RootfsRecipe

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
