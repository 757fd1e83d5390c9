//! Host sessions sharing one server (DESIGN §8): several `mcpctl bridge`
//! hosts (rmcp clients) on one fixture server, through the real daemon.
// Sampling, logging and subscriptions are deprecated by SEP-2577 but are
// current in 2025-11-25, which is what hosts speak.
#![allow(deprecated)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, CreateMessageRequestParams,
    CreateMessageResult, Implementation, LoggingMessageNotificationParam,
    ProgressNotificationParam, ResourceUpdatedNotificationParam,
};
use rmcp::service::{NotificationContext, RequestContext, RunningService};
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use rustix::process::Signal;
use serde_json::{Value, json};

use crate::helper::{BOUND, Daemon, eventually_async, mcpctl_user};

/// What a host received.
#[derive(Debug, Default)]
struct Seen {
    progress: Vec<(String, f64)>,
    levels: Vec<String>,
    updated: Vec<String>,
    tools_changed: usize,
}

/// A host: answers sampling with its own label when it declared sampling.
#[derive(Clone)]
struct Host {
    label: &'static str,
    sampling: bool,
    seen: Arc<Mutex<Seen>>,
}

impl Host {
    fn new(label: &'static str, sampling: bool) -> Self {
        Self {
            label,
            sampling,
            seen: Arc::default(),
        }
    }

    fn seen<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.seen.lock().expect("lock"))
    }
}

impl ClientHandler for Host {
    fn get_info(&self) -> ClientConfig {
        let capabilities: ClientCapabilities = serde_json::from_value(if self.sampling {
            json!({"sampling": {}})
        } else {
            json!({})
        })
        .expect("capabilities");
        ClientConfig::new(capabilities, Implementation::new(self.label, "1"))
    }

    async fn create_message(
        &self,
        _params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        Ok(serde_json::from_value(json!({
            "model": "test",
            "role": "assistant",
            "content": {"type": "text", "text": format!("answer from {}", self.label)},
        }))
        .expect("result"))
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let token = serde_json::to_value(&params.progress_token).expect("token");
        self.seen.lock().expect("lock").progress.push((
            token
                .as_str()
                .map_or_else(|| token.to_string(), str::to_owned),
            params.progress,
        ));
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let level = serde_json::to_value(params.level).expect("level");
        self.seen
            .lock()
            .expect("lock")
            .levels
            .push(level.as_str().unwrap_or_default().to_owned());
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.seen.lock().expect("lock").updated.push(params.uri);
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.seen.lock().expect("lock").tools_changed += 1;
    }
}

type Client = RunningService<RoleClient, Host>;

fn call(name: &str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else {
        panic!("arguments must be an object")
    };
    CallToolRequestParams::new(name.to_owned()).with_arguments(arguments)
}

