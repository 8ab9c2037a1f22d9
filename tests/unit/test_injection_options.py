"""One `InjectionOptions` travels whole from each entry point to the steps that read it,
and a handle opened with one set refuses a caller asking for another, naming the field.

No engine: `ScriptedDebian` answers the injector's fixed commands as a fresh Debian
container does; the steps are spied on where they receive the options.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sandbox_tools.artifacts import Artifact, ArtifactFormat, ArtifactKind, Provenance
from sandbox_tools.errors import ConfigurationError
from sandbox_tools.injector import InjectionOptions, inject
from sandbox_tools.injector.acquire import Need
from sandbox_tools.injector.addon_delivery import install_addon
from sandbox_tools.injector.inject import (
    Injector,
    ToolSupport,
    forget_sandbox,
    open_tool_support,
    tool_support_sandbox,
)
from sandbox_tools.injector.recon import EXE_NAME
from sandbox_tools.platforms import Arch
from sandbox_tools.runtime.addons import TreeDigest
from sandbox_tools.sandboxes.base import DEFAULT_EXEC_TIMEOUT, ExecOutput, Stream
from tests.support import BUILD_ID, ScriptedDebian


class Scripted(ScriptedDebian):
    """ScriptedDebian that counts the persistent streams asked of it (it offers none, so
    the client falls back to one exec per call), and answers the runtime's add-on check
    as a sandbox already holding the pinned add-on does."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.streams_asked = 0

    async def open_stream(
        self, cmd: list[str], env: Mapping[str, str] | None = None, user: str | None = None
    ) -> Stream | None:
        self.streams_asked += 1
        return None

    async def exec(
        self,
        cmd: list[str],
        input: bytes | memoryview | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout: float | None = DEFAULT_EXEC_TIMEOUT,
        max_output: int = 1 << 26,
    ) -> ExecOutput:
        text = bytes(input) if isinstance(input, memoryview) else input
        request = json.loads(text or "{}") if cmd[-1] == "exec" else {}
        if request.get("method") == "browser_info":  # the add-on checked, and started
            chrome = f"{posixpath.dirname(cmd[0])}/browser/chrome"
            result = {"executable": chrome, "addon": {"state": "ok", "free_bytes": 0}}
            response = {"jsonrpc": "2.0", "id": request["id"], "result": result}
            return ExecOutput(0, json.dumps(response).encode() + b"\n", b"")
        return await super().exec(cmd, input, cwd, env, user, timeout, max_output)


@dataclass(frozen=True)
class Listed:
    """A source holding the runtime and the add-on; notes what it was asked for."""

    runtime: Artifact
    addon: Artifact
    asked: list[str] = field(default_factory=list, compare=False)
    name: str = "listed"

    def supply(self, need: Need) -> Artifact:
        self.asked.append("add-on" if need.addon else "runtime")
        return self.addon if need.addon else self.runtime


def located(path: Path, data: bytes, **record: object) -> Artifact:
    path.write_bytes(data)
    artifact = Artifact(
        name=path.name,
        arch=Arch.AMD64,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        **record,  # type: ignore[arg-type]
    )
    found = artifact.found_at(path, Provenance.DIST)
    assert found is not None
    return found


@pytest.fixture
def runtime(tmp_path: Path) -> Artifact:
    return located(
        tmp_path / "sandbox-tools",
        b"\x7fELF" + b"x" * 4096,
        format=ArtifactFormat.PORTABLE,
        build_id=BUILD_ID,
    )


@pytest.fixture
def addon(tmp_path: Path) -> Artifact:
    return located(
        tmp_path / "sandbox-tools-browser.tar.xz",
        b"\xfd7zXZ" + b"y" * 1024,
        format=ArtifactFormat.TAR_XZ,
        build_id="sha256:" + "cd" * 32,
        kind=ArtifactKind.BROWSER,
        tree=TreeDigest("sha256:" + "ef" * 32, 1 << 20, 3),
    )


async def through_injector(sandbox: Scripted, options: InjectionOptions) -> ToolSupport:
    async with Injector(options) as injector:
        return await injector.tool_support(sandbox)


async def through_block(sandbox: Scripted, options: InjectionOptions) -> ToolSupport:
    async with open_tool_support(sandbox, options=options) as support:
        return support


async def on_the_sandbox(sandbox: Scripted, options: InjectionOptions) -> ToolSupport:
    support = await tool_support_sandbox(sandbox, options=options)
    await forget_sandbox(sandbox)
    return support


