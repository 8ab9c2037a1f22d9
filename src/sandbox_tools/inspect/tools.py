"""Model-facing tools for inspect_ai tasks, backed by our runtime in any inspect sandbox.

`bash_session()`, `text_editor()` and `exec_remote()` take the same parameters as
inspect_ai's own and give the model the same contract, but the runtime behind them is
injected by sandbox-tools: it runs where inspect's cannot (images without a libc,
read-only roots with a tmpfs), and its calls cost a fraction (PROTOCOL.md; README).

Identity, as inspect's tools do it: when the sandbox lets us exec as root, the runtime
runs as root, out of the agent's reach, and every call acts as the sandbox's default
user (sent as an identity object) unless the tool was given `user=`; otherwise the
runtime runs as the default user itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from inspect_ai.tool import MCPServer, Tool, ToolError, tool
from inspect_ai.util import (
    ExecCompleted,
    ExecRemoteAwaitableOptions,
    ExecRemoteStreamingOptions,
    ExecResult,
    ExecStderr,
    ExecStdout,
    SandboxEnvironment,
    sandbox,
    store,
)

from sandbox_tools import errors
from sandbox_tools.injector import tool_clients
from sandbox_tools.injector.exec_remote import (
    ExecRemoteOptions,
    StderrChunk,
    StdoutChunk,
    start_exec_remote,
)
from sandbox_tools.injector.exec_remote import ExecRemoteProcess as _OurProcess
from sandbox_tools.injector.inject import ToolSupport, tool_support_sandbox
from sandbox_tools.inspect.adapter import InspectSandbox
from sandbox_tools.protocol import User

DEFAULT_WAIT_FOR_OUTPUT = 30
DEFAULT_IDLE_TIME = 0.5
# Shell builtins only (busybox and dash have them): who an exec runs as, from /proc.
_IDENTITY_PROBE = (
    'while read -r k v rest; do case "$k" in Uid:|Gid:) echo "$k $v";; '
    'Groups:) echo "$k $v $rest";; esac; done < /proc/self/status; echo "HOME: ${HOME-}"'
)


@dataclass
class _Bound:
    support: ToolSupport
    default_user: User | None  # what calls act as when the tool has no `user`


_BOUND: weakref.WeakKeyDictionary[SandboxEnvironment, _Bound] = weakref.WeakKeyDictionary()
_LOCKS: weakref.WeakKeyDictionary[SandboxEnvironment, asyncio.Lock] = weakref.WeakKeyDictionary()


async def _identity(adapted: InspectSandbox, user: str | None) -> dict[str, Any] | None:
    try:
        probe = await adapted.exec(["sh", "-c", _IDENTITY_PROBE], user=user, timeout=60)
    except Exception:  # a provider that cannot exec as `user` says so in its own way
        return None
    fields = dict(line.partition(":")[::2] for line in probe.stdout.decode().splitlines())
    try:
        uid, gid = int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])
        groups = [int(g) for g in fields.get("Groups", "").split()]
    except (KeyError, IndexError, ValueError):
        return None
    return {"uid": uid, "gid": gid, "groups": groups, "home": fields["HOME"].strip() or None}


async def runtime_for(sandbox_name: str | None = None) -> tuple[ToolSupport, User | None]:
    """Our runtime in the sample's sandbox (injected on first use) and the default identity.

    Cached per sandbox for the sample; concurrent first calls inject once.
    """
    environment = sandbox(sandbox_name)
    lock = _LOCKS.setdefault(environment, asyncio.Lock())
    async with lock:
        bound = _BOUND.get(environment)
        if bound is None:
            adapted = InspectSandbox(environment)
            default = await _identity(adapted, None)
            root = await _identity(adapted, "root")
            try:
                if root is not None and root["uid"] == 0 and default is not None:
                    support = await tool_support_sandbox(adapted, user="root")
                    act_as = None if default["uid"] == 0 else default
                else:
                    support, act_as = await tool_support_sandbox(adapted), None
            except errors.SandboxToolsError as exc:
                raise RuntimeError(f"sandbox-tools could not start in the sandbox: {exc}") from exc
            bound = _Bound(support, act_as)
            _BOUND[environment] = bound
    return bound.support, bound.default_user


def _for_model(exc: errors.ToolError) -> ToolError:
    return ToolError(str(exc))


@tool(name="bash_session")
def bash_session(
    *,
    timeout: int | None = None,
    wait_for_output: int | None = None,
    user: str | None = None,
    instance: str | None = None,
) -> Tool:
    """An interactive bash shell that keeps its state between calls.

    Args:
      timeout: Seconds a call may take in all (default: wait_for_output + 180).
      wait_for_output: Longest a call waits for output to settle, in seconds (30).
      user: Run the shell as this user instead of the sandbox's default user.
      instance: Shells are per instance: give each agent its own to keep them apart.
    """
    wait = wait_for_output or DEFAULT_WAIT_FOR_OUTPUT
    budget = timeout or wait + 180

    async def execute(
        action: Literal["type", "type_submit", "restart", "read", "interrupt"],
        input: str | None = None,
    ) -> str:
        """Use a persistent bash shell: type into it and read what it prints.

        Output may arrive over several calls: use "read" to collect more of it. Wait for a
        prompt before submitting the next command. A prompt of "> " means the shell waits
        for the rest of an unfinished command (an open quote, for example): finish it or
        send "interrupt". Control keys are sent as characters, e.g. "\\u0004" for Ctrl+D.

        Args:
          action: "type_submit" sends input and presses Enter; "type" sends input
            without Enter; "read" only collects new output; "interrupt" sends Ctrl+C;
            "restart" replaces the shell with a fresh one.
          input: The text to send. Needed for "type"; not allowed for "read",
            "interrupt" and "restart".

        Returns:
          What the shell printed since the previous call.
        """
        if action == "type" and input is None:
            raise ToolError("'input' is required for the 'type' action.")
        if action in ("read", "interrupt", "restart") and input is not None:
            raise ToolError(f"Do not give 'input' with the '{action}' action.")
        support, default_user = await runtime_for()
        key = f"sandbox_tools:bash_session:{instance or ''}"

        async def call() -> str:
            session = store().get(key)
            if not isinstance(session, str):
                session = await tool_clients.new_bash_session(
                    support.client, user=user or default_user
                )
                store().set(key, session)
            if action == "restart":
                await tool_clients.bash_session(support.client, session, restart=True)
                return "Bash session restarted."
            sent = {
                "type": input,
                "type_submit": (input or "") + "\n",
                "interrupt": "\u0003",
                "read": None,
            }[action]
            return await tool_clients.bash_session(
                support.client,
                session,
                sent,
                wait_for_output=wait,
                idle_timeout=DEFAULT_IDLE_TIME,
            )

        try:
            return await asyncio.wait_for(call(), budget)
        except errors.ToolError as exc:
            raise _for_model(exc) from None

    return execute


@tool(name="text_editor")
def text_editor(timeout: int | None = None, user: str | None = None) -> Tool:
    """View, create and edit files in the sandbox.

    Args:
      timeout: Seconds a call may take (default 180).
      user: Act as this user instead of the sandbox's default user.
    """

    async def execute(
        command: Literal["view", "create", "str_replace", "insert", "undo_edit"],
        path: str,
        file_text: str | None = None,
        insert_line: int | None = None,
        new_str: str | None = None,
        old_str: str | None = None,
        view_range: list[int] | None = None,
    ) -> str:
        """Look at and change text files, with the last change to each file undoable.

        `view` shows a file with line numbers (or lists a directory two levels deep);
        `create` writes a new file; `str_replace` replaces one exact, unique occurrence
        of `old_str`; `insert` adds `new_str` after line `insert_line` (0 for the top);
        `undo_edit` restores the file as it was before the last edit made here.

        Args:
          command: One of view, create, str_replace, insert, undo_edit.
          path: Absolute path of the file or directory.
          file_text: For create: the whole content of the new file.
          insert_line: For insert: the line after which `new_str` goes.
          new_str: For str_replace and insert: the text to put in.
          old_str: For str_replace: the exact text to replace (it must occur once).
          view_range: For view of a file: [first, last] line numbers, -1 as last for
            the end of the file.

        Returns:
          The result of the command: the file view, or what changed.
        """
        if view_range is not None and len(view_range) != 2:
            raise ToolError("view_range must be two line numbers: [first, last].")
        support, default_user = await runtime_for()
        call = tool_clients.text_editor(
            support.client,
            command,
            path,
            view_range=(view_range[0], view_range[1]) if view_range else None,
            file_text=file_text,
            old_str=old_str,
            new_str=new_str,
            insert_line=insert_line,
            user=user or default_user,
        )
        try:
            return await asyncio.wait_for(call, timeout or 180)
        except errors.ToolError as exc:
            raise _for_model(exc) from None

    return execute


# -- exec_remote with inspect's options and events ---------------------------------------


class ExecRemoteProcess:
    """A running command; iterate it for inspect's `ExecStdout`/`ExecStderr`/`ExecCompleted`."""

    def __init__(self, process: _OurProcess) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    async def __aiter__(self) -> AsyncIterator[ExecStdout | ExecStderr | ExecCompleted]:
        async for event in self._process.events():
            if isinstance(event, StdoutChunk):
                yield ExecStdout(data=event.data)
            elif isinstance(event, StderrChunk):
                yield ExecStderr(data=event.data)
            else:
                yield ExecCompleted(exit_code=event.exit_code)

    async def write_stdin(self, data: str | bytes) -> None:
        await self._process.write_stdin(_text(data))

    async def close_stdin(self) -> None:
        await self._process.close_stdin()

    async def kill(self) -> None:
        await self._process.kill()


