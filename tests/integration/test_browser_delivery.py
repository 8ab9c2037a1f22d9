"""The browser add-on delivered on first use, in real containers, driven from the host.

User path: an evaluation author calls `open_browser(support)` (the inspect tool does the
same) in a sandbox that has no browser; the add-on is sent, checked and unpacked, and a
page served inside the container is read, filled in, followed and scrolled. Threat-model
rule 2 (a reused install is accepted only when the agent could not have written it):
a planted or loosened tree is never used.

The add-on and the runtime come from the checkout's dist/ (built on demand, as a
developer's first call does).
"""

from __future__ import annotations

import io
import os
import secrets
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.errors import SandboxInjectionError, ToolError
from sandbox_tools.injector.acquire import Dist
from sandbox_tools.injector.addon_copy import docker_addon_mounts
from sandbox_tools.injector.addon_delivery import ensure_browser
from sandbox_tools.injector.inject import ToolSupport, forget_sandbox, tool_support_sandbox
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.injector.web_browser import BrowserPage, BrowserSession, open_browser
from sandbox_tools.platforms import Arch
from sandbox_tools.runtime.paths import ADDON_MOUNT_ROOT
from sandbox_tools.sandboxes.base import Sandbox
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.docker import DockerSandbox
from tests.support import locked_down_busybox

pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.timeout(1800)]
HOST_ARCH = Arch.parse(os.uname().machine)
PORT = 8000

# A static site (busybox httpd serves it as well as Python's http.server): a form whose
# result page reads the query with JavaScript, a link, and a page several screens long.
SITE = {
    "index.html": """<!doctype html><html><head><title>Shop</title></head><body>
<h1>The shop</h1>
<form action="result.html" method="get">
  <label for="q">Query</label> <input id="q" name="q" type="text">
  <button type="submit">Search</button>
</form>
<p><a href="about.html">About us</a> <a href="long.html">A long page</a></p>
</body></html>""",
    "result.html": """<!doctype html><html><head><title>Result</title></head><body>
<h1 id="r">waiting</h1>
<script>
  const q = new URLSearchParams(location.search).get("q");
  document.getElementById("r").textContent = "You searched for " + q;
</script></body></html>""",
    "about.html": """<!doctype html><html><head><title>About</title></head><body>
<h1>About the shop</h1><p>Founded in an air-gapped network.</p></body></html>""",
    "long.html": "<!doctype html><html><head><title>Long</title></head><body>"
    + "".join(f"<p>Paragraph {n} of the long page.</p>" for n in range(1, 301))
    + "<p>THE END</p></body></html>",
}


# Every process whose executable is the add-on's (its loader runs the browser).
KILL_BROWSER = (
    'for d in /proc/[0-9]*; do case "$(readlink "$d/exe")" in */browser/*) '
    'echo "${d#/proc/}"; kill -9 "${d#/proc/}";; esac; done'
)


async def _write_site(sandbox: Sandbox, root: str) -> None:
    # Through exec's stdin: the engine's archive API cannot write to a read-only root's tmpfs.
    for name, text in SITE.items():
        done = await sandbox.exec(
            ["sh", "-c", 'mkdir -p "$1" && cat > "$1/$2"', "site", root, name], input=text
        )
        assert done.returncode == 0, done.stderr


async def _open_when_served(browser: BrowserSession, url: str) -> BrowserPage:
    """The first page, once the server in the container answers (it starts in the
    background); a refused connection is the page's error, never an exception."""
    for _ in range(100):
        page = await browser.go(url)
        if page.error is None:
            return page
    raise AssertionError(f"{url} never answered: {page.error}")


