//! The list reader against real servers with hostile lists (cursors that
//! cycle, endless or huge lists) beside a healthy one, under the real
//! `mcpd`; the reader's own rules are table-tested in `pure/lists.rs`.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::helper::{Daemon, mcpctl_user, mcpctl_user_command, root, rss_kib};

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
