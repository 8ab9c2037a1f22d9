"""Any inspect_ai sandbox environment as a sandbox-tools provider.

inspect_ai's exec returns text, so command output is UTF-8 here (what the injector and
the runtime's JSON-RPC produce); files stay binary through read_file/write_file.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandbox_tools.errors import SandboxExecError, SandboxOutputLimitError
from sandbox_tools.sandboxes.base import (
    DEFAULT_EXEC_OUTPUT_LIMIT,
    DEFAULT_EXEC_TIMEOUT,
    ExecOutput,
    Sandbox,
    as_bytes,
)


def describe(environment: Any, name: str | None = None) -> str:
    """How messages name an inspect sandbox: its name in the sample and its kind (inspect
    hands tools a proxy that records events; the kind is that of what it wraps)."""
    inner = getattr(environment, "_sandbox", environment)
    return f"inspect sandbox {name or 'default'!r} ({type(inner).__name__})"


def docker_cli_on_this_host(environ: Mapping[str, str], home: Path | None = None) -> bool:
    """Whether the docker CLI (which inspect's docker sandbox drives) reaches an engine
    on this host: no DOCKER_HOST but a Unix socket, and the default context. Anything
    else (a TCP or SSH host, another context) may be remote: False, the safe answer
    (add-ons then travel compressed)."""
    host = environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        return False
    context = environ.get("DOCKER_CONTEXT")
    if context is None and not host:
        config = Path(environ.get("DOCKER_CONFIG") or (home or Path.home()) / ".docker")
        try:
            context = json.loads((config / "config.json").read_text()).get("currentContext")
        except (OSError, ValueError, AttributeError):
            context = None
    return context in (None, "", "default")


class InspectSandbox(Sandbox):
    """`environment` as a provider. `user` is whom commands run as when a call names
    nobody (None: the sandbox's default user); the tools pass "root" where the sandbox
    allows it, so the runtime is installed and run by root, out of the agent's reach.
    `concurrency=False` asks inspect to let every exec skip its `concurrency()` throttle
    (exec_remote's option of that name). `cwd` is where commands run that name no
    directory (None: the sandbox's own choice, which for inspect's `local` sandbox is the
    sample's directory, gone once the sample is cleaned up)."""

    def __init__(
        self,
        environment: Any,
        name: str | None = None,
        user: str | None = None,
        concurrency: bool = True,
        cwd: str | None = None,
    ) -> None:
        self.environment = environment
        self.user = user
        self.concurrency = concurrency
        self.cwd = cwd
        # A readable name for messages; the injector keys its state by object identity.
        self.name = name or describe(environment)

    def _wrapped(self) -> tuple[Any, Sandbox | None]:
        """The environment inspect's event-recording proxy wraps, and our own Sandbox
        inside it if it is one of ours (docker_sdk, modal)."""
        inner = getattr(self.environment, "_sandbox", self.environment)
        ours = getattr(inner, "sandbox", None)
        return inner, ours if isinstance(ours, Sandbox) else None

    def mounted_read_only(self, target: str) -> bool:
        _, ours = self._wrapped()
        return ours is not None and ours.mounted_read_only(target)

    @property
    def bytes_are_cheap(self) -> bool:
        """Ours (docker_sdk, modal) say for themselves; inspect's `local` is the host, and
        its `docker` is cheap where the docker CLI talks to an engine on this host."""
        inner, ours = self._wrapped()
        if ours is not None:
            return ours.bytes_are_cheap
        kind = type(inner).__name__
        if kind == "LocalSandboxEnvironment":
            return True
        return kind == "DockerSandboxEnvironment" and docker_cli_on_this_host(os.environ)

    async def exec(
        self,
        cmd: list[str],
        input: bytes | memoryview | str | None = None,
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
                cwd=cwd or self.cwd,
                env=dict(env or {}),
                user=user or self.user,
                timeout=math.ceil(timeout) if timeout else None,
                timeout_retry=False,  # the injector and exec_remote choose their own retries
                **({} if self.concurrency else {"concurrency": False}),
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

    def exec_output_limit(self) -> int:
        """inspect's exec output limit now (a context variable: the task may set it)."""
        from inspect_ai.util._sandbox.limits import SandboxEnvironmentLimits

        return int(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE)

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """inspect's write_file writes as the sandbox's default user (its docker sandbox)
        or as whoever its provider chooses; where this adapter runs commands as another
        user, the file is written by that user, so it owns what it must then change."""
        if self.user is None:
            await self.environment.write_file(path, data)
            if mode == 0o644:
                return
            command = ["chmod", f"{mode:o}", path]
        else:
            command = ["sh", "-c", 'cat > "$1" && chmod "$2" "$1"', "write", path, f"{mode:o}"]
        done = await self.exec(command, input=data if self.user is not None else None)
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip()[-300:]
            raise SandboxExecError(
                f"cannot write {path} with mode {mode:o} in {self.name}: "
                f"{why or f'exit {done.returncode}'}"
            )

    async def read_file(self, path: str) -> bytes:
        data = await self.environment.read_file(path, text=False)
        return bytes(data)
