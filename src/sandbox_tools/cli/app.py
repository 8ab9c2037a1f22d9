"""`tools`: the entry point. Expected failures print a sentence, never a traceback."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from sandbox_tools import __version__
from sandbox_tools.cli.build_cmd import build_command
from sandbox_tools.cli.validate_cmd import validate_command
from sandbox_tools.errors import SandboxToolsError
from sandbox_tools.injector.exec_remote import (
    Completed,
    ExecRemoteOptions,
    StderrChunk,
    StdoutChunk,
    exec_remote,
)
from sandbox_tools.injector.jsonrpc_client import StdioRuntimeClient, connect_runtime
from sandbox_tools.injector.source_runtime import local_source_runtime
from sandbox_tools.sandboxes.local import LocalSandbox

app = typer.Typer(
    name="tools",
    help="Build, validate, release and inject sandbox-tools' in-container runtime.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)


def _version_callback(value: bool) -> None:
    if value:
        console.print(f"sandbox-tools {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version_callback,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Build, validate, release and inject sandbox-tools' in-container runtime."""


async def _exec_remote_local(command: str, timeout: float | None, server_dir: str) -> int:
    launch = local_source_runtime(server_dir)
    client = await connect_runtime(LocalSandbox(), launch.command, env=launch.env)
    try:
        info = await client.call("runtime_info")
        started = time.monotonic()
        process = await exec_remote(client, command, ExecRemoteOptions(timeout=timeout))
        completed: Completed | None = None
        async for event in process.events():
            if isinstance(event, StdoutChunk):
                sys.stdout.write(event.data)
                sys.stdout.flush()
            elif isinstance(event, StderrChunk):
                sys.stderr.write(event.data)
                sys.stderr.flush()
            else:
                completed = event
        elapsed = time.monotonic() - started
        await client.call("sandbox_tools_shutdown")
    finally:
        await client.aclose()
    assert completed is not None
    transport = "persistent stdio" if isinstance(client, StdioRuntimeClient) else "exec per call"
    table = Table(title="exec_remote via the local runtime server", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for field, value in (
        ("command", command),
        ("pid", str(process.pid)),
        ("exit code", f"{completed.exit_code}" + (" (killed)" if completed.killed else "")),
        ("seconds", f"{elapsed:.3f}"),
        ("runtime", f"{info['version']} build {info['build_id']} on {info['platform']}"),
        ("server pid", str(info["pid"])),
        ("transport", transport),
    ):
        table.add_row(field, value)
    console.print(table)
    return completed.exit_code


@app.command("exec-remote")
def exec_remote_command(
    command: Annotated[str, typer.Argument(help="Shell command to run through exec_remote.")],
    timeout: Annotated[
        float | None, typer.Option(help="Kill the command after this many seconds.")
    ] = None,
) -> None:
    """Start a runtime server on this machine and stream COMMAND through exec_remote."""
    with tempfile.TemporaryDirectory(prefix="sandbox-tools-") as server_dir:
        code = asyncio.run(_exec_remote_local(command, timeout, server_dir))
    raise typer.Exit(code)


app.command("build")(build_command)
app.command("validate")(validate_command)


def main() -> None:
    try:
        app()
    except SandboxToolsError as exc:
        err_console.print(f"[bold red]error:[/] {exc.message}", highlight=False)
        if exc.remedy:
            err_console.print(f"[bold]what to do:[/] {exc.remedy}", highlight=False)
        raise SystemExit(exc.exit_code) from None
    except TimeoutError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise SystemExit(124) from None
