"""One cell of the matrix, whatever runs it: a fresh sandbox, the real injector, the
tools called for real. A backend (one per engine kind, in its own module) says where a
row's image comes from, which scenarios it cannot run, and how to open a sandbox."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import docker.errors

from sandbox_tools.artifacts import Artifact, ArtifactKind
from sandbox_tools.distro_matrix.matrix import Distro, Scenario
from sandbox_tools.errors import SandboxInjectionError, SandboxToolsError
from sandbox_tools.injector.addon_delivery import install_addon
from sandbox_tools.injector.exec_remote import ExecRemoteOptions, exec_remote
from sandbox_tools.injector.inject import open_tool_support
from sandbox_tools.injector.jsonrpc_client import RuntimeInfo
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.injector.tool_clients import bash_session, new_bash_session, text_editor
from sandbox_tools.injector.web_browser import BrowserPage, BrowserSession, new_browser_session
from sandbox_tools.sandboxes.base import Sandbox
from sandbox_tools.validation import CellResult, CellStatus

SandboxFactory = Callable[[], contextlib.AbstractAsyncContextManager[Sandbox]]


@dataclass(frozen=True)
class PreparedRow:
    """A row ready to run on one backend: where its image came from, which scenarios it
    cannot run (and why), and how to open a fresh sandbox for a scenario."""

    source: str
    skip: Callable[[Scenario], str | None]
    sandbox: Callable[[Scenario], SandboxFactory]


class Backend(Protocol):
    """How one engine runs rows (Docker, Modal)."""

    def prepare(self, artifact: Artifact, distro: Distro) -> Awaitable[PreparedRow]: ...


def no_sandbox() -> SandboxFactory:
    raise AssertionError("a skipped row opens no sandbox")


class CheckFailed(Exception):
    """A tool call in a cell answered, but not with what the check expects."""


async def _exercise(
    sandbox: Sandbox,
    artifact: Artifact,
    scenario: Scenario,
    checks: list[str],
    shell: bool = True,
) -> None:
    # The cell's artifact, exactly: a cell tests the bytes it names, never whatever the
    # installation's sources would pick.
    async with open_tool_support(sandbox, options=InjectionOptions(artifact=artifact)) as support:
        client = support.client
        info = RuntimeInfo.parse(await client.call("runtime_info"))
        if info.build_id != artifact.build_id:
            raise CheckFailed(f"runtime_info build id {info.build_id}")
        checks.append("version+runtime_info")
        if not shell:
            return  # the tools below run commands through /bin/sh, which is not there
        result = await exec_remote(client, "echo out; echo err >&2; exit 3", stream=False)
        if (result.returncode, result.stdout, result.stderr) != (3, "out\n", "err\n"):
            raise CheckFailed(f"exec_remote returned {result}")
        process = await exec_remote(client, "sleep 300", ExecRemoteOptions(poll_interval=1))
        await process.kill()
        if not (await process.wait()).killed:
            raise CheckFailed("exec_remote kill did not report killed")
        checks.append("exec_remote")
        session = await new_bash_session(client)
        if await bash_session(client, session, "echo $((6 * 7))\n") != "42\n":
            raise CheckFailed("bash_session round trip failed")
        checks.append("bash_session")
        path = f"{support.install_dir}/validate.txt"
        await text_editor(client, "create", path, file_text="alpha\n")
        await text_editor(client, "str_replace", path, old_str="alpha", new_str="beta")
        if not (await text_editor(client, "view", path)).endswith("     1\tbeta\n"):
            raise CheckFailed("text_editor round trip failed")
        checks.append("text_editor")


# The browser cell's site, served inside the container by a static busybox's httpd (any
# image: no libc, no Python needed). Submitting the form loads a page whose script writes
# what was sent: the render, the script, the form and the query string all show.
SITE_DIR = "/tmp/sandbox-tools-validate"
SITE_PORT = 8765
SENT = "validated-42"
SITE = {
    "index.html": """<!doctype html>
<html><head><title>sandbox-tools validate</title></head><body>
<h1>Browser cell</h1>
<form action="/answer.html" method="get">
<label>Word <input type="text" name="word"></label>
<button type="submit">Send</button>
</form></body></html>
""",
    "answer.html": """<!doctype html>
<html><head><title>answer</title></head><body><p id="out">no script ran</p>
<script>
  const word = new URLSearchParams(location.search).get("word");
  document.getElementById("out").textContent = "received " + word;
