"""Model calls from inside an offline sandbox, answered on the host.

`ModelProxy` starts the runtime's `model_proxy` (HTTP on 127.0.0.1:13131 inside the
sandbox) with exec_remote and answers each request it receives with `handler`, the
moment it arrives (pushed on the persistent channel, long-polled over exec): no network,
no credentials and no Python in the sandbox. A handler returns a `ProxyResponse` whose
body may be an async iterator: each chunk goes to the agent as it is produced, so a
streamed (SSE) answer starts at once.

    async def handler(request: ProxyRequest) -> ProxyResponse: ...

    async with ModelProxy(support, forward_to("http://127.0.0.1:8000")) as proxy:
        await exec_remote(support.client, "my-agent", ExecRemoteOptions(env=proxy.env))

Everything the sandbox sends is untrusted: requests are checked before the handler sees
them, and at most `max_concurrent` handlers run at once (more wait), so an agent cannot
make the host spend without bound.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import re
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sandbox_tools.errors import SandboxToolsError
from sandbox_tools.injector.exec_remote import (
    Completed,
    ExecRemoteOptions,
    ExecRemoteProcess,
    StderrChunk,
    StdoutChunk,
    start_exec_remote,
)
from sandbox_tools.injector.jsonrpc_client import Listener, RuntimeClient
from sandbox_tools.injector.log_bounds import TOLD_IN_FULL, Throttled, said
from sandbox_tools.protocol import (
    HOP_BY_HOP_HEADERS,
    HOST_MESSAGE_HTTP_CANCEL,
    HOST_MESSAGE_HTTP_REQUEST,
    json_cost,
    json_values,
    tunnel_headers_too_many,
)

log = logging.getLogger(__name__)

DEFAULT_PORT = 13131
DEFAULT_TIMEOUT = 300.0
DEFAULT_MAX_CONCURRENT = 32
START_TIMEOUT = 30.0
MAX_BODY_CALL_BYTES = 1024 * 1024  # body bytes per call to the runtime
# Requests the host holds at once (waiting for a handler or being handled), in count and
# in bytes: past either the sandbox gets 503 at once instead of the host holding more.
MAX_PENDING = 256
MAX_HELD_BYTES = 128 * 1024 * 1024
PLACEHOLDER_KEY = "sandbox-tools-proxy"  # SDKs insist on a key; the host holds the real one
# The methods a model API is called with. Others are refused before any handler: TRACE
# (and TRACK) make an upstream echo the request, the host's credentials included, back
# to the agent; CONNECT asks for a tunnel.
ALLOWED_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# JSON values a request body may hold for `ProxyRequest.json()` (a long conversation
# with its tools is thousands); past this, parsing alone would cost the host gigabytes.
MAX_REQUEST_JSON_VALUES = 200_000
# Headers a browser adds to what a page sends and SDKs never do: a page the agent opens
# (or any page, through a form the agent's browser submits) must not spend the host's
# credentials. The Host must name the proxy itself, which also stops DNS rebinding.
BROWSER_HEADERS = frozenset(
    {"origin", "sec-fetch-site", "sec-fetch-mode", "sec-fetch-dest", "sec-fetch-user"}
)
# Refusals logged in full per proxy; after that, one line a minute says how many more.
REFUSALS_LOGGED = TOLD_IN_FULL  # refusals told in full before they are only counted


@dataclass(frozen=True)
class ProxyRequest:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """A request header by case-insensitive name (HTTP header names are)."""
        lowered = name.lower()
        return next((v for k, v in self.headers if k.lower() == lowered), None)

    def json(self) -> Any:
        """The body parsed as JSON; ValueError if it is not, ProxyRequestRefused (413) if
        it holds more values than a model request needs (parsing it would cost far more
        host memory than its bytes)."""
        values = json_values(self.body)
        if values > MAX_REQUEST_JSON_VALUES:
            raise ProxyRequestRefused(
                f"the request body holds about {values} JSON values (at most "
                f"{MAX_REQUEST_JSON_VALUES})",
                status=413,
            )
        try:
            return json.loads(self.body)
        except RecursionError:
            # Nested past the interpreter's depth: bad input like any other, not a crash
            raise ValueError("the request body is nested too deeply to be JSON") from None


@dataclass
class ProxyResponse:
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | AsyncIterator[bytes] = b""

    @classmethod
    def json(cls, payload: Any, status: int = 200) -> ProxyResponse:
        return cls(status, [("Content-Type", "application/json")], json.dumps(payload).encode())


Handler = Callable[[ProxyRequest], Awaitable[ProxyResponse]]


class RuntimeAccess(Protocol):
    """What the proxy needs of an injected runtime (`ToolSupport` is one): a connected
    client, the command that runs the runtime, and the environment it needs."""

    @property
    def client(self) -> RuntimeClient: ...

    @property
    def command(self) -> list[str]: ...

    @property
    def env(self) -> dict[str, str]: ...


# RFC 3986 characters a path or query may hold as they are; anything else (space,
# quotes, backslash, braces, non-ASCII, controls) must arrive percent-encoded.
_PATH_CHARS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/%"
)
_QUERY_CHARS = _PATH_CHARS | {"?"}
_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# What a segment may not hold once decoded: separators, path parameters (`..;` is `..` to
# Tomcat, Jetty and Spring), a second level of encoding (`%252e`), controls.
_DECODED_FORBIDDEN = re.compile(r"[/\\;%\x00-\x1f\x7f]")


class ProxyRequestRefused(ValueError):
    """A request from the sandbox that the host will not handle; the message says why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def origin_form_path(target: str) -> str:
    """`target` as a normalised origin-form path (`/a/b?query`), or ProxyRequestRefused.

    The sandbox chooses this text, and handlers append it to a base URL that may carry
    the host's credentials, so it must not be able to name another host, port, scheme
    or a place above the base path: it starts with one `/`, holds only RFC 3986
    characters, no `.` or `..` segment (also percent-encoded), no encoded `/`, `\\` or
    NUL, and repeated slashes are merged.
    """
    if len(target) > 8192:
        raise ProxyRequestRefused("the request target is longer than 8192 characters")
    path, sep, query = target.partition("?")
    if not path.startswith("/"):
        raise ProxyRequestRefused(f"the request target {target[:80]!r} is not a path")
    if not set(path) <= _PATH_CHARS or not set(query) <= _QUERY_CHARS:
        raise ProxyRequestRefused(
            f"the request target {target[:80]!r} holds a character that must be percent-encoded"
        )
    if _PERCENT.search(target):
        raise ProxyRequestRefused(f"the request target {target[:80]!r} has a malformed %-escape")
    segments = [s for s in path.split("/") if s]
    for segment in segments:
        try:
            decoded = urllib.parse.unquote(segment, errors="strict")
        except UnicodeDecodeError:
            raise ProxyRequestRefused(
                f"the request path {path[:80]!r} is not UTF-8 once decoded"
            ) from None
        if decoded in (".", "..") or not decoded.strip(". \t"):
            # `...` and `..%20` too: some upstream stacks trim them into `..`.
            raise ProxyRequestRefused(f"the request path {path[:80]!r} has a dot segment")
        if not decoded.isascii() or "?" in decoded or "#" in decoded:
            # Full-width dots, zero-width spaces, or a query or fragment smuggled into the
            # path: an upstream may normalise them into something else; no API needs them.
            raise ProxyRequestRefused(
                f"the request path {path[:80]!r} decodes to a character no API path needs"
            )
        if ";" in segment or _DECODED_FORBIDDEN.search(decoded):
            raise ProxyRequestRefused(
                f"the request path {path[:80]!r} holds a path parameter, an encoded "
                "separator or a second level of encoding"
            )
    normal = "/" + "/".join(segments) + ("/" if path.endswith("/") and segments else "")
    return normal + sep + query


