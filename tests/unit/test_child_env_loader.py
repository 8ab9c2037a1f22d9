"""The loader variables the portable launcher kept from the runtime go back to the
commands it starts (THREAT_MODEL.md, rule 2: the image's LD_PRELOAD must not load into
the runtime, but its own programs get what the image set)."""

from __future__ import annotations

import pytest

from sandbox_tools.runtime.child_env import child_environment


def test_saved_loader_variables_are_given_back_and_the_saved_names_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SANDBOX_TOOLS_SELF", "/opt/x/sandbox-tools")
    monkeypatch.setenv("SANDBOX_TOOLS_SELF_LD_PRELOAD", "/usr/lib/libimage.so")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("SANDBOX_TOOLS_SELF_LD_AUDIT", raising=False)
    monkeypatch.delenv("LD_AUDIT", raising=False)
    env = child_environment()
    assert env["LD_PRELOAD"] == "/usr/lib/libimage.so"
    assert "LD_AUDIT" not in env
    assert not [name for name in env if name.startswith("SANDBOX_TOOLS_SELF")]
