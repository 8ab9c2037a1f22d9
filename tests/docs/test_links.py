"""Every link in README.md and docs/*.md stays in the repository and resolves: the file
exists, and a `#fragment` names a heading of the target Markdown file (GitHub's anchors).
Links inside code blocks and code spans are not links."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.docs.blocks import DOCUMENTS, ROOT

FENCED = re.compile(r"^[ \t]*(`{3,}|~{3,}).*?^[ \t]*\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^[ \t]{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
HTML = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)=[\"']([^\"']+)[\"']", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def prose(text: str) -> str:
    """The text with code blocks, code spans and comments blanked out."""
    for pattern in (FENCED, COMMENT, CODE_SPAN):
        text = pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    return text


def links(text: str) -> list[str]:
    body = prose(text)
    return [m.group(1) for pattern in (INLINE, REFERENCE, HTML) for m in pattern.finditer(body)]


def headings_text(markdown: str) -> str:
    """The document with code blocks blanked but headings' code spans kept (they are part
    of the anchor: `## Building: \\`tools build\\`` becomes building-tools-build)."""
    return FENCED.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), markdown)


def problems(document: Path, root: Path = ROOT) -> list[str]:
    found = []
    for target in links(document.read_text()):
        if SCHEME.match(target) or target.startswith("//"):
            found.append(f"{target}: leaves the repository (write it as text, not a link)")
            continue
        path_part, _, fragment = target.partition("#")
        if path_part.startswith("/"):
            found.append(f"{target}: an absolute path; link relative to {document.name}")
            continue
        resolved = (document.parent / unquote(path_part)).resolve() if path_part else document
        if not resolved.is_relative_to(root):
            found.append(f"{target}: leaves the repository")
        elif not resolved.exists():
            found.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md":
            names = anchors_of(resolved)
            if unquote(fragment) not in names:
                found.append(f"{target}: {resolved.name} has no heading #{fragment}")
    return found


def anchors_of(path: Path) -> set[str]:
    text = headings_text(path.read_text())
    seen: dict[str, int] = {}
    found = set()
    for line in text.splitlines():
        heading = re.match(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t#]*$", line)
        if heading is None:
            continue
        kept = [c for c in heading.group(1).lower() if c.isalnum() or c in "-_ "]
        slug = "".join(kept).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_link_resolves_inside_the_repository(document: Path) -> None:
    assert not problems(document), "\n".join(problems(document))


def test_the_docs_link_to_each_other() -> None:
    readme = links((ROOT / "README.md").read_text())
    for document in DOCUMENTS[1:]:
        assert f"docs/{document.name}" in readme, f"README.md does not link {document.name}"


def test_the_link_check_sees_what_is_wrong(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "CLI.md").write_text("# The CLI\n\n## Exit codes\n")
    page = docs / "page.md"
    page.write_text(
        "# A `code` heading: here\n\n## Twice\n\n## Twice\n\n"
        "[ok](CLI.md#exit-codes) [self](#a-code-heading-here) [again](#twice-1) "
        "[bad anchor](CLI.md#no-such-heading) [gone](NOPE.md) [out](../../elsewhere.md) "
        "[web](https://example.com) `[in code](NOPE.md)` <!-- [hidden](NOPE.md) -->\n\n"
        "```text\n[in a block](NOPE.md)\n```\n"
    )
    assert problems(page, root=tmp_path) == [
        "CLI.md#no-such-heading: CLI.md has no heading #no-such-heading",
        "NOPE.md: no such file",
        "../../elsewhere.md: leaves the repository",
        "https://example.com: leaves the repository (write it as text, not a link)",
    ]


TEST_NAME = re.compile(r"`(test_[a-z0-9_]+)`")
TEST_FILE = re.compile(r"`(tests/[A-Za-z0-9_/.]+\.py)`")


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_test_a_document_names_exists(document: Path) -> None:
    """THREAT_MODEL.md and the closing tables name the tests that defend each rule; a
    renamed or moved test must not leave the doc pointing at nothing."""
    text = document.read_text()
    defined = {
        match
        for path in (ROOT / "tests").rglob("test_*.py")
        for match in re.findall(r"def (test_[a-z0-9_]+)", path.read_text())
    }
    missing = sorted(set(TEST_NAME.findall(text)) - defined)
    missing += [p for p in sorted(set(TEST_FILE.findall(text))) if not (ROOT / p).is_file()]
    assert not missing, f"{document.name} names tests that do not exist: {missing}"
