"""A minimal OTLP/HTTP (protobuf) receiver for mcpd's telemetry tests.

Decodes what arrives at /v1/traces and /v1/metrics with the OpenTelemetry
project's own protobuf messages (opentelemetry-proto, pinned in .ci/run)
and prints one JSON line per span and per metric data point on stdout.
The first line is `listening PORT` (it binds 127.0.0.1:0).

--mode ok (default): answers 200. slow: answers after 10 s. refuse: 503.
"""

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

LOCK = threading.Lock()


def emit(obj):
    with LOCK:
        sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
        sys.stdout.flush()


def attrs(kvs):
    out = {}
    for kv in kvs:
        v = kv.value
        which = v.WhichOneof("value")
        out[kv.key] = getattr(v, which) if which else None
    return out


class Handler(BaseHTTPRequestHandler):
    mode = "ok"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        emit({"request": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}})
        if self.mode == "slow":
            time.sleep(10)
        if self.mode == "refuse":
            self.send_response(503)
            self.end_headers()
            return
        if self.path == "/v1/traces":
            req = ExportTraceServiceRequest.FromString(body)
            for rs in req.resource_spans:
                resource = attrs(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        emit({"span": {
                            "name": s.name,
                            "kind": s.kind,
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent_span_id": s.parent_span_id.hex(),
                            "trace_state": s.trace_state,
                            "attributes": attrs(s.attributes),
                            "status": s.status.code,
                            "resource": resource,
                        }})
        elif self.path == "/v1/metrics":
            req = ExportMetricsServiceRequest.FromString(body)
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        for p in getattr(m, kind).data_points:
                            point = {"name": m.name, "unit": m.unit, "kind": kind,
                                     "attributes": attrs(p.attributes)}
                            if kind == "histogram":
                                point["count"] = p.count
                                point["bounds"] = list(p.explicit_bounds)
                            else:
                                point["value"] = p.as_int
                            emit({"metric": point})
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="ok", choices=["ok", "slow", "refuse"])
    args = parser.parse_args()
    Handler.mode = args.mode
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    emit_port = server.server_address[1]
    sys.stdout.write(f"listening {emit_port}\n")
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
