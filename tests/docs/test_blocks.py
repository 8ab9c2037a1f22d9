"""Docs are code: every shell and Python block of README.md and docs/*.md is run here, or
marked illustrative, or names the test that runs it as written (the markers:
tests/docs/blocks.py).

- `test_block`: one test per shell, Python or unlabelled fenced block, as Sybil reads
  them. `doctest` blocks run: Python in this process, in a fresh namespace, with the
  document's line numbers in tracebacks; shell with bash in a scratch directory, this
  venv's `tools` and `python` first on PATH, within SHELL_TIMEOUT. `run by` blocks: the
  named test exists and holds the key line. `illustrative` blocks pass as they are; an
  unmarked block fails.
- Every Python block, run or not, compiles (top-level `await` allowed, as in an async
  REPL), its imports exist and every name it uses is imported or assigned in it.
- Every `tools` command in a shell block names real subcommands and options, every
  `bash FILE` an existing file, every `python -m MODULE` an importable module.
- Every `[tool.sandbox-tools]` table in the docs loads.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import os
import shlex
import subprocess
import symtable
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sybil import Example
from sybil.evaluators.python import pad

from sandbox_tools.settings import load_settings
from tests.docs.blocks import DOCUMENTS, MARKER_HELP, ROOT, Block, code_blocks, parse

SHELL_TIMEOUT = 60  # seconds; a doctest block must be cheap
VENV_BIN = Path(sys.executable).parent  # this venv's bin/, where `tools` is


def run_shell(block: Block) -> None:
    """Run a shell block with bash (-e, -u, pipefail) in a scratch directory; a runtime
    server it started is stopped afterwards."""
    with tempfile.TemporaryDirectory(prefix="doc-block-") as scratch:
        env = {
            **os.environ,
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "TMPDIR": scratch,
            "SANDBOX_TOOLS_DIR": str(Path(scratch, "runtime")),
            "COLUMNS": "100",
        }
        script = "\n".join(block.commands())
        try:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", script],
                cwd=scratch,
                env=env,
                capture_output=True,
                text=True,
                timeout=SHELL_TIMEOUT,
            )
        finally:
            subprocess.run(
                [sys.executable, "-m", "sandbox_tools.runtime", "stop-server"],
                env=env,
                capture_output=True,
                timeout=30,
            )
        assert done.returncode == 0, (
            f"{block.where}: exit {done.returncode}\n"
            f"stdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-2000:]}"
        )


def run_python(block: Block) -> None:
    """Run a Python block in a fresh namespace (each block stands alone, as a reader
    copies it), its line numbers those of the document."""
    code = compile(pad(block.source, block.line), str(block.document), "exec", dont_inherit=True)
    exec(code, {"__name__": "__doc_block__"})


def evaluate(example: Example) -> None:
    """What running a block means, by its marker."""
    block: Block = example.parsed
    if block.kind == "unlabelled":
        raise AssertionError(
            f"{block.where}: a fence without a language; label it (```text for output)"
        )
    if block.kind is None:
        return  # output and data: nothing to run
    if block.marker == "":
        raise AssertionError(f"{block.where}: an unmarked {block.language} block; {MARKER_HELP}")
    if block.marker == "illustrative":
        return
    if block.marker == "run by":
        test_file = ROOT / block.test_file
        assert test_file.is_file(), f"{block.where}: {block.test_file} does not exist"
        assert block.key in block.source, f"{block.where}: the block does not hold {block.key!r}"
        assert block.key in test_file.read_text(), f"{block.test_file} does not hold {block.key!r}"
        return
    if block.kind == "python":
        run_python(block)
    else:
        run_shell(block)


def _name(block: Block) -> str:
    return f"{block.where} {block.language or '?'} {block.marker or 'UNMARKED'}"


EXAMPLES = {  # output and data blocks (text, json, toml...) have nothing to run
    _name(example.parsed): example
    for path in DOCUMENTS
    for example in parse(path, evaluate).examples()
    if example.parsed.kind is not None
}
ALL = [example.parsed for example in EXAMPLES.values()]
PYTHON = [block for block in ALL if block.kind == "python"]
SHELL = [block for block in ALL if block.kind == "shell"]


def test_the_docs_have_blocks_of_every_kind() -> None:
    markers = {block.marker for block in PYTHON + SHELL}
    assert markers == {"doctest", "illustrative", "run by"}, markers
    assert len(PYTHON) >= 8 and len(SHELL) >= 8


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_block(name: str) -> None:
    EXAMPLES[name].evaluate()


def test_an_unmarked_block_fails_and_markers_are_read(tmp_path: Path) -> None:
    """The rule holds for new blocks: one without a marker fails, whatever its language."""
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n<!-- doctest -->\n```python\nassert 1 + 1 == 2\n```\n\n"
        "<!-- illustrative: needs a GPU -->\n```bash\nnvidia-smi\n```\n\n"
        '<!-- run by: tests/journeys/test_git_install.py "async with Injector()" -->\n'
        "```python\nasync with Injector() as injector: ...\n```\n\n"
        "```sh\necho unmarked\n```\n\n"
        "<!-- doctest -->\n\n```python\nprint('a blank line parts it from its marker')\n```\n\n"
        "```\nno language\n```\n\n```text\noutput\n```\n"
    )
    examples = list(parse(page, evaluate).examples())
    found = [(e.parsed.language, e.parsed.marker) for e in examples]
    assert found == [
        ("python", "doctest"),
        ("bash", "illustrative"),
        ("python", "run by"),
        ("sh", ""),
        ("python", ""),
        ("", ""),
        ("text", ""),
    ]
    for example in examples[:3] + examples[6:]:
        example.evaluate()
    for example in examples[3:6]:
        with pytest.raises(AssertionError, match=r"unmarked|without a language"):
            example.evaluate()


# -- Python blocks, run or not: they compile, their imports exist, their names are defined --


def _python_id(block: Block) -> str:
    return block.where


# Modules the docs have the reader save from another block ("Save it as browse.py"):
# module -> a line of the block that is that file.
SAVED_BLOCKS = {"browse": "def browse(image"}


@pytest.mark.parametrize("block", PYTHON, ids=_python_id)
def test_python_compiles_and_its_imports_exist(block: Block) -> None:
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(block.source, block.where, "exec", flags=flags)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in SAVED_BLOCKS:
            (saved,) = [b for b in PYTHON if SAVED_BLOCKS[node.module] in b.source]
            for alias in node.names:
                assert f"def {alias.name}(" in saved.source, f"{block.where}: no {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}"
                ), f"{block.where}: {node.module} has no {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)


@pytest.mark.parametrize("block", PYTHON, ids=_python_id)
def test_python_uses_no_undefined_names(block: Block) -> None:
    wrapped = "async def block():\n" + textwrap.indent(block.source, "    ") + "\n    pass\n"
    (function,) = symtable.symtable(wrapped, block.where, "exec").get_children()
    undefined = [
        symbol.get_name()
        for symbol in function.get_symbols()
        if symbol.is_global()
        and symbol.is_referenced()
        and not hasattr(builtins, symbol.get_name())
    ]
    assert not undefined, f"{block.where} uses undefined names: {undefined}"


# -- shell blocks, run or not: the commands they name exist ------------------------------


def _cli() -> Any:
    import typer.main

    from sandbox_tools.cli.app import app

    return typer.main.get_command(app)


def _options(command: Any) -> set[str]:
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)}


def _tools_problems(words: list[str]) -> Iterator[str]:
    """What is wrong with one `tools ...` command line: unknown commands or options."""
    command = _cli()
    for word in words:
        if word.startswith("-"):
            option = word.split("=", 1)[0]
            if option not in _options(command) | {"--help"}:
                yield f"`{command.name}` has no option {option}"
        elif hasattr(command, "commands") and command.commands.get(word) is not None:
            command = command.commands[word]
        elif hasattr(command, "commands"):
            yield f"`{command.name}` has no command {word!r}"
            return


def _command_problems(line: str) -> Iterator[str]:
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return  # shell syntax beyond a simple command (it is only read, not run)
    while words and "=" in words[0] and not words[0].startswith("-"):
        words = words[1:]  # VAR=value prefixes
    if not words:
        return
    program = Path(words[0]).name
    if program in ("tools", "sandbox-tools"):
        yield from _tools_problems(words[1:])
    elif program == "bash" and len(words) > 1 and not words[1].startswith("-"):
        if not (ROOT / words[1]).is_file():
            yield f"bash {words[1]}: no such file in the repository"
    elif program.startswith("python") and words[1:2] == ["-m"] and len(words) > 2:
        module = words[2]
        if importlib.util.find_spec(module) is None:
            yield f"python -m {module}: no such module"


@pytest.mark.parametrize("block", SHELL, ids=lambda block: block.where)
def test_shell_commands_name_real_commands_files_and_modules(block: Block) -> None:
    problems = [problem for line in block.commands() for problem in _command_problems(line)]
    assert not problems, f"{block.where}: " + "; ".join(problems)


def test_the_command_check_catches_a_renamed_option() -> None:
    assert list(_command_problems("tools build --all --out dist/  # fine")) == []
    assert list(_command_problems("tools build --everything")) == [
        "`build` has no option --everything"
    ]
    assert list(_command_problems("tools manifest publish")) == [
        "`manifest` has no command 'publish'"
    ]
    assert list(_command_problems("bash scripts/nope.sh")) != []


# -- settings tables in the docs load ----------------------------------------------------


@pytest.mark.parametrize(
    "block",
    [b for b in code_blocks() if b.language == "toml" and "[tool.sandbox-tools]" in b.source],
    ids=lambda block: block.where,
)
def test_settings_tables_in_the_docs_load(block: Block, tmp_path: Path) -> None:
    project = tmp_path / "pyproject.toml"
    project.write_text(block.source)
    load_settings({}, pyproject=project)  # an unknown key or a bad value raises
