"""A hostile Streamable HTTP server, for the flood test (tests/daemon/flood.rs,
issue 49): it answers mcpd's handshake (2025-11-25, with a session), then
streams `notifications/message` events (8 KiB each) on the session's GET
stream as fast as the socket takes them, for ever.

`sse_flood.py PORT_FILE` listens on 127.0.0.1 (a free port, written to
PORT_FILE once it listens), path /mcp; every byte it streamed is counted in
PORT_FILE.sent (rewritten every MiB). Test scaffolding, never shipped."""

import http.server
import json
import os
import socketserver
import sys

PORT_FILE = sys.argv[1]
SESSION = "flood-session"
EVENT = (
    "data: "
    + json.dumps(
        {
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": "info", "logger": "flood", "data": "x" * 8192},
        }
    )
    + "\n\n"
).encode()
CHUNK = EVENT * 32


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, code, body=None):
        out = json.dumps(body).encode() if body is not None else b""
        self.send_response(code)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Mcp-Session-Id", SESSION)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        message = json.loads(self.rfile.read(length) or b"{}")
        if "id" not in message or "method" not in message:
            return self.answer(202)
        method = message["method"]
        if method == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}, "logging": {}},
                "serverInfo": {"name": "sse-flood", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
        else:
            result = {}
        self.answer(200, {"jsonrpc": "2.0", "id": message["id"], "result": result})

    def do_DELETE(self):
        self.answer(200)

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        sent = 0
        reported = 0
        try:
            while True:
                self.wfile.write(CHUNK)
                sent += len(CHUNK)
                if sent - reported >= 1 << 20:
                    reported = sent
                    with open(PORT_FILE + ".sent.next", "w") as f:
                        f.write(str(sent))
                    os.replace(PORT_FILE + ".sent.next", PORT_FILE + ".sent")
        except (BrokenPipeError, ConnectionResetError):
            pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


server = Server(("127.0.0.1", 0), Handler)
with open(PORT_FILE + ".next", "w") as f:
    f.write(str(server.server_address[1]))
os.replace(PORT_FILE + ".next", PORT_FILE)
server.serve_forever()
