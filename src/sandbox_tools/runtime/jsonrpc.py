"""JSON-RPC 2.0 parsing, validation and dispatch for the runtime.

Every malformed input maps to a JSON-RPC error object, never to a traceback:
the server keeps serving whatever a client sends it.
"""

from __future__ import annotations

import contextvars
import json
import math
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from sandbox_tools.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    JSONRPC_VERSION,
    MAX_FRAME_BYTES,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    TOOL_ERROR,
    ErrorReason,
)

Params = dict[str, Any]
# Fields whose strings are raw data for a process's stdin, where NUL is legitimate.
NUL_ALLOWED = frozenset({"input", "data"})
_SURROGATE = re.compile("[\ud800-\udfff]")
Method = Callable[[Params], Awaitable[Any]]
FieldReader = Callable[[Params, str], Any]
T = TypeVar("T")
W = TypeVar("W", bound="WireParams")


class RpcError(Exception):
    """An error that becomes a JSON-RPC error object in the response."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class ToolError(RpcError):
    """An expected failure worth showing to the model (-32099); its `reason`, if the host
    may act on it, travels as `data.reason`."""

    def __init__(self, message: str, reason: ErrorReason | None = None) -> None:
        super().__init__(TOOL_ERROR, message, None if reason is None else {"reason": reason.value})


class InvalidParams(RpcError):
    def __init__(self, message: str) -> None:
        super().__init__(INVALID_PARAMS, message)


class Envelope(dict[str, Any]):
    """A method's answer given as response members instead of a `result`.

    Only inspect_ai's large-response continuation needs this: its pieces travel in a
    member of their own, beside `jsonrpc` and `id`.
    """


def error_response(request_id: Any, error: RpcError) -> dict[str, Any]:
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "error": error.to_json()}


def result_response(request_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "result": result}


# The working directory of the CLI a request came through (protocol.CWD_OPTION), set by
# the server for each connection's requests; None if the caller did not say.
CALLER_CWD: contextvars.ContextVar[str | None] = contextvars.ContextVar("caller_cwd", default=None)


def caller_cwd() -> str:
    """Where a process started without `cwd` begins: the caller's directory if it still
    exists, else `/` (the server's own directory is never used: it may be long gone)."""
    cwd = CALLER_CWD.get()
    return cwd if cwd is not None and os.path.isdir(cwd) else "/"


def encode(message: Mapping[str, Any]) -> bytes:
    """One line of compact JSON; ensure_ascii keeps the frame free of raw newlines.

    NaN and infinities are not JSON: a result holding one becomes an error response
    for the same id instead of a frame no strict parser accepts.
    """
    try:
        text = json.dumps(message, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:
        error = RpcError(INTERNAL_ERROR, f"Internal error: the result is not valid JSON ({exc})")
        text = json.dumps(error_response(message.get("id"), error), separators=(",", ":"))
    return text.encode("ascii") + b"\n"


class _NotJson(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotJson(f"{text} is out of range for a number")
    return value


def _check_strings(value: Any, where: str) -> None:
    """Every string (keys too) must be encodable: no lone surrogates; NUL only in the
    fields that carry raw data (stdin). Checked once here, so no tool meets them later
    (they used to surface as -32098 with a traceback)."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise RpcError(INVALID_PARAMS, f'Invalid params: "{path}" holds a lone surrogate')
            if "\x00" in item and path.rsplit(".", 1)[-1] not in NUL_ALLOWED:
                raise RpcError(INVALID_PARAMS, f'Invalid params: "{path}" must not contain NUL')
        elif isinstance(item, dict):
            for key, child in item.items():
                stack.append((key, f"{path} key"))
                stack.append((child, f"{path}.{key}"))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{index}]") for index, child in enumerate(item))


def loads_document(text: str | bytes) -> Any:
    """Strict JSON: size bounded, nesting bounded (RecursionError once escaped as a
    traceback, or as no response at all), no NaN or infinities."""
    if len(text) > MAX_FRAME_BYTES:
        raise RpcError(INVALID_REQUEST, f"Invalid Request: larger than {MAX_FRAME_BYTES} bytes")
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise RpcError(PARSE_ERROR, "Parse error: JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise RpcError(PARSE_ERROR, f"Parse error: request is not valid JSON ({exc})") from None


class Request:
    __slots__ = ("id", "is_notification", "method", "params")

    def __init__(self, method: str, params: Params, request_id: Any, is_notification: bool):
        self.method = method
        self.params = params
        self.id = request_id
        self.is_notification = is_notification


def parse_request(text: str | bytes) -> Request:
    """Parse and validate one request; raise RpcError with the field at fault."""
    return validate_request(loads_document(text))


def validate_request(document: Any) -> Request:
    if not isinstance(document, dict):
        kind = type(document).__name__
        raise RpcError(INVALID_REQUEST, f"Invalid Request: expected a JSON object, got {kind}")
    if document.get("jsonrpc") != JSONRPC_VERSION:
        raise RpcError(INVALID_REQUEST, 'Invalid Request: field "jsonrpc" must be "2.0"')
    is_notification = "id" not in document
    request_id = document.get("id")
    id_ok = request_id is None or (
        isinstance(request_id, (str, int)) and not isinstance(request_id, bool)
    )
    if not id_ok:
        raise RpcError(INVALID_REQUEST, 'Invalid Request: field "id" must be a string or integer')
    method = document.get("method")
    if not isinstance(method, str) or not method:
        raise RpcError(
            INVALID_REQUEST, 'Invalid Request: field "method" must be a non-empty string'
        )
    params = document.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(
            INVALID_REQUEST, 'Invalid Request: field "params" must be an object (named parameters)'
        )
    _check_strings(params, "params")
    return Request(method, params, request_id, is_notification)


def request_id_of(text: str | bytes) -> Any:
    """Best-effort id of a request that failed validation, so the error can be matched."""
    try:
        document = loads_document(text)
    except RpcError:
        return None
    if isinstance(document, dict):
        candidate = document.get("id")
        if isinstance(candidate, (str, int)) and not isinstance(candidate, bool):
            return candidate
    return None


async def dispatch(methods: Mapping[str, Method], line: bytes) -> dict[str, Any] | None:
    """Handle one request line; return the response, or None for a notification."""
    try:
        request = parse_request(line)
    except RpcError as exc:
        return error_response(request_id_of(line), exc)
    handler = methods.get(request.method)
    try:
        if handler is None:
            raise RpcError(
                METHOD_NOT_FOUND, f"Method not found: {request.method}", data=request.method
            )
        result = await handler(request.params)
        if isinstance(result, Envelope):
            response = {"jsonrpc": JSONRPC_VERSION, "id": request.id, **result}
        else:
            response = result_response(request.id, result)
    except RpcError as exc:
        response = error_response(request.id, exc)
    except Exception as exc:
        import traceback  # a failure's details only: the bridge imports this module

        details = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        response = error_response(
            request.id,
            RpcError(INTERNAL_ERROR, f"Internal error in {request.method}: {exc}", data=details),
        )
    return None if request.is_notification else response


# -- typed access to params -------------------------------------------------------------


class FieldRules(NamedTuple):
    """A params field's rules beyond its type, declared beside the field with `wire()`."""

    read: FieldReader | None  # reads the field itself: a shape no type says (a user, an env)
    minimum: float | None
    maximum: float | None
    doc: str | None  # what the field is, for a schema a model reads (the MCP tools)


_REQUIRED: Any = object()
_RULES = "sandbox_tools.wire"  # the metadata key `wire()` keeps a field's rules under
_NO_RULES = FieldRules(None, None, None, None)
_PLAIN = (str, int, float, bool)


class WireField(NamedTuple):
    """One field of a params dataclass as the wire carries it, read from its declaration."""

    name: str
    kind: type  # str, int, float or bool; str for a Literal of strings
    nullable: bool
    default: Any  # _REQUIRED when the field has none
    choices: tuple[Any, ...]  # a Literal's values; empty for any value of `kind`
    rules: FieldRules

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED and not self.nullable

    def read(self, params: Params) -> Any:
        if self.rules.read is not None:
            return self.rules.read(params, self.name)
        if params.get(self.name) is None:
            if self.nullable:
                return None
            if self.default is _REQUIRED:
                raise InvalidParams(f'Invalid params: missing required field "{self.name}"')
            return self.default
        value = _check(params, self.name, self.kind, params[self.name])
        if self.kind is float:
            try:
                value = float(value)
            except OverflowError:  # an integer of hundreds of digits
                raise InvalidParams(
                    f'Invalid params: field "{self.name}" is too large a number'
                ) from None
        if self.choices and value not in self.choices:
            raise InvalidParams(
                f'Invalid params: field "{self.name}" must be one of '
                f"{', '.join(map(str, self.choices))}, got {value!r}"
            )
        low, high = self.rules.minimum, self.rules.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            bound = (
                f"between {low} and {high}"
                if low is not None and high is not None
                else f">= {low}"
                if low is not None
                else f"<= {high}"
            )
            raise InvalidParams(f'Invalid params: field "{self.name}" must be {bound}')
        return value


def wire(
    *,
    default: Any = _REQUIRED,
    read: FieldReader | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    doc: str | None = None,
) -> Any:
    """A params field with rules beyond its type (`dataclasses.field` with them in its
    metadata), so the rules sit beside the field they bound and `parse` applies them: a
    bound (`minimum`, `maximum`), a reader of its own (`read(params, name)`), a `doc`."""
    import dataclasses

    metadata = {_RULES: FieldRules(read, minimum, maximum, doc)}
    if default is _REQUIRED:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class WireParams:
    """A dataclass of a method's params that the host can also build requests from.

    `parse` reads params on the server and `to_params` writes them on the host, both from
    the dataclass's fields: each key is spelled once, and a field's rules (`wire()`) sit
    beside it. None is left out (the server reads a missing field and a null alike). A
    `user` field is sent as the caller gave it (`user=`): the host passes identities
    through, the server parses them.
    """

    @classmethod
    def parse(cls: type[W], params: Params) -> W:
        """Each field read by its declaration, in the order declared: its type (`str`,
        `int`, `float`, `bool`, a `Literal` of them; `X | None` may be absent or null),
        its default (absent: required) and its `wire()` rules."""
        return cls(**{field.name: field.read(params) for field in wire_fields(cls)})

    def to_params(self, user: Any = None) -> dict[str, Any]:
        import dataclasses

        assert dataclasses.is_dataclass(self)
        params = {
            f.name: list(value) if isinstance(value, tuple) else value
            for f in dataclasses.fields(self)
            if (value := getattr(self, f.name)) is not None and f.name != "user"
        }
        if user is not None:
            params["user"] = user
        return params


def _type_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        dict: "object",
        list: "array",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _check(params: Params, name: str, kind: type | tuple[type, ...], value: Any) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        ok = False
    elif float in kinds and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    else:
        ok = isinstance(value, kinds)
    if not ok:
        raise InvalidParams(
            f'Invalid params: field "{name}" must be {_type_name(kind)}, got {type(value).__name__}'
        )
    return value


_FIELDS: dict[type, list[WireField]] = {}


def wire_fields(cls: type) -> list[WireField]:
    """The fields of a params dataclass as the wire carries them, read once per class;
    a TypeError names a field whose type says nothing the wire can check and that has no
    reader of its own."""
    known = _FIELDS.get(cls)
    if known is not None:
        return known
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    fields = []
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        rules = field.metadata.get(_RULES, _NO_RULES)
        kinds = [k for k in typing.get_args(hint) if k is not type(None)]
        nullable = typing.get_origin(hint) is not typing.Literal and len(kinds) < len(
            typing.get_args(hint)
        )
        kind = kinds[0] if nullable and len(kinds) == 1 else hint
        choices: tuple[Any, ...] = ()
        if typing.get_origin(kind) is typing.Literal:
            choices = typing.get_args(kind)
            kind = type(choices[0])
        if rules.read is None and (kind not in _PLAIN or not all(type(c) is kind for c in choices)):
            raise TypeError(f"{cls.__name__}.{field.name}: {hint} needs wire(read=...)")
        default = _REQUIRED if field.default is dataclasses.MISSING else field.default
        fields.append(WireField(field.name, kind, nullable, default, choices, rules))
    _FIELDS[cls] = fields
    return fields


def required(params: Params, name: str, kind: type[T]) -> T:
    if name not in params or params[name] is None:
        raise InvalidParams(f'Invalid params: missing required field "{name}"')
    value: T = _check(params, name, kind, params[name])
    return value


def optional(params: Params, name: str, kind: type[T], default: T) -> T:
    if params.get(name) is None:
        return default
    value: T = _check(params, name, kind, params[name])
    return value


def optional_or_none(params: Params, name: str, kind: type[T]) -> T | None:
    if params.get(name) is None:
        return None
    value: T = _check(params, name, kind, params[name])
    return value


def string_map(params: Params, name: str) -> dict[str, str] | None:
    value = optional_or_none(params, name, dict)
    if value is None:
        return None
    for key, item in value.items():
        if not isinstance(item, str):
            raise InvalidParams(f'Invalid params: field "{name}.{key}" must be a string')
    return value


def env_map(params: Params, name: str, where: str | None = None) -> dict[str, str] | None:
    """An environment for a child process: names and values it can really be given.

    `execve` refuses a name that is empty or holds "=" or NUL, and a value holding NUL;
    such a request once reached it and came back as -32098 with a traceback. `where`
    is the field's full name in the request, for the message (default: `name`).
    """
    field = where or name
    env = params.get(name)
    if env is None:
        return None
    if not isinstance(env, dict):
        raise InvalidParams(
            f'Invalid params: field "{field}" must be object, got {type(env).__name__}'
        )
    for key, value in env.items():
        if not isinstance(value, str):
            raise InvalidParams(f'Invalid params: field "{field}.{key}" must be a string')
        if not key or "=" in key or "\x00" in key:
            raise InvalidParams(
                f'Invalid params: field "{field}" has an invalid variable name {key!r}: a '
                'name must be non-empty and contain neither "=" nor NUL'
            )
        if "\x00" in value:
            raise InvalidParams(
                f'Invalid params: field "{field}.{key}" must not contain NUL (the value of '
                f"environment variable {key!r})"
            )
    return env


# -- the method table ---------------------------------------------------------------------


class MethodTable:
    """The server's methods, each registered by the name of the function that serves it.

    `@table.method` on `async def web_go(params: GoParams)` serves "web_go": the params
    are parsed by the declared type (a `WireParams` class) before the call, or passed as
    received (`Params`, for a method that reads them itself); a function without
    parameters serves a method that takes none. A name registered twice is refused, so
    two tools cannot silently take one method.
    """

    def __init__(self) -> None:
        self.methods: dict[str, Method] = {}

    def method(self, function: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        self.add(function.__name__, function)
        return function

    def add(self, name: str, function: Callable[..., Awaitable[Any]]) -> None:
        self._register(name, _served(name, function))

    def extend(self, methods: Mapping[str, Method]) -> None:
        """Methods served as they are (each takes the params as received)."""
        for name, method in methods.items():
            self._register(name, method)

    def _register(self, name: str, method: Method) -> None:
        if name in self.methods:
            raise ValueError(f"the method {name!r} is registered twice")
        self.methods[name] = method


def _served(name: str, function: Callable[..., Awaitable[Any]]) -> Method:
    """`function` as a Method: its one parameter's declared type says how params are read
    (resolved now, at registration, so a wrong declaration fails when the server starts)."""
    code = function.__code__
    if code.co_argcount == 0:

        async def without_params(params: Params) -> Any:
            return await function()

        return without_params
    if code.co_argcount != 1:
        raise TypeError(f"{name}: a method takes its params or nothing")
    declared = function.__annotations__.get(code.co_varnames[0], "Params")
    kind = function.__globals__.get(declared, declared) if isinstance(declared, str) else declared
    if kind == "Params" or kind is Params:
        return function
    if not (isinstance(kind, type) and issubclass(kind, WireParams)):
        raise TypeError(f"{name}: its params are declared as {declared!r}, not a WireParams")
    parse = kind.parse

    async def parsing(params: Params) -> Any:
        return await function(parse(params))

    return parsing
