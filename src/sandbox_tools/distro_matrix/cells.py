"""One cell of the matrix, whatever runs it: a fresh sandbox, the real injector, the
tools called for real. A backend (one per engine kind, in its own module) says where a
row's image comes from, which scenarios it cannot run, and how to open a sandbox."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import docker.errors

from sandbox_tools.artifacts import Artifact
from sandbox_tools.distro_matrix.matrix import Distro, Scenario
from sandbox_tools.errors import SandboxInjectionError, SandboxToolsError
from sandbox_tools.injector.exec_remote import ExecRemoteOptions, exec_remote
from sandbox_tools.injector.inject import open_tool_support
from sandbox_tools.injector.jsonrpc_client import RuntimeInfo
from sandbox_tools.injector.tool_clients import bash_session, new_bash_session, text_editor
from sandbox_tools.sandboxes.base import Sandbox
from sandbox_tools.validation import CellResult, CellStatus

SandboxFactory = Callable[[], contextlib.AbstractAsyncContextManager[Sandbox]]


@dataclass(frozen=True)
class PreparedRow:
    """A row ready to run on one backend: where its image came from, which scenarios it
    cannot run (and why), and how to open a fresh sandbox for a scenario."""

    source: str
    skip: Callable[[Scenario], str | None]
    sandbox: Callable[[Scenario], SandboxFactory]


class Backend(Protocol):
    """How one engine runs rows (Docker, Modal)."""

    def prepare(self, artifact: Artifact, distro: Distro) -> Awaitable[PreparedRow]: ...


def no_sandbox() -> SandboxFactory:
    raise AssertionError("a skipped row opens no sandbox")


class CheckFailed(Exception):
    """A tool call in a cell answered, but not with what the check expects."""


async def _exercise(
    sandbox: Sandbox,
    artifact: Artifact,
    scenario: Scenario,
    checks: list[str],
    shell: bool = True,
) -> None:
    async with open_tool_support(sandbox, artifact=artifact) as support:
        client = support.client
        info = RuntimeInfo.parse(await client.call("runtime_info"))
        if info.build_id != artifact.build_id:
            raise CheckFailed(f"runtime_info build id {info.build_id}")
        checks.append("version+runtime_info")
        if not shell:
            return  # the tools below run commands through /bin/sh, which is not there
        result = await exec_remote(client, "echo out; echo err >&2; exit 3", stream=False)
        if (result.returncode, result.stdout, result.stderr) != (3, "out\n", "err\n"):
            raise CheckFailed(f"exec_remote returned {result}")
        process = await exec_remote(client, "sleep 300", ExecRemoteOptions(poll_interval=1))
        await process.kill()
        if not (await process.wait()).killed:
            raise CheckFailed("exec_remote kill did not report killed")
        checks.append("exec_remote")
        session = await new_bash_session(client)
        if await bash_session(client, session, "echo $((6 * 7))\n") != "42\n":
            raise CheckFailed("bash_session round trip failed")
        checks.append("bash_session")
        path = f"{support.install_dir}/validate.txt"
        await text_editor(client, "create", path, file_text="alpha\n")
        await text_editor(client, "str_replace", path, old_str="alpha", new_str="beta")
        if not (await text_editor(client, "view", path)).endswith("     1\tbeta\n"):
            raise CheckFailed("text_editor round trip failed")
        checks.append("text_editor")


async def run_cell(
    open_sandbox: SandboxFactory,
    artifact: Artifact,
    distro: Distro,
    scenario: Scenario,
    source: str,
) -> CellResult:
    """One cell, whatever the backend: `open_sandbox` gives a fresh sandbox of the row's
    image with the scenario's options and removes it afterwards."""
    result = CellResult(
        artifact.name,
        artifact.platform,
        distro.name,
        scenario.name,
        CellStatus.FAILED,
        source=source,
    )
    started = time.monotonic()
    try:
        async with open_sandbox() as sandbox:
            try:
                await _exercise(sandbox, artifact, scenario, result.checks, distro.shell)
                failure: BaseException | None = None
            except SandboxInjectionError as exc:
                failure = exc
            if scenario.expect_failure:
                if isinstance(failure, SandboxInjectionError) and "tried" in str(failure):
                    result.status = CellStatus.PASSED
                    result.detail = f"failed as expected: {failure}"
                else:
                    result.detail = "expected a SandboxInjectionError naming the directories"
            elif failure is not None:
                raise failure
            else:
                result.status = CellStatus.PASSED
    except (
        SandboxToolsError,
        CheckFailed,
        docker.errors.DockerException,
        OSError,
        TimeoutError,
    ) as exc:
        result.detail = str(exc)[:2000]
    result.seconds = time.monotonic() - started
    return result
