"""What a host built on the official MCP Python SDK (package `mcp`, 2.x)
gets when it opens a session through COMMAND (`mcpctl bridge NAME`) with a
server that cannot serve, and how long that takes.

Usage: python3 cannot_serve.py MODE COMMAND [ARG...]

MODE "legacy" opens with `initialize` (`ClientSession`); "auto" and
"2026-07-28" use `mcp.client.Client` in that mode (`server/discover` first,
or no handshake at all: then the first request, `tools/list`, opens it).

Prints one JSON object: "opened" (the tool names) or "error" (the message of
the error the opening got; "closed: ..." when the connection closed
instead), and "seconds" from spawning COMMAND to that outcome. Bounded:
nothing waits more than 60 s.
"""

import json
import os
import sys
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client import Client
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

BOUND = 60


def message_of(e):
    """The JSON-RPC error's message, wherever the SDK put it."""
    if isinstance(e, BaseExceptionGroup):
        for inner in e.exceptions:
            found = message_of(inner)
            if found is not None:
                return found
        return None
    if isinstance(e, MCPError):
        return e.message
    return None


async def open_session(mode, params):
    if mode == "legacy":
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = await session.list_tools()
                return [t.name for t in tools.tools]
    async with Client(params, mode=mode) as client:
        tools = await client.list_tools()
        return [t.name for t in tools.tools]


async def main(argv):
    mode, command = argv[0], argv[1:]
    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    out = {}
    started = time.monotonic()
    try:
        with anyio.fail_after(BOUND):
            out["opened"] = await open_session(mode, params)
    except BaseException as e:  # an ExceptionGroup, an MCPError, a timeout
        message = message_of(e)
        out["error"] = message if message is not None else f"closed: {type(e).__name__}: {e}"
    out["seconds"] = round(time.monotonic() - started, 3)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