def _text(data: str | bytes) -> str:
    if isinstance(data, bytes):
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise ValueError("exec_remote input must be UTF-8 text") from None
    return data


async def exec_remote(
    cmd: list[str],
    options: ExecRemoteStreamingOptions | ExecRemoteAwaitableOptions | None = None,
    *,
    stream: bool = True,
    sandbox_name: str | None = None,
) -> ExecRemoteProcess | ExecResult[str]:
    """inspect's `sandbox().exec_remote(...)`, through our runtime.

    stream=True: an `ExecRemoteProcess` yielding inspect's event classes. stream=False:
    inspect's `ExecResult` once the command ends (killed past `options.timeout`, raising
    TimeoutError as inspect does).
    """
    options = options or (ExecRemoteStreamingOptions() if stream else ExecRemoteAwaitableOptions())
    support, default_user = await runtime_for(sandbox_name)
    ours = ExecRemoteOptions(
        input=None if options.input is None else _text(options.input),
        stdin_open=getattr(options, "stdin_open", False),
        cwd=options.cwd,
        env=options.env or {},
        user=options.user or default_user,
        timeout=getattr(options, "timeout", None),
        poll_interval=options.poll_interval or 5.0,
    )
    process = await start_exec_remote(support.client, cmd, ours)
    if stream:
        return ExecRemoteProcess(process)
    completed = await process.wait()
    return ExecResult(
        success=completed.exit_code == 0 and not completed.killed,
        returncode=completed.exit_code,
        stdout=completed.stdout,
        stderr=completed.stderr,
    )


