"""Attacks on the browser add-on mounted into the containers we make (THREAT_MODEL.md,
"Delivering the add-on"), each from the walk of a fresh-context attacker, in real
containers on the local engine:

- an image that ships our install with a `browser/chrome` of its own, reused by the
  injector, in a container made with the mount: the planted program never runs (the
  mount comes first, and the host checks that the runtime uses it);
- the same image without the mount: its tree, in a lower image layer that overlayfs
  cannot rename, is replaced by the checked add-on (it was a denial of the browser);
- an image that makes `/.sandbox-tools-addons` world-writable and names a browser of its
  own: the runtime refuses the mount, the host sees it and sends the add-on, and the
  image's program never runs;
- a host user who is not root (the tree belongs to a uid the container does not know):
  the read-only mount is used all the same.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import posixpath
import secrets
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.injector.acquire import Dist
from sandbox_tools.injector.addon_copy import docker_addon_mounts
from sandbox_tools.injector.addon_delivery import ensure_browser
from sandbox_tools.injector.inject import forget_sandbox, tool_support_sandbox
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.injector.web_browser import open_browser
from sandbox_tools.runtime.paths import ADDON_MOUNT_ROOT
from sandbox_tools.sandboxes.containers import RunningContainer
from tests.support import PLANTED_LOADED

pytestmark = [pytest.mark.docker, pytest.mark.security, pytest.mark.timeout(900)]
RAN = "/tmp/planted-ran"
PLANTED = f'#!/bin/sh\necho "$(id -u) $*" >> {RAN}\nexit 1\n'
PAGE = "data:text/html,<title>t</title><h1>Genuine</h1>"


@pytest.fixture(scope="module")
def addons(browser_dist: Path, tmp_path_factory: pytest.TempPathFactory) -> InjectionOptions:
    """This session's runtime and add-on (built before, so the mount, which only takes
    an add-on already on the host, finds it), kept on the host in a directory of the
    module's."""
    return InjectionOptions(
        sources=[Dist(browser_dist)], addons_on_host=tmp_path_factory.mktemp("addons")
    )


@contextlib.contextmanager
def _hostile_image(engine: Any, base: str, name: str, *lines: str) -> Iterator[str]:
    """An image built offline from `base` with Dockerfile `lines`, removed afterwards."""
    tag = f"{base}-{name}-{secrets.token_hex(4)}"  # tests in parallel remove their own
    dockerfile = "\n".join([f"FROM {base}", *lines]) + "\n"
    engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    try:
        yield tag
    finally:
        engine.images.remove(tag, force=True)


def _plant(program: str) -> str:
    """A shell command writing, at `program`, a script that notes each run in RAN."""
    return (
        f"mkdir -p {posixpath.dirname(program)} && echo '#!/bin/sh' > {program} "
        f"&& echo 'echo \"$(id -u) $*\" >> {RAN}' >> {program} && chmod 755 {program}"
    )


async def _only_the_delivered_browser_runs(support: Any, transfer: str) -> None:
    """The add-on arrives as `transfer`, shows a page, and nothing the image planted ran."""
    install = await ensure_browser(support)
    assert install.transfer == transfer, install
    await _genuine_page(support)
    await _nothing_planted_ran(support.sandbox)
    await forget_sandbox(support.sandbox)


async def _genuine_page(support: Any) -> None:
    async with await open_browser(support) as browser:
        page = await browser.go(PAGE)
        assert page.error is None and 'heading "Genuine"' in page.tree, page


async def _nothing_planted_ran(sandbox: Any) -> None:
    ran = await sandbox.exec(["cat", RAN])
    assert ran.returncode != 0, f"the planted browser ran: {ran.stdout!r}"


@pytest.fixture
async def image_with_a_planted_browser(
    docker_engine: Any, python_image: str, addons: InjectionOptions
) -> Any:
    """An image committed from a container we injected into, whose install directory
    (the exact path the injector reuses) holds a `browser/chrome` of the image's: root's,
    0755, in a lower layer of the image."""
    with RunningContainer(docker_engine, python_image, network_mode="none") as container:
        sandbox = container.sandbox
        support = await tool_support_sandbox(sandbox, options=addons)
        await support.client.call("sandbox_tools_shutdown")
        install_dir = support.install_dir
        await forget_sandbox(sandbox)
        plant = (
            'rm -rf "$1/run" && mkdir "$1/browser" && cat > "$1/browser/chrome" '
            '&& chmod 755 "$1/browser/chrome"'
        )
        done = await sandbox.exec(["sh", "-c", plant, "plant", install_dir], input=PLANTED)
        assert done.returncode == 0, done.stderr
        image = container.container.commit(repository="sandbox-tools-test/planted-browser")
    yield str(image.id)
    docker_engine.images.remove(image.id, force=True)


