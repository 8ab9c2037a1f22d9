"""Base images made offline from Debian's mirror, for engines that cannot pull.

A `RootfsRecipe` says what goes into a root filesystem (suite, architecture,
packages). Its digest names both the cached root tarball and the image tag, so
an unchanged recipe is built once per machine and then reused. A `RootfsStore` says
where the bytes come from (the Debian mirror) and where roots are kept (the cache); the
caller makes it from its resolved settings and passes it in.

The image is built `FROM scratch` + `ADD root.tar /` for the recipe's platform
rather than with `docker import`: engine 20.10 silently ignores `import --platform`
and labels an arm64 root as amd64.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker.errors
from docker import DockerClient

from sandbox_tools.artifacts import atomic_output
from sandbox_tools.cache import cache_root
from sandbox_tools.errors import BuildError
from sandbox_tools.platforms import Arch
from sandbox_tools.recipes import IMAGE_REPOSITORY, RECIPE_FORMAT, RootfsRecipe
from sandbox_tools.settings import Settings, load_settings


@dataclass(frozen=True)
class RootfsStore:
    """Where roots come from (a Debian mirror) and where they, and the build's other
    downloads, are kept (the cache root). Not part of any digest: the same recipe from
    another mirror is the same root."""

    cache: Path
    mirror: str

    @classmethod
    def of(cls, where: Settings) -> RootfsStore:
        return cls(cache_root(where), where.debian_mirror)

    @classmethod
    def from_cascade(cls) -> RootfsStore:
        """For library entry points called without a store: the settings as they stand."""
        return cls.of(load_settings())

    def directory(self) -> Path:
        self.cache.mkdir(parents=True, exist_ok=True)
        return self.cache


def _require_tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BuildError(
            f"{name} is not installed", remedy=f"Install it: apt-get install -y {package}"
        )
    return path


DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def _as_root() -> list[str]:
    """The prefix that runs a command as root: none for root; `sudo -n` for a user who
    may use it without a password (GitHub's runners); else a BuildError saying so.
    debootstrap makes device nodes and files of every owner, and only root reads them
    all back into the tarball."""
    if os.geteuid() == 0:
        return []
    sudo = shutil.which("sudo")
    if (
        sudo is not None
        and subprocess.run([sudo, "-n", "true"], capture_output=True).returncode == 0
    ):
        return [sudo, "-n"]
    raise BuildError(
        "making a Debian root with debootstrap needs root, and this user "
        f"(uid {os.geteuid()}) has no passwordless sudo",
        remedy="Run the build as root, or as a user with passwordless sudo (as on GitHub's "
        "runners); or build where the root tarballs are already cached "
        "(SANDBOX_TOOLS_CACHE_DIR).",
    )


def build_rootfs(
    recipe: RootfsRecipe, store: RootfsStore, log: Callable[[str], None] = lambda _: None
) -> Path:
    """The recipe's root filesystem as a deterministic tarball, made once and cached.
    As root, or through `sudo -n` for a user allowed it; the tarball is the user's."""
    target = store.directory() / "roots" / f"{recipe.digest}.tar"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    debootstrap = _require_tool("debootstrap", "debootstrap")
    root_prefix = _as_root()
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=target.parent) as work:
        root = Path(work) / "root"
        try:
            _debootstrap(recipe, store, debootstrap, root_prefix, root, log)
            partial = Path(work) / "root.tar"
            with partial.open("wb") as tarball:
                subprocess.run(
                    [
                        *root_prefix,
                        "tar",
                        "--sort=name",
                        "--numeric-owner",
                        "--mtime=@0",
                        "-C",
                        str(root),
                        "-cf",
                        "-",
                        ".",
                    ],
                    stdout=tarball,
                    check=True,
                )
            os.replace(partial, target)
        finally:
            if root_prefix and root.exists():  # root's files: only root removes them
                subprocess.run([*root_prefix, "rm", "-rf", "--one-file-system", str(root)])
    return target


