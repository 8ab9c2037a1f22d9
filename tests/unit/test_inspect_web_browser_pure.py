"""`sandbox_tools.inspect.web_browser()` without a sandbox: what the model reads (a page
in inspect's result shape: main content and tree as two text items, or the tree alone;
the screenshot as an image after them; a page error as a ToolError), the tools' names and
parameters, a failed install reported once and then at once, and the sample's browser
sessions closed at its end (a recording client stands in for the runtime)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")

from inspect_ai.tool import ContentImage, ContentText, ToolDef, ToolError

from sandbox_tools.errors import SandboxInjectionError
from sandbox_tools.injector.web_browser import BrowserPage
from sandbox_tools.inspect import browser as module
from sandbox_tools.inspect import tools
from sandbox_tools.inspect.browser import page_result, web_browser

TREE = '[1] RootWebArea "Shop"\n  [4] heading "The shop"\n  [7] link "About us"'
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def _page(main: str | None = None, error: str | None = None, tree: str = TREE) -> BrowserPage:
    return BrowserPage("http://127.0.0.1:8000/", main, tree, error)


def test_a_page_without_main_content_is_its_tree_alone() -> None:
    assert page_result(_page()) == TREE


def test_main_content_comes_first_then_the_tree() -> None:
    result = page_result(_page(main="Welcome."))
    assert result == [
        ContentText(text="main content:\nWelcome.\n\n"),
        ContentText(text=f"accessibility tree:\n{TREE}"),
    ]


def test_a_page_error_is_a_tool_error_for_the_model() -> None:
    with pytest.raises(ToolError, match="net::ERR_CONNECTION_REFUSED"):
        page_result(_page(error="net::ERR_CONNECTION_REFUSED at http://127.0.0.1:8000/"))
    assert page_result(_page(error="  ")) == TREE  # a blank error is no error, as in inspect


def test_inline_images_are_cut_from_tree_lines() -> None:
    tree = '[1] RootWebArea "Pics"\n  [2] image "logo" data:image/png;base64,iVBORw0KGgo='
    assert page_result(_page(tree=tree)) == '[1] RootWebArea "Pics"\n  [2] image "logo" '


def test_an_empty_tree_says_so() -> None:
    assert "no accessibility tree" in str(page_result(_page(tree="")))


@pytest.mark.parametrize("main", [None, "Welcome."])
def test_a_screenshot_is_an_image_after_the_text(main: str | None) -> None:
    result = page_result(_page(main=main), PNG)
    assert isinstance(result, list)
    *texts, image = result
    assert all(isinstance(item, ContentText) for item in texts)
    assert texts[-1].text.endswith(TREE)
    assert isinstance(image, ContentImage)
    assert image.image == "data:image/png;base64," + base64.b64encode(PNG).decode()


def test_the_tools_are_inspects_names_and_interactive_false_drops_the_acting_ones() -> None:
    names = [ToolDef(tool).name for tool in web_browser()]
    assert names == [
        "web_browser_go",
        "web_browser_click",
        "web_browser_type_submit",
        "web_browser_type",
        "web_browser_scroll",
        "web_browser_back",
        "web_browser_forward",
        "web_browser_refresh",
    ]
    passive = [ToolDef(tool).name for tool in web_browser(interactive=False)]
    assert passive == [
        "web_browser_go",
        "web_browser_scroll",
        "web_browser_back",
        "web_browser_forward",
        "web_browser_refresh",
    ]
    assert not any(ToolDef(tool).parallel for tool in web_browser())  # one page at a time
    go = ToolDef(web_browser()[0])
    assert list(go.parameters.properties) == ["url"]
    assert go.parameters.properties["url"].description
    type_submit = ToolDef(web_browser()[2])
    assert list(type_submit.parameters.properties) == ["element_id", "text"]
    assert type_submit.parameters.properties["element_id"].type == "integer"


def test_each_tool_takes_the_shared_options_and_an_unknown_direction_is_the_model_s_error() -> None:
    """The options are declared once for all eight tools; a scroll direction the runtime
    would refuse is refused first, as a ToolError the model reads (no sandbox reached)."""
    import inspect as python_inspect

    for tool in web_browser():
        factory = module.__dict__[ToolDef(tool).name]
        assert list(python_inspect.signature(factory).parameters) == [
            "instance",
            "screenshots",
            "user",
            "sandbox",
        ]
        assert "instance: Each instance has a browser session" in (factory.__doc__ or "")
    scroll = module.web_browser_scroll()
    with pytest.raises(ToolError, match='direction must be "up" or "down", not \'sideways\''):
        asyncio.run(scroll("sideways"))  # type: ignore[operator]


class RecordingClient:
    """Answers every runtime call as a closed session would, and remembers it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call(self, method: str, params: dict[str, Any], timeout: float = 0) -> Any:
        self.calls.append((method, params))
        return {"closed": True}

    async def aclose(self) -> None:
        pass


class FakeSupport:
    def __init__(self) -> None:
        self.client = RecordingClient()
        self.browser = None
        self.closed = False

        class _Sandbox:
            name = "docker:fake"

        self.sandbox = _Sandbox()

    async def aclose(self) -> None:
        self.closed = True


def test_the_sample_end_closes_its_browser_sessions() -> None:
    support = FakeSupport()
    bound = tools._Bound(support, None)
    bound.browsers.update({"WebBrowser_b_1", "WebBrowser_a_0"})
    asyncio.run(tools._release(bound))
    assert support.client.calls == [
        ("web_close_session", {"session_name": "WebBrowser_a_0"}),
        ("web_close_session", {"session_name": "WebBrowser_b_1"}),
    ]
    assert support.closed


def test_a_failed_install_is_reported_as_injection_failures_are_and_not_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tries = []

    async def no_space(support: Any) -> Any:
        tries.append(support)
        raise SandboxInjectionError("the browser add-on needs 380 MiB free", remedy="Give it disk.")

    monkeypatch.setattr(module, "ensure_browser", no_space)
    bound = tools._Bound(FakeSupport(), None)
    for _ in range(2):
        with pytest.raises(RuntimeError) as failed:
            asyncio.run(module._installed(bound))
        message = str(failed.value)
        assert message.startswith("sandbox-tools could not install the browser in docker:fake")
        assert "380 MiB free" in message and "Give it disk." in message
    assert len(tries) == 1
