//! OpenTelemetry (DESIGN §18) through the real `mcpd`, exporting to a real
//! OTLP/HTTP receiver (tests/data/otlp_receiver.py: the OpenTelemetry
//! project's protobuf messages from PyPI, pinned in .ci/run): a host's
//! call with a `traceparent` gives mcpd's server span in the host's trace
//! and its client span beneath, the server's request carries the client
//! span's `traceparent`, and the conventions' histograms arrive, for a
//! 2025 host and a 2026-07-28 host through the bridge and through the
//! HTTP endpoint. Over an HTTP upstream (the Python SDK's example server
//! behind tests/data/traced_http.py, which prints what each POST carried)
//! the client span's context goes in the `traceparent` header as well.

use std::io::{BufRead, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::helper::{BOUND, Daemon, root};

use super::http::{JSON, endpoint_with, request};

/// A receiver the test started, and what it printed.
struct Receiver {
    child: Child,
    port: u16,
    lines: mpsc::Receiver<String>,
    seen: Vec<Value>,
}

impl Receiver {
    fn start(mode: &str) -> Self {
        let python = root().join("target/py-otel/bin/python");
        assert!(
            python.exists(),
            "{} is missing: .ci/run installs it",
            python.display()
        );
        let mut child = Command::new(python)
            .arg(root().join("tests/data/otlp_receiver.py"))
            .args(["--mode", mode])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the receiver");
        let lines = reader(child.stdout.take().expect("stdout"));
        let first = lines.recv_timeout(BOUND).expect("the receiver's port");
        let port = first
            .strip_prefix("listening ")
            .and_then(|p| p.trim().parse().ok())
            .expect("listening PORT");
        Self {
            child,
            port,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads what arrives until `done` holds (bounded).
    fn until(&mut self, what: &str, done: impl Fn(&[Value]) -> bool) {
        let deadline = std::time::Instant::now() + BOUND;
        while !done(&self.seen) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(
                !left.is_zero(),
                "{what}: not received within {BOUND:?}; got:\n{}",
                self.seen
                    .iter()
                    .map(Value::to_string)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            if let Ok(line) = self
                .lines
                .recv_timeout(left.min(Duration::from_millis(200)))
            {
                self.seen
                    .push(serde_json::from_str(&line).expect("a JSON line"));
            }
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Lines of `out`, read on a thread.
fn reader(out: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// A host on `mcpctl bridge demo`: raw lines both ways.
struct Host {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Host {
    fn start(runtime: &std::path::Path) -> Self {
        Self::to(runtime, "demo")
    }

    /// A host on `mcpctl bridge UNIT`.
    fn to(runtime: &std::path::Path, unit: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mcpctl"))
            .args(["--user", "bridge", unit])
            .env("XDG_RUNTIME_DIR", runtime)
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .env_remove("MCPD_RUNTIME_DIR")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn mcpctl bridge");
        let lines = reader(child.stdout.take().expect("stdout"));
        Self { child, lines }
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{message}").expect("write");
    }

    /// The answer to request `id` (bounded).
    fn answer(&mut self, id: u64) -> Value {
        let deadline = std::time::Instant::now() + BOUND;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no answer to {id} within {BOUND:?}"));
            let message: Value = serde_json::from_str(&line).expect("JSON");
            if message["id"] == json!(id) {
                return message;
            }
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const MODERN: &str = "2026-07-28";

fn traceparent(trace: &str, span: &str) -> String {
    format!("00-{trace}-{span}-01")
}

fn call(id: u64, text: &str, meta: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "echo", "arguments": {"text": text}, "_meta": meta}})
}

fn modern_meta(parent: &str) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw-modern", "version": "1"},
        "traceparent": parent,
    })
}

fn spans_of<'a>(seen: &'a [Value], trace: &str) -> Vec<&'a Value> {
    seen.iter()
        .filter_map(|v| v.get("span"))
        .filter(|s| s["trace_id"] == trace)
        .collect()
}

/// The server span (kind 2) and client span (kind 3) of `trace`, once
/// both arrived.
fn pair<'a>(seen: &'a [Value], trace: &str) -> Option<(&'a Value, &'a Value)> {
    let spans = spans_of(seen, trace);
    let server = spans.iter().find(|s| s["kind"] == 2)?;
    let client = spans.iter().find(|s| s["kind"] == 3)?;
    Some((server, client))
}

fn has_metric(seen: &[Value], name: &str) -> bool {
    seen.iter()
        .filter_map(|v| v.get("metric"))
        .any(|m| m["name"] == name && m["count"].as_u64().is_some_and(|n| n >= 1))
}

/// A daemon with unit demo (the fixture), an HTTP endpoint and
/// `telemetry` toward `receiver`.
fn daemon(
    receiver: &Receiver,
    telemetry: &str,
) -> (
    Daemon,
    tempfile::TempDir,
    tempfile::TempDir,
    std::net::SocketAddr,
) {
    daemon_with(receiver, telemetry, &[])
}

/// [`daemon`] with more units: (file name, text).
fn daemon_with(
    receiver: &Receiver,
    telemetry: &str,
    more: &[(&str, String)],
) -> (
    Daemon,
    tempfile::TempDir,
    tempfile::TempDir,
    std::net::SocketAddr,
) {
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("demo.kdl"),
        // One process, translated for the 2025 host (pinned: the spans
        // name the unit; a lane's would name `demo@2025-11-25`).
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\" \"--tools\" \"sleep\"\n}\nprotocol \"2026-07-28\"\n",
    )
    .expect("write");
    for (file, text) in more {
        std::fs::write(units.path().join(file), text).expect("write");
    }
    let settings = format!(
        "http {{\n    listen \"127.0.0.1:0\"\n    auth \"none\"\n}}\ntelemetry {{\n    otlp \"http://127.0.0.1:{}\"\n{telemetry}}}\n",
        receiver.port
    );
    let (mut d, dir, addr) = endpoint_with(units.path(), &settings, &[]);
    let on = format!("telemetry to http://127.0.0.1:{}/", receiver.port);
    assert!(d.seen.iter().any(|l| l.contains(&on)), "{:#?}", d.seen);
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    (d, units, dir, addr)
}

