"""The agent (uid 1000) against a root injection whose only usable base is the shared,
sticky /tmp (read-only root, /tmp a tmpfs): what it can plant before the probe's stream
makes and fills `sandbox-tools-<tag>` there."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.docker import DockerSandbox
from tests.integration.hostile_image import (
    IMPOSTOR,
    PWNED,
    inject,
    nothing_ran,
    run,
    tag_of,
    waiting_shells,
)

pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.security, pytest.mark.timeout(180)]

READ_ONLY = {"read_only": True, "tmpfs": {"/tmp": "exec,mode=1777"}}


async def test_a_dangling_link_at_the_install_name_is_never_followed(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """`[ -e ]` is false for a dangling link, so the probe counts no earlier install and
    goes on to `mkdir` the very name the agent linked. The link points where root making
    a directory would matter; nothing may be made there, and the runtime answers from a
    directory of root's."""
    tag = tag_of(artifact)
    with RunningContainer(docker_engine, debian_image, **READ_ONLY) as c:
        sandbox = DockerSandbox(c.container)
        await run(
            sandbox,
            f"ln -s /tmp/agent-target /tmp/sandbox-tools-{tag} && "
            f"ln -s /tmp/agent-target2 /tmp/.sandbox-tools-probe.AAAAAAAA",
            user="1000",
        )
        support, info = await inject(sandbox, artifact)
        assert info["build_id"] == artifact.build_id
        assert support.install_dir.startswith(f"/tmp/sandbox-tools-{tag}-"), support.install_dir
        owner = await run(sandbox, f"stat -c '%u %a' {support.install_dir}")
        assert owner.split() == ["0", "755"]
        assert await run(sandbox, "ls -d /tmp/agent-target* 2>/dev/null || true") == ""
        assert await waiting_shells(sandbox) == []


async def test_an_agent_install_at_the_exact_name_in_tmp_never_runs(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """The agent prepares `/tmp/sandbox-tools-<tag>` as a complete look-alike (its own
    executable, a staging link, a run/ dir). Two injections one after another: neither
    runs anything of it, both answer as the artifact."""
    tag = tag_of(artifact)
    planted = f"/tmp/sandbox-tools-{tag}"
    with RunningContainer(docker_engine, debian_image, **READ_ONLY) as c:
        sandbox = DockerSandbox(c.container)
        await run(
            sandbox,
            f"mkdir -p {planted}/run && chmod 755 {planted} && "
            f"cat > {planted}/sandbox-tools && chmod 755 {planted}/sandbox-tools && "
            f"ln -s /tmp/agent-partial {planted}/.sandbox-tools.partial",
            user="1000",
            input=IMPOSTOR.encode(),
        )
        for _ in range(2):
            support, info = await inject(sandbox, artifact)
            assert info["build_id"] == artifact.build_id
            assert support.install_dir != planted
        await nothing_ran(sandbox)
        assert await run(sandbox, "ls /tmp/agent-partial 2>/dev/null || true") == ""
        assert await run(sandbox, f"cat {PWNED} 2>/dev/null || true") == ""


@pytest.mark.xfail(
    strict=True,
    reason="open, low: reuse looks at the exact name only; an agent's directory there in "
    "a shared base (the only base under a read-only root) makes every later injection "
    "install beside it (THREAT_MODEL.md, open items)",
)
async def test_after_a_plant_in_tmp_every_later_injection_still_reuses(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Availability: an agent's plant at the exact name in the shared base must not make
    every later injection install (9 MB, an unpacked tree and one more server) again."""
    tag = tag_of(artifact)
    with RunningContainer(docker_engine, debian_image, **READ_ONLY) as c:
        sandbox = DockerSandbox(c.container)
        await run(sandbox, f"mkdir /tmp/sandbox-tools-{tag}", user="1000")
        first, _ = await inject(sandbox, artifact)
        second, _ = await inject(sandbox, artifact)
        third, _ = await inject(sandbox, artifact)
        used = await run(sandbox, "du -sm /tmp/sandbox-tools-* | tr '\\n\\t' '; '")
        servers = await run(
            sandbox,
            "for p in /proc/[0-9]*; do readlink $p/exe; done 2>/dev/null | "
            "grep -c 'sandbox-tools-.*/runtime-' || true",
        )
        assert second.reused and third.reused, (
            f"every injection installed afresh: {first.install_dir}, {second.install_dir}, "
            f"{third.install_dir}; /tmp (tmpfs) holds {used}; runtime processes: {servers}"
        )
