"""Running the matrix: artifact x distribution x scenario, through the real injector."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import docker.errors

from sandbox_tools.build_containers.package import TRAILER, TRAILER_MAGIC
from sandbox_tools.build_containers.records import ArtifactRecord
from sandbox_tools.distro_matrix.matrix import Distro, Matrix, Scenario
from sandbox_tools.errors import SandboxInjectionError, SandboxToolsError
from sandbox_tools.injector.acquire import Artifact
from sandbox_tools.injector.exec_remote import ExecRemoteOptions, exec_remote
from sandbox_tools.injector.inject import forget_sandbox, tool_support_sandbox
from sandbox_tools.injector.tool_clients import bash_session, new_bash_session, text_editor
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.base import Sandbox
from sandbox_tools.sandboxes.docker import DockerSandbox, running_container
from sandbox_tools.sandboxes.engines import Engine
from sandbox_tools.sandboxes.images import RootfsRecipe, ensure_busybox_image, ensure_image

MAX_ARTIFACT_BYTES = 15 * 1000 * 1000
ELF_MACHINES = {Arch.AMD64: 62, Arch.ARM64: 183}


@dataclass
class CellResult:
    artifact: str
    platform: str
    distro: str
    scenario: str
    status: str  # "passed", "failed", "skipped"
    seconds: float = 0.0
    source: str = ""
    detail: str = ""
    checks: list[str] = field(default_factory=list)
    engine: str = ""  # which Docker engine ran the cell (several with --engine)

    @property
    def cell_id(self) -> str:
        return f"{self.distro}/{self.platform.removeprefix('linux/')}/{self.scenario}"


# -- static checks (no container) -------------------------------------------------------


def static_checks(path: Path, record: ArtifactRecord) -> list[str]:
    """Problems found in the artifact's ELF facts; empty when it is sound."""
    problems: list[str] = []
    data = path.read_bytes()
    if len(data) != record.size:
        problems.append(f"size {len(data)} differs from the record's {record.size}")
    if len(data) > MAX_ARTIFACT_BYTES:
        problems.append(f"{len(data)} bytes exceeds the {MAX_ARTIFACT_BYTES} byte budget")
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return [*problems, "not a 64-bit ELF executable"]
    machine = struct.unpack_from("<H", data, 18)[0]
    if machine != ELF_MACHINES[record.arch]:
        problems.append(
            f"ELF machine {machine}, expected {ELF_MACHINES[record.arch]} for {record.platform}"
        )
    (phoff,) = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    for index in range(phnum):
        p_type = struct.unpack_from("<I", data, phoff + index * phentsize)[0]
        if p_type == 3:  # PT_INTERP: would need the container's dynamic loader
            problems.append("has an ELF interpreter: not statically linked")
        if p_type == 2:  # PT_DYNAMIC: would load the container's libraries
            problems.append("is dynamically linked")
    if record.format == "portable":
        magic = TRAILER.unpack_from(data, len(data) - TRAILER.size)[0]
        if magic != TRAILER_MAGIC:
            problems.append("no payload trailer")
    return problems


# -- images -----------------------------------------------------------------------------


def resolve_image(
    client: Any, distro: Distro, arch: Arch, registry_ok: dict[str, bool]
) -> tuple[str | None, str]:
    """(image, where it came from) or (None, why it is skipped)."""
    reasons = []
    if distro.registry:
        if registry_ok.get("reachable", True):
            try:
                client.images.pull(distro.registry, platform=arch.platform)
                return distro.registry, f"registry {distro.registry}"
            except docker.errors.APIError as exc:
                registry_ok["reachable"] = False  # one refusal is enough for this run
                reasons.append(f"registry unreachable ({str(exc.explanation or exc)[:80]})")
        else:
            reasons.append("registry unreachable")
    if distro.offline and distro.offline.startswith("debootstrap:"):
        suite = distro.offline.split(":", 1)[1]
        return ensure_image(client, RootfsRecipe(suite=suite, arch=arch)), distro.offline
    if distro.offline == "busybox-static":
        return ensure_busybox_image(client, arch), distro.offline
    if distro.offline == "noshell":
        return ensure_busybox_image(client, arch, applets=False), distro.offline
    reasons.append("no offline recipe")
    return None, ", ".join(reasons)


# -- one cell ---------------------------------------------------------------------------


def shell_less_skip(distro: Distro, scenario: Scenario) -> str | None:
    """Why a scenario cannot run on an image without a shell, or None if it can."""
    if distro.shell:
        return None
    if scenario.read_only:
        return (
            "no shell: a read-only root refuses uploads and there is no shell to stream "
            "the artifact through"
        )
    if scenario.user:
        return "no shell: uploads are owned by root, and nothing can hand them to another user"
    return None