#[test]
fn a_hosts_trace_goes_through_mcpd_to_the_server_and_reaches_the_collector_in_both_eras() {
    let mut receiver = Receiver::start("ok");
    let (mut d, _units, dir, addr) = daemon(
        &receiver,
        "    service-name \"mcpd-test\"\n    header \"x-api-key\" \"k1\"\n",
    );
    let runtime = d.runtime_dir().expect("runtime").to_owned();

    // A 2025 host through the bridge, its call in trace A.
    let (trace_a, parent_a) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let mut host = Host::start(&runtime);
    host.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}));
    host.answer(1);
    host.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    host.send(&call(
        2,
        "traced",
        json!({"traceparent": traceparent(trace_a, parent_a), "tracestate": "vendor=x"}),
    ));
    let answer = host.answer(2);
    assert!(answer.to_string().contains("traced"), "{answer}");
    // The server was sent a child of the host's trace: a new span id.
    let logged = d.wait_for(&format!("traceparent 00-{trace_a}-"));
    let sent_span = logged
        .split(&format!("traceparent 00-{trace_a}-"))
        .nth(1)
        .and_then(|rest| rest.get(..16))
        .expect("the span id the server got")
        .to_owned();
    assert_ne!(sent_span, parent_a, "{logged}");

    // A 2026-07-28 host through the bridge (no initialize), trace B.
    let trace_b = "0af7651916cd43dd8448eb211c80319c";
    let mut modern = Host::start(&runtime);
    modern.send(&call(
        5,
        "modern",
        modern_meta(&traceparent(trace_b, "b7ad6b7169203331")),
    ));
    let answer = modern.answer(5);
    assert!(answer.to_string().contains("modern"), "{answer}");

    // A 2026-07-28 host through the HTTP endpoint, trace C.
    let trace_c = "11111111111111112222222222222222";
    let body = call(
        7,
        "over http",
        modern_meta(&traceparent(trace_c, "3333333333333333")),
    )
    .to_string();
    let mut headers: Vec<(&str, &str)> = JSON.to_vec();
    headers.extend([
        ("MCP-Protocol-Version", MODERN),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "echo"),
    ]);
    let (status, _, answer) = request(addr, "POST", "/mcp/demo", &headers, body.as_bytes());
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("over http"), "{answer}");

    receiver.until(
        "the spans of the three traces and both histograms",
        |seen| {
            [trace_a, trace_b, trace_c]
                .iter()
                .all(|t| pair(seen, t).is_some())
                && has_metric(seen, "mcp.server.operation.duration")
                && has_metric(seen, "mcp.client.operation.duration")
        },
    );
    let seen = &receiver.seen;
    for (trace, parent, version, transport) in [
        (trace_a, parent_a, "2025-11-25", "pipe"),
        (trace_b, "b7ad6b7169203331", MODERN, "pipe"),
        (trace_c, "3333333333333333", MODERN, "tcp"),
    ] {
        let (server, client) = pair(seen, trace).expect("both spans");
        assert_eq!(server["parent_span_id"], parent, "{server}");
        assert_eq!(client["parent_span_id"], server["span_id"], "{client}");
        for span in [server, client] {
            assert_eq!(span["name"], "tools/call echo", "{span}");
            let a = &span["attributes"];
            assert_eq!(a["mcp.method.name"], "tools/call", "{span}");
            assert_eq!(a["gen_ai.tool.name"], "echo", "{span}");
            assert_eq!(a["gen_ai.operation.name"], "execute_tool", "{span}");
            assert_eq!(a["mcpd.unit"], "demo", "{span}");
            assert!(a["jsonrpc.request.id"].is_string(), "{span}");
            assert!(a.get("error.type").is_none(), "{span}");
            assert_eq!(span["resource"]["service.name"], "mcpd-test", "{span}");
        }
        assert_eq!(
            server["attributes"]["mcp.protocol.version"], version,
            "{server}"
        );
        assert_eq!(
            server["attributes"]["network.transport"], transport,
            "{server}"
        );
        // The fixture is a stdio server.
        assert_eq!(
            client["attributes"]["network.transport"], "pipe",
            "{client}"
        );
        // The version the fixture speaks to mcpd, whichever the host's.
        assert!(
            client["attributes"]["mcp.protocol.version"].is_string(),
            "{client}"
        );
    }
    let (server_a, client_a) = pair(seen, trace_a).expect("trace A");
    assert_eq!(
        client_a["span_id"],
        sent_span.as_str(),
        "the server got the client span's context"
    );
    assert_eq!(
        server_a["attributes"]["jsonrpc.request.id"], "2",
        "{server_a}"
    );
    assert_eq!(server_a["trace_state"], "vendor=x", "{server_a}");
    // Every export carries the configured header, as protobuf.
    let exports: Vec<&Value> = seen.iter().filter(|v| v.get("request").is_some()).collect();
    assert!(
        exports.iter().all(|r| r["headers"]["x-api-key"] == "k1"
            && r["headers"]["content-type"] == "application/x-protobuf"),
        "{exports:?}"
    );
    assert!(
        exports.iter().any(|r| r["request"] == "/v1/traces"),
        "{exports:?}"
    );
    assert!(
        exports.iter().any(|r| r["request"] == "/v1/metrics"),
        "{exports:?}"
    );
    let histogram = seen
        .iter()
        .filter_map(|v| v.get("metric"))
        .find(|m| m["name"] == "mcp.server.operation.duration")
        .expect("a histogram");
    assert_eq!(histogram["unit"], "s", "{histogram}");
    assert_eq!(
        histogram["bounds"][0], 0.01,
        "the conventions' buckets: {histogram}"
    );

    // A failed call is an error span: error.type names the code.
    host.send(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "echo", "arguments": {}, "_meta": {"traceparent": traceparent("22222222222222223333333333333333", "4444444444444444")}}}));
    host.answer(3);
    receiver.until("the failed call's span", |seen| {
        pair(seen, "22222222222222223333333333333333").is_some()
    });
    let (server, _) = pair(&receiver.seen, "22222222222222223333333333333333").expect("spans");
    assert!(server["attributes"]["error.type"].is_string(), "{server}");
    assert_eq!(server["status"], 2, "an error status: {server}");

    // A call the host cancels ends both spans, as cancelled.
    let trace_d = "33333333333333334444444444444444";
    host.send(&json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
        "params": {"name": "sleep", "arguments": {"ms": 60000},
                   "_meta": {"traceparent": traceparent(trace_d, "5555555555555555")}}}));
    d.wait_for("call sleep");
    host.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 6, "reason": "the user gave up"}}),
    );
    receiver.until("the cancelled call's spans", |seen| {
        pair(seen, trace_d).is_some()
    });
    let (server, client) = pair(&receiver.seen, trace_d).expect("spans");
    for span in [server, client] {
        assert_eq!(span["attributes"]["error.type"], "cancelled", "{span}");
        assert_eq!(span["name"], "tools/call sleep", "{span}");
    }

    // mcpd's own counters: the unit's changes of state, and its server
    // running again after it crashed.
    host.send(&json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
        "params": {"name": "crash", "arguments": {"code": 3}}}));
    host.answer(4);
    d.wait_for("running again");
    let counter = |seen: &[Value], name: &str| {
        seen.iter().filter_map(|v| v.get("metric")).any(|m| {
            m["name"] == name
                && m["attributes"]["mcpd.unit"] == "demo"
                && m["value"].as_i64().is_some_and(|n| n >= 1)
        })
    };
    receiver.until("mcpd's counters", |seen| {
        counter(seen, "mcpd.server.state_changes") && counter(seen, "mcpd.server.restarts")
    });

    // Hot reload: without the section, telemetry stops.
    let settings = dir.path().join("mcpd.kdl");
    std::fs::write(
        &settings,
        "http {\n    listen \"127.0.0.1:0\"\n    auth \"none\"\n}\n",
    )
    .expect("write");
    d.wait_for("telemetry off");
    drop(host);
    drop(modern);
}

