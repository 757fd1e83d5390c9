//! `mcpctl bridge` driven by a real rmcp client as a stdio MCP server.

use std::process::Stdio;
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use rmcp::service::NotificationContext;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use rustix::process::Signal;
use tokio::sync::mpsc;

use crate::helper::{BOUND, Daemon, eventually, eventually_async, holds_within_async, timed_out};

struct Watcher(mpsc::UnboundedSender<()>);

impl ClientHandler for Watcher {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.0.send(());
    }
}

fn args(json: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    json.as_object().cloned().expect("object")
}

fn text(result: &rmcp::model::CallToolResult) -> String {
    serde_json::to_value(&result.content).expect("json")[0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// `echo` of `text` on `peer`, its text (the call must succeed: `what`).
async fn echo(peer: &rmcp::service::Peer<RoleClient>, text_: &str, what: &str) -> String {
    let result = peer
        .call_tool(
            CallToolRequestParams::new("echo")
                .with_arguments(args(serde_json::json!({ "text": text_ }))),
        )
        .await
        .expect(what);
    text(&result)
}

#[test]
fn an_mcp_client_uses_a_managed_server_through_the_bridge() {
    let units = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    demo_unit(units.path());
    let start = || demo_running(units.path(), runtime.path());
    let mut daemon = Some(start());

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            let (mut bridge, (stdout, stdin)) = crate::helper::bridge(runtime.path(), "demo");
            let (tx, mut changed) = mpsc::unbounded_channel();
            let client = Watcher(tx)
                .serve((stdout, stdin))
                .await
                .expect("initialize");
            let info = client.peer_info().expect("server info");
            assert_eq!(
                info.server_info.as_ref().map(|i| i.name.as_str()),
                Some("mcp-fixture"),
                "mcpd answers initialize with the server's own result"
            );
            assert_eq!(
                info.instructions.as_deref(),
                Some("A test fixture for mcpd. Try the echo tool."),
                "the managed server's own instructions"
            );

            let tools = client.list_all_tools().await.expect("tools/list");
            assert_eq!(tools.len(), 9);
            assert_eq!(echo(&client, "bridged", "echo").await, "bridged");

            client
                .call_tool(
                    CallToolRequestParams::new("set_tools")
                        .with_arguments(args(serde_json::json!({"tools": ["extra"]}))),
                )
                .await
                .expect("set_tools");
            changed.recv().await.expect("list_changed forwarded");
            let tools = client.list_all_tools().await.expect("tools/list");
            assert!(tools.iter().any(|t| t.name == "extra"));

            // a second bridge (another host) shares the same running server
            let (_second, (out2, in2)) = crate::helper::bridge(runtime.path(), "demo");
            let other = ().serve((out2, in2)).await.expect("initialize");
            assert_eq!(echo(&other, "shared", "echo").await, "shared");
            other.cancel().await.expect("close");

            // the managed server crashes and waits an hour: a clean error, no hang
            client
                .call_tool(
                    CallToolRequestParams::new("crash")
                        .with_arguments(args(serde_json::json!({"code": 1}))),
                )
                .await
                .expect("crash replies");
            // A call racing the crash may fail with "the server closed the
            // connection", and until the hung-up process is reaped the retry
            // has no time yet; within bounds the error names state, retry
            // and next retry.
            let expected = "server demo is reconnecting (retry 1/10, next in ";
            let mut last = String::new();
            let told = holds_within_async(BOUND, async || {
                let r = client
                    .call_tool(
                        CallToolRequestParams::new("echo")
                            .with_arguments(args(serde_json::json!({"text": "x"}))),
                    )
                    .await;
                // During the outage a request gets a JSON-RPC error naming
                // the state and the next retry.
                last = match r {
                    Err(rmcp::service::ServiceError::McpError(e)) => e.message.into_owned(),
                    other => format!("{other:?}"),
                };
                last.starts_with(expected)
            })
            .await;
            assert!(
                told,
                "{}; last answer: {last}",
                timed_out("the outage's error", BOUND)
            );
            assert_eq!(client.list_all_tools().await.expect("tools kept").len(), 10);

            // the daemon restarts: the bridge reconnects to the new one
            let old = daemon.take().expect("daemon");
            assert!(old.stop(Signal::TERM).success());
            daemon = Some(start());
            assert_eq!(
                echo(&client, "again", "echo after the daemon restarted").await,
                "again"
            );
            client.cancel().await.expect("close");
            let status = bridge.wait().await.expect("bridge exits");
            assert!(status.success(), "{status:?}");
        })
        .await
        .expect("within 60 s");
    });
    assert!(daemon.expect("daemon").stop(Signal::TERM).success());
}

