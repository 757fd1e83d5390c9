"""What a host on each era of MCP gets from a server, as the official MCP
Python SDK (package `mcp`, 2.x) sees it: `mcp.client.Client` connecting with
`mode` "legacy" (the initialize handshake), "auto" (`server/discover`,
falling back to initialize) or "2026-07-28" (that version adopted directly:
no handshake, every request stamped with `_meta`).

Usage: python3 era_client.py [--input] MODE SERVER COMMAND [ARG...]

SERVER names the server behind COMMAND, which picks the tool, resource and
prompt every check uses: `everything` (@modelcontextprotocol/server-everything)
or `python` (the Python SDK's example server, tests/data/py_everything_stdio.py),
or `aggregate` (both as one server through `mcpctl bridge @mix`: their
tools and prompts named `ev__…` and `py__…`).
COMMAND is started as a stdio MCP server: the server directly, or
`mcpctl bridge NAME` in front of it; a COMMAND that is one http:// URL is
connected to with the SDK's Streamable HTTP client instead (mcpd's
endpoint).

Prints one JSON object: the negotiated version and server name, then each
check's outcome reduced to what must be the same either way (names, texts);
a check that fails records "error: ..." instead. With --input, the checks are
the tools that ask the host for something (elicitation, sampling) instead:
each records how often the host's callback ran and the tool's final text (at
2026-07-28 the SDK answers `input_required` results by itself, calling the
same callbacks). Every wait is bounded: nothing hangs.
"""

import json
import math
import os
import sys

import anyio
import mcp.types as t
from mcp import StdioServerParameters
from mcp.client import Client

CONNECT = 20  # seconds to connect (spawn, and discover or initialize)
WAIT = 10  # seconds any one check may take (or the close)

ELICITED = "elicited by the host"
SAMPLED = "sampled by the host"

# What each check uses on each server.
PROFILES = {
    "everything": {
        "read": "demo://resource/static/document/architecture.md",
        "prompt": ("simple-prompt", None),
        "call": ("echo", {"message": "era"}),
        "input": {
            "elicit": ("trigger-elicitation-request", {}),
            "sample": ("trigger-sampling-request", {"prompt": "hello", "maxTokens": 10}),
        },
    },
    "python": {
        "read": "test://static-text",
        "prompt": ("test_simple_prompt", None),
        "call": ("test_simple_text", {}),
        "input": {
            # asked in the middle of the call (ctx.elicit, create_message)
            "elicit": ("test_elicitation", {"message": "who?"}),
            "sample": ("test_sampling", {"prompt": "hello"}),
            # returned as an InputRequiredResult (SEP-2322)
            "ir_elicit": ("test_input_required_result_elicitation", {}),
            "ir_sample": ("test_input_required_result_sampling", {}),
            "ir_roots": ("test_input_required_result_list_roots", {}),
            # all three kinds of question in one result
            "ir_multiple": ("test_input_required_result_multiple_inputs", {}),
            # two rounds of questions, the server's requestState evolving
            "ir_multi_round": ("test_input_required_result_multi_round", {}),
            # the server verifies its (sealed) requestState came back intact
            "ir_tampered": ("test_input_required_result_tampered_state", {}),
        },
    },
    "aggregate": {
        "read": "demo://resource/static/document/architecture.md",
        "prompt": ("ev__simple-prompt", None),
        "call": ("py__test_simple_text", {}),
        "input": {
            "elicit": ("ev__trigger-elicitation-request", {}),
            "sample": ("ev__trigger-sampling-request", {"prompt": "hello", "maxTokens": 10}),
            "py_elicit": ("py__test_elicitation", {"message": "who?"}),
            "py_sample": ("py__test_sampling", {"prompt": "hello"}),
        },
    },
}


def error(e):
    if isinstance(e, BaseExceptionGroup):
        return " | ".join(error(x) for x in e.exceptions)
    return f"error: {type(e).__name__}: {e}"


