"""Attacks on the reuse of a checked add-on tree and on what the checked browser loads
(THREAT_MODEL.md, "Delivering the add-on"), from the walk of a fresh-context attacker,
in real containers on the local engine:

- the add-on's place: a link there (to a directory of the image's) is replaced, never
  written through;
- the stat signature a later handle is checked by: changes between handles that try to
  keep it (a write through a hard link made outside the tree, through an old
  descriptor, an inode renamed away and back, an xattr, an entry added and removed,
  a shared writable mapping), a change made in addon-install's staging directory,
  file capabilities the tree digest does not cover, a deep directory the runtime
  removes by recursion, and what the agent at another uid can try at all;
- the check on the channel (`browser_info` with `addon_dir`, `addon_digest`,
  `addon_signature`): malformed params, a tree that takes the check forever (other
  calls are answered meanwhile), a server of another user (the installer's exec judges);
- the browser's loader confined to the tree: what the image's files and ENV make the
  browser's libraries open by absolute or relative path anyway (a Vulkan layer or
  driver, a gconv module a locale asks for, an NSS module named with a slash, a
  fontconfig configuration), and what stays out (LD_LIBRARY_PATH, ICD directories,
  EGL vendors, GIO modules).

Each attack asserts the safe outcome; one that succeeds now is an xfail saying what it
does (strict, but for the mapping on overlayfs, which races with writeback).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.injector.acquire import Dist
from sandbox_tools.injector.addon_delivery import AddonInstall, ensure_browser
from sandbox_tools.injector.inject import ToolSupport, forget_sandbox, tool_support_sandbox
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.injector.web_browser import open_browser
from sandbox_tools.sandboxes.base import Sandbox
from sandbox_tools.sandboxes.containers import RunningContainer
from tests.support import PLANTED_LOADED

pytestmark = [pytest.mark.docker, pytest.mark.security, pytest.mark.timeout(900)]
PAGE = "data:text/html,<title>t</title><h1>Genuine</h1>"
UNRESOLVED = "http://sandbox-tools-nowhere.invalid/"  # a name only a resolver answers
LOADED = PLANTED_LOADED
PLANTED = "/usr/local/lib/planted.so"


@pytest.fixture(scope="module")
def addons(browser_dist: Path, tmp_path_factory: pytest.TempPathFactory) -> InjectionOptions:
    return InjectionOptions(
        sources=[Dist(browser_dist)], addons_on_host=tmp_path_factory.mktemp("addons")
    )


@pytest.fixture(scope="module")
def host_locale(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """en_US in ISO-8859-1, compiled here (the image ships no locale sources)."""
    out = tmp_path_factory.mktemp("locale") / "en_US.ISO-8859-1"
    built = subprocess.run(
        ["localedef", "-i", "en_US", "-f", "ISO-8859-1", str(out)], capture_output=True
    )
    if not (out / "LC_CTYPE").exists():
        pytest.skip(f"no localedef sources on this host: {built.stderr[-200:]!r}")
    return out


@contextlib.contextmanager
def _box(engine: Any, image: str, *dockerfile: str, **options: Any) -> Iterator[RunningContainer]:
    """A container of `image`, or of an image built offline from it with `dockerfile`
    lines (its ENV), removed afterwards."""
    tag = ""
    if dockerfile:
        tag = f"{image}-reuse-attack-{secrets.token_hex(4)}"
        text = "\n".join([f"FROM {image}", *dockerfile]) + "\n"
        engine.images.build(fileobj=io.BytesIO(text.encode()), tag=tag, rm=True)
    try:
        with RunningContainer(engine, tag or image, network_mode="none", **options) as box:
            yield box
    finally:
        if tag:
            engine.images.remove(tag, force=True)


async def _sh(sandbox: Sandbox, script: str, *args: str, user: str | None = None) -> str:
    done = await sandbox.exec(["sh", "-c", script, "sh", *args], user=user)
    assert done.returncode == 0, (script, done.stdout[-300:], done.stderr[-500:])
    return done.stdout.decode()


async def _later_handle(sandbox: Sandbox, **kwargs: Any) -> tuple[ToolSupport, AddonInstall]:
    """A new sample's handle in the same sandbox object, and its browser."""
    await forget_sandbox(sandbox)
    support = await tool_support_sandbox(sandbox, **kwargs)
    return support, await ensure_browser(support)


