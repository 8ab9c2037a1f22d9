"""Base images made offline from Debian's mirror, for engines that cannot pull.

A `RootfsRecipe` says what goes into a root filesystem (suite, architecture,
packages). Its digest names both the cached root tarball and the image tag, so
an unchanged recipe is built once per machine and then reused.

The image is built `FROM scratch` + `ADD root.tar /` for the recipe's platform
rather than with `docker import`: engine 20.10 silently ignores `import --platform`
and labels an arm64 root as amd64.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import docker.errors

from sandbox_tools.errors import BuildError
from sandbox_tools.platforms import Arch

# Bump when the way roots are made changes, so old cache entries are not reused.
RECIPE_FORMAT = 1
DEFAULT_MIRROR = "http://deb.debian.org/debian"
IMAGE_REPOSITORY = "sandbox-tools/base"


def cache_dir() -> Path:
    configured = os.environ.get("SANDBOX_TOOLS_CACHE")
    base = Path(configured) if configured else Path.home() / ".cache" / "sandbox-tools"
    base.mkdir(parents=True, exist_ok=True)
    return base


@dataclass(frozen=True, kw_only=True)
class RootfsRecipe:
    suite: str
    arch: Arch
    include: tuple[str, ...] = ()
    variant: str = "minbase"
    mirror: str = field(
        default_factory=lambda: os.environ.get("SANDBOX_TOOLS_DEBIAN_MIRROR", DEFAULT_MIRROR)
    )

    @property
    def digest(self) -> str:
        # The mirror is where bytes come from, not what they are: it stays out of the digest.
        identity = {"format": RECIPE_FORMAT, **asdict(self), "include": sorted(self.include)}
        identity.pop("mirror")
        canonical = json.dumps(identity, sort_keys=True, default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def image_tag(self) -> str:
        extra = "-" + "-".join(sorted(self.include)) if self.include else ""
        name = f"{self.suite}-{self.arch.value}{extra}"[:80]
        return f"{IMAGE_REPOSITORY}:{name}-{self.digest[:12]}"


def _require_tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BuildError(
            f"{name} is not installed", remedy=f"Install it: apt-get install -y {package}"
        )
    return path


def build_rootfs(recipe: RootfsRecipe, log: Callable[[str], None] = lambda _: None) -> Path:
    """The recipe's root filesystem as a deterministic tarball, made once and cached."""
    target = cache_dir() / "roots" / f"{recipe.digest}.tar"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    debootstrap = _require_tool("debootstrap", "debootstrap")
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=target.parent) as work:
        root = Path(work) / "root"
        command = [debootstrap, f"--variant={recipe.variant}", f"--arch={recipe.arch.value}"]
        if recipe.include:
            command.append("--include=" + ",".join(sorted(recipe.include)))
        command += [recipe.suite, str(root), recipe.mirror]
        log(" ".join(command))
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildError(
                f"debootstrap of {recipe.suite}/{recipe.arch.value} failed: "
                f"{(result.stdout + result.stderr)[-1500:]}",
                remedy="Check that Debian's mirror is reachable (SANDBOX_TOOLS_DEBIAN_MIRROR) "
                "and, for a foreign architecture, that qemu-user-static and binfmt are set up.",
            )
        # Package caches are not part of the image; drop them to keep it small.
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / leftover).glob("*"):
                if entry.is_file():
                    entry.unlink()
        partial = Path(work) / "root.tar"
        subprocess.run(
            [
                "tar",
                "--sort=name",
                "--numeric-owner",
                "--mtime=@0",
                "-C",
                str(root),
                "-cf",
                str(partial),
                ".",
            ],
            check=True,
        )
        os.replace(partial, target)
    return target


def image_exists(client: Any, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def import_rootfs(client: Any, rootfs: Path, tag: str, arch: Arch, cmd: str = "/bin/sh") -> None:
    """Turn a root tarball into an image labelled with the right platform."""
    dockerfile = f'FROM scratch\nADD root.tar /\nCMD ["{cmd}"]\n'.encode()
    with tempfile.TemporaryFile() as context:
        with tarfile.open(fileobj=context, mode="w") as tar:
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(dockerfile)
            tar.addfile(info, io.BytesIO(dockerfile))
            tar.add(str(rootfs), arcname="root.tar")
        context.seek(0)
        try:
            client.images.build(
                fileobj=context, custom_context=True, tag=tag, platform=arch.platform, rm=True
            )
        except docker.errors.BuildError as exc:
            log = "".join(str(item.get("stream", item)) for item in exc.build_log)[-1500:]
            raise BuildError(f"importing {rootfs.name} as {tag} failed: {log}") from None


def ensure_image(
    client: Any, recipe: RootfsRecipe, log: Callable[[str], None] = lambda _: None
) -> str:
    """The recipe's image tag, building root and image only if missing."""
    tag = recipe.image_tag
    if image_exists(client, tag):
        return tag
    rootfs = build_rootfs(recipe, log)
    log(f"importing {rootfs} as {tag}")
    import_rootfs(client, rootfs, tag, recipe.arch)
    return tag


def remove_image(client: Any, tag: str) -> None:
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.remove(tag, force=True)