/// The Python SDK's example server over Streamable HTTP
/// (tests/data/traced_http.py), and what each POST to it carried.
struct Traced {
    child: Child,
    port: u16,
    lines: mpsc::Receiver<String>,
    posts: Vec<Value>,
}

impl Traced {
    fn start() -> Self {
        let python = root().join("target/py-everything/bin/python");
        assert!(
            python.exists(),
            "{} is missing: .ci/run installs it",
            python.display()
        );
        let mut child = Command::new(python)
            .arg(root().join("tests/data/traced_http.py"))
            .env("PYTHONWARNINGS", "ignore")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn traced_http.py");
        let lines = reader(child.stdout.take().expect("stdout"));
        let first = lines.recv_timeout(BOUND).expect("the server's port");
        let port = first
            .strip_prefix("listening ")
            .and_then(|p| p.trim().parse().ok())
            .expect("listening PORT");
        Self {
            child,
            port,
            lines,
            posts: Vec::new(),
        }
    }

    /// The first POST of `method` whose `traceparent` header or body's
    /// carries trace `trace` (bounded).
    fn post(&mut self, method: &str, trace: &str) -> Value {
        let deadline = std::time::Instant::now() + BOUND;
        let wanted = format!("00-{trace}-");
        let found = |p: &Value| {
            p["method"] == method
                && ["traceparent", "meta_traceparent"]
                    .iter()
                    .any(|k| p[k].as_str().is_some_and(|t| t.starts_with(&wanted)))
        };
        loop {
            if let Some(post) = self.posts.iter().find(|p| found(p)) {
                return post.clone();
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {method} POST in trace {trace}: {:#?}", self.posts));
            // The SDK prints lines of its own on stdout too.
            if let Ok(post) = serde_json::from_str::<Value>(&line) {
                self.posts.push(post);
            }
        }
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn over_an_http_upstream_the_client_spans_context_is_the_traceparent_header_too() {
    let mut receiver = Receiver::start("ok");
    let mut server = Traced::start();
    let web = format!("http \"http://127.0.0.1:{}/mcp\"\n", server.port);
    let (d, _units, _dir, _addr) = daemon_with(&receiver, "", &[("web.kdl", web)]);
    let runtime = d.runtime_dir().expect("runtime").to_owned();

    let trace = "5555555555555555aaaaaaaaaaaaaaaa";
    let mut host = Host::to(&runtime, "web");
    host.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}));
    host.answer(1);
    host.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    host.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "test_simple_text", "arguments": {},
        "_meta": {"traceparent": traceparent(trace, "6666666666666666"), "tracestate": "vendor=y"}}}));
    let answer = host.answer(2);
    assert!(answer["result"]["content"].is_array(), "{answer}");

    receiver.until("the call's spans", |seen| pair(seen, trace).is_some());
    let (server_span, client) = pair(&receiver.seen, trace).expect("both spans");
    assert_eq!(server_span["parent_span_id"], "6666666666666666");
    assert_eq!(client["parent_span_id"], server_span["span_id"], "{client}");
    assert_eq!(client["attributes"]["network.transport"], "tcp", "{client}");
    assert_eq!(client["attributes"]["mcpd.unit"], "web", "{client}");

    // The POST of the call: the header is the client span's context, as
    // the body's _meta is, and the host's tracestate goes on.
    let post = server.post("tools/call", trace);
    let span = client["span_id"].as_str().expect("a span id");
    let expected = format!("00-{trace}-{span}-01");
    assert_eq!(post["traceparent"], expected.as_str(), "{post}");
    assert_eq!(post["meta_traceparent"], expected.as_str(), "{post}");
    assert_eq!(post["tracestate"], "vendor=y", "{post}");
    drop(host);
}