async def _full_check(sandbox: Sandbox, support: ToolSupport, install: AddonInstall) -> str:
    """What the installer's `addon-check` says of the tree with no signature: the hash."""
    assert install.artifact.tree is not None
    done = await sandbox.exec(
        [support.exe, "addon-check", install.directory, install.artifact.tree.digest]
    )
    return done.stdout.decode()


async def _loaded_into_the_browser(sandbox: Sandbox, install: AddonInstall) -> list[str]:
    with contextlib.suppress(Exception):
        noted = (await sandbox.read_file(LOADED)).decode().splitlines()
        return [exe for exe in noted if exe.startswith(install.directory)]
    return []


# -- 1. the stat signature ----------------------------------------------------------------

# (what root in the container does between two handles, what the next handle must do)
HELD_CHANGES = {
    # A hard link outside the tree shares the inode: writing through it changes the
    # tree's file. Linking moves the inode's ctime, and so does the write.
    "write through a hard link made outside the tree": (
        'ln "$1/fonts.conf" /tmp/outside && printf X | '
        "dd of=/tmp/outside bs=1 seek=3 conv=notrunc 2>/dev/null",
        "installed",
    ),
    # The original inode renamed away, another put there, the original renamed back
    # (its inode number restored), with the old mtime.
    "inode renamed away and back": (
        'f="$1/fonts.conf"; mv "$f" /tmp/aside.conf 2>/dev/null || mv "$f" "$1/.aside"; '
        'cp -p "$1/browser.json" "$f"; rm "$f"; '
        'if [ -e /tmp/aside.conf ]; then mv /tmp/aside.conf "$f"; else mv "$1/.aside" "$f"; fi',
        "hashed",
    ),
    # A descriptor opened before the check, written through /proc/<pid>/fd after it.
    "write through an old descriptor": (
        'sh -c \'exec 3<>"$1/fonts.conf"; sleep 1; printf X | '
        'dd of=/proc/$$/fd/3 bs=1 seek=3 conv=notrunc 2>/dev/null\' fd "$1"',
        "installed",
    ),
    # An extended attribute lstat does not show (the digest does not cover it either).
    "user xattr set": (
        'python3 -c \'import os,sys; os.setxattr(sys.argv[1], "user.x", b"1")\' "$1/fonts.conf"',
        "hashed",
    ),
    # An entry added and removed again: the directory's size and mtime put back.
    "entry added and removed, mtime put back": (
        'touch -r "$1/lib" /tmp/ref && touch "$1/lib/extra" && rm "$1/lib/extra" '
        '&& touch -r /tmp/ref "$1/lib"',
        "hashed",
    ),
}


@pytest.mark.parametrize("change", list(HELD_CHANGES))
async def test_a_change_that_tries_to_keep_the_signature_is_still_seen(
    docker_engine: Any, python_image: str, change: str
) -> None:
    """Root in the container changes the checked tree between handles in ways that keep
    the inode, size and mtime or touch the file only through another name: the next
    handle never takes the tree by its signature; other bytes are installed again."""
    script, outcome = HELD_CHANGES[change]
    with _box(docker_engine, python_image) as box:
        sandbox = box.sandbox
        installed = await ensure_browser(await tool_support_sandbox(sandbox))
        await _sh(sandbox, script, installed.directory)
        _, after = await _later_handle(sandbox)
        if outcome == "installed":
            assert not after.reused and after.sent_bytes > 0, after
        else:
            assert after.reused and after.check == "hash", after
        await forget_sandbox(sandbox)


async def test_the_agent_at_another_uid_cannot_touch_the_tree_between_handles(
    docker_engine: Any, python_image: str
) -> None:
    """uid 1000 (the runtime is root's) tries to write, link, rename, chmod and touch the
    tree's files: everything is refused, and the next handle takes the tree by its
    signature because nothing moved."""
    with _box(docker_engine, python_image) as box:
        sandbox = box.sandbox
        installed = await ensure_browser(await tool_support_sandbox(sandbox))
        tries = [
            'printf X | dd of="$1/fonts.conf" bs=1 seek=3 conv=notrunc',
            'ln "$1/fonts.conf" /tmp/mine',
            'mv "$1/fonts.conf" "$1/x"',
            'chmod 777 "$1/fonts.conf"',
            'touch -d @0 "$1/fonts.conf"',
            'touch "$1/lib/new"',
            'python3 -c \'import os,sys; os.setxattr(sys.argv[1], "user.x", b"1")\' '
            '"$1/fonts.conf"',
        ]
        for attempt in tries:
            done = await sandbox.exec(["sh", "-c", attempt, "sh", installed.directory], user="1000")
            assert done.returncode != 0, (attempt, done)
        _, after = await _later_handle(sandbox)
        assert after.reused and after.check == "signature", after
        await forget_sandbox(sandbox)


