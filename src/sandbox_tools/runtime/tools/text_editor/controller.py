"""text_editor: view, create, str_replace, insert and undo_edit on UTF-8 text files.

Undo history lives in the server's memory, per file and bounded: nothing is pickled
into a shared temporary directory where another user could read or replace it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass

from sandbox_tools.runtime.identity import resolve_user
from sandbox_tools.runtime.jsonrpc import ToolError
from sandbox_tools.runtime.limits import DEFAULT_LIMITS, Limits
from sandbox_tools.runtime.tools.text_editor.file_ops import (
    DirectFileAccess,
    FileAccess,
    UserFileAccess,
)
from sandbox_tools.runtime.tools.text_editor.tool_types import TextEditorParams

MAX_RESPONSE_CHARS = 16_000
SNIPPET_CONTEXT_LINES = 4
HISTORY_PER_FILE = 10
HISTORY_FILES = 256
TRUNCATION_NOTICE = (
    "\n[sandbox-tools: output truncated to {limit} characters; view a smaller range "
    "(view_range) or search the file with a command to see the rest]\n"
)


def _body(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def _iter_lines(body: str, start: int = 0) -> Iterator[str]:
    """The lines of `body` from offset `start`, one at a time: a file of millions of
    empty lines must not become millions of objects at once (it took the server to
    1.8 GB)."""
    while True:
        end = body.find("\n", start)
        if end < 0:
            yield body[start:]
            return
        yield body[start:end]
        start = end + 1


def _line_offset(body: str, line: int) -> int:
    """Offset where 1-based `line` starts (len(body) + 1 past the last line).

    Newlines are counted a block at a time (str.count runs in C) and only the last block
    is walked line by line: finding line 6,000,000 took a second of the event loop when
    it was walked from the top, and every other client waited.
    """
    wanted = line - 1  # newlines before the line
    offset = 0
    block = 1 << 16
    while wanted > 0:
        if offset >= len(body):
            return len(body) + 1
        in_block = body.count("\n", offset, offset + block)
        if in_block < wanted:
            wanted -= in_block
            offset += block
            continue
        while wanted > 0:
            offset = body.find("\n", offset) + 1
            wanted -= 1
    return offset


def numbered(text: str, first_line: int = 1, last_line: int | None = None) -> str:
    """`cat -n` style: right-aligned line number, a tab, the line. Formatting stops once
    the response would be clipped anyway."""
    body = _body(text)
    out: list[str] = []
    size = 0
    start = _line_offset(body, first_line) if first_line > 1 else 0
    for number, line in enumerate(_iter_lines(body, start), first_line):
        if last_line is not None and number > last_line:
            break
        out.append(f"{number:6}\t{line}\n")
        size += len(out[-1])
        if size > MAX_RESPONSE_CHARS:
            break
    return "".join(out)


def clip(text: str) -> str:
    if len(text) <= MAX_RESPONSE_CHARS:
        return text
    return text[:MAX_RESPONSE_CHARS] + TRUNCATION_NOTICE.format(limit=MAX_RESPONSE_CHARS)


def _digest(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class _Edit:
    previous: str | None  # the contents before the edit; None: the edit created the file
    written: str | None  # digest of what the edit wrote: undo refuses if the file differs


class TextEditorController:
    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits  # read once by the server (Limits.from_environ)
        # path -> previous contents, newest last; None means "did not exist".
        self._history: OrderedDict[str, deque[_Edit]] = OrderedDict()

    async def run(self, params: TextEditorParams) -> str:
        if not params.path.startswith("/"):
            raise ToolError(
                f"the path {params.path!r} is not absolute; give the full path starting with /"
            )
        identity = resolve_user(params.user)
        files: FileAccess = (
            UserFileAccess(identity) if identity.uid is not None else DirectFileAccess()
        )
        if params.command == "view":
            return await self._view(files, params)
        if params.command == "create":
            return await self._create(files, params)
        if params.command == "str_replace":
            return await self._str_replace(files, params)
        if params.command == "insert":
            return await self._insert(files, params)
        return await self._undo(files, params)

    # -- commands ------------------------------------------------------------------------

    async def _view(self, files: FileAccess, params: TextEditorParams) -> str:
        path = params.path
        found = await files.kind(path=path)
        if found == "missing":
            raise ToolError(f"the path {path} does not exist")
        if found == "directory":
            if params.view_range is not None:
                raise ToolError("view_range is only for files; the path is a directory")
            entries = await files.list_tree(path=path)
            listing = "\n".join([path, *entries])
            return clip(
                f"Here are the files and directories up to 2 levels deep in {path}, "
                f"excluding hidden items:\n{listing}\n"
            )
        text = await self._read_file(files, path, found)
        first, last = 1, None
        if params.view_range is not None:
            count = _body(text).count("\n") + 1
            start, end = params.view_range
            if not 1 <= start <= count:
                raise ToolError(
                    f"invalid view_range {list(params.view_range)}: the first line must be "
                    f"between 1 and {count}"
                )
            if end != -1 and not start <= end <= count:
                raise ToolError(
                    f"invalid view_range {list(params.view_range)}: the last line must be "
                    f"between {start} and {count}, or -1 for the end of the file"
                )
            first, last = start, None if end == -1 else end
        return clip(
            f"Here's the result of running `cat -n` on {path}:\n{numbered(text, first, last)}"
        )

    async def _create(self, files: FileAccess, params: TextEditorParams) -> str:
        text = params.need("file_text")
        await files.write_text(path=params.path, text=text, create_only=True)
        self._remember(params.path, None, text)
        return f"File created successfully at: {params.path}"

    async def _str_replace(self, files: FileAccess, params: TextEditorParams) -> str:
        old = params.need("old_str")
        new = params.new_str or ""
        if old == "":
            raise ToolError("old_str must not be empty")
        text = await self._read_file(files, params.path)
        count = text.count(old)
        if count == 0:
            # Quoted back (cut), as inspect's editor does: a model sees what it sent.
            shown = old if len(old) <= 200 else old[:200] + "..."
            raise ToolError(
                f"no replacement was performed: old_str `{shown}` did not appear verbatim "
                f"in {params.path}"
            )
        if count > 1:
            lines = sorted({text.count("\n", 0, index) + 1 for index in _occurrences(text, old)})
            raise ToolError(
                f"no replacement was performed: old_str appears {count} times in "
                f"{params.path} (lines {', '.join(map(str, lines))}); include more "
                "surrounding lines to make it unique"
            )
        updated = text.replace(old, new, 1)
        await files.write_text(path=params.path, text=updated)
        self._remember(params.path, text, updated)
        edit_line = text.count("\n", 0, text.index(old)) + 1
        return self._edited(params.path, updated, edit_line, new.count("\n") + 1)

    async def _insert(self, files: FileAccess, params: TextEditorParams) -> str:
        if params.insert_line is None:
            params.need("insert_line")
        new = params.need("new_str")
        text = await self._read_file(files, params.path)
        body = _body(text)
        count = body.count("\n") + 1
        at = params.insert_line
        assert at is not None
        if not 0 <= at <= count:
            raise ToolError(
                f"invalid insert_line {at}: it must be between 0 and {count} "
                "(the new text goes after that line; 0 inserts at the top)"
            )
        inserted = _body(new)
        if at == 0:
            updated = f"{inserted}\n{body}"
        elif at == count:
            updated = f"{body}\n{inserted}"
        else:
            offset = _line_offset(body, at + 1)
            updated = f"{body[:offset]}{inserted}\n{body[offset:]}"
        if text.endswith("\n"):
            updated += "\n"
        await files.write_text(path=params.path, text=updated)
        self._remember(params.path, text, updated)
        return self._edited(params.path, updated, at + 1, inserted.count("\n") + 1)

    async def _undo(self, files: FileAccess, params: TextEditorParams) -> str:
        history = self._history.get(params.path)
        if not history:
            raise ToolError(f"no edit to undo for {params.path}")
        edit = history[-1]
        found = await files.kind(path=params.path)
        current = None if found == "missing" else await self._read_file(files, params.path, found)
        if _digest(current) != edit.written:
            raise ToolError(
                f"{params.path} has changed since the last edit (by a command or another "
                "program); undo would discard that change, so nothing was undone"
            )
        history.pop()
        if not history:
            del self._history[params.path]
        if edit.previous is None:
            await files.remove(path=params.path)
            return f"Last edit to {params.path} undone: the file it created was removed."
        await files.write_text(path=params.path, text=edit.previous)
        return f"Last edit to {params.path} undone successfully.\n" + clip(
            f"Here's the result of running `cat -n` on {params.path}:\n{numbered(edit.previous)}"
        )

    # -- helpers -------------------------------------------------------------------------

    async def _read_file(self, files: FileAccess, path: str, found: str | None = None) -> str:
        found = found or await files.kind(path=path)
        if found == "missing":
            raise ToolError(f"the path {path} does not exist")
        if found == "directory":
            raise ToolError(f"the path {path} is a directory; this command needs a file")
        if found != "file":
            raise ToolError(f"the path {path} is not a regular file")
        text: str = await files.read_text(path, self.limits.text_editor_max_bytes)
        return text

    def _remember(self, path: str, previous: str | None, written: str) -> None:
        history = self._history.pop(path, None) or deque(maxlen=HISTORY_PER_FILE)
        history.append(_Edit(previous, _digest(written)))
        self._history[path] = history
        while len(self._history) > HISTORY_FILES:
            self._history.popitem(last=False)

    @staticmethod
    def _edited(path: str, text: str, first_changed: int, changed_lines: int) -> str:
        count = _body(text).count("\n") + 1
        start = max(1, first_changed - SNIPPET_CONTEXT_LINES)
        end = min(count, first_changed + changed_lines - 1 + SNIPPET_CONTEXT_LINES)
        snippet = numbered(text, start, end)
        return clip(
            f"The file {path} has been edited. Here's the result of running `cat -n` on a "
            f"snippet of {path}:\n{snippet}"
            "Review the changes and make sure they are as expected. Edit the file again if "
            "necessary."
        )


def _occurrences(text: str, needle: str) -> list[int]:
    found, start = [], text.find(needle)
    while start >= 0:
        found.append(start)
        start = text.find(needle, start + 1)
    return found
