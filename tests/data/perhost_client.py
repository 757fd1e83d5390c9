"""A host of `mcpctl bridge NAME` for the per-host tests, driven a line
at a time (DESIGN §13).

Usage: python3 perhost_client.py [--mode=MODE] MCPCTL NAME [ROOT-URI...];
the environment points at the daemon (XDG_RUNTIME_DIR). The official MCP
Python SDK's `ClientSession` is the host (MCP 2025-11-25), or with
`--mode` its `Client` in that mode ("2026-07-28": a host of MCP
2026-07-28, asked by `input_required` results); with root URIs it
declares `roots` and answers `roots/list` with them. Each line of stdin
is a JSON command, each answer one JSON line on stdout:

  {"op": "init"}                         -> {"name": serverInfo name,
                                             "protocol": its version}
  {"op": "call", "name": N, "args": {}}  -> {"error": bool, "text": ...}
  {"op": "tools"}                        -> {"names": [...]}
SDK errors come back as {"raised": "..."}. End of stdin: the host leaves.
"""

import asyncio
import json
import os
import sys

import mcp.types as t
from mcp import ClientSession, StdioServerParameters
from mcp.client.client import Client
from mcp.client.stdio import stdio_client


async def main(mode, mcpctl, name, roots):
    async def list_roots(_ctx):
        return t.ListRootsResult(roots=[t.Root(uri=uri) for uri in roots])

    params = StdioServerParameters(command=mcpctl, args=["--user", "bridge", name], env=dict(os.environ))
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    extra = {"list_roots_callback": list_roots} if roots else {}
    if mode:
        async with Client(params, mode=mode, **extra) as client:
            await serve(reader, client, client)
        return
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, **extra) as session:
            await serve(reader, session, None)


async def serve(reader, session, client):
    """Answers the commands on stdin until it ends; `client` is the
    modern `Client` (connected already), or None for a `ClientSession`."""
    while True:
        line = await reader.readline()
        if not line:
            return
        command = json.loads(line)
        op = command["op"]
        try:
            if op == "init" and client is not None:
                info = client.server_info
                out = {"name": info.name if info else None, "protocol": client.protocol_version}
            elif op == "init":
                init = await session.initialize()
                out = {"name": init.server_info.name, "protocol": init.protocol_version}
            elif op == "call":
                result = await session.call_tool(command["name"], command.get("args", {}))
                text = result.content[0].text if result.content else ""
                out = {"error": bool(getattr(result, "is_error", False)), "text": text}
            elif op == "tools":
                out = {"names": [x.name for x in (await session.list_tools()).tools]}
            else:
                out = {"raised": f"unknown op {op}"}
        except Exception as e:
            out = {"raised": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)


args = sys.argv[1:]
mode = args.pop(0).removeprefix("--mode=") if args and args[0].startswith("--mode=") else None
asyncio.run(main(mode, args[0], args[1], args[2:]))
