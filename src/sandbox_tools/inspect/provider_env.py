"""One of our providers as an inspect_ai sandbox environment.

inspect_ai talks to sandboxes through `SandboxEnvironment`; our providers (`Sandbox`)
already do everything it needs, with bounded output and timeouts. This class maps
one onto the other once, so each registered environment (`modal`, `docker_sdk`) only
says how its sandboxes are created and removed.
"""

from __future__ import annotations

from typing import Literal, overload

from inspect_ai.util import ExecResult, OutputLimitExceededError, SandboxEnvironment
from inspect_ai.util._sandbox.limits import SandboxEnvironmentLimits

from sandbox_tools.errors import SandboxOutputLimitError
from sandbox_tools.sandboxes.base import Sandbox


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
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        try:
            # inspect caps stdout and stderr each; ours caps both together, so twice.
            result = await self.sandbox.exec(
                cmd, input, cwd, env, user, timeout, max_output=2 * limit
            )
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
