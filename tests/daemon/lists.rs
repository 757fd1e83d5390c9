//! The list reader against real servers with hostile lists (cursors that
//! cycle, endless or huge lists) beside a healthy one, under the real
//! `mcpd`; the reader's own rules are table-tested in `pure/lists.rs`.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::helper::{BOUND, Daemon, mcpctl_user, mcpctl_user_command, root, rss_kib};

/// Unit `name` running the hostile server in `mode`.
fn hostile(dir: &Path, name: &str, mode: &str, extra: &str) {
    let script = root().join("tests/data/hostile_lists.py");
    std::fs::write(
        dir.join(format!("{name}.kdl")),
        format!(
            "stdio {{\n    command \"python3\" \"{}\" \"{mode}\"\n}}\n{extra}",
            script.display()
        ),
    )
    .expect("write unit");
}

/// `mcpctl status NAME --json`, its one entry.
fn status(runtime: &Path, name: &str) -> serde_json::Value {
    let out = mcpctl_user(runtime, &["status", name, "--json"]);
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    all[0].clone()
}

#[test]
fn a_server_whose_tool_cursors_cycle_fails_to_establish_and_is_retried_under_its_budget() {
    let units = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    hostile(
        units.path(),
        "cycle",
        "cycle-tools",
        "reconnect {\n    initial-delay \"50ms\"\n    max-attempts 2\n}\n",
    );
    let mut d = Daemon::user_no_bus(
        units.path(),
        &[("XDG_RUNTIME_DIR", runtime.path().as_os_str())],
    );
    let why = r#"tools/list: cursor "A" repeated after 3 pages"#;
    let line = d.wait_for(why);
    assert!(line.contains("mcpd_server=cycle"), "{line}");
    assert!(
        line.contains("retry 1/2"),
        "retried under the budget: {line}"
    );
    d.wait_for("retry 2/2");
    let failed = d.wait_for("ERROR");
    assert!(failed.contains(why), "{failed}");
    let s = status(runtime.path(), "cycle");
    assert_eq!(s["state"], "failed", "{s}");
    assert!(s["reason"].as_str().expect("reason").contains(why), "{s}");
    assert!(d.stop(rustix::process::Signal::TERM).success());
}

