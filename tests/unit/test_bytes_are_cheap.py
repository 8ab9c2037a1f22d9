"""Which sandboxes get add-ons as plain tar (an engine on this host) and which as the
pinned tar.xz: each provider says, and what cannot tell says no (the slower, safe way).
The transfer itself is tested in tests/integration/test_browser_delivery.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inspect_ai.util._sandbox.local import LocalSandboxEnvironment

from sandbox_tools.inspect.adapter import InspectSandbox, docker_cli_on_this_host
from sandbox_tools.inspect.docker_env import DockerSdkSandboxEnvironment
from sandbox_tools.sandboxes.local import LocalSandbox


@pytest.mark.parametrize(
    ("environ", "context", "local"),
    [
        ({}, None, True),
        ({"DOCKER_HOST": "unix:///var/run/docker.sock"}, None, True),
        ({"DOCKER_HOST": "tcp://10.0.0.5:2376"}, None, False),
        ({"DOCKER_HOST": "ssh://build@far"}, None, False),
        ({"DOCKER_CONTEXT": "far"}, None, False),
        ({"DOCKER_CONTEXT": "default"}, "far", True),  # the variable wins over the file
        ({}, "far", False),
        ({}, "default", True),
    ],
)
def test_the_docker_cli_is_on_this_host_only_when_nothing_points_elsewhere(
    tmp_path: Path, environ: dict[str, str], context: str | None, local: bool
) -> None:
    if context is not None:
        (tmp_path / ".docker").mkdir()
        (tmp_path / ".docker/config.json").write_text(json.dumps({"currentContext": context}))
    assert docker_cli_on_this_host(environ, home=tmp_path) is local


def test_an_unreadable_docker_config_counts_as_the_default_context(tmp_path: Path) -> None:
    (tmp_path / ".docker").mkdir()
    (tmp_path / ".docker/config.json").write_text("[not json")
    assert docker_cli_on_this_host({}, home=tmp_path)
    assert not docker_cli_on_this_host(
        {"DOCKER_CONFIG": str(tmp_path / "none"), "DOCKER_HOST": "tcp://x"}
    )


def test_inspect_sandboxes_ask_what_they_wrap() -> None:
    assert LocalSandbox().bytes_are_cheap
    assert InspectSandbox(LocalSandboxEnvironment()).bytes_are_cheap
    ours = DockerSdkSandboxEnvironment(LocalSandbox())  # any Sandbox of ours: it decides
    assert InspectSandbox(ours).bytes_are_cheap

    class Elsewhere(LocalSandbox):
        @property
        def bytes_are_cheap(self) -> bool:
            return False

    assert not InspectSandbox(DockerSdkSandboxEnvironment(Elsewhere())).bytes_are_cheap
    assert not InspectSandbox(object()).bytes_are_cheap  # a provider we do not know
