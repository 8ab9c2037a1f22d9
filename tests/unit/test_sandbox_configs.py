"""Sandbox configs as inspect uses them: it hashes every sandbox spec, so the README's
own form `sandbox=("docker_sdk", DockerSdkConfig(image=...))` must hash (user path: an
inspect task configured as the docs show)."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_tools.sandboxes.modal_config import ModalConfig

pytest.importorskip("inspect_ai", reason="needs the [inspect] extra")

from sandbox_tools.inspect.docker_env import DockerSdkConfig


def test_configs_with_list_and_mapping_fields_hash_and_compare_by_value() -> None:
    first = DockerSdkConfig(image="img", tmpfs={"/tmp": "size=64m"}, volumes=["/a:/b:ro"])
    same = DockerSdkConfig(image="img", tmpfs={"/tmp": "size=64m"}, volumes=["/a:/b:ro"])
    other = DockerSdkConfig(image="img", volumes=["/a:/c"])
    assert hash(first) == hash(same) and first == same
    assert len({first, same, other}) == 2
    modal = ModalConfig(image="img", env={"A": "1"}, volumes={"/data": "vol"})
    assert hash(modal) == hash(ModalConfig(image="img", env={"A": "1"}, volumes={"/data": "vol"}))
    assert len({modal, ModalConfig(image="img")}) == 2


def test_a_sandbox_spec_with_our_config_is_accepted_by_inspect() -> None:
    from inspect_ai.util import SandboxEnvironmentSpec

    spec = SandboxEnvironmentSpec("docker_sdk", DockerSdkConfig(image="img", tmpfs={"/t": ""}))
    assert hash(spec) == hash(
        SandboxEnvironmentSpec("docker_sdk", DockerSdkConfig(image="img", tmpfs={"/t": ""}))
    )


@pytest.mark.parametrize(
    ("kind", "config"),
    [
        ("docker_sdk", DockerSdkConfig(image="img", user="1000:1000", tmpfs={"/t": "exec"})),
        ("modal", ModalConfig(image="img", env={"A": "1"}, volumes={"/data": "vol"})),
    ],
)
def test_a_spec_with_our_config_survives_inspects_log_round_trip(kind: str, config: object) -> None:
    """User path: every `inspect eval` reads its sandbox spec back from the log it wrote
    (and so does `inspect log dump`); with no way to rebuild our config, an eval with a
    config object ended with an unrelated ERROR and a log nobody could read."""
    from inspect_ai.util import SandboxEnvironmentSpec

    import sandbox_tools.inspect._registry  # noqa: F401  (registers docker_sdk and modal)

    written = SandboxEnvironmentSpec(kind, config).model_dump(mode="json")
    read = SandboxEnvironmentSpec.model_validate(written)
    assert read.config == config


def test_no_tmpfs_is_none_as_docker_run_without_tmpfs() -> None:
    assert not DockerSdkConfig(image="x", tmpfs=None).tmpfs  # none mounted


def test_a_compose_file_given_to_docker_sdk_says_what_to_do(tmp_path: Any) -> None:
    from sandbox_tools.errors import ConfigurationError
    from sandbox_tools.inspect.docker_env import docker_sdk_config

    compose = tmp_path / "compose.yaml"
    compose.write_text("services:\n  default:\n    image: debian\n    user: agent\n")
    with pytest.raises(ConfigurationError, match="is a compose file") as caught:
        docker_sdk_config(str(compose))
    assert 'sandbox="docker"' in caught.value.remedy and "top level" in caught.value.remedy


def test_an_unknown_field_is_refused_naming_the_field_it_meant(tmp_path: Any) -> None:
    """A misspelt `workdir` was dropped: the working directory stayed `/` and the sample
    failed later, copying its files."""
    from pydantic import ValidationError

    from sandbox_tools.errors import ConfigurationError
    from sandbox_tools.inspect.docker_env import docker_sdk_config

    with pytest.raises(ValidationError, match="did you mean 'working_dir'"):
        DockerSdkConfig(image="x", workdir="/home/agent")  # type: ignore[call-arg]
    config = tmp_path / "sandbox.yaml"
    config.write_text("image: x\nworkdir: /home/agent\n")
    with pytest.raises(ConfigurationError, match="unknown field 'workdir'"):
        docker_sdk_config(str(config))


def test_a_field_given_as_none_takes_its_default() -> None:
    """A compose service moved over keeps its empty keys (null in YAML): each takes its
    default, as tmpfs=None does (they were refused with pydantic's raw errors)."""
    config = DockerSdkConfig(
        image="x",
        environment=None,
        volumes=None,
        command=None,
        read_only=None,  # type: ignore[arg-type]
    )
    assert (config.environment, config.volumes, config.read_only) == ({}, [], False)
    assert config.command == ["sleep", "infinity"]


def test_a_bad_config_file_is_told_one_field_a_line(tmp_path: Any) -> None:
    from sandbox_tools.errors import ConfigurationError
    from sandbox_tools.inspect.docker_env import docker_sdk_config

    config = tmp_path / "sandbox.yaml"
    config.write_text("image: x\npids_limit: lots\n")
    with pytest.raises(ConfigurationError) as caught:
        docker_sdk_config(str(config))
    assert "pids_limit: Input should be a valid integer" in caught.value.message
    assert "errors.pydantic.dev" not in caught.value.message
    assert "DockerSdkConfig" in caught.value.remedy
