"""The web browser's pure parts: DevTools framing, the page as text, URLs.

Inputs are written the way Chromium answers (`Accessibility.getFullAXTree`,
`DOMSnapshot.captureSnapshot`), cut down to the fields the rendering reads; the browser
runs as the agent, so hostile shapes (cycles, depth, wrong types, floods) are tried too.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sandbox_tools.runtime.tools.web_browser.cdp_framing import (
    CdpFramingError,
    FrameSplitter,
    encode_command,
    parse_frame,
)
from sandbox_tools.runtime.tools.web_browser.page_text import Rect, redact_data_url, render_page
from sandbox_tools.runtime.tools.web_browser.png import NotPng, png_size
from sandbox_tools.runtime.tools.web_browser.urls import normalise_url, reported_url

VIEWPORT = Rect(0, 0, 1280, 1080)

# -- framing ---------------------------------------------------------------------------


def test_a_command_is_one_json_document_ended_by_nul() -> None:
    frame = encode_command(7, "Page.navigate", {"url": "a\x00b"}, "S1")
    assert frame.endswith(b"\x00") and frame.count(b"\x00") == 1
    assert json.loads(frame[:-1]) == {
        "id": 7,
        "method": "Page.navigate",
        "params": {"url": "a\x00b"},
        "sessionId": "S1",
    }
    assert "sessionId" not in json.loads(encode_command(1, "Browser.getVersion", None, None)[:-1])


def test_frames_are_cut_at_nul_across_reads() -> None:
    splitter = FrameSplitter(1000)
    assert splitter.feed(b'{"id":1,"res') == []
    assert splitter.feed(b'ult":{}}\x00{"method":"A"}\x00{"id"') == [
        b'{"id":1,"result":{}}',
        b'{"method":"A"}',
    ]
    assert splitter.feed(b":2}\x00") == [b'{"id":2}']


def test_a_frame_over_the_bound_is_refused_before_its_end_arrives() -> None:
    splitter = FrameSplitter(100)
    with pytest.raises(CdpFramingError, match="longer than 100 bytes"):
        splitter.feed(b"x" * 101)
    with pytest.raises(CdpFramingError):
        FrameSplitter(10).feed(b"x" * 11 + b"\x00")


def test_replies_errors_and_events_are_told_apart() -> None:
    reply = parse_frame(b'{"id":3,"result":{"a":1},"sessionId":"S"}')
    assert reply.is_reply and reply.result == {"a": 1} and reply.session_id == "S"
    error = parse_frame(b'{"id":4,"error":{"code":-32000,"message":"No node"}}')
    assert error.error == "No node" and error.result is None
    event = parse_frame(b'{"method":"Page.loadEventFired","params":{"timestamp":1}}')
    assert not event.is_reply and event.method == "Page.loadEventFired"


@pytest.mark.parametrize(
    "frame",
    [
        b"not json",
        b"[1,2]",
        b'{"id":"1","result":{}}',
        b'{"id":true,"result":{}}',
        b'{"id":1,"result":[]}',
        b'{"params":{}}',
        b'{"method":"A","params":[]}',
        b'{"method":"A","sessionId":5}',
        b"[" * 100_000,
    ],
)
def test_anything_else_is_a_framing_error(frame: bytes) -> None:
    with pytest.raises(CdpFramingError):
        parse_frame(frame)


# -- the page as text ----------------------------------------------------------------


def ax(
    node_id: str,
    role: str,
    name: str = "",
    *,
    parent: str | None = None,
    children: tuple[str, ...] = (),
    backend: int | None = None,
    ignored: bool = False,
    properties: dict[str, Any] | None = None,
    value: str | None = None,
) -> dict[str, Any]:
    node: dict[str, Any] = {
        "nodeId": node_id,
        "ignored": ignored,
        "role": {"type": "role", "value": role},
        "name": {"type": "computedString", "value": name},
        "properties": [
            {"name": key, "value": {"type": "string", "value": v}}
            for key, v in (properties or {}).items()
        ],
        "childIds": list(children),
    }
    if parent is not None:
        node["parentId"] = parent
    if backend is not None:
        node["backendDOMNodeId"] = backend
    if value is not None:
        node["value"] = {"type": "string", "value": value}
    return node


def snapshot(boxes: dict[int, tuple[float, float, float, float]], **rare: Any) -> dict[str, Any]:
    """A DOMSnapshot whose node i has backend id i and, if given, the layout box boxes[i]."""
    ids = list(range(max(boxes, default=0) + 1))
    layout = [i for i in ids if i in boxes]
    return {
        "documents": [
            {
                "nodes": {"backendNodeId": ids, **rare},
                "layout": {"nodeIndex": layout, "bounds": [list(boxes[i]) for i in layout]},
            }
        ],
        "strings": ["", "https://img.example/cat.png", "typed text"],
    }


FULL = (0, 0, 1280, 1080)


def page() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    nodes = [
        ax("1", "RootWebArea", "Home", children=("2",), backend=1, properties={"url": "u"}),
        ax("2", "main", parent="1", children=("3", "4", "6", "8", "9", "10"), backend=2),
        ax("3", "heading", "Welcome", parent="2", children=("11",), backend=3),
        ax("11", "StaticText", "Welcome", parent="3", backend=11),
        ax("4", "link", "Next page", parent="2", children=("5",), backend=4),
        ax("5", "StaticText", "Next", parent="4", backend=5),
        ax("6", "paragraph", parent="2", children=("7",), backend=6),
        ax("7", "StaticText", "Far below", parent="6", backend=7),
        ax("8", "generic", parent="2", backend=8),
        ax("9", "textbox", "Search", parent="2", backend=9, properties={"editable": "plaintext"}),
        ax("10", "image", "Cat", parent="2", backend=10),
    ]
    boxes = {
        1: FULL,
        2: FULL,
        3: (8, 8, 300, 40),
        11: (8, 8, 300, 40),
        4: (8, 60, 100, 20),
        5: (8, 60, 50, 20),  # inside the link: its text repeats the link's name
        6: (8, 5000, 100, 20),  # below the viewport
        7: (8, 5000, 100, 20),
        8: (8, 100, 100, 20),
        9: (8, 130, 200, 20),
        10: (8, 160, 64, 64),
    }
    rare = {
        "currentSourceURL": {"index": [10], "value": [1]},
        "inputValue": {"index": [9], "value": [2]},
    }
    return nodes, snapshot(boxes, **rare)


def test_visible_elements_are_lines_indented_by_depth() -> None:
    nodes, snap = page()
    text = render_page(nodes, snap, VIEWPORT, max_chars=10_000)
    assert text.tree.splitlines() == [
        '[1] RootWebArea "Home"  [url: u]',
        "  [2] main",
        '    [3] heading "Welcome"',
        '    [5] link "Next page"',
        '    [10] textbox "Search" Current input: "typed text"  [editable: plaintext]',
        '    [11] image "Cat" https://img.example/cat.png',
    ]
    # What can be clicked is what is shown, with its box for the click.
    assert set(text.targets) == {"1", "2", "3", "5", "10", "11"}
    assert text.targets["5"].bounds == Rect(8, 60, 100, 20)
    assert text.targets["5"].backend_node_id == 4
    assert not text.truncated


def test_the_same_document_gives_the_same_ids_whatever_the_browsers_node_ids() -> None:
    """Ids are places in the document's tree, not the browser's node ids (which count up
    over the browser's life: the same link was 14, 16 or 17 in fresh sandboxes, and new
    again after `back`). The browser's ids shifted and its list reordered: same tree."""
    nodes, snap = page()

    def shifted(value: str) -> str:
        return str(int(value) + 1000)

    renumbered = []
    for node in reversed(nodes):
        node = dict(node, nodeId=shifted(node["nodeId"]))
        node["childIds"] = [shifted(c) for c in node.get("childIds", [])]
        if "parentId" in node:
            node["parentId"] = shifted(node["parentId"])
        renumbered.append(node)
    renumbered.insert(0, renumbered.pop())  # the root first, as the browser sends it
    first = render_page(nodes, snap, VIEWPORT, max_chars=10_000)
    again = render_page(renumbered, snap, VIEWPORT, max_chars=10_000)
    assert again.tree == first.tree
    assert set(again.targets) == set(first.targets)


