"""bash_session and text_editor inside a real container (runtime mounted from source)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from sandbox_tools.errors import ToolError
from sandbox_tools.injector.exec_remote import ExecRemoteOptions, exec_remote
from sandbox_tools.injector.jsonrpc_client import RuntimeClient, connect_runtime
from sandbox_tools.injector.source_runtime import mounted_source_runtime
from sandbox_tools.injector.tool_clients import bash_session, new_bash_session, text_editor

pytestmark = pytest.mark.docker


@pytest.fixture
async def client(docker_engine: Any, python_container: Any) -> AsyncIterator[RuntimeClient]:
    sandbox = python_container.sandbox
    setup = await sandbox.exec(
        ["sh", "-c", "useradd -m -u 1000 agent && install -d -o agent /home/agent/work"]
    )
    assert setup.returncode == 0, setup.stderr
    launch = mounted_source_runtime()
    runtime_client = await connect_runtime(sandbox, launch.command, env=launch.env)
    yield runtime_client
    await runtime_client.aclose()


async def test_bash_session_in_container(client: RuntimeClient) -> None:
    session = await new_bash_session(client)
    await bash_session(client, session, "cd /etc && X=42\n")
    assert await bash_session(client, session, "pwd; echo $X; cat debian_version\n") == (
        "/etc\n42\n" + (await bash_session(client, session, "cat /etc/debian_version\n"))
    )
    # Another user's shell starts where the call came from (the container's working
    # directory, /), as `docker exec --user` does; HOME is its own.
    as_agent = await new_bash_session(client, user="agent")
    assert await bash_session(client, as_agent, "id -u; echo $HOME; pwd\n") == (
        "1000\n/home/agent\n/\n"
    )


async def test_text_editor_in_container_as_user(client: RuntimeClient) -> None:
    path = "/home/agent/work/$(touch /tmp/pwned); rm -rf /etc.txt"
    await text_editor(client, "create", path, file_text="a\nb\n", user="agent")
    await text_editor(client, "insert", path, insert_line=1, new_str="between", user="agent")
    view = await text_editor(client, "view", path, user="agent")
    assert view.endswith("     1\ta\n     2\tbetween\n     3\tb\n")
    owner = await bash_session(
        client,
        await new_bash_session(client),
        "stat -c %u /home/agent/work/*; test -e /tmp/pwned || echo clean; ls -d /etc\n",
    )
    assert owner == "1000\nclean\n/etc\n"  # owned by agent; nothing touched, nothing removed
    with pytest.raises(ToolError, match="permission denied"):
        await text_editor(client, "view", "/root/.bashrc", user="agent")


# inspect_ai sends the sandbox's default exec identity as an object of exact ids.
NO_PASSWD = {"uid": 4242, "gid": 4343, "groups": [4343, 27], "home": "/root"}


async def test_an_identity_object_with_no_passwd_entry_is_honoured_by_every_tool(
    client: RuntimeClient,
) -> None:
    """PROTOCOL.md Identities / THREAT_MODEL rule 4: exact ids, no passwd entry needed, and
    privileges dropped before the filesystem is touched: the home it names (/root) is
    entered with uid 4242's rights only, so the shell stays in /."""
    shell = await new_bash_session(client, user=NO_PASSWD)
    assert await bash_session(client, shell, "id -u; id -g; id -G; echo $HOME; pwd\n") == (
        "4242\n4343\n4343 27\n/root\n/\n"
    )
    ran = await exec_remote(
        client, "id -u; id -G; pwd", ExecRemoteOptions(user=NO_PASSWD, cwd="/tmp"), stream=False
    )
    assert (ran.returncode, ran.stdout) == (0, "4242\n4343 27\n/tmp\n")
    denied = await exec_remote(
        client, "pwd", ExecRemoteOptions(user=NO_PASSWD, cwd="/root"), stream=False
    )
    assert denied.returncode != 0 and "/root" not in denied.stdout
    await text_editor(client, "create", "/tmp/by-4242.txt", file_text="x\n", user=NO_PASSWD)
    await text_editor(client, "create", "/tmp/by-1000.txt", file_text="y\n", user="1000")
    owners = await exec_remote(
        client, "stat -c %u:%g /tmp/by-4242.txt /tmp/by-1000.txt", stream=False
    )
    assert owners.stdout == "4242:4343\n1000:1000\n"
    with pytest.raises(ToolError, match="permission denied"):
        await text_editor(client, "view", "/root/.bashrc", user=NO_PASSWD)
