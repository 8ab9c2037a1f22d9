"""The MCP gateway's pure parts: each tool's input schema made from the params dataclass
its call is parsed with (the runtime's own, for the runtime's tools), a job's output
shown in bounded pieces, and the answers that need no engine (an unknown tool, an
argument the tool does not take, a bad type, a sandbox id never given)."""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any

import pytest

from sandbox_tools.injector.exec_remote import StderrChunk, StdoutChunk
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.mcp_gateway.jobs import take
from sandbox_tools.mcp_gateway.registry import MAX_SANDBOXES, Sandboxes
from sandbox_tools.mcp_gateway.schemas import input_schema, type_schema
from sandbox_tools.mcp_gateway.spec import ContainerSpec
from sandbox_tools.mcp_gateway.tools import (
    ANSWER_CHARS,
    RESULT_CHARS,
    SCHEMAS,
    TOOLS_BY_NAME,
    call_tool,
)
from sandbox_tools.runtime.jsonrpc import WireParams, wire, wire_fields
from sandbox_tools.runtime.tools.bash_session.tool_types import MAX_WAIT_S, InteractParams
from sandbox_tools.runtime.tools.exec_remote.tool_types import (
    DEFAULT_WAIT_MS,
    PollParams,
    StartParams,
)
from sandbox_tools.runtime.tools.text_editor.tool_types import COMMANDS, TextEditorParams
from sandbox_tools.sandboxes.containers import ContainerPolicy

# The runtime method each runtime tool calls, by the dataclass the runtime parses it with.
RUNTIME_PARAMS: dict[str, type[WireParams]] = {
    "bash": InteractParams,
    "text_editor": TextEditorParams,
    "exec_start": StartParams,
    "exec_poll": PollParams,
}


@pytest.mark.parametrize("tool", sorted(RUNTIME_PARAMS))
def test_a_runtime_tools_schema_is_its_methods_params_less_what_the_gateway_fills(
    tool: str,
) -> None:
    """Every field of the runtime's dataclass is in the schema, but those the gateway
    fills (session, acknowledgement, identity, output cap), with its type, default and
    bounds as declared there; `sandbox` comes first and is required."""
    schema = SCHEMAS[tool]
    declared = {field.name: field for field in wire_fields(RUNTIME_PARAMS[tool])}
    filled = set(TOOLS_BY_NAME[tool].filled)
    assert filled <= set(declared)
    assert next(iter(schema["properties"])) == "sandbox"
    assert set(schema["properties"]) == (set(declared) - filled) | {"sandbox"}
    assert "sandbox" in schema["required"]
    for name, rule in schema["properties"].items():
        assert rule["description"], name
        if name == "sandbox":
            continue
        field = declared[name]
        assert (name in schema["required"]) == field.required
        assert rule.get("minimum") == field.rules.minimum
        assert rule.get("maximum") == field.rules.maximum
        assert rule.get("enum", []) == list(field.choices)
        if isinstance(field.default, (str, int, float, bool)):
            assert rule["default"] == field.default


def test_the_declared_rules_reach_the_schema() -> None:
    bash = SCHEMAS["bash"]["properties"]
    assert bash["wait_for_output"] == {
        "type": "number",
        "minimum": 0,
        "maximum": MAX_WAIT_S,
        "default": 30.0,
        "description": bash["wait_for_output"]["description"],
    }
    editor = SCHEMAS["text_editor"]["properties"]
    assert editor["command"]["enum"] == list(COMMANDS)
    assert {k: v for k, v in editor["view_range"].items() if k != "description"} == {
        "type": "array",
        "items": {"type": "integer"},
        "minItems": 2,
        "maxItems": 2,
    }
    assert SCHEMAS["exec_start"]["properties"]["env"]["additionalProperties"] == {"type": "string"}
    assert SCHEMAS["exec_poll"]["properties"]["wait_ms"]["default"] == DEFAULT_WAIT_MS
    create = SCHEMAS["sandbox_create"]
    assert create["required"] == ["image"]
    assert create["properties"]["network_mode"]["enum"] == ["none", "bridge"]
    assert "volumes" not in create["properties"]  # host paths: never the model's to choose


def test_every_tool_has_a_description_and_a_closed_schema() -> None:
    for name, tool in TOOLS_BY_NAME.items():
        listing = tool.listing()
        assert listing["name"] == name and len(listing["description"]) > 40
        assert listing["inputSchema"]["additionalProperties"] is False


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Example(WireParams):
    documented: str = wire(doc="What it is.")
    undocumented: int = 3


