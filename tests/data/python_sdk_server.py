"""An MCP server built on the official Python SDK (`mcp` 2.x), for the
interop test: mcpd supervises it like any third-party stdio server."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("python-sdk", instructions="served by the official Python SDK")


@server.tool()
def shout(text: str) -> str:
    """Upper-case the text"""
    return text.upper()


@server.tool()
def big(n: int) -> str:
    """Return n bytes of 'y'"""
    return "y" * n


server.run()
