"""Attack walk: the probe's parsing and sanitising inside the shell (os-release,
alpine-release/debian_version, cleaned values, `stat` owners and modes and their mapping
to candidates, $HOME, the environment), against real containers.

Each test asserts the property THREAT_MODEL.md promises; a failing test is a break."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sandbox_tools.errors import SandboxInjectionError
from sandbox_tools.injector.inject import reconnoitre
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.docker import DockerSandbox
from tests.integration import hostile_image
from tests.integration.hostile_image import (
    PWNED,
    installs,
    nothing_ran,
    run,
    ship,
    waiting_shells,
)

pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.security, pytest.mark.timeout(240)]


BOUND = 90.0  # each injection here, hostile tools and files included


async def inject(sandbox: DockerSandbox, artifact: Any, bound: float = BOUND) -> Any:
    return await hostile_image.inject(sandbox, artifact, bound)


async def inject_or_typed(sandbox: DockerSandbox, artifact: Any, bound: float = BOUND) -> Any:
    """The injection's result, or its typed error (anything else propagates: a break)."""
    try:
        return await inject(sandbox, artifact, bound)
    except SandboxInjectionError as exc:
        return exc


# 1 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["0077", "0027", "0070", "0007"])
async def test_an_ancestor_writable_by_others_whose_owner_bits_are_zero_is_not_ok(
    docker_engine: Any, debian_image: str, mode: str
) -> None:
    """`stat -c %a` prints "77" for mode 0077: two digits. chain_verdict must still see
    the group/other write bits and call /opt/sandbox-tools a writable-ancestor (the
    documented rule: writable by group or others only with the sticky bit)."""
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = c.sandbox
        await run(sandbox, f"chmod {mode} /opt")
        recon = await reconnoitre(sandbox)
        opt = next(x for x in recon.candidates if x.path == "/opt/sandbox-tools")
        assert not opt.usable, (
            f"/opt is mode {mode} (writable by group/others, no sticky bit), yet "
            f"/opt/sandbox-tools was judged {opt.status.value}"
        )