async fn text(client: &Client, name: &str, arguments: Value) -> String {
    let result = client
        .call_tool(call(name, arguments))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_json::to_value(&result.content).expect("json")[0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Waits (bounded) until `done` holds for what `host` received.
async fn host_sees(host: &Host, what: &str, done: impl Fn(&Seen) -> bool) {
    let what = format!("{}: {what}", host.label);
    eventually_async(&what, BOUND, async || host.seen(&done)).await;
}

fn recent_logs(runtime: &std::path::Path) -> String {
    let out = mcpctl_user(runtime, &["logs", "shared", "-n", "200"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn three_hosts_share_one_server_and_each_gets_only_its_own() {
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("shared.kdl"),
        // The fixture speaks both eras; its `sample` asks in the middle of
        // the call, which only the 2025 era has a channel for.
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\" \"--tools\" \"progress,sample,levels,touch\"\n}\nprotocol \"legacy\"\n",
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("shared running", |d| d.latest_pid("shared").is_some());
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let pid = d.latest_pid("shared").expect("pid");

    let mut b_pid = None;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(90), async {
            let (a, b, c) = (
                Host::new("A", true),
                Host::new("B", true),
                Host::new("C", false),
            );
            let mut bridges = Vec::new();
            let mut connect = async |host: &Host| {
                let (child, io) = crate::helper::bridge(&runtime, "shared");
                bridges.push(child);
                host.clone().serve(io).await.expect("initialize")
            };
            let ca = connect(&a).await;
            let cb = connect(&b).await;
            let cc = connect(&c).await;
            b_pid = bridges[1].id();
            let shown = status_of(&runtime, "shared");
            assert!(
                shown.contains("   Sessions: 3 (3 on 2025-11-25)"),
                "{shown}"
            );

            // Progress reaches only the caller, with its own token, even
            // when two hosts use the same token at once.
            let progress = |steps: u64| {
                serde_json::from_value::<CallToolRequestParams>(json!({
                    "name": "progress",
                    "arguments": {"steps": steps},
                    "_meta": {"progressToken": "same-token"},
                }))
                .expect("params")
            };
            let (ra, rb) = tokio::join!(ca.call_tool(progress(3)), cb.call_tool(progress(2)));
            ra.expect("A's progress call");
            rb.expect("B's progress call");
            host_sees(&a, "3 progress", |s| s.progress.len() == 3).await;
            host_sees(&b, "2 progress", |s| s.progress.len() == 2).await;
            // (rmcp numbers its requests' progress tokens itself: both
            // hosts used the same token at once.)
            let tokens = |h: &Host| {
                h.seen(|s| {
                    s.progress
                        .iter()
                        .map(|(t, _)| t.clone())
                        .collect::<std::collections::BTreeSet<_>>()
                })
            };
            assert_eq!(tokens(&a).len(), 1, "{:?}", tokens(&a));
            assert_eq!(
                tokens(&a),
                tokens(&b),
                "the same token, each host its own progress"
            );
            assert!(c.seen(|s| s.progress.is_empty()));

            // A sampling request caused by B's call is answered by B.
            assert_eq!(
                text(&cb, "sample", json!({"text": "q"})).await,
                "answer from B"
            );
            assert_eq!(
                text(&ca, "sample", json!({"text": "q"})).await,
                "answer from A"
            );
            // C declared no sampling: the server gets an error naming why.
            let refused = text(&cc, "sample", json!({"text": "q"})).await;
            assert!(
                refused.starts_with("sampling failed") && refused.contains("capability"),
                "{refused}"
            );
            assert_eq!(
                d.latest_pid("shared"),
                Some(pid),
                "the server keeps running"
            );

            // A's subscription delivers updates to A only.
            ca.subscribe(rmcp::model::SubscribeRequestParams::new("fixture://a"))
                .await
                .expect("subscribe");
            text(&cc, "touch", json!({"uri": "fixture://a"})).await;
            host_sees(&a, "the update", |s| s.updated == ["fixture://a"]).await;
            // B and C would have it queued before this answer.
            text(&cb, "echo", json!({"text": "sync"})).await;
            text(&cc, "echo", json!({"text": "sync"})).await;
            assert!(b.seen(|s| s.updated.is_empty()) && c.seen(|s| s.updated.is_empty()));

            // Levels: A asks for debug, C for error; the server gets debug,
            // C never sees anything below error.
            let level = |l: &str| {
                rmcp::model::SetLevelRequestParams::new(
                    serde_json::from_value(json!(l)).expect("level"),
                )
            };
            ca.set_level(level("debug")).await.expect("A's level");
            cc.set_level(level("error")).await.expect("C's level");
            text(&cb, "levels", json!({})).await;
            host_sees(&a, "8 levels", |s| s.levels.len() == 8).await;
            host_sees(&c, "4 levels", |s| s.levels.len() == 4).await;
            text(&cc, "echo", json!({"text": "sync"})).await;
            // (rmcp hands notifications to the handler concurrently.)
            let mut levels = c.seen(|s| s.levels.clone());
            levels.sort();
            assert_eq!(levels, ["alert", "critical", "emergency", "error"]);

            // 3 × 1,000 concurrent calls: every answer matches its request.
            fn many<'a>(
                client: &'a Client,
                label: &'static str,
            ) -> impl Future<Output = Vec<()>> + 'a {
                let calls = (0..1000).map(move |i| {
                    let want = format!("{label}-{i}");
                    let request = client.call_tool(call("echo", json!({"text": want})));
                    async move {
                        let result = request.await.expect("echo");
                        let got = serde_json::to_value(&result.content).expect("json")[0]["text"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned();
                        assert_eq!(got, want);
                    }
                });
                futures_util::future::join_all(calls)
            }
            tokio::join!(many(&ca, "A"), many(&cb, "B"), many(&cc, "C"));

            // A cancelled call is cancelled upstream; so is the call of a
            // host that disconnects mid-call.
            let hang = tokio::time::timeout(
                Duration::from_millis(200),
                ca.call_tool(call("hang", json!({}))),
            );
            assert!(hang.await.is_err(), "hang never answers");
            let dropped = tokio::spawn({
                let peer = cc.peer().clone();
                async move { peer.call_tool(call("hang", json!({}))).await }
            });
            eventually_async("two hangs", BOUND, async || {
                recent_logs(&runtime).matches("call hang").count() == 2
            })
            .await;
            cc.cancel().await.expect("C leaves");
            let _ = dropped.await;
            eventually_async("both hangs cancelled upstream", BOUND, async || {
                recent_logs(&runtime).matches("hang cancelled").count() == 2
            })
            .await;

            // A and B still work; C's session is gone.
            assert_eq!(text(&ca, "echo", json!({"text": "still"})).await, "still");
            eventually_async("C's session gone", BOUND, async || {
                status_of(&runtime, "shared").contains("   Sessions: 2")
            })
            .await;
            ca.cancel().await.expect("close");
            cb.cancel().await.expect("close");
            for mut bridge in bridges {
                let exit = bridge.wait().await.expect("bridge exits");
                assert!(exit.success(), "{exit:?}");
            }
        })
        .await
        .expect("within 90 s");
    });
    // Every call of a host session is accounted to the bridge's process.
    let uid = rustix::process::getuid().as_raw();
    let b_pid = b_pid.expect("B's bridge pid");
    let line = d.wait_for(&format!("tools/call sample by uid {uid} pid {b_pid}: ok"));
    assert!(line.contains("mcpd_caller_pid"), "{line}");
    let status = status_of(&runtime, "shared");
    assert!(status.contains("Calls: 30"), "{status}");
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn hosts_stay_attached_through_an_outage_and_get_their_state_back() {
    let units = tempfile::tempdir().expect("tempdir");
    let env = units.path().join("fixture.env");
    std::fs::write(&env, "MCP_FIXTURE_TOOLS=touch\n").expect("write");
    std::fs::write(
        units.path().join("outage.kdl"),
        format!(
            "stdio {{\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n    env-file \"{}\"\n}}\nprotocol \"legacy\"\nreconnect {{\n    initial-delay \"1h\"\n    max-delay \"2h\"\n}}\n",
            env.display()
        ),
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("outage running", |d| d.latest_pid("outage").is_some());
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let logs = |needle: &str| {
        let out = mcpctl_user(&runtime, &["logs", "outage", "-n", "500"]);
        String::from_utf8_lossy(&out.stdout).matches(needle).count()
    };
    let state = || {
        String::from_utf8_lossy(&mcpctl_user(&runtime, &["status", "outage"]).stdout).into_owned()
    };

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            let (a, b) = (Host::new("A", false), Host::new("B", false));
            let mut bridges = Vec::new();
            let mut clients = Vec::new();
            for host in [&a, &b] {
                let (child, io) = crate::helper::bridge(&runtime, "outage");
                bridges.push(child);
                clients.push(host.clone().serve(io).await.expect("initialize"));
            }
            let (ca, cb) = (&clients[0], &clients[1]);
            let tools = ca.list_all_tools().await.expect("tools").len();
            ca.subscribe(rmcp::model::SubscribeRequestParams::new("fixture://a"))
                .await
                .expect("subscribe");
            let level = rmcp::model::SetLevelRequestParams::new(
                serde_json::from_value(json!("debug")).expect("level"),
            );
            ca.set_level(level).await.expect("level");
            eventually_async("subscribed and level set", BOUND, async || {
                logs("subscribe fixture://a") == 1 && logs("log level Debug") == 1
            })
            .await;

            // A call in flight when the server dies gets the error at once.
            let hang = tokio::spawn({
                let peer = ca.peer().clone();
                async move { peer.call_tool(call("hang", json!({}))).await }
            });
            eventually_async("the hang started", BOUND, async || logs("call hang") == 1).await;
            text(cb, "crash", json!({"code": 3})).await;
            let failed = hang.await.expect("task").expect_err("the server died");
            assert!(failed.to_string().contains("connection lost"), "{failed}");

            // During the outage lists are answered, other requests get the
            // state and the next retry.
            eventually_async("reconnecting", BOUND, async || {
                state().contains("reconnecting")
            })
            .await;
            assert_eq!(ca.list_all_tools().await.expect("tools kept").len(), tools);
            let resources = cb.list_all_resources().await.expect("resources kept");
            assert_eq!(resources[0].uri, "fixture://a");
            let down = cb.call_tool(call("echo", json!({"text": "x"}))).await;
            let down = format!("{down:?}");
            assert!(
                down.contains("server outage is reconnecting (retry 1/10, next in "),
                "{down}"
            );

            // Back with the same list: both sessions work without
            // reattaching, subscription and level are replayed, and nobody
            // is told the tools changed.
            assert!(
                mcpctl_user(&runtime, &["restart", "outage"])
                    .status
                    .success()
            );
            eventually_async("running again", BOUND, async || {
                state().contains("Active: running")
            })
            .await;
            assert_eq!(text(ca, "echo", json!({"text": "a"})).await, "a");
            assert_eq!(text(cb, "echo", json!({"text": "b"})).await, "b");
            eventually_async("replayed", BOUND, async || {
                logs("subscribe fixture://a") == 2 && logs("log level Debug") == 2
            })
            .await;
            text(cb, "touch", json!({"uri": "fixture://a"})).await;
            host_sees(&a, "the update after the outage", |s| s.updated.len() == 1).await;
            text(ca, "echo", json!({"text": "sync"})).await;
            text(cb, "echo", json!({"text": "sync"})).await;
            let changed = |h: &Host| h.seen(|s| s.tools_changed);
            assert_eq!(
                (changed(&a), changed(&b)),
                (0, 0),
                "the same list is no news"
            );

            // Back with another list: each host is told once.
            std::fs::write(&env, "MCP_FIXTURE_TOOLS=touch,extra\n").expect("write");
            text(cb, "crash", json!({"code": 3})).await;
            eventually_async("reconnecting again", BOUND, async || {
                state().contains("reconnecting")
            })
            .await;
            assert!(
                mcpctl_user(&runtime, &["restart", "outage"])
                    .status
                    .success()
            );
            eventually_async("both told", BOUND, async || {
                changed(&a) == 1 && changed(&b) == 1
            })
            .await;
            let listed = cb.list_all_tools().await.expect("tools");
            assert!(listed.iter().any(|t| t.name == "extra"), "{listed:?}");
            for client in clients {
                client.cancel().await.expect("close");
            }
            for mut bridge in bridges {
                assert!(bridge.wait().await.expect("bridge exits").success());
            }
        })
        .await
        .expect("within 60 s");
    });
    assert!(d.stop(Signal::TERM).success());
}

