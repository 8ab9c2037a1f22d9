"""What the CLI prints for CI: GitHub Actions groups and annotations for builds."""

from __future__ import annotations

import io

import pytest

from sandbox_tools.artifacts import Artifact, ArtifactFormat
from sandbox_tools.build_containers.build import Stage
from sandbox_tools.cli.build_cmd import PlainReporter
from sandbox_tools.platforms import Arch


def record(arch: Arch) -> Artifact:
    return Artifact(
        name=f"sandbox-tools-{arch.value}",
        arch=arch,
        format=ArtifactFormat.PORTABLE,
        size=1,
        sha256="0" * 64,
        build_id="sha256:" + "1" * 64,
    )


def test_concurrent_stages_fold_into_groups_that_never_interleave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    out = io.StringIO()
    reporter = PlainReporter(verbose=False, stream=out)
    reporter.stage(Arch.AMD64, Stage.FREEZE)
    reporter.stage(Arch.ARM64, Stage.FREEZE)
    reporter.log(Arch.AMD64, "amd64 line 1")
    reporter.log(Arch.ARM64, "arm64 line 1")
    reporter.log(Arch.AMD64, "amd64 line 2")
    reporter.stage(Arch.AMD64, Stage.PACKAGE)
    reporter.finished(Arch.AMD64, record(Arch.AMD64), skipped=False)
    reporter.failed()  # arm64 stopped during its stage

    lines = out.getvalue().splitlines()
    opened = [i for i, line in enumerate(lines) if line.startswith("::group::")]
    closed = [i for i, line in enumerate(lines) if line == "::endgroup::"]
    assert len(opened) == len(closed) == 3
    bounds = [*opened, len(lines)]
    for n, (begin, end) in enumerate(zip(opened, closed, strict=True)):
        assert begin < end < bounds[n + 1]  # each group closes before the next opens
    first = lines[opened[0] : closed[0] + 1]
    assert first[0].startswith("::group::[amd64] freeze: done in")
    assert first[1:-1] == ["[amd64]   amd64 line 1", "[amd64]   amd64 line 2"]
    assert "[amd64]   arm64 line 1" not in lines
    assert "::error title=tools build arm64::failed during freeze" in lines
    assert any(line.endswith("sandbox-tools-amd64: built") for line in lines)


def test_plain_logs_show_build_output_only_when_verbose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    for verbose in (False, True):
        out = io.StringIO()
        reporter = PlainReporter(verbose=verbose, stream=out)
        reporter.stage(Arch.AMD64, Stage.FREEZE)
        reporter.log(Arch.AMD64, "compiler says hi")
        reporter.finished(Arch.AMD64, record(Arch.AMD64), skipped=True)
        text = out.getvalue()
        assert ("compiler says hi" in text) is verbose
        assert "::group::" not in text
        assert "[amd64] freeze ..." in text and "up to date" in text


def test_verbose_echoes_each_container_it_starts() -> None:
    """--verbose prints the docker command each container stands for (replayable by hand)."""
    from sandbox_tools.sandboxes.containers import ContainerPolicy

    lines: list[str] = []
    ContainerPolicy(echo=lines.append).show(
        "run -d",
        "sandbox-tools/base:x",
        ["sleep", "infinity"],
        {"user": "1000:1000", "read_only": True, "labels": {"a": "b"}, "tmpfs": {}},
    )
    ContainerPolicy().show("run -d", "quiet", None, {})
    assert lines == [
        "+ docker run -d --read-only=True --user=1000:1000 sandbox-tools/base:x sleep infinity"
    ]
