"""Any inspect_ai sandbox environment as a sandbox-tools provider.

inspect_ai's exec returns text, so command output is UTF-8 here (what the injector and
the runtime's JSON-RPC produce); files stay binary through read_file/write_file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sandbox_tools.errors import SandboxOutputLimitError
from sandbox_tools.sandboxes.base import (
    DEFAULT_EXEC_OUTPUT_LIMIT,
    DEFAULT_EXEC_TIMEOUT,
    ExecOutput,
    Sandbox,
    as_bytes,
)


class InspectSandbox(Sandbox):
    def __init__(self, environment: Any, name: str | None = None) -> None:
        self.environment = environment
        # A readable name for messages; the injector keys its state by object identity.
        self.name = name or f"inspect:{type(environment).__name__}:{id(environment):x}"

    async def exec(
        self,
        cmd: list[str],
        input: bytes | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout: float | None = DEFAULT_EXEC_TIMEOUT,
        max_output: int = DEFAULT_EXEC_OUTPUT_LIMIT,
    ) -> ExecOutput:
        # inspect's providers cap an exec's output themselves (10 MiB by default) and
        # raise their OutputLimitExceededError; the cap here bounds what we keep.
        try:
            result = await self.environment.exec(
                cmd,
                input=as_bytes(input),
                cwd=cwd,
                env=dict(env or {}),
                user=user,
                timeout=math.ceil(timeout) if timeout else None,
                timeout_retry=False,  # the injector and exec_remote choose their own retries
            )
        except Exception as exc:
            if type(exc).__name__ == "OutputLimitExceededError":
                raise SandboxOutputLimitError(
                    f"{cmd[0]} in {self.name} printed more than inspect's exec output limit"
                ) from None
            raise
        stdout, stderr = result.stdout.encode(), result.stderr.encode()
        if len(stdout) + len(stderr) > max_output:
            raise SandboxOutputLimitError(
                f"{cmd[0]} in {self.name} printed more than {max_output} bytes"
            )
        return ExecOutput(int(result.returncode), stdout, stderr)

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        await self.environment.write_file(path, data)
        if mode != 0o644:
            changed = await self.exec(["chmod", f"{mode:o}", path])
            if changed.returncode != 0:
                raise PermissionError(changed.stderr.decode(errors="replace").strip() or path)

    async def read_file(self, path: str) -> bytes:
        data = await self.environment.read_file(path, text=False)
        return bytes(data)
