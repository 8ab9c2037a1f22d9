"""Where the runtime server keeps its socket, lock and log.

The directory is private (0700, owned by the effective user, not a symlink):
anyone who can reach the socket can run commands as us, so an existing path
that another user could have prepared is refused rather than reused.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from sandbox_tools.protocol import SERVER_DIR_ENV, SOCKET_NAME
from sandbox_tools.runtime.build_info import build_info


class AddonPlace(NamedTuple):
    """Where an add-on goes in the runtime's install directory (addons.py installs it),
    and its entry point: build_containers/resources/<kind>/assemble.py has its tree."""

    directory: str
    entry: str

    def mount_name(self) -> re.Pattern[str]:
        """The name of its tree mounted under ADDON_MOUNT_ROOT."""
        return re.compile(rf"{self.directory}-[0-9a-f]{{16}}")


BROWSER = AddonPlace("browser", "chrome")
DESKTOP = AddonPlace("desktop", "desktop")
# Where a server records the browser profiles it has not removed yet (in its directory):
# the next server removes what one killed left.
BROWSER_PROFILES_FILE = "browser-profiles.json"
# Where a container the host made sees add-ons' checked trees, mounted read-only
# (`<root>/browser-<digest>`): a top-level directory, so that an image's /opt or /usr
# link cannot lead the mount elsewhere.
ADDON_MOUNT_ROOT = "/.sandbox-tools-addons"

# sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
_MAX_SOCKET_PATH = 107


class ServerDirError(Exception):
    """The server directory cannot be used safely; the message says what to do."""


class ServerPaths(NamedTuple):
    """Where one server's socket, locks, pid and log are. A NamedTuple, not a dataclass:
    the stdio bridge imports this module, and `dataclasses` (with `inspect`) was a fifth
    of its imports; its start is the first answer of a sample that reuses an install."""

    directory: str

    @property
    def socket(self) -> str:
        return os.path.join(self.directory, SOCKET_NAME)

    @property
    def start_lock(self) -> str:
        """Held by a CLI while it decides whether to start a server."""
        return os.path.join(self.directory, "start.lock")

    @property
    def running_lock(self) -> str:
        """Held by the live server for its whole life: at most one per directory."""
        return os.path.join(self.directory, "server.lock")

    @property
    def pid_file(self) -> str:
        return os.path.join(self.directory, "server.pid")

    @property
    def log(self) -> str:
        return os.path.join(self.directory, "server.log")


def build_key() -> str:
    """What the default server directory is keyed by: this build's id, or for a run from
    source, the checkout it runs from. (The portable launcher keys by its tree id and
    exports the directory, so a frozen runtime under it never gets here.)"""
    build_id = str(build_info()["build_id"])
    if build_id != "source":
        return build_id.removeprefix("sha256:")[:16]
    # The checkout's identity without hashing (this runs on every `exec` from source).
    here = os.stat(os.path.dirname(os.path.abspath(__file__)))
    return f"src-{here.st_dev:x}-{here.st_ino:x}"


# Where a directory of ours may go when $TMPDIR will not do, in this order.
TEMPORARY_DIRECTORIES = ("/tmp", "/var/tmp", "/dev/shm")


def _dir_safe(path: str) -> bool:
    """Ours or root's, and nobody else may rename or replace its entries."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (0, os.geteuid()):
        return False
    return not info.st_mode & 0o022 or bool(info.st_mode & stat.S_ISVTX)


MAX_LINKS = 40  # followed on one path, as Linux does before ELOOP