#[test]
fn the_official_python_sdk_uses_the_bridge() {
    let probe = std::process::Command::new("python3")
        .args(["-c", "import mcp.client.stdio"])
        .output()
        .expect("python3");
    assert!(
        probe.status.success(),
        "the MCP Python SDK is missing: python3 -m pip install mcp (.ci/run does)"
    );
    let units = tempfile::tempdir().expect("tempdir");
    demo_unit(units.path());
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    let out = std::process::Command::new("python3")
        .arg(crate::helper::root().join("tests/data/bridge_client.py"))
        .arg(env!("CARGO_BIN_EXE_mcpctl"))
        .env("XDG_RUNTIME_DIR", d.runtime_dir().expect("runtime"))
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .output()
        .expect("python3");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "OK",
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(d.stop(Signal::TERM).success());
}

/// What the official MCP SDKs give a stdio server they spawn (Python
/// `get_default_environment`, TypeScript `getDefaultEnvironment`).
const SDK_DEFAULT_ENV: [&str; 6] = ["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"];

#[test]
fn a_host_with_the_sdks_default_environment_finds_the_user_daemon() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test uses /run/user/0 as systemd-logind would create it (CI runs as root)"
    );
    // A user daemon as systemd starts it, with XDG_RUNTIME_DIR=/run/user/UID.
    let logind = std::path::Path::new("/run/user/0");
    /// Removes what the test added to /run/user/0, however it ends.
    struct Cleanup {
        created_parent: bool,
        created: bool,
        ours: bool,
    }
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let logind = std::path::Path::new("/run/user/0");
            if self.ours {
                let _ = std::fs::remove_dir_all(logind.join("mcpd"));
            }
            if self.created {
                let _ = std::fs::remove_dir(logind);
            }
            if self.created_parent {
                let _ = std::fs::remove_dir("/run/user");
            }
        }
    }
    use std::os::unix::fs::DirBuilderExt;
    let parent = logind.parent().expect("/run/user");
    let created_parent = !parent.exists();
    if created_parent {
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(parent)
            .expect("create /run/user");
    }
    let created = !logind.exists();
    if created {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(logind)
            .expect("create /run/user/0");
    }
    let _cleanup = Cleanup {
        created_parent,
        created,
        ours: !logind.join("mcpd").exists(),
    };
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("demo.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\n",
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(units.path(), &[("XDG_RUNTIME_DIR", logind.as_os_str())]);
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let listed = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcpctl"));
            // (as root, mcpctl would pick the system instance by default)
            cmd.args(["--user", "bridge", "demo"]).env_clear();
            for var in SDK_DEFAULT_ENV {
                match var {
                    "PATH" => cmd.env(var, "/usr/bin:/bin"),
                    "TERM" => cmd.env(var, "dumb"),
                    other => cmd.env(
                        other,
                        std::env::var_os(other).unwrap_or_else(|| "root".into()),
                    ),
                };
            }
            let mut bridge = cmd
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn bridge");
            let io = (
                bridge.stdout.take().expect("stdout"),
                bridge.stdin.take().expect("stdin"),
            );
            let client = match ().serve(io).await {
                Ok(client) => client,
                Err(e) => {
                    let out = bridge.wait_with_output().await.expect("bridge");
                    panic!(
                        "initialize through the bridge: {e}; its stderr: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            };
            let tools = client.list_all_tools().await.expect("tools/list");
            client.cancel().await.expect("close");
            tools.len()
        })
        .await
        .expect("within 30 s")
    });
    assert_eq!(listed, 9);
    assert!(d.stop(Signal::TERM).success());
}