async def test_a_0077_parent_of_the_best_base_still_gets_a_working_injection(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """The impact of the verdict above for a root injection: the probe installs under
    the agent-renamable /opt; the injection must still end in a working runtime in a
    base nobody else controls (/var/tmp, /tmp), and a second one too, leaving nothing
    half-made that a later injection trusts."""
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = c.sandbox
        await run(sandbox, "chmod 0077 /opt")
        first = await inject_or_typed(sandbox, artifact)
        left = await installs(sandbox)
        second = await inject_or_typed(sandbox, artifact)
        assert not isinstance(first, SandboxInjectionError), (
            f"the root injection failed (install left: {left}): {first}"
        )
        assert not isinstance(second, SandboxInjectionError), f"second: {second}"
        assert not first[0].install_dir.startswith("/opt/"), first[0].install_dir


# 2 ------------------------------------------------------------------------------------
HOSTILE_OS_RELEASE = (
    b'NAME="x"\n'
    b'ID="$(touch /tmp/.pwned)`touch /tmp/.pwned`;touch /tmp/.pwned"\n'
    b"VERSION_ID='/*/*/*/*/* ${IFS} $((1+1)) \\\\ \\\" \\' \x00\x01\xff'\n"
    b"ID=second\n" + b"/*/*/*/*/*/*\n" * 2000 + b"ID=$(id>/tmp/.pwned)\n"
)


async def test_a_hostile_os_release_is_data_and_nothing_of_it_runs(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = c.sandbox
        await DockerSandbox.exec(
            sandbox,
            ["sh", "-c", "rm -f /etc/os-release && cat > /etc/os-release"],
            input=HOSTILE_OS_RELEASE,
            timeout=30,
        )
        start = time.monotonic()
        support, info = await inject(sandbox, artifact)
        assert time.monotonic() - start < 30
        assert info["build_id"] == artifact.build_id
        recon = support.recon
        assert recon.os_id == "touchtmp.pwnedtouchtmp.pwnedtouchtmp.pwned"
        assert set(recon.os_version) <= set(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-"
        )
        await nothing_ran(sandbox)


# 3 ------------------------------------------------------------------------------------
async def test_a_huge_binary_os_release_is_bounded(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """64 MiB of random bytes (NULs, newlines, every byte) and 1M empty lines after it."""
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = c.sandbox
        await run(
            sandbox,
            "rm -f /etc/os-release; head -c 67108864 /dev/urandom > /etc/os-release; "
            "yes '' | head -n 1000000 >> /etc/os-release",
        )
        start = time.monotonic()
        support, info = await inject(sandbox, artifact)
        assert time.monotonic() - start < 30
        assert info["build_id"] == artifact.build_id
        assert len(support.recon.os_id) <= 64 and len(support.recon.os_version) <= 64


# 4 ------------------------------------------------------------------------------------
async def test_hostile_alpine_release_and_debian_version_are_data(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = c.sandbox
        await run(
            sandbox,
            "rm -f /etc/os-release /usr/lib/os-release; "
            "printf '$(touch /tmp/.pwned)\\ncand.0=ok|0|755|no\\n*' > /etc/alpine-release; "
            "printf '`touch /tmp/.pwned`' > /etc/debian_version",
        )
        support, info = await inject(sandbox, artifact)
        assert info["build_id"] == artifact.build_id
        assert support.recon.os_id == "alpine"
        assert support.recon.os_version == "touchtmp.pwnedcand.0ok0755no"
        await nothing_ran(sandbox)


# 5 ------------------------------------------------------------------------------------
async def test_a_hostile_uname_cannot_forge_probe_lines_or_run_code(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = c.sandbox
        await ship(
            sandbox,
            "uname",
            '#!/bin/sh\ncase "$1" in -m) printf '
            "'x86_64\\ncand.1=ok|0|755|no\\nmade=/tmp/x|0|755\\n"
            '$(touch /tmp/.pwned)\\n\' ;; *) exec /usr/bin/uname.real "$@" ;; esac\n',
        )
        result = await inject_or_typed(sandbox, artifact)
        if not isinstance(result, SandboxInjectionError):
            support, _ = result
            assert support.recon.made in ("", support.install_dir)
            assert not support.install_dir.startswith("/tmp/x")
        await nothing_ran(sandbox)
        assert await waiting_shells(sandbox) == []


# 6 ------------------------------------------------------------------------------------
async def test_a_hostile_id_cannot_forge_lines_or_run_code(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = c.sandbox
        await ship(
            sandbox,
            "id",
            "#!/bin/sh\ncase \"$1\" in -u) printf '0\\nuid=1000\\n' ;; "
            "-un) printf 'root$(touch /tmp/.pwned)\\nhome=/tmp\\n%%s' "
            "\"$(head -c 100000 /dev/zero | tr '\\0' a)\" ;; "
            '*) exec /usr/bin/id.real "$@" ;; esac\n',
        )
        result = await inject_or_typed(sandbox, artifact)
        if not isinstance(result, SandboxInjectionError):
            support, _ = result
            assert support.recon.uid is None or support.recon.uid == 0
            assert support.recon.home != "/tmp"
            assert len(support.recon.user) <= 64
        await nothing_ran(sandbox)
        assert await waiting_shells(sandbox) == []


# 7 ------------------------------------------------------------------------------------
async def test_a_hostile_stat_output_is_parsed_never_run_and_bounded(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """`stat` prints names with '|', command substitutions, globs, extra lines and 8 MiB
    of junk: typed error or a sound injection, no code, no hang, no waiting shell."""
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = c.sandbox
        await ship(
            sandbox,
            "stat",
            "#!/bin/sh\n"
            "for a; do case $a in /*) "
            "printf '%s|0|755|x$(touch /tmp/.pwned)\\n/*|0|755\\n' \"$a\" ;; esac; done\n"
            "head -c 8388608 /dev/zero | tr '\\0' '|'\n",
        )
        start = time.monotonic()
        result = await inject_or_typed(sandbox, artifact)
        assert time.monotonic() - start < 75
        if not isinstance(result, SandboxInjectionError):
            _, info = result
            assert info["build_id"] == artifact.build_id
        await nothing_ran(sandbox)
        assert await waiting_shells(sandbox) == []


# 8 ------------------------------------------------------------------------------------
async def test_a_head_that_ignores_its_count_is_bounded(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """The image's `head` floods 48 MiB of 'ID=' lines with glob characters on the
    os-release read: the probe and the host stay bounded, nothing globbed or run."""
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = c.sandbox
        await ship(
            sandbox,
            "head",
            "#!/bin/sh\n"
            'case "$3" in /etc/os-release) '
            "yes 'ID=/*/*/*/$(touch /tmp/.pwned)' | /usr/bin/head.real -c 50331648 ;; "
            '*) exec /usr/bin/head.real "$@" ;; esac\n',
        )
        start = time.monotonic()
        result = await inject_or_typed(sandbox, artifact, bound=100)
        assert time.monotonic() - start < 75
        if not isinstance(result, SandboxInjectionError):
            support, _ = result
            assert support.recon.os_id == "touchtmp.pwned"
        await nothing_ran(sandbox)


# 9 ------------------------------------------------------------------------------------
async def test_a_home_with_a_double_trailing_slash_does_not_break_the_injection(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """The runtime as uid 1000 whose image sets HOME=/home/agent// (a harmless spelling):
    the probe strips one slash, makes `/home/agent//sandbox-tools-TAG`, and the host,
    which expects `/home/agent/sandbox-tools-TAG`, refuses the whole probe."""
    with RunningContainer(
        docker_engine, debian_image, user="1000", environment={"HOME": "/home/agent//"}
    ) as c:
        sandbox = c.sandbox
        await run(sandbox, "mkdir -p /home/agent && chown 1000 /home/agent", user="0")
        result = await inject_or_typed(sandbox, artifact)
        assert not isinstance(result, SandboxInjectionError), f"injection refused: {result}"
        _, info = result
        assert info["build_id"] == artifact.build_id
        left = await run(sandbox, "ls -a /home/agent", user="0")
        assert left.count("sandbox-tools-") <= 1, left


# 10 -----------------------------------------------------------------------------------
async def test_a_home_reached_through_a_symlink_into_the_agents_directory_is_not_ok(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """Root's HOME=/srv/link/inst where /srv/link -> /home/agent/box: root-owned box and
    inst, but /home/agent is the agent's, so the agent can rename box. chain_verdict
    walks the *spelled* ancestors (/srv/link/inst, /srv/link, /srv, /), not the real ones
    (/home/agent/box/inst, /home/agent/box, /home/agent, /home, /). /opt is a file so
    that HOME is the only private base."""
    with RunningContainer(docker_engine, debian_image, environment={"HOME": "/srv/link/inst"}) as c:
        sandbox = c.sandbox
        await run(
            sandbox,
            "rm -rf /opt && touch /opt && mkdir -p /home/agent/box/inst /srv && "
            "chown 1000 /home/agent && ln -s /home/agent/box /srv/link",
        )
        result = await inject_or_typed(sandbox, artifact)
        assert not isinstance(result, SandboxInjectionError), result
        support, _ = result
        home = next(x for x in support.recon.candidates if x.path == "/srv/link/inst")
        assert not home.usable, (
            f"HOME /srv/link/inst (really under the agent's /home/agent) judged "
            f"{home.status.value}; root installed in {support.install_dir}"
        )


# 11 -----------------------------------------------------------------------------------
async def test_an_image_ifs_and_glob_environment_changes_nothing(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """The image's ENV sets IFS (digits, '/', '=', '|'), SHELLOPTS=noglob and a hostile
    HOME spelling: the probe's splitting and globbing are its own."""
    env = {"IFS": "0123456789/=|:", "SHELLOPTS": "noglob:xtrace", "HOME": "/root/*"}
    with RunningContainer(docker_engine, debian_image, environment=env) as c:
        sandbox = c.sandbox
        support, info = await inject(sandbox, artifact)
        assert info["build_id"] == artifact.build_id
        assert support.install_dir.startswith("/opt/sandbox-tools/sandbox-tools-")
        assert support.recon.home == ""
        assert support.recon.arch is not None and support.recon.uid == 0


# 12 -----------------------------------------------------------------------------------
async def test_the_agent_flooding_tmp_with_install_names_does_not_hang_the_probe(
    docker_engine: Any, debian_image: str, artifact: Any
) -> None:
    """200k `sandbox-tools-*` names in /tmp and /dev/shm (the agent can): the probe's glob
    expands them all; the injection must still finish in its bounds, in a safe base."""
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = c.sandbox
        await run(
            sandbox,
            "cd /tmp && seq -f 'sandbox-tools-%.0f' 1 200000 | xargs touch",
            user="1000",
        )
        start = time.monotonic()
        result = await inject_or_typed(sandbox, artifact)
        took = time.monotonic() - start
        assert not isinstance(result, SandboxInjectionError), result
        support, _ = result
        assert took < 60, took
        assert support.install_dir.startswith("/opt/sandbox-tools/")


# 13 -----------------------------------------------------------------------------------
async def test_the_agent_cannot_swap_in_its_executable_for_the_probes_verify_under_a_0077_parent(
    docker_engine: Any, debian_image: str, artifact: Any, tmp_path: Any
) -> None:
    """The root-code-execution consequence of attack 1: /opt is 0077 (the image's), so
    chain_verdict passes /opt/sandbox-tools and the probe's reuse check runs
    `/opt/sandbox-tools/sandbox-tools-TAG/sandbox-tools verify` as root after checking it
    by path. The agent (uid 1000, "others" on /opt) exchanges /opt/sandbox-tools with a
    directory of its own (renameat2 RENAME_EXCHANGE in a loop) so that the checks see
    the genuine install and the exec finds its own program. Nothing of the agent's may
    run as root."""
    import shutil
    import subprocess
    from pathlib import Path

    source = Path(__file__).with_name("xchg.c")
    if shutil.which("gcc") is None:
        pytest.skip("no host compiler for the racer")
    racer = tmp_path / "xchg"
    await asyncio.to_thread(
        subprocess.run,
        ["gcc", "-static", "-O2", "-include", "stdlib.h", "-o", str(racer), str(source)],
        check=True,
    )
    tag = str(artifact.build_id).removeprefix("sha256:")[:16]
    with RunningContainer(docker_engine, debian_image) as c:
        sandbox = c.sandbox
        await inject_or_typed(sandbox, artifact)  # the genuine install, in /opt
        assert await installs(sandbox) == [f"/opt/sandbox-tools/sandbox-tools-{tag}"]
        await run(sandbox, "chmod 0077 /opt")  # the image's odd mode, from now on
        await DockerSandbox.exec(
            sandbox,
            ["sh", "-c", "cat > /usr/local/bin/xchg && chmod 755 /usr/local/bin/xchg"],
            input=racer.read_bytes(),
            timeout=30,
        )
        await run(
            sandbox,
            f"mkdir -p /opt/evil/sandbox-tools-{tag} && "
            f"printf '#!/bin/sh\\nid -u >> {PWNED}\\nexit 1\\n' "
            f"> /opt/evil/sandbox-tools-{tag}/sandbox-tools && "
            f"chmod 755 /opt/evil/sandbox-tools-{tag}/sandbox-tools && "
            "(nohup xchg /opt/sandbox-tools /opt/evil >/dev/null 2>&1 & echo $! > /tmp/.xchg.pid)",
            user="1000",
        )
        try:
            # Before the fix the agent won within 19-31 s of injections, 3 runs of 3.
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline:
                await inject_or_typed(sandbox, artifact, bound=60)
                if (await run(sandbox, f"cat {PWNED} 2>/dev/null || true")).strip():
                    break
        finally:
            await run(sandbox, "kill $(cat /tmp/.xchg.pid) || true", user="0")
        await nothing_ran(sandbox)