ENTRY_POINTS: dict[str, Callable[[Scripted, InjectionOptions], Awaitable[ToolSupport]]] = {
    "Injector": through_injector,
    "open_tool_support": through_block,
    "tool_support_sandbox": on_the_sandbox,
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("persistent", [True, False], ids=["stdio", "exec"])
async def test_the_options_reach_the_install_whole(
    monkeypatch: pytest.MonkeyPatch,
    runtime: Artifact,
    addon: Artifact,
    entry: str,
    persistent: bool,
) -> None:
    """Each entry point hands its one options value, the same object, to the injection
    and to the connection step; the handle keeps it, and the add-on installed later on
    that handle comes from the same sources."""
    received: list[tuple[str, InjectionOptions]] = []
    real_prepare, real_start = inject.prepare_tool_support, inject._start

    async def prepare(*args: object, options: InjectionOptions) -> ToolSupport:
        received.append(("prepare", options))
        return await real_prepare(*args, options=options)  # type: ignore[arg-type]

    async def start(*args: object) -> ToolSupport:
        received.append(("start", next(a for a in args if isinstance(a, InjectionOptions))))
        return await real_start(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(inject, "prepare_tool_support", prepare)
    monkeypatch.setattr(inject, "_start", start)
    source = Listed(runtime, addon)
    options = InjectionOptions(sources=[source], persistent=persistent)
    sandbox = Scripted(entry)

    support = await ENTRY_POINTS[entry](sandbox, options)

    assert received == [("prepare", options), ("start", options)]
    assert all(seen is options for _, seen in received)  # whole, never rebuilt on the way
    assert support.options is options
    assert source.asked == ["runtime"]  # acquired from the options' sources
    staged = f"{support.install_dir}/.{EXE_NAME}.partial"
    assert sandbox.files[staged] == runtime.located.read_bytes()
    assert support.artifact == runtime
    assert sandbox.streams_asked == (1 if persistent else 0)

    install = await install_addon(support, ArtifactKind.BROWSER)
    assert source.asked == ["runtime", "add-on"]
    assert install.artifact == addon and install.reused


async def test_a_given_artifact_and_add_on_are_used_and_no_source_is_asked(
    runtime: Artifact, addon: Artifact
) -> None:
    """`artifact` and `browser_artifact` name the bytes: the sources stay unasked (a
    matrix cell tests exactly the artifacts it names)."""
    source = Listed(runtime, addon)
    options = InjectionOptions(artifact=runtime, browser_artifact=addon, sources=[source])
    async with open_tool_support(Scripted("given"), options=options) as support:
        install = await install_addon(support, ArtifactKind.BROWSER)
    assert support.artifact == runtime and install.artifact == addon
    assert source.asked == []


async def test_other_options_are_refused_naming_the_field(
    runtime: Artifact, addon: Artifact
) -> None:
    """A handle opened with one set of options refuses a caller asking for another,
    naming each differing field with both values; equal options (not the same object)
    get the open handle."""
    source = Listed(runtime, addon)
    opened = InjectionOptions(artifact=runtime, sources=[source], persistent=False)
    sandbox = Scripted("refusals")
    first = await tool_support_sandbox(sandbox, options=opened)

    with pytest.raises(ConfigurationError) as refused:
        await tool_support_sandbox(
            sandbox, options=InjectionOptions(artifact=runtime, sources=[source])
        )
    assert str(refused.value).startswith(
        "tool support for refusals was opened with persistent=False; "
        "this call asks for persistent=True"
    )

    with pytest.raises(ConfigurationError) as refused:
        await tool_support_sandbox(sandbox, options=InjectionOptions(persistent=False))
    message = str(refused.value)
    assert "opened with artifact=sandbox-tools (sha256:abababababab, " in message
    assert "sources=[listed]; this call asks for artifact=None, sources=None" in message
    assert "persistent" not in message  # only what differs

    with pytest.raises(ConfigurationError, match=r"browser_artifact=sandbox-tools-browser"):
        await tool_support_sandbox(
            sandbox,
            options=InjectionOptions(
                artifact=runtime, sources=(source,), persistent=False, browser_artifact=addon
            ),
        )

    again = InjectionOptions(artifact=runtime, sources=(source,), persistent=False)
    assert again == opened and again is not opened
    assert await tool_support_sandbox(sandbox, options=again) is first
    await forget_sandbox(sandbox)


async def test_an_injectors_options_are_its_handles(runtime: Artifact, addon: Artifact) -> None:
    """`open_tool_support` with an Injector uses the Injector's options; options given
    beside it must be the same, else the field is named."""
    options = InjectionOptions(artifact=runtime)
    async with Injector(options) as injector:
        sandbox = Scripted("shared")
        async with open_tool_support(sandbox, injector=injector) as support:
            assert support.options is options
        same = InjectionOptions(artifact=runtime)
        async with open_tool_support(sandbox, options=same, injector=injector) as again:
            assert again is support
        with pytest.raises(ConfigurationError, match=r"^this Injector was opened with persistent"):
            async with open_tool_support(
                sandbox,
                options=InjectionOptions(artifact=runtime, persistent=False),
                injector=injector,
            ):
                pass


def test_the_options_keep_their_own_copy_of_the_sources(runtime: Artifact, addon: Artifact) -> None:
    """A caller's list is copied: changing it later changes no handle's options, and
    equal lists and tuples make equal options."""
    sources = [Listed(runtime, addon)]
    options = InjectionOptions(sources=sources)
    sources.append(Listed(addon, addon, name="other"))
    assert options.sources == (Listed(runtime, addon),)
    assert options == InjectionOptions(sources=(Listed(runtime, addon),))
    assert options.differences(InjectionOptions()) == ("sources",)
    with pytest.raises(TypeError):
        InjectionOptions(None)  # type: ignore[misc]  # keyword-only
