"""The Modal provider's pure parts: chunking, paths, error mapping, retries, compose.

The parts that talk to Modal run in the provider conformance suite when credentials are
present (tests/integration/test_provider_conformance.py), and are skipped otherwise.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox_tools.errors import ConfigurationError
from sandbox_tools.sandboxes.modal import (
    base64_chunks,
    chunk_count,
    os_error_for,
    resolve_path,
    translate_error,
    with_retries,
)
from sandbox_tools.sandboxes.modal_config import config_from_compose


@given(st.binary(max_size=5000), st.integers(min_value=1, max_value=700))
def test_chunks_decode_separately_to_the_original(data: bytes, chunk_bytes: int) -> None:
    chunks = list(base64_chunks(data, chunk_bytes))
    assert b"".join(base64.b64decode(c) for c in chunks) == data
    assert len(chunks) == (0 if not data else chunk_count(len(data), chunk_bytes))
    assert all(len(base64.b64decode(c)) <= chunk_bytes for c in chunks)


def test_chunk_count_covers_empty_and_exact_sizes() -> None:
    assert chunk_count(0, 10) == 1  # an empty file is still one (empty) read
    assert chunk_count(10, 10) == 1 and chunk_count(11, 10) == 2


@pytest.mark.parametrize(
    ("path", "workdir", "expected"),
    [
        ("/etc/hosts", "/work", "/etc/hosts"),
        ("notes.txt", "/work", "/work/notes.txt"),
        ("a/../b/./c", "/work", "/work/b/c"),
        ("../up", "/work/dir", "/work/up"),
        ("x", "", "/x"),
        ("//double//slash", "/", "/double/slash"),
    ],
)
def test_relative_paths_resolve_against_the_workdir(path: str, workdir: str, expected: str) -> None:
    assert resolve_path(path, workdir) == expected


def test_unusable_paths_are_refused() -> None:
    with pytest.raises(ValueError):
        resolve_path("", "/")
    with pytest.raises(ValueError):
        resolve_path("a\0b", "/")


def test_script_failures_map_to_the_interface_exceptions() -> None:
    assert isinstance(os_error_for("/x", 3, b""), FileNotFoundError)
    assert isinstance(os_error_for("/x", 4, b""), IsADirectoryError)
    assert isinstance(os_error_for("/x", 5, b""), PermissionError)
    assert isinstance(
        os_error_for("/x", 1, b"sh: 1: cannot create /x: Permission denied"), PermissionError
    )
    assert isinstance(os_error_for("/x", 1, b"mkdir: Read-only file system"), PermissionError)
    assert isinstance(os_error_for("/x", 1, b"No such file or directory"), FileNotFoundError)
    assert os_error_for("/x", 1, b"something else") is None
    error = os_error_for("/data/f", 3, b"")
    assert error is not None and error.filename == "/data/f"


# Stand-ins with modal.exception's names, module and hierarchy (mapping goes by those, so
# that the provider imports without the SDK).
ModalError = type("Error", (Exception,), {"__module__": "modal.exception"})
AuthError = type("AuthError", (ModalError,), {"__module__": "modal.exception"})
ModalTimeout = type("TimeoutError", (ModalError,), {"__module__": "modal.exception"})
ExecTimeoutError = type("ExecTimeoutError", (ModalTimeout,), {"__module__": "modal.exception"})
InternalError = type("InternalError", (ModalError,), {"__module__": "modal.exception"})


def test_modal_errors_become_interface_errors() -> None:
    auth = translate_error(AuthError("Token missing"))
    assert isinstance(auth, ConfigurationError)
    assert "MODAL_TOKEN_ID" in auth.remedy and "MODAL_TOKEN_SECRET" in auth.remedy
    assert isinstance(translate_error(ExecTimeoutError("deadline")), TimeoutError)
    other = ValueError("x")
    assert translate_error(other) is other


async def test_transient_errors_are_retried_with_backoff() -> None:
    calls: list[int] = []
    waits: list[float] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise InternalError("try again")
        return "ok"

    async def record(seconds: float) -> None:
        waits.append(seconds)

    assert await with_retries(flaky, attempts=4, backoff=0.5, sleep=record) == "ok"
    assert len(calls) == 3
    assert 0.5 <= waits[0] < 0.65 and 1.0 <= waits[1] < 1.3  # doubling, with jitter


async def test_permanent_errors_are_not_retried() -> None:
    calls: list[int] = []

    async def denied() -> None:
        calls.append(1)
        raise AuthError("bad token")

    async def no_wait(_: float) -> None: ...

    with pytest.raises(ConfigurationError, match="Modal refused the credentials"):
        await with_retries(denied, sleep=no_wait)
    assert len(calls) == 1


def test_compose_parameters() -> None:
    config = config_from_compose(
        {
            "services": {
                "default": {
                    "image": "python:3.12-slim",
                    "working_dir": "/work",
                    "cpus": 2,
                    "mem_limit": "2g",
                    "ports": ["8080:80", {"target": 9000}],
                    "volumes": ["cache:/cache"],
                    "environment": ["A=1", "B=two"],
                    "deploy": {
                        "resources": {"reservations": {"devices": [{"capabilities": ["gpu"]}]}}
                    },
                }
            }
        }
    )
    assert config.image == "python:3.12-slim" and config.workdir == "/work"
    assert config.cpu == 2.0 and config.memory == 2048
    assert config.ports == (80, 9000)
    assert config.volumes == {"/cache": "cache"}
    assert config.env == {"A": "1", "B": "two"}
    assert config.gpu == "any:1"


def test_compose_without_an_image_or_with_a_bind_mount_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="has no image"):
        config_from_compose({"services": {"default": {"build": "."}}})
    with pytest.raises(ConfigurationError, match="named volumes only"):
        config_from_compose({"services": {"s": {"image": "x", "volumes": ["./src:/src"]}}})


class _BoundedStdin:
    """A stdin that, like Modal's, refuses more than 2 MiB buffered between drains."""

    def __init__(self) -> None:
        self.buffered = 0
        self.sent = bytearray()
        self.drain = self

    def write(self, data: bytes) -> None:
        if self.buffered + len(data) > 2 << 20:
            raise BufferError("Buffer size exceed limit. Call drain to flush the buffer.")
        self.buffered += len(data)
        self.sent += data

    async def aio(self) -> None:
        self.buffered = 0


async def test_a_large_write_reaches_modals_stdin_in_pieces_it_accepts() -> None:
    """The first start's input (the runtime's 9 MB) goes to a stream's stdin in one call:
    Modal's writer refuses that much between drains, so it goes in pieces."""
    from types import SimpleNamespace

    from sandbox_tools.sandboxes.modal import _ModalStream

    async def nothing() -> Any:
        return
        yield

    stdin = _BoundedStdin()
    stream = _ModalStream(SimpleNamespace(stdin=stdin, stdout=nothing()))
    data = bytes(range(256)) * (9 << 12)  # 9 MiB
    await stream.write(data)
    assert bytes(stdin.sent) == data
