"""Expected failures of the host-side tools, each with an exit code and a remedy.

The CLI catches `SandboxToolsError` once and prints `message` and `remedy`
without a traceback; anything else escaping is a bug and keeps its traceback.
`str()` of an error is its message alone, so code that wraps one error in another
never repeats a remedy; an uncaught error's traceback shows the remedy as a note (Python
3.11+), and where no CLI renders the two apart (a sample's transcript, inspect's
prerequisite error) `explained()` joins them once.
"""

from __future__ import annotations

from typing import Any

from sandbox_tools.protocol import ErrorReason


class SandboxToolsError(Exception):
    """Base class: `exit_code` for the CLI, `remedy` tells the user what to do next."""

    exit_code = 1
    default_remedy = ""

    def __init__(self, message: str, remedy: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy if remedy is not None else self.default_remedy
        if self.remedy and hasattr(self, "add_note"):  # Python 3.11+
            # A library caller's traceback shows it under the message; str() and wrapping
            # errors never carry it, so it is never said twice.
            self.add_note(f"what to do: {self.remedy}")

    def __str__(self) -> str:
        return self.message

    def explained(self) -> str:
        """The message, then the remedy: for readers the CLI does not print to."""
        if not self.remedy:
            return self.message
        return f"{self.message.rstrip('.')}. {self.remedy}"


class ConfigurationError(SandboxToolsError):
    exit_code = 2
    default_remedy = "Check the command-line options and SANDBOX_TOOLS_* environment variables."


class RefusedToolCall(ConfigurationError):
    """A tool call of the MCP gateway that its client can correct (a sandbox id it was
    never given, an image not on the engine): the message says what to do instead."""

    default_remedy = ""


class EngineUnavailableError(SandboxToolsError):
    exit_code = 3
    default_remedy = (
        "Start a Docker engine (`bash scripts/setup.sh` installs and starts one) "
        "or point DOCKER_HOST at a reachable engine."
    )


class SandboxExecError(SandboxToolsError):
    """The sandbox provider could not run a command at all (not: the command failed)."""

    exit_code = 4
    default_remedy = "Check that the sandbox is still running and reachable."


class SandboxOutputLimitError(SandboxExecError):
    """A command printed more than the caller's byte cap; the exec was closed.

    The host never buffers a sandbox's output without limit (THREAT_MODEL.md, rule 3):
    an image whose shell floods stdout ends here instead of exhausting the host.
    """

    default_remedy = (
        "The sandbox printed far more than expected; check the image (a broken or hostile "
        "shell) or raise the command's output limit."
    )


class SandboxInjectionError(SandboxToolsError):
    exit_code = 5
    default_remedy = "See the reason above; the sample cannot use sandbox tools until it is fixed."


class RuntimeTransportError(SandboxToolsError):
    """Talking to the runtime failed: no valid JSON-RPC response came back."""

    exit_code = 6
    default_remedy = (
        "The runtime in the sandbox did not answer; check that it is installed and that the "
        "sandbox is healthy."
    )


class RuntimeRpcError(SandboxToolsError):
    """The runtime answered with a JSON-RPC error that is not a tool error."""

    exit_code = 7

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(self.text(code, message), remedy="")
        self.code = code
        self.data = data

    @staticmethod
    def text(code: int, message: str) -> str:
        return f"runtime error {code}: {message}"


class ToolError(RuntimeRpcError):
    """A tool's expected failure (-32099): its one text is the tool's message, shown to
    the model as is (it can act on it)."""

    exit_code = 8

    @staticmethod
    def text(code: int, message: str) -> str:
        return message

    @property
    def reason(self) -> ErrorReason | None:
        """Why it failed, as the runtime says it for hosts (`data.reason`): the one thing
        host logic decides on. None when it gave none, or one this host does not know."""
        value = self.data.get("reason") if isinstance(self.data, dict) else None
        try:
            return ErrorReason(value) if isinstance(value, str) else None
        except ValueError:
            return None


class BuildError(SandboxToolsError):
    exit_code = 10
    default_remedy = "See the build log above; rerun with --verbose for every command."


class ReleaseRefusedError(SandboxToolsError):
    """A release precondition does not hold, or publishing would change published bytes."""

    exit_code = 11
    default_remedy = "Fix the reason above and run `tools release` again; nothing was uploaded."


class ReleaseFailedError(SandboxToolsError):
    """A target failed mid-release; what is published is complete and correct so far."""

    exit_code = 14
    default_remedy = (
        "Fix the cause above and run the same `tools release` again: objects already "
        "published are compared and skipped, the rest are uploaded."
    )


class ReleaseVerificationError(SandboxToolsError):
    """A published object, downloaded again, does not have the bytes we released."""

    exit_code = 12
    default_remedy = (
        "Do not overwrite published objects: investigate the mirror, then bump the version "
        "and release again."
    )


class NothingValidatedError(SandboxToolsError):
    """`tools validate` ran, nothing failed, but nothing (of what was asked for) passed."""

    exit_code = 15


class FetchError(SandboxToolsError):
    """No mirror or source yielded an artifact with the manifest's size and SHA-256."""

    exit_code = 13
    default_remedy = (
        "Check the mirrors' reachability, pass another with --mirror, or carry a bundle in "
        "and use `tools fetch --from BUNDLE`."
    )