/// A user daemon of `units` in runtime directory `runtime`, once its unit
/// demo runs.
fn demo_running(units: &std::path::Path, runtime: &std::path::Path) -> Daemon {
    let mut d = Daemon::user_no_bus(units, &[("XDG_RUNTIME_DIR", runtime.as_os_str())]);
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    d
}

/// Unit demo in `units`: the fixture, retrying in an hour.
/// The fixture as unit `demo`, one process whatever era its hosts speak
/// (pinned to 2026-07-28: the tests kill it and expect its name in the
/// outage's error; a 2025 host would otherwise get a lane, DESIGN §12).
fn demo_unit(units: &std::path::Path) {
    std::fs::write(
        units.join("demo.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\nprotocol \"2026-07-28\"\nreconnect {\n    initial-delay \"1h\"\n    max-delay \"2h\"\n}\n",
    )
    .expect("write");
}

/// A demo daemon for the attach tests: the fixture, retrying in an hour.
fn demo_daemon(units: &std::path::Path) -> Daemon {
    demo_unit(units);
    let mut d = Daemon::user_no_bus(units, &[]);
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    d
}

#[test]
fn the_bridge_hands_the_hosts_stdio_to_mcpd_and_copies_nothing() {
    let units = tempfile::tempdir().expect("tempdir");
    let d = demo_daemon(units.path());
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            let (_conn, demo) =
                crate::helper::private_server(&runtime.join("mcpd/private"), "demo").await;
            let (bridge, io) = crate::helper::bridge(&runtime, "demo");
            let client = ().serve(io).await.expect("initialize");
            let bridge_pid = bridge.id().expect("pid");
            let pid = rustix::process::Pid::from_raw(bridge_pid as i32).expect("pid");
            // Stopped, the bridge copies nothing; the host is served all
            // the same, by mcpd on the host's own pipes.
            rustix::process::kill_process(pid, Signal::STOP).expect("SIGSTOP");
            assert_eq!(
                echo(&client, "direct", "echo while the bridge is stopped").await,
                "direct"
            );
            assert_eq!(demo.sessions().await.expect("Sessions"), 1);
            rustix::process::kill_process(pid, Signal::CONT).expect("SIGCONT");
            // A bridge killed outright ends its session in the daemon.
            rustix::process::kill_process(pid, Signal::KILL).expect("SIGKILL");
            eventually_async("the session to go with its bridge", BOUND, async || {
                demo.sessions().await.expect("Sessions") == 0
            })
            .await;
            drop(client);
            drop(bridge);
        })
        .await
        .expect("within 60 s");
    });
    assert!(d.stop(Signal::TERM).success());
}

