"""A stdio-to-HTTP front, for the conformance test (tests/daemon/conformance.rs):
MCP Streamable HTTP with 2025-11-25 sessions in front of a stdio command,
one child per session, so the suite can reach `mcpctl bridge UNIT`.

`http_front.py PORT COMMAND [ARG...]` listens on 127.0.0.1:PORT, path /mcp.
A POSTed `initialize` without a session starts COMMAND and names it by
`Mcp-Session-Id`; DELETE ends it (a later request of it is 404). Each
request's answer, and what the child sends while it is in flight (progress,
log messages, its requests to the client), come as an SSE stream on that
POST, which starts with a priming event (an id, empty data, `retry:`); what
comes with no request in flight goes to the session's GET stream, if one is
open. Notifications and answers to the child's requests are `202`. A `Host`
or `Origin` that is not loopback is `403` (DNS rebinding). No resumption, no
tokens: test scaffolding, never shipped."""

import asyncio
import itertools
import json
import sys
import uuid

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

PORT = int(sys.argv[1])
COMMAND = sys.argv[2:]
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
EVENTS = itertools.count(1)


class Session:
    """One child and the streams waiting for what it writes."""

    def __init__(self, proc):
        self.proc = proc
        # Requests in flight by their id's JSON text, oldest first.
        self.pending = {}
        self.listen = None
        self.reader = asyncio.create_task(self.read())

    async def read(self):
        while line := await self.proc.stdout.readline():
            message = json.loads(line)
            if "method" not in message and "id" in message:
                stream = self.pending.pop(json.dumps(message["id"]), None)
                if stream is not None:
                    await stream.put(message)
                    await stream.put(None)
                continue
            streams = list(self.pending.values())
            stream = streams[-1] if streams else self.listen
            if stream is not None:
                await stream.put(message)
        for stream in self.pending.values():
            await stream.put(None)

    async def send(self, message):
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        await self.proc.stdin.drain()

    def end(self):
        if self.proc.returncode is None:
            self.proc.kill()


SESSIONS = {}


async def events(stream):
    yield f"id: {next(EVENTS)}\nretry: 1000\ndata: \n\n"
    while (message := await stream.get()) is not None:
        yield f"id: {next(EVENTS)}\nevent: message\ndata: {json.dumps(message)}\n\n"


def loopback(request):
    host = request.headers.get("host", "").rsplit(":", 1)[0]
    origin = request.headers.get("origin")
    origin_host = origin.split("//", 1)[-1].rsplit(":", 1)[0] if origin else None
    return host in LOOPBACK and origin_host in (None, *LOOPBACK)


async def mcp(request):
    if not loopback(request):
        return Response("not loopback", status_code=403)
    sid = request.headers.get("mcp-session-id")
    session = SESSIONS.get(sid) if sid else None
    if sid and session is None:
        return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "no such session"}}, 404)
    if request.method == "DELETE":
        SESSIONS.pop(sid, None)
        session.end()
        return Response(status_code=200)
    if request.method == "GET":
        if session is None:
            return Response(status_code=400)
        session.listen = asyncio.Queue()
        return StreamingResponse(events(session.listen), media_type="text/event-stream")
    message = json.loads(await request.body())
    if session is None:
        if message.get("method") != "initialize":
            return JSONResponse({"jsonrpc": "2.0", "id": message.get("id"), "error": {"code": -32600, "message": "no session: initialize first"}}, 400)
        proc = await asyncio.create_subprocess_exec(
            *COMMAND, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=16 << 20
        )
        sid = uuid.uuid4().hex
        session = SESSIONS[sid] = Session(proc)
    if "method" not in message or "id" not in message:
        await session.send(message)
        return Response(status_code=202)
    stream = asyncio.Queue()
    session.pending[json.dumps(message["id"])] = stream
    await session.send(message)
    return StreamingResponse(events(stream), media_type="text/event-stream", headers={"mcp-session-id": sid})


app = Starlette(routes=[Route("/mcp", mcp, methods=["GET", "POST", "DELETE"])])

if __name__ == "__main__":
    try:
        uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
    finally:
        for session in SESSIONS.values():
            session.end()
