//! Hosts that speak MCP 2026-07-28 (no handshake, per-request `_meta`)
//! through `mcpctl bridge`, under the real `mcpd`, over a server of the
//! 2025 era (`mcp-fixture`): raw JSON-RPC lines, so every member of what
//! mcpd answers can be checked, beside a 2025 host on the same unit.

use std::path::Path;
use std::time::Duration;

use rustix::process::Signal;
use serde_json::{Value, json};

use crate::daemon::session::Raw;
use crate::helper::{BOUND, Daemon, eventually_async, mcpctl_user};

/// The `_meta` of a modern request: version 2026-07-28, `caps`, and a log
/// level if `level` is one.
fn meta(caps: Value, level: Option<&str>) -> Value {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "raw-modern", "version": "1"},
    });
    if let Some(level) = level {
        meta["io.modelcontextprotocol/logLevel"] = json!(level);
    }
    meta
}

fn line(value: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(value).expect("json");
    bytes.push(b'\n');
    bytes
}

/// A modern `tools/call` of `tool` with `arguments` and `_meta` `meta`.
fn call(id: u64, tool: &str, arguments: Value, meta: Value) -> Vec<u8> {
    line(&json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": meta},
    }))
}

/// Reads `host`'s lines until the answer to `id`: the answer, and the
/// notifications (and requests) on the way.
async fn until_answer(host: &mut Raw, id: &Value) -> (Value, Vec<Value>) {
    let mut seen = Vec::new();
    loop {
        let line = host.line().await;
        if line.get("method").is_none() && line.get("id") == Some(id) {
            return (line, seen);
        }
        seen.push(line);
    }
}

/// The unit `shared`: mcp-fixture with the tools the host-session tests
/// use, and `env` lines.
fn unit(dir: &Path) {
    std::fs::write(
        dir.join("shared.kdl"),
        // A 2025 server (the fixture speaks both eras; pinned to the old).
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n    \
         env MCP_FIXTURE_TOOLS=\"progress,sample,levels,touch\"\n}\nprotocol \"legacy\"\n",
    )
    .expect("write unit");
}

fn legacy_initialize() -> &'static [u8] {
    concat!(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"sampling":{}},"clientInfo":{"name":"raw-legacy","version":"1"}}}"#,
        "\n",
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        "\n"
    )
    .as_bytes()
}

