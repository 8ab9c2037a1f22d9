"""Model-facing tools for inspect_ai tasks, backed by our runtime in any inspect sandbox.

`bash_session()`, `text_editor()` and `exec_remote()` take the same parameters as
inspect_ai's own and give the model the same contract, but the runtime behind them is
injected by sandbox-tools: it runs where inspect's cannot (images without a libc,
read-only roots with a tmpfs), and its calls cost a fraction (docs/PROTOCOL.md, docs/BENCHMARKS.md).

Identity, as inspect's tools do it: when the sandbox lets us exec as root, the runtime
runs as root, out of the agent's reach, and every call acts as the sandbox's default
user (sent as an identity object) unless the tool was given `user=`; otherwise the
runtime runs as the default user itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import secrets
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from inspect_ai.hooks import Hooks, RunEnd, SampleEnd, hooks
from inspect_ai.log import transcript
from inspect_ai.tool import MCPServer, Tool, ToolError, tool
from inspect_ai.tool._tool import ToolParsingError
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
from inspect_ai.util._sandbox.limits import SandboxEnvironmentLimits

from sandbox_tools import errors
from sandbox_tools.artifacts import ArtifactKind
from sandbox_tools.injector import tool_clients
from sandbox_tools.injector.addon_delivery import AddonInstall
from sandbox_tools.injector.exec_remote import (
    ExecEvent,
    ExecRemoteOptions,
    StderrChunk,
    StdoutChunk,
    start_exec_remote,
)
from sandbox_tools.injector.exec_remote import ExecRemoteProcess as _OurProcess
from sandbox_tools.injector.inject import ToolSupport, tool_support_sandbox
from sandbox_tools.injector.jsonrpc_client import ExecRuntimeClient, RuntimeClient
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.injector.web_browser import BrowserSession
from sandbox_tools.inspect.adapter import InspectSandbox, describe
from sandbox_tools.protocol import User

try:  # inspect 0.3.2xx: agents in a tool_state_scope() get shells and browsers of their own
    from inspect_ai.util import tool_state_instance
except ImportError:  # older inspect: the instance is what the caller gave

    def tool_state_instance(instance: str | None) -> str | None:
        return instance


__all__ = ["tool_state_instance"]  # also the browser tools'

# What every sample's tools inject: this installation's runtime and browser add-on from
# its sources under the settings as they stand when acquired (the same ones the docker_sdk
# sandbox checks before the first sample), over the persistent channel where the sandbox
# offers one. One value for the whole eval: every sample's handle is opened with it.
INSPECT_INJECTION = InjectionOptions()

# Whether a task of this process made the browser tools: the docker_sdk sandbox then
# checks, before any sample, that the browser add-on can be had, as it does the runtime.
_ADDONS_WANTED: set[ArtifactKind] = set()


def want_addon(kind: ArtifactKind) -> None:
    """Called by the factories of the tools that need an add-on (the browser's, the
    desktop's), when the task is made: the sandbox then gets it ready at the task's
    start (docker_env.py)."""
    _ADDONS_WANTED.add(kind)


def addons_wanted() -> frozenset[ArtifactKind]:
    return frozenset(_ADDONS_WANTED)


DEFAULT_WAIT_FOR_OUTPUT = 30
DEFAULT_IDLE_TIME = 0.5
# What a call may take beyond its wait for output, as inspect's bash_session allows.
TRANSPORT_TIMEOUT = 180
# Shell builtins only (busybox and dash have them): who an exec runs as, from /proc, and
# where it runs (the sandbox's working directory, against which relative paths resolve).
_IDENTITY_PROBE = (
    'while read -r k v rest; do case "$k" in Uid:|Gid:) echo "$k $v";; '
    'Groups:) echo "$k $v $rest";; esac; done < /proc/self/status; echo "HOME: ${HOME-}"; '
    'printf "CWD: "; pwd'
)


@dataclass
class _Bound:
    support: ToolSupport | None
    default_user: User | None  # what calls act as when the tool has no `user`
    failure: str | None = None  # why the runtime cannot run here: every call says it again
    # What the sample opened and has not closed: released when the sample ends.
    sessions: set[str] = field(default_factory=set)
    processes: set[_OurProcess] = field(default_factory=set)  # dropped once they end
    browsers: set[str] = field(default_factory=set)  # web_browser sessions
    # The browser add-on: installed once per sample under this lock; a failed install is
    # not tried again (every later browser call says why at once).
    browser_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    browser_failure: str | None = None
    # The sandbox's working directory, where a relative path resolves (inspect's tools
    # resolve it in their exec, which runs there); None where it could not be read.
    working_dir: str | None = None

    def ready(self) -> ToolSupport:
        """The runtime, or the reason it cannot run here (raised on every call)."""
        if self.support is None:
            raise RuntimeError(self.failure)
        return self.support


# The sample's store names the bindings it made (key -> token), so that the hook at the
# sample's end finds them: a long-lived sandbox (inspect's `local`) keeps one runtime
# server for every sample, and nothing one sample opened may stay for the next.
_STORE_KEY = "sandbox_tools:binding:"
_BY_TOKEN: dict[str, _Bound] = {}
RELEASE_TIMEOUT = 10.0


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
    cwd = fields.get("CWD", "").strip()
    return {
        "uid": uid,
        "gid": gid,
        "groups": groups,
        "home": fields["HOME"].strip() or None,
        "cwd": cwd if cwd.startswith("/") else None,
    }


async def runtime_for(sandbox_name: str | None = None) -> tuple[ToolSupport, User | None]:
    """Our runtime in the sample's sandbox (injected on first use) and the default identity.

    Cached per sandbox for the sample; concurrent first calls inject once, and a failed
    injection is not tried again: later calls fail at once with the same reason.
    """
    bound = await _bound_for(sandbox_name)
    return bound.ready(), bound.default_user


async def _bound_for(sandbox_name: str | None) -> _Bound:
    environment = sandbox(sandbox_name)
    lock = _LOCKS.setdefault(environment, asyncio.Lock())
    async with lock:
        bound = _BOUND.get(environment)
        if bound is None:
            bound = await _bind(environment, sandbox_name)
            _BOUND[environment] = bound
            if bound.support is not None:
                token = secrets.token_hex(8)
                _BY_TOKEN[token] = bound
                store().set(f"{_STORE_KEY}{sandbox_name or 'default'}", token)
    bound.ready()
    return bound


async def _bind(environment: SandboxEnvironment, sandbox_name: str | None) -> _Bound:
    """Inject into `environment`: as root where the sandbox allows it (the install and
    the server are then out of the agent's reach, whoever the default user is), else as
    the default user. Reports what it did in the sample's transcript."""
    name = describe(environment, sandbox_name)
    probe = InspectSandbox(environment, name)
    default = await _identity(probe, None)
    root = await _identity(probe, "root")
    as_root = root is not None and root["uid"] == 0 and default is not None
    adapted = InspectSandbox(environment, name, user="root" if as_root else None)
    try:
        support = await tool_support_sandbox(adapted, options=INSPECT_INJECTION)
    except errors.SandboxToolsError as exc:
        return _Bound(None, None, f"sandbox-tools could not start in {name}: {exc.explained()}")
    transcript().info(
        {
            "sandbox": name,
            "artifact": support.artifact.name,
            "source": str(support.artifact.provenance),
            "install_dir": support.install_dir,
            "reused": support.reused,
            "runs_as_uid": support.recon.uid,
            "seconds": round(support.seconds, 2),
        },
        source="sandbox-tools",
    )
    act_as = default if as_root and default is not None and default["uid"] != 0 else None
    if act_as is not None:
        act_as = {k: v for k, v in act_as.items() if k != "cwd"}
    working_dir = default["cwd"] if default is not None else None
    return _Bound(support, act_as, working_dir=working_dir)


def report_addon(support: ToolSupport, key: str, install: AddonInstall) -> None:
    """An add-on's first delivery in a sample, in its transcript (`key`: which add-on)."""
    transcript().info(
        {
            "sandbox": support.sandbox.name,
            key: install.artifact.name,
            "source": str(install.artifact.provenance),
            "directory": install.directory,
            "reused": install.reused,
            "transfer": install.transfer,
            "sent_bytes": install.sent_bytes,
            "seconds": round(install.seconds, 2),
        },
        source="sandbox-tools",
    )


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
      timeout: Seconds a call may take in all (default and least: wait_for_output + 180).
      wait_for_output: Longest a call waits for output to settle, in seconds (30).
      user: Run the shell as this user instead of the sandbox's default user.
      instance: Shells are per instance: give each agent its own to keep them apart.
        Defaults to the current `tool_state_scope()`, if any, as in inspect.
    """
    wait = wait_for_output or DEFAULT_WAIT_FOR_OUTPUT
    least = wait + TRANSPORT_TIMEOUT
    if timeout is not None and timeout < least:
        # inspect's own check: a shorter timeout would cut calls that wait for output
        raise ValueError(f"Timeout must be at least {least} seconds, but got {timeout}.")
    budget = timeout or least

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
        # A call the model got wrong is a parsing error, as inspect's.
        if action == "type" and input is None:
            raise ToolParsingError("'input' is required for the 'type' action.")
        if action in ("read", "interrupt", "restart") and input is not None:
            raise ToolParsingError(f"Do not give 'input' with the '{action}' action.")
        bound = await _bound_for(None)
        support, default_user = bound.ready(), bound.default_user
        key = f"sandbox_tools:bash_session:{tool_state_instance(instance) or ''}"

        async def new_session() -> tuple[str, str]:
            try:
                session, note = await tool_clients.start_bash_session(
                    support.client, user=user or default_user
                )
            except errors.ToolError as exc:
                if user is None:
                    raise
                # The task's author named the user, not the model: as in inspect, the
                # sample fails with the reason instead of the model being told.
                raise RuntimeError(
                    f"bash_session(user={user!r}) cannot start a shell: {exc.message}"
                ) from None
            store().set(key, session)
            bound.sessions.add(session)
            return session, f"[sandbox-tools: {note}]\n" if note else ""  # e.g. sh -i

        async def send(session: str) -> str:
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
                # inspect's cut: the sandbox's exec output limit (10 MiB, or the task's)
                max_output_bytes=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE,
            )

        async def call() -> str:
            session = store().get(key)
            if not isinstance(session, str):
                session, said = await new_session()
                return said + await send(session)
            try:
                return await send(session)
            except errors.ToolError as exc:
                if not tool_clients.session_gone(exc):
                    raise
            # The runtime's server was restarted (or closed the shell): names are never
            # reused, so the old one reaches nothing. Go on in a new shell, and say so.
            session, said = await new_session()
            lost = "[sandbox-tools: the previous shell is gone; this is a new one]\n"
            return lost + said + await send(session)

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
        insert_text: str | None = None,
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
          path: Path of the file or directory, e.g. `/repo/file.py` or `../repo` (relative
            to the sandbox's working directory).
          file_text: For create: the whole content of the new file.
          insert_line: For insert: the line after which the text goes.
          insert_text: For insert: the text to put in (or give it as `new_str`).
          new_str: For str_replace: the text to put in; for insert, as `insert_text`.
          old_str: For str_replace: the exact text to replace (it must occur once).
          view_range: For view of a file: [first, last] line numbers, -1 as last for
            the end of the file.

        Returns:
          The result of the command: the file view, or what changed.
        """
        if view_range is not None and len(view_range) != 2:
            raise ToolError("view_range must be two line numbers: [first, last].")
        if command == "insert" and new_str is None:
            new_str = insert_text  # inspect's schema names it so; its runtime takes new_str
        bound = await _bound_for(None)
        support, default_user = bound.ready(), bound.default_user
        call = tool_clients.text_editor(
            support.client,
            command,
            resolved_path(path, bound.working_dir),
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


def resolved_path(path: str, working_dir: str | None) -> str:
    """`path` as the sandbox's working directory resolves it (inspect's text_editor runs
    in an exec there); an absolute path as it is. Our runtime server lives longer than
    one exec, so its own directory means nothing to the model: the host resolves."""
    if path.startswith("/") or working_dir is None or "\0" in path:
        return path
    return posixpath.normpath(posixpath.join(working_dir, path))


# -- exec_remote with inspect's options and events ---------------------------------------

log = logging.getLogger(__name__)
_InspectEvent = ExecStdout | ExecStderr | ExecCompleted


def _inspect_event(event: ExecEvent) -> _InspectEvent:
    if isinstance(event, StdoutChunk):
        return ExecStdout(data=event.data)
    if isinstance(event, StderrChunk):
        return ExecStderr(data=event.data)
    return ExecCompleted(exit_code=event.exit_code)


class ExecRemoteProcess:
    """A running command; iterate it (once) for inspect's `ExecStdout`/`ExecStderr`, then
    `ExecCompleted` when it ends by itself.

    As inspect's: after `kill()` the iteration yields the output the kill's answer
    carried (what no poll had delivered yet, after any events already in hand from the
    last poll), then ends without an `ExecCompleted` and polls no more. A kill while
    another task's poll is in flight: that poll's answer is dropped, the kill's is used.
    """

    def __init__(self, process: _OurProcess, on_end: Callable[[], None] = lambda: None) -> None:
        self._process = process
        self._on_end = on_end  # told once the iteration ended (the process is done)
        self._pending: list[_InspectEvent] = []
        self._killed = False
        self._iterated = False

    @property
    def pid(self) -> int:
        return self._process.pid

    def __aiter__(self) -> AsyncIterator[_InspectEvent]:
        if self._iterated:
            raise RuntimeError("ExecRemoteProcess can only be iterated once")
        self._iterated = True
        return self._events()

    async def _events(self) -> AsyncIterator[_InspectEvent]:
        batches = self._process.batches()
        try:
            while True:
                while self._pending:
                    yield self._pending.pop(0)
                if self._killed:
                    return
                batch = await anext(batches, None)
                if batch is None:
                    return
                if not self._killed:
                    self._pending.extend(_inspect_event(event) for event in batch)
        finally:
            await batches.aclose()  # kills a process left running (not after a kill)
            self._on_end()

    async def write_stdin(self, data: str | bytes) -> None:
        """Send `data` to the process (started with `stdin_open=True`). As inspect's:
        RuntimeError without `stdin_open`, or once the process has ended."""
        self._need_stdin_open("write_stdin")
        if self._killed or self._process.completed is not None:
            raise RuntimeError("Cannot write to stdin: process has terminated")
        await self._process.write_stdin(_text(data))

    async def close_stdin(self) -> None:
        """Close the process's stdin (EOF). As inspect's: RuntimeError without
        `stdin_open`; a no-op once the process has ended."""
        self._need_stdin_open("close_stdin")
        if self._killed or self._process.completed is not None:
            return
        await self._process.close_stdin()

    def _need_stdin_open(self, method: str) -> None:
        if not self._process.options.stdin_open:
            raise RuntimeError(f"{method}() requires stdin_open=True in ExecRemoteStreamingOptions")

    async def kill(self) -> None:
        """Kill the process; a no-op once it was killed or a poll saw it end (as inspect's,
        a failed kill is logged, not raised)."""
        if self._killed or self._process.completed is not None:
            return
        self._killed = True
        try:
            stdout, stderr = await self._process.kill()
        except Exception:
            log.debug("exec_remote kill of pid %s failed", self.pid, exc_info=True)
            return
        if stdout:
            self._pending.append(ExecStdout(data=stdout))
        if stderr:
            self._pending.append(ExecStderr(data=stderr))


def _text(data: str | bytes) -> str:
    if isinstance(data, bytes):
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise ValueError("exec_remote input must be UTF-8 text") from None
    return data


def _client(client: RuntimeClient, concurrency: bool) -> RuntimeClient:
    """The runtime client for one process. Each call of the sandbox's client is one exec
    of the inspect sandbox, throttled as inspect's default (`concurrency=True`) is; with
    `concurrency=False` the process gets a client of its own whose execs are not."""
    return client if concurrency else _variant(client, concurrency=False)


def _variant(
    client: RuntimeClient, concurrency: bool = True, cwd: str | None = None
) -> RuntimeClient:
    """The same runtime through the same inspect sandbox, its execs run differently."""
    if not isinstance(client, ExecRuntimeClient):
        return client  # a persistent channel runs no exec per call
    adapted = client.sandbox
    if not isinstance(adapted, InspectSandbox):
        return client
    changed = InspectSandbox(adapted.environment, adapted.name, adapted.user, concurrency, cwd)
    return ExecRuntimeClient(
        changed, client.runtime_command, client.env, client.user, client.expected_build
    )


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

    inspect's options, each with inspect's meaning:
    - `poll_interval`: the longest one poll waits in the sandbox for news (a long poll:
      output and the end are seen as they happen, not at inspect's >= 5 s ticks).
    - `poll_timeout`: the longest any one call (start, poll, stdin, kill) may go
      unanswered, then TimeoutError; None: our own bound (a poll's wait plus 15 s; a
      kill's 5 s), not inspect's 120 s.
    - `poll_timeout_retry`: None or True sends a timed-out poll, close_stdin or kill again,
      up to twice (no more than 60 s, then 30 s), as inspect's sandboxes do by default;
      never a start or stdin write, which our runtime would carry out twice. False: never.
    - `poll_timeout_recovery`: keeps re-sending a timed-out poll, 5 s apart, for that many
      seconds (none after `kill()`); the re-sent poll replays what the lost answer carried.
    - `concurrency`: True, each call to the runtime is an exec of the inspect sandbox that
      its `concurrency()` throttle counts; False, those execs skip it.
    """
    options = options or (ExecRemoteStreamingOptions() if stream else ExecRemoteAwaitableOptions())
    bound = await _bound_for(sandbox_name)
    support, default_user = bound.ready(), bound.default_user
    ours = ExecRemoteOptions(
        input=None if options.input is None else _text(options.input),
        stdin_open=getattr(options, "stdin_open", False),
        cwd=options.cwd,
        env=options.env or {},
        user=options.user or default_user,
        timeout=getattr(options, "timeout", None),
        poll_interval=options.poll_interval or 5.0,
        poll_timeout=options.poll_timeout,
        poll_timeout_retry=options.poll_timeout_retry is not False,
        poll_timeout_recovery=options.poll_timeout_recovery,
    )
    process = await start_exec_remote(_client(support.client, options.concurrency), cmd, ours)
    bound.processes.add(process)  # killed at the sample's end if still running
    if stream:
        return ExecRemoteProcess(process, lambda: bound.processes.discard(process))
    try:
        completed = await process.wait()
    finally:
        bound.processes.discard(process)
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
    from mcp import StdioServerParameters

    parameters = StdioServerParameters(command=command, args=args or [], cwd=cwd, env=env)

    async def launch(bound: _Bound) -> StdioServerParameters:
        return parameters

    return _mcp_server(
        name=name or " ".join([command, *(args or [])]),
        launch=launch,
        sandbox=sandbox,
        timeout=timeout,
        user=user,
    )


def _mcp_server(
    *,
    name: str,
    launch: Callable[[_Bound], Awaitable[Any]],
    sandbox: str | None,
    timeout: int | None,
    user: str | None,
) -> MCPServer:
    """An MCP server in the sample's sandbox, started when inspect connects to it; `launch`
    prepares the sandbox and answers the server's `StdioServerParameters`."""
    from inspect_ai.tool._mcp._local import MCPServerLocal

    from sandbox_tools.injector.mcp_client import sandbox_mcp_client

    request_timeout = float(timeout or 600)

    @contextlib.asynccontextmanager
    async def client() -> AsyncIterator[Any]:
        bound = await _bound_for(sandbox)
        support, default_user = bound.ready(), bound.default_user
        parameters = await launch(bound)
        async with sandbox_mcp_client(
            support, parameters, user=user or default_user, request_timeout=request_timeout
        ) as streams:
            yield streams

    return MCPServerLocal(client, name=name, events=True, timeout=timeout)


# -- the sample's end ---------------------------------------------------------------------


async def _release(bound: _Bound) -> None:
    """Close the bash and browser sessions and kill the processes a sample left open,
    then the client.

    Runs after inspect cleaned up the sample's sandbox: for a container that is gone,
    the first call fails and nothing more is tried; for a sandbox that lives on (inspect's
    `local`), the calls run from "/" since the sample's directory was deleted."""
    support = bound.support
    if support is None:
        return
    client = _variant(support.client, cwd="/")
    try:
        for session in sorted(bound.sessions):
            await tool_clients.close_bash_session(client, session)
        for name in sorted(bound.browsers):
            await BrowserSession(client, name, None).close()
        for process in list(bound.processes):
            if process.completed is None:
                process.client = client  # the sample's own client may run in its directory
                await process.kill()
    except Exception as exc:
        log.debug("releasing what the sample opened in %s: %s", support.sandbox.name, exc)
    finally:
        with contextlib.suppress(Exception):
            await support.aclose()


@hooks(
    name="sandbox_tools_release",
    description="sandbox-tools: at a sample's end, close the bash and browser sessions and "
    "kill the exec_remote processes its tools left open (one runtime server serves every "
    "sample of a long-lived sandbox).",
)
class ReleaseAtSampleEnd(Hooks):
    async def on_run_end(self, data: RunEnd) -> None:
        """An evaluation run ended: the next one's tasks say again whether they browse."""
        _ADDONS_WANTED.clear()

    async def on_sample_end(self, data: SampleEnd) -> None:
        for key, token in (data.sample.store or {}).items():
            bound = _BY_TOKEN.pop(token, None) if key.startswith(_STORE_KEY) else None
            if bound is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(_release(bound), RELEASE_TIMEOUT)
                # Forgotten with the sample, whoever still holds its environment (inspect
                # keeps it past an in-process eval): the runtime's handle goes now.
                for environment, held in list(_BOUND.items()):
                    if held is bound:
                        _BOUND.pop(environment, None)
