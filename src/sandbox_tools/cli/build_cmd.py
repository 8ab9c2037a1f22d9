"""`tools build`: options in, progress and a result table out."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from sandbox_tools.artifacts import RUNTIME_FORMATS, Artifact, ArtifactFormat, ArtifactKind
from sandbox_tools.build_containers.build import BuildRequest, NullReporter, Stage, build
from sandbox_tools.cli.invocation import invocation
from sandbox_tools.cli.output import (
    actions_error_line,
    append_step_summary,
    console,
    humans_to_stderr,
    notes,
    on_github_actions,
)
from sandbox_tools.cli.output import verbose as globally_verbose
from sandbox_tools.errors import ConfigurationError
from sandbox_tools.platforms import Arch, parse_arches
from sandbox_tools.sandboxes.engines import connect_engines, local_engine


class PlainReporter:
    """One line per stage with the time the previous stage took (CI logs, pipes).

    On GitHub Actions each finished stage is one foldable group holding its build
    output (architectures build concurrently: a stage's lines are held until it ends,
    so groups never interleave); the output is always kept there, `--verbose` or not.
    """

    def __init__(self, verbose: bool, stream: Any = None) -> None:
        self.verbose = verbose
        self.stream = stream
        self.actions = on_github_actions()
        self._lock = threading.Lock()
        self._current: dict[Arch, tuple[str, float]] = {}
        self._held: dict[Arch, list[str]] = {}

    def _emit(self, text: str) -> None:
        with self._lock:
            print(text, flush=True, file=self.stream)

    def _close_stage(self, arch: Arch, how: str = "done in") -> None:
        if arch not in self._current:
            return
        stage, started = self._current.pop(arch)
        line = f"[{arch.value}] {stage}: {how} {time.monotonic() - started:.1f}s"
        held = self._held.pop(arch, [])
        if self.actions:
            self._emit("\n".join([f"::group::{line}", *held, "::endgroup::"]))
        else:
            self._emit(line)

    def stage(self, arch: Arch, stage: Stage) -> None:
        self._close_stage(arch)
        self._current[arch] = (stage, time.monotonic())
        if not self.actions:
            self._emit(f"[{arch.value}] {stage} ...")

    def log(self, arch: Arch, line: str) -> None:
        if self.actions:
            self._held.setdefault(arch, []).append(f"[{arch.value}]   {line}")
        elif self.verbose:
            self._emit(f"[{arch.value}]   {line}")

    def finished(self, arch: Arch, record: Artifact, skipped: bool) -> None:
        self._close_stage(arch)
        verdict = "up to date (build id unchanged)" if skipped else "built"
        self._emit(f"[{arch.value}] {record.name}: {verdict}")

    def failed(self) -> None:
        """The build stopped: show what the unfinished stages printed, and where."""
        for arch in list(self._current):
            stage, _ = self._current[arch]
            self._close_stage(arch, "stopped, not done, after")
            if self.actions:
                self._emit(
                    actions_error_line(f"tools build {arch.value}", f"failed during {stage}")
                )


class RichReporter(PlainReporter):
    """A live progress line per architecture: stage n/6 (7 with add-ons), name, elapsed
    time."""

    def __init__(
        self, progress: Progress, verbose: bool, addons: tuple[ArtifactKind, ...] = ()
    ) -> None:
        super().__init__(verbose)
        self.progress = progress
        self.tasks: dict[Arch, TaskID] = {}
        self.addons = addons
        self.total = len(Stage) if addons else Stage.ADDON.number

    def add(self, arch: Arch) -> None:
        self.tasks[arch] = self.progress.add_task(f"{arch.value}: waiting", total=self.total)

    def stage(self, arch: Arch, stage: Stage) -> None:
        done = stage.number
        self.progress.update(self.tasks[arch], completed=done, description=f"{arch.value}: {stage}")

    def log(self, arch: Arch, line: str) -> None:
        if self.verbose:
            self.progress.console.print(f"[dim]{arch.value}[/]  {line}", highlight=False)

    def finished(self, arch: Arch, record: Artifact, skipped: bool) -> None:
        verdict = "up to date" if skipped else "built"
        last = not self.addons or record.kind is self.addons[-1]
        self.progress.update(
            self.tasks[arch],
            completed=self.total if last else Stage.ADDON.number,
            description=f"{arch.value}: {record.kind} {verdict}",
        )


def _result_table(records: list[Artifact], out_dir: Path, seconds: float) -> Table:
    table = Table(title=f"tools build: {len(records)} artifact(s) in {out_dir} ({seconds:.1f}s)")
    # Names and digests are never cut: they are copied into scripts and compared.
    for column in ("artifact", "platform", "format", "size", "sha256", "build id"):
        table.add_column(column, overflow="fold", no_wrap=column not in ("sha256", "build id"))
    for record in sorted(records, key=lambda r: (r.platform, r.kind.value)):
        table.add_row(
            record.name,
            record.platform,
            record.format.value,
            f"{record.size / 1e6:.1f} MB",
            record.sha256,
            record.build_id.removeprefix("sha256:"),
        )
    return table


def build_command(
    ctx: typer.Context,
    arch: Annotated[
        list[str] | None,
        typer.Option(
            "--arch", help="Architecture to build (amd64, arm64, x86_64, ...); repeatable or a,b."
        ),
    ] = None,
    all_arches: Annotated[
        bool, typer.Option("--all", help="Build every architecture.", metavar="")
    ] = False,
    fmt: Annotated[
        ArtifactFormat,
        typer.Option(
            "--format",
            help="The runtime's format: portable or staticx (tar.xz: the add-ons' packing).",
        ),
    ] = ArtifactFormat.PORTABLE,
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("dist"),
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show build output.", metavar="")
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the records as JSON on stdout; progress on stderr.", metavar=""
        ),
    ] = False,
    engine: Annotated[
        list[str] | None,
        typer.Option(
            "--engine",
            help="Docker engine(s) to build on: default, a URL or a docker context; "
            "repeatable, architectures are spread across them.",
        ),
    ] = None,
    with_browser: Annotated[
        bool,
        typer.Option(
            "--with-browser",
            help="Also build the optional browser add-on (headless Chromium, tar.xz, "
            "about 100 MB) of each architecture.",
            metavar="",
        ),
    ] = False,
    with_desktop: Annotated[
        bool,
        typer.Option(
            "--with-desktop",
            help="Also build the optional desktop add-on (an X server, input, a window "
            "manager and a terminal, tar.xz, about 7 MB) of each architecture.",
            metavar="",
        ),
    ] = False,
) -> None:
    """Build the runtime into one self-contained executable per architecture."""
    if all_arches and arch:
        raise ConfigurationError("--all and --arch exclude each other")
    if fmt not in RUNTIME_FORMATS:
        raise ConfigurationError(
            f"--format {fmt} is the add-ons' packing, not a runtime format",
            remedy="Build the add-ons with --with-browser or --with-desktop.",
        )
    try:
        arches = tuple(Arch) if all_arches else tuple(parse_arches(arch or [os.uname().machine]))
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    addons = tuple(
        kind
        for kind, wanted in (
            (ArtifactKind.BROWSER, with_browser),
            (ArtifactKind.DESKTOP, with_desktop),
        )
        if wanted
    )
    run = invocation(ctx)
    limit = run.settings.engine_concurrency
    client = connect_engines(engine, limit) if engine else [local_engine(limit)]
    request = BuildRequest(
        arches=arches,
        format=fmt,
        out_dir=out,
        roots=run.roots,
        containers=run.containers,
        addons=addons,
    )
    started = time.monotonic()
    verbose = verbose or globally_verbose()
    if as_json:
        humans_to_stderr()  # stdout carries the JSON only
    if notes.quiet:
        records = build(client, request, NullReporter())  # --quiet: only the result
    elif notes.is_terminal:
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=notes,
        ) as progress:
            reporter = RichReporter(progress, verbose, addons)
            for target in arches:
                reporter.add(target)
            records = build(client, request, reporter)
    else:
        plain = PlainReporter(verbose, stream=notes.file)
        try:
            records = build(client, request, plain)
        except BaseException:
            plain.failed()
            raise
    seconds = time.monotonic() - started
    console.print(_result_table(records, out, seconds))
    append_step_summary(_summary_lines(records, seconds))
    if as_json:
        print(json.dumps({"artifacts": [r.to_json() for r in records]}, indent=2))


def _summary_lines(records: list[Artifact], seconds: float) -> list[str]:
    lines = [f"## tools build: {len(records)} artifact(s) in {seconds:.0f} s", ""]
    lines += ["| artifact | platform | size | sha256 |", "|---|---|---|---|"]
    for r in sorted(records, key=lambda r: (r.platform, r.kind.value)):
        lines.append(f"| {r.name} | {r.platform} | {r.size / 1e6:.1f} MB | `{r.sha256}` |")
    return lines