# Root holds a shared writable mapping of a tree file and, after a handle's check,
# writes a byte through it. With `dirty`, it first writes a byte's own value through
# the mapping (the page fault moves ctime then, before the check), so that the later
# write finds the page dirty and writable: no fault, no ctime, as long as writeback
# has not cleaned the page in between.
_MAPPED_WRITER = r"""
import mmap, os, sys, time
path, go, dirty = sys.argv[1], sys.argv[2], sys.argv[3] == "dirty"
fd = os.open(path, os.O_RDWR)
m = mmap.mmap(fd, 0)
if dirty:
    m[3:4] = m[3:4]
open(go + ".ready", "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
m[3:4] = b"X"
open(go + ".done", "w").close()
time.sleep(120)
"""
_WAIT_FOR = 'for i in $(seq 400); do [ -e "$1" ] && exit 0; sleep 0.025; done; exit 1'


@pytest.mark.parametrize(
    "where",
    [
        "tmpfs",
        pytest.param(
            "overlay, page dirtied before the check",
            marks=pytest.mark.xfail(
                strict=False,
                reason="documented open (THREAT_MODEL.md), broke in 2 of 7 runs here: "
                "root dirties a page of a tree file through a shared writable mapping "
                "before a handle's check (ctime moves then, the check hashes the same "
                "bytes), then writes a byte through it: no fault, no ctime, and the next "
                "handle takes the changed tree by its signature. Held only when "
                "writeback (a sync elsewhere on the host) cleaned the page in between",
            ),
        ),
    ],
)
async def test_a_write_through_a_shared_mapping_is_seen_by_the_next_handle(
    docker_engine: Any, python_image: str, where: str
) -> None:
    """On this kernel (6.18) tmpfs stamps ctime for a write through a mapping, unlike
    what THREAT_MODEL.md says of it: the change is seen there."""
    options = {"tmpfs": {"/opt/sandbox-tools": "rw,exec,mode=755,size=1g"}}
    dirty = where != "tmpfs"
    with _box(docker_engine, python_image, **({} if dirty else options)) as box:
        sandbox = box.sandbox
        support = await tool_support_sandbox(sandbox)
        installed = await ensure_browser(support)
        target, go = f"{installed.directory}/fonts.conf", "/tmp/mapped-go"
        await sandbox.write_file("/tmp/writer.py", _MAPPED_WRITER.encode())
        mode = "dirty" if dirty else "clean"
        # The install's 300 MiB written back first: writeback then has nothing to
        # flush (and clean the mapped page with) but what the host does elsewhere.
        script = 'sync; python3 /tmp/writer.py "$1" "$2" "$3" >/dev/null 2>&1 &'
        await _sh(sandbox, script, target, go, mode)
        await _sh(sandbox, _WAIT_FOR, f"{go}.ready")
        if dirty:
            await asyncio.sleep(0.1)  # the ctime the fault stamped old enough to sign
        support, before = await _later_handle(sandbox)
        assert before.reused, before
        await _sh(sandbox, 'touch "$1"', go)
        await _sh(sandbox, _WAIT_FOR, f"{go}.done")
        assert '"state": "different"' in await _full_check(sandbox, support, before)
        _, after = await _later_handle(sandbox)
        assert not (after.reused and after.check == "signature"), after
        await forget_sandbox(sandbox)


