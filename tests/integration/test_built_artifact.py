"""The built portable artifact in real containers: Debian 11/12/13 and a libc-free busybox
image, as root and as uid 1000, through real tool calls (not just --help)."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_tools._version import __version__
from sandbox_tools.artifacts import ArtifactFormat
from sandbox_tools.injector.exec_remote import exec_remote
from sandbox_tools.injector.jsonrpc_client import ExecRuntimeClient, StdioRuntimeClient
from sandbox_tools.injector.tool_clients import bash_session, new_bash_session, text_editor
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.containers import RunningContainer
from tests.support import arches_under_test, ensure_target_image

# Cold machines build images here (debootstrap): minutes, not the default 300 s.
pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.timeout(1800)]


@pytest.mark.parametrize("arch", arches_under_test(), ids=lambda a: a.value)
@pytest.mark.parametrize("user", ["0", "1000"])
@pytest.mark.parametrize("target", ["debian-11", "debian-12", "debian-13", "busybox"])
async def test_artifact_serves_real_tool_calls(
    docker_engine: Any, built_artifacts: Any, target: str, user: str, arch: Arch
) -> None:
    record, artifact = built_artifacts(arch)
    image = ensure_target_image(docker_engine, target, arch)
    with RunningContainer(docker_engine, image, platform=arch.platform) as container:
        sandbox = container.sandbox
        install = f"/tmp/st-{user}"
        prepared = await sandbox.exec(["sh", "-c", f"mkdir -p {install} && chown {user} {install}"])
        assert prepared.returncode == 0, prepared.stderr
        exe = f"{install}/sandbox-tools"
        await sandbox.write_file(exe, artifact.read_bytes(), mode=0o755)
        as_user = f"{user}:{user}"

        per_call = ExecRuntimeClient(sandbox, [exe], user=as_user)
        assert await per_call.call("version") == __version__
        info = await per_call.call("runtime_info")
        assert (info["build_id"], info["platform"], info["format"]) == (
            record.build_id,
            arch.platform,
            "portable",
        )

        stdio = StdioRuntimeClient(sandbox, [exe], user=as_user)
        try:
            result = await exec_remote(
                stdio,
                "id -u; env | grep -E '^(_PYI|LD_|SANDBOX_TOOLS_SELF)' || echo clean",
                stream=False,
            )
            assert result.stdout == f"{user}\nclean\n"  # children see the container as is
            session = await new_bash_session(stdio)
            assert await bash_session(stdio, session, "echo $((6 * 7))\n") == "42\n"
            path = f"{install}/note.txt"
            await text_editor(stdio, "create", path, file_text="hello\n")
            assert (await text_editor(stdio, "view", path)).endswith("     1\thello\n")
        finally:
            await stdio.aclose()


@pytest.mark.parametrize("target", ["debian-12", "busybox"])
async def test_staticx_format_stays_buildable(
    docker_engine: Any, built_artifacts: Any, target: str
) -> None:
    arch = arches_under_test()[0]
    record, artifact = built_artifacts(arch, ArtifactFormat.STATICX)
    assert record.name.endswith(".staticx") and record.format == "staticx"
    image = ensure_target_image(docker_engine, target, arch)
    with RunningContainer(docker_engine, image) as container:
        sandbox = container.sandbox
        exe = "/opt/sandbox-tools.staticx"
        await sandbox.write_file(exe, artifact.read_bytes(), mode=0o755)
        client = ExecRuntimeClient(sandbox, [exe])
        assert await client.call("version") == __version__
        assert (await client.call("runtime_info"))["build_id"] == record.build_id
        result = await exec_remote(client, "echo from staticx", stream=False)
        assert result.stdout == "from staticx\n"


@pytest.mark.parametrize("transport", ["exec", "stdio"])
async def test_large_requests_and_responses_through_the_built_artifact(
    docker_engine: Any, built_artifacts: Any, transport: str
) -> None:
    """Requests over 65,534 bytes once failed with -32700 through the launcher (the only
    transport inspect sandboxes use): creates of 70 KB, 1 MB and 32 MB, and a view of a
    file near the text_editor cap, on both transports."""
    arch = arches_under_test()[0]
    _, artifact = built_artifacts(arch)
    image = ensure_target_image(docker_engine, "debian-12", arch)
    with RunningContainer(docker_engine, image) as container:
        sandbox = container.sandbox
        exe = "/opt/st/sandbox-tools"
        await sandbox.write_file(exe, artifact.read_bytes(), mode=0o755)
        client = (ExecRuntimeClient if transport == "exec" else StdioRuntimeClient)(sandbox, [exe])
        try:
            for size in (70_000, 1_000_000, 32_000_000):
                text = ("x" * 99 + "\n") * (size // 100)
                path = f"/tmp/big-{size}"
                created = await text_editor(client, "create", path, file_text=text)
                assert created == f"File created successfully at: {path}"
                out = await sandbox.exec(["sh", "-c", f"wc -c < {path}"])
                assert out.stdout.decode().strip() == str(len(text))
            near_cap = "/tmp/near-cap"
            made = await sandbox.exec(
                [
                    "sh",
                    "-c",
                    f"head -c 47000000 /dev/zero | tr '\\0' 'a' | fold -w 100 > {near_cap}",
                ]
            )
            assert made.returncode == 0, made.stderr
            view = await text_editor(client, "view", near_cap, view_range=(400_000, -1))
            assert "400000\t" + "a" * 100 in view and "truncated" in view
        finally:
            await client.aclose()


@pytest.mark.security
async def test_another_user_cannot_prepare_the_server_directory_first(
    docker_engine: Any, built_artifacts: Any
) -> None:
    """THREAT_MODEL.md rule 1 (the agent cannot take over the runtime): with no
    SANDBOX_TOOLS_DIR (inspect's own host code runs us so), a root runtime installed in a
    directory of root's keeps its server beside the executable. An agent (uid 1000) that
    makes the shared default directory first no longer stops the tools: the runtime once
    refused that directory, and every call failed."""
    arch = arches_under_test()[0]
    _record, artifact = built_artifacts(arch)
    image = ensure_target_image(docker_engine, "debian-12", arch)
    with RunningContainer(docker_engine, image) as container:
        sandbox = container.sandbox
        assert (await sandbox.exec(["sh", "-c", "mkdir -m 755 /opt/st /tmp/shared"])).success
        exe = "/opt/st/sandbox-tools"
        await sandbox.write_file(exe, artifact.read_bytes(), mode=0o755)
        shared = "/tmp/shared/sandbox-tools"  # the same build where anyone may write
        assert (
            # others may write there (sticky, as /tmp: the launcher runs from no directory
            # where another user could swap its tree)
            await sandbox.exec(["sh", "-c", f"cp {exe} {shared} && chmod 1777 /tmp/shared"])
        ).success
        # Where a root runtime puts its server when its own directory is shared:
        elsewhere = ExecRuntimeClient(sandbox, [shared])
        fallback = (await elsewhere.call("runtime_info"))["server_dir"]
        assert fallback.startswith("/tmp/sandbox-tools-0-")
        await elsewhere.call("sandbox_tools_shutdown")
        assert (await sandbox.exec(["rm", "-rf", fallback])).success
        planted = await sandbox.exec(["mkdir", "-m", "700", fallback], user="1000:1000")
        assert planted.success, planted.stderr
        info = await ExecRuntimeClient(sandbox, [exe]).call("runtime_info")
        assert info["server_dir"].startswith("/opt/st/.run-0-"), info
        taken = await sandbox.exec(["mkdir", "/opt/st/.run-1000-x"], user="1000:1000")
        assert not taken.success  # nobody else can prepare one beside the executable
