"""Drives `mcpctl bridge demo` with the official MCP Python SDK (package
`mcp`) while no mcpd runs.

Usage: python3 bridge_down.py MCPCTL, with XDG_RUNTIME_DIR where no daemon
is. Prints the message of the error `initialize` got and exits 0; exits 1
when `initialize` succeeded or the host saw the connection close instead.
"""

import asyncio
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.client.stdio import stdio_client


async def main(mcpctl):
    params = StdioServerParameters(
        command=mcpctl, args=["--user", "bridge", "demo"], env=dict(os.environ)
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            try:
                await asyncio.wait_for(session.initialize(), 60)
            except MCPError as e:
                print(e.message)
                return 0
    print("initialize succeeded")
    return 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1])))
