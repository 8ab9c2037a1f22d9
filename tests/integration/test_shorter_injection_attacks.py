"""Attacks on the shorter injection: the cold install that sends the runtime's bytes on
its first start's stream, the probe that checks earlier installs itself, and the server
that loads a tool on its first call (THREAT_MODEL.md: "A fresh install", "Reusing an
install", "What the image and the agent can put in the runtime's way").

The image's own tools are replaced as root before the injection, which is what an image
that ships them does; the agent is uid 1000. Each test checks the outcome: a typed error
within a stated time, nothing of the image's or the agent's ran as root, nothing half
made is left for a later injection to trust. The artifact is the prebuilt one in dist/
(never built here).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sandbox_tools.errors import RuntimeRpcError, SandboxInjectionError
from sandbox_tools.injector import jsonrpc_client
from sandbox_tools.injector.exec_remote import exec_remote
from sandbox_tools.injector.inject import Injector
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.docker import DockerSandbox
from tests.integration.hostile_image import (
    IMPOSTOR,
    installs,
    nothing_ran,
    run,
    ship,
    tag_of,
)

pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.security, pytest.mark.timeout(120)]

# Each hostile injection must end with a typed error within this (the hand-over's
# deadline is shortened to HAND_OVER seconds; every other step keeps its own).
HAND_OVER = 5.0
BOUND = 15.0


@pytest.fixture
def short_hand_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonrpc_client, "HAND_OVER_TIMEOUT", HAND_OVER)


async def nothing_half_made_left(sandbox: DockerSandbox, artifact: Any) -> None:
    """What a refused injection may leave: nothing, or (where the image's shell went on
    after the host gave up and its checked executable reached its place: another host
    may be running it from then on) the whole checked install, never less."""
    for left in await installs(sandbox):
        digest = await run(sandbox, f"sha256sum < {left}/sandbox-tools 2>/dev/null || true")
        assert digest.split()[:1] == [artifact.sha256], f"{left} is half made"


async def inject_within(sandbox: DockerSandbox, artifact: Any, bound: float = BOUND) -> Any:
    """The injection, bounded by the test: a host that hangs fails the test."""
    async with Injector(InjectionOptions(artifact=artifact)) as injector:
        return await asyncio.wait_for(injector.tool_support(sandbox), bound)


async def refused_within(
    sandbox: DockerSandbox, artifact: Any, bound: float = BOUND
) -> SandboxInjectionError:
    started = time.monotonic()
    try:
        await inject_within(sandbox, artifact, bound)
    except SandboxInjectionError as exc:
        print(f"refused in {time.monotonic() - started:.1f} s: {exc}")
        return exc
    except TimeoutError:
        pytest.fail(f"the host hung: no answer within {bound:g} s")
    pytest.fail("the injection succeeded against a hostile sandbox")


# -- 1. the cold install: bytes on the first start's stream ------------------------------

# Passes the probe's `printf abc | head -c 2` and its reads of /etc/os-release and the
# like; anything else: the variant's behaviour.
HEAD_PASSES_THE_PROBE = (
    '#!/bin/sh\ncase "$1 $2" in "-c 2"|"-n 1"|"-c 64"|"-c 16384") '
    'exec /usr/bin/head.real "$@" ;; esac\n'
)
HOSTILE_HEADS = {
    # never reads its input: the host's write of 9 MB fills every buffer and waits
    "never-reads": HEAD_PASSES_THE_PROBE + "exec sleep 3600\n",
    # reads everything until the end of the stream, which the host never sends
    "reads-to-the-end": HEAD_PASSES_THE_PROBE
    + 'cat > /tmp/.all; exec /usr/bin/head.real -c "$2" /tmp/.all\n',
    # takes fewer bytes than it was asked for
    "reads-short": HEAD_PASSES_THE_PROBE + "exec /usr/bin/head.real -c $(($2 - 1))\n",
    # takes them all, but writes a program of its own
    "writes-its-own": HEAD_PASSES_THE_PROBE
    + f"/usr/bin/head.real -c \"$2\" > /dev/null; printf %s '{IMPOSTOR}'\n",
}


@pytest.mark.parametrize(
    "variant",
    [
        "never-reads",  # held the injection for ever before the write had a deadline
        "reads-to-the-end",
        "reads-short",
        "writes-its-own",
    ],
)
async def test_a_hostile_head_ends_in_a_typed_error_and_nothing_runs(
    docker_engine: Any, debian_image: str, artifact: Any, short_hand_over: None, variant: str
) -> None:
    """Rule 3 and rule 2: the image's `head` passes the probe's check and then misbehaves
    with the runtime's bytes. The injection fails with a typed error within its bounds,
    nothing of the image's runs, and no half-made install is left behind (a `head` that
    read everything may let its shell finish the checked install after the host gave
    up: that whole install may stay)."""
    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        await ship(sandbox, "head", HOSTILE_HEADS[variant])
        await refused_within(sandbox, artifact)
        await nothing_ran(sandbox)
        await nothing_half_made_left(sandbox, artifact)


# Prints before `head` reads: anything on stdout before the bytes are taken.
FLOODING_RM = (
    '#!/bin/sh\ncase "$2" in *.partial) dd if=/dev/zero bs=1M count=4 2>/dev/null '
    "| tr '\\0' a ;; esac\nexec /usr/bin/rm.real \"$@\"\n"
)


async def test_output_before_the_bytes_are_taken_cannot_deadlock_the_host(
    docker_engine: Any, debian_image: str, artifact: Any, short_hand_over: None
) -> None:
    """Rule 3: the image's `rm` (the prefix's first command) prints 4 MB without a newline
    before `head` starts. The host is writing 9 MB and reads nothing until it is done;
    the sandbox's stdout fills, `rm` blocks, `head` never reads. The host must still
    end with a typed error within its bounds."""
    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        await ship(sandbox, "rm", FLOODING_RM)
        await refused_within(sandbox, artifact)
        await nothing_ran(sandbox)


# Says "staged" before anything was taken or checked (the line the host waits for).
FORGING_RM = (
    '#!/bin/sh\ncase "$2" in *.partial) echo "sandbox-tools: staged" ;; esac\n'
    'exec /usr/bin/rm.real "$@"\n'
)


async def test_a_forged_staged_line_runs_nothing_unchecked(
    docker_engine: Any, debian_image: str, artifact: Any, short_hand_over: None
) -> None:
    """Rule 2: the image's `rm` forges the prefix's "staged" line before the bytes are
    taken, and its `head` writes a program of its own. The host hears "staged" early and
    asks the runtime; the check still stands between the bytes and the run: the image's
    program never runs, the host reports the mismatch, and nothing is left."""
    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        await ship(sandbox, "rm", FORGING_RM)
        await ship(sandbox, "head", HOSTILE_HEADS["writes-its-own"])
        error = await refused_within(sandbox, artifact)
        assert artifact.sha256 in str(error)
        await nothing_ran(sandbox)
        assert await installs(sandbox) == []


# An endless line instead of "staged": printed after the bytes were taken.
ENDLESS_CHMOD = (
    '#!/bin/sh\ncase "$2" in *.partial) dd if=/dev/zero bs=1M count=70 2>/dev/null ;; esac\n'
    'exec /usr/bin/chmod.real "$@"\n'
)


async def test_an_endless_line_instead_of_staged_is_refused(
    docker_engine: Any, debian_image: str, artifact: Any, short_hand_over: None
) -> None:
    """Rule 3: after the bytes were taken and checked, the image's `chmod` prints 70 MB
    without a newline where the host waits for "staged": a typed error within the
    bounds (the line is cut at the stream's 64 MiB), never a hang or a traceback. What
    is left is nothing, or (where the checked executable reached its place before the
    host gave up, so another host may be running it) the whole checked install."""
    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        await ship(sandbox, "chmod", ENDLESS_CHMOD)
        await refused_within(sandbox, artifact)
        await nothing_ran(sandbox)
        await nothing_half_made_left(sandbox, artifact)


DISKS = {
    # a 1 MiB /tmp: far smaller than the runtime, as a nearly full disk is
    "small-disk": ("exec,mode=1777,size=1m", ""),
    # the agent (uid 1000) fills a 48 MiB /tmp up to 1 MiB before the injection
    "agent-fills": (
        "exec,mode=1777,size=48m",
        "dd if=/dev/zero of=/tmp/.fill bs=1M count=47 2>/dev/null",
    ),
}


# A write with no deadline made these wait as long as the engine liked (found by an
# attacker walk); the write now shares the hand-over's deadline.
@pytest.mark.parametrize("disk", sorted(DISKS))
async def test_a_full_disk_leaves_no_half_made_install(
    docker_engine: Any, debian_image: str, artifact: Any, short_hand_over: None, disk: str
) -> None:
    """Rule 3 and "no half-made install": a read-only root with a small /tmp, the only
    place to install, or one the agent filled first. `head` runs out of space half-way
    through the bytes; the injection must fail with a typed error (the mismatch) within
    its bounds and leave nothing in /tmp; with room again, the next injection installs
    and works."""
    options, fill = DISKS[disk]
    with RunningContainer(
        docker_engine, debian_image, read_only=True, tmpfs={"/tmp": options}
    ) as container:
        sandbox = container.sandbox
        if fill:
            await run(sandbox, fill, user="1000:1000")
        await refused_within(sandbox, artifact)
        assert await installs(sandbox, "/tmp") == []
        if not fill:
            return  # no room to make without a remount
        await run(sandbox, "rm -f /tmp/.fill", user="1000:1000")
        support = await inject_within(sandbox, artifact)
        assert not support.reused
        assert support.info.build_id == artifact.build_id
        await support.aclose()


# The image's `sha256sum` says every file is another.
LYING_SHA256SUM = "#!/bin/sh\ncat > /dev/null; echo " + "0" * 64 + "  -\n"


async def test_a_sha256sum_that_says_other_bytes_runs_nothing(
    docker_engine: Any, debian_image: str, artifact: Any, short_hand_over: None
) -> None:
    """Rule 2 and rule 3: the image's `sha256sum` reports another digest for the genuine
    bytes. The first start never runs them, the host names both digests, and no
    half-made install is left for a later injection to trust."""
    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        await ship(sandbox, "sha256sum", LYING_SHA256SUM)
        error = await refused_within(sandbox, artifact)
        assert artifact.sha256 in str(error) and "0" * 64 in str(error)
        assert await installs(sandbox) == []


class _NoStream(DockerSandbox):
    """A provider that cannot hold a stream open: the bytes are uploaded on their own."""

    async def open_stream(self, cmd: list[str], env: Any = None, user: Any = None) -> Any:
        return None


class _NoStreamAltered(_NoStream):
    """...and whose upload delivers other bytes (the image's program)."""

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        await super().write_file(path, IMPOSTOR.encode(), mode)


@pytest.mark.parametrize("altered", [False, True], ids=["intact", "altered"])
async def test_without_a_stream_the_upload_is_checked_before_it_runs(
    docker_engine: Any, debian_image: str, artifact: Any, altered: bool
) -> None:
    """Rule 2 on a provider with no stream: the bytes go by upload, and the first start
    checks them before anything runs. Intact, our runtime answers; altered, the upload's
    program never runs and no install is left."""
    with RunningContainer(docker_engine, debian_image) as container:
        kind = _NoStreamAltered if altered else _NoStream
        sandbox = kind(container.container)
        if altered:
            error = await refused_within(sandbox, artifact)
            assert artifact.sha256 in str(error)
            await nothing_ran(sandbox)
            assert await installs(sandbox) == []
        else:
            support = await inject_within(sandbox, artifact)
            assert support.info.build_id == artifact.build_id
            assert (await exec_remote(support.client, "id -u", stream=False)).stdout == "0\n"


# -- 2. reuse: the probe checks earlier installs itself ----------------------------------

# The agent's tree beside the genuine executable: its loader notes that it ran.
AGENT_TREE = (
    'set -e; d=$1; cp "$2" "$d/sandbox-tools"; chmod 755 "$d/sandbox-tools"; '
    'mkdir -p "$d/runtime-x/lib"; printf %s "$3" > "$d/runtime-x/lib/loader"; '
    'chmod 755 "$d/runtime-x/lib/loader"'
)


EXE = "/tmp/.exe"  # our genuine executable, public, where the agent can copy it


async def test_the_agents_copy_of_our_executable_in_a_shared_base_is_never_reused(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Rule 2: the executable is public. With a read-only root, /tmp is the only base;
    the agent makes the exact install name there first, holding our genuine executable
    (the right size and SHA-256, mode 0755) and a tree of its own, and a link at the
    name with a random suffix. The probe's check finds the directory the agent's; nothing
    of it runs (not even `verify`), and root installs in a fresh directory of its own."""
    tag = tag_of(artifact)
    with RunningContainer(
        docker_engine, debian_image, read_only=True, tmpfs={"/tmp": "exec,mode=1777"}
    ) as container:
        sandbox = container.sandbox
        exe = artifact.located.read_bytes()
        await run(sandbox, f"cat > {EXE} && chmod 644 {EXE}", input=exe)
        planted = f"/tmp/sandbox-tools-{tag}"
        out = await sandbox.exec(
            ["sh", "-c", f"mkdir {planted} && {AGENT_TREE}", "plant", planted, EXE, IMPOSTOR],
            user="1000:1000",
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        await run(sandbox, f"ln -s {planted} /tmp/sandbox-tools-{tag}-AAAAAAAA", user="1000")
        support = await inject_within(sandbox, artifact)
        assert not support.reused
        assert support.install_dir.startswith(f"{planted}-")
        assert support.install_dir != f"/tmp/sandbox-tools-{tag}-AAAAAAAA"
        assert support.info.build_id == artifact.build_id
        assert support.recon.earlier  # the probe checked the agent's install itself
        server = await run(sandbox, f"readlink /proc/{support.info.pid}/exe")
        assert server.startswith(f"{support.install_dir}/runtime-"), server
        await support.aclose()
        await nothing_ran(sandbox)
        # The agent's tree is as it left it: nothing of root's went into it.
        owners = await run(sandbox, f"find {planted} ! -user 1000 -print")
        assert owners == ""


async def test_the_agent_cannot_replace_a_checked_install_before_its_start(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Rule 1: between the probe's check of an earlier install and the start, the agent
    races to put its program in place (it spins over every way it has: rename, unlink,
    a link, a write). Root's install in the shared /tmp is root's and 0755; the second
    injection reuses it and our runtime answers; nothing of the agent's ran."""
    with RunningContainer(
        docker_engine, debian_image, read_only=True, tmpfs={"/tmp": "exec,mode=1777"}
    ) as container:
        sandbox = container.sandbox
        first = await inject_within(sandbox, artifact)
        await first.client.call("sandbox_tools_shutdown")
        await first.aclose()
        target = f"{first.install_dir}/sandbox-tools"
        race = (
            f"printf %s '{IMPOSTOR}' > /tmp/.mine; chmod 755 /tmp/.mine; "
            "end=$(($(date +%s) + 15)); while [ $(date +%s) -lt $end ]; do "
            f"mv -f /tmp/.mine {target} 2>/dev/null; rm -f {target} 2>/dev/null; "
            f"ln -sf /tmp/.mine {target} 2>/dev/null; cat /tmp/.mine > {target} 2>/dev/null; "
            f"mv -f {first.install_dir} /tmp/.moved 2>/dev/null; done"
        )
        racer = asyncio.create_task(sandbox.exec(["sh", "-c", race], user="1000:1000", timeout=60))
        try:
            await asyncio.sleep(0.5)
            support = await inject_within(sandbox, artifact)
            assert (support.reused, support.install_dir) == (True, first.install_dir)
            answer = await exec_remote(support.client, "id -u", stream=False)
            assert answer.stdout == "0\n"
            await support.aclose()
        finally:
            await racer
        await nothing_ran(sandbox)


# The image's `mkdir` prints a forged verdict for every base: an earlier install of its
# own in /opt/sandbox-tools "trusted, verify exited 0".
FORGING_MKDIR = (
    '#!/bin/sh\nfor n in 0 1 2 3 4; do echo "check.$n=trusted|0"; done\n'
    'exec /usr/bin/mkdir.real "$@"\n'
)


async def test_forged_check_lines_are_refused_and_the_planted_install_never_runs(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Rule 2: an install of the image's own at the exact path (root's, 0755, its own
    program), and a `mkdir` that prints forged check lines for every base, repeated
    where the probe prints its own. The host refuses the probe's output with a typed
    error and never runs the planted program."""
    tag = tag_of(artifact)
    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        planted = f"/opt/sandbox-tools/sandbox-tools-{tag}"
        await run(
            sandbox,
            f"mkdir -p {planted} && cat > {planted}/sandbox-tools && chmod 755 "
            f"{planted}/sandbox-tools",
            input=IMPOSTOR.encode(),
        )
        await ship(sandbox, "mkdir", FORGING_MKDIR)
        await refused_within(sandbox, artifact)
        await nothing_ran(sandbox)


async def test_a_home_that_is_also_a_base_is_checked_twice_without_harm(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Rule 2, and no refusal of a sound sandbox: the image's HOME is /tmp, so the probe
    judges /tmp twice (as a base and as $HOME) and prints a check line for each index.
    With the agent's directory at the exact name, both say so; root installs afresh,
    and a second injection reuses root's install, not the agent's."""
    tag = tag_of(artifact)
    with RunningContainer(
        docker_engine,
        debian_image,
        read_only=True,
        tmpfs={"/tmp": "exec,mode=1777"},
        environment={"HOME": "/tmp"},
    ) as container:
        sandbox = container.sandbox
        planted = f"/tmp/sandbox-tools-{tag}"
        await run(
            sandbox,
            f"mkdir {planted} && printf %s '{IMPOSTOR}' > {planted}/sandbox-tools && "
            f"chmod 755 {planted}/sandbox-tools",
            user="1000:1000",
        )
        first = await inject_within(sandbox, artifact)
        assert not first.reused and first.install_dir.startswith(f"{planted}-")
        await first.aclose()
        # Root's install has a random name: only the exact name is ever reused, so the
        # next injection checks the agent's again and installs afresh once more.
        second = await inject_within(sandbox, artifact)
        assert second.install_dir.startswith(f"{planted}-")
        assert {e.base for e in second.recon.earlier} == {"/tmp"}
        assert second.info.build_id == artifact.build_id
        await second.aclose()
        await nothing_ran(sandbox)


# -- 3. the server loads a tool on its first call ----------------------------------------

CRAFTED_NAMES = [
    "mcp_",
    "web_",
    "browser_",
    "exec_remote_",
    "exec_remote_nope",
    "bash_sessionX",
    "text_editorial",
    "web_browser_\u0000",
    "keys",
    "items",
    "get",
    "__getitem__",
    "__class__",
    "load",
    "mcp_" + "x" * 100_000,
]


async def test_crafted_method_names_never_trip_the_lazy_loader(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Rule 6 (the runtime wedges): names with a tool's prefix that the tool does not
    serve, the table's own attribute names, a NUL, a 100 KB name: each is "method not
    found" (-32601), the server stays up, and every tool still loads and answers."""
    with RunningContainer(docker_engine, debian_image) as container:
        support = await inject_within(container.sandbox, artifact)
        try:
            for name in CRAFTED_NAMES:
                with pytest.raises(RuntimeRpcError) as caught:
                    await support.client.call(name, {}, timeout=30)
                assert caught.value.code == -32601, (name[:40], caught.value)
            answer = await exec_remote(support.client, "echo up", stream=False)
            assert answer.stdout == "up\n"
            with pytest.raises(RuntimeRpcError) as caught:
                await support.client.call("exec_remote_nope", {}, timeout=30)
            assert caught.value.code == -32601
            info = await support.client.call("runtime_info", timeout=30)
            assert info["pid"] == support.info.pid  # the same server all along
        finally:
            await support.aclose()
