"""What the host keeps of a page answer is bounded, whoever answers in the sandbox.

THREAT_MODEL.md rule 3 (the host is never exhausted): an agent at the runtime's uid can
answer `web_go` in the runtime's place (or an image can raise the runtime's tree limit),
so a 63 MiB tree of short lines once cost the host 1.4 GB and 2 s in the inspect tool's
result. The host cuts each text field before anything else reads it, and the inline
images are cut in one pass.
"""

from __future__ import annotations

import tracemalloc

from sandbox_tools.injector.web_browser import MAX_TREE_CHARS, BrowserPage
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
