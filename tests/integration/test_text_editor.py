"""text_editor against a real runtime server: every command and every error class."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_tools.errors import RuntimeRpcError, ToolError
from sandbox_tools.injector.jsonrpc_client import RuntimeClient
from sandbox_tools.injector.tool_clients import text_editor


async def test_create_view_and_view_range(client: RuntimeClient, tmp_path: Path) -> None:
    path = str(tmp_path / "new" / "notes.txt")  # parents are created
    assert await text_editor(client, "create", path, file_text="alpha\nbeta\ngamma\n") == (
        f"File created successfully at: {path}"
    )
    assert Path(path).read_text() == "alpha\nbeta\ngamma\n"
    view = await text_editor(client, "view", path)
    assert view == (
        f"Here's the result of running `cat -n` on {path}:\n"
        "     1\talpha\n     2\tbeta\n     3\tgamma\n"
    )
    ranged = await text_editor(client, "view", path, view_range=(2, -1))
    assert ranged.endswith("     2\tbeta\n     3\tgamma\n")
    assert "alpha" not in ranged


async def test_directory_listing_two_levels_without_hidden(
    client: RuntimeClient, tmp_path: Path
) -> None:
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "too-deep.txt").write_text("x")
    (tmp_path / "a" / "file.txt").write_text("x")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "secret").write_text("x")
    listing = await text_editor(client, "view", str(tmp_path))
    lines = listing.splitlines()
    assert "up to 2 levels deep" in lines[0]
    assert lines[1:] == [
        str(tmp_path),
        str(tmp_path / "a"),
        str(tmp_path / "a" / "b"),
        str(tmp_path / "a" / "file.txt"),
    ]


async def test_str_replace_insert_and_undo(client: RuntimeClient, tmp_path: Path) -> None:
    path = tmp_path / "code.py"
    path.write_text("def f():\n    return 1\n")
    edited = await text_editor(
        client, "str_replace", str(path), old_str="return 1", new_str="return 2"
    )
    assert "has been edited" in edited and "     2\t    return 2" in edited
    assert path.read_text() == "def f():\n    return 2\n"

    inserted = await text_editor(client, "insert", str(path), insert_line=0, new_str="import os\n")
    assert "     1\timport os" in inserted
    assert path.read_text() == "import os\ndef f():\n    return 2\n"

    await text_editor(client, "undo_edit", str(path))
    assert path.read_text() == "def f():\n    return 2\n"
    await text_editor(client, "undo_edit", str(path))
    assert path.read_text() == "def f():\n    return 1\n"
    with pytest.raises(ToolError, match="no edit to undo"):
        await text_editor(client, "undo_edit", str(path))


async def test_undo_of_create_removes_the_file(client: RuntimeClient, tmp_path: Path) -> None:
    path = tmp_path / "made.txt"
    await text_editor(client, "create", str(path), file_text="x")
    await text_editor(client, "undo_edit", str(path))
    assert not path.exists()


async def test_str_replace_needs_exactly_one_match(client: RuntimeClient, tmp_path: Path) -> None:
    path = tmp_path / "dup.txt"
    path.write_text("x = 1\ny = 2\nx = 1\n")
    with pytest.raises(ToolError, match=r"appears 2 times .* \(lines 1, 3\)") as many:
        await text_editor(client, "str_replace", str(path), old_str="x = 1", new_str="x = 3")
    assert many.value.code == -32099
    with pytest.raises(ToolError, match="did not appear verbatim"):
        await text_editor(client, "str_replace", str(path), old_str="z = 9", new_str="")
    assert path.read_text() == "x = 1\ny = 2\nx = 1\n"  # untouched


@pytest.mark.parametrize(
    ("command", "path_suffix", "prepare", "message"),
    [
        ("view", "missing.txt", None, "does not exist"),
        ("str_replace", "missing.txt", None, "does not exist"),
        ("insert", "missing.txt", None, "does not exist"),
        ("str_replace", "adir", "dir", "is a directory"),
        ("insert", "adir", "dir", "is a directory"),
        ("view", "blob.bin", "binary", "binary file"),
        ("str_replace", "latin1.txt", "latin1", "not UTF-8"),
        ("create", "exists.txt", "file", "already exists"),
        ("view", "x" * 300, None, "too long"),
        ("create", "x" * 300, None, "too long"),
    ],
)
async def test_error_classes(
    client: RuntimeClient,
    tmp_path: Path,
    command: str,
    path_suffix: str,
    prepare: str | None,
    message: str,
) -> None:
    path = tmp_path / path_suffix
    if prepare == "dir":
        path.mkdir()
    elif prepare == "binary":
        path.write_bytes(b"\x7fELF\x00\x01\x02")
    elif prepare == "latin1":
        path.write_bytes("caf\xe9".encode("latin-1"))
    elif prepare == "file":
        path.write_text("keep me")
    with pytest.raises(ToolError, match=message) as raised:
        await text_editor(
            client,
            command,  # type: ignore[arg-type]
            str(path),
            old_str="a",
            new_str="b",
            insert_line=0,
            file_text="new",
        )
    assert raised.value.code == -32099
    if prepare == "file":
        assert path.read_text() == "keep me"


async def test_relative_path_and_bad_arguments(client: RuntimeClient, tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="not absolute"):
        await text_editor(client, "view", "relative/path.txt")
    path = tmp_path / "f.txt"
    path.write_text("one\ntwo\n")
    with pytest.raises(ToolError, match="invalid view_range"):
        await text_editor(client, "view", str(path), view_range=(5, 9))
    with pytest.raises(ToolError, match="invalid insert_line 7"):
        await text_editor(client, "insert", str(path), insert_line=7, new_str="x")
    with pytest.raises(RuntimeRpcError, match='"file_text" is required') as missing:
        await text_editor(client, "create", str(tmp_path / "g.txt"))
    assert missing.value.code == -32602
    with pytest.raises(RuntimeRpcError, match='"command" must be one of'):
        await client.call("text_editor", {"command": "delete", "path": str(path)})


@pytest.mark.parametrize(
    "name",
    [
        "$(touch /tmp/pwned-te)",
        "; rm -rf /tmp/pwned-dir ;",
        "`touch /tmp/pwned-te`",
        "a' && touch /tmp/pwned-te '",
    ],
)
async def test_shell_metacharacters_in_paths_are_literal(
    client: RuntimeClient, tmp_path: Path, name: str
) -> None:
    sentinel_dir = Path("/tmp/pwned-dir")
    sentinel_dir.mkdir(exist_ok=True)
    Path("/tmp/pwned-te").unlink(missing_ok=True)
    path = tmp_path / name
    await text_editor(client, "create", str(path), file_text="hello\n")
    await text_editor(client, "str_replace", str(path), old_str="hello", new_str="bye")
    await text_editor(client, "view", str(path))
    await text_editor(client, "undo_edit", str(path))
    assert path.read_text() == "hello\n"
    created = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert created == [name]  # exactly the literal path (a "/" in it makes directories)
    assert not Path("/tmp/pwned-te").exists()
    assert sentinel_dir.exists()
    sentinel_dir.rmdir()
