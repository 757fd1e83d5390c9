//! On-demand units (DESIGN §9) with the real daemon and real processes:
//! idle with cached lists, started by a first use from `mcpctl call` or a
//! host session through `mcpctl bridge`, stopped after `idle-stop`, the
//! cache kept across daemon restarts and invalidated by a changed command.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use serde_json::json;

use crate::helper::{
    BOUND, Daemon, alive, eventually, eventually_async, holds_within, mcpctl_user,
    mcpctl_user_command, timed_out,
};

/// A unit directory with `lazy.kdl`: the fixture on demand, idling
/// `idle` after its last use, each spawn counted in `count`.
struct Setup {
    units: tempfile::TempDir,
    state: tempfile::TempDir,
    count: PathBuf,
}

impl Setup {
    fn new(idle: &str) -> Self {
        Self::with(&["--chatter", "0"], idle)
    }

    /// The fixture with flags `args`.
    fn with(args: &[&str], idle: &str) -> Self {
        let units = tempfile::tempdir().expect("units");
        let state = tempfile::tempdir().expect("state");
        let count = units.path().join("count");
        let setup = Self {
            units,
            state,
            count,
        };
        setup.write(args, idle);
        setup
    }

    /// Writes the unit with the fixture's flags `args` (other flags are
    /// another command). One process whatever era its hosts speak (pinned
    /// to 2026-07-28: its starts are counted, and a 2025 host's lane
    /// starts with that host's `initialize`, DESIGN §12).
    fn write(&self, args: &[&str], idle: &str) {
        let args: String = args.iter().map(|a| format!(" \"{a}\"")).collect();
        std::fs::write(
            self.units.path().join("lazy.kdl"),
            format!(
                "stdio {{\n    command \"mcp-fixture\"{args} \"--count-file\" \"{}\"\n}}\nstart \"on-demand\"\nidle-stop \"{idle}\"\nstop-timeout \"2s\"\nprotocol \"2026-07-28\"\n",
                self.count.display()
            ),
        )
        .expect("write unit");
    }

    fn daemon(&self) -> Daemon {
        Daemon::user_no_bus(
            self.units.path(),
            &[("MCPD_STATE_DIR", self.state.path().as_os_str())],
        )
    }

