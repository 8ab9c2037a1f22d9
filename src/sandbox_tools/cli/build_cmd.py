"""`tools build`: options in, progress and a result table out."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from sandbox_tools.build_containers.build import STAGES, BuildRequest, build
from sandbox_tools.build_containers.records import ArtifactFormat, ArtifactRecord
from sandbox_tools.errors import ConfigurationError
from sandbox_tools.platforms import Arch, parse_arches
from sandbox_tools.sandboxes.docker import docker_client
from sandbox_tools.sandboxes.engines import connect_engines

# Off a terminal (CI logs) rich would wrap tables at 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)


class PlainReporter:
    """One line per stage with the time the previous stage took (CI logs, pipes)."""

    def __init__(self, verbose: bool, stream: Any = None) -> None:
        self.verbose = verbose
        self.stream = stream
        self._lock = threading.Lock()
        self._current: dict[Arch, tuple[str, float]] = {}

    def _emit(self, text: str) -> None:
        with self._lock:
            print(text, flush=True, file=self.stream)

    def _close_stage(self, arch: Arch) -> None:
        if arch in self._current:
            stage, started = self._current.pop(arch)
            self._emit(f"[{arch.value}] {stage}: done in {time.monotonic() - started:.1f}s")

    def stage(self, arch: Arch, stage: str) -> None:
        self._close_stage(arch)
        self._current[arch] = (stage, time.monotonic())
        self._emit(f"[{arch.value}] {stage} ...")

    def log(self, arch: Arch, line: str) -> None:
        if self.verbose:
            self._emit(f"[{arch.value}]   {line}")

    def finished(self, arch: Arch, record: ArtifactRecord, skipped: bool) -> None:
        self._close_stage(arch)
        verdict = "up to date (build id unchanged)" if skipped else "built"
        self._emit(f"[{arch.value}] {record.name}: {verdict}")


class RichReporter(PlainReporter):
    """A live progress line per architecture: stage n/6, name, elapsed time."""

    def __init__(self, progress: Progress, verbose: bool) -> None:
        super().__init__(verbose)
        self.progress = progress
        self.tasks: dict[Arch, TaskID] = {}

    def add(self, arch: Arch) -> None:
        self.tasks[arch] = self.progress.add_task(f"{arch.value}: waiting", total=len(STAGES))

    def stage(self, arch: Arch, stage: str) -> None:
        done = STAGES.index(stage) if stage in STAGES else 0
        self.progress.update(self.tasks[arch], completed=done, description=f"{arch.value}: {stage}")

    def log(self, arch: Arch, line: str) -> None:
        if self.verbose:
            self.progress.console.print(f"[dim]{arch.value}[/]  {line}", highlight=False)

    def finished(self, arch: Arch, record: ArtifactRecord, skipped: bool) -> None:
        verdict = "up to date" if skipped else "built"
        self.progress.update(
            self.tasks[arch], completed=len(STAGES), description=f"{arch.value}: {verdict}"
        )


def _result_table(records: list[ArtifactRecord], out_dir: Path, seconds: float) -> Table:
    table = Table(title=f"tools build: {len(records)} artifact(s) in {out_dir} ({seconds:.1f}s)")
    # Names and digests are never cut: they are copied into scripts and compared.
    for column in ("artifact", "platform", "format", "size", "sha256", "build id"):
        table.add_column(column, overflow="fold", no_wrap=column not in ("sha256", "build id"))
    for record in sorted(records, key=lambda r: r.platform):
        table.add_row(
            record.name,
            record.platform,
            record.format,
            f"{record.size / 1e6:.1f} MB",
            record.sha256,
            record.build_id.removeprefix("sha256:"),
        )
    return table


def build_command(
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
        ArtifactFormat, typer.Option("--format", help="Artifact format.")
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
) -> None:
    """Build the runtime into one self-contained executable per architecture."""
    if all_arches and arch:
        raise ConfigurationError("--all and --arch exclude each other")
    try:
        arches = tuple(Arch) if all_arches else tuple(parse_arches(arch or [os.uname().machine]))
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    client: Any = connect_engines(engine) if engine else docker_client()
    request = BuildRequest(arches=arches, format=fmt, out_dir=out)
    started = time.monotonic()
    if as_json:
        console.file = sys.stderr  # stdout carries the JSON only
    if console.is_terminal:
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            reporter = RichReporter(progress, verbose)
            for target in arches:
                reporter.add(target)
            records = build(client, request, reporter)
    else:
        records = build(client, request, PlainReporter(verbose, stream=console.file))
    console.print(_result_table(records, out, time.monotonic() - started))
    if as_json:
        print(json.dumps({"artifacts": [r.to_json() for r in records]}, indent=2))