async def test_a_tree_with_file_capabilities_is_not_reused(
    docker_engine: Any, python_image: str
) -> None:
    """The check refuses setuid and setgid bits (a file that gains rights when run);
    a file capability is the same thing in an xattr. Root gives the tree's loader
    cap_setuid+ep between handles: the tree must not be taken as the pinned one."""
    with _box(docker_engine, python_image) as box:
        sandbox = box.sandbox
        installed = await ensure_browser(await tool_support_sandbox(sandbox))
        loader = f"{installed.directory}/ld-linux-x86-64.so.2"
        setcap = (
            "import os, struct, sys; os.setxattr(sys.argv[1], 'security.capability', "
            "struct.pack('<5I', 0x02000001, 1 << 7, 0, 0, 0))"
        )
        done = await sandbox.exec(["python3", "-c", setcap, loader])
        assert done.returncode == 0, done.stderr
        _, after = await _later_handle(sandbox)
        # What the reused tree gives: uid 1000 runs a program of its own as root.
        escalate = [
            loader, "--library-path", f"{installed.directory}/lib", "/usr/bin/python3",
            "-c", "import os; os.setuid(0); print(os.getuid())",
        ]  # fmt: skip
        became = await sandbox.exec(escalate, user="1000")
        assert not after.reused, (after, became.stdout)


# Root waits for the install's staging directory and changes the launcher there once it
# is written (the next member, chrome_100_percent.pak, has appeared): the install
# digested the bytes as it wrote them, and takes the placed tree's signature without
# reading it again.
_STAGING_RACER = r"""
import glob, os, sys, time
install_dir = sys.argv[1]
deadline = time.time() + 60
while time.time() < deadline:
    for staging in glob.glob(os.path.join(install_dir, ".browser-*.partial")):
        if os.path.exists(os.path.join(staging, "chrome_100_percent.pak")):
            with open(os.path.join(staging, "chrome"), "r+b") as launcher:
                launcher.seek(100)
                launcher.write(b"X")
            open("/tmp/raced", "w").write(staging)
            sys.exit(0)
    time.sleep(0.002)
"""


@pytest.mark.xfail(
    strict=True,
    reason="broke (low): root changes a file in addon-install's staging directory after "
    "it was written and digested; the install places the tree and answers the changed "
    "tree's stat signature, so the next handle takes a tree that fails the pinned "
    "digest by its signature, and the host never notices",
)
async def test_a_change_in_the_staging_directory_is_never_blessed_by_a_signature(
    docker_engine: Any, python_image: str
) -> None:
    with _box(docker_engine, python_image) as box:
        sandbox = box.sandbox
        support = await tool_support_sandbox(sandbox)
        await sandbox.write_file("/tmp/racer.py", _STAGING_RACER.encode())
        await _sh(sandbox, 'python3 /tmp/racer.py "$1" >/dev/null 2>&1 &', support.install_dir)
        installed = await ensure_browser(support)
        assert not installed.reused
        assert (await sandbox.exec(["cat", "/tmp/raced"])).returncode == 0, "lost the race"
        full = await _full_check(sandbox, support, installed)
        assert '"state": "different"' in full, full  # the tree is not the pinned one
        _, after = await _later_handle(sandbox)
        assert not (after.reused and after.check == "signature"), after
        await forget_sandbox(sandbox)


# -- 2. the check on the channel ---------------------------------------------------------

MALFORMED: dict[str, dict[str, Any]] = {
    "relative directory": {"addon_dir": "browser", "addon_digest": "blake2b:" + "0" * 64},
    "directory without digest": {"addon_dir": "/tmp"},
    "signature alone": {"addon_signature": "stat:" + "0" * 64},
    "digest of no form": {"addon_dir": "/tmp", "addon_digest": "md5:00"},
    "signature of no form": {
        "addon_dir": "/tmp",
        "addon_digest": "blake2b:" + "0" * 64,
        "addon_signature": "stat:zz",
    },
    "directory not a string": {"addon_dir": ["/tmp"], "addon_digest": "blake2b:" + "0" * 64},
    "NUL in the directory": {"addon_dir": "/tmp/\0x", "addon_digest": "blake2b:" + "0" * 64},
    "lone surrogate": {"addon_dir": "/tmp/\udcff", "addon_digest": "blake2b:" + "0" * 64},
    "parent missing": {"addon_dir": "/nowhere/at/all", "addon_digest": "blake2b:" + "0" * 64},
    "huge directory name": {"addon_dir": "/" + "a" * 300_000, "addon_digest": "sha256:" + "0" * 64},
    "the root": {"addon_dir": "/", "addon_digest": "blake2b:" + "0" * 64},
    "proc": {"addon_dir": "/proc/self", "addon_digest": "blake2b:" + "0" * 64},
}


