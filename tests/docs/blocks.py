"""The code blocks of README.md and docs/*.md, read with Sybil, each with what its marker
says about how it is checked.

Every ```python, ```bash, ```sh, ```shell and ```console block carries, on the line right
before its opening fence, one of these HTML comments (GitHub does not show them):

    <!-- doctest -->                                run here (tests/docs/test_blocks.py);
                                                    it must finish in seconds
    <!-- illustrative: WHY IT CANNOT RUN HERE -->  not run (Python is still compiled and
                                                    its imports and names checked)
    <!-- run by: TEST_FILE "KEY LINE" -->           run as written by TEST_FILE, which
                                                    must exist and contain KEY LINE, as
                                                    the block must

A block with none of them fails its test, as does a fence without a language (output
goes in ```text). Other languages (text, json, toml, yaml) need no marker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sybil import Document, Region, Sybil
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer
from sybil.typing import Evaluator

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# The languages whose blocks must be run or marked, and how each is run.
LANGUAGES = {
    "python": "python",
    "py": "python",
    "bash": "shell",
    "sh": "shell",
    "shell": "shell",
    "console": "shell",
}
MARKER = re.compile(
    r"<!--\s*(?:(?P<doctest>doctest)"
    r"|illustrative:\s*(?P<reason>\S.*?)"
    r'|run by:\s*(?P<test_file>\S+)\s+"(?P<key>[^"]+)")\s*-->'
)
KINDS = {"doctest": "doctest", "illustrative": "reason", "run by": "test_file"}  # kind: group
MARKER_HELP = (
    'put one of <!-- doctest -->, <!-- illustrative: WHY -->, <!-- run by: TEST_FILE "KEY LINE" -->'
    " on the line right before the fence"
)


@dataclass(frozen=True)
class Block:
    """One fenced code block and what its marker says."""

    document: Path
    line: int  # of the opening fence, 1-based
    language: str  # the fence's info string, as written
    source: str
    marker: str  # "doctest", "illustrative", "run by", or "" when it has none
    reason: str = ""  # illustrative: why it is not run
    test_file: str = ""  # run by: the test that runs it
    key: str = ""  # run by: the line that test and the block share

    @property
    def kind(self) -> str | None:
        """How a block of this language runs: "python" or "shell"; None for output and
        data (text, json, toml...); "unlabelled" for a fence without a language."""
        return LANGUAGES.get(self.language.split()[0]) if self.language else "unlabelled"

    @property
    def where(self) -> str:
        inside = self.document.is_relative_to(ROOT)
        return f"{self.document.relative_to(ROOT) if inside else self.document}:{self.line}"

    def commands(self) -> list[str]:
        """A shell block's commands: a console block's `$ ` lines, else every line
        (continuation lines joined)."""
        lines = self.source.replace("\\\n", " ").splitlines()
        if self.language.split()[0] == "console":
            return [line[2:] for line in lines if line.startswith("$ ")]
        return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _line_before(text: str, start: int) -> str:
    """The line right before the one at `start` (which begins a fence)."""
    head = text[:start].rstrip(" \t")
    if not head.endswith("\n"):
        return ""
    return head[:-1].rsplit("\n", 1)[-1].strip()


class MarkedCodeBlockParser:
    """A Sybil parser: every fenced block becomes a region whose `parsed` is its `Block`;
    the evaluator (given by the test module) decides what running it means."""

    def __init__(self, evaluator: Evaluator | None = None) -> None:
        self.lexer = RawFencedCodeBlockLexer(
            info_pattern=re.compile(r"(?P<language>[^\n]*?)[ \t]*$\n", re.MULTILINE),
            mapping={"language": "language", "source": "source"},
        )
        self.evaluator = evaluator

    def __call__(self, document: Document) -> list[Region]:
        regions = []
        for region in self.lexer(document):
            language = str(region.lexemes["language"]).strip()
            found = MARKER.fullmatch(_line_before(document.text, region.start))
            marker = ""
            if found:
                marker = next(kind for kind in KINDS if found[KINDS[kind]])
            region.parsed = Block(
                document=Path(document.path),
                line=document.text.count("\n", 0, region.start) + 1,
                language=language,
                source=region.lexemes["source"],
                marker=marker,
                reason=(found and found["reason"]) or "",
                test_file=(found and found["test_file"]) or "",
                key=(found and found["key"]) or "",
            )
            region.evaluator = self.evaluator
            regions.append(region)
        return regions


def parse(path: Path, evaluator: Evaluator | None = None) -> Document:
    """`path` read by Sybil with the marked-block parser."""
    return Sybil([MarkedCodeBlockParser(evaluator)]).parse(path)


def code_blocks(documents: list[Path] = DOCUMENTS) -> list[Block]:
    return [example.parsed for path in documents for example in parse(path).examples()]


# The Python examples' sources, in document order (tests/journeys/test_git_install.py
# picks the injection snippet from these and runs it from a fresh venv).
BLOCKS = [block.source for block in code_blocks() if block.kind == "python"]