# -- MCP servers inside the sandbox, as inspect tools -------------------------------------


def mcp_server_sandbox(
    *,
    name: str | None = None,
    command: str,
    args: list[str] | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    sandbox: str | None = None,
    timeout: int | None = None,
    user: str | None = None,
) -> MCPServer:
    """inspect's `mcp_server_sandbox()`, through our runtime: use with `mcp_tools()`.

    Unlike inspect's own, what the server sends on its own reaches inspect: its log
    messages and progress, and sampling requests, which inspect answers with the task's
    model. `user` runs the server as that user instead of the sandbox's default user.
    """
    from inspect_ai.tool._mcp._local import MCPServerLocal
    from mcp import StdioServerParameters

    from sandbox_tools.injector.mcp_client import sandbox_mcp_client

    parameters = StdioServerParameters(command=command, args=args or [], cwd=cwd, env=env)
    request_timeout = float(timeout or 600)

    @contextlib.asynccontextmanager
    async def client() -> AsyncIterator[Any]:
        support, default_user = await runtime_for(sandbox)
        async with sandbox_mcp_client(
            support, parameters, user=user or default_user, request_timeout=request_timeout
        ) as streams:
            yield streams

    return MCPServerLocal(
        client,
        name=name or " ".join([command, *(args or [])]),
        events=True,
        timeout=timeout,
    )