#[test]
fn servers_with_endless_cycling_or_huge_lists_cost_the_daemon_little_and_say_why() {
    let units = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    // the oversized page is dropped at the line limit, and its read
    // ends at once with the error that stands for it (or at the
    // deadline, were its id not found: far enough that a loaded machine
    // writing 16 MiB does not reach it first)
    let quick = "startup-timeout \"15s\"\n";
    hostile(units.path(), "cycle", "cycle-resources", "");
    hostile(units.path(), "endless", "endless-resources", "");
    hostile(units.path(), "huge", "huge-resources", quick);
    hostile(units.path(), "healthy", "plain", "");
    let started = Instant::now();
    let mut d = Daemon::user_no_bus(
        units.path(),
        &[("XDG_RUNTIME_DIR", runtime.path().as_os_str())],
    );
    let pid = d.pid();
    let mut peak = 0;
    let mut sample = |d: &Daemon| peak = peak.max(rss_kib(d.pid()));
    let wanted = [
        (
            "cycle",
            r#"resources/list: cursor "A" repeated after 3 pages"#,
        ),
        ("endless", "resources/list: more than 1000 pages"),
        (
            "huge",
            "resources/list: the server's answer exceeded mcpd's limit of 16 MiB per message and was dropped (-32603)",
        ),
    ];
    d.wait_until("every hostile list refused", |d| {
        wanted
            .iter()
            .all(|(name, why)| d.about(name).any(|l| l.contains(why)))
    });
    // each said once, naming the server, the list and the bound
    for (name, why) in wanted {
        assert_eq!(
            d.about(name).filter(|l| l.contains(why)).count(),
            1,
            "{name}: {:?}",
            d.seen
        );
    }
    // then, until 30 s after the start, the healthy server answers and
    // the daemon stays small
    let until = started + Duration::from_secs(30);
    let mut calls = 0;
    while Instant::now() < until {
        sample(&d);
        let out = mcpctl_user(
            runtime.path(),
            &["call", "healthy", "echo", r#"{"text":"still here"}"#],
        );
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("still here"),
            "{out:?}"
        );
        calls += 1;
    }
    assert!(calls > 5, "{calls} calls");
    sample(&d);
    assert!(peak < 64 * 1024, "daemon RSS peaked at {peak} KiB");
    // the servers go on serving their tools; status says what failed
    for (name, why) in wanted {
        let s = status(runtime.path(), name);
        assert_eq!(s["state"], "running", "{s}");
        assert_eq!(s["generation"], 1, "{s}");
        assert_eq!(s["tools"], serde_json::json!(["echo"]), "{s}");
        assert!(
            s["last_error"].as_str().expect("last_error").contains(why),
            "{name}: {s}"
        );
    }
    let text = mcpctl_user(runtime.path(), &["status", "endless"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("Last error: resources/list: more than 1000 pages"),
        "{text}"
    );
    assert_eq!(pid, d.pid());
    assert!(d.stop(rustix::process::Signal::TERM).success());
}

/// An aggregate pages its members within the unit reader's bounds: over a
/// member whose `resources/list` cursors cycle, a host's `resources/list`
/// is answered at once, without that member's pages (1,000 of them
/// before), and with the healthy member's.
#[test]
fn an_aggregate_over_a_member_whose_cursors_cycle_answers_within_the_readers_bounds() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    let units = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    hostile(units.path(), "cycle", "cycle-resources", "");
    hostile(units.path(), "healthy", "plain", "");
    let mut d = Daemon::user_no_bus(
        units.path(),
        &[("XDG_RUNTIME_DIR", runtime.path().as_os_str())],
    );
    d.wait_for(r#"resources/list: cursor "A" repeated after 3 pages"#);
    let mut bridge = mcpctl_user_command(runtime.path(), &["bridge", "cycle+healthy"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("mcpctl bridge");
    let mut stdin = bridge.stdin.take().expect("stdin");
    let mut lines = BufReader::new(bridge.stdout.take().expect("stdout")).lines();
    let mut answer = |stdin: &mut std::process::ChildStdin, request: serde_json::Value| {
        writeln!(stdin, "{request}").expect("write");
        loop {
            let line = lines.next().expect("an answer").expect("a line");
            let message: serde_json::Value = serde_json::from_str(&line).expect("json");
            if message["id"] == request["id"] {
                return (line.len(), message);
            }
        }
    };
    let (_, init) = answer(
        &mut stdin,
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}),
    );
    assert!(init["result"].is_object(), "{init}");
    writeln!(
        stdin,
        "{}",
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )
    .expect("write");
    let (size, listed) = answer(
        &mut stdin,
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "resources/list"}),
    );
    let resources = listed["result"]["resources"].as_array().expect("resources");
    assert_eq!(
        resources.len(),
        1,
        "the healthy member's one resource, not the cycling member's pages ({size} bytes): {listed}"
    );
    drop(stdin);
    assert!(bridge.wait().expect("wait").success());
    assert!(d.stop(rustix::process::Signal::TERM).success());
}

/// A host that counts `tools/list_changed`.
#[derive(Clone, Default)]
struct Counting(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl rmcp::ClientHandler for Counting {
    async fn on_tool_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// One `list_changed` of the server's is one to each host, whether or not
/// the list mcpd reads again differs (a host hears what it would hear
/// from the server directly: the official conformance suite's
/// `sep-2575-server-sends-*-list-changed-on-subscription` checks, whose
/// server changes its list and changes it back); mcpd's own reads (the
/// handshake's) tell hosts nothing when nothing changed.
#[test]
fn a_servers_list_changed_reaches_hosts_even_when_the_list_comes_back_the_same() {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("same.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\n",
    )
    .expect("write unit");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("same running", |d| d.latest_pid("same").is_some());
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), async {
            let host = Counting::default();
            let changes = std::sync::Arc::clone(&host.0);
            let (_bridge, io) = crate::helper::bridge(&runtime, "same");
            let client = host.serve(io).await.expect("initialize");
            let seen = || changes.load(std::sync::atomic::Ordering::SeqCst);
            let set = async |tools: serde_json::Value| {
                client
                    .call_tool(
                        CallToolRequestParams::new("set_tools").with_arguments(
                            serde_json::json!({"tools": tools})
                                .as_object()
                                .cloned()
                                .expect("obj"),
                        ),
                    )
                    .await
                    .expect("set_tools");
            };
            let names = async || -> Vec<String> {
                let tools = client.list_all_tools().await.expect("tools/list");
                tools.iter().map(|t| t.name.to_string()).collect()
            };
            // The list changes: hosts are told once.
            set(serde_json::json!(["extra"])).await;
            crate::helper::eventually_async("list_changed after a change", BOUND, async || {
                seen() == 1
            })
            .await;
            assert!(names().await.contains(&"extra".to_owned()));
            // The server says so again of the same list: hosts are told
            // again, as directly.
            set(serde_json::json!(["extra"])).await;
            crate::helper::eventually_async(
                "list_changed of a list that came back the same",
                BOUND,
                async || seen() == 2,
            )
            .await;
            assert!(names().await.contains(&"extra".to_owned()));
            // And a third time: one notification each, never more.
            set(serde_json::json!(["extra"])).await;
            crate::helper::eventually_async("the third list_changed", BOUND, async || seen() == 3)
                .await;
            // A second host that attaches now was told nothing (its
            // handshake is no change), and hears only what the server
            // says from now on.
            let late = Counting::default();
            let late_changes = std::sync::Arc::clone(&late.0);
            let (_late_bridge, late_io) = crate::helper::bridge(&runtime, "same");
            let late_client = late.serve(late_io).await.expect("initialize");
            assert!(names().await.contains(&"extra".to_owned()));
            set(serde_json::json!(["extra", "more"])).await;
            crate::helper::eventually_async("both hosts told of the change", BOUND, async || {
                seen() == 4 && late_changes.load(std::sync::atomic::Ordering::SeqCst) == 1
            })
            .await;
            late_client.cancel().await.expect("close");
            client.cancel().await.expect("close");
        })
        .await
        .expect("within 120 s");
    });
    drop(d);
}

