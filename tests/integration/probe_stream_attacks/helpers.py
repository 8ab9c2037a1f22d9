"""Shared helpers for the probe-stream attack walk."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sandbox_tools.injector.inject import Injector
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.sandboxes.docker import DockerSandbox

PWNED = "/tmp/.pwned"
IMPOSTOR = (
    f"#!/bin/sh\nid -u >> {PWNED}\n"
    'echo \'{"jsonrpc":"2.0","id":1,"result":{"build_id":"forged"}}\'\n'
)
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


async def eventually(check: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        await asyncio.sleep(0.2)