async def test_malformed_addon_params_are_refused_and_the_server_keeps_answering(
    docker_engine: Any, python_image: str
) -> None:
    """Every malformed `browser_info` add-on request is an error or a "different" or
    "missing" answer within seconds, never a server that stops answering."""
    with _box(docker_engine, python_image) as box:
        support = await tool_support_sandbox(box.sandbox)
        outcomes = {}
        for name, params in MALFORMED.items():
            started = time.monotonic()
            try:
                info = await support.client.call(
                    "browser_info", {"version": False, **params}, timeout=20
                )
                outcomes[name] = ("answer", (info.get("addon") or {}).get("state"))
            except Exception as exc:  # a typed refusal: what it is, not that it is one
                outcomes[name] = ("error", type(exc).__name__)
            assert time.monotonic() - started < 20, name
            alive = await support.client.call("browser_info", {"version": False}, timeout=10)
            assert "executable" in alive, (name, alive)
        for name, (kind, what) in outcomes.items():
            assert kind == "error" or what in ("missing", "different"), (name, kind, what)
        await forget_sandbox(box.sandbox)


@pytest.mark.xfail(
    strict=True,
    reason="broke (low): a file in the tree far larger than the add-on is hashed to its "
    "end; a sparse 1 TiB file root plants at <install>/browser holds ensure_browser for "
    "the check's whole deadline (CHECK_TIMEOUT, 120 s) while a thread of the server "
    "hashes on",
)
async def test_a_tree_that_would_take_forever_to_hash_is_refused_quickly(
    docker_engine: Any, python_image: str
) -> None:
    """Root (or the installer's uid) leaves a sparse file of 1 TiB in the tree: no disk,
    but a hash of it takes many minutes. The check must not read past what the add-on
    can hold; meanwhile the server answers other calls."""
    with _box(docker_engine, python_image) as box:
        sandbox = box.sandbox
        support = await tool_support_sandbox(sandbox)
        installed = await ensure_browser(support)
        await _sh(sandbox, 'truncate -s 1T "$1/lib/huge"', installed.directory)
        support = await _later_handle_support(sandbox)
        task = asyncio.create_task(ensure_browser(support))
        await asyncio.sleep(2)
        started = time.monotonic()
        alive = await support.client.call("browser_info", {"version": False}, timeout=10)
        assert "executable" in alive and time.monotonic() - started < 5
        done, _ = await asyncio.wait({task}, timeout=12)
        if not done:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        assert done, "ensure_browser still checking after 14 s"
        await forget_sandbox(sandbox)


async def test_a_server_of_another_user_never_judges_the_installers_tree(
    docker_engine: Any, python_image: str
) -> None:
    """A handle whose server runs as uid 1000 has the installer's `addon-check` judge
    the tree: a tree file root handed to uid 1000 between handles is found (the
    installer allows root and itself only) and the tree installed again, where the
    server itself, judging with its own uid, would take the agent's file."""
    with _box(docker_engine, python_image) as box:
        sandbox = box.sandbox
        installed = await ensure_browser(await tool_support_sandbox(sandbox))
        await _sh(sandbox, 'chown 1000 "$1/fonts.conf"', installed.directory)
        support, after = await _later_handle(sandbox, user="1000")
        assert not after.reused and after.sent_bytes > 0, after
        # The server as uid 1000 asked directly says "ok" of an agent-owned tree: what
        # the host must never ask it (an agent-owned copy of the tree, checked there).
        assert after.artifact.tree is not None
        await _sh(sandbox, 'cp -a "$1" /tmp/mine && chown -R 1000 /tmp/mine', after.directory)
        info = await support.client.call(
            "browser_info",
            {
                "version": False,
                "addon_dir": "/tmp/mine",
                "addon_digest": after.artifact.tree.digest,
            },
            timeout=60,
        )
        assert info["addon"]["state"] == "ok", info
        await forget_sandbox(sandbox)


# 1100 nested directories, made without recursion (os.makedirs recurses itself).
_NEST = "import os\nfor _ in range(1100):\n    os.mkdir('d')\n    os.chdir('d')"


