"""A host of `mcpctl bridge` driven line by line, for the aggregate tests.

Usage: python3 aggregate_client.py MCPCTL BRIDGE-ARGS...; the environment
points at the daemon (XDG_RUNTIME_DIR). The official MCP Python SDK's
`ClientSession` is the host. Each line of stdin is a JSON command; each
answer is one JSON line on stdout:

  {"op": "init"}                      -> serverInfo name, title, capabilities
  {"op": "tools"} / {"op": "prompts"} -> {"names": [...]}
  {"op": "resources"}                 -> {"uris": [...]}
  {"op": "call", "name": N, "args": {...}, "tag": T?}
                                      -> {"error": bool, "text": ...} (with a
                                         tag: started in the background)
  {"op": "wait", "tag": T}            -> that background call's answer
  {"op": "read", "uri": U}            -> {"text": ...}
  {"op": "prompt", "name": N}         -> {"text": ...}
  {"op": "changed"}                   -> once tools/list_changed came (30 s)
Errors of the SDK come back as {"raised": "..."}.
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def method_of(message):
    method = getattr(message, "method", None)
    if method is None and hasattr(message, "root"):
        method = getattr(message.root, "method", None)
    return method


async def call(session, name, args):
    try:
        result = await session.call_tool(name, args)
    except Exception as e:  # the SDK raises a JSON-RPC error
        return {"raised": str(e)}
    text = result.content[0].text if result.content else ""
    return {"error": bool(getattr(result, "is_error", False)), "text": text}


async def main(mcpctl, args):
    changed = asyncio.Event()

    async def on_message(message):
        if method_of(message) == "notifications/tools/list_changed":
            changed.set()

    params = StdioServerParameters(command=mcpctl, args=["--user", "bridge", *args], env=dict(os.environ))
    background = {}
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, message_handler=on_message) as session:
            while True:
                line = await reader.readline()
                if not line:
                    return
                command = json.loads(line)
                op = command["op"]
                try:
                    if op == "init":
                        init = await session.initialize()
                        caps = init.capabilities.model_dump(exclude_none=True)
                        out = {"name": init.server_info.name, "title": init.server_info.title,
                               "capabilities": sorted(caps.keys()),
                               "instructions": init.instructions or ""}
                    elif op == "tools":
                        out = {"names": [t.name for t in (await session.list_tools()).tools]}
                    elif op == "prompts":
                        out = {"names": [p.name for p in (await session.list_prompts()).prompts]}
                    elif op == "resources":
                        out = {"uris": [str(r.uri) for r in (await session.list_resources()).resources]}
                    elif op == "call" and "tag" in command:
                        background[command["tag"]] = asyncio.ensure_future(
                            call(session, command["name"], command.get("args", {})))
                        out = {"started": command["tag"]}
                    elif op == "call":
                        out = await call(session, command["name"], command.get("args", {}))
                    elif op == "wait":
                        out = await asyncio.wait_for(background.pop(command["tag"]), 30)
                    elif op == "read":
                        contents = (await session.read_resource(command["uri"])).contents
                        out = {"text": getattr(contents[0], "text", "")}
                    elif op == "prompt":
                        prompt = await session.get_prompt(command["name"], command.get("args", {}))
                        out = {"text": prompt.messages[0].content.text}
                    elif op == "changed":
                        await asyncio.wait_for(changed.wait(), 30)
                        changed.clear()
                        out = {"changed": True}
                    else:
                        out = {"raised": f"unknown op {op}"}
                except Exception as e:
                    out = {"raised": f"{type(e).__name__}: {e}"}
                print(json.dumps(out), flush=True)


asyncio.run(main(sys.argv[1], sys.argv[2:]))
