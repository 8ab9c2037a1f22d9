"""The model proxy for real: the built runtime's `model_proxy` in a container with no
network, a client inside it (python3's http.client), the host's `ModelProxy` forwarding
to a fake model API on the host's loopback with the host's credentials."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.errors import SandboxToolsError
from sandbox_tools.injector.inject import forget_sandbox, tool_support_sandbox
from sandbox_tools.injector.model_proxy import ModelProxy, forward_to
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.docker import DockerSandbox
from tests.proxy.upstream import WORDS, FakeUpstream
from tests.support import arches_under_test

pytest.importorskip("httpx", reason="the [proxy] extra is not installed")
pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]

CLIENT = "/opt/proxy/client.py"


@pytest.fixture
async def sandbox(
    docker_engine: Any, python_image: str, built_artifacts: Any, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[DockerSandbox]:
    _record, path = built_artifacts(arches_under_test()[0])
    monkeypatch.setenv("SANDBOX_TOOLS_DIST", str(path.parent))
    clients = Path(__file__).parents[1] / "proxy"
    volumes = {str(clients): {"bind": "/opt/proxy", "mode": "ro"}}
    with RunningContainer(
        docker_engine, python_image, volumes=volumes, network_mode="none"
    ) as container:
        box = container.sandbox
        yield box
        await forget_sandbox(box)


async def run_client(sandbox: DockerSandbox, scenario: str, port: int = 13131) -> Any:
    done = await sandbox.exec(["python3", CLIENT, scenario, str(port)], timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


@pytest.mark.parametrize("persistent", [True, False], ids=["stdio", "exec"])
async def test_chat_and_messages_streamed_and_not(sandbox: DockerSandbox, persistent: bool) -> None:
    support = await tool_support_sandbox(sandbox, options=InjectionOptions(persistent=persistent))
    async with FakeUpstream(delay=0.2) as upstream:
        handler = forward_to(upstream.url, headers={"Authorization": "Bearer host-secret"})
        async with ModelProxy(support, handler) as proxy:
            assert proxy.env["OPENAI_BASE_URL"] == "http://127.0.0.1:13131/v1"
            status, [(_, body)] = await run_client(sandbox, "chat")
            assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == (
                "".join(WORDS)
            )
            status, events = await run_client(sandbox, "chat-stream")
            deltas = [json.loads(e)["choices"][0]["delta"]["content"] for _, e in events[:-1]]
            assert status == 200 and deltas == WORDS and events[-1][1] == "[DONE]"
            # Streamed, not buffered: the first event came long before the last.
            assert events[-1][0] - events[0][0] > 0.6
            status, [(_, body)] = await run_client(sandbox, "messages")
            assert json.loads(body)["content"][0]["text"] == "".join(WORDS)
            status, events = await run_client(sandbox, "messages-stream")
            assert [json.loads(e)["delta"]["text"] for _, e in events] == WORDS
    # The host's credentials replaced the sandbox's on every request.
    assert all(r["headers"].get("authorization") == "Bearer host-secret" for r in upstream.requests)


async def test_large_bodies_concurrency_disconnects_and_bad_http(sandbox: DockerSandbox) -> None:
    support = await tool_support_sandbox(sandbox)
    async with FakeUpstream(delay=0.05) as upstream:
        async with ModelProxy(support, forward_to(upstream.url)) as proxy:
            status, [(_, body)] = await run_client(sandbox, "big")
            echoed = json.loads(body)
            assert status == 200 and echoed["bytes"] == 5 * 1024 * 1024
            assert echoed["sha256"] == hashlib.sha256(b"x" * (5 * 1024 * 1024)).hexdigest()
            assert echoed["auth"] == ""  # the sandbox's own key never leaves the sandbox
            many = await run_client(sandbox, "concurrent")
            assert [r[0] for r in many["results"]] == [200] * 16
            # A client that goes away mid-stream cancels the host's handler, which closes
            # its upstream request.
            cut = await run_client(sandbox, "disconnect")
            assert cut["first"].startswith("HTTP/1.1 200")
            await asyncio.wait_for(upstream.stream_closed_early.wait(), 30)
            bad = await run_client(sandbox, "malformed")
            assert bad["answer"].startswith("HTTP/1.1 400")
            # The proxy survived all of it.
            status, _ = await run_client(sandbox, "chat")
            assert status == 200
            taken = ModelProxy(support, forward_to(upstream.url), port=proxy.port)
            with pytest.raises(SandboxToolsError, match=r"cannot listen on 127\.0\.0\.1:13131"):
                await taken.start()
        # Closed: the proxy process was killed through exec_remote.
        gone = await sandbox.exec(["python3", CLIENT, "chat"], timeout=60)
        assert gone.returncode != 0 and b"Connection refused" in gone.stderr


async def test_a_host_that_does_not_answer_gives_504(sandbox: DockerSandbox) -> None:
    support = await tool_support_sandbox(sandbox)

    async def never(request: Any) -> Any:
        await asyncio.sleep(3600)

    proxy = ModelProxy(support, never, timeout=2)
    async with proxy:
        status, [(_, body)] = await run_client(sandbox, "chat")
        assert status == 504 and "did not answer within 2 s" in json.loads(body)["error"]["message"]


async def test_an_inspect_model_answers_openai_and_anthropic_requests(
    sandbox: DockerSandbox,
) -> None:
    inspect_model = pytest.importorskip("inspect_ai.model", reason="needs the [inspect] extra")
    from sandbox_tools.inspect.model_handler import inspect_model_handler

    outputs = []
    for n in range(4):
        output = inspect_model.ModelOutput.from_content("mockllm/model", f"answer {n}")
        output.usage = inspect_model.ModelUsage(input_tokens=3, output_tokens=2, total_tokens=5)
        outputs.append(output)
    model = inspect_model.get_model("mockllm/model", custom_outputs=outputs)
    support = await tool_support_sandbox(sandbox)
    async with ModelProxy(support, inspect_model_handler(model)):
        _, [(_, body)] = await run_client(sandbox, "chat")
        assert json.loads(body)["choices"][0]["message"]["content"] == "answer 0"
        _, events = await run_client(sandbox, "chat-stream")
        text = "".join(
            json.loads(e)["choices"][0]["delta"].get("content", "") for _, e in events[:-1]
        )
        assert text == "answer 1" and events[-1][1] == "[DONE]"
        _, [(_, body)] = await run_client(sandbox, "messages")
        assert json.loads(body)["content"][0]["text"] == "answer 2"
        _, events = await run_client(sandbox, "messages-stream")
        kinds = [json.loads(e)["type"] for _, e in events]
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        deltas = [json.loads(e)["delta"]["text"] for _, e in events if "text_delta" in e]
        assert deltas == ["answer 3"]


async def test_the_official_openai_sdk_in_the_sandbox_talks_to_an_inspect_model(
    docker_engine: Any,
    python_image: str,
    built_artifacts: Any,
    openai_site: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent's own SDK, configured only by ModelProxy.env, in a container with no
    network: its requests are answered by the task's model (mockllm) on the host."""
    inspect_model = pytest.importorskip("inspect_ai.model", reason="needs the [inspect] extra")
    from sandbox_tools.inspect.model_handler import inspect_model_handler

    _record, path = built_artifacts(arches_under_test()[0])
    monkeypatch.setenv("SANDBOX_TOOLS_DIST", str(path.parent))
    outputs = []
    for text in ("forty-two", "forty-two, streamed"):
        output = inspect_model.ModelOutput.from_content("mockllm/model", text)
        output.usage = inspect_model.ModelUsage(input_tokens=3, output_tokens=2, total_tokens=5)
        outputs.append(output)
    model = inspect_model.get_model("mockllm/model", custom_outputs=outputs)
    clients = Path(__file__).parents[1] / "proxy"
    volumes = {
        str(clients): {"bind": "/opt/proxy", "mode": "ro"},
        str(openai_site): {"bind": "/opt/openai-site", "mode": "ro"},
    }
    with RunningContainer(
        docker_engine, python_image, volumes=volumes, network_mode="none"
    ) as container:
        sandbox = container.sandbox
        support = await tool_support_sandbox(sandbox)
        try:
            async with ModelProxy(support, inspect_model_handler(model)) as proxy:
                env = {**proxy.env, "PYTHONPATH": "/opt/openai-site"}
                done = await sandbox.exec(
                    ["python3", "/opt/proxy/openai_client.py"], env=env, timeout=120
                )
                assert done.returncode == 0, done.stderr.decode()[-2000:]
                answer = json.loads(done.stdout)
                assert answer["plain"] == "forty-two"
                assert "".join(answer["stream"]) == "forty-two, streamed"
        finally:
            await support.aclose()
            await forget_sandbox(sandbox)