async def _exercise(
    sandbox: Sandbox,
    artifact: Artifact,
    scenario: Scenario,
    checks: list[str],
    shell: bool = True,
) -> None:
    support = await tool_support_sandbox(sandbox, artifact=artifact)
    try:
        client = support.client
        info = await client.call("runtime_info")
        if info.get("build_id") != artifact.build_id:
            raise AssertionError(f"runtime_info build id {info.get('build_id')}")
        checks.append("version+runtime_info")
        if not shell:
            return  # the tools below run commands through /bin/sh, which is not there
        result = await exec_remote(client, "echo out; echo err >&2; exit 3", stream=False)
        if (result.returncode, result.stdout, result.stderr) != (3, "out\n", "err\n"):
            raise AssertionError(f"exec_remote returned {result}")
        process = await exec_remote(client, "sleep 300", ExecRemoteOptions(poll_interval=1))
        await process.kill()
        if not (await process.wait()).killed:
            raise AssertionError("exec_remote kill did not report killed")
        checks.append("exec_remote")
        session = await new_bash_session(client)
        if await bash_session(client, session, "echo $((6 * 7))\n") != "42\n":
            raise AssertionError("bash_session round trip failed")
        checks.append("bash_session")
        path = f"{support.install_dir}/validate.txt"
        await text_editor(client, "create", path, file_text="alpha\n")
        await text_editor(client, "str_replace", path, old_str="alpha", new_str="beta")
        if not (await text_editor(client, "view", path)).endswith("     1\tbeta\n"):
            raise AssertionError("text_editor round trip failed")
        checks.append("text_editor")
    finally:
        await support.aclose()
        await forget_sandbox(sandbox)


async def run_cell(
    client: Any,
    artifact: Artifact,
    record: ArtifactRecord,
    distro: Distro,
    image: str,
    source: str,
    scenario: Scenario,
) -> CellResult:
    result = CellResult(
        record.name, record.platform, distro.name, scenario.name, "failed", source=source
    )
    started = time.monotonic()
    options: dict[str, Any] = {"platform": record.platform, "read_only": scenario.read_only}
    if scenario.tmpfs:
        options["tmpfs"] = dict(scenario.tmpfs)
    if scenario.user:
        options["user"] = scenario.user
    if distro.command:
        options["command"] = distro.command
    try:
        with running_container(client, image, **options) as container:
            sandbox = DockerSandbox(container, client)
            try:
                await _exercise(sandbox, artifact, scenario, result.checks, distro.shell)
                failure: BaseException | None = None
            except SandboxInjectionError as exc:
                failure = exc
            if scenario.expect_failure:
                if isinstance(failure, SandboxInjectionError) and "tried" in str(failure):
                    result.status, result.detail = "passed", f"failed as expected: {failure}"
                else:
                    result.detail = "expected a SandboxInjectionError naming the directories"
            elif failure is not None:
                raise failure
            else:
                result.status = "passed"
    except (SandboxToolsError, AssertionError, docker.errors.DockerException, OSError) as exc:
        result.detail = str(exc)[:2000]
    result.seconds = time.monotonic() - started
    return result


def modal_skip(distro: Distro, scenario: Scenario, arch: Arch) -> str | None:
    """Why a cell cannot run in a Modal sandbox, or None if it can."""
    if arch is not Arch.AMD64:
        return "Modal sandboxes run amd64"
    if not distro.registry:
        return "Modal starts registry images; this row has only an offline recipe"
    if not distro.shell:
        return "Modal keeps the sandbox alive with a command from the image; this one has none"
    if scenario.read_only or scenario.tmpfs or scenario.user or scenario.expect_failure:
        return "read-only roots, tmpfs mounts and container users are Docker options"
    return None


async def run_modal_cell(
    artifact: Artifact, record: ArtifactRecord, distro: Distro, scenario: Scenario
) -> CellResult:
    """The same checks as a Docker cell, in a fresh Modal sandbox of the row's image."""
    from sandbox_tools.sandboxes.modal import ModalConfig, ModalSandbox

    assert distro.registry is not None
    result = CellResult(
        record.name,
        record.platform,
        distro.name,
        scenario.name,
        "failed",
        source=f"registry {distro.registry} (Modal)",
    )
    started = time.monotonic()
    try:
        sandbox = await ModalSandbox.create(ModalConfig(image=distro.registry, timeout=900))
        try:
            await _exercise(sandbox, artifact, scenario, result.checks, distro.shell)
            result.status = "passed"
        finally:
            await sandbox.cleanup()
    except (SandboxToolsError, AssertionError, OSError, TimeoutError) as exc:
        result.detail = str(exc)[:2000]
    result.seconds = time.monotonic() - started
    return result


# -- the whole run ----------------------------------------------------------------------