/// The daemon's `Telemetry:` line of `mcpctl status`, if any.
fn status_line(runtime: &std::path::Path) -> Option<String> {
    let out = crate::helper::mcpctl_user(runtime, &["status"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("Telemetry: "))
        .map(str::to_owned)
}

/// (exported, dropped) of a `Telemetry:` line.
fn counts(line: &str) -> (u64, u64) {
    let words: Vec<&str> = line.split_whitespace().collect();
    let exported = words.get(1).and_then(|w| w.parse().ok()).expect("exported");
    let dropped = words.get(4).and_then(|w| w.parse().ok()).expect("dropped");
    (exported, dropped)
}

#[test]
fn a_collector_that_refuses_is_slow_or_away_never_delays_a_call_and_drops_are_counted() {
    // A port nobody listens on: bound, then let go.
    let away = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    for mode in ["refuse", "slow", "away"] {
        let mut receiver = Receiver::start(if mode == "away" { "ok" } else { mode });
        if mode == "away" {
            receiver.port = away;
        }
        let (d, _units, _dir, _addr) = daemon(&receiver, "");
        let runtime = d.runtime_dir().expect("runtime").to_owned();
        let mut host = Host::start(&runtime);
        host.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}));
        host.answer(1);
        host.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        for id in 2..6u64 {
            let parent = traceparent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
            let started = std::time::Instant::now();
            host.send(&call(id, "unaffected", json!({"traceparent": parent})));
            let answer = host.answer(id);
            assert!(
                answer.to_string().contains("unaffected"),
                "{mode}: {answer}"
            );
            // An export waits up to 5 s (10 s for the slow collector to
            // answer): a call held by it would take that long.
            assert!(
                started.elapsed() < Duration::from_secs(4),
                "{mode}: call {id} took {:?}",
                started.elapsed()
            );
            if id == 3 {
                // The first calls' batch is being exported now.
                std::thread::sleep(Duration::from_millis(1500));
            }
        }
        let deadline = std::time::Instant::now() + BOUND;
        let line = loop {
            let line = status_line(&runtime).expect("a Telemetry line while it is on");
            if counts(&line).1 >= 1 || std::time::Instant::now() > deadline {
                break line;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let (exported, dropped) = counts(&line);
        assert!(dropped >= 1, "{mode}: {line}");
        assert_eq!(exported, 0, "{mode}: {line}");
        drop(host);
        drop(d);
    }

    // Off by default: no line.
    let units = tempfile::tempdir().expect("tempdir");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_for("started 0 units");
    assert!(
        !d.seen.iter().any(|l| l.contains("telemetry to")),
        "{:#?}",
        d.seen
    );
    assert_eq!(status_line(d.runtime_dir().expect("runtime")), None);
}