#[test]
fn a_modern_host_and_a_legacy_host_share_a_unit_each_in_its_own_era() {
    let units = tempfile::tempdir().expect("tempdir");
    unit(units.path());
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("shared running", |d| d.starts("shared") == 1);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            let mut legacy = Raw::new(&runtime, "shared");
            legacy.send(legacy_initialize()).await;
            let init = legacy.answer().await;
            assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
            legacy
                .send(concat!(
                    r#"{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"debug"}}"#,
                    "\n",
                    r#"{"jsonrpc":"2.0","id":3,"method":"resources/subscribe","params":{"uri":"fixture://b"}}"#,
                    "\n"
                ).as_bytes())
                .await;
            assert_eq!(legacy.answer().await["id"], 2);
            assert_eq!(legacy.answer().await["id"], 3);

            // No initialize: discovery, then requests with their _meta.
            let mut modern = Raw::new(&runtime, "shared");
            modern
                .send(&line(&json!({"jsonrpc": "2.0", "id": "d", "method": "server/discover",
                    "params": {"_meta": meta(json!({}), None)}})))
                .await;
            let discover = modern.answer().await;
            let result = &discover["result"];
            assert_eq!(result["resultType"], "complete", "{discover}");
            let versions = result["supportedVersions"].as_array().expect("versions");
            assert_eq!(versions[0], "2026-07-28", "{discover}");
            assert!(versions.contains(&json!("2025-11-25")), "{discover}");
            assert_eq!(result["capabilities"]["tools"]["listChanged"], true, "{discover}");
            assert_eq!(result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "mcp-fixture", "{discover}");
            assert!(result.get("ttlMs").is_some() && result.get("cacheScope").is_some(), "{discover}");

            modern
                .send(&line(&json!({"jsonrpc": "2.0", "id": 10, "method": "tools/list",
                    "params": {"_meta": meta(json!({}), None)}})))
                .await;
            let tools = modern.answer().await;
            assert_eq!(tools["result"]["resultType"], "complete", "{tools}");
            assert_eq!(tools["result"]["cacheScope"], "private", "{tools}");
            assert_eq!(tools["result"]["ttlMs"], 0, "{tools}");
            assert!(tools["result"]["tools"].as_array().expect("tools").iter().any(|t| t["name"] == "echo"));

            modern.send(&call(11, "echo", json!({"text": "modern"}), meta(json!({}), None))).await;
            let (echo, _) = until_answer(&mut modern, &json!(11)).await;
            assert_eq!(echo["result"]["content"][0]["text"], "modern", "{echo}");
            assert_eq!(echo["result"]["resultType"], "complete", "{echo}");
            assert_eq!(echo["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "mcp-fixture", "{echo}");

            // A listen stream for fixture://a: acknowledged, tagged.
            modern
                .send(&line(&json!({"jsonrpc": "2.0", "id": "listen", "method": "subscriptions/listen",
                    "params": {"_meta": meta(json!({}), None),
                               "notifications": {"toolsListChanged": true, "resourceSubscriptions": ["fixture://a"]}}})))
                .await;
            let ack = modern.line().await;
            assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
            assert_eq!(ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "listen", "{ack}");
            assert_eq!(ack["params"]["notifications"]["toolsListChanged"], true, "{ack}");
            assert_eq!(ack["params"]["notifications"]["resourceSubscriptions"], json!(["fixture://a"]), "{ack}");

            // Updates reach their own subscribers only.
            modern.send(&call(12, "touch", json!({"uri": "fixture://a"}), meta(json!({}), None))).await;
            let (_, seen) = until_answer(&mut modern, &json!(12)).await;
            let updated: Vec<&Value> = seen.iter().filter(|m| m["method"] == "notifications/resources/updated").collect();
            assert_eq!(updated.len(), 1, "{seen:?}");
            assert_eq!(updated[0]["params"]["uri"], "fixture://a");
            assert_eq!(updated[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "listen");
            modern.send(&call(13, "touch", json!({"uri": "fixture://b"}), meta(json!({}), None))).await;
            let (_, seen) = until_answer(&mut modern, &json!(13)).await;
            assert!(seen.iter().all(|m| m["method"] != "notifications/resources/updated"), "{seen:?}");

            // Cancelling the stream ends it: no more updates.
            modern
                .send(&line(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                    "params": {"requestId": "listen"}})))
                .await;
            modern.send(&call(20, "touch", json!({"uri": "fixture://a"}), meta(json!({}), None))).await;
            let (_, seen) = until_answer(&mut modern, &json!(20)).await;
            assert!(seen.iter().all(|m| m["method"] != "notifications/resources/updated"), "{seen:?}");

            // Log messages: only for its request that asked, from its level up.
            modern.send(&call(14, "levels", json!({}), meta(json!({}), Some("warning")))).await;
            let (_, seen) = until_answer(&mut modern, &json!(14)).await;
            let levels: Vec<&str> = seen
                .iter()
                .filter(|m| m["method"] == "notifications/message")
                .filter_map(|m| m["params"]["level"].as_str())
                .collect();
            assert_eq!(levels, ["warning", "error", "critical", "alert", "emergency"], "{seen:?}");
            modern.send(&call(15, "levels", json!({}), meta(json!({}), None))).await;
            let (_, seen) = until_answer(&mut modern, &json!(15)).await;
            assert!(seen.iter().all(|m| m["method"] != "notifications/message"), "{seen:?}");

            // Progress, with its own token.
            let mut with_token = meta(json!({}), None);
            with_token["progressToken"] = json!("m-token");
            modern.send(&call(16, "progress", json!({"steps": 2}), with_token)).await;
            let (_, seen) = until_answer(&mut modern, &json!(16)).await;
            let progress: Vec<&Value> = seen.iter().filter(|m| m["method"] == "notifications/progress").collect();
            assert_eq!(progress.len(), 2, "{seen:?}");
            assert!(progress.iter().all(|p| p["params"]["progressToken"] == "m-token"));

            // Sampling: input_required, answered by the retry.
            modern.send(&call(17, "sample", json!({"text": "q?"}), meta(json!({"sampling": {}}), None))).await;
            let (asked, _) = until_answer(&mut modern, &json!(17)).await;
            let result = &asked["result"];
            assert_eq!(result["resultType"], "input_required", "{asked}");
            let requests = result["inputRequests"].as_object().expect("inputRequests");
            assert_eq!(requests.len(), 1, "{asked}");
            let (key, request) = requests.iter().next().expect("one");
            assert_eq!(request["method"], "sampling/createMessage", "{asked}");
            let state = result["requestState"].as_str().expect("requestState");
            modern
                .send(&line(&json!({"jsonrpc": "2.0", "id": 18, "method": "tools/call", "params": {
                    "name": "sample", "arguments": {"text": "q?"}, "_meta": meta(json!({"sampling": {}}), None),
                    "requestState": state,
                    "inputResponses": {key: {"role": "assistant", "model": "m",
                        "content": {"type": "text", "text": "sampled by the modern host"}}},
                }})))
                .await;
            let (sampled, _) = until_answer(&mut modern, &json!(18)).await;
            assert_eq!(sampled["result"]["content"][0]["text"], "sampled by the modern host", "{sampled}");
            assert_eq!(sampled["result"]["resultType"], "complete", "{sampled}");
            // The same state again: used once.
            modern
                .send(&line(&json!({"jsonrpc": "2.0", "id": 19, "method": "tools/call", "params": {
                    "name": "sample", "_meta": meta(json!({"sampling": {}}), None),
                    "requestState": state, "inputResponses": {},
                }})))
                .await;
            let (replayed, _) = until_answer(&mut modern, &json!(19)).await;
            assert_eq!(replayed["error"]["code"], -32602, "{replayed}");

            // The legacy host, meanwhile: its own subscription, every level
            // (it asked for debug), none of the modern host's updates.
            legacy
                .send(&line(&json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                    "params": {"name": "touch", "arguments": {"uri": "fixture://b"}}})))
                .await;
            let (answer, seen) = until_answer(&mut legacy, &json!(4)).await;
            assert!(answer.get("result").is_some() && answer["result"].get("resultType").is_none(), "{answer}");
            // fixture://b, touched by the modern host and by itself; never
            // fixture://a, the modern host's.
            let updated: Vec<&Value> = seen.iter().filter(|m| m["method"] == "notifications/resources/updated").collect();
            assert_eq!(updated.len(), 2, "{seen:?}");
            assert!(updated.iter().all(|u| u["params"]["uri"] == "fixture://b" && u["params"].get("_meta").is_none()), "{seen:?}");
            let logs = seen.iter().filter(|m| m["method"] == "notifications/message").count();
            assert_eq!(logs, 16, "every level of both `levels` calls: {seen:?}");
            assert!(seen.iter().all(|m| m["method"] != "notifications/progress"), "{seen:?}");

            let status = mcpctl_user(&runtime, &["status", "shared"]);
            let status = String::from_utf8_lossy(&status.stdout).into_owned();
            assert!(status.contains("   Sessions: 2 (1 on 2026-07-28, 1 on 2025-11-25)"), "{status}");
        })
        .await
        .expect("within 60 s");
    });
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn bad_modern_requests_get_errors_and_an_input_not_given_in_time_is_withdrawn() {
    let units = tempfile::tempdir().expect("tempdir");
    unit(units.path());
    let mut d = Daemon::user_no_bus(units.path(), &[("MCPD_INPUT_TIMEOUT", "1".as_ref())]);
    d.wait_until("shared running", |d| d.starts("shared") == 1);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    // Its resource list read (a URI is judged by it; before, any passes).
    d.wait_until("the resource list read", |_| {
        let out = mcpctl_user(&runtime, &["resources", "shared"]);
        String::from_utf8_lossy(&out.stdout).contains("fixture://a")
    });
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let state = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            let mut host = Raw::new(&runtime, "shared");
            // A version mcpd does not serve.
            let mut wrong = meta(json!({}), None);
            wrong["io.modelcontextprotocol/protocolVersion"] = json!("2099-01-01");
            host.send(&call(1, "echo", json!({"text": "x"}), wrong)).await;
            let answer = host.answer().await;
            assert_eq!(answer["error"]["code"], -32022, "{answer}");
            assert_eq!(answer["error"]["data"]["requested"], "2099-01-01", "{answer}");
            let supported = &answer["error"]["data"]["supported"];
            assert!(supported.as_array().is_some_and(|s| s.contains(&json!("2026-07-28"))), "{answer}");
            // No capabilities.
            let mut bare = meta(json!({}), None);
            bare.as_object_mut().expect("meta").remove("io.modelcontextprotocol/clientCapabilities");
            host.send(&call(2, "echo", json!({"text": "x"}), bare)).await;
            let answer = host.answer().await;
            assert_eq!(answer["error"]["code"], -32602, "{answer}");
            assert!(answer["error"]["message"].as_str().expect("message").contains("clientCapabilities"), "{answer}");
            // A request that needs a capability its request did not declare.
            host.send(&call(3, "sample", json!({"text": "x"}), meta(json!({}), None))).await;
            let answer = host.answer().await;
            assert_eq!(answer["error"]["code"], -32021, "{answer}");
            assert!(answer["error"]["data"]["requiredCapabilities"].get("sampling").is_some(), "{answer}");
            // A forged state.
            host
                .send(&line(&json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
                    "name": "sample", "_meta": meta(json!({"sampling": {}}), None),
                    "requestState": "mcpd:00000000000000000000000000000000:1", "inputResponses": {},
                }})))
                .await;
            let answer = host.answer().await;
            assert_eq!(answer["error"]["code"], -32602, "{answer}");
            // A listen stream for a URI the server has not.
            host
                .send(&line(&json!({"jsonrpc": "2.0", "id": 5, "method": "subscriptions/listen",
                    "params": {"_meta": meta(json!({}), None),
                               "notifications": {"resourceSubscriptions": ["fixture://nowhere"]}}})))
                .await;
            let answer = host.answer().await;
            assert_eq!(answer["error"]["code"], -32602, "{answer}");
            assert!(answer["error"]["message"].as_str().expect("message").contains("fixture://nowhere"), "{answer}");
            // The session is modern now: a handshake cannot join it.
            host
                .send(concat!(
                    r#"{"jsonrpc":"2.0","id":6,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}"#,
                    "\n"
                ).as_bytes())
                .await;
            let answer = host.answer().await;
            assert_eq!(answer["error"]["code"], -32022, "{answer}");
            assert_eq!(answer["error"]["data"]["supported"], json!(["2026-07-28"]), "{answer}");

            // A legacy session cannot send a modern request either.
            let mut legacy = Raw::new(&runtime, "shared");
            legacy.send(legacy_initialize()).await;
            legacy.answer().await;
            legacy.send(&call(7, "echo", json!({"text": "x"}), meta(json!({}), None))).await;
            let answer = legacy.answer().await;
            assert_eq!(answer["error"]["code"], -32600, "{answer}");
            assert!(answer["error"]["message"].as_str().expect("message").contains("began with initialize"), "{answer}");

            // An input asked for and never given.
            host.send(&call(8, "sample", json!({"text": "x"}), meta(json!({"sampling": {}}), None))).await;
            let (asked, _) = until_answer(&mut host, &json!(8)).await;
            assert_eq!(asked["result"]["resultType"], "input_required", "{asked}");
            (host, asked["result"]["requestState"].as_str().expect("state").to_owned())
        })
        .await
        .expect("within 60 s")
    });
    let (mut host, state) = state;
    // The call is withdrawn after MCPD_INPUT_TIMEOUT: the server's request
    // gets an error, and a retry after that is refused.
    d.wait_for("was not supplied within 1s");
    rt.block_on(async {
        host.send(&line(&json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
            "name": "sample", "_meta": meta(json!({"sampling": {}}), None),
            "requestState": state,
            "inputResponses": {"1": {"role": "assistant", "model": "m", "content": {"type": "text", "text": "late"}}},
        }})))
        .await;
        let answer = host.answer().await;
        assert_eq!(answer["error"]["code"], -32602, "{answer}");
        // The session still works.
        host.send(&call(10, "echo", json!({"text": "still"}), meta(json!({}), None))).await;
        let (answer, _) = until_answer(&mut host, &json!(10)).await;
        assert_eq!(answer["result"]["content"][0]["text"], "still", "{answer}");
    });
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn discovery_and_lists_never_start_an_idle_server() {
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("lazy.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\n\
         start \"on-demand\"\nidle-stop \"2s\"\nstop-timeout \"2s\"\n",
    )
    .expect("write unit");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    // Started once to learn its lists, then idle.
    d.wait_until("lazy started once", |d| d.starts("lazy") == 1);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    d.wait_until("lazy idle", |_| {
        let status = mcpctl_user(&runtime, &["status", "lazy"]);
        String::from_utf8_lossy(&status.stdout).contains("Active: idle")
    });
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let mut host = Raw::new(&runtime, "lazy");
            host.send(&line(
                &json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover",
                "params": {"_meta": meta(json!({}), None)}}),
            ))
            .await;
            let discover = host.answer().await;
            assert_eq!(
                discover["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
                "mcp-fixture",
                "{discover}"
            );
            host.send(&line(
                &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list",
                "params": {"_meta": meta(json!({}), None)}}),
            ))
            .await;
            let tools = host.answer().await;
            assert_eq!(tools["result"]["resultType"], "complete", "{tools}");
        })
        .await
        .expect("within 30 s");
    });
    // Still idle after both answers (a start asked for would show as
    // starting or running by now), and started once.
    let status = mcpctl_user(&runtime, &["status", "lazy"]);
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(status.contains("Active: idle"), "{status}");
    assert_eq!(d.starts("lazy"), 1, "discovery and lists started nothing");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let mut host = Raw::new(&runtime, "lazy");
            host.send(&call(
                3,
                "echo",
                json!({"text": "wake"}),
                meta(json!({}), None),
            ))
            .await;
            let (answer, _) = until_answer(&mut host, &json!(3)).await;
            assert_eq!(answer["result"]["content"][0]["text"], "wake", "{answer}");
        })
        .await
        .expect("within 30 s");
    });
    d.wait_until("lazy started by the call", |d| d.starts("lazy") == 2);
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_legacy_host_of_a_2026_07_28_server_gets_its_requests_updates_and_logs_translated() {
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("pinned.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n    \
         env MCP_FIXTURE_TOOLS=\"levels,touch\"\n}\nprotocol \"2026-07-28\"\n\
         health {\n    interval \"300ms\"\n    timeout \"300ms\"\n    failures 3\n}\n",
    )
    .expect("write unit");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("pinned running", |d| d.starts("pinned") == 1);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let status = || {
        let out = mcpctl_user(&runtime, &["status", "pinned"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Probed by server/discover (there is no ping), and alive.
    d.wait_until("a probe answered", |_| {
        status().contains("Health: ok, ping")
    });
    let shown = status();
    assert!(shown.contains("   Protocol: 2026-07-28"), "{shown}");
    assert!(shown.contains(" Generation: 1"), "{shown}");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let mut host = Raw::new(&runtime, "pinned");
            host.send(legacy_initialize()).await;
            let init = host.answer().await;
            assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
            assert_eq!(init["result"]["serverInfo"]["name"], "mcp-fixture", "{init}");
            host.send(concat!(
                r#"{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"error"}}"#, "\n",
                r#"{"jsonrpc":"2.0","id":3,"method":"resources/subscribe","params":{"uri":"fixture://a"}}"#, "\n",
            ).as_bytes())
            .await;
            assert_eq!(host.answer().await["id"], 2);
            assert_eq!(host.answer().await["id"], 3);
            host.send(&line(&json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "hi"}}})))
                .await;
            let (echo, _) = until_answer(&mut host, &json!(4)).await;
            assert_eq!(echo["result"]["content"][0]["text"], "hi", "{echo}");
            // Its level goes with each of its requests.
            host.send(&line(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                "params": {"name": "levels", "arguments": {}}})))
                .await;
            let (_, seen) = until_answer(&mut host, &json!(5)).await;
            let levels: Vec<&str> = seen
                .iter()
                .filter(|m| m["method"] == "notifications/message")
                .filter_map(|m| m["params"]["level"].as_str())
                .collect();
            assert_eq!(levels, ["error", "critical", "alert", "emergency"], "{seen:?}");
            // Its subscription is mcpd's listen stream's.
            host.send(&line(&json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
                "params": {"name": "touch", "arguments": {"uri": "fixture://a"}}})))
                .await;
            let mut updated = None;
            while updated.is_none() {
                let line = host.line().await;
                if line["method"] == "notifications/resources/updated" {
                    updated = Some(line);
                }
            }
            assert_eq!(updated.expect("updated")["params"]["uri"], "fixture://a");
        })
        .await
        .expect("within 30 s");
    });
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn hosts_of_both_eras_on_a_2026_07_28_server_get_only_their_own() {
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("both.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n    \
         env MCP_FIXTURE_TOOLS=\"progress,levels,touch\"\n}\nprotocol \"2026-07-28\"\n",
    )
    .expect("write unit");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("both running", |d| d.starts("both") == 1);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let mut legacy = Raw::new(&runtime, "both");
            legacy.send(legacy_initialize()).await;
            legacy.answer().await;
            legacy
                .send(concat!(
                    r#"{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"debug"}}"#, "\n",
                    r#"{"jsonrpc":"2.0","id":3,"method":"resources/subscribe","params":{"uri":"fixture://b"}}"#, "\n",
                ).as_bytes())
                .await;
            assert_eq!(legacy.answer().await["id"], 2);
            assert_eq!(legacy.answer().await["id"], 3);
            let mut modern = Raw::new(&runtime, "both");
            modern
                .send(&line(&json!({"jsonrpc": "2.0", "id": "listen", "method": "subscriptions/listen",
                    "params": {"_meta": meta(json!({}), None),
                               "notifications": {"resourceSubscriptions": ["fixture://a"]}}})))
                .await;
            let ack = modern.line().await;
            assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
            // The modern host's call: its progress and its logs, its update.
            let mut asked = meta(json!({}), Some("warning"));
            asked["progressToken"] = json!("m");
            modern.send(&call(1, "levels", json!({}), asked.clone())).await;
            let (answer, seen) = until_answer(&mut modern, &json!(1)).await;
            assert_eq!(answer["result"]["resultType"], "complete", "{answer}");
            let levels: Vec<&str> = seen
                .iter()
                .filter(|m| m["method"] == "notifications/message")
                .filter_map(|m| m["params"]["level"].as_str())
                .collect();
            assert_eq!(levels, ["warning", "error", "critical", "alert", "emergency"], "{seen:?}");
            modern.send(&call(2, "progress", json!({"steps": 2}), asked.clone())).await;
            let (_, seen) = until_answer(&mut modern, &json!(2)).await;
            let progress = seen.iter().filter(|m| m["method"] == "notifications/progress").count();
            assert_eq!(progress, 2, "{seen:?}");
            modern.send(&call(3, "touch", json!({"uri": "fixture://a"}), meta(json!({}), None))).await;
            let mut updated = None;
            while updated.is_none() {
                let line = modern.line().await;
                if line["method"] == "notifications/resources/updated" {
                    updated = Some(line);
                }
            }
            let updated = updated.expect("updated");
            assert_eq!(updated["params"]["uri"], "fixture://a");
            assert_eq!(updated["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "listen");
            // The legacy host's own call: all of its levels, its update;
            // nothing of the modern host's.
            legacy
                .send(&line(&json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                    "params": {"name": "levels", "arguments": {}}})))
                .await;
            let (_, seen) = until_answer(&mut legacy, &json!(4)).await;
            let logs = seen.iter().filter(|m| m["method"] == "notifications/message").count();
            assert_eq!(logs, 8, "only its own call's, at its level: {seen:?}");
            assert!(seen.iter().all(|m| m["method"] != "notifications/progress"), "{seen:?}");
            assert!(seen.iter().all(|m| m["method"] != "notifications/resources/updated"), "{seen:?}");
            legacy
                .send(&line(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                    "params": {"name": "touch", "arguments": {"uri": "fixture://b"}}})))
                .await;
            let (_, seen) = until_answer(&mut legacy, &json!(5)).await;
            let updated: Vec<&Value> = seen.iter().filter(|m| m["method"] == "notifications/resources/updated").collect();
            assert_eq!(updated.len(), 1, "{seen:?}");
            assert_eq!(updated[0]["params"]["uri"], "fixture://b");
        })
        .await
        .expect("within 30 s");
    });
    assert!(d.stop(Signal::TERM).success());
}