def safe_for_us(directory: str) -> str | None:
    """`directory`'s real path if nobody but root and us can change what it names: every
    directory on the way is ours or root's and not writable by others unless sticky, and
    every link on the way is root's or ours, in such a directory (an image's TMPDIR may be
    the agent's link, repointed at will); else None. The launcher (launcher.c,
    safe_for_us) has the same rule."""
    if not directory.startswith("/") or not _dir_safe("/"):
        return None
    rest = [part for part in directory.split("/") if part]
    current, hops = "/", 0
    while rest:
        name = rest.pop(0)
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        try:
            info = os.lstat(candidate)
        except OSError:
            return None
        if stat.S_ISLNK(info.st_mode):
            hops += 1
            if hops > MAX_LINKS or info.st_uid not in (0, os.geteuid()):
                return None
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            rest = [part for part in target.split("/") if part] + rest
            continue
        if not _dir_safe(candidate):
            return None
        current = candidate
    return current


def default_server_dir() -> str:
    """`<temporary directory>/sandbox-tools-<uid>-<build>`: a client only ever meets a
    server of its own build there, never another version's or a stale one's. The
    temporary directory is the first of $TMPDIR, /tmp, /var/tmp, /dev/shm that no other
    user can change (an image may set TMPDIR to a directory the agent owns: a root
    server's directory there could be swapped for the agent's). SERVER_DIR_ENV overrides."""
    configured = os.environ.get(SERVER_DIR_ENV)
    if configured:
        return configured
    name = f"sandbox-tools-{os.geteuid()}-{build_key()}"
    for candidate in (os.environ.get("TMPDIR") or "/tmp", *TEMPORARY_DIRECTORIES):
        base = safe_for_us(candidate)
        if base is not None:
            return os.path.join(base, name)
    raise ServerDirError(
        "no place for the runtime server's directory that only root and this user can "
        f"change (tried $TMPDIR, {', '.join(TEMPORARY_DIRECTORIES)}); set {SERVER_DIR_ENV} "
        "to a directory of your own"
    )


def temporary_base() -> str | None:
    """Where a tool makes its private directories (a browser's profile, a desktop's
    cookie): the temporary directory, unless another user could swap what we make there
    (the image sets TMPDIR for the runtime too, e.g. to a directory the agent owns: root
    then wrote through the agent's links), else the first of TEMPORARY_DIRECTORIES that
    only root and we can change; None where there is none."""
    import tempfile

    for candidate in (tempfile.gettempdir(), *TEMPORARY_DIRECTORIES):
        if safe_for_us(candidate) is not None:
            return candidate
    return None


def private_directory(base: str, prefix: str, uid: int | None, gid: int | None) -> str:
    """A new directory in `base` only `uid` may enter (made by us, then given to it
    through a descriptor of the directory just made: no path another user could swap)."""
    import tempfile

    path = tempfile.mkdtemp(prefix=prefix, dir=base)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if uid is not None and gid is not None:
            os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path


def server_paths(directory: str | None = None, create: bool = True) -> ServerPaths:
    paths = ServerPaths(os.path.abspath(directory or default_server_dir()))
    if len(paths.socket.encode()) > _MAX_SOCKET_PATH:
        raise ServerDirError(
            f"server directory {paths.directory!r} is too long for a Unix socket path "
            f"({_MAX_SOCKET_PATH} bytes at most); set {SERVER_DIR_ENV} to a shorter directory"
        )
    if create:
        ensure_private_dir(paths.directory)
    return paths


