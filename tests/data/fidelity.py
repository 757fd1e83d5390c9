"""What an MCP host gets from @modelcontextprotocol/server-everything, as the
official MCP Python SDK (package `mcp`, 2.x) sees it.

Usage: python3 fidelity.py COMMAND [ARG...]: starts COMMAND as a stdio MCP
server (the reference server directly, or `mcpctl bridge NAME` in front of
it), or python3 fidelity.py --http URL: connects to URL with the SDK's
Streamable HTTP client (with `Authorization: Bearer $MCPD_TOKEN` when that
is set); runs every check, and prints one JSON object: each check's outcome,
reduced to what must be the same either way (names, counts, texts). A check
that fails prints its error instead of its outcome; the test compares the
object of a direct run with the object of a run through mcpd.
"""

import asyncio
import json
import os
import sys

import anyio
import mcp.types as t
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

WAIT = 20  # seconds any one notification may take to arrive


def text_of(result):
    return " ".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def sampling(_ctx, params):
    return t.CreateMessageResult(
        role="assistant",
        content=t.TextContent(type="text", text="sampled by the host"),
        model="test-model",
    )


async def elicitation(_ctx, params):
    return t.ElicitResult(action="accept", content={"name": "elicited by the host"})


async def list_roots(_ctx):
    return t.ListRootsResult(roots=[t.Root(uri="file:///srv/fidelity")])


async def main(argv):
    out = {}
    seen = {"updated": anyio.Event(), "log": anyio.Event(), "resources_changed": anyio.Event()}
    logs = []

    async def on_message(message):
        root = getattr(message, "root", message)
        method = getattr(root, "method", None)
        if method == "notifications/resources/updated":
            seen["updated"].set()
        elif method == "notifications/resources/list_changed":
            seen["resources_changed"].set()

    async def on_log(params):
        logs.append(params.level)
        seen["log"].set()

    async def check(name, step):
        try:
            out[name] = await asyncio.wait_for(step(), WAIT)
        except Exception as e:  # the outcome is the failure
            out[name] = f"error: {type(e).__name__}: {e}"

    if argv[0] == "--http":
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        token = os.environ.get("MCPD_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else None
        transport = streamable_http_client(argv[1], http_client=create_mcp_http_client(headers=headers))
    else:
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(os.environ))
        transport = stdio_client(params)
    async with transport as (read, write):
        async with ClientSession(
            read,
            write,
            sampling_callback=sampling,
            elicitation_callback=elicitation,
            list_roots_callback=list_roots,
            logging_callback=on_log,
            message_handler=on_message,
        ) as s:
            init = await s.initialize()
            out["protocol"] = init.protocol_version
            out["capabilities"] = sorted(init.capabilities.model_dump(exclude_none=True))
            out["server"] = init.server_info.name
            out["instructions"] = bool(init.instructions)

            async def tools():
                return sorted(x.name for x in (await s.list_tools()).tools)

            async def resources():
                listed = (await s.list_resources()).resources
                templates = (await s.list_resource_templates()).resource_templates
                first = await s.read_resource(listed[0].uri)
                return {
                    "resources": len(listed),
                    "templates": sorted(x.uri_template for x in templates),
                    "read": first.contents[0].text[:40],
                }

            async def prompts():
                listed = sorted(p.name for p in (await s.list_prompts()).prompts)
                got = await s.get_prompt("simple-prompt")
                return {"prompts": listed, "get": got.messages[0].content.text[:40]}

            async def complete():
                result = await s.complete(
                    t.PromptReference(type="ref/prompt", name="completable-prompt"),
                    {"name": "department", "value": "E"},
                )
                return sorted(result.completion.values)

            async def set_level():
                await s.set_logging_level("debug")
                return "ok"

            async def subscribe():
                await s.subscribe_resource("demo://resource/static/document/architecture.md")
                await s.call_tool("toggle-subscriber-updates", {})
                await seen["updated"].wait()
                await s.call_tool("toggle-subscriber-updates", {})
                return "updated"

            async def progress():
                steps = []

                async def on_progress(progress, total, message):
                    steps.append(progress)

                result = await s.call_tool(
                    "trigger-long-running-operation",
                    {"duration": 0.3, "steps": 3},
                    progress_callback=on_progress,
                )
                return {"steps": steps, "result": text_of(result)[:40]}

            async def log():
                await s.call_tool("toggle-simulated-logging", {})
                await seen["log"].wait()
                await s.call_tool("toggle-simulated-logging", {})
                return "logged"

            async def sample():
                result = await s.call_tool(
                    "trigger-sampling-request", {"prompt": "hello", "maxTokens": 10}
                )
                return "sampled by the host" in text_of(result)

            async def elicit():
                result = await s.call_tool("trigger-elicitation-request", {})
                return "elicited by the host" in json.dumps(result.model_dump())

            async def roots():
                result = await s.call_tool("get-roots-list", {})
                return "file:///srv/fidelity" in text_of(result)

            async def resources_changed():
                await s.call_tool("gzip-file-as-resource", {"name": "f.gz", "data": "data:text/plain;base64,aGVsbG8="})
                await seen["resources_changed"].wait()
                return "list_changed"

            for name, step in [
                ("tools", tools),
                ("resources", resources),
                ("prompts", prompts),
                ("complete", complete),
                ("set_level", set_level),
                ("subscribe", subscribe),
                ("progress", progress),
                ("log", log),
                ("sampling", sample),
                ("elicitation", elicit),
                ("roots", roots),
                ("resources_changed", resources_changed),
            ]:
                await check(name, step)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
