"""User journeys: sandbox-tools installed from a git URL into a fresh venv (no checkout,
no wheel), then the docs' injection snippet (docs/INJECTION.md, "Injecting") run as written
against a real container.

Cases: no release for this version (the error used to send the user from the injector
to `tools fetch` to `tools build` and back), the same offline, a release whose mirror
answers, and a release behind a dead proxy. The clone is of this repository's HEAD: in
CI that is the code under test.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools import __version__
from sandbox_tools.platforms import Arch
from sandbox_tools.release.manifest import manifest_from_records
from tests.docs.blocks import BLOCKS

pytestmark = [pytest.mark.journey, pytest.mark.docker]
REPO = Path(__file__).resolve().parents[2]
ARCH = Arch.parse(os.uname().machine)


def readme_injection_snippet(container: str) -> str:
    """The docs' Injector example as a script: its `await`s in an async main."""
    (block,) = [b for b in BLOCKS if "async with Injector() as injector" in b]
    body = block.replace('"my-container"', repr(container)).replace('"make test"', '"echo ok"')
    lines = ["import asyncio", *[b for b in body.splitlines() if b.startswith("from ")]]
    lines.append("async def main():")
    lines += ["    " + b for b in body.splitlines() if not b.startswith("from ")]
    lines.append("    print(result.stdout, end='')")
    lines.append("asyncio.run(main())")
    return "\n".join(lines) + "\n"


def install_from_git(root: Path, published: dict[str, Any] | None = None) -> Path:
    """`pip install git+file://CLONE` into a fresh venv; the dependencies come from this
    venv (a .pth file), so that only sandbox-tools itself is installed from git. With
    `published`, the clone commits it as the release manifest a release carries."""
    clone = root / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    if published is not None:
        target = clone / "src/sandbox_tools/release/published/manifest.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(published))
        git = ["git", "-C", str(clone), "-c", "user.name=t", "-c", "user.email=t@t.invalid"]
        subprocess.run([*git, "add", "-f", str(target)], check=True)
        subprocess.run([*git, "commit", "-qm", "release"], check=True)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (next(venv.glob("lib/python*/site-packages")) / "deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    subprocess.run(
        [venv / "bin/python", "-m", "pip", "install", "-q", "--no-deps",
         "--no-build-isolation", f"git+file://{clone}"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return venv


def run_in(venv: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_TOOLS_")}
    return subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        env={**clean, **env},
        cwd=venv.parent,
        timeout=900,
    )


@pytest.fixture
def container(docker_engine: Any, python_image: str) -> Iterator[str]:
    from sandbox_tools.sandboxes.containers import RunningContainer

    with RunningContainer(docker_engine, python_image) as running:
        yield running.name


def test_no_release_the_error_names_the_step_and_the_step_works(
    tmp_path: Path, container: str
) -> None:
    venv = install_from_git(tmp_path)
    snippet = tmp_path / "snippet.py"
    snippet.write_text(readme_injection_snippet(container))
    env = {"SANDBOX_TOOLS_CACHE": str(tmp_path / "cache")}
    failed = run_in(venv, ["python", str(snippet)], env)
    assert failed.returncode != 0
    for source in ("bundled:", "cache:", "fetch:", "dist:", "build:"):
        assert source in failed.stderr, failed.stderr[-3000:]
    step = re.search(r"Run `(tools build [^`]+)`", failed.stderr)
    assert step is not None, failed.stderr[-3000:]
    assert str(tmp_path / "cache") in step.group(1)
    # Offline, nothing more can be had: the same step.
    offline = run_in(venv, ["python", str(snippet)], {**env, "SANDBOX_TOOLS_OFFLINE": "1"})
    assert offline.returncode != 0 and step.group(0) in offline.stderr
    # Following it, exactly as printed, is enough.
    built = run_in(venv, step.group(1).split(), env)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    done = run_in(venv, ["python", str(snippet)], env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "ok\n"


class Mirror:
    """A release mirror on loopback: serves a directory over HTTP."""

    def __init__(self, directory: Path) -> None:
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=directory)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_release_is_fetched_and_a_dead_proxy_is_named(
    tmp_path: Path, container: str, built_artifacts: Any
) -> None:
    record, artifact = built_artifacts(ARCH)
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(artifact, served / record.name)
    mirror = Mirror(served)
    manifest = manifest_from_records(__version__, [record], [mirror.url])
    venv = install_from_git(tmp_path, manifest.to_json())
    snippet = tmp_path / "snippet.py"
    snippet.write_text(readme_injection_snippet(container))
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    env = {
        "SANDBOX_TOOLS_CACHE": str(tmp_path / "cache"),
        "HTTP_PROXY": dead,
        "http_proxy": dead,
        "NO_PROXY": "",
        "no_proxy": "",
    }
    behind = run_in(venv, ["python", str(snippet)], env)
    assert behind.returncode != 0
    assert "downloading failed" in behind.stderr and "roxy" in behind.stderr, behind.stderr[-3000:]
    assert "tools fetch" in behind.stderr
    env = {"SANDBOX_TOOLS_CACHE": str(tmp_path / "cache")}
    fetched = run_in(venv, ["python", str(snippet)], env)
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    assert fetched.stdout == "ok\n"
    mirror.server.shutdown()
