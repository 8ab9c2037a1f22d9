"""bash_session: interactive shells on PTYs, one per session, owned by the server.

How a call knows when to stop reading:
- the shell's prompts are set to per-session nonce tokens (after start, so they
  override any rc file): PS1 at the end of the output means the command finished and
  the call returns at once instead of waiting out `idle_timeout`; PS2 at the end means
  the shell waits for the rest of an unfinished command, which the result says;
- otherwise output is collected until `idle_timeout` seconds of silence after some
  output, or `wait_for_output` seconds in all (a hung command returns what it has).
Output not returned by one call (it arrived after the call ended) is returned by the next.
This module owns the shells, terminals and waiting; output.py the pure buffering,
cleaning and truncation of what they print.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import os
import pty
import secrets
import shlex
import shutil
import signal
import struct
import termios
import time
from dataclasses import dataclass, field

from sandbox_tools.protocol import MAX_SESSIONS_ENV, ErrorReason
from sandbox_tools.runtime.child_env import child_environment, unprotect
from sandbox_tools.runtime.identity import Identity, UserSpec, resolve_user
from sandbox_tools.runtime.jsonrpc import CALLER_CWD, ToolError, caller_cwd
from sandbox_tools.runtime.limits import DEFAULT_LIMITS, Limits
from sandbox_tools.runtime.tools.bash_session.output import (
    OutputBuffer,
    WaitEnd,
    clean_output,
    render,
)
from sandbox_tools.runtime.tools.bash_session.tool_types import (
    CloseSessionParams,
    InteractParams,
    NewSessionParams,
)

READ_SIZE = 64 * 1024
START_TIMEOUT_S = 15.0
PROMPT_SETTLE_S = 0.05
WINDOW = struct.pack("HHHH", 50, 250, 0, 0)  # rows, cols: wide, so little wraps


def _take_controlling_tty() -> None:  # runs in the child between fork and exec
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@dataclass
class _Shell:
    process: asyncio.subprocess.Process
    master: int
    program: str
    ps1: str
    ps2: str
    output: OutputBuffer = field(default_factory=OutputBuffer)
    last_output_at: float = 0.0
    exit_code: int | None = None
    eof: bool = False

    def __post_init__(self) -> None:
        self.watcher: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()

    def on_readable(self) -> None:
        try:
            data = os.read(self.master, READ_SIZE)
        except OSError:  # EIO: every holder of the terminal's other side is gone
            data = b""
        if not data:
            self.eof = True
            asyncio.get_running_loop().remove_reader(self.master)
        self.output.feed(data, final=not data)
        self.last_output_at = time.monotonic()
        self.changed.set()

    async def write(self, data: str) -> None:
        payload = data.encode()
        while payload:
            try:
                written = os.write(self.master, payload)
            except BlockingIOError:
                await asyncio.sleep(0.01)  # the terminal's input queue is full; let it drain
                continue
            payload = payload[written:]

    def kill(self) -> None:
        """Kill the shell's group and close its terminal, once: a second close of the
        descriptor number would close whatever the process opened under it since (another
        client's socket, another session's terminal)."""
        if self.master < 0:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(ValueError, RuntimeError):
            asyncio.get_running_loop().remove_reader(self.master)
        with contextlib.suppress(OSError):
            os.close(self.master)
        self.master = -1


RECLAIMED_KEPT = 256


class BashSessionController:
    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        # Shells held at once (`limits.max_sessions`): each is a process with a PTY and its
        # own output buffer. Read once by the server (Limits.from_environ).
        self.limits = limits
        self._sessions: dict[str, _Shell] = {}
        self._users: dict[str, UserSpec | None] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._starting: set[str] = set()  # names reserved by sessions still starting
        self._reaping: set[asyncio.Task[None]] = set()
        # Names are never reused, not even by the next server after this one dies (its
        # own random part): a caller holding an old name never reaches another's shell.
        self._names = 0
        self._life = secrets.token_hex(4)
        self._last_used: dict[str, float] = {}
        # Sessions closed to make room, and why (the newest RECLAIMED_KEPT names).
        self._reclaimed: collections.OrderedDict[str, str] = collections.OrderedDict()

    async def new_session(self, params: NewSessionParams) -> dict[str, str]:
        # Check and reserve (the slot and the name) in one step, before any await:
        # concurrent starts once all passed the check and shared one name.
        held = len(self._sessions) + len(self._starting)
        if held >= self.limits.max_sessions:
            # Hosts that never close their sessions (inspect's own, on a sandbox that
            # outlives its samples) would otherwise be refused forever: the least recently
            # used idle session makes room.
            victim = self._least_recently_used_idle()
            if victim is None:
                raise ToolError(
                    f"too many bash sessions: {held} exist or are starting and all are busy "
                    f"(at most {self.limits.max_sessions}); wait for a command to finish, "
                    f"or raise {MAX_SESSIONS_ENV}",
                    ErrorReason.TOO_MANY,
                )
            self._reclaim(
                victim,
                f"bash session {victim!r} was closed to make room for a new one: at most "
                f"{self.limits.max_sessions} are kept, and the least recently used idle one "
                "goes first; create a new session",
            )
        name = self._next_name()
        self._starting.add(name)
        try:
            identity = resolve_user(params.user)
            shell = await self._start(identity)
        finally:
            self._starting.discard(name)
        self._sessions[name] = shell
        self._users[name] = params.user
        self._locks[name] = asyncio.Lock()
        self._last_used[name] = time.monotonic()
        result = {"session_name": name, "shell": shell.program}
        if not shell.program.endswith("bash"):
            result["note"] = f"bash is not installed here; this session runs {shell.program} -i"
        return result

    async def interact(self, params: InteractParams) -> str:
        shell = self._sessions.get(params.session_name)
        if shell is None and params.session_name in self._reclaimed:
            raise ToolError(self._reclaimed[params.session_name], ErrorReason.SESSION_GONE)
        if shell is None:
            known = ", ".join(sorted(self._sessions)) or "none"
            raise ToolError(
                f"no bash session named {params.session_name!r} (sessions: {known}); "
                "create one with bash_session_new_session",
                ErrorReason.SESSION_GONE,
            )
        self._last_used[params.session_name] = time.monotonic()
        async with self._locks[params.session_name]:
            if params.restart:
                shell.kill()
                await self._reap(shell)
                identity = resolve_user(self._users[params.session_name])
                fresh = await self._start(identity)
                if self._sessions.get(params.session_name) is not shell:
                    # Closed or reclaimed while the new shell started: it must not return.
                    fresh.kill()
                    await self._reap(fresh)
                    raise ToolError(
                        self._reclaimed.get(params.session_name, "session closed"),
                        ErrorReason.SESSION_GONE,
                    )
                self._sessions[params.session_name] = fresh
                return f"{params.session_name} restarted."
            if shell.exit_code is not None and not shell.output.unreturned:
                raise ToolError(
                    f"the shell of {params.session_name} has exited (code {shell.exit_code}); "
                    "restart the session (restart: true) to get a new shell"
                )
            written_at = shell.output.end
            if params.input:
                await shell.write(params.input)
            state = await self._collect(shell, params, written_at)
            return self._render(shell, params, state)

    def close(self, params: CloseSessionParams) -> dict[str, bool]:
        """End a session its host is done with (a sample ended); a later call to it is
        told so. Closing one that is gone already is not an error: hosts close on
        cleanup paths, where the session may have been reclaimed or never started."""
        if params.session_name not in self._sessions:
            return {"closed": False}
        self._reclaim(
            params.session_name,
            f"bash session {params.session_name!r} was closed by its host; create a new session",
        )
        return {"closed": True}

    async def shutdown(self) -> None:
        for shell in self._sessions.values():
            shell.kill()
        self._sessions.clear()

    # -- internals -----------------------------------------------------------------------

    def _next_name(self) -> str:
        index, self._names = self._names, self._names + 1
        return f"BashSession_{self._life}_{index}"

    def _least_recently_used_idle(self) -> str | None:
        idle = [name for name in self._sessions if not self._locks[name].locked()]
        return min(idle, key=lambda name: self._last_used.get(name, 0.0), default=None)

    def _reclaim(self, name: str, why: str) -> None:
        shell = self._sessions.pop(name)
        shell.kill()
        reap = asyncio.create_task(self._reap(shell))
        self._reaping.add(reap)
        reap.add_done_callback(self._reaping.discard)
        self._users.pop(name, None)
        self._locks.pop(name, None)
        self._last_used.pop(name, None)
        self._reclaimed[name] = why
        while len(self._reclaimed) > RECLAIMED_KEPT:
            self._reclaimed.popitem(last=False)

    async def _start(self, identity: Identity) -> _Shell:
        bash = shutil.which("bash")
        program = bash or shutil.which("sh") or "/bin/sh"
        argv = [program, "--noediting", "-i"] if bash else [program, "-i"]
        master, slave = pty.openpty()
        attrs = termios.tcgetattr(slave)
        attrs[3] &= ~termios.ECHO  # input is not echoed back into the output
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, WINDOW)
        os.set_blocking(master, False)
        env = child_environment({**identity.env(), "TERM": "dumb", "PAGER": "cat"})
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=env,
                # Another user's shell starts in / and enters its directory itself, after
                # the switch: a directory is entered with that user's rights only.
                # Otherwise it starts where the call came from, never in the server's own
                # directory (which may be a finished sample's, long removed).
                cwd="/" if identity.switches else caller_cwd(),
                start_new_session=True,
                preexec_fn=_take_controlling_tty,
                user=identity.uid,
                group=identity.gid,
                extra_groups=identity.groups,
            )
        except OSError as exc:
            os.close(master)
            raise ToolError(f"cannot start {program}: {exc.strerror or exc}") from None
        finally:
            os.close(slave)
        unprotect(process.pid)
        nonce = secrets.token_hex(6)
        shell = _Shell(process, master, program, f"__ST_PS1_{nonce}__", f"__ST_PS2_{nonce}__")
        asyncio.get_running_loop().add_reader(master, shell.on_readable)
        shell.watcher = asyncio.create_task(self._watch(shell))  # held: tasks are weakly kept
        # Another user's shell enters, with its own rights, where the call came from (the
        # sandbox's working directory, as for the runtime's own user), else its home.
        places = [p for p in (CALLER_CWD.get(), identity.home) if p] if identity.switches else []
        enter_home = (
            " || ".join(f"cd -- {shlex.quote(place)} 2>/dev/null" for place in places) + "; "
            if places
            else ""
        )
        try:
            await shell.write(
                f"{enter_home}PS1='{shell.ps1}'; PS2='{shell.ps2}'; unset PROMPT_COMMAND\n"
            )
            deadline = time.monotonic() + START_TIMEOUT_S
            while shell.ps1 not in shell.output.raw:
                if shell.exit_code is not None or time.monotonic() > deadline:
                    raise ToolError(
                        f"{program} did not start an interactive session: "
                        f"{clean_output(shell.output.raw)[-500:]!r}"
                    )
                shell.changed.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(shell.changed.wait(), 0.5)
        except BaseException:
            shell.kill()  # a shell that never became a session (or whose start was
            raise  # cancelled) holds no slot, so it must not outlive this call
        shell.output.skip()  # start-up banner and rc output are not the model's
        return shell

    @staticmethod
    async def _watch(shell: _Shell) -> None:
        returncode = await shell.process.wait()
        # Let the reader drain what the shell wrote before it went away.
        for _ in range(50):
            if shell.eof:
                break
            await asyncio.sleep(0.01)
        shell.exit_code = 128 - returncode if returncode < 0 else returncode
        shell.changed.set()

    @staticmethod
    async def _reap(shell: _Shell) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(shell.process.wait(), 5)

    async def _collect(self, shell: _Shell, params: InteractParams, written_at: int) -> WaitEnd:
        """Wait per the rules in the module docstring; return why the wait ended."""
        started = time.monotonic()
        deadline = started + params.wait_for_output
        while True:
            fresh = shell.output.text_since(written_at).rstrip()
            if shell.exit_code is not None:
                return "exited"
            if fresh.endswith(shell.ps1) or fresh.endswith(shell.ps2):
                # Settle: a prompt between two commands of one input is not the end.
                shell.changed.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(shell.changed.wait(), PROMPT_SETTLE_S)
                if not shell.changed.is_set():
                    return "prompt" if fresh.endswith(shell.ps1) else "continuation"
                continue
            now = time.monotonic()
            has_output = shell.output.unreturned
            if has_output and now - shell.last_output_at >= params.idle_timeout:
                return "idle"
            if now >= deadline:
                return "timeout"
            wait = deadline - now
            if has_output:
                wait = min(wait, params.idle_timeout - (now - shell.last_output_at))
            shell.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(shell.changed.wait(), max(wait, 0.001))

    @staticmethod
    def _render(shell: _Shell, params: InteractParams, ended: WaitEnd) -> str:
        text, dropped = shell.output.take()
        return render(
            text,
            prompts=(shell.ps1, shell.ps2),
            dropped=dropped,
            ended=ended,
            exit_code=shell.exit_code,
            input_given=params.input is not None,
            max_output_bytes=params.max_output_bytes,
        )
