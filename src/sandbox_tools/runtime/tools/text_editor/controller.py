"""text_editor: view, create, str_replace, insert and undo_edit on UTF-8 text files.

Undo history lives in the server's memory, per file and bounded: nothing is pickled
into a shared temporary directory where another user could read or replace it.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from sandbox_tools.runtime.child_env import resolve_user
from sandbox_tools.runtime.jsonrpc import ToolError
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


def numbered(text: str, first_line: int = 1) -> str:
    """`cat -n` style: right-aligned line number, a tab, the line."""
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return "".join(f"{number:6}\t{line}\n" for number, line in enumerate(lines, first_line))


def clip(text: str) -> str:
    if len(text) <= MAX_RESPONSE_CHARS:
        return text
    return text[:MAX_RESPONSE_CHARS] + TRUNCATION_NOTICE.format(limit=MAX_RESPONSE_CHARS)


def _lines(text: str) -> list[str]:
    return text.split("\n")


class TextEditorController:
    def __init__(self) -> None:
        # path -> previous contents, newest last; None means "did not exist".
        self._history: OrderedDict[str, deque[str | None]] = OrderedDict()

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
        found = await files.call("kind", path=path)
        if found == "missing":
            raise ToolError(f"the path {path} does not exist")
        if found == "directory":
            if params.view_range is not None:
                raise ToolError("view_range is only for files; the path is a directory")
            entries = await files.call("list_tree", path=path)
            listing = "\n".join([path, *entries])
            return clip(
                f"Here are the files and directories up to 2 levels deep in {path}, "
                f"excluding hidden items:\n{listing}\n"
            )
        text = await self._read_file(files, path, found)
        first = 1
        if params.view_range is not None:
            lines = _lines(text[:-1] if text.endswith("\n") else text)
            start, end = params.view_range
            if not 1 <= start <= len(lines):
                raise ToolError(
                    f"invalid view_range {list(params.view_range)}: the first line must be "
                    f"between 1 and {len(lines)}"
                )
            if end != -1 and not start <= end <= len(lines):
                raise ToolError(
                    f"invalid view_range {list(params.view_range)}: the last line must be "
                    f"between {start} and {len(lines)}, or -1 for the end of the file"
                )
            text = "\n".join(lines[start - 1 : None if end == -1 else end]) + "\n"
            first = start
        return clip(f"Here's the result of running `cat -n` on {path}:\n{numbered(text, first)}")

    async def _create(self, files: FileAccess, params: TextEditorParams) -> str:
        text = params.need("file_text")
        await files.call("write_text", path=params.path, text=text, create_only=True)
        self._remember(params.path, None)
        return f"File created successfully at: {params.path}"

    async def _str_replace(self, files: FileAccess, params: TextEditorParams) -> str:
        old = params.need("old_str")
        new = params.new_str or ""
        if old == "":
            raise ToolError("old_str must not be empty")
        text = await self._read_file(files, params.path)
        count = text.count(old)
        if count == 0:
            raise ToolError(
                f"no replacement was performed: old_str did not appear verbatim in {params.path}"
            )
        if count > 1:
            lines = sorted({text.count("\n", 0, index) + 1 for index in _occurrences(text, old)})
            raise ToolError(
                f"no replacement was performed: old_str appears {count} times in "
                f"{params.path} (lines {', '.join(map(str, lines))}); include more "
                "surrounding lines to make it unique"
            )
        updated = text.replace(old, new, 1)
        await files.call("write_text", path=params.path, text=updated)
        self._remember(params.path, text)
        edit_line = text.count("\n", 0, text.index(old)) + 1
        return self._edited(params.path, updated, edit_line, new.count("\n") + 1)

    async def _insert(self, files: FileAccess, params: TextEditorParams) -> str:
        if params.insert_line is None:
            params.need("insert_line")
        new = params.need("new_str")
        text = await self._read_file(files, params.path)
        lines = _lines(text)
        trailing_newline = text.endswith("\n")
        if trailing_newline:
            lines.pop()
        at = params.insert_line
        assert at is not None
        if not 0 <= at <= len(lines):
            raise ToolError(
                f"invalid insert_line {at}: it must be between 0 and {len(lines)} "
                "(the new text goes after that line; 0 inserts at the top)"
            )
        inserted = _lines(new[:-1] if new.endswith("\n") else new)
        updated_lines = lines[:at] + inserted + lines[at:]
        updated = "\n".join(updated_lines) + ("\n" if trailing_newline or not lines else "")
        await files.call("write_text", path=params.path, text=updated)
        self._remember(params.path, text)
        return self._edited(params.path, updated, at + 1, len(inserted))

    async def _undo(self, files: FileAccess, params: TextEditorParams) -> str:
        history = self._history.get(params.path)
        if not history:
            raise ToolError(f"no edit to undo for {params.path}")
        previous = history.pop()
        if not history:
            del self._history[params.path]
        if previous is None:
            await files.call("remove", path=params.path)
            return f"Last edit to {params.path} undone: the file it created was removed."
        await files.call("write_text", path=params.path, text=previous)
        return f"Last edit to {params.path} undone successfully.\n" + clip(
            f"Here's the result of running `cat -n` on {params.path}:\n{numbered(previous)}"
        )

    # -- helpers -------------------------------------------------------------------------

    @staticmethod
    async def _read_file(files: FileAccess, path: str, found: str | None = None) -> str:
        found = found or await files.call("kind", path=path)
        if found == "missing":
            raise ToolError(f"the path {path} does not exist")
        if found == "directory":
            raise ToolError(f"the path {path} is a directory; this command needs a file")
        if found != "file":
            raise ToolError(f"the path {path} is not a regular file")
        text: str = await files.call("read_text", path=path)
        return text

    def _remember(self, path: str, previous: str | None) -> None:
        history = self._history.pop(path, None) or deque(maxlen=HISTORY_PER_FILE)
        history.append(previous)
        self._history[path] = history
        while len(self._history) > HISTORY_FILES:
            self._history.popitem(last=False)

    @staticmethod
    def _edited(path: str, text: str, first_changed: int, changed_lines: int) -> str:
        lines = _lines(text[:-1] if text.endswith("\n") else text)
        start = max(1, first_changed - SNIPPET_CONTEXT_LINES)
        end = min(len(lines), first_changed + changed_lines - 1 + SNIPPET_CONTEXT_LINES)
        snippet = numbered("\n".join(lines[start - 1 : end]) + "\n", start)
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
