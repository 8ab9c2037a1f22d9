"""The gateway's tool input schemas, made from the params dataclasses the calls are
parsed with: pure, no I/O.

A runtime method's parameters are declared once, in its `WireParams` dataclass
(`runtime/tools/*/tool_types.py`); `wire_fields` reads each field's type, choices,
default, bounds and doc from that declaration. The schema a model sees is made from the
same fields, less those the gateway fills itself (a session name, an acknowledgement),
and the arguments are then parsed by the same dataclass, so the schema and the parse
cannot disagree. The runtime's fields carry no docs of their own (its other clients are
programs); what a model reads about each is given here, by field name, and a field's own
`doc` wins where it has one.
"""

from __future__ import annotations

import typing
from collections.abc import Collection, Mapping
from typing import Any

from sandbox_tools.runtime.jsonrpc import InvalidParams, WireField, WireParams, wire_fields

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_PLAIN_DEFAULTS = (str, int, float, bool)
# The argument every tool but the sandbox_* ones that make or list sandboxes takes.
SANDBOX_FIELD = "sandbox"


def type_schema(kind: Any, where: str) -> dict[str, Any]:
    """The JSON Schema of a field's type: a plain type, `dict[str, X]` (an object of
    X values) or a fixed-length `tuple[X, ...]` of one item type (an array of that many)."""
    if kind in _JSON_TYPES:
        return {"type": _JSON_TYPES[kind]}
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is dict and len(args) == 2 and args[0] is str:
        return {"type": "object", "additionalProperties": type_schema(args[1], where)}
    if origin is tuple and args and Ellipsis not in args and len(set(args)) == 1:
        return {
            "type": "array",
            "items": type_schema(args[0], where),
            "minItems": len(args),
            "maxItems": len(args),
        }
    raise TypeError(f"{where}: no JSON Schema for {kind!r}; leave the field out or fill it")


def property_schema(field: WireField, where: str, docs: Mapping[str, str]) -> dict[str, Any]:
    rule = type_schema(field.kind, where)
    if field.choices:
        rule["enum"] = list(field.choices)
    if field.rules.minimum is not None:
        rule["minimum"] = field.rules.minimum
    if field.rules.maximum is not None:
        rule["maximum"] = field.rules.maximum
    if isinstance(field.default, _PLAIN_DEFAULTS):
        rule["default"] = field.default
    doc = field.rules.doc or docs.get(field.name)
    if not doc:
        raise TypeError(f"{where}: the field {field.name!r} has no doc for the model")
    rule["description"] = doc
    return rule


def input_schema(
    params: type[WireParams] | None,
    *,
    leave_out: Collection[str] = (),
    docs: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The JSON Schema of a tool's arguments: the fields of the dataclass its call is
    parsed into, but those in `leave_out` (the gateway fills them), `sandbox` first.
    Every property has a description (its `doc`, else `docs[name]`): a TypeError
    otherwise, and for a docs entry naming no property (a doc that drifted from its field)."""
    where = "no params" if params is None else params.__name__
    fields = [f for f in (wire_fields(params) if params else []) if f.name not in leave_out]
    fields.sort(key=lambda f: f.name != SANDBOX_FIELD)  # stable: declared order otherwise
    given = dict(docs or {})
    stale = set(given) - {f.name for f in fields}
    if stale:
        raise TypeError(f"{where}: docs for fields the schema does not have: {sorted(stale)}")
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {f.name: property_schema(f, where, given) for f in fields},
        "additionalProperties": False,
    }
    required = [f.name for f in fields if f.required]
    if required:
        schema["required"] = required
    return schema


def argument_problem(tool: str, schema: Mapping[str, Any], arguments: Any) -> str | None:
    """What is wrong with the arguments' shape before they are parsed (not an object, a
    name the tool does not take), in a sentence for the model; None if nothing. The types,
    choices and bounds are the parse's to check: it reads the same declarations."""
    if not isinstance(arguments, dict):
        return f"the arguments of {tool} must be an object, got {type(arguments).__name__}"
    properties: Mapping[str, Any] = schema["properties"]
    for name in arguments:
        if name not in properties:
            takes = ", ".join(properties) or "no arguments"
            return f"{tool} has no argument {str(name)[:80]!r} (it takes {takes})"
    return None


def parse_problem(tool: str, error: InvalidParams) -> str:
    """The parse's refusal as the model reads it: the tool named, the JSON-RPC prefix off."""
    return f"{tool}: {error.message.removeprefix('Invalid params: ')}"