@pytest.mark.parametrize("mounted", [True, False], ids=["with the mount", "without"])
async def test_a_browser_an_image_ships_in_our_install_never_runs(
    docker_engine: Any, image_with_a_planted_browser: str, addons: InjectionOptions, mounted: bool
) -> None:
    image = image_with_a_planted_browser
    mounts = docker_addon_mounts(docker_engine, image, addons) if mounted else []
    assert bool(mounts) is mounted
    with RunningContainer(docker_engine, image, network_mode="none", mounts=mounts) as box:
        support = await tool_support_sandbox(box.sandbox, options=addons)
        assert support.reused  # the genuine runtime the image ships is reused
        await _only_the_delivered_browser_runs(support, "mount" if mounted else "tar")


async def test_a_mount_the_runtime_refuses_is_sent_instead_never_the_images_browser(
    docker_engine: Any, python_image: str, addons: InjectionOptions
) -> None:
    evil = "/usr/local/bin/evil"
    with _hostile_image(
        docker_engine,
        python_image,
        "open-addon-root",
        f"RUN mkdir -m 0777 {ADDON_MOUNT_ROOT} && {_plant(evil)}",
        f"ENV SANDBOX_TOOLS_BROWSER={evil}",
    ) as tag:
        mounts = docker_addon_mounts(docker_engine, tag, addons)
        with RunningContainer(docker_engine, tag, network_mode="none", mounts=mounts) as box:
            support = await tool_support_sandbox(box.sandbox, options=addons)
            info = await support.client.call("browser_info", {"version": False})
            assert info["executable"] == evil, info  # the mount refused
            await _only_the_delivered_browser_runs(support, "tar")


async def test_a_tree_of_a_host_user_who_is_not_root_is_mounted_and_used(
    docker_engine: Any, python_image: str, addons: InjectionOptions, tmp_path: Path
) -> None:
    """The host's cache belongs to its user (uid 1000 here), a uid the container does not
    know: a read-only mount nobody in the container can change is used all the same."""
    mine = replace(addons, addons_on_host=tmp_path / "addons")
    assert docker_addon_mounts(docker_engine, python_image, mine)  # made (as root, here)
    for path in (tmp_path / "addons").rglob("*"):
        os.lchown(path, 1000, 1000)
    mounts = docker_addon_mounts(docker_engine, python_image, mine)
    assert Path(mounts[0]["Source"]).stat().st_uid == 1000
    with RunningContainer(docker_engine, python_image, network_mode="none", mounts=mounts) as box:
        support = await tool_support_sandbox(box.sandbox, options=mine)
        install = await ensure_browser(support)
        assert install.transfer == "mount" and install.sent_bytes == 0, install
        await _genuine_page(support)
        await forget_sandbox(box.sandbox)


@pytest.mark.parametrize("mounted", [True, False], ids=["with the mount", "without"])
@pytest.mark.parametrize("how", ["look-alike names", "a volume inside ours"])
async def test_volumes_an_image_declares_never_pass_for_our_mount(
    docker_engine: Any, python_image: str, addons: InjectionOptions, mounted: bool, how: str
) -> None:
    """An image has the engine mount a volume at every VOLUME it declares, named as it
    likes: read-write, and seeded with the image's files there. A name holding a
    character mountinfo leaves unescaped (a separator to a naive split) once posed as a
    read-only mount of its own and shadowed ours; a volume inside our tree would replace
    one of its directories with the image's files. Neither is ever run: the runtime
    refuses the look-alikes and a tree with a mount inside, the host then sends the
    add-on, and it refuses any browser but the one it delivered."""
    mounts = docker_addon_mounts(docker_engine, python_image, addons)
    ours = mounts[0]["Target"]
    fake = f"{ADDON_MOUNT_ROOT}/browser-evil"
    if how == "look-alike names":
        volumes = [f"{fake}\\u001cro", f"{ours}\\u001crw/x", f"{fake}\\u000bro"]
    else:
        volumes = [f"{ours}/lib"]
        fake = f"{ours}/lib"
    declared = ", ".join(json.dumps(v) for v in volumes).replace(chr(92) * 2, chr(92))
    with (
        _hostile_image(
            docker_engine,
            python_image,
            f"volumes-{how.replace(' ', '-')}",
            f"RUN {_plant(f'{fake}/chrome')}",
            f"VOLUME [{declared}]",
        ) as tag,
        RunningContainer(
            docker_engine, tag, network_mode="none", mounts=mounts if mounted else []
        ) as box,
    ):
        support = await tool_support_sandbox(box.sandbox, options=addons)
        expected = "mount" if mounted and how == "look-alike names" else "tar"
        await _only_the_delivered_browser_runs(support, expected)


