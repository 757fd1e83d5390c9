"""Runs the MCP Python SDK's dual-era example server (`mcp-everything-server`
from the mcp 2.3.0 sdist, which `.ci/run` installs into
target/py-everything) over stdio instead of its default Streamable HTTP."""

from mcp_everything_server.server import mcp

mcp.run(transport="stdio")
