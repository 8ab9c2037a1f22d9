"""Bad input anywhere gets one clear line and a documented exit code, never a
traceback; an unexpected error is one line, exit 70, with the traceback only on request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GOLDEN = str(Path(__file__).parents[1] / "golden" / "manifest.json")


def tools(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandbox_tools.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    (tmp_path / "list.json").write_text("[]")
    (tmp_path / "schema-only.json").write_text(json.dumps({"schema": 1}))
    (tmp_path / "not-json.json").write_text("{")
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "empty").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["validate", "--jobs", "-3"], 2, "--jobs"),
        (["validate", "--jobs", "0"], 2, "--jobs"),
        (["validate", "--arch", "sparc"], 2, "sparc"),
        (["fetch", "--manifest", "list.json", "--dest", "out"], 2, "expected a JSON object"),
        (["fetch", "--manifest", "a-directory", "--dest", "out"], 2, "is a directory"),
        (["fetch", "--manifest", "schema-only.json", "--dest", "out"], 2, "has no 'version'"),
        (["fetch", "--manifest", "not-json.json", "--dest", "out"], 2, "not a valid manifest"),
        (["fetch", "--manifest", "missing.json", "--dest", "out"], 2, "no manifest at"),
        (["fetch", "--manifest", "missing.json", "--dest", "out"], 2, "`tools release` writes"),
        # an unreleased install: the command that builds where the injector looks
        (["fetch", "--platform", "arm64", "--dest", "out"], 2, "tools build --arch arm64 --out"),
        (["release", "--s3-bucket", "b", "--s3-prefix", "x/{vers}", "--dry-run"], 2, "{version}"),
        (["release", "--github-repo", "o/r", "--github-tag", "{ver}", "--dry-run"], 2, "{version}"),
        # an unset workflow variable: never a release that silently skips S3
        (["release", "--s3-bucket", "", "--github-repo", "o/r", "--dry-run"], 2, "--s3-bucket is"),
        (["release", "--s3-bucket", "b", "--github-repo", " ", "--dry-run"], 2, "--github-repo is"),
        (["fetch", "--manifest", GOLDEN, "--out", "/proc/no/such"], 2, "cannot create"),
        (["fetch", "--manifest", GOLDEN, "--dest", "list.json"], 2, "is a file"),
        (["fetch", "--manifest", GOLDEN, "--platform", "sparc", "--dest", "out"], 2, "sparc"),
        (["validate", "--dist", ".", "--only", "ubunt"], 2, "did you mean ubuntu"),
        (["validate", "--static", "--dist", "empty"], 2, "Run `tools build --out empty`"),
        (["cleanup"], 2, "say what to clean up"),
        (["--quiet", "--verbose", "cleanup", "--modal"], 2, "exclude each other"),
        (["no-such-command"], 2, "No such command"),
    ],
)
def test_bad_input_is_one_clear_line_and_a_documented_code(
    inputs: Path, args: list[str], code: int, words: str
) -> None:
    done = tools(*args, cwd=inputs, env={**os.environ, "GITHUB_TOKEN": "t"})
    assert done.returncode == code, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert words in done.stdout + done.stderr


def test_an_unexpected_error_is_one_line_and_exit_70(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sandbox_tools.cli import app as cli

    def broken() -> None:
        raise RuntimeError("something we did not foresee")

    monkeypatch.setattr(cli, "app", broken)
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == cli.INTERNAL_ERROR_EXIT
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: something we did not foresee" in err
    assert "--debug" in err and "Traceback" not in err
    monkeypatch.setenv(cli.DEBUG_ENV, "1")  # on request, the traceback itself
    with pytest.raises(RuntimeError):
        cli.main()
    monkeypatch.setenv(cli.DEBUG_ENV, "yes")  # the setting's own yes/no spellings
    with pytest.raises(RuntimeError):
        cli.main()
    monkeypatch.delenv(cli.DEBUG_ENV)
    monkeypatch.setattr(sys, "argv", ["tools", "--debug", "build"])  # the root's flag
    with pytest.raises(RuntimeError):
        cli.main()
    monkeypatch.setattr(sys, "argv", ["tools", "exec-remote", "--debug"])  # not the root's
    with pytest.raises(SystemExit):
        cli.main()


def test_ctrl_c_is_one_line_and_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sandbox_tools.cli import app as cli

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "app", interrupted)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 130 and "interrupted" in capsys.readouterr().err


def test_a_container_that_does_not_exist_is_a_configuration_error() -> None:
    from sandbox_tools.errors import ConfigurationError, EngineUnavailableError
    from sandbox_tools.sandboxes.docker import DockerSandbox

    try:
        with pytest.raises(ConfigurationError, match="no container 'no-such-container-here'"):
            DockerSandbox("no-such-container-here")
    except EngineUnavailableError:
        pytest.skip("no Docker engine")


def _codes(text: str) -> set[int]:
    """'11, 12, 14' and '4-8' as the set of codes they name."""
    found: set[int] = set()
    for part in text.replace(" ", "").split(","):
        low, _, high = part.partition("-")
        found |= set(range(int(low), int(high or low) + 1))
    return found


def test_every_exit_code_is_in_help_and_in_the_cli_reference(tmp_path: Path) -> None:
    """The codes a script may see are listed where its author looks."""
    from sandbox_tools import errors
    from sandbox_tools.cli import app as cli

    listed = set().union(*(_codes(code) for code, _ in cli.EXIT_CODES))
    raised = {
        value.exit_code
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, errors.SandboxToolsError)
    }
    assert raised <= listed
    help_text = tools("--help", cwd=tmp_path, env={**os.environ, "COLUMNS": "400"}).stdout
    for code, meaning in cli.EXIT_CODES:
        assert f"{code} {meaning}" in " ".join(help_text.replace("│", " ").split())
    reference = (Path(__file__).parents[2] / "docs" / "CLI.md").read_text()
    blocks = reference[reference.index("## Exit codes") :].split("\n\n")
    table = next(block for block in blocks if block.startswith("| code |"))
    rows = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert set().union(*(_codes(row) for row in rows)) == listed
