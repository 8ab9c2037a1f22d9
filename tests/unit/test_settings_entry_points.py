"""Settings are read at entry points only (docs/ARCHITECTURE.md, "Layout"): the `cli` and
`inspect` layers, a script's `main`, and the library entry points that page lists, each of
which reads them only for a value its caller did not pass. Below those, a setting travels
as a value: a module that looked one up would make a setting the caller passed lose to
the environment, silently."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.docs.blocks import ROOT

PACKAGE = ROOT / "src" / "sandbox_tools"
ENTRY_LAYERS = ("cli", "inspect")
READS = {"load_settings", "from_cascade"}


def documented_entry_points() -> set[str]:
    """`module.py: name, Class.name` lines of ARCHITECTURE.md's library entry points."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("Library entry points that read the settings", 1)[1].split("\n\n", 2)[1]
    points = set()
    for line in section.splitlines():
        found = re.fullmatch(r"- `([\w/]+\.py)`: (.+)", line.strip())
        assert found, f"ARCHITECTURE.md: not an entry point line: {line!r}"
        for name in found.group(2).split(","):
            points.add(f"{found.group(1)}:{name.strip().strip('`')}")
    return points


def settings_reads(path: Path) -> list[tuple[str, int]]:
    """Each call that reads the settings in `path`, named by its enclosing function."""
    reads: list[tuple[str, int]] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, [*scope, child.name])
                continue
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in READS:
                    reads.append((".".join(scope) or "<module>", child.lineno))
            visit(child, scope)

    visit(ast.parse(path.read_text()), [])
    return reads


def test_settings_are_read_at_entry_points_only() -> None:
    allowed = documented_entry_points()
    found = set()
    misplaced = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module.split("/")[0] in ENTRY_LAYERS or module == "settings.py":
            continue
        for function, line in settings_reads(path):
            where = f"{module}:{function}"
            if function.split(".")[-1] == "main" or where in allowed:
                found.add(where)
                continue
            misplaced.append(f"{module}:{line} in {function}")
    assert not misplaced, (
        "settings read below the entry points; take the value as a parameter from the "
        f"entry point instead: {misplaced}"
    )
    # The list names real entry points, not ones that were removed.
    assert allowed <= found, (
        f"ARCHITECTURE.md lists entry points that read nothing: {allowed - found}"
    )


def test_a_read_below_an_entry_point_is_found(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "class C:\n    def f(self):\n        return load_settings().x\n"
        "def g():\n    return RootfsStore.from_cascade()\n"
    )
    assert settings_reads(module) == [("C.f", 3), ("g", 5)]