def _element(tree: str, role: str, name: str) -> int:
    for line in tree.splitlines():
        text = line.strip()
        if f'{role} "{name}"' in text:
            return int(text[1 : text.index("]")])
    raise AssertionError(f'no {role} "{name}" in:\n{tree}')


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def _browse_the_site(browser: BrowserSession, base: str) -> None:
    """Everything a model does with the tool, on the site above."""
    home = await _open_when_served(browser, f"{base}/index.html")
    assert home.url == f"{base}/index.html"
    assert 'heading "The shop"' in home.tree
    field = _element(home.tree, "textbox", "Query")
    result = await browser.type(field, "blue teapot", submit=True)
    assert result.error is None, result.error
    assert result.url.startswith(f"{base}/result.html"), result.url
    assert "You searched for blue teapot" in result.tree
    back = await browser.back()
    assert back.url == f"{base}/index.html"
    forward = await browser.forward()
    assert "You searched for blue teapot" in forward.tree
    home = await browser.back()
    about = await browser.click(_element(home.tree, "link", "About us"))
    assert 'heading "About the shop"' in about.tree, about.tree
    long = await browser.go(f"{base}/long.html")
    assert "THE END" not in long.tree
    for _ in range(40):
        long = await browser.scroll("down")
        if "THE END" in long.tree:
            break
    assert "THE END" in long.tree
    width, height = _png_size(await browser.screenshot())
    assert width > 0 and height > 0
    missing = await browser.click(999_999)
    assert missing.error is not None and "999999" in missing.error


@pytest.fixture
def debian(docker_engine: Any, python_image: str) -> Iterator[RunningContainer]:
    """Debian without network, whose image names a browser of its own in the runtime's
    variable: the add-on the host sent is used anyway (rule 2)."""
    with RunningContainer(
        docker_engine,
        python_image,
        network_mode="none",
        environment={"SANDBOX_TOOLS_BROWSER": "/bin/false"},
    ) as container:
        yield container


async def _serve_with_python(support: ToolSupport) -> str:
    await _write_site(support.sandbox, "/srv/site")
    started = await support.sandbox.exec(
        [
            "sh",
            "-c",
            f"cd /srv/site && nohup python3 -m http.server {PORT} --bind 127.0.0.1 "
            ">/dev/null 2>&1 &",
        ]
    )
    assert started.returncode == 0
    return f"http://127.0.0.1:{PORT}"


async def test_first_use_installs_the_add_on_and_later_handles_reuse_it(
    debian: RunningContainer,
) -> None:
    """Debian as root, no network: the add-on arrives with the first browser, a second
    handle (a later sample) finds it after the in-place check (by the tree's stat
    signature, without hashing it) and sends nothing."""
    sandbox = debian.sandbox
    support = await tool_support_sandbox(sandbox)
    base = await _serve_with_python(support)
    async with await open_browser(support) as browser:
        assert browser.install is not None and not browser.install.reused
        # An engine on this host gets the plain tar (bytes cost less than xz there).
        assert browser.install.transfer == "tar"
        assert browser.install.sent_bytes > browser.install.artifact.tree.size  # type: ignore[union-attr]
        assert browser.install.directory == f"{support.install_dir}/browser"
        info = await support.client.call("browser_info")
        assert info["executable"] == browser.install.executable  # not the image's /bin/false
        await _browse_the_site(browser, base)
        # The agent (root here) kills the browser: a call that meets the dead browser is
        # a tool error saying so; the next one starts a fresh browser and works.
        killed = await sandbox.exec(["sh", "-c", KILL_BROWSER])
        assert killed.stdout.strip(), "no browser process was found to kill"
        try:
            page = await browser.go(f"{base}/about.html")
        except ToolError as exc:
            assert "the browser failed" in str(exc)
            page = await browser.go(f"{base}/about.html")
        assert page.error is None and 'heading "About the shop"' in page.tree
    listing = await sandbox.exec(["ls", "-a", support.install_dir])
    assert ".partial" not in listing.stdout.decode()  # no staging directory left
    await forget_sandbox(sandbox)

    again = await tool_support_sandbox(sandbox)
    async with await open_browser(again) as browser:
        assert browser.install is not None and browser.install.reused
        assert browser.install.sent_bytes == 0
        # Checked by the stat signature this process recorded: nothing hashed.
        assert browser.install.check == "signature"
        page = await browser.go(f"{base}/about.html")
        assert 'heading "About the shop"' in page.tree
    await forget_sandbox(sandbox)


