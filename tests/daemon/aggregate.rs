//! One host entry for many servers (DESIGN §14): `mcpctl bridge @GROUP`,
//! `mcpctl bridge A B`, their tools and prompts named `UNIT__NAME`, through
//! the real `mcpd` with real servers (`mcp-server-time`,
//! `@modelcontextprotocol/server-everything`, the fixture), the host being
//! the official MCP Python SDK's `ClientSession`
//! (`tests/data/aggregate_client.py`, driven a line at a time).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::daemon::fidelity::everything;
use crate::helper::{BOUND, Daemon, eventually, mcpctl, root, run};

/// A host: the Python SDK behind `mcpctl bridge ARGS`, one JSON command
/// and one JSON answer per line.
struct Host {
    child: Child,
    stdin: ChildStdin,
    answers: mpsc::Receiver<String>,
}

impl Host {
    fn start(runtime: &Path, args: &[&str]) -> Self {
        let mut child = Command::new("python3")
            .arg(root().join("tests/data/aggregate_client.py"))
            .arg(env!("CARGO_BIN_EXE_mcpctl"))
            .args(args)
            .env("XDG_RUNTIME_DIR", runtime)
            .env_remove("MCPD_RUNTIME_DIR")
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 aggregate_client.py");
        let stdin = child.stdin.take().expect("stdin");
        let stdout: ChildStdout = child.stdout.take().expect("stdout");
        let (tx, answers) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            stdin,
            answers,
        }
    }

    fn ask(&mut self, command: Value) -> Value {
        writeln!(self.stdin, "{command}").expect("write to the host");
        let line = self
            .answers
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("the host did not answer {command}"));
        serde_json::from_str(&line).expect("a JSON line")
    }

    fn names(&mut self, op: &str) -> Vec<String> {
        let answer = self.ask(json!({"op": op}));
        serde_json::from_value(answer["names"].clone()).unwrap_or_else(|_| panic!("{op}: {answer}"))
    }

    fn call(&mut self, name: &str, args: Value) -> Value {
        self.ask(json!({"op": "call", "name": name, "args": args}))
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_unit(dir: &Path, name: &str, body: &str) {
    std::fs::write(dir.join(format!("{name}.kdl")), body).expect("write unit");
}

fn fixture_unit(groups: &str, extra: &str) -> String {
    format!(
        "group {groups}\nstdio {{\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}}\n{extra}"
    )
}

/// A tool name that makes a 69-character name under the prefix `a__`.
const LONG: &str = "a_tool_whose_name_is_long_enough_to_pass_what_some_hosts_allow_xyz";

fn runtime(daemon: &Daemon) -> std::path::PathBuf {
    daemon.runtime_dir().expect("runtime dir").to_owned()
}

#[test]
fn a_group_is_one_server_whose_tools_and_prompts_carry_their_units_prefix() {
    let units = tempfile::tempdir().expect("units");
    let time = root().join("target/py-time/bin/mcp-server-time");
    assert!(
        time.is_file(),
        "{} is missing: .ci/run installs mcp-server-time into target/py-time",
        time.display()
    );
    write_unit(
        units.path(),
        "time",
        &format!(
            "group \"dev\"\nstdio {{\n    command \"{}\" \"--local-timezone\" \"Europe/Paris\"\n}}\n",
            time.display()
        ),
    );
    write_unit(
        units.path(),
        "everything",
        &format!(
            "group \"dev\" \"other\"\nalias \"ev\"\nstdio {{\n    command \"node\" \"{}\" \"stdio\"\n}}\n",
            everything().display()
        ),
    );
    // Outside the group.
    write_unit(units.path(), "demo", &fixture_unit("\"elsewhere\"", ""));
    let mut daemon = Daemon::user_no_bus(units.path(), &[]);
    for unit in ["time", "everything", "demo"] {
        daemon.wait_until(&format!("{unit} running"), |d| {
            d.about(unit).any(|l| l.contains("running (pid"))
        });
    }
    let mut host = Host::start(&runtime(&daemon), &["@dev"]);
    let init = host.ask(json!({"op": "init"}));
    assert_eq!(init["name"], "mcpd", "{init}");
    assert_eq!(init["title"], "mcpd @dev", "{init}");
    // server-everything's instructions, under its unit's name.
    assert!(
        init["instructions"]
            .as_str()
            .is_some_and(|i| i.starts_with("## everything\n")),
        "{init}"
    );

    let tools = host.names("tools");
    assert!(
        tools.contains(&"time__get_current_time".to_owned()),
        "{tools:?}"
    );
    assert!(tools.contains(&"ev__echo".to_owned()), "{tools:?}");
    assert!(
        tools
            .iter()
            .all(|t| t.starts_with("time__") || t.starts_with("ev__")),
        "only the group's units, each under its prefix: {tools:?}"
    );
    let prompts = host.names("prompts");
    assert!(!prompts.is_empty(), "server-everything's prompts");
    assert!(prompts.iter().all(|p| p.starts_with("ev__")), "{prompts:?}");

    // Each call reaches its own server, which gets its own name back.
    let now = host.call("time__get_current_time", json!({"timezone": "Asia/Tokyo"}));
    assert!(
        now["text"]
            .as_str()
            .is_some_and(|t| t.contains("Asia/Tokyo")),
        "{now}"
    );
    let echo = host.call("ev__echo", json!({"message": "hi"}));
    assert_eq!(echo["text"], "Echo: hi", "{echo}");
    let prompt = host.ask(json!({"op": "prompt", "name": "ev__simple-prompt"}));
    assert!(
        prompt["text"].as_str().is_some_and(|t| !t.is_empty()),
        "{prompt}"
    );
    // A tool of no unit in the group.
    let outside = host.call("demo__echo", json!({"text": "x"}));
    assert!(
        outside["raised"]
            .as_str()
            .is_some_and(|r| r.contains("no tool named \"demo__echo\"")),
        "{outside}"
    );

    // Resources keep their URIs, and a read goes to the unit that listed it.
    let resources = host.ask(json!({"op": "resources"}));
    let uri = resources["uris"]
        .as_array()
        .and_then(|u| {
            u.iter()
                .filter_map(Value::as_str)
                .find(|u| u.starts_with("demo://resource/static/document/"))
        })
        .unwrap_or_else(|| panic!("server-everything's resources: {resources}"))
        .to_owned();
    let read = host.ask(json!({"op": "read", "uri": uri}));
    assert!(
        read["text"].as_str().is_some_and(|t| !t.is_empty()),
        "{read}"
    );

    // The same units named one by one: one session over both.
    let mut pair = Host::start(&runtime(&daemon), &["time", "demo"]);
    let init = pair.ask(json!({"op": "init"}));
    assert_eq!(init["title"], "mcpd time+demo", "{init}");
    let tools = pair.names("tools");
    assert!(tools.contains(&"demo__echo".to_owned()), "{tools:?}");
    assert!(
        tools.contains(&"time__convert_time".to_owned()),
        "{tools:?}"
    );
    let echo = pair.call("demo__echo", json!({"text": "both"}));
    assert_eq!(echo["text"], "both", "{echo}");
}

#[test]
fn a_stopped_unit_keeps_its_tools_listed_and_fails_its_calls_while_the_others_answer() {
    let units = tempfile::tempdir().expect("units");
    // `a` is found stopped within half a second, then waits an hour to retry.
    // One process each (the test stops `a`'s): pinned to one era, so 2025
    // hosts are translated rather than given a lane (DESIGN §12).
    write_unit(
        units.path(),
        "a",
        &fixture_unit(
            "\"g\"",
            "protocol \"2026-07-28\"\nhealth {\n    interval \"300ms\"\n    timeout \"300ms\"\n    failures 1\n}\nreconnect {\n    initial-delay \"1h\"\n    max-delay \"2h\"\n}\n",
        ),
    );
    write_unit(
        units.path(),
        "b",
        &fixture_unit("\"g\"", "protocol \"2026-07-28\"\n"),
    );
    let mut daemon = Daemon::user_no_bus(units.path(), &[]);
    for unit in ["a", "b"] {
        daemon.wait_until(&format!("{unit} running"), |d| {
            d.about(unit).any(|l| l.contains("running (pid"))
        });
    }
    let a = daemon.latest_pid("a").expect("a's pid");
    let mut host = Host::start(&runtime(&daemon), &["@g"]);
    host.ask(json!({"op": "init"}));
    let before = host.names("tools");
    assert!(before.contains(&"a__echo".to_owned()), "{before:?}");

    rustix::process::kill_process(
        rustix::process::Pid::from_raw(a as i32).expect("pid"),
        rustix::process::Signal::STOP,
    )
    .expect("SIGSTOP a");
    // A call of `a` waits on the stopped server; `b` answers meanwhile.
    host.ask(json!({"op": "call", "name": "a__echo", "args": {"text": "x"}, "tag": "a"}));
    let b = host.call("b__echo", json!({"text": "still here"}));
    assert_eq!(b["text"], "still here", "{b}");

    // The missed probe ends `a`'s generation: its call fails with the
    // unit's own reason, and later calls are refused naming it.
    let waited = host.ask(json!({"op": "wait", "tag": "a"}));
    let failed = waited["raised"].as_str().unwrap_or_default().to_owned()
        + waited["text"].as_str().unwrap_or_default();
    assert!(
        failed.contains("connection lost") || failed.contains("not running"),
        "{waited}"
    );
    daemon.wait_until("a in backoff", |d| {
        d.about("a").any(|l| l.contains("retry 1/"))
    });
    let again = host.call("a__echo", json!({"text": "x"}));
    let refused = again["raised"].as_str().unwrap_or_default();
    assert!(refused.contains("a"), "{again}");
    assert!(
        refused.contains("not running") || refused.contains("retry"),
        "the §3 error: {again}"
    );
    // Its tools stay listed through the outage.
    assert_eq!(host.names("tools"), before);
    let b = host.call("b__echo", json!({"text": "after"}));
    assert_eq!(b["text"], "after", "{b}");
}

#[test]
fn a_reload_that_adds_a_unit_to_the_group_tells_the_attached_host() {
    let units = tempfile::tempdir().expect("units");
    write_unit(
        units.path(),
        "a",
        &format!(
            "group \"g\"\nstdio {{\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n    env MCP_FIXTURE_TOOLS=\"{LONG}\"\n}}\n"
        ),
    );
    let mut daemon = Daemon::user_no_bus(units.path(), &[]);
    daemon.wait_until("a running", |d| {
        d.about("a").any(|l| l.contains("running (pid"))
    });
    // `mcpctl tools @g` lists what a host of the group sees, and warns of
    // names some hosts refuse.
    let out = crate::helper::mcpctl_user(&runtime(&daemon), &["tools", "@g"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    let warned = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{warned}");
    assert!(
        listed.lines().any(|l| l.starts_with("a__echo ")),
        "{listed}"
    );
    assert!(
        warned.contains(&format!("a__{LONG} is 69 characters")),
        "{warned}"
    );
    // So does `mcpctl status` of the unit.
    let out = crate::helper::mcpctl_user(&runtime(&daemon), &["status", "a"]);
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(status.contains("     Groups: g (as a__…)"), "{status}");
    assert!(
        status.contains(&format!(
            "    Warning: 1 tool name in its groups over 64 characters, which some hosts refuse (a__{LONG}); a shorter alias helps"
        )),
        "{status}"
    );
    let mut host = Host::start(&runtime(&daemon), &["@g"]);
    host.ask(json!({"op": "init"}));
    let before = host.names("tools");
    assert!(before.iter().all(|t| t.starts_with("a__")), "{before:?}");

    write_unit(units.path(), "b", &fixture_unit("\"g\"", ""));
    // The directory watch reloads; the host is told the tools changed.
    let changed = host.ask(json!({"op": "changed"}));
    assert_eq!(changed["changed"], true, "{changed}");
    daemon.wait_until("b running", |d| {
        d.about("b").any(|l| l.contains("running (pid"))
    });
    let after = host.names("tools");
    assert!(after.contains(&"b__echo".to_owned()), "{after:?}");
    let b = host.call("b__echo", json!({"text": "new"}));
    assert_eq!(b["text"], "new", "{b}");

    // And a unit taken out of the group leaves it.
    write_unit(units.path(), "b", &fixture_unit("\"other\"", ""));
    let changed = host.ask(json!({"op": "changed"}));
    assert_eq!(changed["changed"], true, "{changed}");
    let tools = host.names("tools");
    assert!(tools.iter().all(|t| t.starts_with("a__")), "{tools:?}");
}

#[test]
fn an_alias_that_is_another_units_prefix_is_refused_by_verify_naming_both_files() {
    let dir = tempfile::tempdir().expect("units");
    write_unit(dir.path(), "github", &fixture_unit("\"dev\"", ""));
    write_unit(
        dir.path(),
        "gh-enterprise",
        &fixture_unit("\"dev\"", "alias \"github\"\n"),
    );
    let out = run(mcpctl().arg("verify").arg(dir.path()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&dir.path().join("github.kdl").display().to_string())
            && stderr.contains(&dir.path().join("gh-enterprise.kdl").display().to_string())
            && stderr.contains("github__"),
        "{stderr}"
    );
    // A bad alias or group is a located error of its own file.
    write_unit(
        dir.path(),
        "gh-enterprise",
        &fixture_unit("\"all\"", "alias \"g.h\"\n"),
    );
    let out = run(mcpctl()
        .arg("verify")
        .arg(dir.path().join("gh-enterprise.kdl")));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("`group`: \"all\" is every unit"),
        "{stderr}"
    );
    assert!(stderr.contains("`alias`: unit name `g.h`"), "{stderr}");
}

#[test]
fn verify_warns_of_names_over_64_characters_an_aggregate_would_make_and_still_passes() {
    let dir = tempfile::tempdir().expect("units");
    let state = tempfile::tempdir().expect("state");
    // A prefix that leaves no room for any name: `{62 characters}__x`.
    let wide = "w".repeat(62);
    write_unit(dir.path(), &wide, &fixture_unit("\"g\"", ""));
    // An on-demand unit learns its lists once and caches them: verify
    // reads the instance's cache and names the tool that gets too long.
    write_unit(
        dir.path(),
        "a",
        &format!(
            "start \"on-demand\"\nstdio {{\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n    env MCP_FIXTURE_TOOLS=\"{LONG}\"\n}}\n"
        ),
    );
    let verify = || {
        let out = run(mcpctl()
            .args(["--user", "verify"])
            .arg(dir.path())
            .env("MCPD_STATE_DIR", state.path()));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "warnings only: {stderr}");
        stderr
    };
    let wide_file = dir.path().join(format!("{wide}.kdl")).display().to_string();
    let before = verify();
    assert!(
        before.contains(&format!(
            "mcpctl: warning: {wide_file}: in an aggregate every tool and prompt name of unit {wide} is over 64 characters"
        )),
        "{before}"
    );
    assert!(!before.contains(LONG), "no cache yet: {before}");

    let cache = state.path().join("cache/a.json");
    let daemon = Daemon::user_no_bus(dir.path(), &[("MCPD_STATE_DIR", state.path().as_os_str())]);
    eventually("the aggregate's cache", BOUND, || cache.exists());
    drop(daemon);
    let after = verify();
    assert!(
        after.contains(&format!(
            "mcpctl: warning: {}: in an aggregate a__{LONG} would be over 64 characters (as unit a last listed them)",
            dir.path().join("a.kdl").display()
        )),
        "{after}"
    );
    // Without an instance there is no cache to read: only the prefix rule.
    let out = run(mcpctl().arg("verify").arg(dir.path()));
    let plain = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{plain}");
    assert!(
        plain.contains(&wide_file) && !plain.contains(LONG),
        "{plain}"
    );
}

#[test]
fn attach_group_on_d_bus_gives_the_same_session_and_refuses_an_empty_group() {
    use std::io::{BufRead as _, Write as _};
    let units = tempfile::tempdir().expect("units");
    write_unit(units.path(), "a", &fixture_unit("\"g\"", ""));
    write_unit(units.path(), "b", &fixture_unit("\"g\"", ""));
    let mut daemon = Daemon::user_no_bus(units.path(), &[]);
    for unit in ["a", "b"] {
        daemon.wait_until(&format!("{unit} running"), |d| {
            d.about(unit).any(|l| l.contains("running (pid"))
        });
    }
    let socket = runtime(&daemon).join("mcpd/private");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (fd, missing, units_fd) = rt.block_on(async {
        let conn = crate::helper::private_conn(&socket).await;
        let manager = mcpd::dbus::ManagerProxy::new(&conn).await.expect("proxy");
        let fd = manager.attach_group("g").await.expect("AttachGroup");
        let missing = manager.attach_group("nobody").await.map(|_| ());
        let units_fd = manager.attach_units(&["b"]).await.expect("AttachUnits");
        (fd, missing, units_fd)
    });
    assert!(
        matches!(&missing, Err(mcpd::dbus::Error::NoSuchServer(m)) if m.contains("no unit is in group nobody")),
        "{missing:?}"
    );
    let session = |fd: zbus::OwnedFd| {
        let stream = std::os::unix::net::UnixStream::from(std::os::fd::OwnedFd::from(fd));
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        stream
    };
    let ask = |stream: &mut std::os::unix::net::UnixStream, line: Value| {
        writeln!(stream, "{line}").expect("write");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut answer = String::new();
        reader.read_line(&mut answer).expect("an answer");
        serde_json::from_str::<Value>(&answer).expect("JSON")
    };
    let mut group = session(fd);
    let init = ask(
        &mut group,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    assert_eq!(init["result"]["serverInfo"]["title"], "mcpd @g", "{init}");
    writeln!(
        group,
        "{}",
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )
    .expect("write");
    let call = ask(
        &mut group,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "b__echo", "arguments": {"text": "over d-bus"}}}),
    );
    assert_eq!(call["id"], 2, "{call}");
    assert_eq!(call["result"]["content"][0]["text"], "over d-bus", "{call}");
    let mut one = session(units_fd);
    let init = ask(
        &mut one,
        json!({"jsonrpc": "2.0", "id": "x", "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    assert_eq!(init["result"]["serverInfo"]["title"], "mcpd b", "{init}");
}

#[test]
fn an_idle_on_demand_unit_of_a_group_is_started_by_its_first_call_only() {
    let units = tempfile::tempdir().expect("units");
    let count = units.path().join("count");
    // One process, counted: pinned to one era (a 2025 host's lane would
    // start with its initialize, DESIGN §12).
    write_unit(
        units.path(),
        "lazy",
        &format!(
            "group \"g\"\nstdio {{\n    command \"mcp-fixture\" \"--chatter\" \"0\" \"--count-file\" \"{}\"\n}}\nstart \"on-demand\"\nidle-stop \"1s\"\nstop-timeout \"2s\"\nprotocol \"2026-07-28\"\n",
            count.display()
        ),
    );
    write_unit(units.path(), "b", &fixture_unit("\"g\"", ""));
    let mut daemon = Daemon::user_no_bus(units.path(), &[]);
    let rt = runtime(&daemon);
    let status = |rt: &Path| {
        let out = crate::helper::mcpctl_user(rt, &["status", "lazy"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Started once to learn its lists, then idle.
    daemon.wait_until("lazy idle", |_| {
        status(&rt).contains("idle (stopped after 1s idle)")
    });
    let spawns = || {
        std::fs::read_to_string(&count)
            .unwrap_or_default()
            .lines()
            .count()
    };
    assert_eq!(spawns(), 1);

    let mut host = Host::start(&rt, &["@g"]);
    host.ask(json!({"op": "init"}));
    let tools = host.names("tools");
    assert!(tools.contains(&"lazy__echo".to_owned()), "{tools:?}");
    host.names("prompts");
    host.ask(json!({"op": "resources"}));
    assert!(
        status(&rt).contains("idle"),
        "the lists start nothing: {}",
        status(&rt)
    );
    assert_eq!(spawns(), 1, "initialize and the lists start nothing");

    let echo = host.call("lazy__echo", json!({"text": "woke"}));
    assert_eq!(echo["text"], "woke", "{echo}");
    assert_eq!(spawns(), 2, "its first call started it");
}

#[test]
fn a_host_flooding_an_aggregate_is_refused_past_its_bound_and_disturbs_no_other_host() {
    use std::io::{BufRead as _, Write as _};
    let units = tempfile::tempdir().expect("units");
    write_unit(units.path(), "a", &fixture_unit("\"g\"", ""));
    let mut daemon = Daemon::user_no_bus(units.path(), &[]);
    daemon.wait_until("a running", |d| {
        d.about("a").any(|l| l.contains("running (pid"))
    });
    let socket = runtime(&daemon).join("mcpd/private");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let fd = rt.block_on(async {
        let conn = crate::helper::private_conn(&socket).await;
        let manager = mcpd::dbus::ManagerProxy::new(&conn).await.expect("proxy");
        manager.attach_group("g").await.expect("AttachGroup")
    });
    let flood = std::os::unix::net::UnixStream::from(std::os::fd::OwnedFd::from(fd));
    flood
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut lines = String::new();
    lines.push_str(&format!(
        "{}\n",
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "flood", "version": "1"}}})
    ));
    // More calls that never end than an aggregate keeps in flight.
    let calls = mcpd::mux::aggregate::MAX_IN_FLIGHT + 50;
    for id in 1..=calls {
        lines.push_str(&format!(
            "{}\n",
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                   "params": {"name": "a__hang", "arguments": {}}})
        ));
    }
    let writer = {
        let mut flood = flood.try_clone().expect("clone");
        std::thread::spawn(move || flood.write_all(lines.as_bytes()))
    };
    let mut reader = BufReader::new(flood.try_clone().expect("clone"));
    let mut refused = 0;
    while refused < 50 {
        let mut line = String::new();
        reader
            .read_line(&mut line)
            .expect("the aggregate answers the excess");
        let answer: Value = serde_json::from_str(&line).expect("JSON");
        if answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("requests are in flight already"))
        {
            refused += 1;
        }
    }
    writer.join().expect("writer").expect("write the flood");
    // Another host of the group is served meanwhile.
    let mut other = Host::start(&runtime(&daemon), &["@g"]);
    other.ask(json!({"op": "init"}));
    let echo = other.call("a__echo", json!({"text": "unhurt"}));
    assert_eq!(echo["text"], "unhurt", "{echo}");
    drop(flood);
}

