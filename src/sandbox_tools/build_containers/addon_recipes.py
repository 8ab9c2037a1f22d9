"""Each add-on's recipe, declared once: where its resources lie, what is compiled for it
in the target's builder, which package's version it carries. Free of the Docker SDK (the
injector reads build ids), and an input of every add-on's build id (records.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandbox_tools.artifacts import ArtifactKind
from sandbox_tools.platforms import Arch

RECIPES = Path(__file__).resolve()
BUILD_CONTAINERS = RECIPES.parent


@dataclass(frozen=True)
class Compiled:
    """A file of an add-on's tree compiled from its resources in the target's builder."""

    path: str  # in the tree, and the output's name in the builder's /out
    command: tuple[str, ...]  # with {out} for the output, {recipe} for the resources


STATIC_LAUNCHER = ("musl-gcc", "-static", "-Os", "-s", "-o", "{out}", "{recipe}/launcher.c")


@dataclass(frozen=True)
class AddonRecipe:
    """One add-on. Its tree is said by its resources' assemble.py (debian_tree.py)."""

    kind: ArtifactKind
    compiled: tuple[Compiled, ...]
    version_of: str  # the package whose version the add-on's record carries

    @property
    def resources(self) -> Path:
        return BUILD_CONTAINERS / "resources" / self.kind.value

    def lock_path(self, arch: Arch) -> Path:
        return self.resources / f"{self.kind.value}-{arch.value}.lock"


ADDONS = {
    ArtifactKind.BROWSER: AddonRecipe(
        kind=ArtifactKind.BROWSER,
        compiled=(Compiled("chrome", STATIC_LAUNCHER),),
        version_of="chromium-headless-shell",
    ),
    ArtifactKind.DESKTOP: AddonRecipe(
        kind=ArtifactKind.DESKTOP,
        compiled=(
            Compiled("desktop", STATIC_LAUNCHER),
            # Preloaded into the X server (glibc's, so compiled against the builder's,
            # bookworm's as the tree's): its one shell command runs without a shell.
            Compiled(
                "lib/xkbcomp-shim.so",
                (
                    "gcc",
                    "-shared",
                    "-fPIC",
                    "-Os",
                    "-s",
                    "-Wl,-z,nodefaultlib",
                    "-o",
                    "{out}",
                    "{recipe}/xkbcomp_shim.c",
                ),
            ),
        ),
        version_of="xvfb",
    ),
}