/// The daemon may learn that the server exited before it reads the end of
/// the connection (here the test holds the server's stdout pipe open): a
/// call in flight gets the same §3 error either way, naming what ended the
/// server.
#[test]
fn a_call_in_flight_when_the_server_exits_gets_connection_lost_with_the_exit() {
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("exits.kdl"),
        // One process (the test ends it): pinned to one era.
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\nprotocol \"2026-07-28\"\nreconnect {\n    initial-delay \"1h\"\n    max-delay \"2h\"\n}\n",
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("exits running", |d| d.latest_pid("exits").is_some());
    let pid = d.latest_pid("exits").expect("pid");
    // Another writer of the pipe mcpd reads the server from: no end of the
    // connection until it is dropped, after the exit.
    let stdout = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{pid}/fd/1"))
        .expect("the server's stdout");
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let logs = |needle: &str| {
        let out = mcpctl_user(&runtime, &["logs", "exits", "-n", "500"]);
        String::from_utf8_lossy(&out.stdout).matches(needle).count()
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let (mut bridge, io) = crate::helper::bridge(&runtime, "exits");
            let client = Host::new("A", false).serve(io).await.expect("initialize");
            let hang = tokio::spawn({
                let peer = client.peer().clone();
                async move { peer.call_tool(call("hang", json!({}))).await }
            });
            eventually_async("the hang started", BOUND, async || logs("call hang") == 1).await;
            text(&client, "crash", json!({"code": 3})).await;
            let failed = hang.await.expect("task").expect_err("the server died");
            assert!(
                failed
                    .to_string()
                    .contains("server exits: connection lost: process exited with status 3"),
                "{failed}"
            );
            drop(stdout);
            client.cancel().await.expect("close");
            assert!(bridge.wait().await.expect("bridge exits").success());
        })
        .await
        .expect("within 30 s");
    });
    assert!(d.stop(Signal::TERM).success());
}

