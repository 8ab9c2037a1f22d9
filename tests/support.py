"""Helpers shared by test folders: running the real `inspect eval` and `tools --help` as a
user would, in a child process. Plain functions (not fixtures), imported by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def inspect_eval(
    directory: Path, task_file: str, *options: str, env: dict[str, str], json_log: bool = True
) -> subprocess.CompletedProcess[str]:
    """`inspect eval TASK_FILE OPTIONS` from the task's directory, logs under `logs/`
    (JSON, so tests read them without inspect; `json_log=False`: inspect's default)."""
    log_format = ["--log-format", "json"] if json_log else []
    return subprocess.run(
        [sys.executable, "-m", "inspect_ai", "eval", task_file, *options, *log_format,
         "--display", "plain"],
        capture_output=True,
        text=True,
        cwd=directory,
        env={**os.environ, "INSPECT_LOG_DIR": str(directory / "logs"), **env},
        timeout=1200,
    )  # fmt: skip


def eval_samples(directory: Path, done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    """The samples of a successful eval's JSON log."""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (log_file,) = (directory / "logs").glob("*.json")
    log = json.loads(log_file.read_text())
    assert log["status"] == "success", log.get("error")
    return list(log["samples"])


def cli_help(*command: str) -> subprocess.CompletedProcess[str]:
    """`tools COMMAND --help`, wide enough that no line wraps."""
    return subprocess.run(
        [sys.executable, "-m", "sandbox_tools.cli", *command, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "250"},
        timeout=60,
    )