async def test_a_link_at_the_add_ons_place_is_replaced_never_written_through(
    docker_engine: Any, python_image: str
) -> None:
    """`<install>/browser` is a link to a directory of the image's choosing, left there
    before the first browser: the check refuses it, the install replaces the link itself,
    and nothing is written, moved or removed where it pointed; no staging directory
    stays behind (the ninth walk)."""
    with _box(docker_engine, python_image) as box:
        sandbox = box.sandbox
        support = await tool_support_sandbox(sandbox)
        await _sh(
            sandbox,
            "mkdir -p /opt/victim/sub && echo keep > /opt/victim/marker && "
            'echo keep > /opt/victim/sub/inner && ln -s /opt/victim "$1/browser"',
            support.install_dir,
        )
        installed = await ensure_browser(support)
        assert not installed.reused and installed.sent_bytes > 0
        seen = await _sh(
            sandbox,
            'cd /opt/victim && find . | sort; [ -d "$1/browser" ] && [ ! -L "$1/browser" ] '
            '&& echo real-dir; ls -a "$1"',
            support.install_dir,
        )
        assert seen.split("\n")[:4] == [".", "./marker", "./sub", "./sub/inner"], seen
        assert "real-dir" in seen and ".partial" not in seen and ".old" not in seen, seen
        await forget_sandbox(sandbox)


async def test_a_deep_directory_in_the_tree_is_replaced_not_a_failure(
    docker_engine: Any, python_image: str
) -> None:
    """Root leaves a chain of 1100 nested directories in the tree (paths stay under
    PATH_MAX): the next handle finds the tree different, installs it again and removes
    the old one, one clean sentence at worst, never a traceback from the runtime."""
    deep = 'cd "$1/lib" && python3 -c "$2"'
    with _box(docker_engine, python_image) as box:
        sandbox = box.sandbox
        installed = await ensure_browser(await tool_support_sandbox(sandbox))
        await _sh(sandbox, deep, installed.directory, _NEST)
        try:
            _, after = await _later_handle(sandbox)
        except Exception as exc:  # what the host was told
            assert "Traceback" not in str(exc) and "RecursionError" not in str(exc), exc
            raise
        assert not after.reused and after.sent_bytes > 0, after
        await forget_sandbox(sandbox)


async def test_a_deep_tree_an_image_ships_in_our_install_never_denies_the_browser(
    docker_engine: Any, python_image: str
) -> None:
    with _box(docker_engine, python_image) as box:
        sandbox = box.sandbox
        support = await tool_support_sandbox(sandbox)
        await support.client.call("sandbox_tools_shutdown")
        install_dir = support.install_dir
        await forget_sandbox(sandbox)
        plant = 'rm -rf "$1/run" && mkdir "$1/browser" && cd "$1/browser" && python3 -c "$2"'
        await _sh(sandbox, plant, install_dir, _NEST)
        image = box.container.commit(repository="sandbox-tools-test/deep-browser")
    try:
        with _box(docker_engine, str(image.id)) as planted:
            errors = []
            for _ in range(2):
                support = await tool_support_sandbox(planted.sandbox)
                assert support.install_dir == install_dir  # the image's install, reused
                try:
                    await ensure_browser(support)
                    break
                except Exception as exc:
                    errors.append(str(exc)[-300:])
                await forget_sandbox(planted.sandbox)
            assert not errors, errors
            await forget_sandbox(planted.sandbox)
    finally:
        docker_engine.images.remove(image.id, force=True)


async def _later_handle_support(sandbox: Sandbox) -> ToolSupport:
    await forget_sandbox(sandbox)
    return await tool_support_sandbox(sandbox)


# -- 3. what the browser's loader and its libraries open ---------------------------------