/// A host that writes raw lines: `mcpctl bridge` with piped stdio.
pub(crate) struct Raw {
    _bridge: tokio::process::Child,
    write: tokio::process::ChildStdin,
    read: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Raw {
    pub(crate) fn new(runtime: &std::path::Path, name: &str) -> Self {
        use tokio::io::AsyncBufReadExt;
        let (bridge, (stdout, stdin)) = crate::helper::bridge(runtime, name);
        Self {
            _bridge: bridge,
            write: stdin,
            read: tokio::io::BufReader::new(stdout).lines(),
        }
    }

    pub(crate) async fn send(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.write.write_all(bytes).await.expect("write");
        self.write.flush().await.expect("flush");
    }

    /// The next answer (notifications on the way are skipped).
    pub(crate) async fn answer(&mut self) -> Value {
        loop {
            let line = self.line().await;
            if line.get("method").is_none() {
                return line;
            }
        }
    }

    pub(crate) async fn line(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(10), self.read.next_line())
            .await
            .expect("an answer within 10 s")
            .expect("read")
            .expect("a line");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }
}

#[test]
fn a_host_sending_garbage_or_a_flood_gets_errors_and_disturbs_nobody() {
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("robust.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\n",
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("robust running", |d| d.latest_pid("robust").is_some());
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let pid = d.latest_pid("robust");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            let good = Host::new("good", false);
            let (_good_bridge, io) = crate::helper::bridge(&runtime, "robust");
            let good = good.serve(io).await.expect("initialize");
            let mut bad = Raw::new(&runtime, "robust");

            bad.send(b"this is not json\n").await;
            let e = bad.line().await;
            assert_eq!((e["id"].clone(), e["error"]["code"].clone()), (Value::Null, json!(-32700)), "{e}");
            bad.send(b"[1, 2]\n").await;
            assert_eq!(bad.line().await["error"]["code"], -32700);
            bad.send(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}\n").await;
            let e = bad.line().await;
            assert_eq!(e["id"], 1);
            assert!(e["error"]["message"].as_str().is_some_and(|m| m.contains("initialize")), "{e}");
            bad.send(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"raw\",\"version\":\"1\"}}}\n").await;
            let init = bad.line().await;
            assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
            bad.send(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n").await;
            // Each host negotiates its own revision with mcpd.
            for (asked, got) in [
                ("2024-11-05", "2024-11-05"),
                ("2025-03-26", "2025-03-26"),
                ("2025-11-25", "2025-11-25"),
                ("2099-01-01", "2025-11-25"),
            ] {
                let mut other = Raw::new(&runtime, "robust");
                other
                    .send(format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{{\"protocolVersion\":\"{asked}\",\"capabilities\":{{}},\"clientInfo\":{{\"name\":\"raw\",\"version\":\"1\"}}}}}}\n").as_bytes())
                    .await;
                let init = other.line().await;
                assert_eq!(init["result"]["protocolVersion"], got, "{init}");
                assert_eq!(init["result"]["serverInfo"]["name"], "mcp-fixture");
            }

            // An answer to a request nobody made goes nowhere; the session
            // still answers the next request.
            bad.send(b"{\"jsonrpc\":\"2.0\",\"id\":99,\"result\":{}}\n").await;
            bad.send(b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}\n").await;
            assert_eq!(bad.line().await, json!({"jsonrpc": "2.0", "id": 3, "result": {}}));

            // A message over 16 MiB is refused; the next one works.
            let mut big = b"{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{\"text\":\"".to_vec();
            big.resize(big.len() + 17 * 1024 * 1024, b'x');
            big.extend_from_slice(b"\"}}}\n");
            bad.send(&big).await;
            let e = bad.line().await;
            assert_eq!(e["error"]["code"], -32600, "{e}");
            bad.send(b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{\"text\":\"fine\"}}}\n").await;
            assert_eq!(bad.line().await["result"]["content"][0]["text"], "fine");

            // A flood: 1,100 calls that never end. What exceeds the
            // session's limit is refused at once; the other host is served.
            let mut flood = Vec::new();
            for i in 0..1100 {
                flood.extend_from_slice(
                    format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"tools/call\",\"params\":{{\"name\":\"hang\"}}}}\n", 100 + i)
                        .as_bytes(),
                );
            }
            bad.send(&flood).await;
            for _ in 0..76 {
                let e = bad.line().await;
                assert!(
                    e["error"]["message"].as_str().is_some_and(|m| m.starts_with("too many requests in flight")),
                    "{e}"
                );
            }
            assert_eq!(text(&good, "echo", json!({"text": "served"})).await, "served");

            // The flooding host leaves: its calls are cancelled upstream,
            // the server and the other host carry on.
            drop(bad);
            eventually_async("the flood's session gone", BOUND, async || status_of(&runtime, "robust").contains("   Sessions: 1")).await;
            assert_eq!(text(&good, "echo", json!({"text": "still"})).await, "still");
            good.cancel().await.expect("close");
        })
        .await
        .expect("within 60 s");
    });
    assert_eq!(
        d.latest_pid("robust"),
        pid,
        "the server was never restarted"
    );
    assert!(d.stop(Signal::TERM).success());
}

