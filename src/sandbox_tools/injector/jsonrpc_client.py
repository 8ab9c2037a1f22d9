"""JSON-RPC clients for the runtime inside a sandbox.

Two transports, one interface:
- `ExecRuntimeClient`: one `sandbox.exec([runtime, "exec"])` per call; works with
  any provider.
- `StdioRuntimeClient`: one long-lived `runtime stdio` process per sandbox,
  requests multiplexed by id; no process start per call. If the stream dies,
  calls in flight fail with `RuntimeTransportError` and the next call opens a
  new stream: a call is never silently sent twice.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import collections
import contextlib
import itertools
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandbox_tools.errors import (
    RuntimeRpcError,
    RuntimeTransportError,
    SandboxExecError,
    SandboxToolsError,
    ToolError,
)
from sandbox_tools.injector.log_bounds import Throttled, said
from sandbox_tools.protocol import (
    JSONRPC_VERSION,
    MAX_FRAME_BYTES,
    MAX_JSON_VALUES,
    RESPONSE_CHUNK_FIELD,
    RESPONSE_CHUNK_METHOD,
    RESPONSE_MAX_BYTES_ENV,
    RUNTIME_SERVER_LOST,
    SERVER_DIR_ENV,
    TOOL_ERROR,
    json_cost,
    json_values,
)
from sandbox_tools.sandboxes.base import Sandbox, Stream

# Every call is bounded in time by default (THREAT_MODEL.md, rule 3): a runtime that is
# stopped or wedged costs the caller this long at most, then RuntimeTransportError.
DEFAULT_CALL_TIMEOUT = 120.0
# Closing a stream waits for the other side at most this long.
CLOSE_TIMEOUT = 10.0
# A channel that closed before its first answer: one more run of the runtime, to say why.
DIAGNOSE_TIMEOUT = 30.0
# The largest response the host accepts: one frame of the runtime's protocol.
MAX_RESPONSE_BYTES = MAX_FRAME_BYTES
# The least a piece of a held response carries (all but the last): the runtime's are as
# large as the caller's output limit allows, which is never this small.
MIN_PIECE_BYTES = 1024
# The channel's reader gives the event loop a turn after a sandbox message this long.
YIELD_AFTER_BYTES = 64 * 1024
# A first start that reads input (the runtime's bytes) prints this line once it has taken
# and checked it, before the runtime starts; the input's transfer and check are bounded.
STAGED_LINE = b"sandbox-tools: staged\n"
HAND_OVER_TIMEOUT = 120.0


class FirstStartFailed(RuntimeTransportError):
    """A first start that was given input ran and did not take it: its prefix ran, so
    nothing is tried again on another transport. `timed_out`: the input was not taken
    and checked within the deadline (what it left says nothing of its bytes)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class NoStreamForInput(RuntimeTransportError):
    """The provider holds no stream open, so a first start's input cannot travel with
    it; nothing ran."""


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters)"


# The most of a runtime error's message the host keeps: whatever answers in the sandbox
# may send 60 MiB of it, which went on whole into the model's tool error and the log.
MAX_MESSAGE_CHARS = 10_000