_LAYER = (
    '{"file_format_version": "1.0.0", "layer": {"name": "VK_LAYER_PLANTED_layer", '
    '"type": "GLOBAL", "library_path": "%s", "api_version": "1.3.0", '
    '"implementation_version": "1", "description": "planted"%s}}'
)
_IMPLICIT = _LAYER % (PLANTED, ', "disable_environment": {"DISABLE_PLANTED_LAYER": "1"}')
_EXPLICIT = _LAYER % (PLANTED, "")
_ICD = '{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "1.3.0"}}'
# (the image's ENV lines, its files: path -> content) for each way to name a Vulkan
# library to the tree's libvulkan.so.1
VULKAN = {
    "implicit layer in the image's system directory": (
        [],
        {"/usr/share/vulkan/implicit_layer.d/planted.json": _IMPLICIT},
    ),
    "implicit layer under XDG_DATA_DIRS": (
        ["ENV XDG_DATA_DIRS=/usr/local/share/planted-xdg"],
        {"/usr/local/share/planted-xdg/vulkan/implicit_layer.d/planted.json": _IMPLICIT},
    ),
    "explicit layer by VK_ADD_LAYER_PATH and VK_INSTANCE_LAYERS": (
        [
            "ENV VK_ADD_LAYER_PATH=/usr/local/share/planted-layers "
            "VK_INSTANCE_LAYERS=VK_LAYER_PLANTED_layer"
        ],
        {"/usr/local/share/planted-layers/planted.json": _EXPLICIT},
    ),
    "driver by VK_DRIVER_FILES": (
        ["ENV VK_DRIVER_FILES=/usr/local/share/planted-icd.json"],
        {"/usr/local/share/planted-icd.json": _ICD % PLANTED},
    ),
}


@pytest.mark.parametrize("way", list(VULKAN))
async def test_an_images_vulkan_library_never_loads_into_the_browser(
    docker_engine: Any, python_image: str, planted_library: bytes, way: str
) -> None:
    env, files = VULKAN[way]
    with _box(docker_engine, python_image, *env) as box:
        sandbox = box.sandbox
        await sandbox.write_file(PLANTED, planted_library, mode=0o755)
        for path, content in files.items():
            await sandbox.write_file(path, content.encode())
        support = await tool_support_sandbox(sandbox)
        with contextlib.suppress(Exception):  # the planted driver is no driver
            async with await open_browser(support) as browser:
                await browser.go(PAGE)
        install = await ensure_browser(support)
        assert not await _loaded_into_the_browser(sandbox, install)
        await forget_sandbox(sandbox)


# A gconv module configuration of the image's: the charset its locale names, converted
# by the planted library.
_GCONV_MODULES = (
    "module ISO-8859-1// INTERNAL /usr/local/lib/gconv-planted/planted 1\n"
    "module INTERNAL ISO-8859-1// /usr/local/lib/gconv-planted/planted 1\n"
)


# (the image's ENV, where its locale goes, where its gconv module goes, and the
# gconv-modules file naming it, if any)
LOCALES = {
    "LC_ALL, LOCPATH and GCONV_PATH": (
        "ENV LC_ALL=en_US.ISO-8859-1 LOCPATH=/usr/local/share/planted-locales "
        "GCONV_PATH=/usr/local/lib/gconv-planted",
        "/usr/local/share/planted-locales",
        "/usr/local/lib/gconv-planted/planted.so",
        "/usr/local/lib/gconv-planted/gconv-modules",
    ),
    # Nothing but an ordinary LANG: the bundled glibc looks in the image's own
    # /usr/lib/locale and gconv directory (its compiled-in paths).
    "LANG alone, the image's own directories": (
        "ENV LANG=en_US.ISO-8859-1",
        "/usr/lib/locale",
        "/usr/lib/x86_64-linux-gnu/gconv/ISO8859-1.so",
        None,
    ),
}


@pytest.mark.parametrize("how", list(LOCALES))
async def test_an_images_locale_never_loads_a_gconv_module_into_the_browser(
    docker_engine: Any, python_image: str, planted_library: bytes, host_locale: Path, how: str
) -> None:
    env, locales, module, modules = LOCALES[how]
    with _box(docker_engine, python_image, env) as box:
        sandbox = box.sandbox
        for part in host_locale.rglob("*"):
            if part.is_file():
                name = part.relative_to(host_locale)
                await sandbox.write_file(f"{locales}/en_US.ISO-8859-1/{name}", part.read_bytes())
        await sandbox.write_file(module, planted_library, mode=0o755)
        if modules is not None:
            await sandbox.write_file(modules, _GCONV_MODULES.encode())
        support = await tool_support_sandbox(sandbox)
        install = await ensure_browser(support)
        with contextlib.suppress(Exception):  # the planted module is no converter
            async with await open_browser(support) as browser:
                await browser.go(PAGE)
        assert not await _loaded_into_the_browser(sandbox, install)
        await forget_sandbox(sandbox)


