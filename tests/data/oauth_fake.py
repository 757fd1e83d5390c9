"""A small OAuth-protected MCP server with its own authorization server,
for the login tests mcpd's real example cannot do (DESIGN §17): short-lived
tokens with refresh and rotation, and authorization servers that break one
check each.

Usage: python3 oauth_fake.py PORT MODE. Serves http://localhost:PORT/mcp
(tools/call of `whoami`), its protected resource metadata and the
authorization server's (issuer http://localhost:PORT/). MODE: `ok`,
`no-s256` (no S256 in code_challenge_methods_supported), `wrong-issuer`
(metadata names another issuer), `wrong-resource` (the PRM's resource is
another server), `step-up` (tokens hold the scopes their authorization
asked for, `mcp` when none; tool `admin` needs scope `admin`, tool `never`
needs scope `never`, which is never granted: a call without the scope is
answered `403 insufficient_scope` naming it). Access tokens live 3 s (300 s
in `step-up`; an optional third argument sets their lifetime in seconds);
each token request prints one line (`token authorization_code`, `token
refresh_token age=SECONDS`) to stdout, each authorization request one
(`authorize SCOPE`). `client-credentials`: the token endpoint also grants
`client_credentials` to client `fake-cc` with secret `s3cret` (Basic or in
the body), without a refresh token.

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

import base64
import json
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
MODE = sys.argv[2]
BASE = f"http://localhost:{PORT}"
LIFETIME = int(sys.argv[3]) if len(sys.argv) > 3 else 300 if MODE == "step-up" else 3
tokens = {}  # access token -> expiry
scopes = {}  # access token, refresh token or code -> the scopes granted
refresh = {}  # refresh token -> when it was issued
counter = [0]
control = ["ok"]
NEEDS = {"admin": "admin", "never": "never"} if MODE == "step-up" else {}


def issue(granted):
    counter[0] += 1
    access, rt = f"at-{counter[0]}", f"rt-{counter[0]}"
    tokens[access] = time.time() + LIFETIME
    scopes[access] = scopes[rt] = granted
    refresh[rt] = time.time()
    return {"access_token": access, "token_type": "Bearer", "expires_in": LIFETIME,
            "refresh_token": rt, "scope": " ".join(granted)}


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
                "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
                "code_challenge_methods_supported": methods,
                "token_endpoint_auth_methods_supported": ["client_secret_post"] if MODE == "client-credentials" else ["none"],
                "scopes_supported": ["mcp"],
                "revocation_endpoint": f"{BASE}/revoke",
            })
        if url.path == "/authorize":
            q = urllib.parse.parse_qs(url.query)
            asked = q.get("scope", [""])[0]
            print(f"authorize {asked}", flush=True)
            code = f"code-{len(scopes)}"
            scopes[code] = [s for s in asked.split() if s != "never"] or ["mcp"]
            target = q["redirect_uri"][0] + "?" + urllib.parse.urlencode(
                {"code": code, "state": q["state"][0]})
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
            if grant == "client_credentials":
                basic = self.headers.get("authorization", "")
                sent = (base64.b64decode(basic[6:]).decode() if basic.startswith("Basic ")
                        else f'{form.get("client_id", [""])[0]}:{form.get("client_secret", [""])[0]}')
                if MODE != "client-credentials" or sent != "fake-cc:s3cret":
                    return self.send(401, {"error": "invalid_client"})
                return self.send(200, {k: v for k, v in issue(["mcp"]).items() if k != "refresh_token"})
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
                return self.send(200, issue(scopes.get(rt, ["mcp"])))
            return self.send(200, issue(scopes.get(form.get("code", [""])[0], ["mcp"])))
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
            names = ["whoami", *NEEDS]
            result = {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in names]}
        elif method == "tools/call" and NEEDS.get(message["params"]["name"], "mcp") not in scopes[token] + ["mcp"]:
            needed = NEEDS[message["params"]["name"]]
            challenge = (f'Bearer error="insufficient_scope", scope="{needed}", resource_metadata='
                         f'"{BASE}/.well-known/oauth-protected-resource/mcp"')
            return self.send(403, {"error": "insufficient_scope"}, [("www-authenticate", challenge)])
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": f"token {token}"}]}
        elif method == "ping":
            result = {}
        else:
            return self.send(200, {"jsonrpc": "2.0", "id": mid,
                                   "error": {"code": -32601, "message": "no such method"}})
        self.send(200, {"jsonrpc": "2.0", "id": mid, "result": result})


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
