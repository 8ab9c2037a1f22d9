"""What the probe's stream carries back to the host when the image's programs or the
agent (at the installer's uid) interfere: bounded memory and time, typed errors that say
what happened, nothing run."""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from typing import Any

import pytest

from sandbox_tools.errors import SandboxInjectionError
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
    run,
    ship,
    waiting_shells,
)

from .test_cancel_and_leaks import engine_sockets

pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.security, pytest.mark.timeout(240)]

# `mkdir -p /opt/sandbox-tools` runs with the stream as its stdout: one 60 MiB line.
FLOODING_MKDIR = (
    '#!/bin/sh\nif [ "$1 $2" = "-p /opt/sandbox-tools" ]; then '
    "head -c 62914560 /dev/zero | tr '\\0' a; echo; fi\nexec /usr/bin/mkdir.real \"$@\"\n"
)


async def test_one_long_probe_line_is_bounded_like_the_probes_output(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Rule 3: the probe prints a few hundred bytes and its output is bounded at 64 KiB
    (MAX_PROBE_OUTPUT; over exec the engine read stops there). On the stream, a single
    line is read whole before that bound is looked at: what the host holds for one
    injection's probe must stay near the bound, not the stream's 64 MiB line limit."""
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = DockerSandbox(c.container)
        await ship(sandbox, "mkdir", FLOODING_MKDIR)
        gc.collect()
        tracemalloc.start()
        started = time.monotonic()
        try:
            with pytest.raises(SandboxInjectionError) as refused:
                async with Injector(InjectionOptions(artifact=artifact)) as injector:
                    await asyncio.wait_for(injector.tool_support(sandbox), 90)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        took = time.monotonic() - started
        print(f"refused in {took:.1f} s, host peak {peak / 2**20:.0f} MiB: {refused.value}")
        await nothing_ran(sandbox)
        assert peak < 16 * 2**20, (
            f"one probe made the host hold {peak / 2**20:.0f} MiB (its output is bounded at 64 KiB)"
        )


# The agent, at the runtime's own uid (a sandbox whose default user is 1000): it stops
# the `head` that takes the runtime's bytes on the probe's stream.
STOPPER = (
    "while :; do for p in /proc/[0-9]*; do "
    'case "$(tr "\\0" " " < $p/cmdline 2>/dev/null)" in "head -c "*) '
    "kill -STOP ${p#/proc/} 2>/dev/null ;; esac; done; done"
)


async def test_a_stopped_head_is_reported_as_what_happened_and_releases_the_host(
    docker_engine: Any, debian_image: str, artifact: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent shares the runtime's uid (the threat model's normal case) and SIGSTOPs
    the probe shell's `head` mid-transfer. The hand-over's deadline (shortened to 3 s)
    ends it: the error must say the bytes were not taken in time (not blame a file system
    that altered them), and the host must not keep the engine connection."""
    monkeypatch.setattr(jsonrpc_client, "HAND_OVER_TIMEOUT", 3.0)
    with RunningContainer(docker_engine, debian_image, user="1000") as c:
        sandbox = DockerSandbox(c.container)
        await run(sandbox, f"nohup sh -c '{STOPPER}' >/dev/null 2>&1 &")
        gc.collect()
        before = engine_sockets()
        with pytest.raises(SandboxInjectionError) as refused:
            await inject(sandbox, artifact, bound=60)
        message = str(refused.value)
        print("refused:", message)
        await asyncio.sleep(15)
        gc.collect()
        after = engine_sockets()
        print("host sockets before/after:", before, after)
        await run(sandbox, "kill -9 -1 2>/dev/null; true")  # the agent's loop and `head`
        misleading = "does not match" in message
        leaked = after - before
        assert not misleading and leaked <= 0, (
            f"misleading error: {misleading} ({message[:160]}); "
            f"engine connections still held: {leaked}"
        )


async def test_a_cancellation_mid_transfer_leaves_nothing(
    docker_engine: Any, debian_image: str, artifact: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled after the go and a first megabyte of the runtime's bytes: the shell and
    its `head` end, the directory the probe made is gone, nothing is left to reuse, the
    host lets its connection go, and the next injection is a normal cold one."""
    sent = asyncio.Event()

    async def stalls(stream: Any, pieces: tuple[bytes, ...]) -> None:
        await stream.write(pieces[0])
        if len(pieces) > 1:
            await stream.write(pieces[1][: 1 << 20])
            sent.set()
            await asyncio.sleep(3600)

    monkeypatch.setattr(jsonrpc_client, "_write_in_order", stalls)
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = DockerSandbox(c.container)
        gc.collect()
        before = engine_sockets()
        async with Injector(InjectionOptions(artifact=artifact)) as injector:
            await cancelled_once(sent, injector.tool_support(sandbox))
        await asyncio.sleep(3)
        gc.collect()
        after = engine_sockets()
        assert await waiting_shells(sandbox) == []
        assert "head -c" not in await processes(sandbox)
        assert await installs(sandbox) == []
        assert after <= before, f"{after - before} engine connections held"
        monkeypatch.undo()
        support, info = await inject(sandbox, artifact)
        assert info["build_id"] == artifact.build_id and not support.reused