def test_what_is_scrolled_into_view_appears_and_what_left_it_goes() -> None:
    nodes, snap = page()
    lines = render_page(nodes, snap, Rect(0, 4500, 1280, 1080), max_chars=10_000).tree
    assert '[8] StaticText "Far below"' in lines
    assert "Welcome" not in lines


def test_main_content_is_the_visible_text_of_main_each_name_once() -> None:
    nodes, snap = page()
    main = render_page(nodes, snap, VIEWPORT, max_chars=10_000).main_content
    assert main == "Welcome Next page Next Search Cat"
    assert render_page(nodes[:1], snap, VIEWPORT, max_chars=100).main_content is None


def test_properties_show_booleans_and_references_and_skip_noise() -> None:
    node = ax("1", "button", "Menu", backend=1)
    node["properties"] = [
        {"name": "focusable", "value": {"type": "booleanOrUndefined", "value": True}},
        {"name": "expanded", "value": {"type": "booleanOrUndefined", "value": False}},
        {"name": "level", "value": {"type": "integer", "value": 2}},
        {
            "name": "controls",
            "value": {"type": "idrefList", "relatedNodes": [{"backendDOMNodeId": 9, "idref": "m"}]},
        },
        {"name": "url", "value": {"type": "string", "value": "data:image/png;base64,AAAA"}},
    ]
    tree = render_page([node], snapshot({1: (0, 0, 10, 10)}), VIEWPORT, max_chars=1000).tree
    assert tree == (
        '[1] button "Menu"  [expanded: False, controls: m, url: data:<base64-data-removed>]\n'
    )