</script></body></html>
""",
}
SERVER_START_S = 20.0  # httpd answers within a second; QEMU takes longer


@dataclass(frozen=True)
class BrowserCell:
    """What a browser cell needs besides its sandbox: the runtime that drives the
    add-on, and a static busybox of the cell's architecture to serve the page."""

    runtime: Artifact
    page_server: bytes


def _element(page: BrowserPage, role: str, name: str) -> int:
    found = re.search(rf'^\s*\[(\d+)\] {role} "{re.escape(name)}"', page.tree, re.MULTILINE)
    if found is None:
        raise CheckFailed(f"no {role} {name!r} in the page's tree:\n{page.tree[:1000]}")
    return int(found.group(1))


async def _first_page(browser: BrowserSession, url: str) -> BrowserPage:
    """The site's first page, once its server answers (it was started a moment ago)."""
    deadline = time.monotonic() + SERVER_START_S
    while True:
        page = await browser.go(url)
        if page.error is None or time.monotonic() > deadline:
            return page
        await asyncio.sleep(0.5)


async def _exercise_browser(
    sandbox: Sandbox, addon: Artifact, cell: BrowserCell, checks: list[str]
) -> None:
    for name, text in SITE.items():
        await sandbox.write_file(f"{SITE_DIR}/www/{name}", text.encode(), 0o644)
    await sandbox.write_file(f"{SITE_DIR}/busybox", cell.page_server, 0o755)
    options = InjectionOptions(artifact=cell.runtime, browser_artifact=addon)
    async with open_tool_support(sandbox, options=options) as support:
        install = await install_addon(support, ArtifactKind.BROWSER)
        checks.append(f"add-on installed ({install.seconds:.0f} s)")
        server = await exec_remote(
            support.client,
            f"exec {SITE_DIR}/busybox httpd -f -p 127.0.0.1:{SITE_PORT} -h {SITE_DIR}/www",
            ExecRemoteOptions(poll_interval=1),
        )
        try:
            async with await new_browser_session(support.client, install=install) as browser:
                url = f"http://127.0.0.1:{SITE_PORT}/"
                page = await _first_page(browser, url)
                if page.error is not None:
                    raise CheckFailed(f"{url}: {page.error}")
                field = _element(page, "textbox", "Word")
                _element(page, "heading", "Browser cell")
                checks.append("page rendered")
                sent = await browser.type(field, SENT, submit=True)
                wanted = f"{url}answer.html?word={SENT}"
                if sent.error is not None or sent.url != wanted:
                    raise CheckFailed(f"the form's submission: {sent.error or sent.url}")
                if f"received {SENT}" not in sent.tree:
                    raise CheckFailed(f"the answer page's script did not run:\n{sent.tree}")
                checks.append("form submitted")
                await browser.screenshot()  # a PNG of at most 16 MiB, or it raises
                back = await browser.back()
                if back.error is not None or _element(back, "textbox", "Word") != field:
                    raise CheckFailed(f"back: the form's ids changed: {back.error or back.tree}")
                checks.append("screenshot, back")
        finally:
            await server.kill()


async def run_cell(
    open_sandbox: SandboxFactory,
    artifact: Artifact,
    distro: Distro,
    scenario: Scenario,
    source: str,
    browser: BrowserCell | None = None,
) -> CellResult:
    """One cell, whatever the backend: `open_sandbox` gives a fresh sandbox of the row's
    image with the scenario's options and removes it afterwards. A browser scenario's
    `artifact` is the add-on, run by `browser.runtime`."""
    result = CellResult(
        artifact.name,
        artifact.platform,
        distro.name,
        scenario.name,
        CellStatus.FAILED,
        source=source,
    )
    started = time.monotonic()
    try:
        async with open_sandbox() as sandbox:
            try:
                if scenario.browser:
                    if browser is None:
                        raise CheckFailed("a browser cell needs its runtime and page server")
                    await _exercise_browser(sandbox, artifact, browser, result.checks)
                else:
                    await _exercise(sandbox, artifact, scenario, result.checks, distro.shell)
                failure: BaseException | None = None
            except SandboxInjectionError as exc:
                failure = exc
            if scenario.expect_failure:
                if isinstance(failure, SandboxInjectionError) and "tried" in str(failure):
                    result.status = CellStatus.PASSED
                    result.detail = f"failed as expected: {failure}"
                else:
                    result.detail = "expected a SandboxInjectionError naming the directories"
            elif failure is not None:
                raise failure
            else:
                result.status = CellStatus.PASSED
    except (
        SandboxToolsError,
        CheckFailed,
        docker.errors.DockerException,
        OSError,
        TimeoutError,
    ) as exc:
        result.detail = str(exc)[:2000]
    result.seconds = time.monotonic() - started
    return result
