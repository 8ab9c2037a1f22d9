"""One contract, every provider: the same tests against local, docker and modal.

local and docker run for real here; modal runs when Modal credentials are present and is
skipped with that reason otherwise (never faked). A provider passes when the injector and
`exec_remote` can rely on it: argv verbatim, binary-safe stdin and files, cwd/env/user,
builtin TimeoutError, missing parents created, and FileNotFoundError/IsADirectoryError
from read_file.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from sandbox_tools.sandboxes.base import Sandbox

PROVIDERS = ["local", "docker", "modal"]


@dataclass
class Subject:
    sandbox: Sandbox
    scratch: str  # a writable directory inside the sandbox, unique to the test
    runs_as_root: bool


@pytest.fixture(params=PROVIDERS)
async def subject(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Subject]:
    kind = request.param
    if kind == "local":
        from sandbox_tools.sandboxes.local import LocalSandbox

        yield Subject(LocalSandbox(), str(tmp_path), os.geteuid() == 0)
        return
    if kind == "docker":
        container = request.getfixturevalue("python_container")
        sandbox = container.sandbox
        scratch = f"/tmp/conformance-{uuid.uuid4().hex[:8]}"
        await sandbox.exec(["mkdir", "-p", scratch])
        yield Subject(sandbox, scratch, True)
        await sandbox.cleanup()
        return
    from sandbox_tools.sandboxes.modal import ModalSandbox
    from sandbox_tools.sandboxes.modal_config import ModalConfig, credentials_present

    if not credentials_present():
        pytest.skip("no Modal credentials (MODAL_TOKEN_ID/MODAL_TOKEN_SECRET or ~/.modal.toml)")
    pytest.importorskip("modal", reason="the [modal] extra is not installed")
    modal_sandbox = await ModalSandbox.create(ModalConfig(timeout=600))
    try:
        await modal_sandbox.exec(["mkdir", "-p", "/tmp/conformance"])
        yield Subject(modal_sandbox, "/tmp/conformance", True)
    finally:
        await modal_sandbox.cleanup()


async def test_exec_separates_streams_and_exit_codes(subject: Subject) -> None:
    result = await subject.sandbox.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.returncode, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    assert not result.success


async def test_exec_passes_argv_verbatim(subject: Subject) -> None:
    tricky = "$HOME; `id` $(touch /tmp/pwned) 'quoted' \"double\" \\ newline\n end"
    result = await subject.sandbox.exec(["printf", "%s", tricky])
    assert result.stdout.decode() == tricky


async def test_exec_stdin_is_binary_safe(subject: Subject) -> None:
    data = bytes(range(256)) * 400
    result = await subject.sandbox.exec(["cat"], input=data)
    assert result.stdout == data


async def test_exec_cwd_and_env(subject: Subject) -> None:
    result = await subject.sandbox.exec(
        ["sh", "-c", 'pwd; printf "%s" "$GREETING"'],
        cwd=subject.scratch,
        env={"GREETING": "hello there"},
    )
    assert result.stdout.decode().split("\n") == [subject.scratch, "hello there"]


async def test_exec_timeout_raises_the_builtin_timeout_error(subject: Subject) -> None:
    with pytest.raises(TimeoutError):
        await subject.sandbox.exec(["sleep", "30"], timeout=1)
    # The sandbox is still usable afterwards.
    assert (await subject.sandbox.exec(["true"])).returncode == 0


async def test_exec_as_another_user(subject: Subject) -> None:
    if not subject.runs_as_root:
        pytest.skip("switching users needs a provider running as root")
    result = await subject.sandbox.exec(["id", "-un"], user="nobody")
    assert result.stdout.strip() == b"nobody"


async def test_files_round_trip_binary_and_large(subject: Subject) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17) + bytes(range(256))
    path = f"{subject.scratch}/blob.bin"
    await subject.sandbox.write_file(path, data, mode=0o750)
    assert await subject.sandbox.read_file(path) == data
    mode = await subject.sandbox.exec(["stat", "-c", "%a", path])
    assert mode.stdout.strip() == b"750"
    await subject.sandbox.write_file(f"{subject.scratch}/empty", b"")
    assert await subject.sandbox.read_file(f"{subject.scratch}/empty") == b""


async def test_write_creates_parents_and_replaces(subject: Subject) -> None:
    path = f"{subject.scratch}/a/b c/d/file.txt"
    await subject.sandbox.write_file(path, b"first")
    await subject.sandbox.write_file(path, b"second, longer than the first")
    assert await subject.sandbox.read_file(path) == b"second, longer than the first"
    listing = await subject.sandbox.exec(["ls", "-A", f"{subject.scratch}/a/b c/d"])
    assert listing.stdout == b"file.txt\n"  # no temporary files left behind


async def test_read_errors_are_the_interface_exceptions(subject: Subject) -> None:
    with pytest.raises(FileNotFoundError):
        await subject.sandbox.read_file(f"{subject.scratch}/does-not-exist")
    with pytest.raises(IsADirectoryError):
        await subject.sandbox.read_file(subject.scratch)


async def test_persistent_stream_when_offered(subject: Subject) -> None:
    stream = await subject.sandbox.open_stream(["cat"])
    if stream is None:
        pytest.skip(f"{type(subject.sandbox).__name__} offers no stream (per-call exec)")
    await stream.write(b"one\n")
    assert await stream.readline() == b"one\n"
    await stream.write(b"two\n")
    assert await stream.readline() == b"two\n"
    await stream.close()
