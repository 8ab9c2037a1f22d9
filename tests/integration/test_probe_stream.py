"""The probe on the first start's own stream (INJECTION.md, THREAT_MODEL.md "A fresh
install"): one stream carries the probe, the host's go and, for a fresh install, the
runtime's bytes. These tests hold its promises against real containers: a cold
injection and a reuse take that one stream and no exec; where the host declines (its
choice is not what the waiting shell can do), or the injection is cancelled while the
shell waits, no shell is left waiting and no half-made install is left; a probe that
floods its stream or never ends is refused within its bounds.

The artifact is the prebuilt one in dist/ (never built here).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from typing import Any

import pytest

from sandbox_tools.errors import SandboxInjectionError
from sandbox_tools.injector import inject
from sandbox_tools.injector.inject import Injector
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.base import ExecOutput, Stream
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.docker import DockerSandbox
from sandbox_tools.sandboxes.images import ensure_busybox_image
from tests.integration.hostile_image import (
    cancelled_once,
    eventually,
    installs,
    run,
    tag_of,
    waiting_shells,
)

pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.security, pytest.mark.timeout(180)]


class Counted(DockerSandbox):
    """The Docker provider, counting what the injection asks of the engine."""

    def __init__(self, container: Any) -> None:
        super().__init__(container)
        self.execs: list[list[str]] = []
        self.streams: list[list[str]] = []

    async def exec(self, cmd: list[str], *args: Any, **kwargs: Any) -> ExecOutput:
        self.execs.append(cmd)
        return await super().exec(cmd, *args, **kwargs)

    async def open_stream(
        self, cmd: list[str], env: Mapping[str, str] | None = None, user: str | None = None
    ) -> Stream:
        self.streams.append(cmd)
        return await super().open_stream(cmd, env, user)


async def no_shell_waits(sandbox: DockerSandbox) -> bool:
    return await waiting_shells(sandbox) == []


async def no_install(sandbox: DockerSandbox) -> bool:
    return await installs(sandbox) == []


def images(docker_engine: Any, debian_image: str) -> dict[str, str]:
    arch = Arch.parse(os.uname().machine)
    return {"debian": debian_image, "busybox": ensure_busybox_image(docker_engine, arch)}


@pytest.mark.parametrize("image", ["debian", "busybox"])
async def test_a_cold_injection_and_a_reuse_take_one_stream_and_no_exec(
    docker_engine: Any, debian_image: str, artifact: Any, image: str
) -> None:
    """The whole cold injection (probe, go, bytes, check, first answer) is one stream;
    so is a reuse (probe with its checks, go). The runtime that answers is the artifact,
    run from the directory the probe made, and the waiting shell is gone."""
    with RunningContainer(docker_engine, images(docker_engine, debian_image)[image]) as c:
        sandbox = Counted(c.container)
        async with Injector(InjectionOptions(artifact=artifact)) as injector:
            cold = await injector.tool_support(sandbox)
            assert not cold.reused and cold.info.build_id == artifact.build_id
            assert cold.recon.made == cold.install_dir
            assert (sandbox.execs, len(sandbox.streams)) == ([], 1)
            server = await run(sandbox, f"readlink /proc/{cold.info.pid}/exe")
            assert server.startswith(f"{cold.install_dir}/runtime-"), server
        sandbox.execs.clear()
        sandbox.streams.clear()
        async with Injector(InjectionOptions(artifact=artifact)) as injector:
            again = await injector.tool_support(sandbox)
            assert again.reused and again.install_dir == cold.install_dir
            assert (sandbox.execs, len(sandbox.streams)) == ([], 1)
            assert (await again.client.call("runtime_info"))["build_id"] == artifact.build_id
        assert await waiting_shells(sandbox) == []


async def test_a_declined_go_ends_the_shell_and_the_steps_go_on(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """An earlier install the probe cannot trust (the agent's executable in it) makes it
    make nothing: the host declines the go, the shell ends, and the injection goes on
    step by step into a fresh directory beside it; nothing of the agent's runs."""
    tag = str(artifact.build_id).removeprefix("sha256:")[:16]
    planted = f"/opt/sandbox-tools/sandbox-tools-{tag}"
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = Counted(c.container)
        await run(
            sandbox,
            f"mkdir -p {planted} && printf '#!/bin/sh\\ntouch /tmp/.pwned\\n' "
            f"> {planted}/sandbox-tools && chmod 755 {planted}/sandbox-tools && "
            f"chown -R 1000 {planted}",
        )
        async with Injector(InjectionOptions(artifact=artifact)) as injector:
            support = await injector.tool_support(sandbox)
            assert not support.reused and support.install_dir.startswith(f"{planted}-")
            assert support.info.build_id == artifact.build_id
            assert sandbox.execs  # the steps, after the declined go
        assert await waiting_shells(sandbox) == []
        assert await run(sandbox, "ls /tmp/.pwned 2>/dev/null || true") == ""


async def test_a_cancelled_injection_leaves_no_shell_and_no_directory(
    docker_engine: Any, debian_image: str, artifact: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while the probe's shell waits for its go (the host still deciding): the
    stream is closed, the shell ends, and the directory the probe made is removed."""
    deciding = asyncio.Event()

    async def never_decides(*_: Any) -> None:
        deciding.set()
        await asyncio.sleep(3600)

    monkeypatch.setattr(inject, "find_trusted_install", never_decides)
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = Counted(c.container)
        async with Injector(InjectionOptions(artifact=artifact)) as injector:

            async def waiting_then_cancelled() -> None:
                await deciding.wait()
                assert len(await waiting_shells(sandbox)) == 1
                shell_seen.set()

            shell_seen = asyncio.Event()
            watcher = asyncio.ensure_future(waiting_then_cancelled())
            await cancelled_once(shell_seen, injector.tool_support(sandbox))
            await watcher
        assert await installs(sandbox) == []
        await eventually(lambda: no_shell_waits(sandbox), "the waiting shell ended")


# The image's `stat`, as root before the injection: what a hostile image ships.
# Floods once, where the probe prints what `stat` says as it is (the directory it made),
# past what a probe prints.
FLOODING_STAT = (
    '#!/bin/sh\ncase "$2 $3" in "%u|%a /opt/sandbox-tools/sandbox-tools-"*) '
    "yes 'a line no probe prints' | head -c 70000 ;; *) exec /usr/bin/stat.real \"$@\" ;; esac\n"
)
HANGING_STAT = "#!/bin/sh\nexec sleep 3600\n"


async def ship_stat(sandbox: DockerSandbox, script: str) -> None:
    await run(
        sandbox,
        "cat > /usr/bin/.stat.new && chmod 755 /usr/bin/.stat.new && "
        "mv /usr/bin/stat /usr/bin/stat.real && mv /usr/bin/.stat.new /usr/bin/stat",
        input=script.encode(),
    )


@pytest.mark.parametrize("stat", ["floods", "hangs"])
async def test_a_probe_that_floods_or_hangs_is_refused_within_its_bounds(
    docker_engine: Any,
    debian_image: str,
    artifact: Any,
    monkeypatch: pytest.MonkeyPatch,
    stat: str,
) -> None:
    """The probe's stream is read with the probe's own bounds: 70 kB of lines (more
    than any probe prints) is a typed error, and so is a probe that never ends (its
    deadline shortened to 3 s here). The shell, meeting stdin's end, removes the
    directory it made (the host cannot tell which from a refused output), and the next
    injection, with the image's `stat` mended, installs at the exact name."""
    monkeypatch.setattr(inject, "PROBE_TIMEOUT", 3.0)
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = Counted(c.container)
        await ship_stat(sandbox, FLOODING_STAT if stat == "floods" else HANGING_STAT)
        started = time.monotonic()
        with pytest.raises(SandboxInjectionError) as refused:
            async with Injector(InjectionOptions(artifact=artifact)) as injector:
                await asyncio.wait_for(injector.tool_support(sandbox), 30)
        assert time.monotonic() - started < 15
        said = "did not finish within 3 s" if stat == "hangs" else "printed more than 65536"
        assert said in str(refused.value)
        assert sandbox.execs == []  # refused on the stream, not retried step by step
        await run(sandbox, "pkill sleep || true; mv /usr/bin/stat.real /usr/bin/stat")
        await eventually(lambda: no_install(sandbox), "the made directory removed")
        async with Injector(InjectionOptions(artifact=artifact)) as injector:
            support = await injector.tool_support(sandbox)
            assert support.install_dir == support.recon.made and not support.reused
            assert support.install_dir.rpartition("-")[2] == tag_of(artifact)
