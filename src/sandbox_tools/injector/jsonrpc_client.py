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

from sandbox_tools.errors import RuntimeRpcError, RuntimeTransportError, ToolError
from sandbox_tools.protocol import JSONRPC_VERSION, TOOL_ERROR
from sandbox_tools.sandboxes.base import Sandbox, Stream


def unwrap_response(response: Any, method: str) -> Any:
    if not isinstance(response, dict) or response.get("jsonrpc") != JSONRPC_VERSION:
        raise RuntimeTransportError(
            f"{method}: the runtime sent a malformed response: {response!r}"
        )
    if "error" in response:
        error = response["error"] or {}
        code = int(error.get("code", 0))
        message = str(error.get("message", "unknown error"))
        if code == TOOL_ERROR:
            raise ToolError(code, message, error.get("data"))
        raise RuntimeRpcError(code, message, error.get("data"))
    if "result" not in response:
        raise RuntimeTransportError(f"{method}: the runtime's response has no result: {response!r}")
    return response["result"]


class RuntimeClient(abc.ABC):
    @abc.abstractmethod
    async def call(
        self, method: str, params: Mapping[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        """Call `method`; raises ToolError, RuntimeRpcError or RuntimeTransportError."""

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
        self, method: str, params: Mapping[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        request = json.dumps(_request(next(self._ids), method, params))
        output = await self.sandbox.exec(
            [*self.runtime_command, "exec"],
            input=request,
            env=self.env,
            user=self.user,
            timeout=timeout,
        )
        lines = output.stdout.strip().splitlines()
        if output.returncode != 0 or not lines:
            stderr = output.stderr.decode(errors="replace").strip()[-2000:]
            raise RuntimeTransportError(
                f"{method}: runtime exited with {output.returncode} in {self.sandbox.name} "
                f"without a response; stderr: {stderr or '(empty)'}"
            )
        try:
            response = json.loads(lines[-1])
        except ValueError:
            raise RuntimeTransportError(
                f"{method}: the runtime printed something that is not JSON: {lines[-1][:200]!r}"
            ) from None
        return unwrap_response(response, method)


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
                try:
                    response = json.loads(line)
                except ValueError:
                    continue  # not ours: nothing else writes to this stdout, but be tolerant
                future = self._pending.pop(response.get("id"), None)
                if future is not None and not future.done():
                    future.set_result(response)
        except Exception as exc:
            reason = f"the runtime's stdio channel failed: {exc}"
        finally:
            if self._stream is stream:
                self._stream = None
            with contextlib.suppress(Exception):
                await stream.close()  # release the connection: nothing else will
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(RuntimeTransportError(reason))
            self._pending.clear()

    async def call(
        self, method: str, params: Mapping[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        stream = await self._ensure_stream()
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            line = json.dumps(_request(request_id, method, params)) + "\n"
            await stream.write(line.encode())
            response = await asyncio.wait_for(future, timeout)
        except OSError as exc:
            raise RuntimeTransportError(f"{method}: cannot write to the runtime: {exc}") from None
        finally:
            self._pending.pop(request_id, None)
        return unwrap_response(response, method)

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(Exception):
                await stream.close()
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
