//! Hostile servers and hosts beside well-behaved ones, under the real
//! `mcpd`: what one misbehaving peer cannot do to the daemon or to its
//! neighbours. The servers are `tests/data/hostile_server.py` (raw
//! JSON-RPC, misbehaving exactly as its mode says).

use std::path::Path;

use rustix::process::Signal;

use crate::helper::{BOUND, Daemon, holds_within, root, timed_out};

/// Unit `name` running the hostile server in `mode` (with `arg`), and
/// `extra` unit text.
fn hostile(dir: &Path, name: &str, mode: &[&str], extra: &str) {
    let script = root().join("tests/data/hostile_server.py");
    let args: String = mode.iter().map(|a| format!(" \"{a}\"")).collect();
    std::fs::write(
        dir.join(format!("{name}.kdl")),
        format!(
            "stdio {{\n    command \"python3\" \"{}\"{args}\n}}\n{extra}",
            script.display()
        ),
    )
    .expect("write unit");
}

#[test]
fn a_ping_answered_after_its_timeout_is_a_miss() {
    let units = tempfile::tempdir().expect("tempdir");
    // every ping is answered 1.3 s late, with a timeout of 1 s
    hostile(
        units.path(),
        "late",
        &["slow-ping", "1.3"],
        "health {\n    interval \"1s\"\n    timeout \"1s\"\n    failures 2\n}\n\
         reconnect {\n    initial-delay \"100ms\"\n}\n",
    );
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("late running", |d| d.starts("late") == 1);
    let line = d.wait_for("no answer to ping (2 probes, 1s each)");
    assert!(line.contains("mcpd_server=late"), "{line}");
    d.wait_until("late running again", |d| d.starts("late") == 2);
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn what_is_not_json_rpc_2_0_is_refused_at_once_and_unknown_members_never_reach_the_server() {
    use serde_json::json;
    let units = tempfile::tempdir().expect("tempdir");
    hostile(units.path(), "strict", &["strict"], "");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("strict running", |d| d.starts("strict") == 1);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(std::time::Duration::from_secs(30), async {
            let mut host = crate::daemon::session::Raw::new(&runtime, "strict");
            host.send(concat!(
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#, "\n",
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#, "\n",
            ).as_bytes())
            .await;
            assert_eq!(host.answer().await["id"], 1);
            for (line, id, why) in [
                (r#"{"jsonrpc":"1.0","id":2,"method":"tools/list"}"#, json!(2), "jsonrpc must be \"2.0\""),
                (r#"{"id":3,"method":"ping"}"#, json!(3), "jsonrpc must be \"2.0\""),
                (r#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#, json!(null), "a request id must be a string or an integer (64 bits)"),
                (r#"{"jsonrpc":"2.0","id":{"x":1},"method":"tools/call","params":{"name":"echo"}}"#, json!(null), "a request id must be a string or an integer (64 bits)"),
            ] {
                host.send(format!("{line}\n").as_bytes()).await;
                let refused = host.answer().await;
                assert_eq!(
                    (&refused["id"], &refused["error"]["code"], refused["error"]["message"].as_str()),
                    (&id, &json!(-32600), Some(why)),
                    "{line}: {refused}"
                );
            }
            // a member JSON-RPC does not have is dropped on the way: the
            // strict server answers instead of ignoring the request
            host.send(b"{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{\"text\":\"through\"}},\"trace\":\"x\"}\n").await;
            let echo = host.answer().await;
            assert_eq!(echo["id"], 4, "{echo}");
            assert_eq!(echo["result"]["content"][0]["text"], "through", "{echo}");
        })
        .await
        .expect("within 30 s");
    });
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_host_that_never_reads_large_answers_is_detached_and_the_daemon_stays_small() {
    let units = tempfile::tempdir().expect("tempdir");
    hostile(units.path(), "big", &["plain"], "");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("big running", |d| d.starts("big") == 1);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let pid = d.pid();
    let baseline = crate::helper::rss_kib(pid);
    let init = concat!(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
        "\n",
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        "\n",
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut peak = 0;
    rt.block_on(async {
        tokio::time::timeout(std::time::Duration::from_secs(60), async {
            let mut sink = crate::daemon::session::Raw::new(&runtime, "big");
            sink.send(init.as_bytes()).await;
            assert_eq!(sink.answer().await["id"], 1);
            // 24 answers of 8 MiB asked for, none read
            let mut calls = String::new();
            for id in 2..26 {
                calls.push_str(&format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"big\",\"arguments\":{{\"n\":{}}}}}}}\n",
                    8 << 20
                ));
            }
            sink.send(calls.as_bytes()).await;
            let detaching = |d: &Daemon| d.seen.iter().any(|l| l.contains("detaching host session"));
            let detached = holds_within(BOUND, || {
                if detaching(&d) {
                    return true;
                }
                peak = peak.max(crate::helper::rss_kib(pid));
                d.read_until(std::time::Duration::from_millis(50), detaching)
            });
            assert!(
                detached,
                "{}; mcpd logged:\n{}",
                timed_out("the host to be detached", BOUND),
                d.seen.join("\n")
            );
            // the daemon goes on serving a host that reads
            let mut good = crate::daemon::session::Raw::new(&runtime, "big");
            good.send(init.as_bytes()).await;
            assert_eq!(good.answer().await["id"], 1);
            good.send(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{\"text\":\"here\"}}}\n").await;
            let echo = good.answer().await;
            assert_eq!(echo["result"]["content"][0]["text"], "here", "{echo}");
            drop(sink);
        })
        .await
        .expect("within 60 s");
    });
    let detached = d
        .seen
        .iter()
        .find(|l| l.contains("detaching host session"))
        .expect("detached");
    assert!(
        detached.contains("it stopped reading its messages"),
        "{detached}"
    );
    assert!(detached.contains("mcpd_server=big"), "{detached}");
    assert!(peak < 256 * 1024, "daemon RSS peaked at {peak} KiB");
    // once the peer is gone, the daemon gives the memory back (within
    // 16 MiB of where it started)
    let mut now = 0;
    let within = std::time::Duration::from_secs(20);
    let given_back = holds_within(within, || {
        now = crate::helper::rss_kib(pid);
        if now <= baseline + 16 * 1024 {
            return true;
        }
        d.read_for(std::time::Duration::from_millis(100));
        false
    });
    assert!(
        given_back,
        "{}: {now} KiB, {baseline} KiB at the start",
        timed_out("the daemon's RSS to come down", within)
    );
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_log_flood_is_rate_limited_and_a_slow_reading_host_keeps_its_session_and_every_answer() {
    use serde_json::{Value, json};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let units = tempfile::tempdir().expect("tempdir");
    hostile(
        units.path(),
        "flood",
        &["log-flood", "100000"],
        "log-rate-limit 100 \"30s\"\n",
    );
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("flood running", |d| d.starts("flood") == 1);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (answers, notices) = rt.block_on(async {
        tokio::time::timeout(std::time::Duration::from_secs(90), async {
            let (_bridge, (stdout, mut stdin)) = crate::helper::bridge(&runtime, "flood");
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            let mut send = async |line: String| {
                stdin.write_all(format!("{line}\n").as_bytes()).await.expect("write");
                stdin.flush().await.expect("flush");
            };
            send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "slow", "version": "1"}}}).to_string()).await;
            send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string()).await;
            send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "flood", "arguments": {}}}).to_string()).await;
            for id in 10..20 {
                send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": format!("echo {id}")}}}).to_string()).await;
            }
            // A host that reads every line, slowly (a millisecond each):
            // it falls behind the flood but never stops reading.
            let mut answers = std::collections::BTreeMap::new();
            let mut notices = Vec::new();
            let mut pinged = false;
            // Until it is told what it missed, once it caught up: before
            // the next message after that, so it keeps asking (a ping
            // each time the last was answered).
            let mut next_ping = 99;
            while notices.is_empty() || !answers.contains_key(&99) {
                let line = lines.next_line().await.expect("read").expect("the session ended");
                let message: Value = serde_json::from_str(&line).expect("json");
                if let Some(id) = message["id"].as_u64() {
                    answers.insert(id, message);
                } else if message["params"]["logger"] == "mcpd" {
                    notices.push(message["params"]["data"].as_str().unwrap_or_default().to_owned());
                }
                // answers 1, 2 and 10..20 are in: one more request, behind
                // the flood
                if answers.len() >= 12 && (!pinged || answers.contains_key(&(next_ping - 1))) {
                    assert!(next_ping < 10_000, "never told what it missed");
                    send(json!({"jsonrpc": "2.0", "id": next_ping, "method": "ping"}).to_string()).await;
                    pinged = true;
                    next_ping += 1;
                }
                // (scenario: the slow reader's millisecond per line)
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            (answers, notices)
        })
        .await
        .expect("within 90 s")
    });
    // lossless answers
    assert_eq!(answers[&2]["result"]["content"][0]["text"], "flooding");
    for id in 10..20u64 {
        assert_eq!(
            answers[&id]["result"]["content"][0]["text"],
            format!("echo {id}"),
            "{:?}",
            answers[&id]
        );
    }
    assert_eq!(answers[&99]["result"], json!({}));
    // told what it missed
    assert!(
        notices.iter().any(|n| n.starts_with("mcpd dropped ")
            && n.ends_with(" for this session while it was behind")),
        "{notices:?}"
    );
    // never detached; the daemon's log kept to the unit's rate limit
    d.wait_for("log-rate-limit reached: dropping its log messages until ");
    assert_eq!(d.count("detaching host session"), 0, "{:?}", d.seen);
    let logged = d
        .about("flood")
        .filter(|l| l.contains("mcpd::server") && l.contains("flood "))
        .count();
    assert!(logged <= 100, "{logged} log lines of the flood");
    // and said, once, that it drops them from now on
    assert_eq!(
        d.about("flood")
            .filter(|l| l.contains("log-rate-limit reached: dropping its log messages until "))
            .count(),
        1,
        "{:?}",
        d.seen
    );
    let out = crate::helper::mcpctl_user(&runtime, &["status", "flood", "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        status[0]["dropped_notifications"].as_u64() > Some(0),
        "{status}"
    );
    assert_eq!(status[0]["detached_sessions"], 0, "{status}");
    assert!(d.stop(Signal::TERM).success());
}

