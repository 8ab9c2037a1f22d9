"""One of our providers as an inspect_ai sandbox environment.

inspect_ai talks to sandboxes through `SandboxEnvironment`; our providers (`Sandbox`)
already do everything it needs, with bounded output and timeouts. This class maps
one onto the other once, so each registered environment (`modal`, `docker_sdk`) only
says how its sandboxes are created and removed.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import posixpath
import re
import time
from typing import Literal, overload

from inspect_ai.util import ExecResult, OutputLimitExceededError, SandboxEnvironment
from inspect_ai.util._sandbox.limits import SandboxEnvironmentLimits

from sandbox_tools.errors import SandboxExecError, SandboxOutputLimitError
from sandbox_tools.injector.exec_remote import retry_timeouts
from sandbox_tools.sandboxes.base import ExecOutput, Sandbox, file_error_kind

log = logging.getLogger(__name__)

# The commands a file operation runs as the sandbox's user. Absolute paths and a fixed
# PATH: an agent that can write to a directory early in the image's PATH must not put
# its own `cat` in front of a root sandbox's file operations.
SHELL = "/bin/sh"
FIXED_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Only a regular file (or a new one) is written or read: a FIFO or a device at the path
# would hold the call until its timeout.
_REGULAR = (
    'if [ -e "$1" ] && [ ! -f "$1" ] && [ ! -d "$1" ]; then '
    'echo "$1: not a regular file" >&2; exit 1; fi; '
)
WRITE_SCRIPT = _REGULAR + 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
READ_SCRIPT = _REGULAR + 'exec cat -- "$1"'
FILE_TIMEOUT = 600  # one file operation, as inspect's Docker sandbox bounds its own
# What an exec's timeout runs in the sandbox, as inspect's Docker sandbox does: it ends
# the command's whole process group in the container (a timeout on the host only stops
# waiting), SIGKILL 5 s after SIGTERM.
TIMEOUT_COMMAND = "/usr/bin/timeout"
# How long past `timeout` the host waits for the in-sandbox timeout to end the command.
HOST_TIMEOUT_SLACK = 10

# The container runtime's own one-line refusal to start a command (runc's wording):
# `exec: "<path>": <reason>` with exit 126 or 127, before any process of the image ran.
_LAUNCH_FAILURE = re.compile(
    r'^OCI runtime exec failed: .*exec: "(?P<binary>[^"]*)": (?P<reason>.*)$', re.IGNORECASE
)


def launch_failure(result: ExecOutput) -> tuple[str, str] | None:
    """(binary, reason) when the container runtime refused to start the command: one line
    of its wording and its exit code. A program can print the same and exit so: what this
    decides is only how that command's own call ends (PermissionError), as in inspect's
    Docker sandbox; what the sandbox has is never learnt from it."""
    if result.returncode not in (126, 127) or len(result.stdout) + len(result.stderr) > 4096:
        return None
    lines = (result.stdout + result.stderr).decode(errors="replace").strip().splitlines()
    if len(lines) != 1:
        return None
    match = _LAUNCH_FAILURE.match(lines[0].strip())
    return (match["binary"], match["reason"].lower()) if match else None


def file_error(stderr: str, file: str) -> OSError | None:
    """inspect's exception for a failed file operation, from what `sh`/`cat` said; the
    file's name as the caller gave it is in the message (inspect's checks read it)."""
    said = stderr.strip()[:500]
    if "not a regular file" in said:  # our own script's refusal of a FIFO or device
        return OSError(errno.EINVAL, f"Not a regular file: {said}", file)
    kind = file_error_kind(said)
    return kind[0](kind[1], f"{os.strerror(kind[1])}: {said}", file) if kind else None


class ProviderEnvironment(SandboxEnvironment):
    """inspect's `SandboxEnvironment` on one of our providers.

    `working_dir` (absolute) is where relative paths and a relative `cwd` resolve, as in
    inspect's own sandboxes; None passes paths to the provider as they are.
    `user` is the sandbox's default user: files are written and read as that user when
    `shell_files` is set and the sandbox has a shell (so its permissions hold, and what
    a sample's files create belongs to it), through the provider's file API otherwise.
    `timeout_command`, where set, ends a timed-out command inside the sandbox.
    """

    shell_files = False
    timeout_command: str | None = None

    def __init__(
        self, sandbox: Sandbox, working_dir: str | None = None, user: str | None = None
    ) -> None:
        super().__init__()
        self.sandbox = sandbox
        self.working_dir = working_dir
        self.user = user
        # Which of our fixed programs (the shell, timeout) the sandbox has, once looked at.
        self._programs: dict[str, bool] = {}

    def default_polling_interval(self) -> float:
        """How often inspect's exec_remote client polls (its base default is 2 s; its own
        docker and local sandboxes use 0.2 s, and an exec here costs about as much)."""
        return 0.2

    def sandbox_path(self, file: str) -> str:
        """`file` as the sandbox sees it: relative to the working directory."""
        return posixpath.join(self.working_dir, file) if self.working_dir else file

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        """inspect's `exec`, on our provider.

        A relative `cwd` is taken from the working directory. With a `timeout`, the
        command runs under the sandbox's `timeout` (where it has one) so that its
        processes end with it; exit 124, or a signal's exit past the deadline, is a
        TimeoutError, as in inspect's Docker sandbox. A command the container runtime
        could not start for lack of permission is a PermissionError.

        `timeout_retry` (with a `timeout`), as inspect's docker sandbox: when the exec
        machinery timed out rather than the command (the provider raised a TimeoutError
        that is also a SandboxExecError: the Docker engine did not answer, or gave no
        exec slot, within its deadline), the command is run again, up to twice, given
        no more than 60 s and then 30 s. A command that itself ran past `timeout` is
        not run again, nor is any command when `timeout` is None. As with inspect's
        retry of a hung docker CLI, a command the engine had started before it stopped
        answering may then run twice.

        `concurrency` has no effect: inspect uses it to let a call skip its local
        throttles (`max_subprocesses`, which counts subprocesses of the host, and its
        docker sandbox's limit on concurrent docker CLI processes); our providers run no
        host subprocess per exec (the Docker engine's API over a socket, Modal's over
        the network). The docker_sdk provider's own bound, its engine's exec slots
        (`engine-concurrency`), is taken by every exec whatever this flag says.
        """
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        if cwd is not None:
            cwd = self.sandbox_path(cwd)
        try:
            result = await self._timed(cmd, input, cwd, env, user, timeout, timeout_retry)
        except SandboxOutputLimitError:
            raise OutputLimitExceededError(
                SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, None
            ) from None
        if len(result.stdout) > limit or len(result.stderr) > limit:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, None)
        return ExecResult(
            success=result.returncode == 0,
            returncode=result.returncode,
            stdout=result.stdout.decode(errors="replace"),
            stderr=result.stderr.decode(errors="replace"),
        )

    async def _timed(
        self,
        cmd: list[str],
        input: str | bytes | None,
        cwd: str | None,
        env: dict[str, str] | None,
        user: str | None,
        timeout: int | None,
        timeout_retry: bool,
    ) -> ExecOutput:
        wrapper = self.timeout_command
        # An image without `timeout` (distroless, scratch): the host's deadline alone.
        if timeout is None or wrapper is None or not await self.has_program(wrapper):
            result = await self._run(cmd, input, cwd, env, user, timeout, timeout_retry)
            return self._checked_launch(cmd, result)
        started = time.monotonic()
        wrapped = [wrapper, "-k", "5s", f"{timeout}s", *cmd]
        host_timeout = timeout + HOST_TIMEOUT_SLACK
        result = await self._run(wrapped, input, cwd, env, user, host_timeout, timeout_retry)
        elapsed = time.monotonic() - started
        # 124: GNU timeout's own code; 137 (after -k) and 143 (busybox) are also any
        # signal's, so they count only once the deadline has passed.
        if result.returncode == 124 or (result.returncode in (137, 143) and elapsed >= timeout):
            raise TimeoutError(f"Command timed out after {timeout} seconds")
        return self._checked_launch(cmd, result)

    @staticmethod
    def _checked_launch(cmd: list[str], result: ExecOutput) -> ExecOutput:
        refused = launch_failure(result)
        if refused is not None and "permission denied" in refused[1]:
            raise PermissionError(errno.EACCES, f"cannot execute {cmd[0]}", cmd[0])
        return result

    async def _run(
        self,
        cmd: list[str],
        input: str | bytes | None,
        cwd: str | None,
        env: dict[str, str] | None,
        user: str | None,
        timeout: int | None,
        timeout_retry: bool,
        max_output: int | None = None,
    ) -> ExecOutput:
        # inspect caps stdout and stderr each; ours caps both together, so twice.
        if max_output is None:
            max_output = 2 * SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        timeouts: list[int | None] = (
            [timeout]
            if timeout is None
            else [math.ceil(t) for t in retry_timeouts(timeout, timeout_retry)]
        )
        for attempt, seconds in enumerate(timeouts, 1):
            try:
                return await self.sandbox.exec(
                    cmd, input, cwd, env, user, seconds, max_output=max_output
                )
            except TimeoutError as exc:
                if not isinstance(exc, SandboxExecError) or attempt == len(timeouts):
                    raise
                log.info("retrying %s in %s after: %s", cmd[0], self.sandbox.name, exc)
        raise AssertionError("unreachable")

    # -- files -----------------------------------------------------------------------

    async def _shell(
        self, script: str, path: str, data: bytes | None, max_output: int
    ) -> ExecOutput | None:
        """`script` run by the sandbox's shell as its user, or None if it has no shell.
        Bounded in time as inspect bounds its own (a FIFO the agent put at the path would
        otherwise hold the call, and an engine slot, for ever)."""
        if not self.shell_files or not await self.has_program(SHELL):
            return None
        return await self._run(
            [SHELL, "-c", script, "sh", path],
            data,
            None,
            {"PATH": FIXED_PATH},
            self.user,
            FILE_TIMEOUT,
            False,
            max_output=max_output,
        )

    async def has_program(self, path: str) -> bool:
        """Whether the sandbox has `path`, asked once of the provider (never read from a
        command's output, which the agent's programs write). Without a way to look: yes."""
        if path not in self._programs:
            self._programs[path] = await self.provider_has(path)
        return self._programs[path]

    async def provider_has(self, path: str) -> bool:
        """The provider's own look at a path (assumed there where it has none)."""
        return True

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Written as the sandbox's user where it has a shell (`mkdir -p`, then `cat`),
        so a read-only file, a directory or a place the user may not write is refused
        as inspect refuses it; through the provider's file API where it has none."""
        data = contents.encode() if isinstance(contents, str) else contents
        path = self.sandbox_path(file)
        result = await self._shell(WRITE_SCRIPT, path, data, 1 << 20)
        if result is None:
            await self.provider_write_file(path, data, file)
            return
        if result.returncode != 0:
            said = (result.stderr or result.stdout).decode(errors="replace")
            raise file_error(said, file) or RuntimeError(f"failed to write {file}: {said}")

    async def provider_write_file(self, path: str, data: bytes, file: str) -> None:
        """The provider's own file API (no shell in the sandbox)."""
        await self.sandbox.write_file(path, data)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        """Read as the sandbox's user where it has a shell (`cat`), so a file the user
        may not read is a PermissionError; through the provider's file API otherwise."""
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        path = self.sandbox_path(file)
        try:
            result = await self._shell(READ_SCRIPT, path, None, limit + (1 << 20))
        except SandboxOutputLimitError:
            raise OutputLimitExceededError(
                SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None
            ) from None
        if result is None:
            data = await self.provider_read_file(path, file)
        elif result.returncode != 0:
            said = result.stderr.decode(errors="replace")
            raise file_error(said, file) or RuntimeError(f"failed to read {file}: {said}")
        else:
            data = result.stdout
        if len(data) > limit:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        return data.decode() if text else data

    async def provider_read_file(self, path: str, file: str) -> bytes:
        """The provider's own file API (no shell in the sandbox)."""
        try:
            return await self.sandbox.read_file(path)
        except IsADirectoryError:
            raise IsADirectoryError(errno.EISDIR, "Is a directory", file) from None
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", file) from None