def bounded_text(text: str, limit: int, what: str) -> str:
    """Text from the sandbox, as the host may pass it on: cut at a line (with a note of
    what was left out) past `limit`, and lone surrogates replaced (JSON can carry them;
    a model request or a log serialised as UTF-8 cannot)."""
    if len(text) > limit:
        cut = text.rfind("\n", 0, limit)
        kept = text[: cut if cut > 0 else limit]
        text = (
            f"{kept}\n[the {what} was cut by the host: {len(text) - len(kept):,} more characters]"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


MAX_SCREENSHOT_BYTES = 16 << 20
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def checked_png(encoded: object, what: str) -> bytes:
    """A screenshot from the sandbox (base64 of a PNG), decoded: RuntimeTransportError
    for anything else (not text, over MAX_SCREENSHOT_BYTES, not strict base64, not a
    PNG), so that nothing but an image reaches a model's input as one."""
    if not isinstance(encoded, str):
        raise RuntimeTransportError(f"{what}: the image is not text")
    if len(encoded) > (MAX_SCREENSHOT_BYTES + 2) // 3 * 4:
        raise RuntimeTransportError(f"{what}: the image is over {MAX_SCREENSHOT_BYTES >> 20} MiB")
    try:
        png = base64.b64decode(encoded, validate=True)
    except ValueError:
        raise RuntimeTransportError(f"{what}: the image is not base64") from None
    if not png.startswith(PNG_SIGNATURE):
        raise RuntimeTransportError(f"{what}: the image is not a PNG")
    return png


def _last_line(output: bytes) -> bytes:
    """The last line of `output` once stripped (`output.strip().splitlines()[-1]`, b"" if
    there is none), found without splitting the rest: 64 MiB of short lines split would
    be 22 million bytes objects, 1.3 GB of the host's memory (THREAT_MODEL.md, rule 3)."""
    text = output.strip()
    return text[max(text.rfind(b"\n"), text.rfind(b"\r")) + 1 :]


def parse_response_line(line: bytes | str, method: str) -> Any:
    """One response frame as JSON; anything else is the transport's failure, typed.

    A frame that may hold more than MAX_JSON_VALUES values is refused unparsed: parsed, a
    few MB of `[{},{},...]` would take GBs of the host's memory and seconds of its loop.
    """
    values = json_values(line)
    if values > MAX_JSON_VALUES:
        raise RuntimeTransportError(
            f"{method}: the runtime sent a frame of up to {values} JSON values; the host "
            f"parses at most {MAX_JSON_VALUES}"
        )
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        # RecursionError: 100,000 nested brackets are not a response either.
        raise RuntimeTransportError(
            f"{method}: the runtime printed something that is not JSON: {_describe(line[:200])}"
        ) from None


def unwrap_response(response: Any, method: str) -> Any:
    """The result of a response object, or the typed error it carries.

    Every shape check raises RuntimeTransportError naming what was wrong: a hostile or
    broken sandbox must not surface as AttributeError or KeyError in the host.
    """
    if not isinstance(response, dict) or response.get("jsonrpc") != JSONRPC_VERSION:
        raise RuntimeTransportError(
            f"{method}: the runtime sent a malformed response: {_describe(response)}"
        )
    if "error" in response:
        error = response["error"]
        if not isinstance(error, dict):
            raise RuntimeTransportError(
                f"{method}: the runtime's error is not an object: {_describe(error)}"
            )
        code, message = error.get("code"), error.get("message", "unknown error")
        if not isinstance(code, int) or isinstance(code, bool) or not isinstance(message, str):
            raise RuntimeTransportError(
                f"{method}: the runtime's error has no integer code and string message: "
                f"{_describe(error)}"
            )
        message = bounded_text(message, MAX_MESSAGE_CHARS, "error message")
        if code == TOOL_ERROR:
            raise ToolError(code, message, error.get("data"))
        raise RuntimeRpcError(code, message, error.get("data"))
    if "result" not in response:
        raise RuntimeTransportError(
            f"{method}: the runtime's response has no result: {_describe(response)}"
        )
    return response["result"]


def result_fields(result: Any, method: str, **fields: type | tuple[type, ...]) -> dict[str, Any]:
    """`result` checked to be an object with these fields of these types.

    bool is not accepted where int is asked for (JSON true is not a number).
    """
    if not isinstance(result, dict):
        raise RuntimeTransportError(
            f"{method}: expected an object as the result, got {_describe(result)}"
        )
    for name, kind in fields.items():
        value = result.get(name)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise RuntimeTransportError(
                f"{method}: the result's field {name!r} is {_describe(value)}, expected "
                + " or ".join(k.__name__ for k in kinds)
            )
    return result


@dataclass(frozen=True, kw_only=True)
class RuntimeInfo:
    """What a runtime server says it is (`runtime_info`, PROTOCOL.md), read in this one
    place: the host compares builds and names directories from typed fields, never from
    a sandbox's dict."""

    version: str
    build_id: str
    format: str
    platform: str
    pid: int
    server_dir: str
    # The limits the server holds, by name (read once, when it started): a reused server
    # started with other values shows them here. Numbers only, at most MAX_LIMITS of them.
    limits: Mapping[str, int | float] = field(default_factory=dict)

    @classmethod
    def parse(cls, result: Any) -> RuntimeInfo:
        """The answer to `runtime_info`; RuntimeTransportError names a missing or
        mistyped field."""
        fields = result_fields(
            result,
            "runtime_info",
            version=str,
            build_id=str,
            format=str,
            platform=str,
            pid=int,
            server_dir=str,
        )
        return cls(
            version=fields["version"],
            build_id=fields["build_id"],
            format=fields["format"],
            platform=fields["platform"],
            pid=fields["pid"],
            server_dir=fields["server_dir"],
            limits=_limits(result.get("limits")),
        )


# What the host keeps of `runtime_info`'s limits: their count, and each name's length
# (the runtime's names are a few words; a sandbox could send megabytes of them).
MAX_LIMITS = 64
MAX_LIMIT_NAME_CHARS = 64


def _limits(value: Any) -> dict[str, int | float]:
    """`runtime_info`'s limits as the sandbox sent them, kept only where each is a named
    number (the sandbox is untrusted; anything else reads as not reported)."""
    if not isinstance(value, dict):
        return {}
    return {
        key: number
        for key, number in list(value.items())[:MAX_LIMITS]
        if isinstance(key, str)
        and len(key) <= MAX_LIMIT_NAME_CHARS
        and isinstance(number, (int, float))
        and not isinstance(number, bool)
    }


# Sandbox -> host messages (PROTOCOL.md) waiting for a slow listener, at most, in count
# and bytes; past either the listener fails loudly (a typed drop its owner hears)
# instead of the host buffering without limit (THREAT_MODEL.md, rule 3).
LISTENER_QUEUE = 1024
LISTENER_BYTES = 64 * 1024 * 1024
CLIENT_LISTENER_BYTES = 256 * 1024 * 1024  # all of one client's listeners together
# One long poll of host_messages_poll on exec-per-call transports.
HOST_POLL_WAIT_MS = 5000
HOST_POLL_SLACK = 15.0
# Waits before polling again after a failed poll; past the last, the listeners fail.
POLL_RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0, 4.0)