/// Runs tests/data/era_client.py with `--input` (the official Python SDK's
/// client, answering elicitation and sampling) in `mode` on `mcpctl bridge
/// UNIT`: its JSON object.
fn ask_through(runtime: &std::path::Path, mode: &str, unit: &str) -> Value {
    let out = Command::new(root().join("target/py-everything/bin/python"))
        .arg(root().join("tests/data/era_client.py"))
        .args(["--input", mode, "python", env!("CARGO_BIN_EXE_mcpctl")])
        .args(["--user", "bridge", unit])
        .env("XDG_RUNTIME_DIR", runtime)
        .env("PYTHONWARNINGS", "ignore")
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .env_remove("MCPD_RUNTIME_DIR")
        .stdin(Stdio::null())
        .output()
        .expect("era_client.py");
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

/// The spans named `name` of kind `kind` (2 server, 3 client).
fn named<'a>(seen: &'a [Value], name: &str, kind: u64) -> Vec<&'a Value> {
    seen.iter()
        .filter_map(|v| v.get("span"))
        .filter(|s| s["name"] == name && s["kind"] == kind)
        .collect()
}

/// The first span named `name` of kind `kind` whose parent is `parent`.
fn child<'a>(seen: &'a [Value], parent: &Value, name: &str, kind: u64) -> Option<&'a Value> {
    named(seen, name, kind)
        .into_iter()
        .find(|s| s["trace_id"] == parent["trace_id"] && s["parent_span_id"] == parent["span_id"])
}

