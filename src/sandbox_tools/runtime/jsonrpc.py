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
import traceback
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

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
        details = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        response = error_response(
            request.id,
            RpcError(INTERNAL_ERROR, f"Internal error in {request.method}: {exc}", data=details),
        )
    return None if request.is_notification else response


# -- typed access to params -------------------------------------------------------------


class WireParams:
    """A dataclass of a method's params that the host can also build requests from.

    `parse` reads params on the server and `to_params` writes them on the host, both from
    the dataclass's fields: each key is spelled once. None is left out (the server reads
    a missing field and a null alike). A `user` field is sent as the caller gave it
    (`user=`): the host passes identities through, the server parses them.
    """

    @classmethod
    def parse(cls: type[W], params: Params) -> W:
        """Each field read by its declared type, in the order declared: `str`, `int`,
        `float` or `bool` is required, or optional with a default; `X | None` may be
        absent or null. A class whose params have rules beyond their types (a range, a
        choice, an identity) overrides this."""
        values = {
            name: (
                optional_or_none(params, name, kind)
                if nullable
                else required(params, name, kind)
                if default is _REQUIRED
                else optional(params, name, kind, default)
            )
            for name, kind, nullable, default in _wire_fields(cls)
        }
        return cls(**values)

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


_REQUIRED: Any = object()
_PLAIN = (str, int, float, bool)
_FIELDS: dict[type, list[tuple[str, type, bool, Any]]] = {}


def _wire_fields(cls: type) -> list[tuple[str, type, bool, Any]]:
    """(name, type, nullable, default) per field of a params dataclass, read once."""
    known = _FIELDS.get(cls)
    if known is not None:
        return known
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    fields = []
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        kinds = [k for k in typing.get_args(hint) if k is not type(None)] or [hint]
        nullable = len(kinds) < len(typing.get_args(hint))
        if len(kinds) != 1 or kinds[0] not in _PLAIN:
            raise TypeError(f"{cls.__name__}.{field.name}: {hint} needs a parse of its own")
        default = _REQUIRED if field.default is dataclasses.MISSING else field.default
        fields.append((field.name, kinds[0], nullable, default))
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
