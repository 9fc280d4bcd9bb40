"""treadle as an MCP server (``/mcp``; docs/mcp.md): ``server`` (the agents as tools, runs as
resources) and ``calls`` (one ``tools/call``: a run followed until it ends or pauses)."""
