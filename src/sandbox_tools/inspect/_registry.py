"""Loaded by inspect_ai through the `inspect_ai` entry point: registers our sandboxes."""

from sandbox_tools.inspect.docker_env import DockerSdkSandboxEnvironment
from sandbox_tools.inspect.modal_env import ModalSandboxEnvironment

__all__ = ["DockerSdkSandboxEnvironment", "ModalSandboxEnvironment"]
