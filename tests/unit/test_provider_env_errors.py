"""How our inspect sandboxes read a failed exec or file operation (pure: no sandbox)."""

from __future__ import annotations

import pytest

pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")

from sandbox_tools.inspect.provider_env import file_error, launch_failure
from sandbox_tools.sandboxes.base import ExecOutput

RUNC = 'OCI runtime exec failed: exec failed: unable to start container process: exec: "{}": {}'


def test_the_runtimes_refusal_names_the_binary_and_reason() -> None:
    said = RUNC.format("/etc/passwd", "permission denied: unknown").encode()
    assert launch_failure(ExecOutput(126, said + b"\r\n", b"")) == (
        "/etc/passwd",
        "permission denied: unknown",
    )
    missing = RUNC.format("/bin/sh", "stat /bin/sh: no such file or directory: unknown")
    assert launch_failure(ExecOutput(127, b"", missing.encode()))[0] == "/bin/sh"  # type: ignore[index]


@pytest.mark.parametrize(
    "result",
    [
        # a command's own output, however it looks: another exit code, more than one
        # line, or a long answer
        ExecOutput(1, RUNC.format("/bin/sh", "permission denied").encode(), b""),
        ExecOutput(126, RUNC.format("x", "permission denied").encode() + b"\nmore", b""),
        ExecOutput(126, b"OCI runtime exec failed" + b"x" * 5000, b""),
        ExecOutput(126, b"\xc3\x28 binary", b""),
    ],
)
def test_a_commands_own_output_is_not_a_refusal(result: ExecOutput) -> None:
    assert launch_failure(result) is None


@pytest.mark.parametrize(
    ("said", "kind"),
    [
        ("sh: 1: cannot create /w/x: Is a directory", IsADirectoryError),
        ("sh: 1: cannot create /w/x: Permission denied", PermissionError),
        ("cat: /w/x: Permission denied", PermissionError),
        ("cat: /w/x: No such file or directory", FileNotFoundError),
        ("mkdir: cannot create directory '/w/x': Read-only file system", PermissionError),
        ("cat: /w/x/y: Not a directory", NotADirectoryError),
    ],
)
def test_file_errors_are_inspects_exceptions_naming_the_file(said: str, kind: type) -> None:
    error = file_error(said, "x.txt")
    assert isinstance(error, kind)
    assert "x.txt" in str(error)


def test_an_unknown_failure_is_left_to_the_caller() -> None:
    assert file_error("cat: write error: No space left on device", "x") is None
