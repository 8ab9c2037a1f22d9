"""`tools validate`: artifacts in dist/ across the distribution matrix."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from sandbox_tools.artifacts import (
    Artifact,
    ArtifactFormat,
    ArtifactKind,
    Provenance,
    read_build_records,
)
from sandbox_tools.cli.invocation import invocation
from sandbox_tools.cli.output import (
    actions_error,
    actions_group,
    append_step_summary,
    console,
    humans_to_stderr,
    notes,
    one_line,
    print_json,
)
from sandbox_tools.distro_matrix.matrix import load_matrix
from sandbox_tools.distro_matrix.runner import plan, run_matrix
from sandbox_tools.distro_matrix.static import static_checks
from sandbox_tools.errors import ConfigurationError, NothingValidatedError
from sandbox_tools.platforms import Arch, parse_arches
from sandbox_tools.sandboxes.engines import Engine, connect_engines
from sandbox_tools.validation import CellResult, EngineStatus, write_reports

STYLE = {"passed": "green", "failed": "bold red", "skipped": "yellow"}


ORDER = {"failed": 0, "passed": 1, "skipped": 2}


def _table(
    results: list[CellResult], engines: int = 1, total: int | None = None, rows: int | None = None
) -> Table:
    """Failures first. `total`: cells planned (a done/total count); `rows`: the most the
    screen holds (the live view): the newest results beyond that are summarised in a line."""
    done = f"{len(results)}/{total} done" if total else f"{len(results)} cells"
    table = Table(title=f"tools validate: {done}")
    columns = ["distribution", "platform", "scenario", "status", "seconds", "detail"]
    if engines > 1:
        columns.insert(3, "engine")
    for column in columns:
        table.add_column(column, overflow="fold")
    ordered = sorted(
        results, key=lambda r: (ORDER.get(r.status, 3), r.platform, r.distro, r.scenario)
    )
    hidden = 0
    if rows is not None and len(ordered) > rows:
        hidden, ordered = len(ordered) - rows, ordered[:rows]
    for r in ordered:
        detail = ", ".join(r.checks) if r.status == "passed" and r.checks else r.detail
        cells = [
            r.distro,
            r.platform,
            r.scenario,
            f"[{STYLE[r.status]}]{r.status}[/]",
            f"{r.seconds:.1f}",
            escape(detail[:160]),
        ]
        if engines > 1:
            cells.insert(3, r.engine)
        table.add_row(*cells)
    if hidden:
        table.caption = f"... and {hidden} more (all in the reports)"
    return table


def _artifacts(dist: Path, arches: list[Arch]) -> list[Artifact]:
    chosen = []
    built = [r for r in read_build_records(dist) if r.format is ArtifactFormat.PORTABLE]
    for record in built:
        if arches and record.arch not in arches:
            continue
        artifact = record.found_at(dist / record.name, Provenance.DIST)
        if artifact is None:
            raise ConfigurationError(
                f"{dist / record.name} is missing or does not match "
                "its record in build.json; rebuild it with `tools build`"
            )
        chosen.append(artifact)
    if not chosen and built:  # what was asked for is not built, something else is
        wanted = ", ".join(a.value for a in arches)
        raise ConfigurationError(
            f"no {wanted} artifact is built in {dist} (built: "
            f"{', '.join(sorted(r.platform for r in built))})",
            remedy=f"Build it with `tools build --arch {','.join(a.value for a in arches)}` "
            "(or `tools build --all`), or validate what is built: "
            f"--arch {','.join(sorted(r.arch.value for r in built))}.",
        )
    if not chosen:
        raise ConfigurationError(
            f"no artifacts to validate in {dist}",
            remedy=f"Run `tools build --out {dist}` (or `tools build --all`) first, or name "
            "the directory of a build with --dist DIR (--only narrows the distributions).",
        )
    return chosen


def _addons(dist: Path, arches: list[Arch]) -> tuple[list[Artifact], dict[str, list[str]]]:
    """Each add-on built in `dist`, and its static findings (none built: none). The
    report names their records beside the runtimes': `tools release` publishes an add-on
    only if the report names its exact bytes with sound static checks and passing cells
    (the browser's), none failed."""
    records: list[Artifact] = []
    found: dict[str, list[str]] = {}
    for record in read_build_records(dist):
        if record.kind is ArtifactKind.RUNTIME or (arches and record.arch not in arches):
            continue
        located = record.found_at(dist / record.name, Provenance.DIST)
        records.append(located or record)  # the browser cells read the bytes found
        if located is None:
            found[record.name] = [
                "missing or does not match its record in build.json; rebuild it with "
                f"`tools build --with-{record.kind.value}`"
            ]
        else:
            found[record.name] = static_checks(located.located, located)
    return records, found


def validate_command(
    ctx: typer.Context,
    only: Annotated[
        list[str] | None,
        typer.Option(
            "--only",
            metavar="DISTRO",
            help="Distributions to run, e.g. debian:12 or debian (repeatable or a,b).",
        ),
    ] = None,
    arch: Annotated[
        list[str] | None,
        typer.Option(
            "--arch",
            metavar="ARCH",
            help="Architectures to run (repeatable or a,b); default: all built.",
        ),
    ] = None,
    dist: Annotated[
        Path, typer.Option("--dist", metavar="DIR", help="Artifacts and build.json.")
    ] = Path("dist"),
    static: Annotated[
        bool,
        typer.Option(
            "--static",
            help="Only the static checks (the ELF and its payload read back), no containers; "
            "the report holds what they found.",
            metavar="",
        ),
    ] = False,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", min=1, metavar="N", help="Cells in parallel.")
    ] = (os.cpu_count() or 2),
    report: Annotated[Path, typer.Option(metavar="FILE", help="JSON report.")] = Path(
        "validate-report.json"
    ),
    junit: Annotated[Path, typer.Option(metavar="FILE", help="JUnit XML report.")] = Path(
        "validate-junit.xml"
    ),
    engine: Annotated[
        list[str] | None,
        typer.Option(
            "--engine",
            metavar="ENGINE",
            help="Docker engine to run rows on: default, a URL (unix://, tcp://, ssh://) or a "
            "docker context; repeatable, rows are spread across them.",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the JSON report on stdout; tables and logs on stderr.", metavar=""
        ),
    ] = False,
    allow_skipped: Annotated[
        bool,
        typer.Option(
            "--allow-skipped",
            help="Succeed even if nothing (or nothing of an --only selection) passed, "
            "e.g. every cell skipped because the registry is unreachable.",
            metavar="",
        ),
    ] = False,
) -> None:
    """Run every artifact through the distribution matrix with real tool calls.

    Exit codes: 0 passed; 1 a static check or a cell failed; 2 bad input; 15 nothing of
    what was asked for passed (all skipped), unless --allow-skipped. The report is written
    (and printed with --json) whatever the outcome.
    """
    if as_json:
        humans_to_stderr()  # stdout carries the report only
    # Reports of an earlier run must never stand for this one, whatever happens next.
    for stale in (report, junit):
        stale.unlink(missing_ok=True)
        try:
            stale.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(f"cannot write {stale}: {exc.strerror or exc}") from None
    try:
        arches = parse_arches(arch or [])
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    # Every input is checked before anything runs.
    only = [part for value in only or [] for part in value.split(",") if part.strip()] or None
    matrix = load_matrix().select(only)
    artifacts = _artifacts(dist, arches)
    problems = {art.name: static_checks(art.located, art) for art in artifacts}
    addons, addon_problems = _addons(dist, arches)  # their cells run after every check
    problems.update(addon_problems)
    reported = [*artifacts, *addons]  # the exact bytes the report vouches for
    for name, found in problems.items():
        verdict = "[green]ok[/]" if not found else "[bold red]" + escape("; ".join(found)) + "[/]"
        (console if found else notes).print(f"static checks {name}: {verdict}")
    if any(problems.values()) or static:
        # No cell runs; the report, the annotations and the summary say what was found.
        write_reports([], report, junit, reported, static=problems)
        for name, found in problems.items():
            if found:
                actions_error(f"tools validate: static checks {name}", "; ".join(found))
        _github_summary([], {"passed": 0, "failed": 0, "skipped": 0}, [], problems)
        if as_json:
            print_json(report.read_text())
        if any(problems.values()):
            raise typer.Exit(1)
        return
    run = invocation(ctx)
    engines = connect_engines(engine or ["default"], run.settings.engine_concurrency)
    for each in engines:
        state = "ready" if each.available else f"[bold red]unavailable[/]: {escape(each.error)}"
        (notes if each.available else console).print(f"engine {escape(each.label)}: {state}")
    results: list[CellResult] = []

    def cells(on_result: Callable[[CellResult], None]) -> list[CellResult]:
        return asyncio.run(
            run_matrix(
                engines,
                artifacts,
                matrix,
                jobs,
                on_result,
                containers=run.containers,
                roots=run.roots,
                addons=addons,
            )
        )

    try:
        if notes.is_terminal and not notes.quiet:
            planned = sum(len(row.scenarios) for row in plan(artifacts, addons, matrix))
            fits = max(5, notes.size.height - 8)  # the live view never outgrows the screen
            with Live(
                _table(results, total=planned, rows=fits), console=notes, refresh_per_second=2
            ) as live:

                def show(result: CellResult) -> None:
                    results.append(result)
                    live.update(_table(results, len(engines), planned, fits))

                outcome = cells(show)
        else:

            def log(result: CellResult) -> None:
                results.append(result)
                where = f" [{result.engine}]" if len(engines) > 1 else ""
                notes.print(
                    f"{result.status:7} {result.cell_id}{where} {result.seconds:.1f}s "
                    f"{result.detail[:200]}",
                    highlight=False,
                    markup=False,
                    soft_wrap=True,
                )
                if result.status == "failed":
                    actions_error(f"validate {result.cell_id}", result.detail)

            with actions_group("tools validate: cells"):
                outcome = cells(log)
            console.print(_table(outcome, len(engines)))
    except KeyboardInterrupt:
        # What ran so far is reported (marked interrupted, never "passed"); the cells'
        # containers go; main() says "interrupted" and exits 130.
        run.containers.tracker.remove_all()
        write_reports(
            results,
            report,
            junit,
            reported,
            statuses(engines),
            interrupted=True,
            static=problems,
        )
        if as_json:
            print_json(report.read_text())
        raise
    unvalidated = [] if allow_skipped else _unvalidated(outcome, only)
    write_reports(outcome, report, junit, reported, statuses(engines), unvalidated, static=problems)
    counts = {s: sum(r.status == s for r in outcome) for s in ("passed", "failed", "skipped")}
    console.print(
        f"[bold]{counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['skipped']} skipped[/]  reports: {report}, {junit}"
    )
    _github_summary(outcome, counts, unvalidated, problems)
    if as_json:
        print_json(report.read_text())
    if unvalidated:
        actions_error("tools validate", f"nothing passed for {', '.join(unvalidated)}")
    if counts["failed"]:
        raise typer.Exit(1)
    if unvalidated:
        raise NothingValidatedError(
            f"nothing passed for: {', '.join(unvalidated)} (every cell was skipped)",
            remedy="make the images available (see the skip reasons above), or pass "
            "--allow-skipped if skipping is what you want",
        )


