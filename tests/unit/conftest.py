"""Unit tests are fast and process-free: pure logic, no child process, no socket that
connects or listens. A test that needs one belongs in tests/local (real processes and
loopback servers) or tests/integration (containers); this guard keeps the line."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest


def _refuse(what: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(
            f"a unit test {what}: move it to tests/local (processes, loopback) or "
            "tests/integration (containers)"
        )

    return refused


def refuse_processes_and_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("started a process"))
    monkeypatch.setattr(asyncio, "create_subprocess_exec", _refuse("started a process"))
    monkeypatch.setattr(asyncio, "create_subprocess_shell", _refuse("started a process"))
    monkeypatch.setattr(os, "posix_spawn", _refuse("started a process"))
    monkeypatch.setattr(os, "fork", _refuse("forked"))
    monkeypatch.setattr(socket.socket, "connect", _refuse("connected a socket"))
    monkeypatch.setattr(socket.socket, "bind", _refuse("bound a socket"))


@pytest.fixture(autouse=True)
def process_free(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    refuse_processes_and_sockets(monkeypatch)
    yield
