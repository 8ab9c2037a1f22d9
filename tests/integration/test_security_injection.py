"""Adversarial tests: the agent (uid 1000) and the image against a root injector.

Each test names the rule of ../shared/design/THREAT_MODEL.md it defends and checks the
outcome, not the mechanism: root ran nothing of the agent's, no file of the agent's
choosing changed, the host stayed within a stated memory bound, every call returned
within its timeout with a typed error.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sandbox_tools.errors import SandboxInjectionError
from sandbox_tools.injector.exec_remote import ExecRemoteOptions, exec_remote
from sandbox_tools.injector.inject import Injector, reconnoitre
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.injector.tool_clients import text_editor
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.docker import DockerSandbox
from tests.support import peak_rss_mib

pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.security, pytest.mark.timeout(900)]

# What a host may grow by while a sandbox floods it (the caps are 64 KiB for the probe,
# 64 MiB for any exec): stated here, measured in the closing note.
HOST_RSS_BOUND_MIB = 150
PWNED = "/tmp/.pwned-by-agent"  # the agent's programs write here when root runs them

# No single quotes: it travels inside a single-quoted shell word.
AGENT_EXE = (
    f"#!/bin/sh\nid -u >> {PWNED}\n"
    'echo "{\\"jsonrpc\\":\\"2.0\\",\\"id\\":1,\\"result\\":{\\"build_id\\":\\"forged\\"}}"\n'
)


def tag_of(artifact: Any) -> str:
    return str(artifact.build_id).removeprefix("sha256:")[:16]


async def as_agent(sandbox: DockerSandbox, script: str) -> str:
    out = await sandbox.exec(["sh", "-c", script], user="1000:1000", timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.decode()


async def as_root(sandbox: DockerSandbox, script: str) -> str:
    out = await sandbox.exec(["sh", "-c", script], timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.decode()


def forged_install(directory: str, artifact: Any) -> str:
    """The review's attack: a look-alike install whose marker carries extra lines."""
    marker = (
        f"{artifact.build_id} {artifact.sha256}\\n"
        f"install={directory}|0|755|{artifact.build_id} {artifact.sha256}|{artifact.sha256}\\n"
        "uid=1000"
    )
    return (
        f"mkdir -p {directory} && printf '%s' '{AGENT_EXE}' > {directory}/sandbox-tools && "
        f"chmod 755 {directory}/sandbox-tools && printf '{marker}' > {directory}/.installed"
    )


async def assert_root_ran_nothing_of_the_agents(sandbox: DockerSandbox) -> None:
    ran = await as_root(sandbox, f"cat {PWNED} 2>/dev/null || true")
    assert ran == "", f"agent code ran as uid {ran!r}"