/// A host session on the attach socket that has said nothing yet: the
/// daemon's reply line, and the session's socket.
fn session(
    runtime: &Path,
    name: &str,
) -> (String, std::io::BufReader<std::os::unix::net::UnixStream>) {
    crate::daemon::bridge::attach_raw(
        runtime,
        format!("{{\"server\":\"{name}\"}}\n").as_bytes(),
        &[],
    )
}

/// The next line of a session's socket, as JSON (`None` at its end).
fn next(
    socket: &mut std::io::BufReader<std::os::unix::net::UnixStream>,
) -> Option<serde_json::Value> {
    use std::io::BufRead;
    let mut line = String::new();
    match socket.read_line(&mut line).expect("read") {
        0 => None,
        _ => Some(serde_json::from_str(&line).expect("json")),
    }
}

const INITIALIZE: &str = concat!(
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
    "\n",
    r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    "\n",
);

#[test]
fn sessions_are_bounded_per_unit_and_one_that_never_initializes_is_let_go() {
    use std::io::Write;
    let units = tempfile::tempdir().expect("tempdir");
    hostile(units.path(), "many", &["plain"], "");
    let timeout: &std::ffi::OsStr = "3s".as_ref();
    let mut d = Daemon::user_no_bus(units.path(), &[("MCPD_INITIALIZE_TIMEOUT", timeout)]);
    d.wait_until("many running", |d| d.starts("many") == 1);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let max = mcpd::supervisor::MAX_SESSIONS;
    // as many sessions as a unit may have, none of them initializing
    let mut silent: Vec<_> = (0..max)
        .map(|_| {
            let (reply, socket) = session(&runtime, "many");
            assert!(reply.contains("attached"), "{reply}");
            socket
        })
        .collect();
    // one more is refused, saying why
    let (reply, mut extra) = session(&runtime, "many");
    assert!(reply.contains("attached"), "{reply}");
    let refusal = next(&mut extra).expect("a refusal");
    assert_eq!(refusal["error"]["code"], -32600, "{refusal}");
    assert_eq!(
        refusal["error"]["message"],
        format!("too many sessions on server many (at most {max})")
    );
    assert!(next(&mut extra).is_none(), "and the session ends");
    // the silent ones are let go after MCPD_INITIALIZE_TIMEOUT
    for socket in &mut silent {
        assert!(next(socket).is_none(), "a silent session ends");
    }
    d.wait_until("every silent session let go", |d| {
        d.count("it sent no initialize in time") == max
    });
    // a session that initializes is served
    let (reply, mut host) = session(&runtime, "many");
    assert!(reply.contains("attached"), "{reply}");
    host.get_mut()
        .write_all(INITIALIZE.as_bytes())
        .expect("write");
    let init = next(&mut host).expect("an answer");
    assert_eq!(init["result"]["serverInfo"]["name"], "hostile", "{init}");
    let out = crate::helper::mcpctl_user(&runtime, &["status", "many", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status[0]["detached_sessions"], max, "{status}");
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn requests_in_flight_are_bounded_per_unit_as_well_as_per_session() {
    use std::io::Write;
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("busy.kdl"),
        // One process (its bound is the unit's): pinned to one era.
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\nprotocol \"2026-07-28\"\nhealth {\n    enabled #false\n}\n",
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("busy running", |d| d.starts("busy") == 1);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let per_host = mcpd::supervisor::MAX_IN_FLIGHT;
    let per_unit = mcpd::supervisor::MAX_UNIT_IN_FLIGHT;
    let hang = |id: usize| {
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"hang\",\"arguments\":{{}}}}}}\n"
        )
    };
    let mut hosts = Vec::new();
    for _ in 0..per_unit / per_host {
        let (reply, mut host) = session(&runtime, "busy");
        assert!(reply.contains("attached"), "{reply}");
        host.get_mut()
            .write_all(INITIALIZE.as_bytes())
            .expect("write");
        assert_eq!(next(&mut host).expect("initialize")["id"], 1);
        let calls: String = (0..per_host).map(|i| hang(100 + i)).collect();
        host.get_mut().write_all(calls.as_bytes()).expect("write");
        hosts.push(host);
    }
    // one more host: its call is refused, naming the unit's bound, once
    // the others' are all in flight (a ping of each is answered after)
    for host in &mut hosts {
        host.get_mut()
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":\"p\",\"method\":\"ping\"}\n")
            .expect("write");
        // (refused: the session has its 1,024 in flight)
        let pong = next(host).expect("pong");
        assert_eq!(pong["id"], "p", "{pong}");
    }
    let (reply, mut late) = session(&runtime, "busy");
    assert!(reply.contains("attached"), "{reply}");
    late.get_mut()
        .write_all(INITIALIZE.as_bytes())
        .expect("write");
    assert_eq!(next(&mut late).expect("initialize")["id"], 1);
    late.get_mut().write_all(hang(7).as_bytes()).expect("write");
    let refused = next(&mut late).expect("a refusal");
    assert_eq!(refused["id"], 7, "{refused}");
    assert_eq!(
        refused["error"]["message"],
        format!(
            "too many requests in flight on server busy (at most {per_unit} for all its sessions)"
        )
    );
    drop(hosts);
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn an_answer_over_the_line_limit_is_an_error_to_the_host_at_once() {
    use serde_json::json;
    let units = tempfile::tempdir().expect("tempdir");
    hostile(units.path(), "first", &["plain"], "");
    hostile(units.path(), "last", &["id-last"], "");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("both running", |d| {
        d.starts("first") == 1 && d.starts("last") == 1
    });
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(std::time::Duration::from_secs(60), async {
            // the id first (most servers) or last (the TypeScript SDK)
            for name in ["first", "last"] {
                let mut host = crate::daemon::session::Raw::new(&runtime, name);
                host.send(INITIALIZE.as_bytes()).await;
                assert_eq!(host.answer().await["id"], 1);
                host.send(format!("{{\"jsonrpc\":\"2.0\",\"id\":\"big\",\"method\":\"tools/call\",\"params\":{{\"name\":\"big\",\"arguments\":{{\"n\":{}}}}}}}\n", 17 << 20).as_bytes()).await;
                let answer = host.answer().await;
                assert_eq!(answer["id"], "big", "{name}: {answer}");
                assert_eq!(answer["error"]["code"], -32603, "{name}: {answer}");
                assert_eq!(
                    answer["error"]["message"],
                    "the server's answer exceeded mcpd's limit of 16 MiB per message and was dropped",
                    "{name}"
                );
                // the session goes on
                host.send(b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{\"text\":\"on\"}}}\n").await;
                assert_eq!(host.answer().await["result"]["content"][0]["text"], json!("on"));
            }
        })
        .await
        .expect("within 60 s");
    });
    // each call counted as failed
    for name in ["first", "last"] {
        let out = crate::helper::mcpctl_user(&runtime, &["status", name, "--json"]);
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(
            (
                status[0]["calls"].as_u64(),
                status[0]["failed_calls"].as_u64()
            ),
            (Some(2), Some(1)),
            "{status}"
        );
    }
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn garbage_on_stdout_is_counted_logged_within_the_rate_limit_and_ends_the_generation_past_a_bound()
{
    let units = tempfile::tempdir().expect("tempdir");
    hostile(
        units.path(),
        "some",
        &["garbage"],
        "log-rate-limit 20 \"30s\"\n",
    );
    hostile(
        units.path(),
        "binary",
        &["binary"],
        "log-rate-limit 20 \"30s\"\nreconnect {\n    initial-delay \"100ms\"\n}\n",
    );
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("both running", |d| {
        d.starts("some") == 1 && d.starts("binary") == 1
    });
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let status = |name: &str| {
        let out = crate::helper::mcpctl_user(&runtime, &["status", name, "--json"]);
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        status[0].clone()
    };
    // a few lines of garbage: counted and logged, the server serves on
    let out = crate::helper::mcpctl_user(&runtime, &["call", "some", "garbage", r#"{"n":50}"#]);
    assert!(out.status.success(), "{out:?}");
    let s = status("some");
    assert_eq!(s["garbage_lines"], 50, "{s}");
    assert_eq!(
        (s["state"].as_str(), s["generation"].as_u64()),
        (Some("running"), Some(1)),
        "{s}"
    );
    let text = crate::helper::mcpctl_user(&runtime, &["status", "some"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("Misbehaved: 50 lines of garbage"), "{text}");
    // binary for ever: the connection fails past the bound, the server is
    // restarted, and the log holds what the rate limit lets through
    let _ = crate::helper::mcpctl_user(&runtime, &["call", "binary", "garbage", "{}"]);
    d.wait_for("lines in a row that are not JSON-RPC messages");
    d.wait_until("binary running again", |d| d.starts("binary") == 2);
    let logged = d
        .about("binary")
        .filter(|l| l.contains("not a JSON-RPC message") || l.contains("not JSON-RPC messages ("))
        .count();
    assert!((1..=20).contains(&logged), "{logged} lines about garbage");
    assert!(status("binary")["garbage_lines"].as_u64() >= Some(10_000));
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_server_that_dies_with_requests_in_flight_names_the_sessions_that_had_them() {
    use std::io::Write;
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("frail.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\n",
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("frail running", |d| d.starts("frail") == 1);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let (reply, mut host) = session(&runtime, "frail");
    assert!(reply.contains("attached"), "{reply}");
    host.get_mut()
        .write_all(INITIALIZE.as_bytes())
        .expect("write");
    assert_eq!(next(&mut host).expect("initialize")["id"], 1);
    host.get_mut()
        .write_all(concat!(
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"hang","arguments":{}}}"#, "\n",
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"crash","arguments":{}}}"#, "\n",
        ).as_bytes())
        .expect("write");
    // the crash is answered, then the call in flight fails with the loss
    loop {
        let answer = next(&mut host).expect("an answer");
        if answer["id"] == 2 {
            assert!(
                answer["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("connection lost")),
                "{answer}"
            );
            break;
        }
    }
    let line = d.wait_for("with requests in flight from");
    let uid = rustix::process::getuid().as_raw();
    assert!(
        line.contains(&format!("(pid {}, uid {uid}): 1", std::process::id())),
        "{line}"
    );
    assert!(line.contains("mcpd_server=frail"), "{line}");
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_request_over_max_request_size_is_refused_and_never_reaches_the_server() {
    use std::io::Write;
    let units = tempfile::tempdir().expect("tempdir");
    hostile(
        units.path(),
        "small",
        &["plain"],
        "max-request-size \"1K\"\n",
    );
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("small running", |d| d.starts("small") == 1);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let (reply, mut host) = session(&runtime, "small");
    assert!(reply.contains("attached"), "{reply}");
    host.get_mut()
        .write_all(INITIALIZE.as_bytes())
        .expect("write");
    assert_eq!(next(&mut host).expect("initialize")["id"], 1);
    let call = |id: u32, text: &str| {
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"echo\",\"arguments\":{{\"text\":\"{text}\"}}}}}}\n"
        )
    };
    host.get_mut()
        .write_all(call(2, &"x".repeat(2000)).as_bytes())
        .expect("write");
    let refused = next(&mut host).expect("a refusal");
    assert_eq!(refused["id"], 2, "{refused}");
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    let message = refused["error"]["message"].as_str().expect("message");
    assert!(
        message.starts_with("a request of ")
            && message
                .ends_with(" bytes is over the max-request-size of server small (1024 bytes)"),
        "{message}"
    );
    host.get_mut()
        .write_all(call(3, "fits").as_bytes())
        .expect("write");
    assert_eq!(
        next(&mut host).expect("an answer")["result"]["content"][0]["text"],
        "fits"
    );
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn what_is_not_a_message_behind_a_waiting_initialize_is_refused_in_its_turn() {
    use std::io::Write;
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("slow.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\" \"--slow-start\" \"1s\"\n}\n",
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_for("mcpd::supervisor: starting");
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let (reply, mut host) = session(&runtime, "slow");
    assert!(reply.contains("attached"), "{reply}");
    // while the server starts: initialize, a line that is not JSON, a ping
    host.get_mut()
        .write_all(
            format!("{INITIALIZE}this is not json\n{{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}}\n")
                .as_bytes(),
        )
        .expect("write");
    assert_eq!(next(&mut host).expect("initialize")["id"], 1);
    let refused = next(&mut host).expect("a refusal");
    assert_eq!(refused["error"]["code"], -32700, "{refused}");
    assert_eq!(next(&mut host).expect("pong")["id"], 2);
    assert!(d.stop(Signal::TERM).success());
}

/// Issue 32 item 13 (a 4 s stall of every host on a unit, seen twice
/// beside messages of a million keys): a request of 1,000,000 keys
/// (10 MB, under the 16 MiB line limit) from one host holds up no other host of
/// the unit. Another host's ping, sent once the big request is written,
/// is answered within 2 s, and the big request is answered too.
#[test]
fn a_request_of_a_million_keys_holds_up_no_other_host_of_the_unit() {
    use std::fmt::Write as _;
    use std::io::Write;
    use std::time::{Duration, Instant};
    let units = tempfile::tempdir().expect("tempdir");
    hostile(units.path(), "wide", &["plain"], "");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("wide running", |d| d.starts("wide") == 1);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let host = || {
        let (reply, mut host) = session(&runtime, "wide");
        assert!(reply.contains("attached"), "{reply}");
        host.get_ref()
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        host.get_mut()
            .write_all(INITIALIZE.as_bytes())
            .expect("write");
        assert_eq!(next(&mut host).expect("initialize")["id"], 1);
        host
    };
    let (mut wide, mut other) = (host(), host());
    let mut call = String::with_capacity(16 << 20);
    call.push_str(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"wide""#);
    for i in 0..1_000_000 {
        write!(call, ",\"{i:x}\":0").expect("write");
    }
    call.push_str("}}}\n");
    assert!(
        call.len() < mcpd::mux::lines::MAX_LINE,
        "{} bytes",
        call.len()
    );
    let t0 = Instant::now();
    // returns once the daemon has read all but a socket buffer of it
    wide.get_mut().write_all(call.as_bytes()).expect("write");
    let written = t0.elapsed();
    let asked = Instant::now();
    other
        .get_mut()
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}\n")
        .expect("write");
    assert_eq!(next(&mut other).expect("pong")["id"], 3);
    let pong = asked.elapsed();
    let answer = next(&mut wide).expect("an answer");
    let answered = t0.elapsed();
    assert_eq!(answer["result"]["content"][0]["text"], "wide", "{answer}");
    assert!(
        pong < Duration::from_secs(2),
        "a ping waited {pong:?} behind a request of a million keys (written in {written:?}, answered {answered:?} after it was sent)"
    );
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_server_that_fumbles_server_discover_is_spoken_to_with_initialize() {
    let units = tempfile::tempdir().expect("tempdir");
    for (mode, start) in [
        ("discover-hang", "20s"),
        ("discover-garbage", "60s"),
        ("discover-error", "60s"),
    ] {
        // The probe gets half of the start's time: a server slow to load
        // (Python, under load) is waited for; one that never answers
        // costs it.
        hostile(
            units.path(),
            mode,
            &[mode],
            &format!("protocol \"auto\"\nstartup-timeout \"{start}\"\n"),
        );
    }
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    for (mode, why) in [
        ("discover-hang", "no answer to server/discover within 10s"),
        ("discover-garbage", "server/discover"),
        (
            "discover-error",
            "server/discover failed: what is discover? (-1)",
        ),
    ] {
        d.wait_until_within(&format!("{mode} running"), crate::helper::STARTUP, |d| {
            d.about(mode).any(|l| l.contains("running (pid"))
        });
        // Logged once.
        assert_eq!(
            d.about(mode)
                .filter(|l| l.contains("speaking MCP 2025-11-25") && l.contains(why))
                .count(),
            1,
            "{mode}: {:?}",
            d.about(mode).collect::<Vec<_>>()
        );
        assert_eq!(d.starts(mode), 1, "{mode} established at its first start");
    }
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let out = crate::helper::mcpctl_user(&runtime, &["status", "discover-error"]);
    let status = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(status.contains("   Protocol: 2025-11-25"), "{status}");
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_tool_list_of_megabytes_is_read_and_published_whole_beside_a_healthy_unit() {
    // 40,000 tools in pages of 10,000: some 4 MB of answers, past
    // upstream::LARGE, so the pages are judged and the list made on a
    // blocking thread (the daemon's runtime has one thread).
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("huge.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\" \"--many-tools\" \"40000\" \"--page-size\" \"10000\"\n}\n",
    )
    .expect("write");
    hostile(units.path(), "healthy", &["plain"], "");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("both running", |d| {
        d.starts("huge") == 1 && d.starts("healthy") == 1
    });
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let tools = |name: &str| {
        let out = crate::helper::mcpctl_user(&runtime, &["tools", name]);
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    d.wait_until("the huge list published", |_| tools("huge") >= 40_000);
    assert!(tools("huge") >= 40_000 && tools("healthy") == 4);
    assert!(d.stop(Signal::TERM).success());
}