/// The unit `NAME` running `tests/data/ttl_server.py` (a server of
/// 2026-07-28 whose lists carry ttlMs `ttl` and cacheScope `scope`, and
/// change on every read), counting its reads into `count`.
fn ttl_unit(dir: &Path, name: &str, ttl: u64, scope: &str, count: &Path) {
    let script = crate::helper::root().join("tests/data/ttl_server.py");
    std::fs::write(
        dir.join(format!("{name}.kdl")),
        format!(
            "stdio {{\n    command \"python3\" \"{}\" \"{ttl}\" \"{scope}\" \"{}\"\n}}\n",
            script.display(),
            count.display()
        ),
    )
    .expect("write unit");
}

/// How often the server counting into `count` was asked for list `kind`.
fn reads(count: &Path, kind: &str) -> usize {
    std::fs::read_to_string(count)
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == kind)
        .count()
}

/// A legacy host's list request `method` (id `id`): the answer.
async fn list(host: &mut Raw, id: u64, method: &str) -> Value {
    host.send(&line(
        &json!({"jsonrpc": "2.0", "id": id, "method": method}),
    ))
    .await;
    until_answer(host, &json!(id)).await.0
}

#[test]
fn a_list_whose_ttl_passed_is_read_again_on_the_next_request_at_most_once_per_ttl() {
    let units = tempfile::tempdir().expect("tempdir");
    let (slow, fast) = (
        units.path().join("slow.count"),
        units.path().join("fast.count"),
    );
    // Good for 1.5 s, public; and stale at once (ttlMs 0, the SDKs' default).
    ttl_unit(units.path(), "slow", 1500, "public", &slow);
    ttl_unit(units.path(), "fast", 0, "private", &fast);
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let status = |name: &str| {
        let out = mcpctl_user(&runtime, &["status", name]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    d.wait_until("both listed", |_| {
        ["slow", "fast"].iter().all(|n| {
            let s = status(n);
            s.contains("Protocol: 2026-07-28") && s.contains("Tools: 1")
        }) && reads(&slow, "resources") == 1
            && reads(&fast, "resources") == 1
    });
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            // A modern host is told the server's scope and what is left
            // of its TTL.
            let mut modern = Raw::new(&runtime, "slow");
            modern
                .send(&line(
                    &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list",
                "params": {"_meta": meta(json!({}), None)}}),
                ))
                .await;
            let (tools, _) = until_answer(&mut modern, &json!(2)).await;
            assert_eq!(tools["result"]["cacheScope"], "public", "{tools}");
            assert!(
                tools["result"]["ttlMs"].as_u64().is_some_and(|t| t <= 1500),
                "{tools}"
            );
            let mut host = Raw::new(&runtime, "slow");
            host.send(legacy_initialize()).await;
            host.answer().await;
            // Once the TTL has passed (the wait is for the clock alone),
            // the next request of each list has it read again: answered
            // from what is kept, then list_changed, then the new list.
            let first = [
                list(&mut host, 3, "tools/list").await["result"]["tools"][0]["name"].clone(),
                list(&mut host, 4, "resources/list").await["result"]["resources"][0]["uri"].clone(),
            ];
            // (scenario: the TTL passes)
            tokio::time::sleep(Duration::from_millis(1600)).await;
            let mut changed = std::collections::BTreeSet::new();
            host.send(&line(
                &json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}),
            ))
            .await;
            host.send(&line(
                &json!({"jsonrpc": "2.0", "id": 6, "method": "resources/list"}),
            ))
            .await;
            while changed.len() < 2 {
                let line = host.line().await;
                if let Some(method) = line["method"].as_str() {
                    changed.insert(method.to_owned());
                }
            }
            assert_eq!(
                changed.into_iter().collect::<Vec<_>>(),
                [
                    "notifications/resources/list_changed",
                    "notifications/tools/list_changed"
                ]
            );
            let again = [
                list(&mut host, 7, "tools/list").await["result"]["tools"][0]["name"].clone(),
                list(&mut host, 8, "resources/list").await["result"]["resources"][0]["uri"].clone(),
            ];
            assert_ne!(again[0], first[0], "tools read again");
            assert_ne!(again[1], first[1], "resources read again");
            assert_eq!((reads(&slow, "tools"), reads(&slow, "resources")), (2, 2));

            // ttlMs 0: hosts' requests as fast as they come are no storm
            // of reads: at most one each 100 ms (MIN_LIST_TTL).
            let mut host = Raw::new(&runtime, "fast");
            host.send(legacy_initialize()).await;
            host.answer().await;
            let began = std::time::Instant::now();
            let before = (reads(&fast, "tools"), reads(&fast, "resources"));
            for id in 0..100 {
                list(&mut host, 10 + 2 * id, "tools/list").await;
                list(&mut host, 11 + 2 * id, "resources/list").await;
            }
            // The server answers in order: its count is complete once this
            // call is answered (the tools' re-read may yet be under way:
            // one more).
            host.send(&line(
                &json!({"jsonrpc": "2.0", "id": 500, "method": "tools/call",
                "params": {"name": "v1", "arguments": {}}}),
            ))
            .await;
            until_answer(&mut host, &json!(500)).await;
            let periods = began.elapsed().as_millis() / 100;
            let bound = usize::try_from(periods).expect("small") + 2;
            let after = (reads(&fast, "tools"), reads(&fast, "resources"));
            assert!(
                after.0 - before.0 <= bound && after.1 - before.1 <= bound,
                "{before:?} -> {after:?} reads in {:?} (200 requests)",
                began.elapsed()
            );
        })
        .await
        .expect("within 60 s");
    });
    assert!(d.stop(Signal::TERM).success());
}