fn status_of(runtime: &std::path::Path, name: &str) -> String {
    String::from_utf8_lossy(&mcpctl_user(runtime, &["status", name]).stdout).into_owned()
}

#[test]
fn what_a_host_pipelines_behind_an_initialize_that_waits_is_answered_in_order() {
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("slow.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\" \"--slow-start\" \"1s\"\n}\n",
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_for("mcpd::supervisor: starting");
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            // While the server starts: initialize, initialized and two
            // requests in one write, as a bridge replaying a session does.
            let mut host = Raw::new(&runtime, "slow");
            host.send(concat!(
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#, "\n",
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#, "\n",
                r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#, "\n",
                r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}"#, "\n",
            ).as_bytes())
            .await;
            let init = host.answer().await;
            assert_eq!(init["id"], 1, "{init}");
            assert_eq!(init["result"]["serverInfo"]["name"], "mcp-fixture");
            let tools = host.answer().await;
            assert_eq!(tools["id"], 2, "{tools}");
            assert!(tools["result"]["tools"].as_array().is_some_and(|t| t.len() == 9), "{tools}");
            let echo = host.answer().await;
            assert_eq!(echo["result"]["content"][0]["text"], "after", "{echo}");
        })
        .await
        .expect("within 30 s");
    });
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_host_that_stops_reading_is_detached_and_its_socket_closed() {
    use std::io::Write;
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("deaf.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\n",
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("deaf running", |d| d.latest_pid("deaf").is_some());
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let socket = rt.block_on(async {
        let (_conn, server) =
            crate::helper::private_server(&runtime.join("mcpd/private"), "deaf").await;
        let fd: std::os::fd::OwnedFd = server.attach().await.expect("Attach").into();
        std::os::unix::net::UnixStream::from(fd)
    });
    // Pings are answered by mcpd itself; the host never reads the answers.
    let mut writer = &socket;
    writer
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-11-25\",\"capabilities\":{},\"clientInfo\":{\"name\":\"deaf\",\"version\":\"1\"}}}\n")
        .expect("write");
    socket
        .set_write_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut refused = None;
    for i in 1..200_000 {
        let ping = format!("{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"ping\"}}\n");
        if let Err(e) = writer.write_all(ping.as_bytes()) {
            refused = Some(e);
            break;
        }
    }
    // The daemon detached it and shut the socket down, instead of waiting
    // on it forever: the host's writes fail.
    let refused = refused.expect("the session was closed");
    // (Reset once the daemon's end is closed with the pings unread.)
    assert!(
        matches!(
            refused.kind(),
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
        ),
        "{refused}"
    );
    d.wait_for("it stopped reading its messages");
    assert!(status_of(&runtime, "deaf").contains("Active: running"));
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_tool_filter_shapes_what_hosts_see_and_a_reload_lifts_it_in_place() {
    let units = tempfile::tempdir().expect("tempdir");
    let unit = units.path().join("filtered.kdl");
    let write = |filter: &str| {
        std::fs::write(
            &unit,
            format!("stdio {{\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}}\n{filter}\n"),
        )
        .expect("write");
    };
    write("tools { deny \"add\" \"cra*\"; }");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("filtered running", |d| d.latest_pid("filtered").is_some());
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let pid = d.latest_pid("filtered").expect("pid");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            let host = Host::new("H", false);
            let (_child, io) = crate::helper::bridge(&runtime, "filtered");
            let client = host.clone().serve(io).await.expect("initialize");
            let names = |tools: Vec<rmcp::model::Tool>| -> Vec<String> {
                tools.into_iter().map(|t| t.name.to_string()).collect()
            };
            let listed = names(client.list_all_tools().await.expect("tools/list"));
            assert!(listed.contains(&"echo".to_owned()), "{listed:?}");
            assert!(
                !listed.iter().any(|n| n == "add" || n == "crash"),
                "{listed:?}"
            );
            let refused = client.call_tool(call("add", json!({"a": 1, "b": 2}))).await;
            let shown = match refused {
                Ok(result) => serde_json::to_string(&result).expect("json"),
                Err(e) => e.to_string(),
            };
            assert!(shown.contains("deny"), "a clear error: {shown}");
            // A repeated `name` is judged as the server reads it: the last.
            let (_raw, (out, mut input)) = crate::helper::bridge(&runtime, "filtered");
            use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
            input
                .write_all(
                    concat!(
                        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
                        "\n",
                        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                        "\n",
                        r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo","arguments":{"a":1,"b":2},"name":"add"}}"#,
                        "\n",
                    )
                    .as_bytes(),
                )
                .await
                .expect("write");
            let mut lines = tokio::io::BufReader::new(out).lines();
            let answer = loop {
                let line = lines.next_line().await.expect("read").expect("a line");
                let answer: serde_json::Value = serde_json::from_str(&line).expect("JSON");
                if answer["id"] == 9 {
                    break answer;
                }
            };
            assert!(
                answer["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("deny")),
                "{answer}"
            );
            // Lifting the filter: hosts are told, the server is not restarted.
            write("");
            host_sees(&host, "tools list_changed", |s| s.tools_changed >= 1).await;
            let listed = names(client.list_all_tools().await.expect("tools/list"));
            assert!(listed.contains(&"add".to_owned()), "{listed:?}");
            assert_eq!(text(&client, "add", json!({"a": 1, "b": 2})).await, "3");
            client.cancel().await.expect("close");
        })
        .await
        .expect("within 60 s");
    });
    assert_eq!(d.latest_pid("filtered"), Some(pid), "not restarted");
}

