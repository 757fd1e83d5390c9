"""An MCP stdio server that misbehaves on purpose, for the tests of what a
hostile server cannot do to the daemon and its neighbours.

Usage: hostile_server.py MODE [ARG], where MODE is one of:

- ``slow-ping SECONDS``: answers every ``ping`` SECONDS late (everything
  else at once);
- ``strict``: drops, unanswered, a message with a member JSON-RPC 2.0 does
  not have (as a strictly validating SDK does);
- ``log-flood N``: a call of the tool ``flood`` answers at once and then
  sends N ``notifications/message``, as fast as the pipe takes them;
- ``id-last``: behaves, but writes every answer with its id last, as the
  TypeScript SDK does;
- ``garbage``: a call of the tool ``garbage`` (``n``) writes ``n`` lines
  of text that are not JSON before its answer;
- ``binary``: a call of ``garbage`` writes random bytes to stdout for
  ever, from then on;
- ``discover-hang``, ``discover-garbage``, ``discover-error``: behaves,
  but never answers ``server/discover``, answers it with a line that is
  not JSON, or with an error of an odd code;
- ``plain``: behaves.

Tools: ``echo`` (``text``), ``big`` (``n``: an answer of ``n`` bytes of
text) and ``flood`` (see ``log-flood``).

Raw JSON-RPC on stdin and stdout, no SDK, so the misbehaviour is exactly
what is written here.
"""

import json
import os
import sys
import threading

MODE = sys.argv[1]
ARG = sys.argv[2] if len(sys.argv) > 2 else None
LOCK = threading.Lock()


def send(message):
    line = json.dumps(message, separators=(",", ":")) + "\n"
    with LOCK:
        sys.stdout.write(line)
        sys.stdout.flush()


def answer(message, result):
    if MODE == "id-last":
        send({"result": result, "jsonrpc": "2.0", "id": message["id"]})
    else:
        send({"jsonrpc": "2.0", "id": message["id"], "result": result})


MEMBERS = {"jsonrpc", "id", "method", "params", "result", "error"}

ECHO = {
    "name": "echo",
    "description": "says it back",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
}

BIG = {
    "name": "big",
    "description": "an answer of n bytes",
    "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}},
}

GARBAGE = dict(ECHO, name="garbage", description="writes what is not JSON")
FLOOD = dict(ECHO, name="flood", description="floods log messages")


def binary():
    with LOCK:
        while True:
            sys.stdout.buffer.write(os.urandom(65536))
            sys.stdout.buffer.flush()


def flood(n):
    for i in range(n):
        send({"jsonrpc": "2.0", "method": "notifications/message",
              "params": {"level": "info", "logger": "flood", "data": f"flood {i}"}})


for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    method = message.get("method")
    if MODE == "strict" and set(message) - MEMBERS:
        continue
    if "id" not in message or method is None:
        continue
    params = message.get("params") or {}
    if method == "server/discover" and MODE.startswith("discover-"):
        if MODE == "discover-garbage":
            with LOCK:
                sys.stdout.write("<discover>this is not json</discover>\n")
                sys.stdout.flush()
        elif MODE == "discover-error":
            send({"jsonrpc": "2.0", "id": message["id"],
                  "error": {"code": -1, "message": "what is discover?"}})
        continue
    if method == "initialize":
        answer(message, {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "hostile", "version": "1"},
        })
    elif method == "ping":
        if MODE == "slow-ping":
            threading.Timer(float(ARG), answer, (message, {})).start()
        else:
            answer(message, {})
    elif method == "tools/list":
        answer(message, {"tools": [ECHO, BIG, GARBAGE, FLOOD]})
    elif method == "tools/call" and params.get("name") == "garbage":
        if MODE == "binary":
            threading.Thread(target=binary).start()
        else:
            with LOCK:
                n = int(params.get("arguments", {}).get("n", 0))
                sys.stdout.write("".join(f"this is not json {i}\n" for i in range(n)))
                sys.stdout.flush()
            answer(message, {"content": [{"type": "text", "text": "garbage"}]})
    elif method == "tools/call" and params.get("name") == "flood":
        answer(message, {"content": [{"type": "text", "text": "flooding"}]})
        threading.Thread(target=flood, args=(int(ARG or 0),)).start()
    elif method == "tools/call":
        arguments = params.get("arguments", {})
        if params.get("name") == "big":
            text = "y" * int(arguments.get("n", 0))
        else:
            text = arguments.get("text", "")
        answer(message, {"content": [{"type": "text", "text": text}]})
    else:
        send({"jsonrpc": "2.0", "id": message["id"],
              "error": {"code": -32601, "message": "no such method"}})
