"""`tools exec-remote` on this machine: stdout carries only the command's own
output (the summary goes to stderr), and a timeout or Ctrl-C leaves neither the command
nor the runtime server running."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from tests.support import eventually


def ctrl_c_as_in_a_terminal() -> None:
    """A job started in the background of a non-interactive shell (as CI may run us)
    inherits SIGINT ignored, and Python then never raises KeyboardInterrupt: restore
    what a terminal gives the child."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def tools(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sandbox_tools.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_in_a_terminal,
    )


def running(marker: str) -> bool:
    # Anchored: the CLI's own command line contains the marker too.
    found = subprocess.run(["pgrep", "-f", f"^{marker}"], capture_output=True, text=True)
    return bool(found.stdout.strip())


def test_stdout_is_only_the_commands_output() -> None:
    done = tools("exec-remote", "echo hello; echo oops >&2")
    stdout, stderr = done.communicate(timeout=120)
    assert done.returncode == 0, stderr
    assert stdout == "hello\n"
    assert "oops" in stderr and "exit code" in stderr


def test_timeout_leaves_nothing_running() -> None:
    marker = f"sleep 3{uuid.uuid4().int % 1000:03d}"
    done = tools("exec-remote", marker, "--timeout", "1")
    _, stderr = done.communicate(timeout=120)
    assert done.returncode == 124, stderr
    assert "did not finish within 1" in stderr
    eventually(lambda: not running(marker), "the command ends with the CLI")


def orphaned_servers() -> list[str]:
    """Runtime servers whose directory is gone: the CLI deletes its temporary server
    directory on the way out, so a server it left running shows up here (servers of
    other runs on this machine keep their directories and do not)."""
    found = subprocess.run(
        ["pgrep", "-f", "sandbox_tools.runtime server --dir"], capture_output=True, text=True
    )
    orphans = []
    for pid in found.stdout.split():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        directory = argv[argv.index(b"--dir") + 1].decode() if b"--dir" in argv else ""
        if directory and not Path(directory).exists():
            orphans.append(pid)
    return orphans


def test_ctrl_c_leaves_nothing_running() -> None:
    marker = f"sleep 4{uuid.uuid4().int % 1000:03d}"
    done = tools("exec-remote", marker)
    eventually(lambda: running(marker), "the command started", timeout=60)
    done.send_signal(signal.SIGINT)
    _, stderr = done.communicate(timeout=120)
    assert done.returncode == 130 and "interrupted" in stderr, stderr
    eventually(lambda: not running(marker), "the command ends with the CLI")
    eventually(lambda: not orphaned_servers(), "the runtime server ends with the CLI")


def test_distro_and_image_choose_the_container(
    docker_engine: object, python_image: str, built_artifacts: object, tmp_path: Path
) -> None:
    """--image took only matrix names. Now --distro takes those, --image a real
    image on the engine (never pulled), and a wrong one is a clear error."""
    import os

    from tests.support import arches_under_test

    _record, artifact = built_artifacts(arches_under_test()[0])  # type: ignore[operator]
    env = {**os.environ, "SANDBOX_TOOLS_DIST": str(artifact.parent)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sandbox_tools.cli", "exec-remote", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )

    real = run("cat /etc/debian_version", "--image", python_image)
    assert real.returncode == 0, real.stderr
    assert real.stdout.strip()[:2].isdigit() and python_image in real.stderr
    missing = run("true", "--image", "no-such-image:here")
    assert missing.returncode == 2 and "not on the Docker engine" in missing.stderr
    unknown = run("true", "--distro", "debain-12")
    assert unknown.returncode == 2 and "did you mean debian-12" in unknown.stderr


def test_an_image_that_cannot_be_kept_running_is_a_clear_error_and_leaves_nothing(
    docker_engine: Any,
) -> None:
    """An image without `sleep` (the shell-less busybox): the engine cannot start the
    container. It was an internal error, and a container stayed behind in 'Created'."""
    import os

    from sandbox_tools.platforms import Arch
    from sandbox_tools.sandboxes.images import ensure_busybox_image

    image = ensure_busybox_image(docker_engine, Arch.parse(os.uname().machine), applets=False)
    from sandbox_tools.sandboxes.containers import OWNER_LABEL

    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandbox_tools.cli",
            "-q",
            "exec-remote",
            "--image",
            image,
            "echo x",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = run.communicate(timeout=300)
    assert run.returncode == 2, stdout + stderr
    assert "cannot start a container of" in stderr and "internal error" not in stderr
    mine = {"label": f"{OWNER_LABEL}={run.pid}"}  # only what that process made
    assert not docker_engine.containers.list(all=True, ignore_removed=True, filters=mine)