async def test_a_planted_or_loosened_tree_is_replaced_not_used(
    debian: RunningContainer,
) -> None:
    """Rule 2: a tree beside a genuine runtime that differs from the pinned one by a
    file, or only by a file others may write, is installed again before any of it runs."""
    sandbox = debian.sandbox
    support = await tool_support_sandbox(sandbox)
    installed = await ensure_browser(support)
    tree = installed.directory
    for tamper in (
        ["sh", "-c", 'printf "#!/bin/sh\\necho planted\\n" > "$1/chrome"', "x", tree],
        ["chmod", "o+w", f"{tree}/fonts.conf"],
        ["chown", "1000", f"{tree}/lib"],
    ):
        done = await sandbox.exec(tamper)
        assert done.returncode == 0, done.stderr
        await forget_sandbox(sandbox)
        fresh = await tool_support_sandbox(sandbox)
        replaced = await ensure_browser(fresh)
        assert not replaced.reused, tamper
        assert replaced.sent_bytes > 0
    dom = await sandbox.exec([f"{tree}/chrome", "--dump-dom", "data:text/html,<p>ok</p>"])
    assert b"<p>ok</p>" in dom.stdout
    await forget_sandbox(sandbox)


class FarEngine(DockerSandbox):
    """A container here, driven as a remote engine's (or a service's) is: bytes cost
    more than the sandbox's decompression, so add-ons travel as the pinned tar.xz."""

    @property
    def bytes_are_cheap(self) -> bool:
        return False


async def test_busybox_without_libc_as_uid_1000_read_only_and_offline(
    docker_engine: Any,
) -> None:
    """The hardest sandbox: a static busybox and nothing else, uid 1000, a read-only root
    with an exec tmpfs, no network. busybox httpd serves the site inside it. Driven as a
    remote engine's, it gets the compressed archive."""
    with locked_down_busybox(docker_engine, HOST_ARCH) as container:
        sandbox = FarEngine(container.container, docker_engine)
        support = await tool_support_sandbox(sandbox)
        assert support.recon.uid == 1000
        await _write_site(sandbox, "/tmp/site")
        served = await sandbox.exec(
            ["busybox", "httpd", "-p", f"127.0.0.1:{PORT}", "-h", "/tmp/site"]
        )
        assert served.returncode == 0, served.stderr
        async with await open_browser(support) as browser:
            assert browser.install is not None and not browser.install.reused
            assert browser.install.transfer == "tar.xz"
            assert browser.install.sent_bytes == browser.install.artifact.size
            await _browse_the_site(browser, f"http://127.0.0.1:{PORT}")
        await forget_sandbox(sandbox)


async def test_too_little_space_is_refused_before_a_byte_is_sent(docker_engine: Any) -> None:
    """Free space is checked first; the error says what is needed and what there is, and
    nothing is left behind."""
    with locked_down_busybox(docker_engine, HOST_ARCH, tmp_size="120m") as container:
        sandbox = container.sandbox
        support = await tool_support_sandbox(sandbox)
        with pytest.raises(SandboxInjectionError) as refused:
            await ensure_browser(support)
        message = str(refused.value)
        assert "the browser add-on needs" in message and "MiB free in" in message, message
        listing = await sandbox.exec(["ls", "-a", support.install_dir])
        assert "browser" not in listing.stdout.decode()
        await forget_sandbox(sandbox)


async def test_a_container_made_with_the_tree_mounted_sends_nothing(
    docker_engine: Any, python_image: str, browser_dist: Path, tmp_path: Path
) -> None:
    """Where our code makes the container (docker_sdk, the MCP gateway), the add-on's
    checked tree is mounted read-only: the first browser call sends and hashes nothing,
    the runtime finds the browser there by itself, and root in the container cannot
    change a byte of it."""
    # This session's builds: the mount takes only an add-on already on the host.
    options = InjectionOptions(sources=[Dist(browser_dist)], addons_on_host=tmp_path / "addons")
    mounts = docker_addon_mounts(docker_engine, python_image, options)
    assert len(mounts) == 1 and mounts[0]["ReadOnly"] is True
    # Made again for a second container: found, not unpacked again.
    tree = Path(mounts[0]["Source"])
    made_at = tree.stat().st_mtime_ns
    assert docker_addon_mounts(docker_engine, python_image, options) == mounts
    assert tree.stat().st_mtime_ns == made_at
    with RunningContainer(
        docker_engine, python_image, network_mode="none", mounts=mounts
    ) as container:
        sandbox = container.sandbox
        support = await tool_support_sandbox(sandbox, options=options)
        base = await _serve_with_python(support)
        async with await open_browser(support) as browser:
            assert browser.install is not None and browser.install.transfer == "mount"
            assert browser.install.sent_bytes == 0 and browser.install.check == ""
            target = mounts[0]["Target"]
            assert browser.install.executable == f"{target}/chrome"
            info = await support.client.call("browser_info")
            assert info["executable"] == f"{target}/chrome"
            await _browse_the_site(browser, base)
        changed = await sandbox.exec(["sh", "-c", 'echo planted > "$1/chrome"', "x", target])
        assert changed.returncode != 0 and b"Read-only" in changed.stderr
        await forget_sandbox(sandbox)