/// Sends `request` on the attach socket with `fds`; the reply line, and
/// the socket behind the buffer that read it: what the daemon sends right
/// after its reply (the answer to a message that came with the request)
/// may be in that buffer already. Every read gives up after 10 s.
pub(crate) fn attach_raw(
    runtime: &std::path::Path,
    request: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> (String, std::io::BufReader<std::os::unix::net::UnixStream>) {
    use std::io::BufRead;
    use std::os::fd::AsFd;
    let socket =
        std::os::unix::net::UnixStream::connect(runtime.join("mcpd/attach")).expect("connect");
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let sent = mcpd::mux::attach::send_with_fds(socket.as_fd(), request, fds).expect("send");
    assert_eq!(sent, request.len());
    let mut socket = std::io::BufReader::new(socket);
    let mut reply = String::new();
    socket.read_line(&mut reply).expect("reply");
    (reply, socket)
}

#[test]
fn a_host_whose_stdio_was_handed_over_and_detached_is_read_no_more() {
    use std::io::{BufRead, Write};
    use std::os::fd::AsFd;
    let units = tempfile::tempdir().expect("tempdir");
    let d = demo_daemon(units.path());
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let (input, mut to_daemon) = std::io::pipe().expect("pipe");
    // Its answers are never read: the daemon detaches it.
    let (_unread, output) = std::io::pipe().expect("pipe");
    let (reply, mut control) = attach_raw(
        &runtime,
        b"{\"server\":\"demo\",\"stdio\":true}\n",
        &[input.as_fd(), output.as_fd()],
    );
    assert!(reply.contains("attached"), "{reply}");
    // The daemon holds the only reader of the host's input now.
    drop((input, output));
    to_daemon
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-11-25\",\"capabilities\":{},\"clientInfo\":{\"name\":\"deaf\",\"version\":\"1\"}}}\n")
        .expect("write");
    let mut refused = None;
    for i in 1..200_000 {
        let ping = format!("{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"ping\"}}\n");
        if let Err(e) = to_daemon.write_all(ping.as_bytes()) {
            refused = Some(e);
            break;
        }
    }
    // Once detached, the session task stops reading the host's input and
    // closes it: the host's writes fail, rather than go on being read.
    let refused = refused.expect("the daemon stopped reading");
    assert_eq!(refused.kind(), std::io::ErrorKind::BrokenPipe, "{refused}");
    // The bridge is told why (after the host's initialize, for replays).
    let mut end = String::new();
    while !end.contains("\"end\"") {
        end.clear();
        assert!(control.read_line(&mut end).expect("read") > 0, "no end");
    }
    assert!(end.contains("it stopped reading its messages"), "{end}");
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn bad_attach_requests_get_named_refusals_and_a_file_is_copied() {
    use std::io::{BufRead, Write};
    use std::os::fd::AsFd;
    let units = tempfile::tempdir().expect("tempdir");
    let d = demo_daemon(units.path());
    let runtime = d.runtime_dir().expect("runtime").to_owned();

    let (reply, _) = attach_raw(&runtime, b"not json\n", &[]);
    assert!(
        reply.contains("\"invalid-request\"") && reply.contains("not an attach request"),
        "{reply}"
    );
    let (reply, _) = attach_raw(&runtime, b"{\"server\":\"nope\"}\n", &[]);
    assert!(
        reply.contains("\"no-such-server\"") && reply.contains("no unit nope; units: demo"),
        "{reply}"
    );
    let (reply, _) = attach_raw(&runtime, b"{\"server\":\"demo\",\"stdio\":true}\n", &[]);
    assert!(reply.contains("needs two descriptors"), "{reply}");
    let file = tempfile::tempfile().expect("file");
    let (reply, _) = attach_raw(
        &runtime,
        b"{\"server\":\"demo\",\"stdio\":true}\n",
        &[file.as_fd(), file.as_fd()],
    );
    assert!(
        reply.contains("the host's input: it is a RegularFile, not a pipe or a socket"),
        "{reply}"
    );
    // The daemon writes only to the caller's own pipes and socketpairs,
    // never to a connection the caller made elsewhere.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let tcp = std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("tcp");
    let (reply, _) = attach_raw(
        &runtime,
        b"{\"server\":\"demo\",\"stdio\":true}\n",
        &[tcp.as_fd(), tcp.as_fd()],
    );
    assert!(
        reply.contains("the host's input: a socket that is not a Unix stream socket"),
        "{reply}"
    );
    let (r, w) = std::io::pipe().expect("pipe");
    let (reply, _) = attach_raw(
        &runtime,
        b"{\"server\":\"demo\",\"stdio\":true,\"replay\":{\"method\":\"initialize\"}}\n",
        &[r.as_fd(), w.as_fd()],
    );
    assert!(
        reply.contains("expected an initialize request with an id"),
        "{reply}"
    );

    // Without descriptors the socket is the session, and bytes sent with
    // the request are its first.
    let (reply, mut socket) = attach_raw(
        &runtime,
        b"{\"server\":\"demo\"}\n{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-11-25\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}\n",
        &[],
    );
    assert_eq!(reply, "\"attached\"\n");
    let mut answer = String::new();
    socket.read_line(&mut answer).expect("answer");
    assert!(
        answer.contains("\"id\":7") && answer.contains("mcp-fixture"),
        "{answer}"
    );
    drop(socket);

    // A bridge whose stdout is a file copies (a file cannot be handed
    // over), and exits when the host closes its input.
    let answers = tempfile::NamedTempFile::new().expect("file");
    let mut bridge = std::process::Command::new(env!("CARGO_BIN_EXE_mcpctl"))
        .args(["--user", "bridge", "demo"])
        .env("XDG_RUNTIME_DIR", &runtime)
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .stdin(Stdio::piped())
        .stdout(answers.reopen().expect("reopen"))
        .spawn()
        .expect("bridge");
    let mut stdin = bridge.stdin.take().expect("stdin");
    let answered = |n: usize| {
        let mut text = String::new();
        eventually(format_args!("answer {n} in the file"), BOUND, || {
            text = std::fs::read_to_string(answers.path()).expect("read");
            text.lines().count() >= n
        });
        text
    };
    stdin.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-11-25\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}\n").expect("write");
    assert!(answered(1).contains("mcp-fixture"));
    stdin.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{\"text\":\"into a file\"}}}\n").expect("write");
    assert!(answered(2).contains("into a file"));
    drop(stdin);
    assert!(bridge.wait().expect("wait").success());

    // An unknown server: exit 4 and the daemon's words.
    let out = crate::helper::mcpctl_user(&runtime, &["bridge", "nope"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no unit nope; units: demo"),
        "{out:?}"
    );
    assert!(d.stop(Signal::TERM).success());
    // No daemon at all: a host's bridge says so and exits 1.
    let out = crate::helper::mcpctl_user_command(&runtime, &["bridge", "demo"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .output()
        .expect("mcpctl");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot reach mcpd (user instance)"),
        "{out:?}"
    );
}

#[test]
fn handed_over_stdio_reads_the_pending_bytes_first_and_a_replay_is_answered_to_nobody() {
    use std::io::{BufRead, Read, Write};
    use std::os::fd::AsFd;
    let units = tempfile::tempdir().expect("tempdir");
    let d = demo_daemon(units.path());
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let initialize = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}\n";
    // The host's pipes, as a host would make them for its server.
    let host_pipes = || {
        let (to_mcpd, host_writes) = std::io::pipe().expect("pipe");
        let (host_reads, from_mcpd) = std::io::pipe().expect("pipe");
        (to_mcpd, host_writes, host_reads, from_mcpd)
    };
    let read_line = |from: &mut std::io::BufReader<std::io::PipeReader>| {
        let mut line = String::new();
        from.read_line(&mut line).expect("read");
        line
    };

    // Half of the initialize was read by the client already: it comes
    // first, and the rest follows on the pipe.
    let (to_mcpd, mut host_writes, host_reads, from_mcpd) = host_pipes();
    let (head, tail) = initialize.split_at(40);
    let request = format!(
        "{{\"server\":\"demo\",\"stdio\":true,\"pending\":{}}}\n{head}",
        head.len()
    );
    let (reply, mut control) = attach_raw(
        &runtime,
        request.as_bytes(),
        &[to_mcpd.as_fd(), from_mcpd.as_fd()],
    );
    assert_eq!(reply, "\"attached\"\n");
    drop((to_mcpd, from_mcpd));
    host_writes.write_all(tail.as_bytes()).expect("write");
    let mut host_reads = std::io::BufReader::new(host_reads);
    let answer = read_line(&mut host_reads);
    assert!(
        answer.contains("\"id\":1") && answer.contains("\"protocolVersion\":\"2025-06-18\""),
        "{answer}"
    );
    // The client is told the host's initialize, for a replay.
    let mut told = String::new();
    control.read_line(&mut told).expect("control");
    let told: serde_json::Value = serde_json::from_str(&told).expect("json");
    assert_eq!(told["initialize"]["method"], "initialize");
    // The host closes its input: the client is told the session is over.
    drop(host_writes);
    let mut end = String::new();
    control.read_to_string(&mut end).expect("control");
    assert_eq!(end, "{\"end\":null}\n");

    // A replay: initialized without an answer, told the lists may have
    // changed, then the pending call.
    let (to_mcpd, host_writes, host_reads, from_mcpd) = host_pipes();
    let call = "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{\"text\":\"replayed\"}}}\n";
    let request = serde_json::json!({"server": "demo", "stdio": true, "replay": told["initialize"], "pending": call.len()});
    let request = format!("{request}\n{call}");
    let (reply, control) = attach_raw(
        &runtime,
        request.as_bytes(),
        &[to_mcpd.as_fd(), from_mcpd.as_fd()],
    );
    assert_eq!(reply, "\"attached\"\n");
    drop((to_mcpd, from_mcpd));
    let mut host_reads = std::io::BufReader::new(host_reads);
    assert_eq!(
        read_line(&mut host_reads),
        "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n"
    );
    let answer = read_line(&mut host_reads);
    assert!(
        answer.contains("\"id\":2") && answer.contains("replayed"),
        "{answer}"
    );
    // The client going away ends the session, and the host sees the end.
    drop(control);
    assert_eq!(
        read_line(&mut host_reads),
        "",
        "the host's stdout ends with the session"
    );
    drop(host_writes);
    assert!(d.stop(Signal::TERM).success());
}

/// A bridge whose daemon comes back without its server (the unit was
/// removed meanwhile) ends as a server that is gone would: exit 4, saying
/// why, where it would otherwise retry for ever.
#[test]
fn a_bridge_whose_server_is_gone_when_mcpd_comes_back_exits_4() {
    let units = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    let unit = units.path().join("demo.kdl");
    std::fs::write(
        &unit,
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\n",
    )
    .expect("write");
    let start = || {
        Daemon::user_no_bus(
            units.path(),
            &[("XDG_RUNTIME_DIR", runtime.path().as_os_str())],
        )
    };
    let mut d = start();
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let d = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            let mut bridge = crate::helper::bridge_command(runtime.path(), "demo")
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn mcpctl bridge");
            let io = (
                bridge.stdout.take().expect("stdout"),
                bridge.stdin.take().expect("stdin"),
            );
            let client = ().serve(io).await.expect("initialize");
            assert_eq!(echo(&client, "here", "echo").await, "here");

            assert!(d.stop(Signal::TERM).success());
            std::fs::remove_file(&unit).expect("remove the unit");
            let mut d = start();
            d.wait_for("started 0 units");
            // Whether the bridge tries again for this request or on its
            // own first, the host learns the server is gone.
            let answer = client
                .call_tool(
                    CallToolRequestParams::new("echo")
                        .with_arguments(args(serde_json::json!({"text": "x"}))),
                )
                .await
                .expect_err("no server any more");
            let answer = answer.to_string();
            assert!(
                answer.contains("mcpd refused the session: no unit demo; no unit is loaded")
                    || answer.contains("closed"),
                "{answer}"
            );
            let out = bridge.wait_with_output().await.expect("bridge exits");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(4), "{stderr}");
            assert!(
                stderr.contains("cannot attach to demo again: no unit demo; no unit is loaded"),
                "{stderr}"
            );
            drop(client);
            d
        })
        .await
        .expect("within 60 s")
    });
    assert!(d.stop(Signal::TERM).success());
}