/// DESIGN §12: a unit's lanes each read the server's lists; the unit
/// publishes one (its own lane's: `mcpctl tools`), each era's hosts get
/// their lane's, and a difference is logged, a warning naming the list
/// and the lanes, once per change. The fixture speaks both eras: a 2025
/// host gets the second process, and its `set_tools` changes that
/// process's list alone.
#[test]
fn two_lanes_that_list_differently_are_logged_once_per_change_and_one_list_is_published() {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("pair.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\n",
    )
    .expect("write unit");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let published = || -> String {
        let out = mcpctl_user(&runtime, &["tools", "pair"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    d.wait_until("the unit's tools", |_| published().contains("echo"));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let host = Counting::default();
    let changes = std::sync::Arc::clone(&host.0);
    let seen = || changes.load(std::sync::atomic::Ordering::SeqCst);
    let entered = rt.enter();
    let (_bridge, io) = crate::helper::bridge(&runtime, "pair");
    drop(entered);
    let client = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(60), host.serve(io)).await })
        .expect("within 60 s")
        .expect("initialize");
    let set = |tools: serde_json::Value| {
        let call = client.call_tool(
            CallToolRequestParams::new("set_tools").with_arguments(
                serde_json::json!({"tools": tools})
                    .as_object()
                    .cloned()
                    .expect("obj"),
            ),
        );
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(60), call).await })
            .expect("within 60 s")
            .expect("set_tools");
    };
    let host_names = || -> Vec<String> {
        let list = client.list_all_tools();
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(60), list).await })
            .expect("within 60 s")
            .expect("tools/list")
            .iter()
            .map(|t| t.name.to_string())
            .collect()
    };
    // The 2025 host's process lists one more tool than the unit's own.
    set(serde_json::json!(["lane-only"]));
    let warned = d.wait_for("differ (");
    assert!(
        warned.contains(
            "the tools of lanes pair (2026-07-28) and pair@2025-11-25 (2025-11-25) differ (only pair@2025-11-25: lane-only)"
        ),
        "{warned}"
    );
    assert!(warned.contains("WARN"), "{warned}");
    // One list is published, the unit's own; the host has its lane's.
    assert!(!published().contains("lane-only"), "{}", published());
    assert!(host_names().contains(&"lane-only".to_owned()));
    // The same list again (the server says it changed, it did not): the
    // host hears of it, the log does not.
    set(serde_json::json!(["lane-only"]));
    crate::helper::eventually("the host told twice", BOUND, || seen() == 2);
    // A change while they still differ: told again, as it is now.
    set(serde_json::json!(["other"]));
    let again = d.wait_for("differ (");
    assert!(
        again.contains("(only pair@2025-11-25: other)"),
        "the next warning is of the next change: {again}"
    );
    assert_eq!(d.count("differ ("), 2, "once per change");
    rt.block_on(async {
        let _ = client.cancel().await;
    });
    assert!(d.stop(rustix::process::Signal::TERM).success());
}
