#!/usr/bin/env python3
"""Instructions the daemon executes per tool call through `mcpctl bridge`.

Counts with valgrind's callgrind, which counts instructions rather than
time: the figure repeats run to run whatever else the machine is doing, so
it can judge a change to the session path that timings on a noisy machine
cannot. It is not a target of bench/run (valgrind runs the daemon some 50
times slower); run it before and after a change:

    cargo build --release --bins --examples
    [PROTOCOL=auto] bench/instructions.py [CALLS] [--keep DIR] [--pace MS] [--http] [--progress] [--telemetry]

It starts `mcpd --user --no-bus` under callgrind with one fixture unit
(`--chatter 0`, logging at the default, as bench/run does), attaches one host through
`mcpctl bridge`, and makes `echo` calls one at a time. It does so twice,
with 100 and with 100 + CALLS calls (default 1000), and prints the
difference divided by CALLS: start-up and shutdown cancel out. With
`--keep DIR` the two runs' callgrind files are kept there, for
`callgrind_annotate --inclusive=yes DIR/1100-callgrind.out` (where the
instructions go).

With `--http` the host is an HTTP client instead (Python's http.client,
one keep-alive connection, a session with a token, `Accept`
both JSON and SSE as the SDKs send) on the daemon's endpoint
(`/mcp/u0`, `mcpd.kdl` listening on a free loopback port): the figure is
then the daemon's instructions per HTTP tool call.

With `--progress` each call carries `_meta.progressToken`, as the SDKs'
clients send it (rmcp's on every request, the benchmark's host among
them): the daemon then gives the request a token of its own.

With `--telemetry` the daemon exports OpenTelemetry (`telemetry` in its
`mcpd.kdl`, `sample-ratio 1.0`) to a real OTLP/HTTP receiver
(`tests/data/otlp_receiver.py` in `target/py-otel`): run it with and
without to judge telemetry's cost per call (issue 53: within +15 %).

Calls are paced, `--pace MS` apart (default 10): each call's work (its
answer, the line the fixture writes to stderr for it, the call-log
batch's timer) is done before the next call starts, so every call costs
what a lone call costs and the figure repeats within about a thousand
instructions. Back to back (`--pace 0`) the same binary read anywhere
from 31k to 39k on this machine, as the load decided how many wake-ups
of the daemon's loop each call's events shared.
"""

import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE = os.path.join(ROOT, "target", "release")
FIXTURE = os.path.join(RELEASE, "examples", "mcp-fixture")


def wait_for(what, cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            sys.exit(f"instructions.py: {what} within {timeout:.0f} s: no")
        time.sleep(0.05)


class Bridge:
    """A host through `mcpctl bridge u0`, JSON-RPC lines."""

    def __init__(self, env):
        self.proc = subprocess.Popen(
            [os.path.join(RELEASE, "mcpctl"), "--user", "bridge", "u0"],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self.pending = b""

    def request(self, n, method, params):
        line = {"jsonrpc": "2.0", "id": n, "method": method, "params": params}
        self.proc.stdin.write((json.dumps(line) + "\n").encode())
        while b"\n" not in self.pending:
            chunk = self.proc.stdout.read(65536)
            if not chunk:
                sys.exit("instructions.py: the bridge closed its stdout")
            self.pending += chunk
        answer, self.pending = self.pending.split(b"\n", 1)
        return json.loads(answer)

    def notify(self, method):
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method}).encode() + b"\n")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class Http:
    """A host over the daemon's HTTP endpoint: one keep-alive connection."""

    def __init__(self, addr, token):
        host, port = addr.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                        "Accept": "application/json, text/event-stream"}

    def post(self, body):
        self.conn.request("POST", "/mcp/u0", body=json.dumps(body), headers=self.headers)
        response = self.conn.getresponse()
        data = response.read()
        if "mcp-session-id" in response.headers:
            self.headers["Mcp-Session-Id"] = response.headers["mcp-session-id"]
            self.headers["Mcp-Protocol-Version"] = "2025-06-18"
        return response, data

    def request(self, n, method, params):
        response, data = self.post({"jsonrpc": "2.0", "id": n, "method": method, "params": params})
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            for line in data.decode().splitlines():
                if line.startswith("data: "):
                    message = json.loads(line[6:])
                    if message.get("id") == n:
                        return message
            sys.exit(f"instructions.py: no answer in {data!r}")
        return json.loads(data)

    def notify(self, method):
        self.post({"jsonrpc": "2.0", "method": method})

    def close(self):
        self.conn.request("DELETE", "/mcp/u0", headers=self.headers)
        self.conn.getresponse().read()
        self.conn.close()