def refuse_unless_model_method(method: str) -> None:
    """405 for a method no model API takes (see ALLOWED_METHODS: TRACE echoes credentials)."""
    if method not in ALLOWED_METHODS:
        raise ProxyRequestRefused(
            f"the method {method[:40]} is not one a model API takes", status=405
        )


def _request_from(params: Mapping[str, Any]) -> ProxyRequest:
    """The sandbox's request, checked field by field (untrusted input)."""
    try:
        method, path = params["method"], params["path"]
        raw_headers, body = params["headers"], params["body"]
        if not isinstance(method, str) or not isinstance(path, str):
            raise TypeError
        headers = [(k, v) for k, v in raw_headers if isinstance(k, str) and isinstance(v, str)]
        if len(headers) != len(raw_headers) or not isinstance(body, str):
            raise TypeError
        decoded = base64.b64decode(body, validate=True)
    except (KeyError, TypeError, ValueError, binascii.Error):
        raise ProxyRequestRefused("the request from the sandbox is malformed") from None
    too_many = tunnel_headers_too_many(headers)
    if too_many:
        raise ProxyRequestRefused(f"the request has {too_many}")
    if len(method) > 32 or not _TOKEN.fullmatch(method):
        raise ProxyRequestRefused(f"the request method {method[:40]!r} is not an HTTP token")
    refuse_unless_model_method(method)
    for name, value in headers:
        if not _TOKEN.fullmatch(name) or any(c in value for c in "\r\n\x00"):
            raise ProxyRequestRefused(f"the request header {name[:40]!r} is malformed")
    return ProxyRequest(method, origin_form_path(path), headers, decoded)


