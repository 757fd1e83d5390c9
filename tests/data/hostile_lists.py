"""An MCP stdio server whose lists are hostile, for the list reader's tests.

Usage: hostile_lists.py MODE, where MODE names the list and how it pages:

- ``cycle-tools``: ``tools/list`` answers cursor "A", then "B" to "A" and
  "A" to "B", for ever;
- ``cycle-resources``: ``resources/list`` does the same (tools are fine);
- ``endless-resources``: ``resources/list`` pages 10,000 times, each page
  with a new cursor;
- ``huge-resources``: ``resources/list`` answers with one page of 100 MiB.

Every other request a server needs is answered plainly: ``initialize``,
``ping``, ``tools/call`` of ``echo``. Raw JSON-RPC on stdin and stdout, no
SDK, so the misbehaviour is exactly what is written here.
"""

import json
import sys

MODE = sys.argv[1]


def send(message):
    sys.stdout.write(json.dumps(message, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def cycle(cursor):
    return {None: "A", "A": "B", "B": "A"}[cursor]


def resources(cursor):
    item = {"uri": "file:///r", "name": "r"}
    if MODE == "cycle-resources":
        return {"resources": [item], "nextCursor": cycle(cursor)}
    if MODE == "endless-resources":
        n = int(cursor or 0) + 1
        result = {"resources": [item]}
        if n < 10000:
            result["nextCursor"] = str(n)
        return result
    if MODE == "huge-resources":
        return {"resources": [{"uri": "file:///r", "name": "r" * (100 << 20)}]}
    return {"resources": [item]}


def tools(cursor):
    echo = {
        "name": "echo",
        "description": "says it back",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    }
    if MODE == "cycle-tools":
        return {"tools": [echo], "nextCursor": cycle(cursor)}
    return {"tools": [echo]}


for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    method = message.get("method")
    if "id" not in message or method is None:
        continue
    params = message.get("params") or {}
    cursor = params.get("cursor")
    if method == "initialize":
        result = {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}, "resources": {}},
            "serverInfo": {"name": "hostile-lists", "version": "1"},
        }
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = tools(cursor)
    elif method == "resources/list":
        result = resources(cursor)
    elif method == "resources/templates/list":
        result = {"resourceTemplates": []}
    elif method == "tools/call":
        text = params.get("arguments", {}).get("text", "")
        result = {"content": [{"type": "text", "text": text}]}
    else:
        send({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "no"}})
        continue
    send({"jsonrpc": "2.0", "id": message["id"], "result": result})