/// A modern `tasks/get` or `tasks/cancel` of `task`, declaring tasks.
fn about_task(id: u64, method: &str, task: &str) -> Vec<u8> {
    line(&json!({
        "jsonrpc": "2.0", "id": id, "method": method,
        "params": {"taskId": task, "_meta": meta(tasks_caps(), None)},
    }))
}

/// A client that declares the tasks extension (SEP-2663).
fn tasks_caps() -> Value {
    json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
}

#[test]
fn a_task_on_a_2026_07_28_server_is_its_hosts_alone_and_ends_with_it() {
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("tasks.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n    \
         env MCP_FIXTURE_TOOLS=\"task\"\n}\nprotocol \"2026-07-28\"\n",
    )
    .expect("write unit");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("tasks running", |d| d.starts("tasks") == 1);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (mine, second) = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let mut a = Raw::new(&runtime, "tasks");
            let mut b = Raw::new(&runtime, "tasks");
            // A's call becomes a task, known to A by an id of mcpd's.
            a.send(&call(
                1,
                "task",
                json!({"text": "done later"}),
                meta(tasks_caps(), None),
            ))
            .await;
            let (created, _) = until_answer(&mut a, &json!(1)).await;
            assert_eq!(created["result"]["resultType"], "task", "{created}");
            let mine = created["result"]["taskId"]
                .as_str()
                .expect("taskId")
                .to_owned();
            assert!(mine.starts_with("mcpd-task-"), "{created}");
            // B can reach it by neither A's id nor the server's.
            b.send(&about_task(1, "tasks/get", &mine)).await;
            let (refused, _) = until_answer(&mut b, &json!(1)).await;
            assert_eq!(refused["error"]["code"], -32602, "{refused}");
            // A polls it to its end under its own id.
            let (mut n, mut done) = (2, Value::Null);
            eventually_async("A's task to complete", BOUND, async || {
                a.send(&about_task(n, "tasks/get", &mine)).await;
                let (got, _) = until_answer(&mut a, &json!(n)).await;
                n += 1;
                assert_eq!(got["result"]["taskId"], json!(mine), "{got}");
                if got["result"]["status"] == "completed" {
                    done = got;
                    return true;
                }
                assert_eq!(got["result"]["status"], "working", "{got}");
                false
            })
            .await;
            assert_eq!(
                done["result"]["result"]["content"][0]["text"], "done later",
                "{done}"
            );
            // A second task, left running when A goes.
            a.send(&call(
                100,
                "task",
                json!({"text": "never read"}),
                meta(tasks_caps(), None),
            ))
            .await;
            let (second, _) = until_answer(&mut a, &json!(100)).await;
            let second = second["result"]["taskId"]
                .as_str()
                .expect("taskId")
                .to_owned();
            assert_ne!(second, mine);
            drop(a);
            (mine, second)
        })
        .await
        .expect("within 30 s")
    });
    // The server's ids, from its log: B cannot use them either.
    let created = |d: &Daemon| -> Vec<String> {
        d.about("tasks")
            .filter_map(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                words
                    .windows(3)
                    .find(|w| w[0] == "task" && w[2] == "created")
                    .map(|w| w[1].to_owned())
            })
            .collect()
    };
    d.wait_until("the server's two tasks logged", |d| created(d).len() == 2);
    let ids = created(&d);
    assert!(
        ids.iter().all(|id| id.starts_with("fixture-task-")),
        "{ids:?}"
    );
    assert!(!ids.contains(&mine) && !ids.contains(&second));
    // A left: its task still running is cancelled on the server.
    let cancelled = format!("tasks/cancel {}", ids[1]);
    d.wait_until("the left host's task cancelled", |d| {
        d.about("tasks").any(|l| l.contains(&cancelled))
    });
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), async {
            let mut b = Raw::new(&runtime, "tasks");
            for (n, id) in ids.iter().enumerate() {
                b.send(&about_task(n as u64 + 1, "tasks/get", id)).await;
                let (refused, _) = until_answer(&mut b, &json!(n + 1)).await;
                assert_eq!(refused["error"]["code"], -32602, "{refused}");
                assert!(
                    refused["error"]["message"]
                        .as_str()
                        .unwrap_or_default()
                        .contains("of this session's"),
                    "mcpd refuses it, not the server: {refused}"
                );
            }
        })
        .await
        .expect("within 10 s")
    });
    assert!(d.stop(Signal::TERM).success());
}
