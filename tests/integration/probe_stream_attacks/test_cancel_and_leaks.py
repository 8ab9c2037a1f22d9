"""What a cancelled or failed first round trip leaves behind: in the sandbox (a directory
the probe made, a waiting shell, a process) and on the host (its connections)."""

from __future__ import annotations

import asyncio
import gc
import os
from typing import Any

import pytest

from sandbox_tools.errors import SandboxInjectionError
from sandbox_tools.injector import inject as inject_module
from sandbox_tools.injector import jsonrpc_client
from sandbox_tools.injector.inject import Injector
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.docker import DockerSandbox
from tests.integration.hostile_image import (
    cancelled_once,
    inject,
    installs,
    nothing_ran,
    processes,
    ship,
)

pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.security, pytest.mark.timeout(240)]


async def test_a_cancellation_as_the_probe_ends_leaves_no_directory_behind(
    docker_engine: Any, debian_image: str, artifact: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness cancels the injection (a sample's time limit, Ctrl-C) after the probe's
    shell made `sandbox-tools-<tag>` but before the host parsed the `made=` line: the host
    never learns the directory. It must not be left behind, and later injections must
    still install once and reuse."""
    probed = asyncio.Event()
    original = inject_module._until_probed

    async def slow_host(stream: Any) -> Any:  # the cancellation lands right here
        output = await original(stream)
        probed.set()
        await asyncio.sleep(3600)
        return output

    monkeypatch.setattr(inject_module, "_until_probed", slow_host)
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = DockerSandbox(c.container)
        async with Injector(InjectionOptions(artifact=artifact)) as injector:
            await cancelled_once(probed, injector.tool_support(sandbox))
        monkeypatch.setattr(inject_module, "_until_probed", original)
        left = await installs(sandbox)
        later = []
        for _ in range(3):
            support, _info = await inject(sandbox, artifact)
            later.append((support.install_dir, support.reused))
        print("left after the cancel:", left, "later injections:", later)
        assert left == [], f"the cancelled probe left {left}"
        assert [reused for _, reused in later] == [False, True, True], later


NEVER_READS = (
    '#!/bin/sh\ncase "$1 $2" in "-c 2"|"-n 1"|"-c 64"|"-c 16384") '
    'exec /usr/bin/head.real "$@" ;; esac\n'
    "exec sleep 3600\n"
)


def engine_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            pass
    return count


async def test_an_abandoned_hand_over_releases_the_hosts_connection(
    docker_engine: Any, debian_image: str, artifact: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 3: the image's `head` takes nothing on the probe's stream (or the agent at the
    installer's uid stops it). The hand-over times out (shortened to 3 s) and closes the
    stream: the host's connection to the engine must be released, not held for as long as
    the sandbox's process lives with our unsent bytes in its buffer."""
    monkeypatch.setattr(jsonrpc_client, "HAND_OVER_TIMEOUT", 3.0)
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = DockerSandbox(c.container)
        await ship(sandbox, "head", NEVER_READS)
        gc.collect()
        before = engine_sockets()
        for _ in range(3):
            with pytest.raises(SandboxInjectionError) as refused:
                await inject(sandbox, artifact, bound=60)
            print("refused:", str(refused.value)[:200])
        await asyncio.sleep(20)  # well past CLOSE_TIMEOUT (10 s)
        gc.collect()
        after = engine_sockets()
        left = await processes(sandbox)
        sleepers = [line.split()[0] for line in left.splitlines() if "sleep 3600" in line]
        await nothing_ran(sandbox)
        print("host sockets before / 20 s after:", before, after, "sandbox sleepers:", sleepers)
        assert after <= before, (
            f"{after - before} engine connections (each with our unsent bytes buffered) "
            "still held by the host 20 s after the injections failed; they last as long as "
            "the sandbox's process does"
        )
