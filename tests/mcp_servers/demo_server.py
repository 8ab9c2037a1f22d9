"""A FastMCP server for the MCP bridge tests: each tool exercises one thing the bridge
must carry (plain calls, concurrency, progress, logging, sampling, a crash, garbage)."""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import SamplingMessage, TextContent

server = FastMCP("demo")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@server.tool()
async def slow(seconds: float, label: str) -> str:
    """Sleep, then answer with the label (several may run at once)."""
    await asyncio.sleep(seconds)
    return label


@server.tool()
async def progress(steps: int, ctx: Context) -> str:  # type: ignore[type-arg]
    """Report progress once per step."""
    for step in range(1, steps + 1):
        await ctx.report_progress(step, steps)
    return "done"


@server.tool()
async def log(text: str, ctx: Context) -> str:  # type: ignore[type-arg]
    """Send a log message to the client."""
    await ctx.info(text)
    return "logged"


@server.tool()
async def ask_client(question: str, ctx: Context) -> str:  # type: ignore[type-arg]
    """Ask the client's model (sampling) and return its answer."""
    result = await ctx.session.create_message(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text=question))],
        max_tokens=50,
    )
    assert isinstance(result.content, TextContent)
    return f"the client said: {result.content.text}"


@server.tool()
def crash() -> str:
    """Exit at once, as a crashing server would."""
    print("about to crash", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool()
def garbage() -> str:
    """Write a line that is not JSON-RPC to stdout (forbidden by the MCP stdio transport)."""
    sys.stdout.write("this is not JSON\n")
    sys.stdout.flush()
    return "wrote garbage"


@server.tool()
def whoami() -> str:
    """The uid, gid and working directory the server runs with."""
    return f"{os.getuid()}:{os.getgid()} {os.getcwd()}"


if __name__ == "__main__":
    server.run("stdio")