#[test]
fn a_request_reusing_the_id_of_a_call_in_flight_is_refused_and_the_call_goes_on() {
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("ids.kdl"),
        // One process (its calls are counted): pinned to one era.
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\nprotocol \"2026-07-28\"\n",
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("ids running", |d| d.latest_pid("ids").is_some());
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let counts = || {
        let out = mcpctl_user(&runtime, &["status", "ids", "--json"]);
        let json: Value = serde_json::from_slice(&out.stdout).expect("json");
        (json[0]["calls"].as_u64(), json[0]["failed_calls"].as_u64())
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let mut host = Raw::new(&runtime, "ids");
            host.send(concat!(
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#, "\n",
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#, "\n",
            ).as_bytes())
            .await;
            assert_eq!(host.answer().await["id"], 1);
            // a call that stays in flight, then a ping and a call with its id
            host.send(concat!(
                r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"hang","arguments":{}}}"#, "\n",
                r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#, "\n",
                r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}"#, "\n",
                r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}"#, "\n",
            ).as_bytes())
            .await;
            for _ in 0..2 {
                let refused = host.answer().await;
                assert_eq!(refused["id"], 7, "{refused}");
                assert_eq!(refused["error"]["code"], -32600, "{refused}");
                assert_eq!(refused["error"]["message"], "request id 7 is already in use");
            }
            let echo = host.answer().await;
            assert_eq!((echo["id"].clone(), echo["result"]["content"][0]["text"].clone()), (json!(8), json!("after")));
            // the refusals ended nothing: one call counted (8), none failed,
            // and 7 is still in flight (a third refusal says so)
            assert_eq!(counts(), (Some(1), Some(0)));
            host.send(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\"}\n").await;
            assert_eq!(host.answer().await["error"]["message"], "request id 7 is already in use");
            assert_eq!(counts(), (Some(1), Some(0)));
        })
        .await
        .expect("within 30 s");
    });
    assert!(d.stop(Signal::TERM).success());
}
