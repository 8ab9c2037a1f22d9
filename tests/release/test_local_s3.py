"""docs/RELEASING.md's "A local S3" block, run as written: moto's server on 127.0.0.1 with
dummy credentials, a release to it, and a fetch from it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from sandbox_tools.artifacts import sha256_of
from sandbox_tools.release.manifest import MANIFEST_FILE, read_manifest
from tests.docs.blocks import ROOT, code_blocks
from tests.release.conftest import FakeRelease, aws_env, git

KEY = "tools release --s3-bucket local-releases --s3-endpoint-url $S3"


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port: int = probe.getsockname()[1]
        return port


def test_the_local_s3_block_releases_to_moto_and_fetches_from_it(
    fake_release: FakeRelease, tmp_path: Path
) -> None:
    (block,) = [b for b in code_blocks([ROOT / "docs" / "RELEASING.md"]) if KEY in b.source]
    assert block.marker == "run by" and block.test_file == "tests/release/test_local_s3.py"
    # A clone after steps 2 and 3: the artifacts and the report, committed (a clean tree).
    clone = tmp_path / "clone"
    shutil.copytree(fake_release.dist, clone / "dist")
    shutil.copyfile(fake_release.report, clone / "validate-report.json")
    shutil.copyfile(ROOT / ".gitignore", clone / ".gitignore")
    git(clone, "init", "-q")
    git(clone, "add", ".")
    git(clone, "commit", "-qm", "built and validated")
    venv_bin = Path(sys.executable).parent
    env = {
        **os.environ,
        **aws_env(),
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "PORT": str(_free_port()),
        "TMPDIR": str(tmp_path / "tmp"),
    }
    (tmp_path / "tmp").mkdir()
    # As written, then its server stopped however it ended.
    script = "trap 'kill $(jobs -p) 2>/dev/null' EXIT\n" + "\n".join(block.commands())

    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    manifest = read_manifest(clone / "dist" / MANIFEST_FILE)
    s3 = f"http://127.0.0.1:{env['PORT']}/local-releases/releases/{manifest.version}/"
    (scratch,) = (tmp_path / "tmp").iterdir()  # the block's mktemp -d
    for artifact in manifest.artifacts:
        assert artifact.urls == (f"{s3}{artifact.name}",)
        assert sha256_of(scratch / "fetched" / artifact.name) == artifact.sha256
        assert f"{artifact.platform}/{artifact.name}: fetched from {s3}" in done.stdout
