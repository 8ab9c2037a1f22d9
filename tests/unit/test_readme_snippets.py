"""README's Python examples (issue 18: they did not run as written): each block compiles
(top-level await allowed, as in an async REPL), every name it imports exists, and every
name it uses is imported or assigned in the block (or a builtin)."""

from __future__ import annotations

import ast
import builtins
import importlib
import re
import symtable
import textwrap
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_compiles_and_its_imports_exist(index: int) -> None:
    source = BLOCKS[index]
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(source, f"README block {index}", "exec", flags=flags)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}"
                ), f"README block {index}: {node.module} has no {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_uses_no_undefined_names(index: int) -> None:
    wrapped = "async def block():\n" + textwrap.indent(BLOCKS[index], "    ") + "\n    pass\n"
    (function,) = symtable.symtable(wrapped, "README", "exec").get_children()
    undefined = [
        symbol.get_name()
        for symbol in function.get_symbols()
        if symbol.is_global()
        and symbol.is_referenced()
        and not hasattr(builtins, symbol.get_name())
    ]
    assert not undefined, f"README block {index} uses undefined names: {undefined}"
