"""`tools exec-remote`: stream a command through exec_remote, from a runtime server on
this machine or injected into a fresh container of a matrix distribution or an image."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from typing import Annotated

import docker
import typer
from rich.table import Table

from sandbox_tools.cli.invocation import Invocation, invocation
from sandbox_tools.cli.output import err_console, quiet
from sandbox_tools.distro_matrix.docker_backend import DockerBackend
from sandbox_tools.errors import ConfigurationError
from sandbox_tools.injector.acquire import default_sources
from sandbox_tools.injector.exec_remote import (
    Completed,
    ExecRemoteOptions,
    StderrChunk,
    StdoutChunk,
    exec_remote,
)
from sandbox_tools.injector.inject import open_tool_support
from sandbox_tools.injector.jsonrpc_client import (
    RuntimeClient,
    RuntimeInfo,
    StdioRuntimeClient,
    connect_runtime,
)
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.injector.source_runtime import local_source_runtime
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.engines import docker_client
from sandbox_tools.sandboxes.local import LocalSandbox


async def _stream(
    client: RuntimeClient, command: str, timeout: float | None
) -> tuple[int, Completed, float]:
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
    assert completed is not None
    return process.pid, completed, time.monotonic() - started


def _summary(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for field, value in rows:
        table.add_row(field, value)
    return table


async def _exec_remote_local(command: str, timeout: float | None, server_dir: str) -> int:
    launch = local_source_runtime(server_dir)
    client = await connect_runtime(LocalSandbox(), launch.command, env=launch.env)
    try:
        info = RuntimeInfo.parse(await client.call("runtime_info"))
        pid, completed, elapsed = await _stream(client, command, timeout)
    finally:
        # Whatever ended the run (done, --timeout, Ctrl-C), the server and its processes
        # go with it: its directory is about to be deleted.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(client.call("sandbox_tools_shutdown")), 10)
        await client.aclose()
    transport = "persistent stdio" if isinstance(client, StdioRuntimeClient) else "exec per call"
    if quiet():
        return completed.exit_code
    err_console.print(
        _summary(
            "exec_remote via the local runtime server",
            [
                ("command", command),
                ("pid", str(pid)),
                ("exit code", f"{completed.exit_code}" + (" (killed)" if completed.killed else "")),
                ("seconds", f"{elapsed:.3f}"),
                ("runtime", f"{info.version} build {info.build_id} on {info.platform}"),
                ("server pid", str(info.pid)),
                ("transport", transport),
            ],
        )
    )
    return completed.exit_code


async def _exec_remote_in_container(
    run: Invocation,
    command: str,
    timeout: float | None,
    distro: str | None,
    real_image: str | None,
) -> int:
    engine = docker_client(run.settings.engine_concurrency)
    if real_image is not None:
        try:
            engine.images.get(real_image)
        except docker.errors.ImageNotFound:
            raise ConfigurationError(
                f"image {real_image!r} is not on the Docker engine",
                remedy=f"docker pull {real_image} (or build it), then run again",
            ) from None
        image, source, target = real_image, "the engine", real_image
    else:
        assert distro is not None
        arch = Arch.parse(os.uname().machine)
        backend = DockerBackend(engine, run.containers, run.roots)
        image, source, target = await asyncio.to_thread(backend.matrix_image, distro, arch)
    with RunningContainer(engine, image, policy=run.containers) as container:
        started = time.monotonic()
        # The sources under this command's settings (flags included), resolved once by
        # the root callback: the injector below reads no settings of its own.
        options = InjectionOptions(sources=default_sources(run.settings))
        async with open_tool_support(container.sandbox, options=options) as support:
            injected = time.monotonic() - started
            pid, completed, elapsed = await _stream(support.client, command, timeout)
    recon = support.recon
    provenance = support.artifact.provenance.value if support.artifact.provenance else "given"
    if quiet():
        return completed.exit_code
    err_console.print(
        _summary(
            f"exec_remote injected into a fresh {target} container",
            [
                ("command", command),
                ("container", f"{container.name} ({image}, from {source})"),
                (
                    "sandbox",
                    f"{recon.os_name}, {recon.platform}, libc {recon.libc}, "
                    f"user {recon.user or recon.uid}",
                ),
                (
                    "artifact",
                    f"{support.artifact.name} ({provenance}, "
                    f"sha256 {support.artifact.sha256[:16]}…)",
                ),
                (
                    "installed at",
                    f"{support.install_dir} (verified, {injected:.2f}s incl. first start)",
                ),
                ("pid / exit code", f"{pid} / {completed.exit_code}"),
                ("seconds", f"{elapsed:.3f}"),
            ],
        )
    )
    return completed.exit_code


def exec_remote_command(
    ctx: typer.Context,
    command: Annotated[
        str, typer.Argument(metavar="COMMAND", help="Shell command to run through exec_remote.")
    ],
    timeout: Annotated[
        float | None,
        typer.Option(metavar="SECONDS", help="Kill the command after this many seconds."),
    ] = None,
    distro: Annotated[
        str | None,
        typer.Option(
            metavar="DISTRO",
            help="Run in a fresh container of this matrix distribution (e.g. debian-12), "
            "injecting the built artifact.",
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(
            metavar="IMAGE",
            help="Run in a fresh container of this image (present on the engine: never "
            "pulled), injecting the built artifact. Default: a runtime server on this machine.",
        ),
    ] = None,
) -> None:
    """Stream COMMAND through exec_remote: locally, or injected into a fresh container."""
    if distro is not None and image is not None:
        raise ConfigurationError("--distro and --image exclude each other")
    if distro is not None or image is not None:
        code = asyncio.run(
            _exec_remote_in_container(invocation(ctx), command, timeout, distro, image)
        )
    else:
        with tempfile.TemporaryDirectory(prefix="sandbox-tools-") as server_dir:
            code = asyncio.run(_exec_remote_local(command, timeout, server_dir))
    raise typer.Exit(code)