def _debootstrap(
    recipe: RootfsRecipe,
    store: RootfsStore,
    debootstrap: str,
    root_prefix: list[str],
    root: Path,
    log: Callable[[str], None],
) -> None:
    if not Path(DEBIAN_KEYRING).is_file():
        raise BuildError(
            f"{DEBIAN_KEYRING} is missing: debootstrap could not check Debian's signatures",
            remedy="Install it: apt-get install -y debian-archive-keyring (scripts/setup.sh "
            "does; Ubuntu's debootstrap does not pull it in).",
        )
    command = [
        debootstrap,
        f"--variant={recipe.variant}",
        f"--arch={recipe.arch.value}",
        # Every Release file checked against Debian's keys: never an unsigned root.
        "--force-check-gpg",
        f"--keyring={DEBIAN_KEYRING}",
    ]
    if recipe.include:
        command.append("--include=" + ",".join(sorted(recipe.include)))
    command += [recipe.suite, str(root), store.mirror]
    log(" ".join(command))
    result = subprocess.run([*root_prefix, *command], capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(
            f"debootstrap of {recipe.suite}/{recipe.arch.value} failed: "
            f"{(result.stdout + result.stderr)[-1500:]}",
            remedy="Check that Debian's mirror is reachable (SANDBOX_TOOLS_DEBIAN_MIRROR) "
            "and, for a foreign architecture, that qemu-user-static and binfmt are set up.",
        )
    # Package caches are not part of the image; drop them to keep it small.
    caches = [root / leftover for leftover in ("var/cache/apt/archives", "var/lib/apt/lists")]
    present = [str(cache) for cache in caches if cache.is_dir()]
    if present:
        subprocess.run(
            [*root_prefix, "find", *present, "-maxdepth", "1", "-type", "f", "-delete"],
            capture_output=True,
            check=True,
        )


def image_exists(client: DockerClient, tag: str) -> bool:
    """Whether the engine has `tag` locally (we never pull implicitly)."""
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def import_rootfs(
    client: DockerClient, rootfs: Path, tag: str, arch: Arch, cmd: str = "/bin/sh"
) -> None:
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
    client: DockerClient,
    recipe: RootfsRecipe,
    log: Callable[[str], None] = lambda _: None,
    *,
    store: RootfsStore | None = None,
) -> str:
    """The recipe's image tag, building root and image only if missing (from `store`,
    else from the settings as they stand: this is a library entry point)."""
    tag = recipe.image_tag
    if image_exists(client, tag):
        return tag
    rootfs = build_rootfs(recipe, store or RootfsStore.from_cascade(), log)
    log(f"importing {rootfs} as {tag}")
    import_rootfs(client, rootfs, tag, recipe.arch)
    return tag


def remove_image(client: DockerClient, tag: str) -> None:
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.remove(tag, force=True)


# -- a busybox-only image: no libc, no package manager, just Debian's static busybox ----

BUSYBOX_APPLETS = (
    "sh",
    "ash",
    "ls",
    "cat",
    "echo",
    "id",
    "mkdir",
    "rm",
    "rmdir",
    "sleep",
    "env",
    "chmod",
    "chown",
    "stat",
    "test",
    "[",
    "true",
    "false",
    "uname",
    "ps",
    "head",
    "tail",
    "grep",
    "sed",
    "awk",
    "wc",
    "sort",
    "tr",
    "cp",
    "mv",
    "ln",
    "pwd",
    "date",
    "kill",
    "which",
    "printf",
    "seq",
    "yes",
    "find",
    "mktemp",
    "touch",
    "dd",
    "sha256sum",
    "whoami",
    "hostname",
    "du",
    "df",
    "mount",
    "readlink",
    "realpath",
    "basename",
    "dirname",
    "xargs",
    "vi",
    "less",
    "more",
)
_ETC_FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\n"
    "user:x:1000:1000:user:/home/user:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    "etc/group": "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n",
}


def busybox_source_recipe(arch: Arch) -> RootfsRecipe:
    """Where the static busybox comes from: Debian's busybox-static package."""
    return RootfsRecipe(suite="bookworm", arch=arch, include=("busybox-static",))