class ModelProxy:
    """An OpenAI-compatible HTTP endpoint inside the sandbox, answered by `handler` here.

    The agent's SDK talks plain HTTP to 127.0.0.1 in its own (often offline) sandbox; each
    request travels to the host as a sandbox -> host message, so no credential and no
    network route ever enter the sandbox. At most `max_concurrent` requests are handled
    at once; each is cancelled past `timeout` seconds.
    """

    def __init__(
        self,
        support: RuntimeAccess,
        handler: Handler,
        *,
        port: int = DEFAULT_PORT,
        timeout: float = DEFAULT_TIMEOUT,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
    ) -> None:
        self.support = support
        self.handler = handler
        self.port = port
        self.timeout = timeout
        self._slots = asyncio.Semaphore(max_concurrent)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._listeners: list[Listener] = []
        self._process: ExecRemoteProcess | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.ended: str | None = None  # why the in-sandbox proxy ended while in use
        self._held = 0  # what requests held by pending tasks may cost, in bytes
        self._refusals = Throttled(log, "model proxy: refused")
        self._failures = Throttled(log, "model proxy: the handler failed")
        self._ended_early = Throttled(
            log, "model proxy: a response ended early", level=logging.INFO
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What to give the agent so its SDK or CLI calls the proxy."""
        return {
            "OPENAI_BASE_URL": f"{self.base_url}/v1",
            "OPENAI_API_KEY": PLACEHOLDER_KEY,
            "ANTHROPIC_BASE_URL": self.base_url,
            "ANTHROPIC_API_KEY": PLACEHOLDER_KEY,
            "GOOGLE_GEMINI_BASE_URL": self.base_url,
            "GEMINI_API_KEY": PLACEHOLDER_KEY,
            "SANDBOX_TOOLS_MODEL_PROXY": self.base_url,
        }

    async def __aenter__(self) -> ModelProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start the in-sandbox listener and begin answering; returns once it listens."""
        client = self.support.client
        self._listeners = [
            await client.listen(HOST_MESSAGE_HTTP_REQUEST, self._on_request, self._on_failure),
            await client.listen(HOST_MESSAGE_HTTP_CANCEL, self._on_cancel),
        ]
        command = [*self.support.command, "model_proxy", "--port", str(self.port)]
        command += ["--timeout", str(self.timeout)]
        options = ExecRemoteOptions(env=self.support.env, poll_interval=5.0)
        self._process = await start_exec_remote(client, command, options)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._watcher = asyncio.create_task(self._watch(self._process, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), START_TIMEOUT)
        except asyncio.TimeoutError:
            await self.aclose()
            raise SandboxToolsError(
                f"the model proxy did not start within {START_TIMEOUT:g} s"
            ) from None
        except BaseException:
            await self.aclose()
            raise

    async def _on_failure(self, reason: str) -> None:
        """The host stopped hearing the sandbox (its channel was killed, or it fell behind):
        the agent's requests cannot be answered any more; say so, loudly."""
        self.ended = self.ended or f"the host stopped receiving its requests: {reason}"
        log.error("model proxy stopped: %s", said(self.ended, 1000))

    async def _watch(self, process: ExecRemoteProcess, ready: asyncio.Future[None]) -> None:
        """Follow the proxy process for its whole life (leaving its events would kill it)."""
        try:
            await self._follow(process, ready)
        except SandboxToolsError as exc:
            self.ended = self.ended or f"following the proxy process failed: {exc}"
            log.error("model proxy stopped: %s", said(self.ended, 1000))
            if not ready.done():
                ready.set_exception(exc)

    async def _follow(self, process: ExecRemoteProcess, ready: asyncio.Future[None]) -> None:
        stderr = ""
        async for event in process.events():
            if isinstance(event, StdoutChunk) and "listening" in event.data and not ready.done():
                ready.set_result(None)
            elif isinstance(event, StderrChunk):
                stderr = (stderr + event.data)[-4000:]
            elif isinstance(event, Completed):
                reason = (stderr or event.stderr).strip() or f"exit code {event.exit_code}"
                if not ready.done():
                    ready.set_exception(
                        SandboxToolsError(f"the model proxy did not start: {reason}")
                    )
                else:
                    # Killed by the agent or the OOM killer: the agent's requests now fail
                    # to connect; the host hears it here and in `ended`, and nothing of the
                    # host's is exposed by it.
                    self.ended = reason
                    log.warning("model proxy in the sandbox ended: %s", said(reason, 1000))

    async def aclose(self) -> None:
        # The watcher goes first: it would take the end of the process killed here for
        # one the agent caused and warn of it (about one close in twenty did).
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watcher
            self._watcher = None
        if self._process is not None:
            with contextlib.suppress(Exception):
                await self._process.kill()
            self._process = None
        for listener in self._listeners:
            await listener.aclose()
        self._listeners = []
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        close = getattr(self.handler, "aclose", None)
        if close is not None:  # a handler holding connections (forward_to)
            with contextlib.suppress(Exception):
                await close()

    # -- serving -------------------------------------------------------------------------

    async def _on_request(self, params: dict[str, Any]) -> None:
        request_id = params.get("request_id")
        if not isinstance(request_id, str) or not request_id or len(request_id) > 64:
            self._refusals.warn("a request from the sandbox without a valid id was ignored")
            return
        if request_id in self._tasks:
            return
        if len(self._tasks) >= MAX_PENDING:
            # Not even a refusal: that would be one more task. The runtime answers its
            # client 504 when the host stays silent.
            self._refusals.warn(f"{MAX_PENDING} requests pending; one more was dropped")
            return
        held = 0  # what this request keeps on the host until it is answered
        request: ProxyRequest | ProxyRequestRefused
        try:
            parsed = _request_from(params)
        except ProxyRequestRefused as exc:
            self._refusals.warn(f"a request from the sandbox: {said(exc)}")
            request = exc
        else:
            request = parsed
            # Counted as what it may cost parsed, not its bytes: dense JSON grows tenfold.
            held = json_cost(parsed.body) + sum(len(k) + len(v) for k, v in parsed.headers)
            refused = self._from_a_page(parsed)
            if refused is None and self._held + held > MAX_HELD_BYTES:
                refused = ProxyRequestRefused(
                    f"the host holds requests that may cost {self._held} bytes already, "
                    f"and this one {held} (at most {MAX_HELD_BYTES} together); retry later",
                    status=503,
                )
            if refused is not None:
                self._refusals.warn(f"a request from the sandbox: {said(refused)}")
                request, held = refused, 0
        self._held += held
        task = asyncio.create_task(self._serve(request_id, request))
        self._tasks[request_id] = task

        def done(_: asyncio.Task[None]) -> None:
            self._tasks.pop(request_id, None)
            self._held -= held

        task.add_done_callback(done)

    def _from_a_page(self, request: ProxyRequest) -> ProxyRequestRefused | None:
        """A 403 for a request that a web page sent rather than the agent's own client."""
        browser = sorted({k.lower() for k, _ in request.headers} & BROWSER_HEADERS)
        if browser:
            return ProxyRequestRefused(
                f"the request carries {', '.join(browser)}: a web page sent it", status=403
            )
        host = (request.header("host") or "").lower()
        mine = {f"{name}:{self.port}" for name in ("127.0.0.1", "localhost", "[::1]")}
        if host not in mine:
            return ProxyRequestRefused(
                f"the request's Host {host[:80]!r} is not this proxy's ({self.base_url})",
                status=403,
            )
        return None

    async def _on_cancel(self, params: dict[str, Any]) -> None:
        task = self._tasks.get(str(params.get("request_id")))
        if task is not None:
            task.cancel()

    async def _serve(self, request_id: str, request: ProxyRequest | ProxyRequestRefused) -> None:
        async with self._slots:
            try:
                if isinstance(request, ProxyRequestRefused):
                    response = refusal(str(request), request.status)
                else:
                    response = await self.handler(request)
            except asyncio.CancelledError:
                raise
            except ProxyRequestRefused as exc:
                self._refusals.warn(f"{said(request_id, 80)}: {said(exc)}")
                response = refusal(str(exc), exc.status)
            except Exception as exc:
                # Counted, not a traceback per request: what the sandbox sends may make
                # the handler fail on every request (its traceback at debug level).
                self._failures.warn(f"{type(exc).__name__}: {said(exc)}")
                log.debug("model proxy handler failed", exc_info=True)
                response = ProxyResponse.json(
                    {"error": {"type": "handler_error", "message": f"{type(exc).__name__}: {exc}"}},
                    status=502,
                )
            try:
                await self._send(request_id, response)
            except SandboxToolsError as exc:
                self._ended_early.warn(f"{said(request_id, 80)}: {said(exc)}")

    async def _send(self, request_id: str, response: ProxyResponse) -> None:
        """The head with the body's first chunks in one call, then the rest as produced.

        Chunks produced while a call is on its way go together in the next one, so a
        cheap transport sends each at once and a slow one is not flooded.
        """
        client = self.support.client
        head: dict[str, Any] | None = {
            "request_id": request_id,
            "status": response.status,
            "headers": [[k, v] for k, v in response.headers],
        }

        async def send(chunks: list[bytes], end: bool, error: str | None = None) -> None:
            nonlocal head
            params: dict[str, Any] = {
                **(head or {"request_id": request_id}),
                "key": client.host_key,  # only the queue's owner may answer
                "chunks": [base64.b64encode(c).decode("ascii") for c in chunks],
                "end": end,
            }
            if error is not None:
                params["error"] = error
            await client.call("http_tunnel_respond" if head else "http_tunnel_body", params)
            head = None

        body = response.body
        if isinstance(body, bytes):
            size = MAX_BODY_CALL_BYTES
            pieces = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
            for n, piece in enumerate(pieces):
                await send([piece], end=n == len(pieces) - 1)
            return
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(64)

        async def produce() -> None:
            # The end mark is put only when the body ended or failed: a producer cancelled
            # because the agent hung up must not wait on a full queue nobody reads.
            try:
                async for chunk in body:
                    await queue.put(chunk)
            except asyncio.CancelledError:
                raise
            except Exception:
                await queue.put(None)
                raise
            finally:
                # The upstream's connection is released now, not when the collector runs.
                aclose = getattr(body, "aclose", None)
                if aclose is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(aclose())
            await queue.put(None)

        producer = asyncio.create_task(produce())
        try:
            finished = False
            while not finished:
                batch = [await queue.get()]
                await asyncio.sleep(0)  # a body that is already complete goes in one call
                while not queue.empty() and sum(len(c) for c in batch if c) < MAX_BODY_CALL_BYTES:
                    batch.append(queue.get_nowait())
                finished = batch[-1] is None
                chunks = [c for c in batch if c]
                error = None
                if finished and producer.done() and producer.exception() is not None:
                    error = f"the handler failed mid-answer: {producer.exception()}"
                await send(chunks, end=finished, error=error)
        finally:
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await producer


# -- a ready-made handler: forward to an upstream with the host's credentials -------------

# Besides the connection's own headers: the upstream's host, and an encoding httpx
# would have to undo.
HOP_BY_HOP = HOP_BY_HOP_HEADERS | {"host", "accept-encoding"}
SANDBOX_CREDENTIALS = {"authorization", "x-api-key", "api-key", "x-goog-api-key"}
# Headers some upstreams and their gateways read to reroute a request or change its
# method: a gateway drops them from untrusted clients, and so does forward_to.
ROUTING_HEADERS = {
    "x-original-url",
    "x-rewrite-url",
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-forwarded-prefix",
    "x-forwarded-port",
    "x-forwarded-server",
    "forwarded",
    "x-real-ip",
    "x-envoy-original-path",
}


def refusal(reason: str, status: int = 400) -> ProxyResponse:
    """The answer to a request the host will not handle: the reason, as JSON."""
    return ProxyResponse.json(
        {"error": {"type": "sandbox_tools_refused", "message": reason}}, status=status
    )


class forward_to:
    """A handler sending each request to `base_url` (e.g. a vLLM server or a provider API),
    with `headers` (the host's credentials) in place of whatever the sandbox sent; the
    answer streams back as the upstream produces it. `ModelProxy` closes it.

    The sandbox chooses only the path below `base_url`'s path and the query: the
    upstream URL is built from the base's scheme, host and port and the checked path
    (never by joining text), then checked again to have exactly that scheme, host, port
    and base path; a request that would leave them is refused with 400 and logged
    (THREAT_MODEL.md, "the host's credentials go only where the host sends them").
    """

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        import httpx

        base = httpx.URL(base_url)
        if base.scheme not in ("http", "https") or not base.host:
            raise ValueError(f"forward_to needs an http(s) URL with a host, not {base_url!r}")
        if base.query or base.fragment or base.userinfo:
            raise ValueError(
                f"forward_to's base URL {base_url!r} must not carry a query, fragment or "
                "user info; pass credentials in headers="
            )
        self.base_url = str(base).rstrip("/")
        self._base = base
        self._base_path = base.raw_path.decode("ascii").rstrip("/")
        self.headers = dict(headers or {})
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=30.0),
            follow_redirects=False,  # a redirect must not carry the host's credentials on
            trust_env=False,  # nor a proxy from the host's environment see them
        )

    def upstream_url(self, path: str) -> Any:
        """The URL for the sandbox's `path`, or ProxyRequestRefused if it would leave the base."""
        import httpx

        relative = origin_form_path(path)
        url = httpx.URL(
            scheme=self._base.scheme,
            host=self._base.host,
            port=self._base.port,
            raw_path=(self._base_path + relative).encode("ascii"),
        )
        path_only = url.raw_path.decode("ascii").partition("?")[0]
        if (
            url.scheme != self._base.scheme
            or url.host != self._base.host
            or url.port != self._base.port
            or url.userinfo
            or not (path_only + "/").startswith(self._base_path + "/")
        ):
            raise ProxyRequestRefused(f"the path {path[:80]!r} leaves {self.base_url}")
        return url

    async def __call__(self, request: ProxyRequest) -> ProxyResponse:
        # Checked on arrival too; this handler may also be given requests made elsewhere.
        refuse_unless_model_method(request.method)
        url = self.upstream_url(request.path)
        forwarded = [
            (k, v)
            for k, v in request.headers
            if k.lower() not in HOP_BY_HOP | SANDBOX_CREDENTIALS | ROUTING_HEADERS
        ]
        outgoing = self._client.build_request(
            request.method,
            url,
            headers=[*forwarded, *self.headers.items()],
            content=request.body,
        )
        upstream = await self._client.send(outgoing, stream=True)

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_bytes():
                    yield chunk
            finally:
                await upstream.aclose()

        kept = [(k, v) for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP]
        return ProxyResponse(upstream.status_code, kept, body())

    async def aclose(self) -> None:
        await self._client.aclose()
