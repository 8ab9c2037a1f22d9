from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandbox_tools.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    TOOL_ERROR,
)
from sandbox_tools.runtime.jsonrpc import (
    Params,
    ToolError,
    dispatch,
    encode,
    optional,
    required,
    string_map,
)


async def echo(params: Params) -> Any:
    return {"text": required(params, "text", str), "n": optional(params, "n", int, 1)}


async def tool_fails(params: Params) -> Any:
    raise ToolError("file not found: /nope")


async def crashes(params: Params) -> Any:
    raise RuntimeError("boom")


METHODS = {"echo": echo, "tool_fails": tool_fails, "crashes": crashes}


def run(line: str | bytes) -> dict[str, Any] | None:
    return asyncio.run(dispatch(METHODS, line.encode() if isinstance(line, str) else line))


@pytest.mark.parametrize(
    ("line", "code", "fragment"),
    [
        ("not json", PARSE_ERROR, "not valid JSON"),
        (b"\xff\xfe", PARSE_ERROR, "not valid JSON"),
        ("[1, 2]", INVALID_REQUEST, "expected a JSON object"),
        ('"text"', INVALID_REQUEST, "expected a JSON object"),
        ('{"id": 1, "method": "echo"}', INVALID_REQUEST, '"jsonrpc"'),
        ('{"jsonrpc": "1.0", "id": 1, "method": "echo"}', INVALID_REQUEST, '"jsonrpc"'),
        ('{"jsonrpc": "2.0", "id": 1}', INVALID_REQUEST, '"method"'),
        ('{"jsonrpc": "2.0", "id": 1, "method": 7}', INVALID_REQUEST, '"method"'),
        ('{"jsonrpc": "2.0", "id": [1], "method": "echo"}', INVALID_REQUEST, '"id"'),
        ('{"jsonrpc": "2.0", "id": true, "method": "echo"}', INVALID_REQUEST, '"id"'),
        (
            '{"jsonrpc": "2.0", "id": 1, "method": "echo", "params": [1]}',
            INVALID_REQUEST,
            '"params"',
        ),
        ('{"jsonrpc": "2.0", "id": 1, "method": "nope"}', METHOD_NOT_FOUND, "nope"),
        ('{"jsonrpc": "2.0", "id": 1, "method": "echo"}', INVALID_PARAMS, '"text"'),
        (
            '{"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"text": 5}}',
            INVALID_PARAMS,
            '"text" must be string',
        ),
        (
            '{"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"text": "a", "n": true}}',
            INVALID_PARAMS,
            '"n" must be integer',
        ),
        ('{"jsonrpc": "2.0", "id": 1, "method": "tool_fails"}', TOOL_ERROR, "file not found"),
        ('{"jsonrpc": "2.0", "id": 1, "method": "crashes"}', INTERNAL_ERROR, "boom"),
    ],
)
def test_every_malformed_input_maps_to_its_error(line: str, code: int, fragment: str) -> None:
    response = run(line)
    assert response is not None
    assert response["error"]["code"] == code
    assert fragment in response["error"]["message"]
    assert "Traceback" not in response["error"]["message"]


def test_error_keeps_request_id_when_it_is_valid() -> None:
    response = run('{"jsonrpc": "2.0", "id": "abc", "method": "nope"}')
    assert response is not None and response["id"] == "abc"
    assert response["error"]["data"] == "nope"


def test_result_and_notification() -> None:
    assert run('{"jsonrpc": "2.0", "id": 3, "method": "echo", "params": {"text": "hi"}}') == {
        "jsonrpc": "2.0",
        "id": 3,
        "result": {"text": "hi", "n": 1},
    }
    assert run('{"jsonrpc": "2.0", "method": "echo", "params": {"text": "hi"}}') is None


def test_encode_is_one_line_even_with_newlines_and_unicode() -> None:
    frame = encode({"text": "a\nb ünï 🎉"})
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1
    assert frame.isascii()


def test_string_map_names_the_bad_key() -> None:
    with pytest.raises(Exception, match=r'"env.PATH" must be a string'):
        string_map({"env": {"PATH": 3}}, "env")


def test_a_result_that_is_not_json_becomes_an_error_for_the_same_id() -> None:
    import json as json_module

    from sandbox_tools.runtime.jsonrpc import encode

    line = encode({"jsonrpc": "2.0", "id": 4, "result": {"x": float("nan")}})
    response = json_module.loads(line, parse_constant=lambda name: 1 / 0)
    assert response["id"] == 4 and response["error"]["code"] == -32098
