"""The image's programs speak on the probe's stream in the probe's place, or cannot do
what the go needs: the host refuses typed or declines, and nothing is left half made."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandbox_tools.errors import SandboxInjectionError
from sandbox_tools.injector.inject import Injector
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.docker import DockerSandbox
from tests.integration.hostile_image import inject, installs, nothing_ran, ship, waiting_shells

pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.security, pytest.mark.timeout(240)]

# `mkdir -p /opt/sandbox-tools` prints on the stream: a forged end of the probe, early.
FORGING_MKDIR = (
    '#!/bin/sh\nif [ "$1 $2" = "-p /opt/sandbox-tools" ] && [ ! -e /etc/.forged ]; then '
    ": > /etc/.forged; echo 'sandbox-tools: probed'; fi\n"
    'exec /usr/bin/mkdir.real "$@"\n'
)


async def test_a_forged_early_end_of_probe_is_refused_and_leaves_nothing(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """The end line arrives before the facts: a typed refusal at once. The probe's shell
    goes on after the host hung up; it must not leave a `sandbox-tools-<tag>` that every
    later injection then installs beside (the next two injections: install, reuse)."""
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = DockerSandbox(c.container)
        await ship(sandbox, "mkdir", FORGING_MKDIR)
        with pytest.raises(SandboxInjectionError) as refused:
            async with Injector(InjectionOptions(artifact=artifact)) as injector:
                await asyncio.wait_for(injector.tool_support(sandbox), 60)
        print("refused:", refused.value)
        await asyncio.sleep(2)
        await nothing_ran(sandbox)
        assert await waiting_shells(sandbox) == []
        left = await installs(sandbox)
        first, _ = await inject(sandbox, artifact)
        second, _ = await inject(sandbox, artifact)
        print("left:", left, "then:", first.install_dir, second.install_dir, second.reused)
        assert second.reused, f"{left} left behind: every injection now installs afresh"


# A `head` that passes the probe's `printf abc | head -c 2` check only when it can count
# bytes is what the probe looks for; this one cannot (a busybox built without -c).
NO_BYTES_HEAD = '#!/bin/sh\ncase "$1" in -c) exec cat ;; esac\nexec /usr/bin/head.real "$@"\n'


async def test_a_declined_go_for_a_head_that_cannot_count_installs_step_by_step(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """head_bytes=no: the host declines the go (closes the stream) though the probe made
    the directory; the steps use that directory, nothing is left waiting, and the second
    injection reuses it."""
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = DockerSandbox(c.container)
        await ship(sandbox, "head", NO_BYTES_HEAD)
        first, info = await inject(sandbox, artifact)
        assert info["build_id"] == artifact.build_id
        assert not first.recon.has_head_bytes and first.install_dir == first.recon.made
        assert await waiting_shells(sandbox) == []
        second, _ = await inject(sandbox, artifact)
        assert second.reused and second.install_dir == first.install_dir
        await nothing_ran(sandbox)
