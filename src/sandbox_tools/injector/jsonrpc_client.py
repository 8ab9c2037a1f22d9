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
import contextlib
import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from sandbox_tools.errors import (
    RuntimeRpcError,
    RuntimeTransportError,
    SandboxExecError,
    ToolError,
)
from sandbox_tools.protocol import JSONRPC_VERSION, MAX_FRAME_BYTES, TOOL_ERROR
from sandbox_tools.sandboxes.base import Sandbox, Stream

# Every call is bounded in time by default (THREAT_MODEL.md, rule 3): a runtime that is
# stopped or wedged costs the caller this long at most, then RuntimeTransportError.
DEFAULT_CALL_TIMEOUT = 120.0
# Closing a stream waits for the other side at most this long.
CLOSE_TIMEOUT = 10.0
# The largest response the host accepts: one frame of the runtime's protocol.
MAX_RESPONSE_BYTES = MAX_FRAME_BYTES


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters)"


def parse_response_line(line: bytes | str, method: str) -> Any:
    """One response frame as JSON; anything else is the transport's failure, typed."""
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


class RuntimeClient(abc.ABC):
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
    ) -> None:
        self.sandbox = sandbox
        self.runtime_command = list(runtime_command)
        self.env = dict(env or {})
        self.user = user
        self._ids = itertools.count(1)


class ExecRuntimeClient(_SandboxRuntimeClient):
    async def call(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> Any:
        request = json.dumps(_request(next(self._ids), method, params))
        try:
            output = await self.sandbox.exec(
                [*self.runtime_command, "exec"],
                input=request,
                env=self.env,
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
        lines = output.stdout.strip().splitlines()
        if output.returncode != 0 or not lines:
            stderr = output.stderr.decode(errors="replace").strip()[-2000:]
            raise RuntimeTransportError(
                f"{method}: runtime exited with {output.returncode} in {self.sandbox.name} "
                f"without a response; stderr: {stderr or '(empty)'}"
            )
        return unwrap_response(parse_response_line(lines[-1], method), method)


class StdioRuntimeClient(_SandboxRuntimeClient):
    def __init__(
        self,
        sandbox: Sandbox,
        runtime_command: Sequence[str],
        env: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> None:
        super().__init__(sandbox, runtime_command, env, user)
        self._stream: Stream | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._open_lock = asyncio.Lock()

    async def _ensure_stream(self) -> Stream:
        async with self._open_lock:
            if self._stream is None:
                stream = await self.sandbox.open_stream(
                    [*self.runtime_command, "stdio"], env=self.env, user=self.user
                )
                if stream is None:
                    raise RuntimeTransportError(
                        f"{self.sandbox.name} cannot hold a stream open; use ExecRuntimeClient"
                    )
                self._stream = stream
                self._reader = asyncio.create_task(self._read_responses(stream))
            return self._stream

    async def _read_responses(self, stream: Stream) -> None:
        reason = "the runtime's stdio channel closed"
        try:
            while True:
                line = await stream.readline()
                if not line:
                    break
                if not line.strip():
                    continue
                # Nothing but the runtime writes to this stdout: a line that is not a
                # response means the channel cannot be trusted any more (it might be
                # desynchronised), so it is declared failed rather than skipped.
                response = parse_response_line(line, "stdio channel")
                request_id = response.get("id") if isinstance(response, dict) else None
                future = self._pending.pop(request_id, None) if type(request_id) is int else None
                if future is None:
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

    async def call(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> Any:
        stream = await self._ensure_stream()
        request_id = next(self._ids)
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
            raise RuntimeTransportError(f"{method}: cannot write to the runtime: {exc}") from None
        finally:
            self._pending.pop(request_id, None)
        return unwrap_response(response, method)

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(stream.close(), CLOSE_TIMEOUT)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader


async def connect_runtime(
    sandbox: Sandbox,
    runtime_command: Sequence[str],
    env: Mapping[str, str] | None = None,
    user: str | None = None,
    persistent: bool = True,
) -> RuntimeClient:
    """The cheapest client the provider supports: a persistent channel where possible."""
    if persistent:
        client = StdioRuntimeClient(sandbox, runtime_command, env, user)
        try:
            await client._ensure_stream()
        except (RuntimeTransportError, NotImplementedError):
            pass
        else:
            return client
    return ExecRuntimeClient(sandbox, runtime_command, env, user)
