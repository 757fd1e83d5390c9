"""A small OAuth-protected MCP server with its own authorization server,
for the login tests mcpd's real example cannot do (DESIGN §17): short-lived
tokens with refresh and rotation, and authorization servers that break one
check each.

Usage: python3 oauth_fake.py PORT MODE. Serves http://localhost:PORT/mcp
(tools/call of `whoami`), its protected resource metadata and the
authorization server's (issuer http://localhost:PORT/). MODE: `ok`,
`no-s256` (no S256 in code_challenge_methods_supported), `wrong-issuer`
(metadata names another issuer), `wrong-resource` (the PRM's resource is
another server). Access tokens live 3 s; each token request prints one
line (`token authorization_code`, `token refresh_token age=SECONDS`) to
stdout. An optional third argument sets the tokens' lifetime in seconds.

The token lifetime's tests steer it at run time: a POST to /control with
one word sets how the authorization server behaves from then on: `ok`,
`503` (the token endpoint answers 503), `unavailable` (400
`temporarily_unavailable`), `invalid_grant` (every refresh token refused),
`reject` (the MCP server refuses every token with 401 `invalid_token`),
`hang` (the authorization server's endpoints accept and never answer,
printing `hang PATH`),
`revoke-fails` (the revocation endpoint answers 503). Each revocation
(RFC 7009, advertised as `revocation_endpoint`) prints `revoke HINT TOKEN`.
"""

import json
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
MODE = sys.argv[2]
BASE = f"http://localhost:{PORT}"
LIFETIME = int(sys.argv[3]) if len(sys.argv) > 3 else 3
tokens = {}  # access token -> expiry
refresh = {}  # refresh token -> when it was issued
counter = [0]
control = ["ok"]


def issue():
    counter[0] += 1
    access, rt = f"at-{counter[0]}", f"rt-{counter[0]}"
    tokens[access] = time.time() + LIFETIME
    refresh[rt] = time.time()
    return {"access_token": access, "token_type": "Bearer", "expires_in": LIFETIME,
            "refresh_token": rt, "scope": "mcp"}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send(self, status, body=None, headers=()):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        if body is not None:
            self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def hang(self):
        if control[0] == "hang":
            print(f"hang {urllib.parse.urlparse(self.path).path}", flush=True)
            time.sleep(3600)

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        if url.path != "/.well-known/oauth-protected-resource/mcp" and url.path != "/mcp":
            self.hang()
        if url.path == "/.well-known/oauth-protected-resource/mcp":
            resource = f"{BASE}/other" if MODE == "wrong-resource" else f"{BASE}/mcp"
            return self.send(200, {"resource": resource, "authorization_servers": [f"{BASE}/"]})
        if url.path == "/.well-known/oauth-authorization-server":
            issuer = "http://127.0.0.1:1/" if MODE == "wrong-issuer" else f"{BASE}/"
            methods = ["plain"] if MODE == "no-s256" else ["S256"]
            return self.send(200, {
                "issuer": issuer,
                "authorization_endpoint": f"{BASE}/authorize",
                "token_endpoint": f"{BASE}/token",
                "registration_endpoint": f"{BASE}/register",
                "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code", "refresh_token"],
                "code_challenge_methods_supported": methods,
                "token_endpoint_auth_methods_supported": ["none"],
                "scopes_supported": ["mcp"],
                "revocation_endpoint": f"{BASE}/revoke",
            })
        if url.path == "/authorize":
            q = urllib.parse.parse_qs(url.query)
            target = q["redirect_uri"][0] + "?" + urllib.parse.urlencode(
                {"code": "the-code", "state": q["state"][0]})
            return self.send(302, None, [("location", target)])
        if url.path == "/mcp":
            return self.send(405)
        return self.send(404, {"error": "not found"})

    def do_DELETE(self):
        self.send(200)

    def body(self):
        return self.rfile.read(int(self.headers.get("content-length", "0")))

    def do_POST(self):
        url = urllib.parse.urlparse(self.path)
        if url.path == "/control":
            control[0] = self.body().decode().strip()
            return self.send(200, {})
        if url.path != "/mcp":
            self.hang()
        if url.path == "/revoke":
            form = urllib.parse.parse_qs(self.body().decode())
            hint = form.get("token_type_hint", ["-"])[0]
            print(f"revoke {hint} {form['token'][0]}", flush=True)
            if control[0] == "revoke-fails":
                return self.send(503, {"error": "server_error"})
            tokens.pop(form["token"][0], None)
            refresh.pop(form["token"][0], None)
            return self.send(200)
        if url.path == "/register":
            asked = json.loads(self.body())
            return self.send(201, dict(asked, client_id="fake-client"))
        if url.path == "/token":
            form = urllib.parse.parse_qs(self.body().decode())
            grant = form["grant_type"][0]
            if grant != "refresh_token":
                print(f"token {grant}", flush=True)
            if grant == "refresh_token":
                rt = form["refresh_token"][0]
                age = time.time() - refresh.get(rt, 0)
                print(f"token refresh_token age={age:.1f} {control[0]}", flush=True)
                if control[0] == "503":
                    return self.send(503, {"error": "server_error"})
                if control[0] == "unavailable":
                    return self.send(400, {"error": "temporarily_unavailable"})
                if rt not in refresh or control[0] == "invalid_grant":
                    return self.send(400, {"error": "invalid_grant"})
                del refresh[rt]  # rotation: each refresh token once
            return self.send(200, issue())
        if url.path != "/mcp":
            return self.send(404, {"error": "not found"})
        auth = self.headers.get("authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
        if tokens.get(token, 0) < time.time() or control[0] == "reject":
            challenge = (f'Bearer error="invalid_token", resource_metadata='
                         f'"{BASE}/.well-known/oauth-protected-resource/mcp"')
            return self.send(401, {"error": "invalid_token"}, [("www-authenticate", challenge)])
        message = json.loads(self.body())
        method, mid = message.get("method"), message.get("id")
        if mid is None:
            return self.send(202)
        if method == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "oauth-fake", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "whoami", "inputSchema": {"type": "object"}}]}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": f"token {token}"}]}
        elif method == "ping":
            result = {}
        else:
            return self.send(200, {"jsonrpc": "2.0", "id": mid,
                                   "error": {"code": -32601, "message": "no such method"}})
        self.send(200, {"jsonrpc": "2.0", "id": mid, "result": result})


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
