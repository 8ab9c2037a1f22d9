"""tool_support_sandbox into real containers: reuse, locking, trust, hostile mounts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandbox_tools.errors import SandboxInjectionError
from sandbox_tools.injector.exec_remote import exec_remote
from sandbox_tools.injector.inject import forget_sandbox, tool_support_sandbox
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.docker import DockerSandbox
from tests.support import arches_under_test

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]


@pytest.fixture
def dist_env(built_artifacts: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Point acquisition at the artifact the session built (no rebuild per test)."""
    record, path = built_artifacts(arches_under_test()[0])
    monkeypatch.setenv("SANDBOX_TOOLS_DIST", str(path.parent))
    return record


async def test_second_call_reuses_without_writing(
    docker_engine: Any, debian_image: str, dist_env: Any
) -> None:
    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        first = await tool_support_sandbox(sandbox)
        assert (first.reused, first.writes) == (False, 2)
        assert first.info is not None and first.info.build_id == dist_env.build_id
        await first.aclose()
        await forget_sandbox(sandbox)  # a new host process: only what is in the sandbox counts
        second = await tool_support_sandbox(DockerSandbox(container.container, docker_engine))
        assert (second.reused, second.writes, second.install_dir) == (True, 0, first.install_dir)
        result = await exec_remote(second.client, "echo reused", stream=False)
        assert result.stdout == "reused\n"
        await second.aclose()
        await forget_sandbox(sandbox)


async def test_concurrent_first_calls_inject_once(
    docker_engine: Any, debian_image: str, dist_env: Any
) -> None:
    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        handles = await asyncio.gather(*(tool_support_sandbox(sandbox) for _ in range(5)))
        assert all(handle is handles[0] for handle in handles)
        listing = await sandbox.exec(["sh", "-c", "ls -d /opt/sandbox-tools/*/"])
        assert len(listing.stdout.split()) == 1
        await handles[0].aclose()
        await forget_sandbox(sandbox)


async def test_foreign_install_directory_is_not_trusted(
    docker_engine: Any, debian_image: str, dist_env: Any
) -> None:
    tag = dist_env.build_id.removeprefix("sha256:")[:16]
    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        # uid 1000 owns /opt/sandbox-tools and planted a look-alike install in it.
        planted = f"/opt/sandbox-tools/sandbox-tools-{tag}"
        script = (
            f'mkdir -p {planted} && printf "#!/bin/sh\\necho pwned" > {planted}/sandbox-tools'
            f" && chmod 755 {planted}/sandbox-tools && chown -R 1000:1000 /opt/sandbox-tools"
            " && mkdir -p /opt/inspect-sandbox-tools"
        )  # another tool's install: ignored
        assert (await sandbox.exec(["sh", "-c", script])).returncode == 0
        support = await tool_support_sandbox(sandbox)
        assert not support.install_dir.startswith("/opt/sandbox-tools")
        # The next private directory (root's home) before any shared one.
        assert support.install_dir.startswith("/root/sandbox-tools-")
        candidate = support.recon.candidates[0]
        assert candidate.path == "/opt/sandbox-tools"
        assert "owned by another user" in candidate.reason
        assert (await support.client.call("runtime_info"))["build_id"] == dist_env.build_id
        await support.aclose()
        await forget_sandbox(sandbox)


async def test_read_only_root_with_exec_tmpfs_succeeds(
    docker_engine: Any, debian_image: str, dist_env: Any
) -> None:
    with RunningContainer(
        docker_engine, debian_image, read_only=True, tmpfs={"/tmp": "exec,mode=1777"}
    ) as container:
        sandbox = container.sandbox
        support = await tool_support_sandbox(sandbox)
        assert support.install_dir.startswith("/tmp/")  # streamed through exec: no upload
        result = await exec_remote(support.client, "touch /etc/x 2>&1; echo done", stream=False)
        assert "Read-only file system" in result.stdout
        await support.aclose()
        await forget_sandbox(sandbox)


