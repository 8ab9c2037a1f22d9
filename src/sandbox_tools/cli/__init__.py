"""The `tools` command line (Typer + rich); thin: parse, call a package, render."""
