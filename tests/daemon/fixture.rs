//! The fixture MCP server itself works, driven by a real rmcp client: later
//! stages build their tests on it, so it must not silently break.

use std::process::Stdio;
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tokio::process::{ChildStdin, ChildStdout, Command};
use tokio::sync::mpsc;

use crate::helper::fixture_path;

/// Forwards `notifications/tools/list_changed` to a channel.
struct Watcher(mpsc::UnboundedSender<()>);

impl ClientHandler for Watcher {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.0.send(());
    }
}

struct Session {
    client: RunningService<RoleClient, Watcher>,
    child: tokio::process::Child,
    changed: mpsc::UnboundedReceiver<()>,
}

/// Spawns the fixture with piped stdio; returns it with its stdout and stdin.
fn spawn(args: &[&str]) -> (tokio::process::Child, ChildStdout, ChildStdin) {
    let mut child = Command::new(fixture_path())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn fixture");
    let stdout = child.stdout.take().expect("stdout");
    let stdin = child.stdin.take().expect("stdin");
    (child, stdout, stdin)
}

async fn start(args: &[&str]) -> Session {
    let (child, stdout, stdin) = spawn(args);
    let (tx, changed) = mpsc::unbounded_channel();
    let client = Watcher(tx)
        .serve((stdout, stdin))
        .await
        .expect("initialize");
    Session {
        client,
        child,
        changed,
    }
}

fn args(json: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    json.as_object().cloned().expect("object")
}

fn first_text(result: &rmcp::model::CallToolResult) -> String {
    serde_json::to_value(&result.content).expect("json")[0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

#[tokio::test]
async fn tools_echo_add_fail_and_paging() {
    bounded("session", async {
        let s = start(&["--page-size", "2"]).await;
        let tools = s.client.list_all_tools().await.expect("list");
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                "echo",
                "add",
                "crash",
                "hang",
                "fail",
                "log",
                "env",
                "whoami",
                "set_tools"
            ]
        );
        let echo = s
            .client
            .call_tool(
                CallToolRequestParams::new("echo")
                    .with_arguments(args(serde_json::json!({"text": "hi"}))),
            )
            .await
            .expect("echo");
        assert_eq!(first_text(&echo), "hi");
        let sum = s
            .client
            .call_tool(
                CallToolRequestParams::new("add")
                    .with_arguments(args(serde_json::json!({"a": 2, "b": 3.5}))),
            )
            .await
            .expect("add");
        assert_eq!(first_text(&sum), "5.5");
        let failed = s
            .client
            .call_tool(CallToolRequestParams::new("fail"))
            .await
            .expect("fail");
        assert_eq!(failed.is_error, Some(true));
    })
    .await;
}

#[tokio::test]
async fn set_tools_changes_the_list_and_notifies() {
    bounded("set_tools", async {
        let mut s = start(&["--tools", "alpha"]).await;
        let before = s.client.list_all_tools().await.expect("list");
        assert!(before.iter().any(|t| t.name == "alpha"));
        s.client
            .call_tool(
                CallToolRequestParams::new("set_tools")
                    .with_arguments(args(serde_json::json!({"tools": ["beta", "gamma"]}))),
            )
            .await
            .expect("set_tools");
        s.changed.recv().await.expect("list_changed notification");
        let after = s.client.list_all_tools().await.expect("list");
        let extra: Vec<&str> = after.iter().skip(9).map(|t| t.name.as_ref()).collect();
        assert_eq!(extra, ["beta", "gamma"]);
    })
    .await;
}

#[tokio::test]
async fn crash_replies_then_exits_with_the_code() {
    bounded("crash", async {
        let mut s = start(&[]).await;
        let reply = s
            .client
            .call_tool(
                CallToolRequestParams::new("crash")
                    .with_arguments(args(serde_json::json!({"code": 7}))),
            )
            .await
            .expect("crash replies first");
        assert_eq!(first_text(&reply), "crashing with exit code 7");
        let status = s.child.wait().await.expect("wait");
        assert_eq!(status.code(), Some(7));
    })
    .await;
}

#[tokio::test]
async fn die_on_start_and_count_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let count = tmp.path().join("spawns");
    for _ in 0..2 {
        let status = bounded(
            "die",
            Command::new(fixture_path())
                .arg("--die-on-start")
                .arg("9")
                .arg("--count-file")
                .arg(&count)
                .stderr(Stdio::null())
                .status(),
        )
        .await
        .expect("run");
        assert_eq!(status.code(), Some(9));
    }
    assert_eq!(
        std::fs::read_to_string(&count)
            .expect("count")
            .lines()
            .count(),
        2
    );
}

#[tokio::test]
async fn hang_never_answers_initialize() {
    let (mut child, stdout, stdin) = spawn(&["--hang"]);
    let attempt = tokio::time::timeout(Duration::from_millis(500), ().serve((stdout, stdin))).await;
    assert!(attempt.is_err(), "initialize must not complete");
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "still running"
    );
}
