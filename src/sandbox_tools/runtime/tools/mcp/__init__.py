"""MCP bridge: stdio MCP servers inside the sandbox, spoken to from the host."""
