#!/usr/bin/env python3
"""A healthy unit's call latency while another unit reads a huge tool list.

Issue 32, item 6: a server whose one tool has a 14 MB input schema, started
again and again, must not hold up another unit's hosts. The daemon's
runtime has one thread: a list of megabytes is read and published on a
blocking thread (`upstream::LARGE`). Not a target of bench/run (it needs
minutes of restarts); run it before and after a change:

    cargo build --release --bins --examples
    bench/list_latency.py [SECONDS]

It starts `mcpd --user --no-bus` on two units, `big` (this script as the
server, with `--serve`) and `ok` (the fixture), attaches one host to `ok`
through `mcpctl bridge`, and calls `echo` every 5 ms: first for SECONDS
quietly, then for SECONDS while `big` is restarted every 1.5 s. It prints
p50, p99 and the slowest call of each.
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE = os.path.join(ROOT, "target", "release")


def serve():
    schema = {"type": "object", "properties": {
        f"p{i}": {"type": "string", "description": "x" * 100} for i in range(95000)}}
    def send(m):
        sys.stdout.write(json.dumps(m, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    for line in sys.stdin:
        m = json.loads(line)
        if "id" not in m or "method" not in m:
            continue
        if m["method"] == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "big", "version": "1"}}
        elif m["method"] == "tools/list":
            result = {"tools": [{"name": "t", "inputSchema": schema}]}
        elif m["method"] == "ping":
            result = {}
        else:
            send({"jsonrpc": "2.0", "id": m["id"], "error": {"code": -32601, "message": "no"}})
            continue
        send({"jsonrpc": "2.0", "id": m["id"], "result": result})


def measure(seconds):
    with tempfile.TemporaryDirectory() as tmp:
        units = os.path.join(tmp, "units")
        run = os.path.join(tmp, "run")
        os.makedirs(units)
        os.makedirs(run, mode=0o700)
        with open(os.path.join(units, "big.kdl"), "w") as f:
            f.write(f'stdio {{\n    command "{sys.executable}" "{os.path.abspath(__file__)}" "--serve"\n}}\n'
                    'protocol "legacy"\nstartup-timeout "60s"\n')
        with open(os.path.join(units, "ok.kdl"), "w") as f:
            f.write(f'stdio {{\n    command "{RELEASE}/examples/mcp-fixture" "--chatter" "0"\n}}\n')
        env = dict(os.environ, XDG_RUNTIME_DIR=run)
        env.pop("DBUS_SESSION_BUS_ADDRESS", None)
        env.pop("MCPD_RUNTIME_DIR", None)
        daemon = subprocess.Popen([f"{RELEASE}/mcpd", "--user", "--no-bus", "--units", units],
                                  env=env, stderr=subprocess.DEVNULL)
        ctl = lambda *a: subprocess.run([f"{RELEASE}/mcpctl", "--user", *a], env=env,
                                        capture_output=True, text=True)
        try:
            deadline = time.monotonic() + 60
            while "2 running" not in ctl("status").stdout:
                if time.monotonic() > deadline:
                    sys.exit("the units did not start")
                time.sleep(0.1)
            host = subprocess.Popen([f"{RELEASE}/mcpctl", "--user", "bridge", "ok"], env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            def rpc(m):
                host.stdin.write((json.dumps(m) + "\n").encode())
                host.stdin.flush()
                while True:
                    r = json.loads(host.stdout.readline())
                    if r.get("id") == m["id"]:
                        return r
            rpc({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "latency", "version": "1"}}})
            n = [0]
            def calls(what, restarting):
                stop = time.monotonic() + seconds
                if restarting:
                    def restarter():
                        while time.monotonic() < stop:
                            ctl("restart", "big")
                            time.sleep(1.5)
                    threading.Thread(target=restarter, daemon=True).start()
                lat = []
                while time.monotonic() < stop:
                    n[0] += 1
                    t = time.perf_counter()
                    rpc({"jsonrpc": "2.0", "id": n[0], "method": "tools/call",
                         "params": {"name": "echo", "arguments": {"text": "x"}}})
                    lat.append((time.perf_counter() - t) * 1000)
                    time.sleep(0.005)
                lat.sort()
                print(f"{what}: {len(lat)} calls, p50 {lat[len(lat) // 2]:.2f} ms, "
                      f"p99 {lat[int(len(lat) * 0.99)]:.2f} ms, slowest {lat[-1]:.1f} ms")
            calls("quiet", False)
            calls("big restarting", True)
            host.stdin.close()
            host.wait()
        finally:
            daemon.terminate()
            daemon.wait()


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        measure(float(sys.argv[1]) if sys.argv[1:] else 10.0)
