"""One tool call with progress, as the official MCP Python SDK's client
(package `mcp`, 2.x) makes it over Streamable HTTP with a session
(`mode="legacy"`: initialize, then each request's answer on its own POST's
stream).

Usage: python3 progress_client.py URL STEPS

Calls the fixture's `progress` tool with `steps` STEPS and prints one JSON
object: how many progress notifications the callback saw, how many distinct
values, the answer's text and the call's seconds. Bounded: 120 s in all.
"""

import json
import sys
import time

import anyio
from mcp.client import Client


async def main(url, steps):
    seen = []

    async def progress(value, _total, _message):
        seen.append(value)

    with anyio.fail_after(120):
        async with Client(url, mode="legacy") as client:
            start = time.monotonic()
            result = await client.call_tool(
                "progress", {"steps": steps}, progress_callback=progress
            )
            took = time.monotonic() - start
    print(
        json.dumps(
            {
                "progress": len(seen),
                "distinct": len(set(seen)),
                "text": result.content[0].text,
                "seconds": took,
            }
        )
    )


anyio.run(main, sys.argv[1], int(sys.argv[2]))
