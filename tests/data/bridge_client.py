"""Drives `mcpctl bridge demo` with the official MCP Python SDK (package `mcp`).

Usage: python3 bridge_client.py MCPCTL. The daemon must be running with a
unit `demo` (the fixture server, long backoff); XDG_RUNTIME_DIR points at it.
Prints OK and exits 0 when every check holds.
"""

import asyncio
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.client.stdio import stdio_client


def method_of(message):
    method = getattr(message, "method", None)
    if method is None and hasattr(message, "root"):
        method = getattr(message.root, "method", None)
    return method


def text_of(result):
    return result.content[0].text if result.content else ""


def is_error(result):
    return bool(getattr(result, "is_error", None) or getattr(result, "isError", None))


async def main(mcpctl):
    changed = asyncio.Event()

    async def on_message(message):
        if method_of(message) == "notifications/tools/list_changed":
            changed.set()

    params = StdioServerParameters(
        command=mcpctl, args=["--user", "bridge", "demo"], env=dict(os.environ)
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, message_handler=on_message) as session:
            init = await session.initialize()
            info = getattr(init, "server_info", None) or getattr(init, "serverInfo", None)
            # mcpd answers initialize with the server's own result
            assert info.name == "mcp-fixture", info
            tools = await session.list_tools()
            names = [t.name for t in tools.tools]
            assert len(names) == 9 and "echo" in names, names

            result = await session.call_tool("echo", {"text": "from python"})
            assert not is_error(result) and text_of(result) == "from python", result

            await session.call_tool("set_tools", {"tools": ["py_extra"]})
            await asyncio.wait_for(changed.wait(), 30)
            tools = await session.list_tools()
            assert "py_extra" in [t.name for t in tools.tools], tools

            await session.call_tool("crash", {"code": 1})
            message = ""
            for _ in range(300):
                # During the outage a request gets a JSON-RPC error naming
                # the state and the next retry (a call racing the crash may
                # fail with "connection lost" first).
                try:
                    result = await session.call_tool("echo", {"text": "x"})
                    message = repr(result)
                except MCPError as e:
                    message = e.message
                    if message.startswith("server demo is"):
                        break
                await asyncio.sleep(0.02)
            assert message.startswith("server demo is reconnecting"), message
            # the bridge stays up, and the tools stay listed during the outage
            tools = await session.list_tools()
            assert len(tools.tools) == 10, tools
    print("OK")


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(sys.argv[1]), 60))