/// The host's span of `call` whose protocol version is `version`, on
/// unit `unit`.
fn host_span<'a>(seen: &'a [Value], call: &str, version: &str, unit: &str) -> Option<&'a Value> {
    named(seen, call, 2).into_iter().find(|s| {
        s["attributes"]["mcp.protocol.version"] == version && s["attributes"]["mcpd.unit"] == unit
    })
}

#[test]
fn the_servers_requests_to_a_host_and_input_required_rounds_are_spans_in_the_callers_trace() {
    let mut receiver = Receiver::start("ok");
    let python = |protocol: &str| {
        format!(
            "stdio {{\n    command \"{}\" \"{}\"\n}}\nprotocol \"{protocol}\"\nstartup-timeout \"90s\"\n",
            root().join("target/py-everything/bin/python").display(),
            root().join("tests/data/py_everything_stdio.py").display()
        )
    };
    // The 2026-07-28 one over HTTP: started before mcpd probes it (a
    // stdio one may not answer server/discover within the probe's 10 s
    // while Python starts on a loaded machine).
    let server = Traced::start();
    let pym = format!(
        "http \"http://127.0.0.1:{}/mcp\"\nprotocol \"2026-07-28\"\n",
        server.port
    );
    let (d, _units, _dir, _addr) = daemon_with(
        &receiver,
        "",
        &[("py.kdl", python("legacy")), ("pym.kdl", pym)],
    );
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    const LEGACY: &str = "2025-11-25";
    // Python's start is slow on a loaded machine.
    for unit in ["py", "pym"] {
        crate::helper::eventually(format!("{unit}'s tools"), Duration::from_secs(180), || {
            let out = crate::helper::mcpctl_user(&runtime, &["tools", unit]);
            String::from_utf8_lossy(&out.stdout).lines().count() >= 20
        });
    }

    // A 2025 host, a 2025 server: the server asks the host in the middle
    // of the call. Its request is a server span, child of mcpd's client
    // span of the call, and mcpd's request to the host a client span
    // beneath it.
    let run = ask_through(&runtime, "legacy", "py");
    assert_eq!(run["elicit"]["callbacks"]["elicitation"], 1, "{run:#}");
    assert_eq!(run["sample"]["callbacks"]["sampling"], 1, "{run:#}");
    for (tool, method) in [
        ("test_elicitation", "elicitation/create"),
        ("test_sampling", "sampling/createMessage"),
    ] {
        let call = format!("tools/call {tool}");
        let chain = |seen: &[Value]| {
            let host = host_span(seen, &call, LEGACY, "py")?;
            let up = child(seen, host, &call, 3)?;
            let from_server = child(seen, up, method, 2)?;
            let to_host = child(seen, from_server, method, 3)?;
            Some([up.clone(), from_server.clone(), to_host.clone()])
        };
        receiver.until(&format!("the spans of {method}"), |seen| {
            chain(seen).is_some()
        });
        let [_, from_server, to_host] = chain(&receiver.seen).expect("the chain");
        for span in [&from_server, &to_host] {
            let a = &span["attributes"];
            assert_eq!(a["mcp.method.name"], method, "{span}");
            assert_eq!(a["mcpd.unit"], "py", "{span}");
            assert_eq!(a["network.transport"], "pipe", "{span}");
            assert!(a["jsonrpc.request.id"].is_string(), "{span}");
            assert!(a.get("error.type").is_none(), "{span}");
        }
    }

    // A 2026-07-28 host, the same server: the server's request becomes
    // the call's input_required answer; its span is in the call's trace,
    // and ends once the host's retry answered it.
    let run = ask_through(&runtime, MODERN, "py");
    assert_eq!(run["elicit"]["callbacks"]["elicitation"], 1, "{run:#}");
    let call = "tools/call test_elicitation";
    receiver.until("the modern host's elicitation span", |seen| {
        host_span(seen, call, MODERN, "py")
            .and_then(|host| child(seen, host, call, 3))
            .and_then(|up| child(seen, up, "elicitation/create", 2))
            .is_some()
    });

    // A 2025 host, a 2026-07-28 server answering input_required: mcpd asks
    // the host (a client span under the host's call) and retries upstream
    // (a second client span of the call): one trace.
    let run = ask_through(&runtime, "legacy", "pym");
    assert_eq!(run["ir_elicit"]["callbacks"]["elicitation"], 1, "{run:#}");
    let call = "tools/call test_input_required_result_elicitation";
    let rounds = |seen: &[Value]| {
        let host = host_span(seen, call, LEGACY, "pym")?;
        let ups: Vec<&Value> = named(seen, call, 3)
            .into_iter()
            .filter(|s| s["trace_id"] == host["trace_id"] && s["parent_span_id"] == host["span_id"])
            .collect();
        let asked = child(seen, host, "elicitation/create", 3)?;
        (ups.len() >= 2).then(|| (ups.len(), asked.clone()))
    };
    receiver.until("the input_required rounds' spans", |seen| {
        rounds(seen).is_some()
    });
    let (ups, asked) = rounds(&receiver.seen).expect("the rounds");
    assert_eq!(ups, 2, "two rounds upstream");
    assert_eq!(asked["attributes"]["mcpd.unit"], "pym", "{asked}");
    assert_eq!(
        asked["attributes"]["mcp.method.name"], "elicitation/create",
        "{asked}"
    );
}
