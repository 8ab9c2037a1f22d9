"""Two hosts (two Injectors, two sandbox objects) on one container at once, and
injections one after another with the install changed underneath between them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandbox_tools.errors import SandboxToolsError
from sandbox_tools.injector import jsonrpc_client
from sandbox_tools.injector.exec_remote import exec_remote
from sandbox_tools.injector.inject import Injector
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.docker import DockerSandbox
from tests.integration.hostile_image import (
    IMPOSTOR,
    eventually,
    inject,
    installs,
    nothing_ran,
    run,
    tag_of,
    waiting_shells,
)

pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.security, pytest.mark.timeout(240)]


async def test_four_hosts_inject_one_cold_container_at_once(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Four probes race for `mkdir sandbox-tools-<tag>`, each host then sends its bytes on
    its own stream: each must end up talking to the artifact, no shell left waiting, no
    staging file left, and a fifth injection afterwards reuses."""
    with RunningContainer(docker_engine, debian_image) as c:
        sandboxes = [DockerSandbox(c.container) for _ in range(4)]
        results = await asyncio.gather(
            *(inject(s, artifact) for s in sandboxes), return_exceptions=True
        )
        for result in results:
            assert not isinstance(result, BaseException), repr(result)
            assert result[1]["build_id"] == artifact.build_id
        dirs = sorted({r[0].install_dir for r in results})
        print("install directories:", dirs)
        assert await waiting_shells(sandboxes[0]) == []
        partial = await run(
            sandboxes[0], "ls /opt/sandbox-tools/*/.sandbox-tools.partial 2>/dev/null || true"
        )
        assert partial == ""
        again, info = await inject(DockerSandbox(c.container), artifact)
        assert again.reused and info["build_id"] == artifact.build_id


async def test_a_second_hosts_failed_first_start_never_removes_an_install_in_use(
    docker_engine: Any, debian_image: str, artifact: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Host A installs cold; its first answer is slow and A is then cancelled (its
    sample's time limit). Meanwhile host B's probe found A's install trusted and B is
    using it. A's clean-up (`rm -rf` of the directory it made) must not pull the install
    from under B: B's tools must keep working."""
    with RunningContainer(docker_engine, debian_image) as c:
        a, b = DockerSandbox(c.container), DockerSandbox(c.container)
        a_started = asyncio.Event()
        original = jsonrpc_client.StdioRuntimeClient.call

        async def slow_first_answer_for_a(self: Any, method: str, *args: Any, **kw: Any) -> Any:
            if self.sandbox is a and method == "runtime_info":
                a_started.set()
                await asyncio.sleep(3600)
            return await original(self, method, *args, **kw)

        monkeypatch.setattr(jsonrpc_client.StdioRuntimeClient, "call", slow_first_answer_for_a)
        async with Injector(InjectionOptions(artifact=artifact)) as injector_a:
            task_a = asyncio.ensure_future(injector_a.tool_support(a))
            await asyncio.wait_for(a_started.wait(), 60)
            tag = tag_of(artifact)
            directory = f"/opt/sandbox-tools/sandbox-tools-{tag}"

            async def server_up() -> bool:
                out = await run(b, f"ls {directory}/run/ 2>/dev/null || true")
                return "sock" in out or "socket" in out or "pid" in out

            await eventually(server_up, "A's server started")
            async with Injector(InjectionOptions(artifact=artifact)) as injector_b:
                support_b = await injector_b.tool_support(b)
                assert support_b.reused and support_b.install_dir == directory
                ok = await exec_remote(support_b.client, "echo before", stream=False)
                print("B before A's failure:", ok)
                task_a.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task_a
                await asyncio.sleep(2)
                left = await installs(b)
                try:
                    after = await exec_remote(support_b.client, "echo after", stream=False)
                    outcome = f"answered {after!r}"
                except SandboxToolsError as exc:
                    outcome = f"failed: {exc}"
                print("installs left:", left, "B after A's failure:", outcome)
                assert directory in left, f"A removed the install B is using; B {outcome}"
                assert outcome.startswith("answered"), outcome


async def test_an_install_removed_or_replaced_underneath_is_never_trusted(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Between injections, the install is removed (then reinstalled at the same name),
    then its executable replaced by a program of the same size, then a file of its
    unpacked tree replaced: nothing replaced ever runs, each injection answers as the
    artifact."""
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = DockerSandbox(c.container)
        first, _ = await inject(sandbox, artifact)
        d = first.install_dir
        await run(sandbox, f"rm -rf {d}")
        second, info = await inject(sandbox, artifact)
        assert info["build_id"] == artifact.build_id and second.install_dir == d
        assert not second.reused
        # Same size, other bytes (the image's root processes could do this).
        await run(
            sandbox,
            f"cp {d}/sandbox-tools /tmp/genuine && "
            f"{{ cat; head -c $(( {artifact.size} - {len(IMPOSTOR)} )) /dev/zero; }} "
            f"> {d}/.x && chmod 755 {d}/.x && mv {d}/.x {d}/sandbox-tools",
            input=IMPOSTOR.encode(),
        )
        third, info = await inject(sandbox, artifact)
        assert info["build_id"] == artifact.build_id and third.install_dir != d
        await nothing_ran(sandbox)
        # A file of the unpacked tree of the third install replaced by a script.
        d3 = third.install_dir
        victim = (await run(sandbox, f"ls -d {d3}/runtime-*/_internal/*.so* | head -n 1")).strip()
        assert victim, "no unpacked tree"
        await run(sandbox, f"printf '#!/bin/sh\\nid -u >> /tmp/.pwned\\n' > {victim}")
        fourth, info = await inject(sandbox, artifact)
        assert info["build_id"] == artifact.build_id
        print("installs:", d, third.install_dir, fourth.install_dir, fourth.reused)
        assert not (fourth.reused and fourth.install_dir == d3)
        await nothing_ran(sandbox)
