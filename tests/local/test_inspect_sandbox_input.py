"""The add-on's plain tar reaches inspect's sandboxes as a view of the host's file
(browser_addon: `addon_copy.mapped`), not as bytes: inspect's `local` and `docker`
providers, and the proxy that records an eval's sandbox events, must take it."""

from __future__ import annotations

import mmap

from inspect_ai.util._sandbox.events import SandboxEnvironmentProxy
from inspect_ai.util._sandbox.local import LocalSandboxEnvironment

from sandbox_tools.inspect.adapter import InspectSandbox


async def test_inspects_local_sandbox_and_its_event_proxy_take_a_view_as_input() -> None:
    data = mmap.mmap(-1, 3_000_000)
    data[:5] = b"hello"
    for environment in (
        LocalSandboxEnvironment(),
        SandboxEnvironmentProxy(LocalSandboxEnvironment()),
    ):
        sandbox = InspectSandbox(environment)
        out = await sandbox.exec(["sh", "-c", "head -c 5; wc -c"], input=memoryview(data))
        assert out.returncode == 0, out.stderr
        assert out.stdout == b"hello2999995\n"
