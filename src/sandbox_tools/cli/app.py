"""`tools`: the entry point. Expected failures print a sentence, never a traceback."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from typing import Annotated, Any

import typer
from rich.markup import escape

from sandbox_tools import __version__, settings
from sandbox_tools.cli.build_cmd import build_command
from sandbox_tools.cli.exec_remote_cmd import exec_remote_command
from sandbox_tools.cli.invocation import Invocation, invocation
from sandbox_tools.cli.manifest_cmd import manifest_app
from sandbox_tools.cli.mcp_cmd import mcp_command
from sandbox_tools.cli.output import (
    Verbosity,
    configure,
    console,
    err_console,
    error_document,
    json_printed,
    notes,
)
from sandbox_tools.cli.release_cmd import (
    bundle_app,
    fetch_command,
    release_command,
    wheel_command,
)
from sandbox_tools.cli.validate_cmd import validate_command
from sandbox_tools.errors import ConfigurationError, SandboxToolsError

INTERNAL_ERROR_EXIT = 70  # EX_SOFTWARE: a bug of ours, not bad input
INTERRUPTED_EXIT = 130
TIMEOUT_EXIT = 124
# Every code the CLI exits with: shown in `--help`, and docs/CLI.md's table must agree
# (tests/unit/test_cli_bad_input.py checks both against the error classes).
EXIT_CODES: tuple[tuple[str, str], ...] = (
    ("0", "done"),
    ("1", "a check failed (a validate cell, a static check)"),
    ("2", "bad input"),
    ("3", "no Docker engine"),
    ("4-8", "sandbox exec, injection, runtime transport, runtime error, tool error"),
    ("10", "build failed"),
    ("11, 12, 14", "release refused, verification failed, publishing failed"),
    ("13", "fetch failed"),
    ("15", "validate: nothing of what was asked for passed"),
    (str(INTERNAL_ERROR_EXIT), "internal error (a bug: rerun with --debug)"),
    (str(TIMEOUT_EXIT), "timeout"),
    (str(INTERRUPTED_EXIT), "interrupted"),
)


def human_metavars(command: Any) -> None:
    """Help shows what to type, not Python types: typer labels an option without a
    metavar `<bool>`, `<str>`, `<list[str]>`, `<float>` (the built-in --help too). A flag
    gets none; any other value the option's name in capitals, as argparse does (`--arch
    ARCH`). Options given a metavar of their own keep it."""
    help_option = command.get_help_option(typer.Context(command))
    if help_option is not None:
        help_option.metavar = ""
    for param in command.params:
        if param.param_type_name == "argument":
            # Its name is already in the first column; typer adds a `<str>` column.
            param.display_type_rich = lambda ctx: None
        if param.metavar is not None:
            continue
        if getattr(param, "is_flag", False):
            param.metavar = ""
        elif getattr(param, "type_descriptor", None) is None or not (
            param.type_descriptor.is_choice
        ):
            param.metavar = (param.name or "value").upper()
    for sub in getattr(command, "commands", {}).values():
        human_metavars(sub)


class _Tools(typer.Typer):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        command = typer.main.get_command(self)
        human_metavars(command)
        return command(*args, **kwargs)


app = _Tools(
    name="tools",
    help="Build, validate, release and inject sandbox-tools' in-container runtime.",
    epilog="Exit codes: " + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES) + ".",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
)


# Commands that read no pyproject.toml (see the root callback).
WITHOUT_PROJECT_FILE = frozenset({"mcp"})
DEBUG_ENV = next(s.env for s in settings.SETTINGS if s.key == "debug")


def _version_callback(value: bool) -> None:
    if value:
        console.print(f"sandbox-tools {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version_callback,
            is_eager=True,
            help="Print the version and exit.",
            metavar="",
        ),
    ] = False,
    quiet_flag: Annotated[
        bool,
        typer.Option(
            "--quiet",
            "-q",
            help="No progress or notes: results, --json and errors only.",
            metavar="",
        ),
    ] = False,
    verbose_flag: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="More detail, e.g. the builder's output.", metavar=""),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help=f"Show the traceback of an internal error (also {DEBUG_ENV}=1).",
            metavar="",
        ),
    ] = False,
) -> None:
    """Build, validate, release and inject sandbox-tools' in-container runtime."""
    if quiet_flag and verbose_flag:
        raise ConfigurationError("--quiet and --verbose exclude each other")
    configure(
        Verbosity.QUIET if quiet_flag else Verbosity.VERBOSE if verbose_flag else Verbosity.NORMAL
    )
    # A command a client starts in whatever directory it opened (`mcp`: a cloned
    # repository, say) reads no project file: the repository must not choose the
    # runtime it injects, or keep the containers it makes.
    project = ctx.invoked_subcommand not in WITHOUT_PROJECT_FILE
    resolved = settings.with_flags(
        settings.load_settings(read_project=project), {"debug": debug or None}
    )
    ctx.obj = Invocation(resolved, echo=_echo_line if verbose_flag else None)


@app.command("cleanup")
def cleanup_command(
    ctx: typer.Context,
    modal: Annotated[
        bool,
        typer.Option("--modal", help="Terminate leftover Modal sandboxes of ours.", metavar=""),
    ] = False,
    app_name: Annotated[
        str, typer.Option("--app", metavar="APP", help="Modal app the sandboxes run in.")
    ] = "sandbox-tools",
    mcp: Annotated[
        bool,
        typer.Option(
            "--mcp",
            help="Remove the containers `tools mcp` servers of this host made and left "
            "behind when killed (never kept ones, nor those of a server still running).",
            metavar="",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="With --mcp: list what would go, remove nothing.", metavar=""
        ),
    ] = False,
) -> None:
    """Remove sandboxes an interrupted run left behind."""
    if not modal and not mcp:
        raise ConfigurationError(
            "say what to clean up", remedy="tools cleanup --mcp, or tools cleanup --modal"
        )
    if mcp:
        from sandbox_tools.mcp_gateway.cleanup import cleanup_leftovers as mcp_leftovers
        from sandbox_tools.sandboxes.engines import docker_client

        client = docker_client(invocation(ctx).settings.engine_concurrency)
        found = mcp_leftovers(
            client,
            dry_run=dry_run,
            say=lambda one: console.print(f"{one.name} ({one.sandbox}): {one.verdict}"),
        )
        if not dry_run:
            removed = sum(one.removed for one in found)
            console.print(f"{removed} leftover container(s) of MCP gateways removed")
    if modal:
        from sandbox_tools.sandboxes.modal import cleanup_leftovers

        terminated = asyncio.run(cleanup_leftovers(app_name))
        for sandbox_id in terminated:
            console.print(f"terminated {sandbox_id}")
        console.print(f"{len(terminated)} leftover Modal sandbox(es) terminated in app {app_name}")


app.command("build")(build_command)
app.command("exec-remote")(exec_remote_command)
app.command("mcp")(mcp_command)
app.command("validate")(validate_command)
app.add_typer(manifest_app, name="manifest")
app.command("release")(release_command)
app.command("fetch")(fetch_command)
app.add_typer(bundle_app, name="bundle")
app.command("wheel")(wheel_command)


def _echo_line(line: str) -> None:
    notes.print(line, markup=False, highlight=False, soft_wrap=True)


def _say(label: str, text: str) -> None:
    # Messages carry paths and extras like [modal]: printed literally, never as markup,
    # and never wrapped (digests and URLs must stay copyable).
    line = f"[bold]{label}[/] {escape(text)}" if text else f"[bold]{label}[/]"
    err_console.print(line, highlight=False, soft_wrap=True)


def _debugging() -> bool:
    """The `debug` setting (--debug, or SANDBOX_TOOLS_DEBUG as any yes/no value); off if
    the settings themselves cannot be read, so the one-line report still comes out. Read
    here, after the command, because an error may come before the root callback ran."""
    root_flags = itertools.takewhile(lambda arg: arg.startswith("-"), sys.argv[1:])
    if "--debug" in root_flags:  # before the command's name: the root's own flag
        return True
    try:
        return settings.load_settings().debug
    except ConfigurationError:
        return False


def _json_error(message: str, remedy: str, exit_code: int) -> None:
    """`--json`: a failure before the command's own document is a JSON document too, so a
    script reading stdout never gets nothing."""
    if "--json" in sys.argv[1:] and not json_printed():
        sys.stdout.write(json.dumps(error_document(message, remedy, exit_code), indent=2) + "\n")
        sys.stdout.flush()


def _run() -> None:
    if "--json" not in sys.argv[1:]:
        app()
        return
    # Usage errors (`--jobs 0`) come back as exceptions instead of being printed by
    # click, so that they get a JSON document too.
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as exc:
        exit_code = int(getattr(exc, "exit_code", 2))
        _say("[red]error:[/]", exc.format_message())
        _json_error(exc.format_message(), "", exit_code)
        raise SystemExit(exit_code) from None
    except typer.Abort:
        raise KeyboardInterrupt from None
    if code == INTERRUPTED_EXIT:
        raise KeyboardInterrupt
    raise SystemExit(code if isinstance(code, int) else 0)


def main() -> None:
    """The console script: every failure is one clear line and a code of EXIT_CODES."""
    try:
        _run()
    except SandboxToolsError as exc:
        _say("[red]error:[/]", exc.message)
        if exc.remedy:
            _say("what to do:", exc.remedy)
        _json_error(exc.message, exc.remedy, exc.exit_code)
        raise SystemExit(exc.exit_code) from None
    except TimeoutError as exc:
        _say("[red]error:[/]", str(exc))
        _json_error(str(exc), "", TIMEOUT_EXIT)
        raise SystemExit(TIMEOUT_EXIT) from None
    except KeyboardInterrupt:
        _say("[yellow]interrupted[/]", "")
        _json_error("interrupted", "", INTERRUPTED_EXIT)
        raise SystemExit(INTERRUPTED_EXIT) from None
    except SystemExit as exc:
        if exc.code == INTERRUPTED_EXIT:  # Typer turned Ctrl-C into a silent exit 130
            _say("[yellow]interrupted[/]", "")
        raise
    except Exception as exc:
        if _debugging():
            raise
        _say("[red]internal error:[/]", f"{type(exc).__name__}: {exc}")
        _json_error(f"internal error: {type(exc).__name__}: {exc}", "", INTERNAL_ERROR_EXIT)
        _say(
            "what to do:",
            f"this is a bug in sandbox-tools; rerun with --debug (or {DEBUG_ENV}=1) for the "
            "traceback and report it",
        )
        raise SystemExit(INTERNAL_ERROR_EXIT) from None