async def test_read_only_root_with_only_noexec_mounts_fails_clearly(
    docker_engine: Any, debian_image: str, dist_env: Any
) -> None:
    with RunningContainer(
        docker_engine,
        debian_image,
        read_only=True,
        tmpfs={"/tmp": "noexec,mode=1777", "/var/tmp": "noexec,mode=1777"},
    ) as container:
        sandbox = container.sandbox
        with pytest.raises(SandboxInjectionError) as failure:
            await tool_support_sandbox(sandbox)
        message = str(failure.value)
        for directory, why in (
            ("/opt/sandbox-tools", "missing"),
            ("/var/tmp", "noexec"),
            ("/tmp", "noexec"),
            ("/dev/shm", "noexec"),
            ("/root", "not writable"),
        ):
            assert f"{directory}: {why}" in message, message
        assert "tmpfs /tmp:exec" in failure.value.remedy  # the remedy, apart from the message
        await forget_sandbox(sandbox)


async def test_a_failed_install_leaves_nothing_behind(
    docker_engine: Any, debian_image: str, dist_env: Any
) -> None:
    """Issue path: an install that fails half way (here the tmpfs is too small for the
    artifact) removes the directory it made, so that retries do not pile up copies."""
    with RunningContainer(
        docker_engine,
        debian_image,
        read_only=True,
        tmpfs={"/tmp": "exec,mode=1777,size=1m", "/var/tmp": "noexec,mode=1777"},
    ) as container:
        sandbox = container.sandbox
        with pytest.raises(SandboxInjectionError) as failure:
            await tool_support_sandbox(sandbox)
        assert "/tmp/sandbox-tools-" in str(failure.value)
        left = await sandbox.exec(["sh", "-c", "ls -A /tmp; df -k /tmp | tail -1"])
        assert "sandbox-tools" not in left.stdout.decode(), left.stdout
        await forget_sandbox(sandbox)


async def test_unsupported_platform_names_the_platform_and_the_supported_list(
    tmp_path: Any,
) -> None:
    import os

    from sandbox_tools.sandboxes.local import LocalSandbox

    shim = tmp_path / "uname"
    shim.write_text("#!/bin/sh\necho riscv64\n")
    shim.chmod(0o755)
    sandbox = LocalSandbox({**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    sandbox.name = "local-riscv64"
    with pytest.raises(SandboxInjectionError) as failure:
        await tool_support_sandbox(sandbox)
    assert "linux/riscv64" in str(failure.value)
    assert "supported: linux/amd64, linux/arm64" in str(failure.value)


async def test_injection_without_any_shell(docker_engine: Any, dist_env: Any) -> None:
    from sandbox_tools.sandboxes.images import ensure_busybox_image

    image = ensure_busybox_image(docker_engine, arches_under_test()[0], applets=False)
    with RunningContainer(
        docker_engine, image, command=["/.sleeper/busybox", "sleep", "infinity"]
    ) as container:
        sandbox = container.sandbox
        assert (await sandbox.exec(["sh", "-c", "true"])).returncode != 0  # really no shell
        support = await tool_support_sandbox(sandbox)
        assert not support.recon.has_shell and "no shell" in support.recon.notes[0]
        assert support.install_dir.startswith("/tmp/sandbox-tools-")
        assert support.writes == 1  # one upload: directory, artifact and marker
        assert (await support.client.call("runtime_info"))["build_id"] == dist_env.build_id
        await support.aclose()
        await forget_sandbox(sandbox)


async def test_the_block_form_and_options_a_second_call_cannot_change(
    docker_engine: Any, debian_image: str, dist_env: Any
) -> None:
    """User path (docs/INJECTION.md): `open_tool_support` injects for the block and
    closes its client after; a second `tool_support_sandbox` with other options is
    refused with a reason instead of silently keeping the first call's."""
    from dataclasses import replace

    from sandbox_tools.errors import ConfigurationError
    from sandbox_tools.injector.inject import open_tool_support
    from sandbox_tools.injector.options import InjectionOptions

    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        async with open_tool_support(sandbox) as support:
            result = await exec_remote(support.client, "echo block", stream=False)
            assert result.stdout == "block\n"
        first = await tool_support_sandbox(sandbox)
        exec_per_call = InjectionOptions(persistent=False)
        with pytest.raises(ConfigurationError, match=r"opened with persistent=True; .*False"):
            await tool_support_sandbox(sandbox, options=exec_per_call)
        other = replace(first.artifact, build_id="sha256:" + "0" * 64)
        with pytest.raises(ConfigurationError, match=r"opened with artifact=None; .*sha256:0000"):
            await tool_support_sandbox(sandbox, options=InjectionOptions(artifact=other))
        assert await tool_support_sandbox(sandbox) is first
        await forget_sandbox(sandbox)