def statuses(engines: list[Engine]) -> list[EngineStatus]:
    return [EngineStatus(e.label, e.kind.value, e.available, e.error) for e in engines]


def _unvalidated(results: list[CellResult], only: list[str] | None) -> list[str]:
    """What was asked for and has no passing cell: each --only selector, or everything."""
    passed = [r for r in results if r.status == "passed"]
    if not only:
        return [] if passed else ["the whole matrix"]
    missing = []
    for selector in only:
        selected = load_matrix().select([selector]).distros
        names = {d.name for d in selected}
        if not any(r.distro in names for r in passed):
            missing.append(selector)
    return missing


def _github_summary(
    results: list[CellResult],
    counts: dict[str, int],
    unvalidated: list[str],
    static: dict[str, list[str]],
) -> None:
    """On GitHub Actions: a Markdown summary of the run, failures first."""
    static_failed = {name: found for name, found in static.items() if found}
    verdict = "failed" if counts["failed"] or unvalidated or static_failed else "passed"
    lines = [f"## tools validate: {verdict}", ""]
    if static_failed:
        lines += ["Static checks failed (no cell ran):", ""]
        lines += [
            f"- `{name}`: {one_line('; '.join(found))}" for name, found in static_failed.items()
        ]
    elif not results:
        lines += [f"Static checks passed for {', '.join(f'`{n}`' for n in static)} (--static)."]
    else:
        lines.append(
            f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
        )
    if unvalidated:
        lines += ["", f"Nothing passed for: {', '.join(unvalidated)}"]
    if not results:
        append_step_summary(lines)
        return
    order = {"failed": 0, "passed": 1, "skipped": 2}
    lines += ["", "| cell | status | seconds | detail |", "|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (order.get(r.status, 3), r.cell_id)):
        detail = one_line(r.detail).replace("|", "\\|")[:200]
        lines.append(f"| {r.cell_id} | {r.status} | {r.seconds:.1f} | {detail} |")
    append_step_summary(lines)
