"""MCP servers (stdio) run by the runtime, one session each.

A session is a process speaking newline-delimited JSON-RPC on its stdin/stdout. The
host's requests are written to it and answered by matching the server's responses by
id, several at a time. What the server says on its own (notifications, and requests
such as sampling) goes to the host as sandbox -> host messages when the host asked for
them at launch (`host_messages: true`); otherwise, as with inspect_ai's runtime, its
notifications are dropped and its requests answered at once with an error, so the
server never waits for an answer that cannot come.

A server that exits, writes something that is not JSON-RPC, or stops reading its
stdin gives a clear -32099 naming the session, never a hang; what it wrote to stderr is
kept (the newest 64 KiB) for the error messages and `mcp_server_stderr`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Any

from sandbox_tools.protocol import (
    HOST_MESSAGE_MCP,
    INVALID_REQUEST,
    MAX_JSON_VALUES,
    MAX_SERVER_MESSAGE_VALUES,
    METHOD_NOT_FOUND,
    ErrorReason,
    json_values,
)
from sandbox_tools.runtime.child_env import child_environment, unprotect
from sandbox_tools.runtime.host_messages import HostMessageRefused, HostMessages
from sandbox_tools.runtime.identity import Identity, resolve_user
from sandbox_tools.runtime.jsonrpc import InvalidParams, ToolError, caller_cwd
from sandbox_tools.runtime.limits import DEFAULT_LIMITS, Limits
from sandbox_tools.runtime.tools.mcp.tool_types import LaunchParams, SendParams

MAX_LINE_BYTES = 32 * 1024 * 1024  # one message from the server
STDERR_KEPT = 64 * 1024
WRITE_TIMEOUT = 30.0
KILL_GRACE = 2.0
MAX_PENDING = 1024
# An answer waits this long at most for the server's earlier messages to reach the host.
ORDER_WAIT = 10.0


def _key(request_id: Any) -> str:
    return json.dumps(request_id)  # 1 and "1" are different ids


@dataclass
class _Session:
    id: int
    label: str
    process: asyncio.subprocess.Process
    forward: bool
    tag: str
    encoding: str
    errors: str
    pending: dict[str, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    stderr: bytearray = field(default_factory=bytearray)
    ended: str | None = None
    forwarded_seq: int = 0  # the newest of its messages queued for the host
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    waiting: set[asyncio.Task[None]] = field(default_factory=set)  # answers held for order
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def stderr_tail(self, limit: int = 2000) -> str:
        text = self.stderr[-limit:].decode(errors="replace").strip()
        return text or "(nothing)"

    def fail_pending(self, reason: str) -> None:
        for future in self.pending.values():
            if not future.done():
                future.set_exception(ToolError(reason))
        self.pending.clear()


class McpController:
    def __init__(self, host: HostMessages, limits: Limits = DEFAULT_LIMITS) -> None:
        self.host = host
        self.limits = limits  # read once by the server (Limits.from_environ)
        self._sessions: dict[int, _Session] = {}
        # Ids are never given twice, not even by the next server after this one dies: a
        # host holding an id from before a restart must not reach another user's server.
        self._next_id = secrets.randbelow(1 << 40) + 1
        self._launching = 0  # launches past the limit check that hold no session yet

    # -- methods -------------------------------------------------------------------------

    async def launch(self, params: LaunchParams, forward: bool, tag: str = "") -> int:
        # Check and reserve in one step, before any await: launches racing each other
        # must not all pass the check (100 concurrent launches were once all accepted).
        held = sum(1 for s in self._sessions.values() if s.ended is None) + self._launching
        if held >= self.limits.max_mcp_sessions:
            raise ToolError(
                f"too many MCP sessions: {held} are running or starting (at most "
                f"{self.limits.max_mcp_sessions}); end some with mcp_kill_server",
                ErrorReason.TOO_MANY,
            )
        self._launching += 1
        try:
            identity = resolve_user(params.user)
            process = await self._spawn(params, identity)
        finally:
            self._launching -= 1  # from here the session counts itself (no await between)
        session = _Session(
            id=self._next_id,
            label=f"MCP session {self._next_id} ({params.command})",
            process=process,
            forward=forward,
            tag=tag,
            encoding=params.encoding,
            errors=params.encoding_error_handler,
        )
        self._next_id += 1
        self._sessions[session.id] = session
        session.tasks = [
            asyncio.create_task(self._read_stdout(session)),
            asyncio.create_task(self._read_stderr(session)),
        ]
        return session.id

    async def send_request(self, params: SendParams) -> dict[str, Any]:
        session = self._live(params.session_id)
        key = _key(params.message["id"])
        if key in session.pending:
            raise InvalidParams(
                f"Invalid params: a request with id {key} is already waiting in {session.label}"
            )
        if len(session.pending) >= MAX_PENDING:
            raise ToolError(f"{session.label} has {MAX_PENDING} requests waiting; wait for some")
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        session.pending[key] = future
        try:
            await self._write(session, params.message)
            return await future
        finally:
            session.pending.pop(key, None)

    async def send_notification(self, params: SendParams) -> None:
        await self._write(self._live(params.session_id), params.message)

    async def send_response(self, params: SendParams) -> None:
        await self._write(self._live(params.session_id), params.message)

    async def kill(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise ToolError(
                f"no MCP session {session_id} (it was never launched, or was killed)",
                ErrorReason.SESSION_GONE,
            )
        await self._end(session, f"{session.label} was killed")

    async def stderr(self, session_id: int) -> str:
        session = self._sessions.get(session_id)
        if session is None:
            raise ToolError(f"no MCP session {session_id}", ErrorReason.SESSION_GONE)
        return session.stderr.decode(errors="replace")

    async def shutdown(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(
            *(self._end(s, "the runtime server stopped") for s in sessions),
            return_exceptions=True,
        )

    # -- internals -----------------------------------------------------------------------

    def _live(self, session_id: int) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise ToolError(
                f"no MCP session {session_id} (it was never launched, or was killed)",
                ErrorReason.SESSION_GONE,
            )
        if session.ended is not None:
            raise ToolError(session.ended)
        return session

    async def _spawn(self, params: LaunchParams, identity: Identity) -> asyncio.subprocess.Process:
        env = child_environment({**identity.env(), **(params.env or {})})
        cwd = params.cwd
        if cwd is not None and not identity.switches and not os.path.isdir(cwd):
            raise ToolError(f"cwd {cwd!r} is not an existing directory")

        def enter_cwd() -> None:
            # Runs in the child after the switch to `identity`: the directory is entered
            # with that user's rights, never the runtime's (THREAT_MODEL rule 4).
            if cwd is not None:
                os.chdir(cwd)

        try:
            process = await asyncio.create_subprocess_exec(
                params.command,
                *params.args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd="/" if identity.switches else (cwd or caller_cwd()),
                preexec_fn=enter_cwd if identity.switches else None,
                start_new_session=True,  # its own process group: kill reaches its children
                user=identity.uid,
                group=identity.gid,
                extra_groups=identity.groups,
                limit=MAX_LINE_BYTES,
            )
            unprotect(process.pid)
            return process
        except FileNotFoundError:
            raise ToolError(
                f"cannot launch the MCP server: command {params.command!r} not found "
                f"(PATH={env.get('PATH', '')})"
            ) from None
        except subprocess.SubprocessError:
            raise ToolError(
                f"cannot launch the MCP server as {identity.describe()}: cannot enter its "
                f"cwd {cwd!r}"
            ) from None
        except OSError as exc:
            raise ToolError(
                f"cannot launch the MCP server {params.command!r}: {exc.strerror or exc}"
            ) from None

    async def _write(self, session: _Session, message: dict[str, Any]) -> None:
        stdin = session.process.stdin
        assert stdin is not None
        line = json.dumps(message, ensure_ascii=False) + "\n"
        data = line.encode(session.encoding, session.errors)
        async with session.write_lock:
            try:
                stdin.write(data)
                await asyncio.wait_for(stdin.drain(), WRITE_TIMEOUT)
            except asyncio.TimeoutError:
                raise ToolError(
                    f"{session.label} has not read its input for {WRITE_TIMEOUT:g} s; it is "
                    "stuck or not an MCP server"
                ) from None
            except (ConnectionError, RuntimeError):
                raise ToolError(
                    session.ended or f"{session.label} closed its input (it is exiting)"
                ) from None

    async def _read_stdout(self, session: _Session) -> None:
        stdout = session.process.stdout
        assert stdout is not None
        reason: str | None = None
        try:
            while True:
                try:
                    line = await stdout.readline()
                except (asyncio.LimitOverrunError, ValueError):
                    reason = (
                        f"{session.label} wrote a message larger than {MAX_LINE_BYTES} bytes; "
                        "the session was ended"
                    )
                    break
                if not line:
                    break
                if line.strip():
                    await self._route(session, line)
        finally:
            returncode = await self._reap(session) if reason is None else None
            if reason is not None:
                self._signal(session, signal.SIGKILL)
            if reason is None:
                how = (
                    f"exited with code {returncode}"
                    if returncode is not None
                    else "closed its output"
                )
                reason = f"{session.label} {how}; its stderr ends with: {session.stderr_tail()}"
            session.ended = session.ended or reason
            session.fail_pending(session.ended)

    async def _route(self, session: _Session, line: bytes) -> None:
        values = json_values(line)
        if values > MAX_JSON_VALUES:
            # Parsed, a few MB of `[{},{},...]` costs GBs: neither we nor the host parse it.
            reason = (
                f"{session.label} sent a message of up to {values} JSON values (at most "
                f"{MAX_JSON_VALUES}); it was dropped"
            )
            session.fail_pending(reason)
            if session.forward:
                await self._report_dropped(session, None, reason)
            return
        try:
            message = json.loads(line.decode(session.encoding, session.errors))
        except (ValueError, UnicodeDecodeError):
            message = None
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            # The MCP stdio transport allows nothing else on stdout: whatever waits for an
            # answer gets this, instead of waiting for one that may never come.
            session.fail_pending(
                f"{session.label} wrote something that is not a JSON-RPC message: "
                f"{line[:200].decode(errors='replace')!r}; its stderr ends with: "
                f"{session.stderr_tail()}"
            )
            return
        if "method" not in message:  # a response to one of the host's requests
            future = session.pending.get(_key(message.get("id")))
            if future is not None and not future.done():
                if session.forward and session.forwarded_seq:
                    # What the server said before this answer (progress, logs) reaches the
                    # host first: over exec, they travel on another call (a poll).
                    task = asyncio.create_task(self._answer_after(session, future, message))
                    session.waiting.add(task)
                    task.add_done_callback(session.waiting.discard)
                else:
                    future.set_result(message)
            return
        if session.forward and values > MAX_SERVER_MESSAGE_VALUES:
            # Dropped here, before the queue: the host would refuse it too (its SDK would
            # spend hundreds of MB on it), and a frame that size delays every session.
            reason = (
                f"{session.label} sent a {message.get('method')!r} message of up to {values} "
                f"JSON values (at most {MAX_SERVER_MESSAGE_VALUES}); it was dropped"
            )
            await self._report_dropped(session, message.get("method"), reason)
            if "id" in message:
                await self._refuse(session, message["id"], reason, INVALID_REQUEST)
            return
        if session.forward:
            await self._to_host(session, message)
        elif "id" in message:  # a request nobody will answer: say so at once
            await self._refuse(
                session,
                message["id"],
                "this client does not handle requests from the server "
                "(launch with host_messages: true to receive them)",
            )

    async def _to_host(self, session: _Session, message: dict[str, Any]) -> None:
        """Queue `message` for the host in the session's own share of the queue; one that
        can never be delivered is dropped here, and both ends are told."""
        try:
            await self._put(session, {"message": message})
        except HostMessageRefused as exc:
            reason = f"{session.label}: a message was dropped: {exc}"
            await self._report_dropped(session, message.get("method"), reason)
            if "id" in message:  # the server would wait for an answer that cannot come
                await self._refuse(session, message["id"], reason)

    async def _report_dropped(self, session: _Session, method: Any, reason: str) -> None:
        """Tell the host a message of this session was dropped, and why (a small notice)."""
        with contextlib.suppress(HostMessageRefused):
            await self._put(session, {"dropped": {"method": str(method)[:200], "reason": reason}})

    async def _put(self, session: _Session, fields: dict[str, Any]) -> None:
        params: dict[str, Any] = {"session_id": session.id, **fields}
        if session.tag:
            params["tag"] = session.tag  # how the host routes it to the session it launched
        session.forwarded_seq = await self.host.put(HOST_MESSAGE_MCP, params, f"mcp:{session.id}")

    async def _refuse(
        self, session: _Session, request_id: Any, reason: str, code: int = METHOD_NOT_FOUND
    ) -> None:
        refusal = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": reason}}
        with contextlib.suppress(ToolError):
            await self._write(session, refusal)

    async def _answer_after(
        self, session: _Session, future: asyncio.Future[dict[str, Any]], message: dict[str, Any]
    ) -> None:
        await self.host.wait_delivered(session.forwarded_seq, ORDER_WAIT)
        if not future.done():
            future.set_result(message)

    async def _read_stderr(self, session: _Session) -> None:
        stderr = session.process.stderr
        assert stderr is not None
        while chunk := await stderr.read(65536):
            session.stderr += chunk
            del session.stderr[:-STDERR_KEPT]

    async def _reap(self, session: _Session) -> int | None:
        with contextlib.suppress(asyncio.TimeoutError):
            return await asyncio.wait_for(session.process.wait(), KILL_GRACE)
        return None

    @staticmethod
    def _signal(session: _Session, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(session.process.pid, signum)

    async def _end(self, session: _Session, reason: str) -> None:
        session.ended = session.ended or reason
        session.fail_pending(reason)
        if session.process.returncode is None:
            self._signal(session, signal.SIGTERM)
            if await self._reap(session) is None:
                self._signal(session, signal.SIGKILL)
                await self._reap(session)
        tasks = [*session.tasks, *session.waiting]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
