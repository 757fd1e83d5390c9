"""An MCP stdio server of 2026-07-28 whose lists go stale by the clock
alone: every list answer carries ``ttlMs`` TTL and ``cacheScope`` SCOPE,
and the lists change on every read without a word (no ``list_changed``),
for the tests of how mcpd honours a list's TTL.

Usage: ttl_server.py TTL SCOPE COUNT_FILE

Its tools are one tool, ``v{n}``, and its resources one resource,
``ttl://v{n}``, where n counts that list's reads; each read appends a line
(``tools`` or ``resources``) to COUNT_FILE before it is answered. It
answers ``server/discover`` (2026-07-28 only) and nothing of the 2025
era; mcpd's ``subscriptions/listen`` stream is left open, unanswered.

Raw JSON-RPC on stdin and stdout, no SDK, so the hints are exactly what
is written here.
"""

import json
import sys

TTL, SCOPE, COUNT_FILE = int(sys.argv[1]), sys.argv[2], sys.argv[3]
READS = {"tools": 0, "resources": 0}


def send(message):
    sys.stdout.write(json.dumps(message, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def answer(message, result):
    send({"jsonrpc": "2.0", "id": message["id"], "result": result})


def listed(kind):
    READS[kind] += 1
    with open(COUNT_FILE, "a") as f:
        f.write(kind + "\n")
    return READS[kind]


INFO = {"io.modelcontextprotocol/serverInfo": {"name": "ttl", "version": "1"}}

for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    method = message.get("method")
    if "id" not in message or method is None:
        continue
    hints = {"resultType": "complete", "ttlMs": TTL, "cacheScope": SCOPE, "_meta": INFO}
    if method == "server/discover":
        answer(message, {
            "resultType": "complete",
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {}, "resources": {}},
            "_meta": INFO,
        })
    elif method == "subscriptions/listen":
        continue
    elif method == "tools/list":
        n = listed("tools")
        tool = {"name": f"v{n}", "inputSchema": {"type": "object"}}
        answer(message, dict(hints, tools=[tool]))
    elif method == "resources/list":
        n = listed("resources")
        answer(message, dict(hints, resources=[{"uri": f"ttl://v{n}", "name": f"v{n}"}]))
    elif method in ("resources/templates/list", "prompts/list"):
        send({"jsonrpc": "2.0", "id": message["id"],
              "error": {"code": -32601, "message": "no such method"}})
    elif method == "tools/call":
        answer(message, {"resultType": "complete", "content": [{"type": "text", "text": "ok"}],
                         "_meta": INFO})
    else:
        send({"jsonrpc": "2.0", "id": message["id"],
              "error": {"code": -32601, "message": "no such method"}})