def busybox_image_tag(arch: Arch, applets: bool = True) -> str:
    kind = "busybox" if applets else "noshell"
    identity = f"{kind}-{RECIPE_FORMAT}-{busybox_source_recipe(arch).digest}-{BUSYBOX_APPLETS}"
    digest = hashlib.sha256(identity.encode()).hexdigest()
    return f"{IMAGE_REPOSITORY}:{kind}-{arch.value}-{digest[:12]}"


def _busybox_of(source: Path) -> bytes:
    with tarfile.open(source) as tar:
        names = set(tar.getnames())
        # Merged /usr (bookworm on): /bin is a link to usr/bin.
        found = next((n for n in ("./usr/bin/busybox", "./bin/busybox") if n in names), None)
        if found is None:
            raise BuildError(f"{source} holds no busybox binary")
        extracted = tar.extractfile(found)
        assert extracted is not None
        return extracted.read()


def static_busybox(
    arch: Arch, store: RootfsStore, log: Callable[[str], None] = lambda _: None
) -> bytes:
    """Debian's static busybox for `arch` (no libc needed wherever it is copied): the
    validate matrix's browser cells serve their page with its httpd in any image."""
    return _busybox_of(build_rootfs(busybox_source_recipe(arch), store, log))


def _busybox_rootfs(source: Path, target: Path, applets: bool = True) -> None:
    busybox = _busybox_of(source)

    def add(
        tar: tarfile.TarFile, name: str, kind: bytes, mode: int, data: bytes = b"", link: str = ""
    ) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime = kind, mode, 0
        info.linkname = link
        info.size = len(data) if kind == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

    with atomic_output(target) as handle, tarfile.open(fileobj=handle, mode="w") as tar:
        for directory, mode in (
            ("bin", 0o755),
            ("etc", 0o755),
            ("tmp", 0o1777),
            ("root", 0o700),
            ("home", 0o755),
            ("opt", 0o755),
        ):
            add(tar, directory, tarfile.DIRTYPE, mode)
        if applets:
            add(tar, "bin/busybox", tarfile.REGTYPE, 0o755, busybox)
            for applet in BUSYBOX_APPLETS:
                add(tar, f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox")
        else:
            # No shell, no tools: the binary only keeps the container alive
            # (`/.sleeper/busybox sleep infinity`); nothing is on PATH.
            add(tar, ".sleeper", tarfile.DIRTYPE, 0o755)
            add(tar, ".sleeper/busybox", tarfile.REGTYPE, 0o755, busybox)
        for name, text in _ETC_FILES.items():
            add(tar, name, tarfile.REGTYPE, 0o644, text.encode())


def ensure_busybox_image(
    client: DockerClient,
    arch: Arch,
    log: Callable[[str], None] = lambda _: None,
    applets: bool = True,
    *,
    store: RootfsStore | None = None,
) -> str:
    """A libc-free image: static busybox and a few applet links, nothing else.

    applets=False: not even a shell (the distroless case): run it with
    `command=["/.sleeper/busybox", "sleep", "infinity"]`.
    """
    tag = busybox_image_tag(arch, applets)
    if image_exists(client, tag):
        return tag
    store = store or RootfsStore.from_cascade()
    source = build_rootfs(busybox_source_recipe(arch), store, log)
    rootfs = store.directory() / "roots" / f"{tag.rsplit(':', 1)[1]}.tar"
    if not rootfs.exists():
        _busybox_rootfs(source, rootfs, applets)
    log(f"importing {rootfs} as {tag}")
    import_rootfs(client, rootfs, tag, arch)
    return tag


def installed_packages(rootfs: Path) -> list[str]:
    """`name:arch=version` of every package installed in a root tarball, sorted: its
    dpkg status file read from the tar, nothing run."""
    with tarfile.open(rootfs) as tar:
        member = next(
            (m for m in tar if m.name.lstrip("./") == "var/lib/dpkg/status" and m.isfile()),
            None,
        )
        handle = tar.extractfile(member) if member is not None else None
        if handle is None:
            raise BuildError(f"{rootfs} has no var/lib/dpkg/status: not a Debian root")
        text = handle.read().decode("utf-8", "replace")
    packages = []
    for stanza in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            arch = fields.get("Architecture", "all")
            packages.append(f"{fields['Package']}:{arch}={fields.get('Version', '')}")
    return sorted(packages)
