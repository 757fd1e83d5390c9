"""The MCP Python SDK's dual-era example server (`mcp-everything-server` from
the mcp 2.3.0 sdist, which `.ci/run` installs into target/py-everything) over
Streamable HTTP, printing what each POST carried of the W3C trace context,
for the telemetry test (tests/daemon/telemetry.rs).

It binds 127.0.0.1:0 and prints `listening PORT` first; then one JSON line
per POST to /mcp: {"method", "traceparent", "tracestate" (the headers, or
null), "meta_traceparent" (the body's `params._meta.traceparent`, or null)}.
Test scaffolding, never shipped."""

import json
import socket
import sys

import uvicorn
from mcp_everything_server.server import mcp


def emit(obj):
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def recording(app):
    """ASGI middleware: reads a POST's body, records it, replays it."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await app(scope, receive, send)
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = {}
        params = parsed.get("params") if isinstance(parsed, dict) else None
        meta = (params or {}).get("_meta") or {}
        emit({
            "method": parsed.get("method") if isinstance(parsed, dict) else None,
            "traceparent": headers.get("traceparent"),
            "tracestate": headers.get("tracestate"),
            "meta_traceparent": meta.get("traceparent"),
        })
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await app(scope, replay, send)

    return wrapped


def main():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sys.stdout.write(f"listening {sock.getsockname()[1]}\n")
    sys.stdout.flush()
    config = uvicorn.Config(recording(mcp.streamable_http_app()), log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
