"""`tools mcp`: an MCP server on stdio that gives an MCP client (a coding agent)
containers as sandboxes, with the runtime's tools in them (docs/MCP_GATEWAY.md).

registry.py holds the sandboxes (made or attached, by the id the client passes),
jobs.py exec_start's jobs between polls, schemas.py the input schemas made from the
params dataclasses, tools.py the tool table, server.py the SDK's stdio server around it.
The `mcp` package is needed (`pip install 'sandbox-tools[mcp]'`).
"""
