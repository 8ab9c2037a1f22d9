"""inspect_ai's own sandbox conformance suite (`self_check`) against our `docker_sdk` sandbox.

inspect ships these checks in its package for any `SandboxEnvironment` to run: they are
collected here unchanged (`from ... self_check import *`), with the one fixture they ask
for, `sandbox_env`, over three configurations an author uses:

- `root`: the image as it is (root, working directory `/`);
- `nonroot`: a user with a home directory as the working directory, the configuration
  inspect's own runner uses for its Docker sandbox;
- `read_only`: root on a read-only root filesystem with a tmpfs for the working directory
  and /tmp (our sandbox's own case: inspect's Docker sandbox has no such runner).

The checks a configuration cannot pass by its nature are marked xfail below, each with
the reason; docs/INSPECT_COMPAT.md lists them. One container per configuration serves
all its checks (as inspect's runner does): each check cleans up after itself.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest

inspect_ai = pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")

from inspect_ai.util._sandbox.self_check import *  # noqa: E402, F403

from sandbox_tools.platforms import Arch  # noqa: E402

pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.timeout(300)]

from tests.support import NONROOT  # noqa: E402

# Checks that cannot pass in a configuration, and why. Root may read and overwrite any
# file whatever its mode (CAP_DAC_OVERRIDE): inspect's own runner excepts the same two
# writes for its root container. A read-only root has no writable /etc for `adduser`.
ROOT_BYPASSES_MODES = "root reads and overwrites files whatever their mode"
KNOWN_FAILURES: dict[str, dict[str, str]] = {
    "root": {
        "test_read_file_not_allowed": ROOT_BYPASSES_MODES,
        "test_write_text_file_without_permissions": ROOT_BYPASSES_MODES,
        "test_write_binary_file_without_permissions": ROOT_BYPASSES_MODES,
    },
    "nonroot": {},
    "read_only": {
        "test_read_file_not_allowed": ROOT_BYPASSES_MODES,
        "test_write_text_file_without_permissions": ROOT_BYPASSES_MODES,
        "test_write_binary_file_without_permissions": ROOT_BYPASSES_MODES,
        "test_exec_as_user": "adduser cannot write /etc on a read-only root",
    },
}


def _config(name: str, image: str) -> Any:
    from sandbox_tools.inspect.docker_env import DockerSdkConfig

    if name == "root":
        return DockerSdkConfig(image=image)
    if name == "nonroot":
        return DockerSdkConfig(image=image, user=NONROOT, working_dir=f"/home/{NONROOT}")
    return DockerSdkConfig(
        image=image,
        read_only=True,
        tmpfs={"/tmp": "exec,mode=1777", "/work": "exec,mode=755"},
        working_dir="/work",
    )


@pytest.fixture(scope="module", params=sorted(KNOWN_FAILURES))
def self_check_container(request: pytest.FixtureRequest, self_check_image: str) -> Iterator[Any]:
    """The configuration's container, made by the docker_sdk sandbox's own code."""
    from sandbox_tools.inspect.docker_env import _remove, _run

    client, container = _run(_config(request.param, self_check_image), "self-check")
    try:
        yield request.param, client, container
    finally:
        _remove(container)


@pytest.fixture
def sandbox_env(request: pytest.FixtureRequest, self_check_container: Any) -> Any:
    from sandbox_tools.inspect.docker_env import DockerSdkSandboxEnvironment

    name, client, container = self_check_container
    reason = KNOWN_FAILURES[name].get(request.node.originalname)
    if reason is not None:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    return DockerSdkSandboxEnvironment.for_container(container, client)


# -- an image with no shell: what our sandbox does beyond inspect's ----------------------


@pytest.fixture(scope="module")
def shell_less_container(docker_engine: Any) -> Iterator[Any]:
    """Static busybox under /.sleeper and nothing else: no /bin/sh, no timeout."""
    from sandbox_tools.inspect.docker_env import DockerSdkConfig, _remove, _run
    from sandbox_tools.sandboxes.images import ensure_busybox_image

    image = ensure_busybox_image(docker_engine, Arch.parse(os.uname().machine), applets=False)
    config = DockerSdkConfig(
        image=image, command=["/.sleeper/busybox", "sleep", "infinity"], working_dir="/tmp"
    )
    client, container = _run(config, "self-check")
    try:
        yield client, container
    finally:
        _remove(container)


async def test_files_in_an_image_without_a_shell_go_through_the_engine(
    shell_less_container: Any,
) -> None:
    """Without a shell, files are written and read by the engine (as root): relative paths
    still resolve against the working directory, and a write onto a directory is refused
    with inspect's IsADirectoryError, the directory and its files untouched (the engine's
    upload alone would replace the directory by the file)."""
    from sandbox_tools.inspect.docker_env import DockerSdkSandboxEnvironment

    env = DockerSdkSandboxEnvironment.for_container(*reversed(shell_less_container))
    await env.write_file("made/here.txt", b"\x00\xffbytes")
    assert await env.read_file("/tmp/made/here.txt", text=False) == b"\x00\xffbytes"
    with pytest.raises(IsADirectoryError, match="directory"):
        await env.write_file("made", "would replace the directory")
    assert await env.read_file("made/here.txt", text=False) == b"\x00\xffbytes"
    with pytest.raises(IsADirectoryError, match="directory"):
        await env.read_file("made")
    with pytest.raises(FileNotFoundError, match="absent"):
        await env.read_file("absent")


async def test_a_timed_exec_in_an_image_without_timeout_still_runs(
    shell_less_container: Any,
) -> None:
    """No /usr/bin/timeout: the command runs with the host's deadline alone, and a
    command past it is still a TimeoutError."""
    from sandbox_tools.inspect.docker_env import DockerSdkSandboxEnvironment

    env = DockerSdkSandboxEnvironment.for_container(*reversed(shell_less_container))
    result = await env.exec(["/.sleeper/busybox", "echo", "hi"], timeout=20)
    assert (result.returncode, result.stdout) == (0, "hi\n")
    with pytest.raises(TimeoutError):
        await env.exec(["/.sleeper/busybox", "sleep", "10"], timeout=2)


async def test_cleanup_removes_what_an_interrupted_run_left_not_a_live_evaluations(
    self_check_image: str,
) -> None:
    """`inspect sandbox cleanup docker_sdk` removed every container with our label on the
    engine, another evaluation's running samples included. Now: only those whose
    evaluation process is gone; a live one's (here: this test's own) are kept."""
    import docker

    from sandbox_tools.inspect.docker_env import (
        LABEL,
        OWNER_LABEL,
        DockerSdkConfig,
        DockerSdkSandboxEnvironment,
        _remove,
        _run,
        this_evaluation,
    )

    client, live = _run(DockerSdkConfig(image=self_check_image), "cleanup-live")
    host, pid, started = this_evaluation().split("/")
    gone_owner = f"{host}/{pid}/{int(started) - 1}"  # this pid, another process: gone
    left = client.containers.run(
        self_check_image,
        ["sleep", "infinity"],
        detach=True,
        network_mode="none",
        labels={LABEL: "cleanup-left", OWNER_LABEL: gone_owner},
    )
    try:
        await DockerSdkSandboxEnvironment.cli_cleanup(None)
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(left.id)
        assert client.containers.get(live.id).status == "running"
        await DockerSdkSandboxEnvironment.cli_cleanup("cleanup-live")  # by task: removed
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(live.id)
    finally:
        _remove(live)
        _remove(left)


@pytest.fixture(scope="module")
def root_container(self_check_image: str) -> Iterator[Any]:
    from sandbox_tools.inspect.docker_env import DockerSdkConfig, _remove, _run

    client, container = _run(DockerSdkConfig(image=self_check_image), "self-check")
    try:
        yield client, container
    finally:
        _remove(container)


async def test_a_fifo_at_the_path_is_refused_not_waited_on(root_container: Any) -> None:
    """THREAT_MODEL.md rule 3: the agent put a FIFO where the host reads or writes a
    file; `cat` waited on it for ever, holding an engine slot."""
    from sandbox_tools.inspect.docker_env import DockerSdkSandboxEnvironment

    env = DockerSdkSandboxEnvironment.for_container(*reversed(root_container))
    made = await env.exec(["mkfifo", "/tmp/answer.txt"])
    assert made.success, made.stderr
    for operation in (env.read_file("/tmp/answer.txt"), env.write_file("/tmp/answer.txt", "x")):
        with pytest.raises(OSError, match="not a regular file"):
            await asyncio.wait_for(operation, 60)


async def test_a_command_cannot_pass_itself_off_as_the_runtimes_refusal(
    root_container: Any,
) -> None:
    """The agent's program printed the container runtime's one-line refusal for
    /usr/bin/timeout and exited 127: the host ran it a second time without `timeout`,
    and every later timed command lost its in-sandbox timeout. What the sandbox has is
    looked up by the engine, never read from a command's output."""
    from sandbox_tools.inspect.docker_env import DockerSdkSandboxEnvironment

    env = DockerSdkSandboxEnvironment.for_container(*reversed(root_container))
    spoof = (
        "echo ran >> /tmp/spoof.count; echo 'OCI runtime exec failed: exec failed: unable to "
        'start container process: exec: "/usr/bin/timeout": stat /usr/bin/timeout: no such '
        "file or directory: unknown'; exit 127"
    )
    result = await env.exec(["sh", "-c", spoof], timeout=30)
    assert result.returncode == 127
    assert (await env.read_file("/tmp/spoof.count")) == "ran\n"  # once, not twice
    with pytest.raises(TimeoutError):
        await env.exec(["sh", "-c", "sleep 300 # spoof-marker; :"], timeout=2)
    await asyncio.sleep(7)  # past timeout's -k 5s
    left = await env.exec(["sh", "-c", "ps aux | grep spoof-marker | grep -v grep"])
    assert left.stdout.strip() == "", left.stdout  # the in-sandbox timeout still ends it
