"""`tools mcp`: serve containers as sandboxes to an MCP client on stdio."""

from __future__ import annotations

import logging
import stat
from pathlib import Path
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
    attach_with_mounts: Annotated[
        list[str] | None,
        typer.Option(
            "--attach-with-mounts",
            metavar="NAME",
            help="As --attach, for a container whose bind mounts and volumes the agent may "
            "read and change (a project directory): attach refuses mounts otherwise.",
        ),
    ] = None,
    http: Annotated[
        int | None,
        typer.Option(
            "--http",
            metavar="PORT",
            min=1,
            max=65535,
            help="Serve MCP's streamable HTTP on 127.0.0.1:PORT (path /mcp) instead of "
            "stdio; needs --token-file.",
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            metavar="FILE",
            help="With --http: the secret clients send as `Authorization: Bearer <it>`, "
            "at least 32 characters, in a file only its owner can read.",
        ),
    ] = None,
) -> None:
    """Serve containers as sandboxes to an MCP client (a coding agent), on stdio or HTTP.

    Containers made from local images, or running ones listed with --attach.

    Each gets bash, a file editor, long-running jobs and a headless browser.

    Made containers go when the client disconnects (stdio) or the server ends (HTTP).

    Reads no pyproject.toml: settings come from the environment. See docs/MCP_GATEWAY.md.
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

    listener = None
    if http is not None or token_file is not None:
        from sandbox_tools.mcp_gateway.server import HttpListener

        listener = HttpListener(http or 0, read_token(http, token_file))
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
        mounts_trusted=attach_with_mounts or (),
        http=listener,
        log_level=level,
    )


# The least a bearer token holds: it stands for the user's Docker engine.
MIN_TOKEN_CHARS = 32


def read_token(port: int | None, token_file: Path | None) -> str:
    """The HTTP transport's token, from a file only its owner may read: every local user
    can reach a loopback port, and whoever holds the token drives the Docker engine."""
    if port is None or token_file is None:
        raise ConfigurationError(
            "--http and --token-file go together",
            remedy="tools mcp --http 8765 --token-file ~/.config/sandbox-tools/mcp-token",
        )
    try:
        mode = token_file.stat().st_mode
        token = token_file.read_text().strip()
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read the token file {token_file}: {exc.strerror}",
            remedy="(umask 077 && openssl rand -hex 32 > FILE)",
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigurationError(
            f"the token file {token_file} can be read by others (mode {stat.filemode(mode)})",
            remedy=f"chmod 600 {token_file}",
        )
    if len(token) < MIN_TOKEN_CHARS or not token.isprintable() or " " in token:
        raise ConfigurationError(
            f"the token in {token_file} must be at least {MIN_TOKEN_CHARS} printable "
            "characters without spaces",
            remedy="(umask 077 && openssl rand -hex 32 > FILE)",
        )
    return token