#[test]
fn a_killed_daemons_aggregate_requests_in_flight_are_failed_by_the_bridge() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    write_unit(units.path(), "demo", &fixture_unit("\"g\"", ""));
    let start = || {
        let mut d = Daemon::user_no_bus(
            units.path(),
            &[("XDG_RUNTIME_DIR", runtime.path().as_os_str())],
        );
        d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
        d
    };
    let first = start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let next = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            let (_bridge, (stdout, mut stdin)) = crate::helper::bridge(runtime.path(), "@g");
            let mut out = tokio::io::BufReader::new(stdout).lines();
            let mut send = async |m: Value| {
                let mut line = m.to_string().into_bytes();
                line.push(b'\n');
                stdin.write_all(&line).await.expect("write");
            };
            let mut answer = async |id: Value| loop {
                let line = out.next_line().await.expect("read").expect("a line");
                let m: Value = serde_json::from_str(&line).expect("json");
                if m.get("method").is_none() {
                    assert_eq!(m["id"], id, "{m}");
                    return m;
                }
            };
            send(
                json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "test", "version": "1"}}}),
            )
            .await;
            assert!(answer(json!(1)).await.get("result").is_some());
            send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
            // Two calls the server never answers, a third the host cancels;
            // a call answered: mcpd read everything before it.
            for id in [json!("hang-a"), json!(7), json!(8)] {
                send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                            "params": {"name": "demo__hang", "arguments": {}}}))
                .await;
            }
            send(
                json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": 8, "reason": "changed my mind"}}),
            )
            .await;
            send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                        "params": {"name": "demo__echo", "arguments": {"text": "x"}}}))
            .await;
            assert_eq!(answer(json!(2)).await["result"]["content"][0]["text"], "x");
            // Killed, mcpd answers nothing: the bridge fails both at once.
            assert!(!first.stop(rustix::process::Signal::KILL).success());
            let next = start();
            let mut failed = Vec::new();
            while failed.len() < 2 {
                let line = out.next_line().await.expect("read").expect("a line");
                let m: Value = serde_json::from_str(&line).expect("json");
                if m.get("method").is_some() {
                    continue;
                }
                let text = m["error"]["message"].as_str().unwrap_or_default();
                assert!(text.contains("mcpd went away"), "{m}");
                failed.push(m["id"].clone());
            }
            failed.sort_by_key(|id| id.to_string());
            assert_eq!(failed, [json!("hang-a"), json!(7)]);
            next
        })
        .await
        .expect("within 60 s")
    });
    drop(next);
}