    /// The pids of every spawn so far.
    fn spawns(&self) -> Vec<u32> {
        std::fs::read_to_string(&self.count)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    fn cache(&self) -> PathBuf {
        self.state.path().join("cache").join("lazy.json")
    }
}

fn ctl(runtime: &Path, args: &[&str]) -> (bool, String) {
    let out = mcpctl_user(runtime, args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn active(runtime: &Path) -> String {
    let (_, text) = ctl(runtime, &["status", "lazy"]);
    text.lines()
        .find(|l| l.trim_start().starts_with("Active:"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Waits (bounded) until `lazy`'s `Active:` line contains `what`.
fn wait_active(runtime: &Path, what: &str) -> String {
    let mut line = String::new();
    let became = holds_within(BOUND, || {
        line = active(runtime);
        line.contains(what)
    });
    assert!(
        became,
        "{}; last: {line}",
        timed_out(format_args!("lazy to become {what:?}"), BOUND)
    );
    line
}

/// Whether every spawned process is gone (the last one is what an idle
/// stop stops).
fn none_alive(setup: &Setup) -> bool {
    !setup.spawns().into_iter().any(alive)
}

#[test]
fn an_idle_server_answers_lists_without_a_process_and_first_uses_start_it_once() {
    // Every start takes 300 ms: first uses that come meanwhile all wait.
    let setup = Setup::with(&["--chatter", "0", "--slow-start", "300ms"], "1s");
    let d = setup.daemon();
    let runtime = d.runtime_dir().expect("runtime").to_owned();

    // No cache yet: it starts once to learn its lists, then idles.
    let line = wait_active(&runtime, "idle (stopped after 1s idle)");
    assert!(line.contains("idle"), "{line}");
    eventually("every server process to exit", BOUND, || none_alive(&setup));
    assert_eq!(setup.spawns().len(), 1, "one discovery start");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(setup.cache())
        .expect("cache written")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let cache: serde_json::Value =
        serde_json::from_slice(&std::fs::read(setup.cache()).expect("read")).expect("json");
    assert_eq!(cache["initialize"]["serverInfo"]["name"], "mcp-fixture");
    assert_eq!(cache["resources"][0]["uri"], "fixture://a");

    // Idle is healthy; lists come from the cache, nothing is spawned.
    let (ok, status) = ctl(&runtime, &["status", "lazy"]);
    assert!(ok, "idle exits 0: {status}");
    assert!(
        !status.contains("Main PID") && !status.contains("Containment:"),
        "no process: {status}"
    );
    assert!(
        status.contains("      Start: on demand, stops after 1s idle"),
        "{status}"
    );
    let (ok, tools) = ctl(&runtime, &["tools", "lazy"]);
    assert!(ok && tools.contains("echo"), "{tools}");
    let (ok, resources) = ctl(&runtime, &["resources", "lazy"]);
    assert!(ok && resources.contains("fixture://a"), "{resources}");
    let (ok, json) = ctl(&runtime, &["status", "lazy", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&json).expect("status --json");
    assert!(ok);
    assert_eq!(json[0]["state"], "idle");
    assert_eq!(json[0]["main_pid"], 0);
    assert_eq!(json[0]["start"], "on-demand");
    assert_eq!(json[0]["idle_stop_usec"], 1_000_000);
    assert_eq!(setup.spawns().len(), 1, "listing never starts it");

    // A host session: initialize and tools/list from the cache; the first
    // tools/call starts the server (cold) and succeeds.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            let (_bridge, io) = crate::helper::bridge(&runtime, "lazy");
            let host = ().serve(io).await.expect("initialize while idle");
            let info = host.peer_info().expect("server info");
            assert_eq!(
                info.server_info.as_ref().map(|i| i.name.as_str()),
                Some("mcp-fixture")
            );
            let tools = host.list_all_tools().await.expect("tools/list");
            assert!(tools.iter().any(|t| t.name == "echo"));
            let resources = host.list_all_resources().await.expect("resources/list");
            assert_eq!(resources.len(), 1);
            assert_eq!(setup.spawns().len(), 1, "the host's lists started nothing");
            let result = host
                .call_tool(
                    CallToolRequestParams::new("echo")
                        .with_arguments(json!({"text": "cold"}).as_object().cloned().expect("obj")),
                )
                .await
                .expect("cold tools/call");
            assert_eq!(
                serde_json::to_value(&result.content).expect("json")[0]["text"],
                "cold"
            );
            assert_eq!(setup.spawns().len(), 2, "the first use started it");
            // The host stays attached through the idle stop, and its next
            // call starts the server again.
            wait_active(&runtime, "idle (stopped after 1s idle)");
            eventually("every server process to exit", BOUND, || none_alive(&setup));
            let (_, status) = ctl(&runtime, &["status", "lazy"]);
            assert!(
                status.contains("   Sessions: 1 (1 on 2025-11-25)"),
                "{status}"
            );
            let result = host
                .call_tool(
                    CallToolRequestParams::new("add")
                        .with_arguments(json!({"a": 2, "b": 3}).as_object().cloned().expect("obj")),
                )
                .await
                .expect("second cold call");
            assert_eq!(
                serde_json::to_value(&result.content).expect("json")[0]["text"],
                "5"
            );
            assert_eq!(setup.spawns().len(), 3);
            host.cancel().await.expect("close");
        })
        .await
        .expect("within 60 s");
    });

    // 20 concurrent first calls from mcpctl (all within the 300 ms the
    // start takes): one process.
    wait_active(&runtime, "idle (stopped after 1s idle)");
    eventually("every server process to exit", BOUND, || none_alive(&setup));
    let before = setup.spawns().len();
    let calls: Vec<std::process::Child> = (0..20)
        .map(|i| {
            let text = format!("{{\"text\":\"n{i}\"}}");
            mcpctl_user_command(&runtime, &["call", "lazy", "echo", &text])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("mcpctl call")
        })
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        let out = call.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "call {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("n{i}"));
    }
    assert_eq!(setup.spawns().len(), before + 1, "exactly one spawn");

    // After idle-stop the process is gone and the state is idle.
    wait_active(&runtime, "idle (stopped after 1s idle)");
    eventually("every server process to exit", BOUND, || none_alive(&setup));

    // D-Bus ReadResource is a use too: it starts the server and gets the
    // server's own answer (the fixture reads no resources), not the
    // daemon's "not running".
    let spawned = setup.spawns().len();
    rt.block_on(async {
        let (_conn, server) =
            crate::helper::private_server(&runtime.join("mcpd/private"), "lazy").await;
        match server.read_resource("fixture://a").await {
            Err(mcpd::dbus::Error::InvalidArguments(message)) => {
                assert_eq!(message, "resources/read", "rmcp names the method it lacks");
            }
            other => panic!("the server's own refusal, got {other:?}"),
        }
    });
    assert_eq!(setup.spawns().len(), spawned + 1);
    wait_active(&runtime, "idle (stopped after 1s idle)");
    eventually("every server process to exit", BOUND, || none_alive(&setup));

    // Stop is final: no activation until start.
    let before = setup.spawns().len();
    let (ok, out) = ctl(&runtime, &["stop", "lazy"]);
    assert!(ok, "{out}");
    wait_active(&runtime, "stopped");
    let (ok, out) = ctl(&runtime, &["call", "lazy", "echo", "{\"text\":\"x\"}"]);
    assert!(!ok && out.contains("server lazy is stopped"), "{out}");
    let (_, tools) = ctl(&runtime, &["tools", "lazy"]);
    assert!(!tools.contains("echo"), "withdrawn by stop: {tools}");
    assert_eq!(setup.spawns().len(), before, "stopped means stopped");
    let (ok, out) = ctl(&runtime, &["start", "lazy"]);
    assert!(ok, "{out}");
    wait_active(&runtime, "running");
    assert_eq!(setup.spawns().len(), before + 1, "start runs it now");
    wait_active(&runtime, "idle (stopped after 1s idle)");
    eventually("every server process to exit", BOUND, || none_alive(&setup));
    drop(d);
}

#[test]
fn the_cache_outlives_the_daemon_and_a_changed_command_or_a_corrupt_file_relearns() {
    let setup = Setup::new("500ms");
    {
        let d = setup.daemon();
        let runtime = d.runtime_dir().expect("runtime").to_owned();
        wait_active(&runtime, "idle (stopped after 500ms idle)");
        eventually("every server process to exit", BOUND, || none_alive(&setup));
    }
    assert_eq!(setup.spawns().len(), 1);

    // A new daemon lists the cached tools without spawning.
    {
        let mut d = setup.daemon();
        let runtime = d.runtime_dir().expect("runtime").to_owned();
        wait_active(&runtime, "idle (waiting for first use)");
        let (ok, tools) = ctl(&runtime, &["tools", "lazy"]);
        assert!(ok && tools.contains("echo"), "{tools}");
        // The era it was spoken to in is the cache's too (the fixture
        // answers server/discover: 2026-07-28), in status and on D-Bus.
        let (_, status) = ctl(&runtime, &["status", "lazy"]);
        assert!(status.contains("   Protocol: 2026-07-28"), "{status}");
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let version = rt.block_on(async {
            let (_conn, server) =
                crate::helper::private_server(&runtime.join("mcpd/private"), "lazy").await;
            server.protocol_version().await.expect("ProtocolVersion")
        });
        assert_eq!(version, "2026-07-28");
        assert_eq!(setup.spawns().len(), 1, "the cache answered");
        // A start that learns the same lists leaves the file alone (a
        // rewrite would be a new inode: it is renamed into place).
        use std::os::unix::fs::MetadataExt;
        let inode = std::fs::metadata(setup.cache()).expect("cache").ino();
        let (ok, out) = ctl(&runtime, &["call", "lazy", "echo", "{\"text\":\"x\"}"]);
        assert!(ok, "{out}");
        wait_active(&runtime, "idle (stopped after 500ms idle)");
        assert_eq!(
            std::fs::metadata(setup.cache()).expect("cache").ino(),
            inode
        );
        assert_eq!(setup.spawns().len(), 2);

        // A changed command: the cache is not its lists; it starts to
        // learn them (a reload, as `mcpctl reload` after an edit).
        setup.write(&["--name", "0"], "500ms");
        let (ok, out) = ctl(&runtime, &["reload"]);
        assert!(ok, "{out}");
        d.wait_until("the changed unit started", |_| setup.spawns().len() == 3);
        wait_active(&runtime, "idle (stopped after 500ms idle)");
        eventually("every server process to exit", BOUND, || none_alive(&setup));
    }
    // ... and across a restart too: the old cache was replaced.
    {
        let d = setup.daemon();
        let runtime = d.runtime_dir().expect("runtime").to_owned();
        wait_active(&runtime, "idle (waiting for first use)");
        assert_eq!(setup.spawns().len(), 3);
    }
    // A cache written for another command is not used.
    setup.write(&["--chatter", "0"], "500ms");
    {
        let d = setup.daemon();
        let runtime = d.runtime_dir().expect("runtime").to_owned();
        wait_active(&runtime, "idle (stopped after 500ms idle)");
        eventually("every server process to exit", BOUND, || none_alive(&setup));
        assert_eq!(setup.spawns().len(), 4, "started to learn its lists");
    }

    // A corrupt cache is a warning and a fresh discovery start.
    std::fs::write(setup.cache(), "{\"version\": 1, \"key\": ").expect("corrupt");
    let mut d = setup.daemon();
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let warning = d.wait_for("is not a valid cache");
    assert!(
        warning.contains(&setup.cache().display().to_string()),
        "{warning}"
    );
    wait_active(&runtime, "idle (stopped after 500ms idle)");
    eventually("every server process to exit", BOUND, || none_alive(&setup));
    assert_eq!(setup.spawns().len(), 5);
    let cache: serde_json::Value =
        serde_json::from_slice(&std::fs::read(setup.cache()).expect("read")).expect("rewritten");
    assert!(cache["tools"].as_array().is_some_and(|t| !t.is_empty()));
}

#[test]
fn a_crash_mid_call_fails_the_call_and_the_unit_follows_its_backoff() {
    let setup = Setup::new("10m");
    let mut d = setup.daemon();
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    // Discovery runs it; with a 10m idle-stop it stays for the test.
    wait_active(&runtime, "running");
    let pid = *setup.spawns().last().expect("spawned");
    let call = mcpctl_user_command(&runtime, &["call", "lazy", "hang", "{}"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("mcpctl call");
    d.wait_for("call hang");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(pid).expect("pid")).expect("pid"),
        rustix::process::Signal::KILL,
    )
    .expect("kill");
    let out = call.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("connection lost"), "{err}");
    d.wait_for("retry 1/");
    wait_active(&runtime, "running");
    assert_eq!(setup.spawns().len(), 2, "one retry, as for any unit");
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

#[test]
fn a_start_whose_tools_differ_from_the_cache_updates_it_and_tells_hosts() {
    let setup = Setup::new("1s");
    let d = setup.daemon();
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    wait_active(&runtime, "idle (stopped after 1s idle)");
    let cached_tools = || -> Vec<String> {
        let cache: serde_json::Value =
            serde_json::from_slice(&std::fs::read(setup.cache()).expect("read")).expect("json");
        cache["tools"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(!cached_tools().contains(&"extra".to_owned()));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            let host = Counting::default();
            let changes = std::sync::Arc::clone(&host.0);
            let (_bridge, io) = crate::helper::bridge(&runtime, "lazy");
            let client = host.serve(io).await.expect("initialize");
            let seen = || changes.load(std::sync::atomic::Ordering::SeqCst);
            // The server changes its list while it runs (a cold call):
            // the cache follows, hosts are told.
            client
                .call_tool(
                    CallToolRequestParams::new("set_tools").with_arguments(
                        json!({"tools": ["extra"]})
                            .as_object()
                            .cloned()
                            .expect("obj"),
                    ),
                )
                .await
                .expect("set_tools");
            eventually_async("list_changed after set_tools", BOUND, async || seen() == 1).await;
            eventually_async("the cache lists extra", BOUND, async || {
                cached_tools().contains(&"extra".to_owned())
            })
            .await;
            // Idle: the changed list is what is answered.
            eventually_async("idle again", BOUND, async || {
                active(&runtime).contains("idle (stopped")
            })
            .await;
            let tools = client.list_all_tools().await.expect("tools/list");
            assert!(tools.iter().any(|t| t.name == "extra"), "from the cache");
            assert_eq!(
                seen(),
                1,
                "the cold start with the cached list was not news"
            );
            // A new process lists its tools afresh (no extra): the
            // published list, the cache and hosts follow.
            client
                .call_tool(
                    CallToolRequestParams::new("echo")
                        .with_arguments(json!({"text": "x"}).as_object().cloned().expect("obj")),
                )
                .await
                .expect("cold echo");
            eventually_async("list_changed after the start", BOUND, async || seen() == 2).await;
            let tools = client.list_all_tools().await.expect("tools/list");
            assert!(!tools.iter().any(|t| t.name == "extra"), "{tools:?}");
            eventually_async("the cache is rewritten", BOUND, async || {
                !cached_tools().contains(&"extra".to_owned())
            })
            .await;
            client.cancel().await.expect("close");
        })
        .await
        .expect("within 60 s");
    });
    wait_active(&runtime, "idle (stopped after 1s idle)");
    eventually("every server process to exit", BOUND, || none_alive(&setup));
    drop(d);
}