def receiver():
    """tests/data/otlp_receiver.py, listening: (process, port)."""
    python = os.path.join(ROOT, "target", "py-otel", "bin", "python")
    if not os.access(python, os.X_OK):
        sys.exit(f"instructions.py: {python} is missing (.ci/run installs it)")
    proc = subprocess.Popen([python, os.path.join(ROOT, "tests", "data", "otlp_receiver.py")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    first = proc.stdout.readline()
    if not first.startswith("listening "):
        proc.kill()
        sys.exit(f"instructions.py: the OTLP receiver said {first!r}")
    # Drained, so the receiver never blocks on its stdout.
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, int(first.split()[1])


def run(calls, keep=None, pace=0.0, over_http=False, progress=False, telemetry=None):
    """Total instructions of one daemon run making `calls` calls."""
    work = tempfile.mkdtemp(prefix="mcpd-instructions-")
    try:
        runtime, units, state = (os.path.join(work, d) for d in ("run", "units", "state"))
        for d in (runtime, units, state):
            os.mkdir(d, 0o700)
        with open(os.path.join(units, "u0.kdl"), "w") as f:
            # The fixture speaks both eras: PROTOCOL picks which (the 2025
            # era by default, the figure's history).
            f.write(f'stdio {{\n    command "{FIXTURE}" "--name" "u0" "--chatter" "0"\n}}\n'
                    f'protocol "{os.environ.get("PROTOCOL", "legacy")}"\n')
        # The log configuration a user's daemon has by default.
        env = dict(os.environ, XDG_RUNTIME_DIR=runtime, MCPD_STATE_DIR=state)
        env.pop("MCPD_LOG", None)
        env.pop("DBUS_SESSION_BUS_ADDRESS", None)
        out = os.path.join(work, "callgrind.out")
        config = []
        if over_http or telemetry:
            settings = os.path.join(work, "mcpd.kdl")
            with open(settings, "w") as f:
                if over_http:
                    f.write('http {\n    listen "127.0.0.1:0"\n}\n')
                if telemetry:
                    f.write(f'telemetry {{\n    otlp "http://127.0.0.1:{telemetry}"\n'
                            '    sample-ratio 1.0\n}\n')
            config = ["--config", settings]
        daemon = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             os.path.join(RELEASE, "mcpd"), "--user", "--no-bus", "--units", units] + config,
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        lines = []
        threading.Thread(target=lambda: lines.extend(daemon.stderr), daemon=True).start()
        wait_for("the unit running", lambda: any("running" in l for l in lines))
        if over_http:
            wait_for("the endpoint listening", lambda: any("listening on " in l for l in lines))
            addr = next(l.split("listening on ")[1].split()[0] for l in lines if "listening on " in l)
            token = subprocess.run(
                [os.path.join(RELEASE, "mcpctl"), "--user", "token", "new", "instructions"],
                env=env, check=True, capture_output=True, text=True).stdout.strip()
            host = Http(addr, token)
        else:
            host = Bridge(env)
        host.request(0, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                       "clientInfo": {"name": "instructions", "version": "1"}})
        host.notify("notifications/initialized")
        for n in range(1, calls + 1):
            params = {"name": "echo", "arguments": {"text": "x"}}
            if progress:
                params["_meta"] = {"progressToken": n}
            answer = host.request(n, "tools/call", params)
            if "result" not in answer:
                sys.exit(f"instructions.py: {answer}")
            time.sleep(pace)
        host.close()
        daemon.terminate()
        daemon.wait(timeout=120)
        if keep:
            os.makedirs(keep, exist_ok=True)
            for name in os.listdir(work):
                if name.startswith("callgrind.out"):
                    shutil.copy(os.path.join(work, name), os.path.join(keep, f"{calls}-{name}"))
        total = 0
        for name in os.listdir(work):
            if name.startswith("callgrind.out"):
                with open(os.path.join(work, name)) as f:
                    for line in f:
                        m = re.match(r"(?:summary|totals): (\d+)", line)
                        if m:
                            total += int(m.group(1))
                            break
        return total
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    args = sys.argv[1:]
    keep = None
    if "--keep" in args:
        at = args.index("--keep")
        if at + 1 >= len(args):
            sys.exit("instructions.py: --keep needs a directory")
        keep = args[at + 1]
        del args[at:at + 2]
    pace = 10.0
    if "--pace" in args:
        at = args.index("--pace")
        try:
            pace = float(args[at + 1])
        except (IndexError, ValueError):
            sys.exit("instructions.py: --pace needs milliseconds")
        del args[at:at + 2]
    over_http = "--http" in args
    if over_http:
        args.remove("--http")
    progress = "--progress" in args
    if progress:
        args.remove("--progress")
    telemetry = "--telemetry" in args
    if telemetry:
        args.remove("--telemetry")
    if len(args) > 1 or (args and not args[0].isdigit()):
        sys.exit("usage: bench/instructions.py [CALLS] [--keep DIR] [--pace MS] [--http] [--progress] [--telemetry]")
    calls = int(args[0]) if args else 1000
    if not shutil.which("valgrind"):
        sys.exit("instructions.py: valgrind is not installed")
    for binary in (FIXTURE, os.path.join(RELEASE, "mcpd"), os.path.join(RELEASE, "mcpctl")):
        if not os.access(binary, os.X_OK):
            sys.exit(f"instructions.py: {binary} is missing (cargo build --release --bins --examples)")
    collector, port = receiver() if telemetry else (None, None)
    try:
        base = run(100, keep, pace / 1000, over_http, progress, port)
        more = run(100 + calls, keep, pace / 1000, over_http, progress, port)
    finally:
        if collector:
            collector.kill()
            collector.wait()
    what = "HTTP" if over_http else "bridged"
    if progress:
        what += " (with a progress token)"
    if telemetry:
        what += " (telemetry on, sample-ratio 1.0)"
    print(f"daemon instructions per {what} tools/call: {(more - base) / calls:,.0f}"
          f" (callgrind, {calls} calls, {pace:g} ms apart)")


if __name__ == "__main__":
    main()