def ensure_private_dir(directory: str) -> None:
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        os.mkdir(directory, 0o700)
    except OSError as exc:
        raise ServerDirError(
            f"cannot create server directory {directory!r}: {exc.strerror}; "
            f"set {SERVER_DIR_ENV} to a writable directory"
        ) from None
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise ServerDirError(
            f"server directory {directory!r} exists but is not a directory (or is a symlink); "
            f"remove it or set {SERVER_DIR_ENV} elsewhere"
        )
    if info.st_uid != os.geteuid():
        raise ServerDirError(
            f"server directory {directory!r} is owned by uid {info.st_uid}, not by us "
            f"(uid {os.geteuid()}); refusing to use it. Set {SERVER_DIR_ENV} to a directory "
            "of our own"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        # We own it, so tightening is safe; nobody else could have put a socket we trust.
        os.chmod(directory, 0o700)


def installed_addon(place: AddonPlace, launcher: str | None) -> str | None:
    """An add-on's entry point: the one the host mounted when it made the container, if
    any (`mounted_addon`), else the one beside the runtime's launcher (in its install
    directory) if the host installed one there and nobody but root and us can change it
    or any directory above it: a runtime copied to a directory others may write must not
    start, as root, a `browser/chrome` another user put beside it. The mount comes
    first: the host checks a tree beside the runtime only where it mounted none, so a
    tree an image left there is never run in a container with the mount."""
    mounted = mounted_addon(place)
    if mounted is not None or not launcher:
        return mounted
    return _entry_in(os.path.join(os.path.dirname(launcher), place.directory), place.entry)


def mounted_addon(
    place: AddonPlace,
    root: str = ADDON_MOUNT_ROOT,
    points: Mapping[str, Sequence[Sequence[str]]] | None = None,
) -> str | None:
    """The entry point of the add-on tree the host mounted read-only under `root` when
    it made the container (`<place>-<16 hex of its digest>`), if there is exactly one:
    one mount at that point of this namespace, read-only, nothing mounted inside it,
    under directories only root and we can change. Nobody in the container can write to
    a read-only mount (remounting needs CAP_SYS_ADMIN), so its files' owners do not
    matter (they are the host user's, a uid the container may not know). An image can
    have the engine mount volumes (VOLUME), but read-write ones only: one at a look-alike
    name is not read-only, one stacked on ours or inside it (shadowing a library of the
    tree with the image's) makes the tree refused. `points`: each mount point's mounts'
    options (mount_points(), read now by default). The host asks which program the
    runtime would start and refuses any but the one it delivered."""
    points = mount_points() if points is None else points
    if safe_for_us(root) != root:
        return None
    pattern = place.mount_name()
    try:
        names = sorted(n for n in os.listdir(root) if pattern.fullmatch(n))
    except OSError:
        return None
    mounted = [
        path
        for path in (os.path.join(root, name) for name in names)
        if len(points.get(path, ())) == 1
        and "ro" in points[path][0]
        and not any(point.startswith(f"{path}/") for point in points)
        and _is_dir(path)
    ]
    if len(mounted) != 1:
        return None
    entry = os.path.join(mounted[0], place.entry)
    try:
        return entry if stat.S_ISREG(os.lstat(entry).st_mode) else None
    except OSError:
        return None


def _is_dir(path: str) -> bool:
    """A directory itself, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def mount_points(mountinfo: str = "/proc/self/mountinfo") -> dict[str, list[list[str]]]:
    """Each mount point of this mount namespace, with the per-mount options of each
    mount on it (several when mounts are stacked). The file is read as bytes and split
    on single spaces and newlines only, as the kernel writes it: it escapes space, tab,
    newline and backslash in a path as octal, and no other character (a path may hold a
    carriage return or a vertical tab, which str.split and text-mode lines would take
    for separators)."""
    points: dict[str, list[list[str]]] = {}
    try:
        with open(mountinfo, "rb") as info:
            lines = info.read().split(b"\n")
    except OSError:
        return points
    for line in lines:
        fields = line.split(b" ")
        if len(fields) >= 6:
            point = re.sub(
                rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8) & 0xFF]), fields[4]
            ).decode("utf-8", "surrogateescape")
            options = fields[5].decode("utf-8", "surrogateescape").split(",")
            points.setdefault(point, []).append(options)
    return points


def _entry_in(tree: str, name: str) -> str | None:
    """`tree`'s entry point `name` if nobody but root and us can change it or the way
    to it."""
    directory = safe_for_us(tree)
    if directory is None:  # reached through a link or a directory another user controls
        return None
    entry = os.path.join(directory, name)  # by its real path: nothing to repoint
    try:
        info = os.lstat(entry)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_uid not in (0, os.geteuid()):
        return None
    return None if info.st_mode & 0o022 else entry