async def test_forged_markers_before_a_genuine_install_are_not_reused(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Rule 2 (the host is misled) and rule 1: a forged install in the shared /tmp, with
    newline-injected probe lines, is never run by root; root installs its own."""
    tag = tag_of(artifact)
    # Read-only root with an exec /tmp: /tmp is the only place root can install, so the
    # planted directory sits exactly where a genuine install would go.
    with RunningContainer(
        docker_engine, debian_image, read_only=True, tmpfs={"/tmp": "exec,mode=1777"}
    ) as container:
        sandbox = container.sandbox
        await as_agent(sandbox, forged_install(f"/tmp/sandbox-tools-{tag}", artifact))
        await as_agent(sandbox, forged_install(f"/tmp/sandbox-tools-{tag}-x", artifact))
        async with Injector(InjectionOptions(artifact=artifact)) as injector:
            support = await injector.tool_support(sandbox)
            assert not support.reused
            assert support.install_dir.startswith(f"/tmp/sandbox-tools-{tag}-")
            assert support.info.build_id == artifact.build_id
            assert support.recon.uid == 0  # the forged uid=1000 line changed nothing
            result = await exec_remote(support.client, "id -u", stream=False)
            assert result.stdout == "0\n"
        await assert_root_ran_nothing_of_the_agents(sandbox)

        # A new host process: root's install got a random name (the agent holds the exact
        # one), and only exact names are ever reused, so root installs afresh; the
        # agent's directory is still never run.
        async with Injector(InjectionOptions(artifact=artifact)) as injector:
            again = await injector.tool_support(sandbox)
            assert again.info.build_id == artifact.build_id
        await assert_root_ran_nothing_of_the_agents(sandbox)


@pytest.mark.parametrize("persistent", [True, False], ids=["stdio", "exec"])
async def test_bytes_that_fail_the_check_never_run(
    docker_engine: Any, debian_image: str, artifact: Any, tmp_path: Any, persistent: bool
) -> None:
    """Rules 1 and 2: the staged file's SHA-256 is checked by the fixed command its first
    start goes through, before anything of it runs. Bytes that differ from the pin (here
    a script that records being run) never run, on either transport: the injection fails
    with the mismatch named, and the directory it made is removed."""
    import dataclasses

    other = tmp_path / "other-bytes"
    other.write_text(f"#!/bin/sh\nid -u >> {PWNED}\n")
    altered = dataclasses.replace(artifact, path=other)  # the pin stays the genuine one
    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        options = InjectionOptions(artifact=altered, persistent=persistent)
        async with Injector(options) as injector:
            with pytest.raises(SandboxInjectionError) as failure:
                await injector.tool_support(sandbox)
        assert "does not match" in str(failure.value), failure.value
        assert f"expected sha256 {artifact.sha256}" in str(failure.value)
        await assert_root_ran_nothing_of_the_agents(sandbox)
        left = await as_root(sandbox, "ls -A /opt/sandbox-tools")
        assert "sandbox-tools-" not in left, left


async def test_after_a_genuine_install_the_agent_cannot_take_its_place(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Rules 1 and 2: once root installed at the exact name, the agent can neither write
    into it nor plant a forged install that root would prefer; reuse checks the digest."""
    tag = tag_of(artifact)
    with RunningContainer(
        docker_engine, debian_image, read_only=True, tmpfs={"/tmp": "exec,mode=1777"}
    ) as container:
        sandbox = container.sandbox
        async with Injector(InjectionOptions(artifact=artifact)) as injector:
            first = await injector.tool_support(sandbox)
            assert first.install_dir == f"/tmp/sandbox-tools-{tag}"
        # The agent tries to replace the executable, rename the directory, and plant
        # forged installs with newline-carrying markers everywhere it can write.
        attempts = await sandbox.exec(
            [
                "sh",
                "-c",
                f"cp /bin/true {first.exe} 2>/dev/null && echo replaced; "
                f"mv {first.install_dir} /tmp/moved 2>/dev/null && echo moved; "
                f"printf x > {first.install_dir}/.new 2>/dev/null && echo wrote; "
                + forged_install(f"/var/tmp/sandbox-tools-{tag}", artifact)
                + " && "
                + forged_install(f"/dev/shm/sandbox-tools-{tag}", artifact),
            ],
            user="1000:1000",
        )
        assert attempts.stdout == b"", attempts.stdout
        async with Injector(InjectionOptions(artifact=artifact)) as injector:
            second = await injector.tool_support(sandbox)
            assert (second.reused, second.install_dir) == (True, first.install_dir)
            assert second.info.build_id == artifact.build_id
        await assert_root_ran_nothing_of_the_agents(sandbox)

        # Root's own install, tampered with (as root could): the digest check refuses it.
        await as_root(
            sandbox,
            f"printf 'x' >> {first.exe}; truncate -s -1 {first.exe}; "
            f"printf 'X' | dd of={first.exe} bs=1 seek=100 conv=notrunc 2>/dev/null",
        )
        async with Injector(InjectionOptions(artifact=artifact)) as injector:
            third = await injector.tool_support(sandbox)
            assert not third.reused and third.install_dir != first.install_dir


PLANTED_RAN = "/tmp/.planted-tree-ran"  # the image's loader writes here when it runs

# Everything under a directory, with owner, mode, size, link target and content: what
# "nothing of it was changed" is compared on.
SNAPSHOT = (
    'cd "$1" && find . -printf "%y %m %u %s %l %p\\n" | sort && '
    "find . -type f -exec sha256sum {} + | sort"
)


# The image's loader: notes that it ran, then runs the real one (moved beside it).
PLANTED_LOADER = f'#!/bin/sh\necho "$*" >> {PLANTED_RAN}\nexec "$0.real" "$@"\n'


@contextlib.asynccontextmanager
async def image_with_our_install(
    engine: Any, base: str, artifact: Any, *, plant: bool
) -> AsyncIterator[tuple[str, str]]:
    """An image, committed offline from a container we injected into, that ships our
    install at the exact path the injector reuses: the genuine executable and the tree
    its first run unpacked, untouched, or (`plant`) with the bundled loader swapped for
    PLANTED_LOADER. Yields (image, install directory)."""
    with RunningContainer(engine, base) as container:
        sandbox = container.sandbox
        async with Injector(InjectionOptions(artifact=artifact)) as injector:
            support = await injector.tool_support(sandbox)
            await support.client.call("sandbox_tools_shutdown")
            install_dir = support.install_dir
        await as_root(sandbox, f"rm -rf {install_dir}/run")  # as a saved image has none
        if plant:
            swap = 'l=$(echo "$1"/runtime-*/lib/ld-linux-*) && mv "$l" "$l.real" && cat > "$l"'
            out = await sandbox.exec(
                ["sh", "-c", swap + ' && chmod 755 "$l"', "plant", install_dir],
                input=PLANTED_LOADER.encode(),
            )
            assert out.returncode == 0, out.stderr
        image = container.container.commit(repository="sandbox-tools-test/reused-install")
    try:
        yield str(image.id), install_dir
    finally:
        engine.images.remove(image.id, force=True)


async def test_an_image_that_ships_our_executable_beside_its_own_tree_gets_a_fresh_install(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Rule 2 (the host is misled): a reused install is accepted only when the agent could
    not have written it, and the image is untrusted too. The image ships the exact install
    directory with the genuine executable (public: root's, 0755, the right SHA-256) and
    an unpacked tree whose loader is its own script. The host does not reuse it: the
    launcher compares the tree with its payload first. The runtime that answers is
    installed afresh beside it; nothing of the planted tree ran, and nothing in it was
    run, chmodded or changed."""
    async with image_with_our_install(docker_engine, debian_image, artifact, plant=True) as (
        image,
        planted,
    ):
        with RunningContainer(docker_engine, image) as container:
            sandbox = container.sandbox
            before = await as_root(sandbox, f"set -- {planted}; {SNAPSHOT}")
            assert ".real" in before  # the planted tree is there
            async with Injector(InjectionOptions(artifact=artifact)) as injector:
                support = await injector.tool_support(sandbox)
                assert not support.reused
                assert support.install_dir.startswith(f"{planted}-")
                assert support.info.build_id == artifact.build_id
                result = await exec_remote(support.client, "id -u", stream=False)
                assert result.stdout == "0\n"
                # The server that answers runs the fresh install's own loader.
                server = await as_root(sandbox, f"readlink /proc/{support.info.pid}/exe")
                assert server.startswith(f"{support.install_dir}/runtime-"), server
            assert await as_root(sandbox, f"cat {PLANTED_RAN} 2>/dev/null || true") == ""
            assert await as_root(sandbox, f"set -- {planted}; {SNAPSHOT}") == before


async def test_an_image_that_ships_our_untouched_install_is_reused(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Rule 2, the other side: an install we made, its tree untouched, passes the tree
    check and is reused (an image saved from an injected container, say), and it is
    our runtime that answers."""
    async with image_with_our_install(docker_engine, debian_image, artifact, plant=False) as (
        image,
        install_dir,
    ):
        with RunningContainer(docker_engine, image) as container:
            async with Injector(InjectionOptions(artifact=artifact)) as injector:
                support = await injector.tool_support(container.sandbox)
                assert (support.reused, support.install_dir) == (True, install_dir)
                assert support.info.build_id == artifact.build_id
                result = await exec_remote(support.client, "echo reused", stream=False)
                assert result.stdout == "reused\n"


async def test_planted_symlinks_fifos_and_a_huge_marker_change_nothing(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Rule: scratch space is private; rule 3: bounded reads. Symlinks at every
    predictable probe name, FIFOs where we used to read, and a 400 MB marker: no file of
    the agent's choosing changes, the injection neither hangs nor grows the host."""
    tag = tag_of(artifact)
    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        await as_root(sandbox, "chmod 1777 /opt && cp /etc/issue /etc/issue.orig")
        plant = (
            "for d in /tmp /var/tmp /dev/shm; do "
            "  i=1; while [ $i -le 3000 ]; do "
            "    ln -s /etc/issue $d/.sandbox-tools-probe-$i; i=$((i + 1)); done; "
            f"  mkfifo $d/sandbox-tools-{tag}; "
            f"  mkdir -p $d/sandbox-tools-{tag}-big && "
            f"  truncate -s 400M $d/sandbox-tools-{tag}-big/.installed && "
            f"  mkfifo $d/sandbox-tools-{tag}-big/sandbox-tools; "
            "done; "
            # /opt itself writable by the agent (sticky): /opt/sandbox-tools is not trusted
            "mkdir /opt/sandbox-tools && mkfifo /opt/sandbox-tools/sandbox-tools-"
            f"{tag}; mkfifo /tmp/sandbox-tools-0"
        )
        await as_agent(sandbox, plant)
        before = peak_rss_mib()
        started = time.monotonic()
        async with Injector(InjectionOptions(artifact=artifact)) as injector:
            support = await injector.tool_support(sandbox)
            elapsed = time.monotonic() - started
            print(f"injection through planted FIFOs/symlinks/400 MB marker: {elapsed:.2f} s")
            assert support.info.build_id == artifact.build_id
            # /opt is agent-writable here, so root uses its home, never /opt or /tmp.
            assert support.install_dir.startswith("/root/sandbox-tools-")
            opt = next(c for c in support.recon.candidates if c.path == "/opt/sandbox-tools")
            assert not opt.usable
        assert elapsed < 30
        assert peak_rss_mib() - before < HOST_RSS_BOUND_MIB
        assert await as_root(sandbox, "cmp /etc/issue /etc/issue.orig && echo same") == "same\n"
        await assert_root_ran_nothing_of_the_agents(sandbox)


async def test_a_shell_that_floods_is_cut_off_and_the_host_stays_small(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Rule 3, a malicious image: its sh prints forever. The probe is cut at its byte cap
    with a typed error; so is any other exec; the host's memory stays bounded."""
    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        await as_root(
            sandbox,
            "printf '#!/bin/dash\\nexec yes flood\\n' > /usr/bin/sh.x && "
            "chmod 755 /usr/bin/sh.x && mv /usr/bin/sh.x /usr/bin/sh",
        )
        before = peak_rss_mib()
        started = time.monotonic()
        with pytest.raises(SandboxInjectionError, match="printed more than"):
            async with Injector(InjectionOptions(artifact=artifact)) as injector:
                await injector.tool_support(sandbox)
        probe_seconds = time.monotonic() - started
        # Any exec, e.g. a tool call that floods: cut at the default 64 MiB cap.
        from sandbox_tools.errors import SandboxOutputLimitError

        with pytest.raises(SandboxOutputLimitError):
            await sandbox.exec(["/usr/bin/yes", "x" * 1000])
        grown = peak_rss_mib() - before
        print(f"flooding shell: probe refused in {probe_seconds:.2f} s; host grew {grown:.0f} MiB")
        assert grown < HOST_RSS_BOUND_MIB


async def test_a_shell_that_never_exits_fails_the_probe_within_its_timeout(
    docker_engine: Any, debian_image: str
) -> None:
    """Rule 3, a malicious image: its sh never exits; the probe ends at its timeout."""
    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        await as_root(
            sandbox,
            "printf '#!/bin/dash\\nexec sleep infinity\\n' > /usr/bin/sh.x "
            "&& chmod 755 /usr/bin/sh.x && mv /usr/bin/sh.x /usr/bin/sh",
        )
        started = time.monotonic()
        with pytest.raises(SandboxInjectionError, match="did not finish within 3 s"):
            await reconnoitre(sandbox, timeout=3)
        assert time.monotonic() - started < 10


async def test_exec_remote_timeout_holds_when_the_server_is_stopped(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Rule 3: SIGSTOP of the runtime server during exec_remote(timeout=...): the call
    returns with TimeoutError within its deadline plus the bounded kill, on both
    transports; the caller's own wait_for is never needed."""
    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        for persistent in (True, False):
            async with Injector(
                InjectionOptions(artifact=artifact, persistent=persistent)
            ) as injector:
                support = await injector.tool_support(sandbox)
                process = await exec_remote(
                    support.client, "sleep 300", ExecRemoteOptions(timeout=3)
                )
                pid = support.info.pid
                await as_root(sandbox, f"kill -STOP {pid}")
                started = time.monotonic()
                try:
                    with pytest.raises(TimeoutError):
                        await asyncio.wait_for(process.wait(), 60)
                finally:
                    await as_root(sandbox, f"kill -CONT {pid}")
                elapsed = time.monotonic() - started
                print(f"stopped server, persistent={persistent}: TimeoutError in {elapsed:.1f} s")
                assert elapsed < 3 + 1 + 5 + 3


async def test_user_injection_for_another_user(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Rule: drop privileges first. A runtime for uid 1000 next to root's: root installs
    and unpacks; uid 1000 gets its own server directory; its tools run as uid 1000."""
    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        async with Injector(InjectionOptions(artifact=artifact)) as injector:
            agent = await injector.tool_support(sandbox, user="1000:1000")
            root = await injector.tool_support(sandbox)
            assert agent.install_dir == root.install_dir
            assert agent.env["SANDBOX_TOOLS_DIR"].endswith("/run-1000")
            result = await exec_remote(agent.client, "id -u; cat /root/.bashrc", stream=False)
            assert result.stdout == "1000\n" and "Permission denied" in result.stderr
            created = await text_editor(agent.client, "create", "/tmp/by-agent", file_text="x\n")
            assert "created" in created.lower() or "/tmp/by-agent" in created
            owner = await as_root(sandbox, "stat -c %u /tmp/by-agent")
            assert owner == "1000\n"
            assert (await exec_remote(root.client, "id -u", stream=False)).stdout == "0\n"


async def test_user_injection_refused_when_the_installer_is_not_root(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Rule 1: a runtime for root would run files an unprivileged installer owns."""

    class AsAgent(DockerSandbox):
        async def exec(self, cmd: list[str], *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("user") is None:
                kwargs["user"] = "1000:1000"
            return await super().exec(cmd, *args, **kwargs)

    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = AsAgent(container.container, docker_engine)
        async with Injector(InjectionOptions(artifact=artifact, persistent=False)) as injector:
            with pytest.raises(SandboxInjectionError, match=r"installed .* by uid 1000"):
                await injector.tool_support(sandbox, user="0")


async def test_a_recreated_container_gets_a_fresh_handle(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Handles are keyed by identity, not by name: a container recreated under the same
    name never gets the dead handle of the old one."""
    name = "sandbox-tools-recreated"
    async with Injector(InjectionOptions(artifact=artifact)) as injector:
        with RunningContainer(docker_engine, debian_image, name=name) as container:
            first = await injector.tool_support(DockerSandbox(container.container, docker_engine))
        with RunningContainer(docker_engine, debian_image, name=name) as container:
            sandbox = container.sandbox
            second = await injector.tool_support(sandbox)
            assert second is not first
            assert (await exec_remote(second.client, "echo alive", stream=False)).stdout == (
                "alive\n"
            )


async def test_an_endless_line_on_the_persistent_stream_is_refused(
    docker_engine: Any, debian_image: str
) -> None:
    """Rule 3: stream lines are capped (64 MiB + slack) and scanned once; a channel that
    sends 70 MB without a newline fails with a typed error, and the host stays bounded."""
    from sandbox_tools.sandboxes.base import StreamLineTooLong

    with RunningContainer(docker_engine, debian_image) as container:
        sandbox = container.sandbox
        stream = await sandbox.open_stream(
            ["sh", "-c", "head -c 70000000 /dev/zero; sleep 60"], env=None
        )
        before = peak_rss_mib()
        started = time.monotonic()
        with pytest.raises(StreamLineTooLong):
            await stream.readline()
        grown = peak_rss_mib() - before
        print(f"endless line refused in {time.monotonic() - started:.2f} s; grew {grown:.0f} MiB")
        assert grown < HOST_RSS_BOUND_MIB
        await stream.close()


PRELOAD_MARKER = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
/* Loaded into a process: leave /tmp/preloaded-<pid> naming its executable. */
__attribute__((constructor)) static void mark(void) {
    char exe[512], path[64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n < 0) return;
    exe[n] = 0;
    snprintf(path, sizeof path, "/tmp/preloaded-%d", (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) { write(fd, exe, strlen(exe)); close(fd); }
}
"""


# How an image may get a library of its own loaded into a process (each is the image's
# right for its own programs, never for the runtime):
LOADINGS = {
    "environment": "LD_PRELOAD in the image's ENV",
    "preload-list": "/etc/ld.so.preload",
    "nss": "an NSS module /etc/nsswitch.conf names, loaded by a user look-up",
    "locale": "a gconv module for the charset of the image's locale (LANG, LOCPATH, GCONV_PATH)",
}
EVIL_GCONV = "module  ISO-8859-15//  INTERNAL  mark  1\nmodule  INTERNAL  ISO-8859-15//  mark  1\n"


@pytest.mark.parametrize("how", sorted(LOADINGS))
async def test_an_images_ld_preload_never_loads_into_the_runtime(
    docker_engine: Any, python_image: str, tmp_path: Any, how: str
) -> None:
    """Rule 2 (the host talks only to what it injected): an engine's exec passes the
    image's ENV, and the bundled loader obeyed its LD_PRELOAD, loading the image's code
    into the (root) runtime. The launcher keeps the loader's variables from the runtime
    and gives them back to the commands it starts, as the image meant them. The image's
    /etc/ld.so.preload, which every glibc loader reads and nothing turns off, loaded
    into the root runtime too: the bundled loader reads a path that cannot exist. So did
    an NSS module (the C library's user look-ups load what nsswitch.conf names: the
    runtime reads /etc/passwd and /etc/group as data) and a gconv module for a locale's
    charset (the runtime runs in the C locale; its commands get the image's back)."""
    import shutil
    import subprocess

    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build the preloaded library (scripts/setup.sh installs it)")
    source = tmp_path / "mark.c"
    source.write_text(PRELOAD_MARKER)
    compile_it = ["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "mark.so"), str(source)]
    await asyncio.to_thread(subprocess.run, compile_it, check=True)
    environment: dict[str, str] = {}
    if how == "environment":
        environment = {"LD_PRELOAD": "/opt/mark/mark.so"}
    elif how == "locale":
        if shutil.which("localedef") is None:
            pytest.skip("no localedef to make the image's locale")
        (tmp_path / "loc").mkdir()
        (tmp_path / "gc").mkdir()
        locale = ["localedef", "-i", "POSIX", "-f", "ISO-8859-15"]
        made = await asyncio.to_thread(
            subprocess.run, [*locale, str(tmp_path / "loc" / "xx_YY.ISO-8859-15")], check=False
        )
        assert made.returncode in (0, 1), made  # 1: warnings only
        shutil.copy(tmp_path / "mark.so", tmp_path / "gc" / "mark.so")
        (tmp_path / "gc" / "gconv-modules").write_text(EVIL_GCONV)
        environment = {
            "LANG": "xx_YY.ISO-8859-15",
            "LOCPATH": "/opt/mark/loc",
            "GCONV_PATH": "/opt/mark/gc",
        }
    with RunningContainer(
        docker_engine,
        python_image,
        network_mode="none",
        volumes={str(tmp_path): {"bind": "/opt/mark", "mode": "ro"}},
        environment=environment,
    ) as container:
        sandbox = container.sandbox
        if how == "preload-list":
            listed = await sandbox.exec(["sh", "-c", "echo /opt/mark/mark.so > /etc/ld.so.preload"])
            assert listed.returncode == 0, listed.stderr
        if how == "nss":
            planted = await sandbox.exec(
                [
                    "sh",
                    "-c",
                    'dir=$(dirname "$(ls /lib/*/libnss_files.so.2 /usr/lib/*/libnss_files.so.2 '
                    '2>/dev/null | head -n1)") && cp /opt/mark/mark.so "$dir/libnss_mark.so.2" '
                    '&& sed -i "s/^passwd:.*/passwd: files mark/;s/^group:.*/group: files mark/" '
                    "/etc/nsswitch.conf && /usr/bin/id 4242 || true",
                ]
            )
            assert planted.returncode == 0, planted.stderr
        async with Injector() as injector:
            support = await injector.tool_support(sandbox)
            await text_editor(support.client, "create", "/tmp/x.txt", file_text="x")
            options = ExecRemoteOptions(
                user={"uid": 4242, "gid": 4242, "groups": [4242], "home": None}
                if how == "nss"
                else None
            )
            if how != "locale":  # the image's locale breaks its own shell (a fake module)
                done = await exec_remote(
                    support.client, ["/usr/bin/env", "true"], options, stream=False
                )
                assert done.returncode == 0, done
        listing = await sandbox.exec(
            ["sh", "-c", 'for f in /tmp/preloaded-*; do cat "$f"; echo; done']
        )
    loaded_into = set(listing.stdout.decode().split())
    if how != "locale":  # `true` converts no text: no charset module
        assert "/usr/bin/true" in loaded_into or "/usr/bin/id" in loaded_into, sorted(loaded_into)
    assert not [exe for exe in loaded_into if "/runtime-" in exe], (LOADINGS[how], loaded_into)
