"""One of our providers as an inspect_ai sandbox environment.

inspect_ai talks to sandboxes through `SandboxEnvironment`; our providers (`Sandbox`)
already do everything it needs, with bounded output and timeouts. This class maps
one onto the other once, so each registered environment (`modal`, `docker_sdk`) only
says how its sandboxes are created and removed.
"""

from __future__ import annotations

import logging
import math
from typing import Literal, overload

from inspect_ai.util import ExecResult, OutputLimitExceededError, SandboxEnvironment
from inspect_ai.util._sandbox.limits import SandboxEnvironmentLimits

from sandbox_tools.errors import SandboxExecError, SandboxOutputLimitError
from sandbox_tools.injector.exec_remote import retry_timeouts
from sandbox_tools.sandboxes.base import ExecOutput, Sandbox

log = logging.getLogger(__name__)


class ProviderEnvironment(SandboxEnvironment):
    def __init__(self, sandbox: Sandbox) -> None:
        super().__init__()
        self.sandbox = sandbox

    def default_polling_interval(self) -> float:
        """How often inspect's exec_remote client polls (its base default is 2 s; its own
        docker and local sandboxes use 0.2 s, and an exec here costs about as much)."""
        return 0.2

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

        `timeout_retry` (with a `timeout`), as inspect's docker sandbox: when the exec
        machinery timed out rather than the command (the provider raised a TimeoutError
        that is also a SandboxExecError: the Docker engine did not answer, or gave no
        exec slot, within its deadline), the command is run again, up to twice, given
        no more than 60 s and then 30 s. A command that itself ran past `timeout` is
        not run again (inspect's in-container timeout ends such a command with exit 124
        and TimeoutError, never retried), nor is any command when `timeout` is None.
        As with inspect's retry of a hung docker CLI, a command the engine had started
        before it stopped answering may then run twice.

        `concurrency` has no effect: inspect uses it to let a call skip its local
        throttles (`max_subprocesses`, which counts subprocesses of the host, and its
        docker sandbox's limit on concurrent docker CLI processes); our providers run no
        host subprocess per exec (the Docker engine's API over a socket, Modal's over
        the network). The docker_sdk provider's own bound, its engine's exec slots
        (`engine-concurrency`), is taken by every exec whatever this flag says.
        """
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        try:
            result = await self._run(cmd, input, cwd, env, user, timeout, timeout_retry)
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

    async def _run(
        self,
        cmd: list[str],
        input: str | bytes | None,
        cwd: str | None,
        env: dict[str, str] | None,
        user: str | None,
        timeout: int | None,
        timeout_retry: bool,
    ) -> ExecOutput:
        # inspect caps stdout and stderr each; ours caps both together, so twice.
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

    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode() if isinstance(contents, str) else contents
        await self.sandbox.write_file(file, data)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        data = await self.sandbox.read_file(file)
        if len(data) > SandboxEnvironmentLimits.MAX_READ_FILE_SIZE:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        return data.decode() if text else data