@pytest.fixture
def planted_image(docker_engine: Any, python_image: str) -> Iterator[str]:
    """An image with a browser of its own (and a link to it) where we mount add-ons."""
    tag = f"{python_image}-planted-addon-{secrets.token_hex(4)}"  # each test removes its own
    planted = f"{ADDON_MOUNT_ROOT}/browser-0123456789abcdef"
    dockerfile = (
        f"FROM {python_image}\n"
        f"RUN mkdir -p {planted} && printf '#!/bin/sh\\ntouch /tmp/planted-ran\\n' "
        f"> {planted}/chrome && chmod 755 {planted}/chrome\n"
    )
    docker_engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    yield tag
    docker_engine.images.remove(tag, force=True)


@pytest.mark.security
@pytest.mark.parametrize("how", ["image", "read-only root", "writable mount", "link"])
async def test_a_browser_prepared_where_we_mount_one_is_never_used(
    docker_engine: Any, planted_image: str, how: str
) -> None:
    """Rule 2: a tree an image ships (or the agent puts) under /.sandbox-tools-addons is
    not a read-only mount point, whatever else it looks like (root's, 0755, under a
    read-only root where every path is read-only, on a writable mount, through a link):
    the runtime never runs it, and the first browser call installs the pinned add-on."""
    extra: dict[str, Any] = {}
    if how == "read-only root":
        extra = {"read_only": True, "tmpfs": {"/tmp": "exec"}}
    if how == "writable mount":
        extra = {"tmpfs": {f"{ADDON_MOUNT_ROOT}/browser-feedfeedfeedfeed": "exec"}}
    with RunningContainer(docker_engine, planted_image, network_mode="none", **extra) as box:
        sandbox = box.sandbox
        if how == "writable mount":
            copied = await sandbox.exec(
                [
                    "sh",
                    "-c",
                    f"cp {ADDON_MOUNT_ROOT}/browser-0123456789abcdef/chrome "
                    f"{ADDON_MOUNT_ROOT}/browser-feedfeedfeedfeed/ && rm -r "
                    f"{ADDON_MOUNT_ROOT}/browser-0123456789abcdef",
                ]
            )
            assert copied.returncode == 0, copied.stderr
        if how == "link":
            linked = await sandbox.exec(
                [
                    "sh",
                    "-c",
                    f"mv {ADDON_MOUNT_ROOT}/browser-0123456789abcdef /srv/b && "
                    f"ln -s /srv/b {ADDON_MOUNT_ROOT}/browser-0123456789abcdef",
                ]
            )
            assert linked.returncode == 0, linked.stderr
        support = await tool_support_sandbox(sandbox)
        info = await support.client.call("browser_info")
        assert not str(info["executable"]).startswith(ADDON_MOUNT_ROOT), info
        installed = await ensure_browser(support)
        assert installed.transfer == "tar" and installed.sent_bytes > 0
        info = await support.client.call("browser_info")
        assert info["executable"] == installed.executable
        dom = await sandbox.exec([installed.executable, "--dump-dom", "data:text/html,<p>ok</p>"])
        assert b"<p>ok</p>" in dom.stdout
        ran = await sandbox.exec(["test", "-e", "/tmp/planted-ran"])
        assert ran.returncode != 0, "the planted browser ran"
        await forget_sandbox(sandbox)
