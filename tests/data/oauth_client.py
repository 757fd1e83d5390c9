"""Drives `mcpctl bridge NAME` to a unit that needs a login, with the
official MCP Python SDK (package `mcp`), as a connected host would.

Usage: python3 oauth_client.py MCPCTL NAME (needs-login|ok). With
needs-login, the host must get mcpd's error naming the login (at its
initialize or its call); with ok, the protected server's get_time tool
answers. Prints OK and exits 0 when that holds.
"""

import asyncio
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(mcpctl, name, expect):
    hint = f"server {name} needs a login: run mcpctl auth login {name}"
    params = StdioServerParameters(
        command=mcpctl, args=["--user", "bridge", name], env=dict(os.environ)
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            try:
                await session.initialize()
                result = await session.call_tool("get_time", {})
            except Exception as e:  # the SDK's MCPError
                assert expect == "needs-login", f"unexpected error: {e}"
                assert hint in str(e), f"{e!r} does not say {hint!r}"
                print("OK")
                return
            if expect == "needs-login":
                error = bool(getattr(result, "is_error", None) or getattr(result, "isError", None))
                text = result.content[0].text if result.content else ""
                assert error and hint in text, result
            else:
                text = result.content[0].text if result.content else ""
                assert "current_time" in text, result
    print("OK")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
