"""The example GitHub Actions workflows in .github/workflows, as a maintainer copies them:
they match the GitHub Actions workflow schema (check-jsonschema's, offline); CI runs what
`.ci/run` runs; the release job keeps the order RELEASING.md depends on (a draft, the
manifest commit, the tag on that commit, then the GitHub release published on it), and
its tag step, run in a scratch repository, can be rerun; every `tools` flag the
workflows pass exists."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import cli_help

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def check_jsonschema() -> str:
    here = Path(sys.executable).parent / "check-jsonschema"  # the dev extra installs it here
    found = str(here) if here.exists() else shutil.which("check-jsonschema")
    if found is None:
        pytest.fail(
            "check-jsonschema is not installed: pip install -c constraints-dev.txt -e '.[dev]' "
            "(scripts/setup.sh does)"
        )
    return found


def load(name: str) -> dict[Any, Any]:
    document = yaml.safe_load((WORKFLOWS / name).read_text())
    assert isinstance(document, dict)
    return document


def steps(name: str) -> list[dict[str, Any]]:
    jobs = load(name)["jobs"]
    (job,) = jobs.values()
    found: list[dict[str, Any]] = job["steps"]
    return found


def runs(name: str) -> list[str]:
    return [step["run"] for step in steps(name) if "run" in step]


def test_the_workflows_match_the_github_actions_schema() -> None:
    done = subprocess.run(
        [check_jsonschema(), "--builtin-schema", "vendor.github-workflows",
         *sorted(str(p) for p in WORKFLOWS.glob("*.yml"))],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert {p.name for p in WORKFLOWS.glob("*.yml")} == {"ci.yml", "release.yml"}


def test_ci_runs_on_pull_requests_what_ci_run_runs() -> None:
    workflow = load("ci.yml")
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as true
    assert "pull_request" in triggers
    assert workflow["permissions"] == {"contents": "read"}
    script = " ".join(runs("ci.yml"))
    assert "bash scripts/setup.sh" in script
    # Every command of scripts/test.sh (what `.ci/run` executes) is a step of its own.
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    commands = [
        line.split(" ||")[0] for line in test_sh.splitlines() if line.startswith(".venv/bin/")
    ]
    assert len(commands) == 5
    for command in commands:
        words = command.split("#")[0].replace('"$@"', "").split()
        assert " ".join(words) in script, command
    env = next(step["env"] for step in steps("ci.yml") if "pytest" in step.get("run", ""))
    assert env["SANDBOX_TOOLS_REQUIRE_DOCKER"] == "1" and env["SANDBOX_TOOLS_TEST_ARM64"] == "1"


def test_release_commits_the_manifest_then_tags_then_publishes() -> None:
    workflow = load("release.yml")
    assert workflow[True] == {"push": {"tags": ["release/v*"]}}
    assert workflow["permissions"] == {"contents": "write", "id-token": "write"}
    all_steps = steps("release.yml")
    uses = [step.get("uses", "") for step in all_steps]
    aws = next(s for s in all_steps if s.get("uses", "").startswith("aws-actions/configure-aws"))
    assert "role-to-assume" in aws["with"]  # OIDC: no long-lived keys anywhere
    assert "secrets." not in (WORKFLOWS / "release.yml").read_text()
    assert any(u.startswith("pypa/gh-action-pypi-publish") for u in uses)

    def at(predicate: Any) -> int:
        return next(i for i, step in enumerate(all_steps) if predicate(step.get("run", "")))

    qemu = at(lambda r: "binfmt" in r)
    build = at(lambda r: "tools build --all $WITH_BROWSER" in r)
    # An unset bucket stops the job before anything is built: never a release without S3.
    assert 'if [ -z "$RELEASE_BUCKET" ]' in all_steps[build]["run"]
    assert "vars.RELEASE_WITH_BROWSER" in workflow["jobs"]["release"]["env"]["WITH_BROWSER"]
    validate = at(lambda r: r.startswith("tools validate"))
    draft = at(lambda r: "tools release" in r and "--github-draft" in r)
    commit = at(lambda r: "git commit" in r)
    publish = at(lambda r: "tools release" in r and "--github-draft" not in r)
    wheel = at(lambda r: r.startswith("tools wheel"))
    pypi = uses.index(next(u for u in uses if u.startswith("pypa/")))
    assert qemu < build < validate < draft < commit < publish < wheel < pypi
    assert uses.index(aws["uses"]) < draft
    script = all_steps[commit]["run"]
    assert script.index("git add src/sandbox_tools/release/published/") < script.index("git commit")
    tag, push = script.index("git tag -a"), script.index('git push origin "refs/tags/v$VERSION"')
    assert script.index("git commit") < tag < push
    comments = (WORKFLOWS / "release.yml").read_text().split("\nname:", 1)[0]
    header = " ".join(line.lstrip("# ") for line in comments.splitlines())
    assert "tag after committing the manifest" in header
    assert "create that tag itself, at the head of the default branch" in header


def help_flags(*command: str) -> set[str]:
    done = cli_help(*command)
    return set(re.findall(r"--[a-z0-9-]+", done.stdout))


@pytest.mark.parametrize("name", ["ci.yml", "release.yml"])
def test_every_tools_flag_in_the_workflows_exists(name: str) -> None:
    for script in runs(name):
        for line in script.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if not words or words[0] != "tools":
                continue
            command = [w for w in words[1:3] if not w.startswith("-")][:1]
            known = help_flags(*command)
            for flag in (w.split("=")[0] for w in words if w.startswith("--")):
                assert flag in known, f"{name}: `{line.strip()}` passes {flag}"


# -- the tag step, run as written in a scratch repository ------------------------------


def tag_step() -> str:
    (script,) = [s["run"] for s in steps("release.yml") if "git tag" in s.get("run", "")]
    return script


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def run_tag_step(origin: Path, at: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    """A fresh checkout of `at` (as actions/checkout does: detached, every tag fetched),
    the manifest `tools release` writes, then the step's script with GitHub's bash flags."""
    git(workdir.parent, "clone", "-q", str(origin), workdir.name)
    git(workdir, "checkout", "-q", "--detach", at)
    published = workdir / "src" / "sandbox_tools" / "release" / "published"
    published.mkdir(parents=True)
    (published / "manifest.json").write_text('{"version": "0.2.0"}\n')
    (published / "SHA256SUMS").write_text(f"{'0' * 64}  sandbox-tools-0.2.0-linux-amd64\n")
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", tag_step()],
        cwd=workdir,
        env={**os.environ, "VERSION": "0.2.0", "DEFAULT_BRANCH": "main"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_tag_step_can_be_rerun(tmp_path: Path) -> None:
    """A rerun of the release job (a later step failed) stopped at `git tag`: the tag
    existed. Now the rerun makes the same manifest commit, finds the tag on it and goes
    on; a tag on another commit stops the step with a clear message."""
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    seed = tmp_path / "seed"
    git(tmp_path, "clone", "-q", str(origin), "seed")
    (seed / "README").write_text("sandbox-tools 0.2.0\n")
    git(seed, "add", "README")
    git(seed, "commit", "-qm", "Release 0.2.0")
    git(seed, "push", "-q", "origin", "HEAD:refs/heads/main")
    version_commit = git(seed, "rev-parse", "HEAD")

    first = run_tag_step(origin, version_commit, tmp_path / "run1")
    assert first.returncode == 0, first.stdout + first.stderr
    tagged = git(origin, "rev-parse", "v0.2.0^{commit}")
    assert git(origin, "rev-parse", f"{tagged}^") == version_commit  # the manifest commit
    assert git(origin, "rev-parse", "main") == tagged  # the default branch got it too

    time.sleep(1.1)  # a commit made now would carry another date, hence another hash
    rerun = run_tag_step(origin, version_commit, tmp_path / "run2")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"tag v0.2.0 is already on the manifest commit {tagged} (a rerun): kept" in rerun.stdout
    assert git(origin, "rev-parse", "v0.2.0^{commit}") == tagged

    git(seed, "tag", "-f", "v0.2.0", version_commit)  # someone tagged another commit
    git(seed, "push", "-qf", "origin", "refs/tags/v0.2.0")
    moved = run_tag_step(origin, version_commit, tmp_path / "run3")
    assert moved.returncode == 1
    assert (
        f"::error::tag v0.2.0 already exists at {version_commit}, not at this run's manifest "
        f"commit {tagged}: a released tag never moves." in moved.stdout
    )
    assert git(origin, "rev-parse", "v0.2.0^{commit}") == version_commit  # left alone