def text_of(result):
    return " ".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def checks(client, profile, interactive, calls, out):
    """Runs every check on a connected client, into `out`."""

    async def check(name, step):
        try:
            with anyio.fail_after(WAIT):
                out[name] = await step()
        except Exception as e:  # the outcome is the failure
            out[name] = error(e)

    out["protocol"] = client.protocol_version
    info = client.server_info
    out["server"] = info.name if info is not None else None

    if interactive:
        for name, (tool, args) in profile["input"].items():

            async def ask(tool=tool, args=args):
                before = dict(calls)
                result = await client.call_tool(tool, args)
                return {
                    "callbacks": {k: calls[k] - before[k] for k in calls},
                    "error": bool(result.is_error),
                    "text": text_of(result),
                }

            await check(name, ask)
        return

    async def tools():
        return sorted(x.name for x in (await client.list_tools()).tools)

    async def resources():
        return sorted(str(x.uri) for x in (await client.list_resources()).resources)

    async def read():
        result = await client.read_resource(profile["read"])
        return result.contents[0].text[:40]

    async def prompts():
        return sorted(p.name for p in (await client.list_prompts()).prompts)

    async def prompt():
        name, args = profile["prompt"]
        result = await client.get_prompt(name, args)
        return result.messages[0].content.text[:40]

    async def call():
        tool, args = profile["call"]
        result = await client.call_tool(tool, args)
        return {"error": bool(result.is_error), "text": text_of(result)}

    for name, step in [
        ("tools", tools),
        ("resources", resources),
        ("read", read),
        ("prompts", prompts),
        ("prompt", prompt),
        ("call", call),
    ]:
        await check(name, step)


async def main(argv):
    interactive = argv[:1] == ["--input"]
    if interactive:
        argv = argv[1:]
    mode, server, command = argv[0], argv[1], argv[2:]
    profile = PROFILES[server]
    calls = {"elicitation": 0, "sampling": 0, "roots": 0}

    async def sampling(_ctx, _params):
        calls["sampling"] += 1
        return t.CreateMessageResult(
            role="assistant", content=t.TextContent(type="text", text=SAMPLED), model="test-model"
        )

    async def elicitation(_ctx, params):
        calls["elicitation"] += 1
        # every required string, and `name`, answered with the same text
        schema = getattr(params, "requested_schema", None) or {}
        props = schema.get("properties", {})
        keys = set(schema.get("required", [])) | ({"name"} & set(props))
        content = {k: ELICITED for k in keys if props.get(k, {}).get("type", "string") == "string"}
        return t.ElicitResult(action="accept", content=content)

    async def list_roots(_ctx):
        calls["roots"] += 1
        return t.ListRootsResult(roots=[t.Root(uri="file:///srv/eras")])

    out = {"mode": mode}
    if len(command) == 1 and command[0].startswith("http://"):
        params = command[0]
    else:
        params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    client = Client(
        params,
        mode=mode,
        sampling_callback=sampling,
        elicitation_callback=elicitation,
        list_roots_callback=list_roots,
    )
    # One cancel scope around the session (anyio wants the client's task
    # group entered and left in the same scope): its deadline bounds the
    # connect, is lifted while each check bounds itself, then bounds the
    # close.
    scope = anyio.CancelScope(deadline=anyio.current_time() + CONNECT)
    try:
        with scope:
            async with client:
                out["connect"] = "ok"
                scope.deadline = math.inf
                await checks(client, profile, interactive, calls, out)
                scope.deadline = anyio.current_time() + WAIT
    except Exception as e:
        out.setdefault("connect", error(e))
        if out["connect"] == "ok":
            out["close"] = error(e)
    if scope.cancelled_caught:
        out.setdefault("connect", f"error: timed out after {CONNECT} s")
        if out["connect"] == "ok":
            out["close"] = f"error: timed out after {WAIT} s"
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