MessageHandler = Callable[[dict[str, Any]], Awaitable[None]]
FailureHandler = Callable[[str], Awaitable[None]]

log = logging.getLogger(__name__)


class Listener:
    """Delivers one kind of sandbox -> host message to `handler`, in order, off the reader.

    Only messages `accepts` takes are queued (a session's listener holds that session's
    messages, never another's). `failed` holds the reason once the listener stopped: it
    fell more than LISTENER_QUEUE messages or LISTENER_BYTES behind, its transport
    ended, or (`per_server`) the runtime server it was bound to was replaced. What was
    queued is dropped at once, and `on_failure` hears the reason even while `handler`
    is stuck.
    """

    def __init__(
        self,
        method: str,
        handler: MessageHandler,
        on_failure: FailureHandler | None,
        release: Callable[[Listener], None],
        accepts: Callable[[dict[str, Any]], bool] | None = None,
        per_server: bool = False,
        max_messages: int = LISTENER_QUEUE,
        max_bytes: int = LISTENER_BYTES,
    ) -> None:
        self.method = method
        self.per_server = per_server
        self.failed: str | None = None
        self._failures = Throttled(log, f"a handler of {method} messages failed")
        self.max_messages, self.max_bytes = max_messages, max_bytes
        self._handler = handler
        self._on_failure = on_failure
        self._accepts = accepts
        self._release = release
        self._queue: collections.deque[tuple[dict[str, Any], int]] = collections.deque()
        self._bytes = 0
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()  # nothing queued, and the handler not running
        self._idle.set()
        self._task = asyncio.create_task(self._consume())
        self._failure_task: asyncio.Task[None] | None = None

    @property
    def queued(self) -> tuple[int, int]:
        """Messages and bytes waiting for the handler."""
        return len(self._queue), self._bytes

    def wants(self, params: dict[str, Any]) -> bool:
        """Whether a message with these params is this listener's to take."""
        return self.failed is None and (self._accepts is None or self._accepts(params))

    def deliver(self, params: dict[str, Any], size: int) -> None:
        """Queue a message `wants` took; past the bounds, fail instead."""
        if self._queue and (
            len(self._queue) >= self.max_messages or self._bytes + size > self.max_bytes
        ):
            self.fail(
                f"the host fell behind the sandbox: {len(self._queue)} {self.method} messages "
                f"({self._bytes} bytes) were waiting, at most {self.max_messages} messages "
                f"or {self.max_bytes} bytes are kept"
            )
            return
        self._queue.append((params, size))
        self._bytes += size
        self._idle.clear()
        self._ready.set()

    def fail(self, reason: str) -> None:
        if self.failed is not None:
            return
        self.failed = reason
        self._queue.clear()
        self._bytes = 0
        self._ready.set()
        self._idle.set()
        if self._on_failure is not None:
            on_failure = self._on_failure

            async def report() -> None:
                await on_failure(reason)

            self._failure_task = asyncio.create_task(report())

    async def _consume(self) -> None:
        while True:
            while not self._queue:
                self._idle.set()
                if self.failed is not None:
                    return
                self._ready.clear()
                await self._ready.wait()
            params, size = self._queue.popleft()
            self._bytes -= size
            try:
                await self._handler(params)
            except Exception as exc:
                # What the sandbox sends may fail the handler every time: counted, never a
                # traceback per message (its traceback at debug level).
                self._failures.warn(f"{type(exc).__name__}: {said(exc)}")
                log.debug("a handler of %s messages failed", self.method, exc_info=True)

    async def drained(self, timeout: float) -> None:
        """Until every message received so far went through the handler (or `timeout`).

        A message received before an answer is queued before the answer is read (the
        reader queues as it reads, and the runtime sends what a server said before its
        answer first), so a caller that waits here before acting on an answer acts after
        the handler saw those messages: an MCP server's progress reaches the SDK before
        the result it preceded."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)

    async def aclose(self) -> None:
        self._release(self)
        tasks = [t for t in (self._task, self._failure_task) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class RuntimeClient(abc.ABC):
    """JSON-RPC to one runtime: `call` a method, `listen` for sandbox -> host messages.

    Responses are bounded in size and time; an error response becomes a typed exception
    (RuntimeRpcError, ToolError for a tool's own failures).
    """

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        # The secret that makes this client the owner of the sandbox -> host queue: no
        # other client of the runtime (an agent with its uid) can then take the messages
        # or answer them in the host's place (THREAT_MODEL.md, "Sandbox -> host").
        self.host_key = secrets.token_urlsafe(24)
        self._server_instance: str | None = None
        self._restarts = Throttled(log, "the runtime server in the sandbox was restarted")

    async def listen(
        self,
        method: str,
        handler: MessageHandler,
        on_failure: FailureHandler | None = None,
        *,
        accepts: Callable[[dict[str, Any]], bool] | None = None,
        per_server: bool = False,
    ) -> Listener:
        """Hear the sandbox -> host messages named `method` (their params), until closed.

        `accepts` keeps only the messages meant for this listener; `per_server` says they
        belong to the runtime server of this moment (an MCP session), so the listener
        fails if that server is replaced instead of hearing the new one's.
        """
        listener = Listener(
            method, handler, on_failure, self._listeners.remove, accepts, per_server
        )
        self._listeners.append(listener)
        try:
            await self._start_listening()
        except BaseException:
            await listener.aclose()
            raise
        return listener

    async def _start_listening(self) -> None:
        raise RuntimeTransportError(
            f"{type(self).__name__} cannot receive messages from the sandbox"
        )

    def _dispatch(self, message: Any, size: int) -> None:
        """Route one sandbox -> host notification (untrusted: checked before use)."""
        if not isinstance(message, dict):
            return
        method, params = message.get("method"), message.get("params")
        if not isinstance(method, str) or not isinstance(params, dict):
            return
        for listener in list(self._listeners):
            if listener.method == method and listener.wants(params):
                held = sum(other.queued[1] for other in self._listeners)
                if held + size > CLIENT_LISTENER_BYTES and listener.queued[0]:
                    # All listeners together hold the client's share: the one this message
                    # is for, when it is behind already, is the one that stops.
                    listener.fail(
                        f"the host holds {held} bytes of sandbox messages for its listeners "
                        f"(at most {CLIENT_LISTENER_BYTES}); this one fell behind"
                    )
                    continue
                listener.deliver(params, size)

    def _fail_listeners(self, reason: str) -> None:
        for listener in list(self._listeners):
            listener.fail(reason)

    def _note_server(self, instance: Any) -> None:
        """The runtime server answering now; listeners bound to an older one fail."""
        if not isinstance(instance, str):
            raise RuntimeTransportError(f"the runtime named its server {_describe(instance)}")
        if self._server_instance is not None and instance != self._server_instance:
            # Counted: a runtime the agent controls may name a new server in every answer.
            self._restarts.warn(f"now {said(instance, 80)}")
            for listener in list(self._listeners):
                if listener.per_server:
                    listener.fail(
                        "the runtime server in the sandbox was restarted; what it was "
                        "running (MCP servers) is gone"
                    )
        self._server_instance = instance

    @abc.abstractmethod
    async def call(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> Any:
        """Call `method`; raises ToolError, RuntimeRpcError or RuntimeTransportError.

        Past `timeout` seconds the call fails with RuntimeTransportError; the request may
        or may not have been carried out.
        """

    async def aclose(self) -> None:
        """Release the transport (the runtime server keeps running)."""

    async def __aenter__(self) -> RuntimeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _chunk_fields(piece: Any, handle: str | None, offset: int) -> tuple[str, bytes, bool]:
    """One piece of a held response as (handle, data, done), checked: the same handle,
    the next offset, a total within MAX_RESPONSE_BYTES, base64 data that ends where the
    piece says."""
    method = RESPONSE_CHUNK_METHOD
    fields = piece if isinstance(piece, dict) else {}
    got_handle, done, data = fields.get("handle"), fields.get("done"), fields.get("chunk")
    numbers = [fields.get(k) for k in ("offset", "next_offset", "total_size")]
    ints = [n for n in numbers if isinstance(n, int) and not isinstance(n, bool)]
    if (
        not isinstance(got_handle, str)
        or (handle is not None and got_handle != handle)
        or len(ints) != 3
        or ints[0] != offset
        or not isinstance(done, bool)
        or not isinstance(data, str)
    ):
        raise RuntimeTransportError(f"{method}: a malformed piece: {_describe(piece)}")
    next_offset, total = ints[1], ints[2]
    if total > MAX_RESPONSE_BYTES:
        raise RuntimeTransportError(
            f"{method}: the response would be {total} bytes; the host accepts at most "
            f"{MAX_RESPONSE_BYTES}"
        )
    try:
        chunk = base64.b64decode(data, validate=True)
    except ValueError:
        raise RuntimeTransportError(f"{method}: a piece's data is not base64") from None
    end = offset + len(chunk)
    if end != next_offset or end > total or done != (end == total) or (not chunk and not done):
        raise RuntimeTransportError(f"{method}: a piece does not continue the response")
    return got_handle, chunk, done


def _request(request_id: int, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    return {
        "jsonrpc": JSONRPC_VERSION,
        "id": request_id,
        "method": method,
        "params": dict(params or {}),
    }


class _SandboxRuntimeClient(RuntimeClient):
    """What both transports need: where the runtime is and how to start it."""

    def __init__(
        self,
        sandbox: Sandbox,
        runtime_command: Sequence[str],
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        expected_build: str | None = None,
    ) -> None:
        super().__init__()
        self.sandbox = sandbox
        self.runtime_command = list(runtime_command)
        self.env = dict(env or {})
        self.user = user
        # The build the host injected: a server of another build is never used.
        self.expected_build = expected_build
        self._ids = itertools.count(1)
        # A fixed command the first run of the runtime goes through, once (the injector's
        # check of a fresh install's bytes before anything of them runs; inject.py).
        self.first_start_prefix: list[str] = []
        # What that command reads from stdin before anything else, in pieces written in
        # order: the runtime's bytes, received into place in the same round trip (a
        # stream only; inject.py).
        self.first_start_input: tuple[bytes, ...] | None = None
        # The first start's stream where it is open already: the probe's, its shell
        # waiting for its input (the host's go, then the bytes; inject.py).
        self.first_stream: Stream | None = None

    def _start_command(self, *args: str) -> list[str]:
        """The runtime's command with `args`; the first one goes through the prefix."""
        prefix, self.first_start_prefix = self.first_start_prefix, []
        return [*prefix, *self.runtime_command, *args]


class ExecRuntimeClient(_SandboxRuntimeClient):
    """One exec per call; sandbox -> host messages are long-polled by one background task."""

    _poller: asyncio.Task[None] | None = None

    async def _start_listening(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll_host_messages())

    async def _poll_host_messages(self) -> None:
        ack = 0
        failures = 0
        try:
            while self._listeners:
                try:
                    result = await self.call(
                        "host_messages_poll",
                        {"key": self.host_key, "ack_seq": ack, "wait_ms": HOST_POLL_WAIT_MS},
                        timeout=HOST_POLL_WAIT_MS / 1000 + HOST_POLL_SLACK,
                    )
                except (RuntimeTransportError, RuntimeRpcError) as exc:
                    # A server that died is started again by the next call: a few polls
                    # may fail on the way, and only a failure that lasts ends the listeners.
                    if isinstance(exc, ToolError) or failures >= len(POLL_RETRY_DELAYS):
                        raise
                    await asyncio.sleep(POLL_RETRY_DELAYS[failures])
                    failures += 1
                    continue
                failures = 0
                fields = result_fields(
                    result, "host_messages_poll", seq=int, messages=list, server=str
                )
                if fields["server"] != self._server_instance:
                    self._note_server(fields["server"])
                    ack = 0  # a new server numbers its messages from 1 again
                for message in fields["messages"]:
                    seq = message.get("seq") if isinstance(message, dict) else None
                    if type(seq) is int and seq > ack:  # a retried poll repeats nothing
                        self._dispatch(message, json_cost(json.dumps(message)))
                ack = max(ack, fields["seq"])
        except Exception as exc:
            self._fail_listeners(f"polling the sandbox for its messages failed: {exc}")

    async def aclose(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._poller
            self._poller = None
            with contextlib.suppress(Exception):  # the next client may claim the queue
                await self.call("host_messages_release", {"key": self.host_key}, CLOSE_TIMEOUT)

    async def call(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> Any:
        # A sandbox that caps an exec's output lower than a response may be (inspect's,
        # at the task's limit) gets larger responses in pieces, as inspect's host does.
        limit = self.sandbox.exec_output_limit()
        env = self.env if limit is None else {**self.env, RESPONSE_MAX_BYTES_ENV: str(limit)}
        response = await self._exchange(_request(next(self._ids), method, params), env, timeout)
        if isinstance(response, dict) and RESPONSE_CHUNK_FIELD in response:
            response = await self._reassembled(response[RESPONSE_CHUNK_FIELD], env, timeout)
        return unwrap_response(response, method)

    async def _reassembled(self, piece: Any, env: Mapping[str, str], timeout: float) -> Any:
        """The whole response from its pieces: each asked for by handle and offset, checked
        to continue the one before, bounded by MAX_RESPONSE_BYTES; the handle released.
        All of it within the call's `timeout`, each piece but the last at least
        MIN_PIECE_BYTES: a runtime handing out one byte at a time took days."""
        method = RESPONSE_CHUNK_METHOD
        data, handle = bytearray(), None
        deadline = time.monotonic() + timeout
        try:
            while True:
                handle, chunk, done = _chunk_fields(piece, handle, len(data))
                data += chunk
                if done:
                    break
                if len(chunk) < MIN_PIECE_BYTES:
                    raise RuntimeTransportError(
                        f"{method}: a piece of {len(chunk)} bytes (at least {MIN_PIECE_BYTES} "
                        "but the last)"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeTransportError(
                        f"{method}: the response did not arrive whole within {timeout:g} s"
                    )
                ask = {"handle": handle, "offset": len(data)}
                answer = await self._exchange(_request(next(self._ids), method, ask), env, left)
                if not isinstance(answer, dict) or RESPONSE_CHUNK_FIELD not in answer:
                    unwrap_response(answer, method)  # an error: raised as the runtime said it
                    raise RuntimeTransportError(f"{method}: the runtime sent no piece")
                piece = answer[RESPONSE_CHUNK_FIELD]
        finally:
            if handle is not None:
                release = {"handle": handle, "release": True}
                with contextlib.suppress(SandboxToolsError):
                    await self._exchange(_request(next(self._ids), method, release), env, timeout)
        return parse_response_line(bytes(data), method)

    async def _exchange(
        self, request: dict[str, Any], env: Mapping[str, str], timeout: float
    ) -> Any:
        """One request through one run of `exec`: the response object it printed."""
        method = str(request["method"])
        try:
            output = await self.sandbox.exec(
                self._start_command("exec"),
                input=json.dumps(request),
                env=env,
                user=self.user,
                timeout=timeout,
                max_output=MAX_RESPONSE_BYTES,
            )
        except TimeoutError:
            raise RuntimeTransportError(
                f"{method}: no response from the runtime in {self.sandbox.name} within "
                f"{timeout:g} s"
            ) from None
        except SandboxExecError as exc:
            raise RuntimeTransportError(f"{method}: {exc.message}") from None
        last = _last_line(output.stdout)
        if output.returncode != 0 or not last:
            stderr = output.stderr.decode(errors="replace").strip()[-2000:]
            raise RuntimeTransportError(
                f"{method}: runtime exited with {output.returncode} in {self.sandbox.name} "
                f"without a response; stderr: {stderr or '(empty)'}"
            )
        return parse_response_line(last, method)


class StdioRuntimeClient(_SandboxRuntimeClient):
    """Over the persistent `stdio` channel: ~1 ms per call, many calls in flight at once,
    and messages pushed from the sandbox as they happen."""

    def __init__(
        self,
        sandbox: Sandbox,
        runtime_command: Sequence[str],
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        expected_build: str | None = None,
    ) -> None:
        super().__init__(sandbox, runtime_command, env, user, expected_build)
        self._verify_pending = True  # a new channel, or one whose server was replaced
        self._verify_lock = asyncio.Lock()
        self._stream: Stream | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._open_lock = asyncio.Lock()
        self._subscribed = False
        self._resubscribing: asyncio.Task[None] | None = None
        self._last_id = 0  # the newest request id sent: older unknown ids are late answers

    async def _start_listening(self) -> None:
        # Pushed on this channel from now on: no polling (PROTOCOL.md).
        if not self._subscribed:
            await self._subscribe()

    async def _subscribe(self) -> None:
        result = await self.call("host_messages_subscribe", {"key": self.host_key})
        self._note_server(result_fields(result, "host_messages_subscribe", server=str)["server"])
        self._subscribed = True

    def _server_lost(self, reason: Any) -> None:
        """The channel's bridge lost its server: the subscription went with it. Subscribe
        again at once (a restarted server is then noticed), or fail the listeners loudly."""
        self._subscribed = False
        self._verify_pending = True  # the bridge's next connection may reach another server
        if not self._listeners or (self._resubscribing and not self._resubscribing.done()):
            return

        async def again() -> None:
            # The bridge starts a new server on the next call, and a call or two may
            # still meet the old one on the way: only a failure that lasts is final.
            for delay in (*POLL_RETRY_DELAYS, None):
                try:
                    await self._subscribe()
                    return
                except Exception as exc:
                    if delay is None or isinstance(exc, ToolError):
                        self._fail_listeners(
                            f"the runtime server in the sandbox went away "
                            f"({_describe(reason)}) and subscribing again failed: {exc}"
                        )
                        return
                    await asyncio.sleep(delay)

        self._resubscribing = asyncio.create_task(again())

    async def _ensure_stream(self) -> Stream:
        async with self._open_lock:
            if self._stream is None:
                prefix, payload = self.first_start_prefix, self.first_start_input
                stream = self.first_stream or await self.sandbox.open_stream(
                    [*prefix, *self.runtime_command, "stdio"], env=self.env, user=self.user
                )
                if stream is None:  # nothing ran: the prefix stays for the first exec
                    raise RuntimeTransportError(
                        f"{self.sandbox.name} cannot hold a stream open; use ExecRuntimeClient"
                    )
                self.first_start_prefix, self.first_start_input = [], None
                self.first_stream = None
                if payload is not None:
                    await self._hand_over(stream, payload)
                self._stream = stream
                self._verify_pending = True
                self._reader = asyncio.create_task(self._read_responses(stream))
            return self._stream

    async def _read_responses(self, stream: Stream) -> None:
        reason = "the runtime's stdio channel closed"
        answered = False
        try:
            while True:
                line = await stream.readline()
                if not line:
                    if not answered:  # it never started: say why, not only that it closed
                        reason += await self._why_it_did_not_start()
                    break
                answered = True
                if not line.strip():
                    continue
                # Nothing but the runtime writes to this stdout: a line that is not a
                # response means the channel cannot be trusted any more (it might be
                # desynchronised), so it is declared failed rather than skipped.
                response = parse_response_line(line, "stdio channel")
                if isinstance(response, dict) and "method" in response and "id" not in response:
                    if response["method"] == RUNTIME_SERVER_LOST:
                        self._server_lost(response.get("params"))
                    else:
                        self._dispatch(response, json_cost(line))  # the sandbox spoke first
                    if len(line) > YIELD_AFTER_BYTES:
                        # A buffered next line is read without a pause: let the loop (and
                        # the listener that may drop this one) run between big messages.
                        await asyncio.sleep(0)
                    continue
                request_id = response.get("id") if isinstance(response, dict) else None
                future = self._pending.pop(request_id, None) if type(request_id) is int else None
                if future is None:
                    if type(request_id) is int and 0 < request_id <= self._last_id:
                        # The answer to a call that timed out or was cancelled: it has
                        # nobody left to hear it, and the channel is as sound as before.
                        log.debug("a late answer to request %d was dropped", request_id)
                        continue
                    raise RuntimeTransportError(
                        f"the runtime answered a request that was never sent: {line[:200]!r}"
                    )
                if not future.done():
                    future.set_result(response)
        except Exception as exc:
            reason = f"the runtime's stdio channel failed: {exc}"
        finally:
            if self._stream is stream:
                self._stream = None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(stream.close(), CLOSE_TIMEOUT)  # release the connection
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(RuntimeTransportError(reason))
            self._pending.clear()
            self._subscribed = False
            self._fail_listeners(reason)

    async def _hand_over(self, stream: Stream, payload: tuple[bytes, ...]) -> None:
        """Send the first start's input, then wait for its prefix to say it is done
        (`STAGED_LINE`) before anything else is written: the command that reads the
        input may read ahead of it (busybox's `head` through stdio), so nothing follows
        the input on the stream until it has ended.

        The sandbox decides how fast the input is taken, and whether at all (a `head`
        that never reads, a full disk): the write and the wait share one deadline, and
        the stream is read while the input is written, so output before the input is
        taken (a line, or no newline for megabytes) cannot stall both sides. A failure,
        a timeout or a cancellation closes the stream."""
        writing = asyncio.ensure_future(_write_in_order(stream, payload))
        writing.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            line = await asyncio.wait_for(self._staged(stream, writing), HAND_OVER_TIMEOUT)
        except BaseException as exc:
            await self._abandon(stream, writing)
            # asyncio's TimeoutError: wait_for's, not the builtin one before 3.11.
            if not isinstance(exc, (SandboxToolsError, OSError, asyncio.TimeoutError)):
                raise  # a cancellation: nothing is left open behind it
            if isinstance(exc, asyncio.TimeoutError):
                reason = f"it was not taken and checked within {HAND_OVER_TIMEOUT:g} s"
            else:
                reason = _describe(exc) if str(exc) else type(exc).__name__
            raise FirstStartFailed(
                f"the first start in {self.sandbox.name} did not take its input: {reason}",
                timed_out=isinstance(exc, asyncio.TimeoutError),
            ) from None
        if line != STAGED_LINE:
            await self._abandon(stream, writing)
            said = line.decode(errors="replace").strip()[:200] if line else "nothing (it ended)"
            raise FirstStartFailed(
                f"the first start in {self.sandbox.name} said {said!r}, not that its input "
                "was received and checked"
            )

    @staticmethod
    async def _abandon(stream: Stream, writing: asyncio.Future[None]) -> None:
        """Stop the input's write and close the stream, whatever happens on the way (a
        cancellation included: nothing is left open behind the first start)."""
        writing.cancel()
        await close_quietly(stream)

    @staticmethod
    async def _staged(stream: Stream, writing: asyncio.Future[None]) -> bytes:
        """The prefix's first line, read while the input is still being written; the
        write must end too before anything else is sent (a line that came before the
        input was all taken is not the prefix's: it is refused by the caller)."""
        line = await stream.readline()
        if line == STAGED_LINE:
            await writing
        return line

    async def _why_it_did_not_start(self) -> str:
        """What the runtime says when run once more over exec (a full disk while it
        unpacks, a missing file): the channel's own stderr is not kept by every provider."""
        once = ExecRuntimeClient(self.sandbox, self.runtime_command, self.env, self.user)
        try:
            await once.call("version", timeout=DIAGNOSE_TIMEOUT)
        except SandboxToolsError as exc:
            return f" before answering; run once more: {exc.message}"
        return " before answering (run once more, the runtime answered)"

    async def call(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> Any:
        stream = await self._ensure_stream()
        # runtime_info itself is how a caller (the injector) checks the build on its own.
        if self.expected_build is not None and self._verify_pending and method != "runtime_info":
            await self._verify_build(stream, timeout)
        return await self._send(stream, method, params, timeout)

    async def _verify_build(self, stream: Stream, timeout: float) -> None:
        """Once per connection to a server: it must be the build the host injected."""
        async with self._verify_lock:
            if not self._verify_pending:
                return
            info = RuntimeInfo.parse(await self._send(stream, "runtime_info", None, timeout))
            if info.build_id != self.expected_build:
                raise RuntimeTransportError(
                    f"the runtime server answering in {self.sandbox.name} is build "
                    f"{_describe(info.build_id)}, not {self.expected_build}; a server of "
                    f"another build is never used. Stop it (`sandbox-tools stop-server` with "
                    f"{SERVER_DIR_ENV}={_describe(info.server_dir)}) or give this runtime a "
                    "server directory of its own"
                )
            self._verify_pending = False

    async def _send(
        self, stream: Stream, method: str, params: Mapping[str, Any] | None, timeout: float
    ) -> Any:
        request_id = next(self._ids)
        self._last_id = request_id
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            line = json.dumps(_request(request_id, method, params)) + "\n"
            await asyncio.wait_for(stream.write(line.encode()), timeout)
            response = await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise RuntimeTransportError(
                f"{method}: no response from the runtime in {self.sandbox.name} within "
                f"{timeout:g} s"
            ) from None
        except OSError as exc:
            # The runtime is gone: the reader says why (what it printed) when it ends.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(future), DIAGNOSE_TIMEOUT + CLOSE_TIMEOUT)
            raise RuntimeTransportError(f"{method}: cannot write to the runtime: {exc}") from None
        finally:
            self._pending.pop(request_id, None)
        return unwrap_response(response, method)

    async def aclose(self) -> None:
        if self._resubscribing is not None:
            self._resubscribing.cancel()
        if self._subscribed and self._stream is not None:
            with contextlib.suppress(Exception):  # the next client may claim the queue
                await self.call("host_messages_release", {"key": self.host_key}, CLOSE_TIMEOUT)
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(stream.close(), CLOSE_TIMEOUT)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader


async def close_quietly(stream: Stream) -> None:
    """Close a stream whatever happens on the way, a cancellation included (its process
    ends at stdin's end): what is abandoned leaves nothing open behind it."""
    with contextlib.suppress(BaseException):
        await asyncio.shield(asyncio.wait_for(stream.close(), CLOSE_TIMEOUT))


async def _write_in_order(stream: Stream, pieces: tuple[bytes, ...]) -> None:
    for piece in pieces:
        await stream.write(piece)


async def connect_runtime(
    sandbox: Sandbox,
    runtime_command: Sequence[str],
    env: Mapping[str, str] | None = None,
    user: str | None = None,
    persistent: bool = True,
    expected_build: str | None = None,
    first_start_prefix: Sequence[str] = (),
    first_start_input: tuple[bytes, ...] | None = None,
    first_stream: Stream | None = None,
) -> RuntimeClient:
    """The cheapest client the provider supports: a persistent channel where possible.

    With `expected_build`, a persistent channel checks the build of the server it reaches,
    once per connection (the injector checks the first answer on either transport).
    `first_start_prefix`: a fixed command the runtime's first run goes through (it ends
    by running the command it is given); later runs start the runtime directly.
    `first_start_input`: what that command reads first, in pieces (not joined: a copy of
    megabytes costs milliseconds), on a stream only; it prints
    `STAGED_LINE` once it has taken and checked it. NoStreamForInput, with nothing run,
    where the provider holds no stream open. `first_stream`: that command's stream,
    already open (the probe's shell, waiting for `first_start_input`); the channel's
    later streams start `runtime_command` itself."""
    if first_stream is not None and (not persistent or first_start_input is None):
        raise ValueError("an open first stream is the channel's and needs its input")
    if persistent:
        client = StdioRuntimeClient(sandbox, runtime_command, env, user, expected_build)
        client.first_start_prefix = list(first_start_prefix)
        client.first_start_input = first_start_input
        client.first_stream = first_stream
        try:
            await client._ensure_stream()
        except FirstStartFailed:
            raise  # the prefix ran: nothing to try again with
        except (RuntimeTransportError, NotImplementedError):
            first_start_prefix = client.first_start_prefix  # still there: nothing ran
        else:
            return client
    if first_start_input is not None:
        raise NoStreamForInput(f"{sandbox.name} cannot hold a stream open to send input")
    exec_client = ExecRuntimeClient(sandbox, runtime_command, env, user, expected_build)
    exec_client.first_start_prefix = list(first_start_prefix)
    return exec_client
