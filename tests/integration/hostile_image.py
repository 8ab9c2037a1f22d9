"""What the injection's attack tests share: a hostile image's tools shipped as root
before the injection, the agent's and the image's programs noting that they ran, and
what a test reads back from the container (run past any counting the test's sandbox
does)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sandbox_tools.injector.inject import Injector
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.sandboxes.docker import DockerSandbox

PWNED = "/tmp/.pwned"  # what the image's or the agent's programs write when they run
# A program of the agent's or the image's: notes its uid, then answers as a runtime would.
IMPOSTOR = (
    f"#!/bin/sh\nid -u >> {PWNED}\n"
    'echo \'{"jsonrpc":"2.0","id":1,"result":{"build_id":"forged"}}\'\n'
)
# Every process whose command line holds the probe's end line: a shell still waiting.
WAITING_SHELLS = (
    'for p in /proc/[0-9]*; do tr "\\0" " " < "$p/cmdline" 2>/dev/null '
    '| grep -q "sandbox-tools: probe[d]" && echo "${p#/proc/}"; done; true'
)


def tag_of(artifact: Any) -> str:
    return str(artifact.build_id).removeprefix("sha256:")[:16]


async def run(sandbox: DockerSandbox, script: str, user: str | None = None, **kw: Any) -> str:
    out = await DockerSandbox.exec(sandbox, ["sh", "-c", script], user=user, timeout=60, **kw)
    assert out.returncode == 0, (out.stdout, out.stderr)
    return out.stdout.decode()


async def ship(sandbox: DockerSandbox, name: str, script: str) -> None:
    """The image's /usr/bin/NAME replaced by `script` (the original kept as NAME.real)."""
    out = await DockerSandbox.exec(
        sandbox,
        [
            "sh",
            "-c",
            'cat > "/usr/bin/.$1.new" && chmod 755 "/usr/bin/.$1.new" && '
            'mv "/usr/bin/$1" "/usr/bin/$1.real" && mv "/usr/bin/.$1.new" "/usr/bin/$1"',
            "ship",
            name,
        ],
        input=script.encode(),
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


async def nothing_ran(sandbox: DockerSandbox) -> None:
    ran = await run(sandbox, f"cat {PWNED} 2>/dev/null || true")
    assert ran == "", f"a program of the image's or the agent's ran as uid {ran!r}"


async def installs(sandbox: DockerSandbox, base: str = "/opt/sandbox-tools") -> list[str]:
    return (await run(sandbox, f"ls -d {base}/sandbox-tools-* 2>/dev/null || true")).split()


async def waiting_shells(sandbox: DockerSandbox) -> list[str]:
    return (await run(sandbox, WAITING_SHELLS)).split()


async def processes(sandbox: DockerSandbox) -> str:
    return await run(
        sandbox,
        'for p in /proc/[0-9]*; do printf "%s " "${p#/proc/}"; '
        'tr "\\0" " " < "$p/cmdline" 2>/dev/null | cut -c1-150; echo; done',
    )


async def inject(sandbox: DockerSandbox, artifact: Any, bound: float = 60.0) -> Any:
    async with Injector(InjectionOptions(artifact=artifact)) as injector:
        support = await asyncio.wait_for(injector.tool_support(sandbox), bound)
        info = await support.client.call("runtime_info")
        return support, info


async def cancelled_once(event: asyncio.Event, injection: Any) -> None:
    """Run `injection` until `event` is set, then cancel it: it must end cancelled."""
    task = asyncio.ensure_future(injection)
    await asyncio.wait_for(event.wait(), 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def eventually(check: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        await asyncio.sleep(0.2)