/// A line of JSON to a bridge's stdin.
async fn send_line(stdin: &mut tokio::process::ChildStdin, message: serde_json::Value) {
    use tokio::io::AsyncWriteExt;
    let mut line = message.to_string().into_bytes();
    line.push(b'\n');
    stdin.write_all(&line).await.expect("write to the bridge");
}

/// The next message from a bridge's stdout.
async fn next_message(
    out: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) -> serde_json::Value {
    let line = out
        .next_line()
        .await
        .expect("read from the bridge")
        .expect("the bridge closed its stdout");
    serde_json::from_str(&line).expect("a JSON line")
}

/// The answer to request `id`, skipping notifications; an answer to any
/// other request fails the test.
async fn answer_to(
    out: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    id: &serde_json::Value,
) -> serde_json::Value {
    loop {
        let message = next_message(out).await;
        if message.get("method").is_some() {
            continue;
        }
        assert_eq!(message.get("id"), Some(id), "{message}");
        return message;
    }
}

#[test]
fn a_killed_daemons_requests_in_flight_fail_at_once_and_the_bridge_attaches_to_the_next() {
    use serde_json::json;
    use tokio::io::AsyncBufReadExt;
    let units = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("demo.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\n",
    )
    .expect("write");
    let start = || demo_running(units.path(), runtime.path());
    let first = start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let next = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            let (mut bridge, (stdout, mut stdin)) = crate::helper::bridge(runtime.path(), "demo");
            let mut out = tokio::io::BufReader::new(stdout).lines();
            send_line(
                &mut stdin,
                json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "test", "version": "1"}}}),
            )
            .await;
            assert!(answer_to(&mut out, &json!(1)).await.get("result").is_some());
            send_line(
                &mut stdin,
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            )
            .await;
            // Three calls that the server never answers (a string id and
            // numbers), one of them cancelled by the host, a list mcpd
            // answers itself, and an id reused; then a ping: once it is
            // answered, mcpd has read everything before it.
            for id in [json!("hang-a"), json!(7), json!(8)] {
                send_line(
                    &mut stdin,
                    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                           "params": {"name": "hang", "arguments": {}}}),
                )
                .await;
            }
            send_line(
                &mut stdin,
                json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                       "params": {"requestId": 8, "reason": "changed my mind"}}),
            )
            .await;
            send_line(
                &mut stdin,
                json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
            )
            .await;
            assert!(answer_to(&mut out, &json!(3)).await["result"]["tools"].is_array());
            // A second request with an id in flight is refused; the first
            // stays in flight.
            send_line(
                &mut stdin,
                json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                       "params": {"name": "hang", "arguments": {}}}),
            )
            .await;
            let refused = answer_to(&mut out, &json!(7)).await;
            assert!(
                refused["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("already in use")),
                "{refused}"
            );
            send_line(
                &mut stdin,
                json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}),
            )
            .await;
            assert!(answer_to(&mut out, &json!(2)).await.get("result").is_some());

            // Killed, mcpd answers nothing: the bridge answers both at once.
            // (The next daemon, which kills what the first left, starts
            // right away, so that nothing is left even if this fails.)
            assert!(!first.stop(Signal::KILL).success());
            let next = start();
            let mut failed = Vec::new();
            while failed.len() < 2 {
                let message = next_message(&mut out).await;
                let text = message["error"]["message"].as_str().unwrap_or_default();
                assert_eq!(
                    text, "server demo: connection lost: mcpd went away",
                    "{message}"
                );
                failed.push(message["id"].clone());
            }
            failed.sort_by_key(|id| id.to_string());
            assert_eq!(failed, [json!("hang-a"), json!(7)]);
            // Nothing else fails: what was answered or cancelled is not in
            // flight (`answer_to` refuses any other answer from here on).

            // The bridge attaches to the next daemon, replays the host's
            // initialize, and the session works without the host doing
            // anything.
            let (mut answered, mut n) = (None, 100);
            eventually_async("an answer from the next daemon", BOUND, async || {
                // (refused while the bridge is not attached yet)
                let id = json!(n);
                n += 1;
                send_line(
                    &mut stdin,
                    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                           "params": {"name": "echo", "arguments": {"text": "back"}}}),
                )
                .await;
                let answer = answer_to(&mut out, &id).await;
                if answer.get("result").is_none() {
                    return false;
                }
                answered = Some(answer);
                true
            })
            .await;
            let answered = answered.expect("answered");
            assert_eq!(answered["result"]["content"][0]["text"], json!("back"));
            drop(stdin);
            let status = bridge.wait().await.expect("bridge exits");
            assert!(status.success(), "{status:?}");
            next
        })
        .await
        .expect("within 60 s")
    });
    assert!(next.stop(Signal::TERM).success());
}