async def test_the_images_preload_never_reaches_the_browser(
    docker_engine: Any, python_image: str, addons: InjectionOptions
) -> None:
    """The programs the runtime starts get the image's environment back, loader variables
    included; the browser is the host's checked program, not one of the image's
    commands: an image's LD_PRELOAD and LD_AUDIT never reach its processes."""
    with _hostile_image(
        docker_engine,
        python_image,
        "preload",
        "ENV LD_PRELOAD=/usr/local/lib/planted-preload.so LD_AUDIT=/usr/local/lib/planted.so",
    ) as tag:
        mounts = docker_addon_mounts(docker_engine, tag, addons)
        with RunningContainer(docker_engine, tag, network_mode="none", mounts=mounts) as box:
            support = await tool_support_sandbox(box.sandbox, options=addons)
            async with await open_browser(support) as browser:
                page = await browser.go(PAGE)
                assert 'heading "Genuine"' in page.tree, page
                info = await support.client.call("browser_info", {"version": False})
                assert info["running"] and info["pid"], info
                environ = await box.sandbox.exec(["cat", f"/proc/{info['pid']}/environ"])
                assert environ.returncode == 0, environ.stderr
                names = {item.split(b"=", 1)[0] for item in environ.stdout.split(b"\0")}
                assert b"XDG_CONFIG_HOME" in names  # the browser's own environment, read
                assert not names & {b"LD_PRELOAD", b"LD_AUDIT"}, names
            await forget_sandbox(box.sandbox)


LOADED = PLANTED_LOADED
# Where an image puts libraries for the loader to find: its preload list, and the names
# Chromium opens on its own when the tree does not carry them, in the system directory
# and the image's library cache.
_LIBRARY_PLACES = (
    "/usr/local/lib/planted.so",
    "/usr/lib/x86_64-linux-gnu/libpci.so.3",
    "/usr/lib/x86_64-linux-gnu/libva.so.2",
    "/usr/lib/x86_64-linux-gnu/libva-drm.so.2",
    "/usr/lib/x86_64-linux-gnu/libgbm.so.1",
)


@pytest.mark.parametrize("mounted", [True, False], ids=["mounted", "copied"])
async def test_the_images_libraries_never_load_into_the_browser(
    docker_engine: Any,
    python_image: str,
    addons: InjectionOptions,
    planted_library: bytes,
    mounted: bool,
) -> None:
    """The browser is the tree the host checked and nothing else: the bundled loader
    reads no preload list of the image's, no library cache of its, and searches none of
    its system directories, so a library the image plants where a loader looks (here
    one that notes every program it loads into) is never loaded into the browser,
    whichever way the add-on arrived. The image's own programs load it (the note shows
    the plant works)."""
    mounts = docker_addon_mounts(docker_engine, python_image, addons) if mounted else []
    with RunningContainer(docker_engine, python_image, network_mode="none", mounts=mounts) as box:
        sandbox = box.sandbox
        for place in _LIBRARY_PLACES:
            await sandbox.write_file(place, planted_library, mode=0o755)
        await sandbox.write_file("/etc/ld.so.preload", f"{_LIBRARY_PLACES[0]}\n".encode())
        assert (await sandbox.exec(["ldconfig"])).returncode == 0
        support = await tool_support_sandbox(sandbox, options=addons)
        install = await ensure_browser(support)
        assert install.transfer == ("mount" if mounted else "tar"), install
        await _genuine_page(support)
        noted = (await sandbox.exec(["cat", LOADED])).stdout.decode().splitlines()
        assert "/usr/bin/cat" in noted  # the image's programs load what it planted
        into_the_browser = [exe for exe in noted if exe.startswith(install.directory)]
        assert not into_the_browser, f"loaded into the browser: {into_the_browser}"
        await forget_sandbox(sandbox)
