"""Typed parameters of the MCP bridge methods (PROTOCOL.md "MCP bridge")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sandbox_tools.runtime.identity import UserSpec, parse_user
from sandbox_tools.runtime.jsonrpc import (
    InvalidParams,
    Params,
    WireParams,
    env_map,
    optional,
    optional_or_none,
    required,
    wire,
)

MAX_ARGS = 4096
MAX_TAG = 128


@dataclass(frozen=True, kw_only=True)
class LaunchParams:
    """`server_params` as the `mcp` SDK's StdioServerParameters dumps it, and `user`."""

    command: str
    args: list[str]
    env: dict[str, str] | None
    cwd: str | None
    encoding: str
    encoding_error_handler: str
    user: UserSpec | None

    @classmethod
    def parse(cls, params: Params) -> LaunchParams:
        server = required(params, "server_params", dict)
        args = optional(server, "args", list, [])
        if len(args) > MAX_ARGS or not all(isinstance(a, str) for a in args):
            raise InvalidParams(
                f'Invalid params: field "server_params.args" must be at most {MAX_ARGS} strings'
            )
        encoding = optional(server, "encoding", str, "utf-8")
        handler = optional(server, "encoding_error_handler", str, "strict")
        if handler not in ("strict", "ignore", "replace"):
            raise InvalidParams(
                'Invalid params: field "server_params.encoding_error_handler" must be '
                "strict, ignore or replace"
            )
        try:
            "".encode(encoding)
        except LookupError:
            raise InvalidParams(f"Invalid params: unknown encoding {encoding!r}") from None
        command = required(server, "command", str)
        if not command:
            raise InvalidParams('Invalid params: field "server_params.command" is empty')
        return cls(
            command=command,
            args=args,
            env=env_map(server, "env", "server_params.env"),
            cwd=optional_or_none(server, "cwd", str),
            encoding=encoding,
            encoding_error_handler=handler,
            user=parse_user(params),
        )


def _session(params: Params) -> int:
    return required(params, "session_id", int)


def _message(params: Params, field: str) -> dict[str, Any]:
    message = required(params, field, dict)
    if message.get("jsonrpc") != "2.0":
        raise InvalidParams(f'Invalid params: field "{field}" must be a JSON-RPC 2.0 message')
    return message


@dataclass(frozen=True)
class SendParams:
    session_id: int
    message: dict[str, Any]

    @classmethod
    def request(cls, params: Params) -> SendParams:
        message = _message(params, "request")
        if not isinstance(message.get("method"), str) or "id" not in message:
            raise InvalidParams('Invalid params: "request" needs a "method" and an "id"')
        return cls(_session(params), message)

    @classmethod
    def notification(cls, params: Params) -> SendParams:
        message = _message(params, "notification")
        if not isinstance(message.get("method"), str) or "id" in message:
            raise InvalidParams('Invalid params: "notification" needs a "method" and no "id"')
        return cls(_session(params), message)

    @classmethod
    def response(cls, params: Params) -> SendParams:
        message = _message(params, "response")
        if "id" not in message or ("result" in message) == ("error" in message):
            raise InvalidParams('Invalid params: "response" needs an "id" and a result or error')
        return cls(_session(params), message)

    def to_params(self, kind: MessageKind) -> dict[str, Any]:
        """The host's side: the params `SendParams.<kind>` parses."""
        return {"session_id": self.session_id, kind: self.message}


MessageKind = Literal["request", "notification", "response"]


@dataclass(frozen=True, kw_only=True)
class SessionParams(WireParams):
    """The params of the methods that name only a session (kill, stderr)."""

    session_id: int


def _tag(params: Params, name: str) -> str:
    tag = optional(params, name, str, "")
    if len(tag) > MAX_TAG:
        raise InvalidParams(f'Invalid params: "{name}" is longer than {MAX_TAG} characters')
    return tag


@dataclass(frozen=True, kw_only=True)
class LaunchOptions(WireParams):
    """Ours, beside `server_params`: `host_messages` forwards what the server says on its
    own to the host; `message_tag` is echoed as "tag" in each of those messages, so a
    host routes them to the session it launched without trusting anything else in them."""

    host_messages: bool = False
    message_tag: str = wire(default="", read=_tag)