#[test]
fn a_failed_on_demand_start_fails_the_waiting_call_with_the_state_and_the_backoff_follows() {
    let dir = tempfile::tempdir().expect("dir");
    let program = dir.path().join("server");
    std::os::unix::fs::symlink(crate::helper::fixture_path(), &program).expect("symlink");
    let units = tempfile::tempdir().expect("units");
    std::fs::write(
        units.path().join("lazy.kdl"),
        format!(
            "stdio {{\n    command \"{}\" \"--chatter\" \"0\"\n}}\nstart \"on-demand\"\nidle-stop \"500ms\"\nreconnect {{\n    initial-delay \"200ms\"\n    max-delay \"400ms\"\n    max-attempts 1\n}}\n",
            program.display()
        ),
    )
    .expect("unit");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    wait_active(&runtime, "idle (stopped after 500ms idle)");
    // The same command now fails at once (its cache stays valid).
    std::fs::remove_file(&program).expect("rm");
    std::fs::write(&program, "#!/bin/sh\nexit 7\n").expect("script");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let (ok, out) = ctl(&runtime, &["call", "lazy", "echo", "{\"text\":\"x\"}"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("server lazy is retrying (retry 1/1") && out.contains("connection failed: "),
        "the waiting call gets the state and the next retry: {out}"
    );
    d.wait_for("retry 1/1");
    let line = wait_active(&runtime, "Active: failed");
    assert!(line.contains("gave up after 1 retry"), "{line}");
    let (_, tools) = ctl(&runtime, &["tools", "lazy"]);
    assert!(
        !tools.contains("echo"),
        "withdrawn on final failure: {tools}"
    );
    // The daemon is fine, and nothing starts a failed unit but restart.
    let (ok, out) = ctl(&runtime, &["call", "lazy", "echo", "{\"text\":\"x\"}"]);
    assert!(!ok && out.contains("server lazy is failed"), "{out}");
    assert_eq!(
        d.count("mcpd_server=lazy generation=4"),
        0,
        "no start after failed"
    );
}

#[test]
fn a_host_that_only_pings_does_not_keep_an_idle_server_running() {
    use std::io::{BufRead, Write};
    let setup = Setup::with(&["--chatter", "0", "--tools", "sleep"], "700ms");
    let d = setup.daemon();
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    wait_active(&runtime, "idle (stopped after 700ms idle)");
    let mut bridge = mcpctl_user_command(&runtime, &["bridge", "lazy"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("bridge");
    let mut to = bridge.stdin.take().expect("stdin");
    let mut from = std::io::BufReader::new(bridge.stdout.take().expect("stdout"));
    let mut ask = |line: &str| -> String {
        writeln!(to, "{line}").expect("write");
        to.flush().expect("flush");
        let mut answer = String::new();
        from.read_line(&mut answer).expect("read");
        answer
    };
    let init = ask(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"pinger","version":"1"}}}"#,
    );
    assert!(init.contains("\"result\""), "{init}");
    // A list the server does not offer: refused as it would refuse it,
    // without starting it.
    let prompts = ask(r#"{"jsonrpc":"2.0","id":3,"method":"prompts/list"}"#);
    assert!(
        prompts.contains("-32601") && prompts.contains("server lazy does not offer prompts"),
        "{prompts}"
    );
    assert_eq!(setup.spawns().len(), 1, "listing started nothing");
    let call = ask(
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"cold"}}}"#,
    );
    assert!(call.contains("cold"), "{call}");
    assert_eq!(setup.spawns().len(), 2);
    // A call longer than idle-stop is use until it is answered.
    let slow = ask(
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":1600}}}"#,
    );
    assert!(
        slow.contains("\"result\"") && !slow.contains("\"error\""),
        "{slow}"
    );
    assert!(
        active(&runtime).contains("running"),
        "not stopped under the call"
    );
    assert_eq!(setup.spawns().len(), 2);
    // Pings and the session's log level, every 100 ms: answered by mcpd,
    // no use of the server; it idles on time anyway.
    let mut id = 10;
    eventually("lazy to idle under pings", BOUND, || {
        if active(&runtime).contains("idle (stopped") {
            return true;
        }
        id += 1;
        let pong = ask(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#));
        assert!(pong.contains("\"result\""), "{pong}");
        id += 1;
        let level = ask(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"logging/setLevel","params":{{"level":"info"}}}}"#
        ));
        assert!(level.contains("\"result\""), "{level}");
        // (scenario: a host that pings every 100 ms)
        std::thread::sleep(Duration::from_millis(100));
        false
    });
    eventually("every server process to exit", BOUND, || none_alive(&setup));
    drop(to);
    let _ = bridge.wait();
    drop(d);
}