async def run_matrix(
    engines: Sequence[Engine],
    artifacts: list[tuple[ArtifactRecord, Artifact]],
    matrix: Matrix,
    jobs: int,
    on_result: Callable[[CellResult], None],
) -> list[CellResult]:
    """Every cell, with the rows (artifact x distribution) dealt round-robin to `engines`.

    Each engine runs up to `jobs` cells at once and prepares its own images. A row whose
    engine is unreachable or cannot prepare the image fails cell by cell with the reason.
    """
    registries: dict[str, dict[str, bool]] = {e.label: {} for e in engines}
    semaphores = {e.label: asyncio.Semaphore(jobs) for e in engines}
    results: list[CellResult] = []

    def report(result: CellResult) -> None:
        results.append(result)
        on_result(result)

    async def row(
        engine: Engine, record: ArtifactRecord, artifact: Artifact, distro: Distro
    ) -> None:
        def cell_result(scenario: Scenario, status: str, detail: str) -> CellResult:
            return CellResult(
                record.name,
                record.platform,
                distro.name,
                scenario.name,
                status,
                detail=detail,
                engine=engine.label,
            )

        if not engine.available:
            for scenario in matrix.scenarios:
                report(
                    cell_result(
                        scenario, "failed", f"engine {engine.label} unreachable: {engine.error}"
                    )
                )
            return
        if engine.kind == "modal":
            for scenario in matrix.scenarios:
                why = modal_skip(distro, scenario, record.arch)
                if why is not None:
                    report(cell_result(scenario, "skipped", why))
                    continue
                async with semaphores[engine.label]:
                    outcome = await run_modal_cell(artifact, record, distro, scenario)
                outcome.engine = engine.label
                report(outcome)
            return
        try:
            async with semaphores[engine.label]:
                image, source = await asyncio.to_thread(
                    resolve_image, engine.client, distro, record.arch, registries[engine.label]
                )
        except (SandboxToolsError, docker.errors.DockerException, OSError) as exc:
            for scenario in matrix.scenarios:
                report(cell_result(scenario, "failed", f"engine {engine.label}: no image: {exc}"))
            return

        async def cell(scenario: Scenario) -> None:
            reason = source if image is None else shell_less_skip(distro, scenario)
            if image is None or reason is not None:
                report(cell_result(scenario, "skipped", reason or source))
                return
            async with semaphores[engine.label]:
                outcome = await run_cell(
                    engine.client, artifact, record, distro, image, source, scenario
                )
            outcome.engine = engine.label
            report(outcome)

        await asyncio.gather(*(cell(scenario) for scenario in matrix.scenarios))

    rows = [
        (record, artifact, distro) for record, artifact in artifacts for distro in matrix.distros
    ]
    await asyncio.gather(*(row(engines[i % len(engines)], *spec) for i, spec in enumerate(rows)))
    return sorted(results, key=lambda r: (r.platform, r.distro, r.scenario))


def write_reports(
    results: list[CellResult],
    json_path: Path,
    junit_path: Path,
    artifacts: list[ArtifactRecord],
    engines: Sequence[Engine] = (),
    unvalidated: Sequence[str] = (),
    interrupted: bool = False,
) -> None:
    """`unvalidated`: what was asked for but had no passing cell; it makes the run fail."""
    summary = {
        status: sum(r.status == status for r in results)
        for status in ("passed", "failed", "skipped")
    }
    document = {
        "schema": 1,
        # release refuses unless validation passed for these exact bytes
        "artifacts": [
            {"name": a.name, "platform": a.platform, "sha256": a.sha256, "build_id": a.build_id}
            for a in artifacts
        ],
        "engines": [
            {"label": e.label, "kind": e.kind, "reachable": e.available, "error": e.error}
            for e in engines
        ],
        "summary": summary,
        "passed": summary["failed"] == 0 and not unvalidated and not interrupted,
        "interrupted": interrupted,
        "unvalidated": list(unvalidated),
        "results": [{**asdict(r), "id": r.cell_id} for r in results],
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    suite = ElementTree.Element(
        "testsuite",
        name="sandbox-tools validate",
        tests=str(len(results)),
        failures=str(summary["failed"]),
        skipped=str(summary["skipped"]),
    )
    for result in results:
        case = ElementTree.SubElement(
            suite,
            "testcase",
            classname=result.artifact,
            name=result.cell_id,
            time=f"{result.seconds:.2f}",
        )
        if result.status == "failed":
            ElementTree.SubElement(
                case, "failure", message=result.detail[:200]
            ).text = result.detail
        elif result.status == "skipped":
            ElementTree.SubElement(case, "skipped", message=result.detail)
    junit_path.parent.mkdir(parents=True, exist_ok=True)
    ElementTree.ElementTree(suite).write(junit_path, encoding="utf-8", xml_declaration=True)
