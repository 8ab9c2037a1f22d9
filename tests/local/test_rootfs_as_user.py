"""`tools build` as GitHub's runners run it: as a user with passwordless sudo, not root.
debootstrap only runs as root and leaves files only root may read, so the build runs it,
the cache clean-up, the tarball's tar and the work tree's removal through `sudo -n`;
the tarball is the user's. A user without sudo gets a sentence saying what to do.

A real user, a real sudoers entry, real sudo and tar. debootstrap itself is stood in by
a script that makes what it makes that matters here (files of root's only, a device
node, apt's caches) and refuses to run as anyone but root: a real debootstrap takes a
minute and Debian's mirror, and runs as root in every image test of the suite.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = Path("/usr/bin/python3")
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"

STAND_IN = """#!/bin/sh
# debootstrap's stand-in: ARGS... SUITE TARGET MIRROR
[ "$(id -u)" = 0 ] || { echo "E: debootstrap can only run as root" >&2; exit 1; }
for arg; do case "$arg" in --force-check-gpg) checked=1 ;; --keyring=*) keyring=1 ;; esac; done
[ -n "$checked" ] && [ -n "$keyring" ] || { echo "E: not asked to check signatures" >&2; exit 1; }
eval "target=\\${$(($# - 1))}"
mkdir -p "$target/etc" "$target/dev" "$target/var/cache/apt/archives" "$target/var/lib/apt/lists"
echo 'root:*:19000:0:99999:7:::' > "$target/etc/shadow" && chmod 600 "$target/etc/shadow"
mkdir -m 700 "$target/root" && echo secret > "$target/root/.profile"
mknod "$target/dev/null" c 1 3
echo deb > "$target/var/cache/apt/archives/libc6.deb"
echo list > "$target/var/lib/apt/lists/deb.debian.org_dists_bookworm_InRelease"
"""

BUILD = """
import sys
from pathlib import Path
from sandbox_tools.platforms import Arch
from sandbox_tools.recipes import RootfsRecipe
from sandbox_tools.errors import SandboxToolsError
from sandbox_tools.sandboxes.images import RootfsStore, build_rootfs

store = RootfsStore(Path(sys.argv[1]), "http://deb.debian.org/debian")
try:
    print(build_rootfs(RootfsRecipe(suite="bookworm", arch=Arch.AMD64), store))
except SandboxToolsError as exc:
    print(f"error: {exc.message}\\nwhat to do: {exc.remedy}", file=sys.stderr)
    sys.exit(2)
"""

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or shutil.which("sudo") is None
    or shutil.which("useradd") is None
    or not SYSTEM_PYTHON.exists(),
    reason="needs root (to make the user), sudo (scripts/setup.sh installs it) and "
    "/usr/bin/python3 (the venv's interpreter may sit where the user cannot read it)",
)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory every user may enter (pytest's own are root's alone)."""
    where = Path(tempfile.mkdtemp(prefix="sandbox-tools-rootfs-"))
    where.chmod(0o755)
    try:
        yield where
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(where)], check=True)


@pytest.fixture
def user_with(scratch: Path) -> Iterator[Any]:
    """Make a user (with or without passwordless sudo); removed afterwards."""
    made: list[str] = []

    def make(sudo: bool) -> str:
        name = f"strootfs{secrets.token_hex(3)}"
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)
        made.append(name)
        if sudo:
            rule = Path("/etc/sudoers.d") / name
            rule.write_text(f"{name} ALL=(ALL) NOPASSWD: ALL\n")
            rule.chmod(0o440)
        return name

    try:
        yield make
    finally:
        for name in made:
            Path("/etc/sudoers.d", name).unlink(missing_ok=True)
            subprocess.run(["userdel", name], check=False)


def build_as(user: str, scratch: Path) -> subprocess.CompletedProcess[str]:
    bin_dir = scratch / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "debootstrap").write_text(STAND_IN)
    (bin_dir / "debootstrap").chmod(0o755)
    cache = scratch / f"cache-{user}"
    cache.mkdir()
    shutil.chown(cache, user)
    python_path = f"{ROOT / 'src'}:{SITE / 'site-packages'}"
    return subprocess.run(
        ["sudo", "-u", user, "env", "-i", f"PATH={bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin",
         f"PYTHONPATH={python_path}", str(SYSTEM_PYTHON), "-c", BUILD, str(cache)],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip


def test_a_user_with_passwordless_sudo_builds_a_root(user_with: Any, scratch: Path) -> None:
    user = user_with(sudo=True)
    done = build_as(user, scratch)
    assert done.returncode == 0, done.stderr
    tarball = Path(done.stdout.strip())
    assert tarball.owner() == user and tarball.parent.parent == scratch / f"cache-{user}"
    with tarfile.open(tarball) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["./etc/shadow"].uid == 0 and members["./etc/shadow"].mode == 0o600
    assert members["./root/.profile"].isfile()  # read back through sudo
    assert members["./dev/null"].ischr()
    assert not [
        n for n in members if n.startswith(("./var/cache/apt/archives/", "./var/lib/apt/lists/"))
    ]
    # Nothing of the work tree is left behind, root's files included.
    assert [p.name for p in tarball.parent.iterdir()] == [tarball.name]


def test_a_user_without_sudo_is_told_what_to_do(user_with: Any, scratch: Path) -> None:
    user = user_with(sudo=False)
    done = build_as(user, scratch)
    assert done.returncode == 2, done.stderr
    assert "debootstrap needs root, and this user" in done.stderr
    assert "passwordless sudo" in done.stderr and "Traceback" not in done.stderr
    assert not list((scratch / f"cache-{user}").rglob("*.tar"))
