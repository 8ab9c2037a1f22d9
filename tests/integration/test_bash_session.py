"""bash_session against a real runtime server and real PTY shells."""

from __future__ import annotations

import os
import re
import time
from collections.abc import AsyncIterator

import pytest

from sandbox_tools.errors import ToolError
from sandbox_tools.injector.jsonrpc_client import RuntimeClient, StdioRuntimeClient
from sandbox_tools.injector.source_runtime import local_source_runtime
from sandbox_tools.injector.tool_clients import bash_session, new_bash_session
from sandbox_tools.sandboxes.local import LocalSandbox
from tests.support import RuntimeDir


@pytest.fixture
async def client(runtime_dir: RuntimeDir) -> AsyncIterator[RuntimeClient]:
    launch = local_source_runtime(runtime_dir.path)
    # The freezer's private variables and library path must never reach the shell.
    env = {
        **launch.env,
        "_PYI_ARCHIVE_FILE": "/opt/runtime/bootloader",
        "LD_LIBRARY_PATH": "/opt/runtime/lib",
        "LD_LIBRARY_PATH_ORIG": "/usr/local/lib/caller",
    }
    runtime_client = StdioRuntimeClient(LocalSandbox(), launch.command, env=env)
    yield runtime_client
    await runtime_client.aclose()


async def test_session_names_and_state_across_calls(client: RuntimeClient) -> None:
    first = await new_bash_session(client)
    second = await new_bash_session(client)
    # Unique beyond this server's life: a random part, then a count.
    assert re.fullmatch(r"BashSession_[0-9a-f]{8}_0", first), first
    assert second == first[:-1] + "1"
    assert await bash_session(client, first, "cd /tmp && export GREETING=hi\n") == ""
    assert await bash_session(client, first, "pwd; echo $GREETING\n") == "/tmp\nhi\n"
    # The other session has its own state.
    assert await bash_session(client, second, "echo ${GREETING:-unset}\n") == "unset\n"


async def test_children_see_the_container_not_the_runtime(client: RuntimeClient) -> None:
    session = await new_bash_session(client)
    output = await bash_session(client, session, "env | grep -E '^(_PYI|LD_LIBRARY)' | sort\n")
    assert output == "LD_LIBRARY_PATH=/usr/local/lib/caller\n"


async def test_hung_command_returns_partial_output_within_wait(client: RuntimeClient) -> None:
    session = await new_bash_session(client)
    started = time.monotonic()
    output = await bash_session(
        client, session, "echo started; sleep 300\n", wait_for_output=2, idle_timeout=5
    )
    elapsed = time.monotonic() - started
    assert output.startswith("started\n")
    assert "still running" in output
    assert elapsed < 4
    # The session is still usable after the hung command is restarted away.
    assert await bash_session(client, session, restart=True) == f"{session} restarted."
    assert await bash_session(client, session, "echo alive\n") == "alive\n"


async def test_idle_timeout_returns_after_silence(client: RuntimeClient) -> None:
    session = await new_bash_session(client)
    output = await bash_session(
        client, session, "echo one; sleep 3; echo two\n", wait_for_output=20, idle_timeout=0.5
    )
    assert output.startswith("one\n") and "two" not in output
    later = await bash_session(client, session, None, wait_for_output=10, idle_timeout=0.5)
    assert later == "two\n"  # nothing is lost between calls


async def test_multibyte_character_split_across_writes(client: RuntimeClient) -> None:
    session = await new_bash_session(client)
    command = (
        r"printf '\xe2\x82'; sleep 0.3; printf '\xac \xf0\x9f'; sleep 0.3; printf '\x8e\x89\n'"
    )
    output = await bash_session(client, session, command + "\n", idle_timeout=1)
    assert output == "€ 🎉\n"


async def test_truncation_keeps_the_tail_with_a_notice(client: RuntimeClient) -> None:
    session = await new_bash_session(client)
    output = await bash_session(client, session, "seq 1 20000\n", max_output_bytes=100)
    notice, _, kept = output.partition("]\n")
    assert "bytes of earlier output truncated" in notice
    assert kept.endswith("19999\n20000\n") and len(kept.encode()) <= 100


async def test_control_characters_are_stripped(client: RuntimeClient) -> None:
    session = await new_bash_session(client)
    output = await bash_session(
        client, session, r"printf '\033[1;31mred\033[0m\r\n\a\tok\n'" + "\n"
    )
    assert output == "red\n\tok\n"


async def test_unmatched_quote_reports_continuation(client: RuntimeClient) -> None:
    session = await new_bash_session(client)
    waiting = await bash_session(client, session, "echo 'never closed\n")
    assert "waiting for more input" in waiting
    assert await bash_session(client, session, "now closed'\n") == "never closed\nnow closed\n"


async def test_program_reading_stdin(client: RuntimeClient) -> None:
    session = await new_bash_session(client)
    prompt = await bash_session(
        client, session, "read -p 'name? ' name; echo hi $name\n", wait_for_output=1
    )
    assert prompt.startswith("name? ")
    assert await bash_session(client, session, "model\n") == "hi model\n"


async def test_exited_shell_is_reported_and_restart_recovers(client: RuntimeClient) -> None:
    session = await new_bash_session(client)
    output = await bash_session(client, session, "exit 3\n")
    assert "exited with code 3" in output
    with pytest.raises(ToolError, match="has exited"):
        await bash_session(client, session, "echo again\n")
    await bash_session(client, session, restart=True)
    assert await bash_session(client, session, "echo again\n") == "again\n"


async def test_unknown_session_is_a_tool_error(client: RuntimeClient) -> None:
    with pytest.raises(ToolError, match="no bash session named 'Nope'"):
        await bash_session(client, "Nope", "true\n")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
async def test_session_as_another_user(client: RuntimeClient) -> None:
    session = await new_bash_session(client, user="nobody")
    assert await bash_session(client, session, "id -un; id -u\n") == "nobody\n65534\n"
    await bash_session(client, session, restart=True)
    assert await bash_session(client, session, "id -u\n") == "65534\n"  # restart keeps the user
