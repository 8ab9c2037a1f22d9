"""What the model reads of a page: the accessibility tree as text, and the main content.

Pure: it takes what Chromium answered to `Accessibility.getFullAXTree` and
`DOMSnapshot.captureSnapshot` plus the visible part of the page, and returns text and the
clickable boxes behind the ids in it. inspect_ai's host and the models prompted by its
tool descriptions expect one line per element, indented two spaces per level:

    [AXNodeId] role "name" [property: value, ...]

Only elements on screen are shown (their layout box has an area and overlaps the
viewport), and the noise a raw tree is full of is dropped (see `_hidden`). The browser
runs as the agent's identity, so the input is untrusted: every field is type-checked,
child lists may be cyclic or very deep (walked with an explicit stack, never recursion),
and the output is cut at a size bound with a last line saying so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Properties that only add noise to a line (every link is focusable, every heading has a
# level the role already implies, and so on).
_SKIPPED_PROPERTIES = frozenset(
    {"focusable", "readonly", "level", "settable", "multiline", "invalid"}
)
# Roles never worth a line of their own.
_SKIPPED_ROLES = frozenset({"horizontal_rule", "ignored", "none", "InlineTextBox"})
# Containers that say nothing unless they have a name of their own.
_ROLES_NEEDING_A_NAME = frozenset({"generic", "paragraph", "div"})
# In the main content, these start a new paragraph; everything else follows with a space.
_BLOCK_ROLES = frozenset({"paragraph", "note", "row", "div", "heading", "region"})
_SPACES = re.compile(r"[ \t]+")
_PARAGRAPH_BREAKS = re.compile(r" ?\n[\s]*\n ?")


@dataclass(frozen=True)
class Rect:
    """A box in CSS pixels of the document (not of the viewport)."""

    left: float
    top: float
    width: float
    height: float

    @property
    def right(self) -> float:
        return self.left + self.width

    @property
    def bottom(self) -> float:
        return self.top + self.height

    @property
    def has_area(self) -> bool:
        return self.width > 0 and self.height > 0

    def overlaps(self, other: Rect) -> bool:
        return (
            other.left < self.right
            and other.right > self.left
            and other.top < self.bottom
            and other.bottom > self.top
        )

    def inside(self, other: Rect) -> bool:
        """Whether this box lies within `other` (a link's own text within the link)."""
        return (
            other.left <= self.left
            and self.right <= other.right
            and other.top <= self.top
            and self.bottom <= other.bottom
        )


@dataclass(frozen=True)
class Target:
    """What a tool needs to act on an element the model named by id."""

    bounds: Rect
    backend_node_id: int | None


@dataclass(frozen=True)
class PageText:
    tree: str
    main_content: str | None
    targets: Mapping[str, Target]
    truncated: bool


def redact_data_url(url: str) -> str:
    """Inline images are kilobytes of base64 that mean nothing to a model."""
    if url.startswith("data:") and "base64" in url:
        return "data:<base64-data-removed>"
    return url


def _text(value: Any) -> str:
    """An AXValue's string (`{"type": ..., "value": "..."}`), or "" for anything else."""
    if isinstance(value, dict):
        inner = value.get("value")
        if isinstance(inner, str):
            return inner
    return ""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


class _Snapshot:
    """The first document of a DOMSnapshot, indexed by backend node id."""

    def __init__(self, snapshot: Mapping[str, Any], scale: float) -> None:
        self.strings: list[str] = [s for s in _list(snapshot.get("strings")) if isinstance(s, str)]
        documents = _list(snapshot.get("documents"))
        document = documents[0] if documents and isinstance(documents[0], dict) else {}
        nodes = document.get("nodes") if isinstance(document.get("nodes"), dict) else {}
        layout = document.get("layout") if isinstance(document.get("layout"), dict) else {}
        assert isinstance(nodes, dict) and isinstance(layout, dict)
        self.index_of: dict[int, int] = {}
        for index, backend_id in enumerate(_list(nodes.get("backendNodeId"))):
            if isinstance(backend_id, int):
                self.index_of.setdefault(backend_id, index)
        self.bounds_of: dict[int, Rect] = {}
        boxes = _list(layout.get("bounds"))
        for layout_index, node_index in enumerate(_list(layout.get("nodeIndex"))):
            if not isinstance(node_index, int) or node_index in self.bounds_of:
                continue
            if layout_index < len(boxes):
                rect = _rect(boxes[layout_index], scale)
                if rect is not None:
                    self.bounds_of[node_index] = rect
        self.source_url_of = self._rare_strings(nodes.get("currentSourceURL"))
        self.text_value_of = self._rare_strings(nodes.get("textValue"))
        self.input_value_of = self._rare_strings(nodes.get("inputValue"))

    def _rare_strings(self, rare: Any) -> dict[int, str]:
        if not isinstance(rare, dict):
            return {}
        found: dict[int, str] = {}
        for node_index, string_index in zip(
            _list(rare.get("index")), _list(rare.get("value")), strict=False
        ):
            if (
                isinstance(node_index, int)
                and isinstance(string_index, int)
                and 0 <= string_index < len(self.strings)
            ):
                found[node_index] = self.strings[string_index]
        return found


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _rect(box: Any, scale: float) -> Rect | None:
    if not isinstance(box, list) or len(box) != 4:
        return None
    numbers = [_number(v) for v in box]
    if any(n is None for n in numbers):
        return None
    left, top, width, height = (n / scale for n in numbers if n is not None)
    return Rect(left, top, width, height)


@dataclass
class _Node:
    node_id: str
    parent_id: str | None
    children: list[str]
    ignored_by_browser: bool
    role: str
    name: str
    properties: list[tuple[str, Any]]
    value: str | None
    backend_node_id: int | None
    bounds: Rect | None = None
    visible: bool = False
    image_url: str | None = None
    current_input: str | None = None
    # The id the model sees: the node's place in the document's tree (pre-order from the
    # root), so the same document gives the same ids in every run and after back/forward
    # (the browser's own node ids count up across the browser's life).
    element_id: int = 0


def _number_in_document_order(nodes: dict[str, _Node], root: str) -> None:
    """Give every node reachable from `root` its pre-order place, from 1."""
    stack, seen, number = [root], set(), 0
    while stack:
        node_id = stack.pop()
        node = nodes.get(node_id)
        if node is None or node_id in seen:  # a malformed tree may name a node twice
            continue
        seen.add(node_id)
        number += 1
        node.element_id = number
        stack.extend(reversed(node.children))


def _property_value(prop: Mapping[str, Any]) -> Any:
    value = prop.get("value")
    if not isinstance(value, dict):
        return None
    related = value.get("relatedNodes")
    if value.get("value") is None and isinstance(related, list):
        refs = [r.get("idref") for r in related if isinstance(r, dict)]
        return " ".join(r for r in refs if isinstance(r, str)) or None
    inner = value.get("value")
    return inner if isinstance(inner, (str, int, float, bool)) else None


def _parse_nodes(ax_nodes: Iterable[Any]) -> tuple[dict[str, _Node], str | None]:
    nodes: dict[str, _Node] = {}
    root: str | None = None
    for raw in ax_nodes:
        if not isinstance(raw, dict) or not isinstance(raw.get("nodeId"), str):
            continue
        node_id = raw["nodeId"]
        if node_id in nodes:
            continue
        parent = raw.get("parentId")
        properties = [
            (p["name"], _property_value(p))
            for p in _list(raw.get("properties"))
            if isinstance(p, dict) and isinstance(p.get("name"), str)
        ]
        backend = raw.get("backendDOMNodeId")
        value = raw.get("value")
        nodes[node_id] = _Node(
            node_id=node_id,
            parent_id=parent if isinstance(parent, str) else None,
            children=[c for c in _list(raw.get("childIds")) if isinstance(c, str)],
            ignored_by_browser=raw.get("ignored") is True,
            role=_text(raw.get("role")),
            name=_text(raw.get("name")),
            properties=properties,
            value=_text(value) if isinstance(value, dict) and "value" in value else None,
            backend_node_id=backend if isinstance(backend, int) else None,
        )
        if root is None and not isinstance(parent, str):
            root = node_id
    if root is not None:
        _number_in_document_order(nodes, root)
    return nodes, root


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _line(node: _Node) -> str:
    has_box = node.bounds is not None and node.bounds.has_area
    parts = [f"[{node.element_id if has_box else '*'}]", node.role]
    if node.name:
        parts.append(f'"{node.name}"')
    if node.image_url:
        parts.append(redact_data_url(node.image_url))
    if node.current_input:
        parts.append(f'Current input: "{node.current_input}"')
    shown = []
    for name, value in node.properties:
        if name in _SKIPPED_PROPERTIES:
            continue
        # A value of False is shown as such (inspect's tool documentation shows the model
        # `required: False`; a bare `required` reads as true), a property without one by
        # its name alone.
        if value is None:
            shown.append(name)
            continue
        text = redact_data_url(value) if name == "url" and isinstance(value, str) else value
        shown.append(f"{name}: {_format_value(text)}")
    line = " ".join(parts)
    # Two spaces before the properties, as inspect's tree has them (authors' checks
    # compare lines such as `link "Anchor"  [url: ...]` exactly).
    return f"{line}  [{', '.join(shown)}]" if shown else line


class _Page:
    def __init__(
        self,
        nodes: dict[str, _Node],
        root: str,
        snapshot: _Snapshot,
        viewport: Rect,
    ) -> None:
        self.nodes = nodes
        self.root = root
        self.parent_of: dict[str, str] = {}
        self.order: list[str] = []  # pre-order from the root, each node once
        self._annotate(snapshot, viewport)

    def _annotate(self, snapshot: _Snapshot, viewport: Rect) -> None:
        seen = {self.root}
        stack = [self.root]
        while stack:
            node = self.nodes[stack.pop()]
            self.order.append(node.node_id)
            parent = self.nodes.get(self.parent_of.get(node.node_id, ""))
            index = (
                snapshot.index_of.get(node.backend_node_id)
                if node.backend_node_id is not None
                else None
            )
            if index is not None:
                node.bounds = snapshot.bounds_of.get(index)
                node.visible = bool(
                    node.bounds and node.bounds.has_area and node.bounds.overlaps(viewport)
                )
                if node.role == "image":
                    node.image_url = snapshot.source_url_of.get(index)
            if node.role == "combobox" or any(n == "editable" for n, _ in node.properties):
                node.current_input = node.value or (
                    (snapshot.text_value_of.get(index) or snapshot.input_value_of.get(index))
                    if index is not None
                    else None
                )
            # An open menu's items are shown even when they have no box of their own.
            if node.role == "menuitem" and parent is not None and _expanded(parent):
                node.visible = True
            for child in reversed(node.children):
                if child in self.nodes and child not in seen:
                    seen.add(child)
                    self.parent_of[child] = node.node_id
                    stack.append(child)

    def hidden(self, node: _Node, shown_ancestor: _Node | None) -> bool:
        """Whether `node` gets no line (its children may still get theirs)."""
        if node.ignored_by_browser or not node.visible or node.role in _SKIPPED_ROLES:
            return True
        # The text inside a named link or button repeats the link's name.
        if (
            shown_ancestor is not None
            and shown_ancestor.role in ("link", "button")
            and shown_ancestor.name
            and shown_ancestor.bounds is not None
            and node.bounds is not None
            and node.bounds.inside(shown_ancestor.bounds)
        ):
            return True
        if node.name:
            parent = self.nodes.get(self.parent_of.get(node.node_id, ""))
            return parent is not None and parent.name == node.name
        return node.role in _ROLES_NEEDING_A_NAME


def _expanded(node: _Node) -> bool:
    return any(name == "expanded" and value is True for name, value in node.properties)


def render_page(
    ax_nodes: Sequence[Any],
    snapshot: Mapping[str, Any],
    viewport: Rect,
    *,
    max_chars: int,
    device_scale_factor: float = 1.0,
) -> PageText:
    """The tree (at most `max_chars`, cut at a line with a note), main content, targets."""
    nodes, root = _parse_nodes(ax_nodes)
    if root is None:
        return PageText("", None, {}, False)
    page = _Page(nodes, root, _Snapshot(snapshot, device_scale_factor or 1.0), viewport)
    lines: list[str] = []
    size = 0
    cut_after = 0  # elements not shown because the tree reached max_chars
    targets: dict[str, Target] = {}
    # (node, depth, nearest ancestor with a line)
    stack: list[tuple[str, int, _Node | None]] = [(root, 0, None)]
    while stack:
        node_id, depth, shown_ancestor = stack.pop()
        node = nodes[node_id]
        child_depth, child_ancestor = depth, shown_ancestor
        if not page.hidden(node, shown_ancestor):
            if node.bounds is not None and node.bounds.has_area:
                targets[str(node.element_id)] = Target(node.bounds, node.backend_node_id)
            line = "  " * depth + _line(node)
            if cut_after or size + len(line) + 1 > max_chars:
                cut_after += 1
            else:
                lines.append(line)
                size += len(line) + 1
            child_depth, child_ancestor = depth + 1, node
        stack.extend(
            (child, child_depth, child_ancestor)
            for child in reversed(node.children)
            if page.parent_of.get(child) == node_id
        )
    if cut_after:
        lines.append(
            f"[the tree was cut at {max_chars} characters: {cut_after} more elements are "
            "not shown; scroll, or act on the elements above]"
        )
    return PageText(
        tree="\n".join(lines) + "\n" if lines else "",
        main_content=_main_content(page, max_chars),
        targets=targets,
        truncated=bool(cut_after),
    )


def _main_content(page: _Page, max_chars: int) -> str | None:
    """The visible text under the first `main` element, paragraphs kept apart."""
    main = next((n for n in page.order if page.nodes[n].role == "main"), None)
    if main is None:
        return None
    pieces: list[str] = []
    size = 0
    stack: list[tuple[str, str]] = [("node", main)]
    while stack and size <= max_chars:
        kind, value = stack.pop()
        if kind == "text":
            pieces.append(value)
            size += len(value)
            continue
        node = page.nodes[value]
        if not node.visible:
            continue
        parent = page.nodes.get(page.parent_of.get(value, ""))
        # A heading's or link's text node repeats its name: say it once.
        if node.name and (parent is None or parent.name != node.name):
            pieces.append(node.name)
            size += len(node.name)
        for child in reversed(node.children):
            if page.parent_of.get(child) != value or not page.nodes[child].visible:
                continue
            stack.append(("node", child))
            stack.append(("text", "\n\n" if page.nodes[child].role in _BLOCK_ROLES else " "))
    text = _PARAGRAPH_BREAKS.sub("\n\n", _SPACES.sub(" ", "".join(pieces))).strip()
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[main content cut at {max_chars} characters]"
    return text
