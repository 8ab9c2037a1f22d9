"""A model-proxy handler that answers with an inspect_ai `Model`.

An agent inside the sandbox speaks OpenAI chat completions (`POST /v1/chat/completions`)
or Anthropic messages (`POST /v1/messages`), streamed or not; each request becomes one
`Model.generate` call with inspect's public model API, so the task's model (with its
logging, limits and usage accounting) answers it. Text conversations: system, user and
assistant messages with text content (tool definitions and tool calls are not
translated; a request with them gets a 400 saying so).

    async with ModelProxy(support, inspect_model_handler()) as proxy: ...
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageUser,
    GenerateConfig,
    Model,
    ModelOutput,
    get_model,
)

from sandbox_tools.injector.model_proxy import (
    Handler,
    ProxyRequest,
    ProxyRequestRefused,
    ProxyResponse,
)


class _Unsupported(ValueError):
    pass


def _text(content: Any) -> str:
    """Text of a message's content: a string, or a list of text parts/blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _Unsupported(f"content of type {kind!r} is not supported (text only)")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise _Unsupported("message content must be text")


def _message(role: Any, content: Any) -> ChatMessage:
    text = _text(content)
    if role in ("system", "developer"):
        return ChatMessageSystem(content=text)
    if role == "user":
        return ChatMessageUser(content=text)
    if role == "assistant":
        return ChatMessageAssistant(content=text)
    raise _Unsupported(f"messages with role {role!r} are not supported")


def _config(body: dict[str, Any]) -> GenerateConfig:
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    return GenerateConfig(
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        temperature=body.get("temperature") if isinstance(body.get("temperature"), float) else None,
    )


def _sse(events: list[tuple[str | None, Any]]) -> AsyncIterator[bytes]:
    async def stream() -> AsyncIterator[bytes]:
        for name, data in events:
            text = data if isinstance(data, str) else json.dumps(data)
            yield (f"event: {name}\n" if name else "").encode() + f"data: {text}\n\n".encode()

    return stream()


def _usage(output: ModelOutput) -> tuple[int, int]:
    usage = output.usage
    return (usage.input_tokens, usage.output_tokens) if usage else (0, 0)


async def _openai(model: Model, body: dict[str, Any]) -> ProxyResponse:
    if body.get("tools") or body.get("functions"):
        raise _Unsupported("tool definitions are not translated by this handler")
    messages = [_message(m.get("role"), m.get("content")) for m in body.get("messages", [])]
    output = await model.generate(messages, config=_config(body))
    created, ident = int(time.time()), f"chatcmpl-{uuid.uuid4().hex[:24]}"
    prompt, completion = _usage(output)
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if not body.get("stream"):
        return ProxyResponse.json(
            {
                "id": ident,
                "object": "chat.completion",
                "created": created,
                "model": model.name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": output.completion},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
        )
    base = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model.name}
    events: list[tuple[str | None, Any]] = [
        (None, {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        (None, {**base, "choices": [{"index": 0, "delta": {"content": output.completion}}]}),
        (
            None,
            {
                **base,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "usage": usage,
            },
        ),
        (None, "[DONE]"),
    ]
    return ProxyResponse(200, [("Content-Type", "text/event-stream")], _sse(events))


async def _anthropic(model: Model, body: dict[str, Any]) -> ProxyResponse:
    if body.get("tools"):
        raise _Unsupported("tool definitions are not translated by this handler")
    messages: list[ChatMessage] = []
    if body.get("system"):
        messages.append(ChatMessageSystem(content=_text(body["system"])))
    messages += [_message(m.get("role"), m.get("content")) for m in body.get("messages", [])]
    output = await model.generate(messages, config=_config(body))
    ident = f"msg_{uuid.uuid4().hex[:24]}"
    prompt, completion = _usage(output)
    usage = {"input_tokens": prompt, "output_tokens": completion}
    message = {
        "id": ident,
        "type": "message",
        "role": "assistant",
        "model": model.name,
        "content": [{"type": "text", "text": output.completion}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }
    if not body.get("stream"):
        return ProxyResponse.json(message)
    events: list[tuple[str | None, Any]] = [
        ("message_start", {"type": "message_start", "message": {**message, "content": []}}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": output.completion},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return ProxyResponse(200, [("Content-Type", "text/event-stream")], _sse(events))


def inspect_model_handler(model: str | Model | None = None) -> Handler:
    """Answer OpenAI chat completions and Anthropic messages with `model` (the active
    model of the task when None)."""

    async def handler(request: ProxyRequest) -> ProxyResponse:
        resolved = model if isinstance(model, Model) else get_model(model)
        path = request.path.split("?")[0]
        route = {
            "/v1/chat/completions": _openai,
            "/chat/completions": _openai,
            "/v1/messages": _anthropic,
        }
        answer = route.get(path) if request.method == "POST" else None
        if answer is None:
            return ProxyResponse.json(
                {
                    "error": {
                        "type": "not_found",
                        "message": f"{request.method} {path} is not served",
                    }
                },
                status=404,
            )
        try:
            body = request.json()
            if not isinstance(body, dict):
                raise _Unsupported("the request body must be a JSON object")
            return await answer(resolved, body)
        except ProxyRequestRefused:
            raise  # answered with its own status (413 for an oversized body)
        except (_Unsupported, ValueError) as exc:
            return ProxyResponse.json(
                {"error": {"type": "invalid_request_error", "message": str(exc)}}, status=400
            )

    return handler
