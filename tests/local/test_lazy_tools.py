"""A fresh server imports a tool, and makes its controller, only when the tool is first
called; the table it answers from is the same as one built whole."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from sandbox_tools.protocol import INTERNAL_ERROR
from sandbox_tools.runtime import methods as server_methods
from sandbox_tools.runtime.jsonrpc import dispatch
from sandbox_tools.runtime.limits import Limits
from sandbox_tools.runtime.methods import TOOLS, Controllers, Tool, all_methods, tool_of

LOADED_AFTER_ONE_CALL = """
import asyncio, json, sys
from sandbox_tools.runtime.jsonrpc import dispatch
from sandbox_tools.runtime.limits import Limits
from sandbox_tools.runtime.methods import Controllers, all_methods

def tools():
    return sorted({m.split(".")[3] for m in sys.modules
                   if m.startswith("sandbox_tools.runtime.tools.") and m.count(".") > 3})

async def main():
    controllers = Controllers(Limits())
    table = all_methods("/nonexistent", lambda: None, controllers)
    first = tools()
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "text_editor",
                       "params": {"command": "view", "path": "/"}}).encode()
    await dispatch(table, line)
    print(json.dumps([first, tools()]))
    await controllers.shutdown()

asyncio.run(main())
"""


def test_a_tool_is_imported_only_when_it_is_first_called() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOADED_AFTER_ONE_CALL], capture_output=True, text=True, check=True
    )
    before, after = json.loads(done.stdout)
    assert before == ["http_tunnel"]  # the host's tunnel, used from the start
    assert after == ["http_tunnel", "text_editor"]


def test_no_two_tools_share_a_prefix_and_every_name_is_its_tools() -> None:
    controllers = Controllers(Limits())
    names = set(all_methods("/nonexistent", lambda: None, controllers))  # loads them all
    for name in names:
        owner = tool_of(name)
        assert owner is None or controllers.loaded(owner)
    prefixes = [(tool, prefix) for tool, spec in TOOLS.items() for prefix in spec.prefixes]
    for tool, prefix in prefixes:
        others = [p for t, p in prefixes if t != tool]
        assert not [p for p in others if p.startswith(prefix) or prefix.startswith(p)], prefix
    assert {"web_go", "bash_session", "exec_remote_poll", "mcp_kill_server"} <= names


@pytest.mark.parametrize("failure", [ImportError, SystemExit])
async def test_a_tool_that_cannot_load_answers_why_and_the_rest_still_serve(
    monkeypatch: pytest.MonkeyPatch, failure: type[BaseException]
) -> None:
    """An import that fails answers each call of that tool with why; the server goes on
    (PyInstaller's importer raises SystemExit when its archive is gone from under it)."""

    def broken(controllers: Controllers) -> Any:
        raise failure("a module is missing from the runtime")

    monkeypatch.setitem(server_methods.TOOLS, "web_browser", Tool(("web_", "browser_"), broken))
    table = all_methods("/nonexistent", lambda: None, Controllers(Limits()))
    answer = await dispatch(table, b'{"jsonrpc": "2.0", "id": 1, "method": "web_go"}')
    assert answer is not None and answer["error"]["code"] == INTERNAL_ERROR
    assert "web_browser tool could not be loaded: a module is missing" in answer["error"]["message"]
    version = await dispatch(table, b'{"jsonrpc": "2.0", "id": 2, "method": "version"}')
    assert version is not None and "result" in version


def test_a_tool_serving_a_name_outside_its_prefixes_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = TOOLS["text_editor"]
    monkeypatch.setitem(server_methods.TOOLS, "text_editor", Tool(("text_editor_x",), real.load))
    with pytest.raises(ValueError, match="outside its prefixes"):
        Controllers(Limits()).load("text_editor")


async def test_an_unknown_name_with_a_tools_prefix_is_not_found() -> None:
    table = all_methods("/nonexistent", lambda: None, Controllers(Limits()))
    answer = await dispatch(table, b'{"jsonrpc": "2.0", "id": 1, "method": "web_nothing"}')
    assert answer is not None and answer["error"]["code"] == -32601