@pytest.mark.parametrize(
    "user",
    [
        None,
        "1000",
    ],
    ids=["root", "uid-1000"],
)
async def test_an_images_nss_module_never_loads_into_the_browser(
    docker_engine: Any, python_image: str, planted_library: bytes, user: str | None
) -> None:
    with _box(docker_engine, python_image) as box:
        sandbox = box.sandbox
        await _sh(sandbox, 'sed -i "s|^hosts:.*|hosts: files x/planted dns|" /etc/nsswitch.conf')
        await sandbox.write_file("/libnss_x/planted.so.2", planted_library, mode=0o755)
        support = await tool_support_sandbox(sandbox)
        async with await open_browser(support, user) as browser:
            page = await browser.go(PAGE)
            assert 'heading "Genuine"' in page.tree, page
            await browser.go(UNRESOLVED)
        install = await ensure_browser(support)
        assert not await _loaded_into_the_browser(sandbox, install)
        await forget_sandbox(sandbox)


async def test_the_images_fontconfig_never_replaces_the_trees(
    docker_engine: Any, python_image: str
) -> None:
    planted = "/usr/local/share/planted-fonts.conf"
    with _box(docker_engine, python_image, f"ENV FONTCONFIG_FILE={planted}") as box:
        sandbox = box.sandbox
        await sandbox.write_file(
            planted, b'<?xml version="1.0"?><fontconfig><dir>/usr/local/fonts</dir></fontconfig>'
        )
        support = await tool_support_sandbox(sandbox)
        async with await open_browser(support) as browser:
            await browser.go(PAGE)
            info = await support.client.call("browser_info", {"version": False})
            environ = (await sandbox.exec(["cat", f"/proc/{info['pid']}/environ"])).stdout
        install = await ensure_browser(support)
        assert f"FONTCONFIG_FILE={install.directory}/fonts.conf".encode() in environ.split(b"\0"), (
            environ
        )
        await forget_sandbox(sandbox)


async def test_the_images_library_paths_icds_and_gio_modules_stay_out(
    docker_engine: Any, python_image: str, planted_library: bytes
) -> None:
    """Loader and library variables in the image's ENV, and the places a Vulkan ICD,
    an EGL vendor or a GIO module is looked for: none of the image's libraries loads
    into the browser (the image's own programs load the LD_LIBRARY_PATH one)."""
    env = [
        "ENV LD_LIBRARY_PATH=/usr/local/lib/planted-path "
        "VK_ICD_FILENAMES=/usr/local/share/planted-icd.json "
        "VK_ADD_DRIVER_FILES=/usr/local/share/planted-icd.json "
        "__EGL_VENDOR_LIBRARY_DIRS=/usr/local/share/planted-egl "
        "GIO_EXTRA_MODULES=/usr/local/lib/planted-gio XDG_CURRENT_DESKTOP=GNOME "
        "DESKTOP_SESSION=gnome"
    ]
    icd = _ICD
    egl = '{"file_format_version": "1.0.0", "ICD": {"library_path": "%s"}}'
    with _box(docker_engine, python_image, *env) as box:
        sandbox = box.sandbox
        for name in ("libpci.so.3", "libva.so.2", "libgbm.so.1", "libc.so.6.planted"):
            await sandbox.write_file(
                f"/usr/local/lib/planted-path/{name}", planted_library, mode=0o755
            )
        await sandbox.write_file(PLANTED, planted_library, mode=0o755)
        await sandbox.write_file("/usr/local/share/planted-icd.json", (icd % PLANTED).encode())
        for place in ("/etc/vulkan/icd.d", "/usr/share/vulkan/icd.d"):
            await sandbox.write_file(f"{place}/planted.json", (icd % PLANTED).encode())
        await sandbox.write_file(
            "/usr/local/share/planted-egl/50_planted.json", (egl % PLANTED).encode()
        )
        for place in ("/usr/local/lib/planted-gio", "/usr/lib/x86_64-linux-gnu/gio/modules"):
            await sandbox.write_file(f"{place}/libplanted.so", planted_library, mode=0o755)
        support = await tool_support_sandbox(sandbox)
        async with await open_browser(support) as browser:
            page = await browser.go(PAGE)
            assert 'heading "Genuine"' in page.tree, page
            await browser.go(UNRESOLVED)
        install = await ensure_browser(support)
        assert not await _loaded_into_the_browser(sandbox, install)
        await forget_sandbox(sandbox)
