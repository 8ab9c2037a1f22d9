"""What the host keeps of a page answer is bounded, whoever answers in the sandbox.

THREAT_MODEL.md rule 3 (the host is never exhausted): an agent at the runtime's uid can
answer `web_go` in the runtime's place (or an image can raise the runtime's tree limit),
so a 63 MiB tree of short lines once cost the host 1.4 GB and 2 s in the inspect tool's
result. The host cuts each text field before anything else reads it, and the inline
images are cut in one pass.
"""

from __future__ import annotations

import base64
import tracemalloc
from typing import Any

import pytest

from sandbox_tools.errors import RuntimeTransportError
from sandbox_tools.injector.web_browser import (
    MAX_TREE_CHARS,
    BrowserPage,
    BrowserSession,
    new_browser_session,
)
from sandbox_tools.inspect.browser import page_result


def test_a_forged_giant_tree_is_cut_before_it_is_split_or_shown() -> None:
    answer = {
        "web_url": "http://site/",
        "page_url": "http://site/",
        "web_at": "ab\n" * (21 << 20),  # 63 MiB of short lines
        "main_content": None,
        "error": None,
    }
    tracemalloc.start()
    try:
        page = BrowserPage.parse(answer, "web_go")
        shown = page_result(page)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(shown, str)
    assert len(shown) < MAX_TREE_CHARS + 200
    assert shown.endswith("more characters]") and "cut by the host" in shown
    assert peak < 32 << 20, f"{peak >> 20} MiB allocated for a cut tree"


def test_an_ordinary_page_is_untouched_and_inline_images_are_cut() -> None:
    tree = '[1] RootWebArea "Shop"\n  [2] image "logo" [url: data:image/png;base64,AAAA]\n'
    page = BrowserPage.parse(
        {
            "web_url": "http://site/",
            "page_url": "http://site/",
            "web_at": tree,
            "main_content": None,
            "error": None,
        },
        "web_go",
    )
    assert page.tree == tree
    assert page_result(page) == '[1] RootWebArea "Shop"\n  [2] image "logo" [url: \n'


# -- answers forged in the runtime's place (an attacker's walk found each) ---------------

PAGE = {"web_url": "http://site/", "page_url": "http://site/?q=1", "web_at": '[1] heading "A"'}


def test_a_page_answer_without_the_optional_keys_is_a_page() -> None:
    """inspect's protocol lets `main_content` and `error` be absent: the host raised an
    untyped KeyError, which failed the sample."""
    page = BrowserPage.parse(PAGE, "web_go")
    assert (page.url, page.main_content, page.error) == ("http://site/?q=1", None, None)


def test_a_blank_error_is_no_error() -> None:
    """Whitespace as `error` skipped the screenshot yet showed the page as a success (and
    20,000 spaces became a tool error): blank is no error, everywhere."""
    assert BrowserPage.parse({**PAGE, "error": " " * 20_000}, "web_go").error is None


def test_lone_surrogates_never_reach_a_model_request() -> None:
    """JSON carries lone surrogates; a model request serialised as UTF-8 cannot (the next
    generate failed with UnicodeEncodeError)."""
    page = BrowserPage.parse(
        {**PAGE, "page_url": "\udfff", "web_at": "\ud800", "main_content": "mc \udc00",
         "error": "bad \ud800"},
        "web_go",
    )  # fmt: skip
    for text in (page.url, page.tree, page.main_content, page.error):
        assert text is not None
        text.encode("utf-8")  # would raise on a surrogate
    shown = page_result(BrowserPage.parse({**PAGE, "web_at": "tree \ud800"}, "web_go"))
    assert isinstance(shown, str) and shown.encode("utf-8")


def test_a_runtime_error_message_is_cut_before_it_reaches_the_model() -> None:
    """A 60 MiB tool error became a ToolError of 62,914,560 characters for the model."""
    from sandbox_tools.errors import ToolError
    from sandbox_tools.injector.jsonrpc_client import MAX_MESSAGE_CHARS, unwrap_response

    response = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32099, "message": "E" * (60 << 20)}}
    with pytest.raises(ToolError) as caught:
        unwrap_response(response, "web_go")
    assert len(caught.value.message) < MAX_MESSAGE_CHARS + 100
    assert caught.value.message.endswith("more characters]")
    response["error"]["message"] = "no session \ud800"
    with pytest.raises(ToolError) as caught:
        unwrap_response(response, "web_go")
    caught.value.message.encode("utf-8")


class _Answers:
    """A client whose every call gets `result`: the sandbox answering in the runtime's
    place."""

    def __init__(self, result: Any) -> None:
        self.result = result

    async def call(self, method: str, params: Any = None, timeout: float | None = None) -> Any:
        return self.result


@pytest.mark.parametrize(
    "name", ["S\x1b[31m\n" * 1000, "x" * 129, "", "../../etc", "a b"], ids=repr
)
async def test_a_session_name_the_runtime_would_not_make_is_refused(name: str) -> None:
    """A 110-million-character name was kept, sent with every call and written to the
    store (hence the eval log), once more each time the session was reopened."""
    with pytest.raises(RuntimeTransportError, match="not a session name"):
        await new_browser_session(_Answers({"session_name": name}))  # type: ignore[arg-type]
    ok = await new_browser_session(_Answers({"session_name": "WebBrowser_ab12_0"}))  # type: ignore[arg-type]
    assert ok.name == "WebBrowser_ab12_0"


@pytest.mark.parametrize(
    ("encoded", "words"),
    [
        ("", "not a PNG"),
        ("AAAA", "not a PNG"),
        (base64.b64encode(b"GIF89a" + b"\0" * 100).decode(), "not a PNG"),
        ("A" * ((16 << 20) // 3 * 4 + 8), "over 16 MiB"),
    ],
    ids=["empty", "zeros", "gif", "huge"],
)
async def test_a_screenshot_must_be_a_png_of_bounded_size(encoded: str, words: str) -> None:
    """Empty, garbage or 46 MiB non-PNG bytes went to the model as an image."""
    session = BrowserSession(_Answers({"png_base64": encoded}), "WebBrowser_x_0", None)  # type: ignore[arg-type]
    with pytest.raises(RuntimeTransportError, match=words):
        await session.screenshot()
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()
    assert (await BrowserSession(_Answers({"png_base64": png}), "s", None).screenshot())[
        :4
    ] == b"\x89PNG"  # type: ignore[arg-type]