def test_a_tree_past_the_bound_is_cut_at_a_line_and_says_how_much_is_missing() -> None:
    children = tuple(str(i) for i in range(2, 502))
    nodes = [ax("1", "RootWebArea", "Long", children=children, backend=1)]
    nodes += [ax(c, "StaticText", f"Line {c}", parent="1", backend=int(c)) for c in children]
    boxes = {int(c): (0, 0, 100, 10) for c in ("1", *children)}
    text = render_page(nodes, snapshot(boxes), VIEWPORT, max_chars=2000)
    lines = text.tree.splitlines()
    assert text.truncated
    assert sum(len(line) + 1 for line in lines[:-1]) <= 2000
    shown = len(lines) - 2  # the root's line and the note
    assert lines[-1].startswith(f"[the tree was cut at 2000 characters: {500 - shown} more")
    # Elements past the cut can still be named (the model may have seen them earlier).
    assert "501" in text.targets


def test_hostile_trees_are_rendered_without_recursion_or_loops() -> None:
    depth = 50_000
    nodes = [
        ax(str(i), "group", f"g{i}", parent=str(i - 1) if i else None, children=(str(i + 1),))
        for i in range(depth)
    ]
    nodes[-1]["childIds"] = ["0"]  # and a cycle back to the root
    nodes.append({"nodeId": 5, "role": "x"})  # wrong types are skipped
    nodes.append("not a node")
    text = render_page(nodes, {"documents": "nonsense"}, VIEWPORT, max_chars=1000)
    assert text.tree == ""  # nothing has a box, so nothing is on screen
    assert render_page([], {}, VIEWPORT, max_chars=10).tree == ""


def test_boxes_that_are_not_four_numbers_mean_no_box() -> None:
    nodes = [ax("1", "button", "B", backend=1)]
    bad = snapshot({1: FULL})
    bad["documents"][0]["layout"]["bounds"] = [["a", 0, 1, 1]]
    assert render_page(nodes, bad, VIEWPORT, max_chars=100).tree == ""


def test_data_urls_lose_their_base64() -> None:
    assert redact_data_url("data:image/png;base64,iVBOR") == "data:<base64-data-removed>"
    assert redact_data_url("https://x.test/a.png") == "https://x.test/a.png"


# -- URLs and screenshots ------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("example.com", "https://example.com"),
        ("  example.com/a?b=1 ", "https://example.com/a?b=1"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/"),
        ("about:blank", "about:blank"),
        ("data:text/html,hi", "data:text/html,hi"),
        ("file:///etc/hostname", "file:///etc/hostname"),
    ],
)
def test_a_url_without_scheme_gets_https(given: str, expected: str) -> None:
    assert normalise_url(given) == expected


def test_the_reported_url_has_no_query() -> None:
    assert reported_url("https://a.test/p?token=secret#x") == "https://a.test/p"
    assert reported_url("https://a.test/p#frag") == "https://a.test/p#frag"


def test_png_size_reads_the_header_and_refuses_what_is_not_a_png() -> None:
    header = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + (1280).to_bytes(4, "big")
    assert png_size(header + (1080).to_bytes(4, "big") + b"\x08\x06") == (1280, 1080)
    with pytest.raises(NotPng):
        png_size(b"GIF89a" + b"\x00" * 30)


def test_a_large_frame_in_many_reads_is_found_once_whole() -> None:
    splitter = FrameSplitter(10_000_000)
    frame = b'{"id":1,"result":{"x":"' + b"a" * 5_000_000 + b'"}}'
    data = frame + b"\x00"
    found: list[bytes] = []
    for offset in range(0, len(data), 65_536):
        found += splitter.feed(data[offset : offset + 65_536])
    assert found == [frame]
    assert splitter.feed(b'{"id":2}\x00') == [b'{"id":2}']
