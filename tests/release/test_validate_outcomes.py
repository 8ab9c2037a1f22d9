"""`tools validate` as CI runs it, whatever the outcome: a static check that fails still
leaves the report (on stdout with --json), the annotations and the step summary; bad input
under --json is a JSON document; an architecture that is not built is named as such.

No container runs here: the fake release's artifacts are random bytes, which the static
checks refuse before any engine is asked for.
"""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

from sandbox_tools.artifacts import BUILD_RECORD_FILE, write_build_records
from sandbox_tools.platforms import Arch
from tests.release.conftest import FakeRelease, S3Server, release_args, run_tools, tools_env


def validate_args(release: FakeRelease, tmp_path: Path) -> list[str]:
    return [
        "validate",
        "--dist",
        str(release.dist),
        "--report",
        str(tmp_path / "out" / "report.json"),
        "--junit",
        str(tmp_path / "out" / "junit.xml"),
    ]


def test_a_failed_static_check_still_writes_report_summary_and_annotations(
    fake_release: FakeRelease, s3: S3Server, tmp_path: Path
) -> None:
    """Finding 5: a failed static check exited 1 with one plain line and nothing else: no
    `::error::` on GitHub Actions, no step summary, no report (none on stdout with --json)."""
    summary = tmp_path / "summary.md"
    env = tools_env(GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary))
    names = [r.name for r in fake_release.records]

    plain = run_tools(*validate_args(fake_release, tmp_path), env=env)
    assert plain.returncode == 1, plain.stderr
    for name in names:
        assert f"static checks {name}: not a 64-bit ELF executable" in plain.stdout
        assert (
            f"::error title=tools validate: static checks {name}::not a 64-bit ELF executable"
            in plain.stdout.splitlines()
        )
    assert "Traceback" not in plain.stderr
    page = summary.read_text()
    assert page.startswith("## tools validate: failed")
    assert "Static checks failed (no cell ran):" in page and f"`{names[0]}`" in page

    as_json = run_tools(*validate_args(fake_release, tmp_path), "--json", env=env)
    assert as_json.returncode == 1
    document = json.loads(as_json.stdout)  # stdout: the report alone
    report_file = tmp_path / "out" / "report.json"
    assert document == json.loads(report_file.read_text())
    assert document["passed"] is False and document["results"] == []
    assert document["static"] == {name: ["not a 64-bit ELF executable"] for name in names}
    assert "::error title=tools validate: static checks" in as_json.stderr
    junit = ElementTree.parse(tmp_path / "out" / "junit.xml").getroot()
    assert junit.get("failures") == str(len(names))

    # The contract with release: bytes whose static checks failed are never published.
    fake_release.report.write_text(report_file.read_text())
    refused = run_tools(*release_args(fake_release, s3), "--dry-run")
    assert refused.returncode == 11 and "static checks failed for" in refused.stderr


def test_validate_names_the_architecture_that_is_not_built(
    fake_release: FakeRelease, tmp_path: Path
) -> None:
    """Finding 7: `--only debian-12 --arch arm64` with only amd64 built said "no artifacts
    to validate"."""
    (fake_release.dist / BUILD_RECORD_FILE).unlink()  # records merge: start afresh
    write_build_records(
        fake_release.dist, [r for r in fake_release.records if r.arch is Arch.AMD64]
    )
    args = [*validate_args(fake_release, tmp_path), "--only", "debian-12", "--arch", "arm64"]

    done = run_tools(*args)

    assert done.returncode == 2, done.stdout + done.stderr
    error = " ".join(done.stderr.split())
    assert f"no arm64 artifact is built in {fake_release.dist} (built: linux/amd64)" in error
    assert "tools build --arch arm64" in error and "--arch amd64" in error
    assert "no artifacts to validate" not in error
    as_json = run_tools(*args, "--json")
    assert as_json.returncode == 2
    assert "no arm64 artifact is built" in json.loads(as_json.stdout)["error"]
    assert not (tmp_path / "out" / "report.json").exists()


def test_bad_input_under_json_is_a_json_error_document(
    fake_release: FakeRelease, tmp_path: Path
) -> None:
    """Finding 5: `--json` with bad input printed nothing on stdout."""
    cases = [
        (["--arch", "sparc"], "unsupported architecture 'sparc'"),
        (["--jobs", "0"], "--jobs"),  # refused by the option parser itself
        (["--only", "ubunt"], "did you mean ubuntu"),
    ]
    for extra, words in cases:
        done = run_tools(*validate_args(fake_release, tmp_path), *extra, "--json")
        assert done.returncode == 2, (extra, done.stderr)
        document = json.loads(done.stdout)
        assert document["exit_code"] == 2 and words in document["error"], document
        assert set(document) == {"error", "remedy", "exit_code"}
        assert words in done.stderr  # people still read stderr
        assert "Traceback" not in done.stderr


def test_the_report_names_the_browser_add_on_it_checked(
    fake_release: FakeRelease, tmp_path: Path
) -> None:
    """`tools release` publishes an add-on only if the report names its exact bytes: the
    report listed add-ons' findings by name alone, so no release could carry one."""
    addon = fake_release.add_browser(Arch.AMD64)

    done = run_tools(*validate_args(fake_release, tmp_path), "--json")

    assert done.returncode == 1, done.stderr  # the stand-ins are no real artifacts
    document = json.loads(done.stdout)
    assert addon.to_json() in document["artifacts"]
    assert addon.name in document["static"] and document["results"] == []
    assert "Traceback" not in done.stderr
