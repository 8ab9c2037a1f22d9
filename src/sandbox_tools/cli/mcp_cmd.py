"""`tools mcp`: serve containers as sandboxes to an MCP client on stdio."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from sandbox_tools.cli.invocation import invocation
from sandbox_tools.cli.output import humans_to_stderr, quiet, verbose
from sandbox_tools.errors import ConfigurationError


def mcp_command(
    ctx: typer.Context,
    attach: Annotated[
        list[str] | None,
        typer.Option(
            "--attach",
            metavar="NAME",
            help="A running container sandbox_attach may use, by its exact name or full id "
            "(repeat for more). No other container is ever touched.",
        ),
    ] = None,
) -> None:
    """Serve containers as sandboxes to an MCP client (a coding agent) on stdio.

    Containers made from local images, or the running ones named with --attach, each
    with bash, a file editor and long-running jobs. Started by the client (its server
    configuration); ends when the client closes stdin, removing the containers it made.
    Reads no pyproject.toml: settings come from the environment only. See
    docs/MCP_GATEWAY.md.
    """
    try:
        import mcp  # noqa: F401  (the optional extra)
    except ImportError:
        raise ConfigurationError(
            "`tools mcp` needs the `mcp` package",
            remedy="pip install 'sandbox-tools[mcp]'",
        ) from None
    from sandbox_tools.injector.acquire import default_sources
    from sandbox_tools.injector.options import InjectionOptions
    from sandbox_tools.mcp_gateway.server import run_gateway
    from sandbox_tools.sandboxes.engines import docker_client

    humans_to_stderr()  # stdout carries the protocol alone (--verbose echoes containers)
    run = invocation(ctx)
    settings = run.settings
    level = logging.WARNING if quiet() else logging.DEBUG if verbose() else logging.INFO
    run_gateway(
        lambda: docker_client(settings.engine_concurrency),
        # The sources under this command's settings, resolved once by the root callback.
        InjectionOptions(sources=default_sources(settings)),
        run.containers,
        attachable=attach or (),
        log_level=level,
    )
