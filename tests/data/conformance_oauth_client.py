"""mcpd as the client of the official conformance suite's auth scenarios.

Usage (by `conformance client --command "python3 THIS MCPD MCPCTL"`, which
appends the mock server's URL): starts a user instance of mcpd with one
unit, `conf`, for that URL with an `oauth { }` block (the pre-registered
client and secret of MCP_CONFORMANCE_CONTEXT when the scenario gives
them; mcpd.kdl names a client metadata document for the CIMD scenarios),
waits for it to need a login, runs `mcpctl auth login conf --no-browser`,
opens the printed URL as a browser would (the suite's authorization
endpoint redirects at once to mcpctl's listener), waits for the unit to
run, and calls its first tool with `mcpctl call`. When the unit needs a
login again (a step-up: the server answered 403 insufficient_scope, at
connect or to the call), it logs in again, at most LOGINS logins in all. The suite judges what
its servers saw. Exits 0 when the call was made, 1 otherwise; every wait
is bounded, and the daemon is stopped on the way out.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

WAIT = 45.0
# The most logins a run makes: the first and two step-ups (mcpd asks for a
# scope the server goes on refusing at two logins, DESIGN §17).
LOGINS = 3


def log(*what):
    print("conformance_oauth_client:", *what, file=sys.stderr, flush=True)


def until(what, check, wait=WAIT):
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out after {wait} s waiting for {what}")


def main(mcpd, mcpctl, url):
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    top = tempfile.mkdtemp(prefix="mcpd-conformance-")
    units, runtime, state, config = (os.path.join(top, d) for d in ("units", "run", "state", "config"))
    for d in (units, runtime, state, os.path.join(config, "mcpd")):
        os.makedirs(d, mode=0o700)
    with open(os.path.join(config, "mcpd", "mcpd.kdl"), "w") as f:
        f.write('oauth {\n    client-metadata-url "https://conformance-test.local/client-metadata.json"\n}\n')
    keys = []
    credentials = ""
    if context.get("client_id"):
        keys.append(f"client-id {json.dumps(context['client_id'])}")
    if context.get("client_secret"):
        secret = os.path.join(top, "secret")
        with open(secret, "w") as f:
            f.write(context["client_secret"])
        os.chmod(secret, 0o600)
        credentials = f'credentials {{\n    load "conf" {json.dumps(secret)}\n}}\n'
        keys.append('client-secret credential="conf"')
    if context.get("name", "").startswith("auth/client-credentials"):
        keys.append('grant "client-credentials"')
    block = "oauth {\n" + "".join(f"        {k}\n" for k in keys) + "    }" if keys else "oauth"
    # An HTTP unit speaks 2026-07-28 only when it pins it (DESIGN §12).
    wire = os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION")
    protocol = f"protocol {json.dumps(wire)}\n" if wire == "2026-07-28" else ""
    with open(os.path.join(units, "conf.kdl"), "w") as f:
        f.write(f"{credentials}http {json.dumps(url)} {{\n    {block}\n}}\n{protocol}")
    env = dict(os.environ, XDG_RUNTIME_DIR=runtime, MCPD_STATE_DIR=state, XDG_CONFIG_HOME=config)
    env.pop("DBUS_SESSION_BUS_ADDRESS", None)
    env.setdefault("MCPD_LOG", "debug")
    daemon = subprocess.Popen(
        [mcpd, "--user", "--no-bus", "--units", units], env=env, stdin=subprocess.DEVNULL, stderr=sys.stderr
    )
    login = None

    def ctl(*args, timeout=WAIT):
        return subprocess.run(
            [mcpctl, "--user", *args], env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )

    def status():
        out = ctl("--json", "status", "conf")
        try:
            value = json.loads(out.stdout)
        except ValueError:
            return {}
        return value[0] if isinstance(value, list) and value else value

    logins = []

    def log_in():
        nonlocal login
        logins.append(1)
        login = subprocess.Popen(
            [mcpctl, "--user", "auth", "login", "conf", "--no-browser"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=sys.stderr,
            text=True,
        )
        lines = []
        until("mcpctl to print the URL", lambda: lines.append(login.stdout.readline()) or lines[-1].startswith("http"))
        address = lines[-1].strip()
        log("opening", address)
        try:
            with urllib.request.urlopen(address, timeout=WAIT) as page:
                log("browser ended at", page.geturl(), page.status)
        except urllib.error.HTTPError as e:
            log("browser ended with", e.code, e.geturl())
        login.wait(timeout=WAIT)
        log("mcpctl auth login exited", login.returncode)

    def settled():
        value = status()
        return value if value.get("state") in ("needs-login", "running") else None

    try:
        until("unit conf to need a login or run", settled)
        # A login, and again each time mcpd says the unit needs one (a
        # step-up: the server answered 403 insufficient_scope, at connect
        # or to the call), within LOGINS; then a call of its first tool.
        while True:
            now = settled() or {}
            if now.get("state") == "needs-login":
                if len(logins) >= LOGINS:
                    break
                before = now.get("generation")
                log_in()
                until("unit conf to start again", lambda: (settled() or {}).get("generation", before) != before)
                continue
            tools = now.get("tools") or []
            log("tools", tools)
            if not tools:
                break
            out = ctl("call", "conf", tools[0], "{}")
            log("call", out.returncode, out.stdout.strip()[:200], out.stderr.strip()[:300])
            if "needs a login" not in out.stdout + out.stderr or len(logins) >= LOGINS:
                break
            until("unit conf to need a login", lambda: status().get("state") == "needs-login")
        return 0
    finally:
        if login is not None and login.poll() is None:
            login.kill()
            login.wait()
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        subprocess.run(["rm", "-rf", top])


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