def test_a_field_without_a_doc_or_a_doc_without_a_field_is_refused() -> None:
    with pytest.raises(TypeError, match="'undocumented' has no doc"):
        input_schema(_Example)
    assert input_schema(_Example, docs={"undocumented": "Three."})["properties"]["undocumented"]
    with pytest.raises(TypeError, match="docs for fields the schema does not have"):
        input_schema(_Example, leave_out={"undocumented"}, docs={"undocumented": "Three."})


def test_a_type_the_schema_cannot_say_must_be_left_out() -> None:
    (user,) = [f for f in wire_fields(TextEditorParams) if f.name == "user"]
    with pytest.raises(TypeError, match="leave the field out"):
        type_schema(user.kind, "TextEditorParams")


def _chunks(*items: tuple[str, str]) -> deque[StdoutChunk | StderrChunk]:
    return deque(StdoutChunk(text) if kind == "out" else StderrChunk(text) for kind, text in items)


def test_output_is_shown_in_order_at_most_the_budget_and_the_rest_waits() -> None:
    unread = _chunks(("out", "abc"), ("err", "12345"), ("out", "de"))
    first = take(unread, 5)
    assert (first.stdout, first.stderr, first.waiting) == ("abc", "12", 5)
    assert list(unread) == [StderrChunk("345"), StdoutChunk("de")]
    second = take(unread, 100)
    assert (second.stdout, second.stderr, second.waiting) == ("de", "345", 0)
    assert not unread
    assert take(unread, 10) == take(deque(), 10)


def test_a_read_only_root_gets_a_place_for_the_runtime() -> None:
    options = ContainerSpec(image="x", read_only=True).run_options(4)
    assert options["tmpfs"] == {"/tmp": "exec"} and options["network_mode"] == "none"
    given = ContainerSpec(image="x", read_only=True, tmpfs={"/work": "exec"}).run_options(4)
    assert given["tmpfs"] == {"/work": "exec"}
    assert "tmpfs" not in ContainerSpec(image="x").run_options(4)


def _no_engine() -> Any:
    raise AssertionError("these calls never reach an engine")


@pytest.fixture
def sandboxes() -> Sandboxes:
    return Sandboxes(_no_engine, InjectionOptions(), ContainerPolicy())


@pytest.mark.parametrize(
    ("name", "arguments", "said"),
    [
        ("sh", {}, "there is no tool 'sh'; the tools are sandbox_create, "),
        ("bash", {"sandbox": "sbx-1", "inptu": "ls\n"}, "bash has no argument 'inptu' (it takes "),
        ("bash", {"sandbox": "sbx-1", "session_name": "x"}, "bash has no argument 'session_name'"),
        ("bash", ["ls"], "the arguments of bash must be an object, got list"),
        ("exec_poll", {"sandbox": "sbx-1", "pid": "7"}, 'exec_poll: field "pid" must be integer'),
        ("bash", {"input": "ls\n"}, 'bash: missing required field "sandbox"'),
        ("bash", {"sandbox": "s", "wait_for_output": 601}, "must be between 0 and 600"),
        ("text_editor", {"sandbox": "s", "command": "cat", "path": "/"}, "must be one of view,"),
        ("sandbox_create", {"image": "x", "network_mode": "host"}, "must be one of none, bridge"),
        ("exec_start", {"sandbox": "s", "command": "x", "env": {"A=B": "c"}}, "variable name"),
        ("bash", {"sandbox": "sbx-nope", "input": "ls\n"}, "there is no sandbox 'sbx-nope'"),
        ("sandbox_close", {"sandbox": "sbx-nope"}, "pass an id that sandbox_create or sandbox_"),
    ],
)
async def test_what_the_model_got_wrong_is_an_error_result_saying_so(
    sandboxes: Sandboxes, name: str, arguments: Any, said: str
) -> None:
    answer = await call_tool(sandboxes, name, arguments)
    assert answer.is_error, answer
    assert said in answer.text
    assert "Traceback" not in answer.text


async def test_a_huge_argument_is_not_echoed_back_whole(sandboxes: Sandboxes) -> None:
    answer = await call_tool(sandboxes, "bash", {"sandbox": "s" * 10_000_000})
    assert answer.is_error and len(answer.text) < 500
    answer = await call_tool(sandboxes, "bash", {"x" * 10_000_000: 1})
    assert answer.is_error and len(answer.text) < 500


async def test_no_sandboxes_is_an_answer_not_an_error(sandboxes: Sandboxes) -> None:
    answer = await call_tool(sandboxes, "sandbox_list", {})
    assert not answer.is_error and answer.structured == {"sandboxes": [], "attachable": []}


def test_the_answer_bound_leaves_room_for_the_runtimes_notes() -> None:
    assert ANSWER_CHARS > RESULT_CHARS
    assert MAX_SANDBOXES == 16