/// Reads one line of `from` on a thread, or panics after `within`.
fn line_within(from: std::process::ChildStdout, within: Duration) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut line = String::new();
        let _ = std::io::BufReader::new(from).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(within).expect("a line in time")
}

/// Waits for `child` to exit, or panics after `within`.
fn exit_within(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let mut status = None;
    eventually("the bridge to exit", within, || {
        status = child.try_wait().expect("try_wait");
        status.is_some()
    });
    status.expect("exited")
}

/// `mcpctl bridge demo` in `runtime`, sent an `initialize` request.
fn initialized_bridge(
    runtime: &std::path::Path,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::process::ChildStdout,
) {
    use std::io::Write;
    let mut bridge = crate::helper::mcpctl_user_command(runtime, &["bridge", "demo"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("bridge");
    let mut stdin = bridge.stdin.take().expect("stdin");
    stdin.write_all(INITIALIZE).expect("write");
    let stdout = bridge.stdout.take().expect("stdout");
    (bridge, stdin, stdout)
}

const INITIALIZE: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-11-25\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}\n";

#[test]
fn with_no_daemon_the_host_is_told_why_and_how_to_start_it() {
    let runtime = tempfile::tempdir().expect("runtime");
    let attach = runtime.path().join("mcpd/attach");
    // The official Python SDK's client shows the error initialize got.
    let out = std::process::Command::new("python3")
        .arg(crate::helper::root().join("tests/data/bridge_down.py"))
        .arg(env!("CARGO_BIN_EXE_mcpctl"))
        .env("XDG_RUNTIME_DIR", runtime.path())
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .output()
        .expect("python3");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for part in [
        &format!(
            "mcpd (user instance) is not running: no socket at {}",
            attach.display()
        ),
        "so server demo cannot be reached",
        "start it with `systemctl --user start mcpd`",
    ] {
        assert!(said.contains(part), "{part:?} not in {said}");
    }
    // How soon is measured from inside the client, without the
    // interpreter's start: `daemon::reasons`.

    // A host that reads late: the answer waits for it, the bridge too.
    let (mut bridge, stdin, stdout) = initialized_bridge(runtime.path());
    let answer = line_within(stdout, Duration::from_secs(30));
    let answer: serde_json::Value = serde_json::from_str(&answer).expect("json");
    assert_eq!(answer["id"], 1, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("systemctl --user start mcpd")),
        "{answer}"
    );
    assert!(
        bridge.try_wait().expect("try_wait").is_none(),
        "it waits for the host"
    );
    drop(stdin);
    assert_eq!(
        exit_within(&mut bridge, Duration::from_secs(10)).code(),
        Some(1)
    );
}

#[test]
fn a_bridge_started_before_the_daemon_tells_its_host_and_the_next_one_is_served() {
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    demo_unit(units.path());
    let (mut bridge, stdin, stdout) = initialized_bridge(runtime.path());
    let answer = line_within(stdout, Duration::from_secs(30));
    assert!(answer.contains("is not running"), "{answer}");
    drop(stdin);
    assert_eq!(
        exit_within(&mut bridge, Duration::from_secs(10)).code(),
        Some(1)
    );
    let d = Daemon::user_no_bus(
        units.path(),
        &[("XDG_RUNTIME_DIR", runtime.path().as_os_str())],
    );
    let socket = runtime.path().join("mcpd/attach");
    eventually("the attach socket", Duration::from_secs(60), || {
        socket.exists()
    });
    let (mut bridge, stdin, stdout) = initialized_bridge(runtime.path());
    let answer = line_within(stdout, Duration::from_secs(60));
    assert!(answer.contains("mcp-fixture"), "{answer}");
    drop(stdin);
    assert!(exit_within(&mut bridge, Duration::from_secs(10)).success());
    assert!(d.stop(Signal::TERM).success());
}
