"""The guard that keeps tests/unit process-free refuses what it names, and only then."""

from __future__ import annotations

import asyncio
import socket
import subprocess

import pytest

from tests.unit.conftest import refuse_processes_and_sockets


def test_the_unit_guard_refuses_processes_and_sockets_while_it_is_on() -> None:
    with pytest.MonkeyPatch.context() as patch:
        refuse_processes_and_sockets(patch)
        with pytest.raises(AssertionError, match="started a process"):
            subprocess.run(["true"])
        with pytest.raises(AssertionError, match="started a process"):
            asyncio.run(asyncio.create_subprocess_exec("true"))
        with socket.socket() as sock, pytest.raises(AssertionError, match="bound a socket"):
            sock.bind(("127.0.0.1", 0))
    assert subprocess.run(["true"]).returncode == 0  # off again once the test ends
