//! `mcpctl` against the real daemon over its private socket: output,
//! exit codes (0/1/3/4), `--json` values.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use rustix::process::Signal;

use crate::helper::{
    BOUND, Daemon, Snapshot, holds_within, mcpctl, mcpctl_user, snapshot_mode, timed_out,
};

/// Units in every state: running, retrying, invalid.
fn units(dir: &Path) {
    std::fs::write(
        dir.join("demo.kdl"),
        "description \"Demo\"\nstdio {\n    command \"mcp-fixture\" \"--chatter\" \"2\"\n}\nreconnect {\n    initial-delay \"50ms\"\n    max-delay \"1s\"\n}\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("doomed.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--die-on-start\" \"1\"\n}\nreconnect {\n    initial-delay \"1h\"\n    max-delay \"2h\"\n}\n",
    )
    .expect("write");
    std::fs::write(dir.join("broken.kdl"), "stdio {\n    command 5\n}\n").expect("write");
    std::fs::write(
        dir.join("failing.kdl"),
        "description \"Gives up\"\nstdio {\n    command \"mcp-fixture\" \"--die-on-start\" \"2\" \"--chatter\" \"0\"\n}\nreconnect {\n    initial-delay \"10ms\"\n    max-delay \"20ms\"\n    max-attempts 1\n}\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("remote.kdl"),
        "http \"http://127.0.0.1:9/mcp\" {\n    header \"Authorization\" \"Bearer s3cret\"\n}\nreconnect {\n    initial-delay \"1h\"\n    max-delay \"2h\"\n}\n",
    )
    .expect("write");
}

struct Ctl {
    runtime: std::path::PathBuf,
}

impl Ctl {
    fn run(&self, args: &[&str]) -> Output {
        self.run_with_stdin(args, "")
    }

    fn run_with_stdin(&self, args: &[&str], stdin: &str) -> Output {
        use std::io::Write;
        let mut child: std::process::Child = mcpctl()
            .arg("--user")
            .args(args)
            .env("XDG_RUNTIME_DIR", &self.runtime)
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .env_remove("NO_COLOR")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mcpctl");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write stdin");
        child.wait_with_output().expect("mcpctl")
    }
}

/// Output with what changes from run to run masked: PIDs, times,
/// durations, the temporary directory.
fn masked(out: &Output, dir: &Path) -> String {
    let text = String::from_utf8_lossy(&out.stdout).replace(&dir.display().to_string(), "<units>");
    let mut lines = Vec::new();
    for line in text.lines() {
        let mut line = line.to_owned();
        if let Some(at) = line.find("Main PID: ") {
            line.truncate(at + "Main PID: ".len());
            line.push_str("<pid>");
        }
        if let Some(at) = line.find(" since ") {
            line.truncate(at);
            line.push_str(" since <time>; <ago> ago");
        }
        if let Some(at) = line.find("next retry in ") {
            line.truncate(at + "next retry in ".len());
            line.push_str("<duration>");
        }
        for key in ["Tasks: ", "Memory: ", "CPU: "] {
            if let Some(at) = line.find(key) {
                line.truncate(at + key.len());
                line.push_str("<usage>");
            }
        }
        if let (Some(start), Some(end)) =
            (line.find("Containment: cgroup /"), line.find("/mcpd-user-"))
        {
            // the v2 hierarchy's mount point differs between systems
            line.replace_range(start + "Containment: cgroup ".len()..end, "<v2>");
        }
        if let Some(at) = line.find("mcpd-user-") {
            line.replace_range(at..at + "mcpd-user-".len() + 16, "mcpd-user-<hash>");
        }
        if let (Some(open), Some(close)) = (line.find("mcp-fixture["), line.find("]:")) {
            line.replace_range(open + "mcp-fixture[".len()..close, "<pid>");
        }
        lines.push(line);
    }
    lines.join("\n") + "\n"
}

fn snapshot(mode: Snapshot, name: &str, actual: &str) {
    let path = crate::helper::root()
        .join("tests/data/ctl")
        .join(format!("{name}.txt"));
    if let Some(diff) = crate::helper::check_snapshot(mode, &path, actual) {
        panic!("{diff}");
    }
}

/// A user daemon (no bus) running the fixture as `demo`, quiet on stderr,
/// with units in `units`; and its runtime directory.
fn quiet_demo(units: &Path, env: &[(&str, &std::ffi::OsStr)]) -> (Daemon, std::path::PathBuf) {
    std::fs::write(
        units.join("demo.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\n",
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(units, env);
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    (d, runtime)
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn err(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn every_command_against_a_live_daemon() {
    every_command(snapshot_mode());
}

fn every_command(mode: Snapshot) {
    let tmp = tempfile::tempdir().expect("tempdir");
    units(tmp.path());
    let mut d = Daemon::user_no_bus(tmp.path(), &[]);
    d.wait_until("ready", |d| {
        d.latest_pid("demo").is_some()
            && d.count("retry 1/10 in 1h") == 2
            && d.count("gave up after 1 retry,") == 1
    });
    let pid = d.latest_pid("demo").expect("pid");
    let ctl = Ctl {
        runtime: d.runtime_dir().expect("runtime").to_owned(),
    };

    // snapshots of every state (timestamps, PIDs and paths masked)
    snapshot(mode, "status", &masked(&ctl.run(&["status"]), tmp.path()));
    snapshot(mode, "list", &masked(&ctl.run(&["list"]), tmp.path()));
    for name in ["demo", "doomed", "failing", "broken"] {
        let out = ctl.run(&["status", name]);
        assert_eq!(
            out.status.code(),
            Some(if name == "demo" { 0 } else { 3 }),
            "{name}"
        );
        snapshot(mode, &format!("status-{name}"), &masked(&out, tmp.path()));
    }

    // status overview
    let out = ctl.run(&["status"]);
    assert_eq!(out.status.code(), Some(0), "{}", err(&out));
    let overview = text(&out);
    assert!(
        overview.contains("● demo     running         9 tools  Demo"),
        "{overview}"
    );
    assert!(
        overview.contains(
            "● doomed   retrying        0 tools  connection failed: process exited with status 1"
        ),
        "{overview}"
    );
    assert!(
        overview.contains("● broken   stopped         0 tools  invalid unit file: "),
        "{overview}"
    );
    assert!(
        overview.ends_with("5 servers: 1 running, 2 retrying, 1 failed, 1 stopped\n"),
        "{overview}"
    );
    assert!(
        !overview.contains("\x1b["),
        "no colour when stdout is not a terminal"
    );

    // status of one: running (0), retrying (3), invalid (3), unknown (4)
    let out = ctl.run(&["status", "demo"]);
    assert_eq!(out.status.code(), Some(0));
    let block = text(&out);
    assert!(block.starts_with("● demo - Demo\n     Loaded: "), "{block}");
    assert!(block.contains("     Active: running since "), "{block}");
    assert!(block.contains(&format!("   Main PID: {pid}\n")), "{block}");
    assert!(
        block.contains("      Tools: 9 (echo, add, crash, hang, fail, …)"),
        "{block}"
    );
    assert!(
        block.contains("chatter line 1"),
        "recent stderr lines: {block}"
    );
    let out = ctl.run(&["status", "doomed"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out).contains("    Attempt: 1/10, next retry in 59m"),
        "{}",
        text(&out)
    );
    let out = ctl.run(&["status", "broken"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out).contains("broken.kdl (invalid: "),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains("broken.kdl:2:13: `stdio.command`: expected a string, found integer 5")
    );
    let out = ctl.run(&["status", "demo", "nope"]);
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(err(&out), "mcpctl: no server named nope\n");

    // --json matches the D-Bus values
    let out = ctl.run(&["--json", "status", "demo"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json[0]["main_pid"], pid);
    assert_eq!(json[0]["state"], "running");
    assert_eq!(json[0]["tools"].as_array().map(Vec::len), Some(9));
    let out = ctl.run(&["--json", "list"]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: Vec<&str> = rows
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(names, ["broken", "demo", "doomed", "failing", "remote"]);
    assert_eq!(rows[1]["path"], "/org/mcpd1/server/demo");
    let out = ctl.run(&["list"]);
    assert!(
        text(&out).starts_with("NAME     STATE         TOOLS  DESCRIPTION\n"),
        "{}",
        text(&out)
    );

    // tools and call
    let out = ctl.run(&["tools", "demo"]);
    assert!(
        text(&out).starts_with("echo       Return the given text\n"),
        "{}",
        text(&out)
    );
    let out = ctl.run(&["--json", "tools", "demo"]);
    let tools: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(tools[0]["inputSchema"]["required"][0], "text");
    let out = ctl.run(&["call", "demo", "echo", "{\"text\":\"hello\"}"]);
    assert_eq!(
        (out.status.code(), text(&out).as_str()),
        (Some(0), "hello\n")
    );
    let out = ctl.run_with_stdin(&["call", "demo", "echo", "-"], "{\"text\":\"from stdin\"}");
    assert_eq!(text(&out), "from stdin\n");
    let out = ctl.run(&["call", "demo", "fail", "{\"message\":\"it broke\"}"]);
    assert_eq!(
        (out.status.code(), text(&out).as_str()),
        (Some(1), "it broke\n")
    );
    let out = ctl.run(&["call", "doomed", "echo", "{}"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err(&out).starts_with("mcpctl: server doomed is retrying (retry 1/10, next in "),
        "{}",
        err(&out)
    );
    let out = ctl.run(&["call", "nope", "echo"]);
    assert_eq!(out.status.code(), Some(4));

    // logs and cat (header values never shown)
    let out = ctl.run(&["logs", "demo", "-n", "1"]);
    assert!(text(&out).ends_with("call fail\n"), "{}", text(&out));
    let out = ctl.run(&["--json", "logs", "demo", "-n", "2"]);
    let lines: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(lines.as_array().map(Vec::len), Some(2));
    let out = ctl.run(&["--json", "cat", "remote"]);
    let files: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        files[0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("<redacted>") && !t.contains("s3cret"))
    );
    let out = ctl.run(&["cat", "remote"]);
    let shown = text(&out);
    assert!(
        shown.starts_with(&format!("# {}\n", tmp.path().join("remote.kdl").display())),
        "{shown}"
    );
    assert!(
        shown.contains("header \"Authorization\" \"<redacted>\""),
        "{shown}"
    );
    assert!(!shown.contains("s3cret"), "{shown}");

    // stop, start, restart, reload
    assert_eq!(ctl.run(&["stop", "demo"]).status.code(), Some(0));
    d.wait_until("demo stopped", |d| {
        d.about("demo")
            .any(|l| l.contains("mcpd::supervisor: stopped"))
    });
    assert_eq!(ctl.run(&["status", "demo"]).status.code(), Some(3));
    assert_eq!(ctl.run(&["start", "demo"]).status.code(), Some(0));
    d.wait_until("demo running again", |d| d.starts("demo") == 2);
    let out = ctl.run(&["restart", "demo", "nope"]);
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(err(&out), "mcpctl: no server named nope\n");
    d.wait_until("demo restarted", |d| d.starts("demo") == 3);
    let out = ctl.run(&["reload"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "an invalid unit makes reload fail"
    );
    assert!(
        text(&out).starts_with("broken: invalid\n  "),
        "{}",
        text(&out)
    );
    assert!(text(&out).contains("demo: unchanged\n"), "{}", text(&out));
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn without_a_daemon_mcpctl_says_so() {
    let runtime = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_mcpctl"))
        .args(["--user", "status"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .output()
        .expect("mcpctl");
    assert_eq!(out.status.code(), Some(1));
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(
        message.starts_with("mcpctl: cannot reach mcpd (user instance): no daemon at "),
        "{message}"
    );
}

#[test]
fn status_shows_local_time_and_how_the_last_process_ended() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (mut d, runtime) = quiet_demo(tmp.path(), &[]);
    let status = |tz: &str| {
        let out = mcpctl()
            .args(["--user", "status", "demo"])
            .env("XDG_RUNTIME_DIR", &runtime)
            .env("TZ", tz)
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .output()
            .expect("mcpctl");
        assert!(out.status.success(), "{}", err(&out));
        let active = text(&out)
            .lines()
            .find(|l| l.trim_start().starts_with("Active:"))
            .expect("an Active line")
            .to_owned();
        active
            .split(" since ")
            .nth(1)
            .and_then(|s| s.split(';').next())
            .unwrap_or_else(|| panic!("{active}"))
            .to_owned()
    };
    // POSIX TZ strings need no time zone database.
    let cet = status("CET-1");
    let words: Vec<&str> = cet.split(' ').collect();
    assert_eq!(words.len(), 4, "weekday date time zone: {cet}");
    assert!(
        ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"].contains(&words[0]),
        "{cet}"
    );
    assert_eq!(words[1].len(), "2026-12-01".len(), "{cet}");
    assert_eq!(words[2].len(), "09:36:32".len(), "{cet}");
    assert_eq!(words[3], "CET", "{cet}");
    // the same instant, one hour later on the wall clock than UTC
    let utc = status("UTC0");
    let hour = |s: &str| -> u32 {
        s.split(' ').nth(2).expect("time")[..2]
            .parse()
            .expect("hour")
    };
    assert!(utc.ends_with(" UTC"), "{utc}");
    assert_eq!((hour(&utc) + 1) % 24, hour(&cet), "{utc} vs {cet}");

    // After a crash and recovery, how it ended stays visible.
    let old = d.latest_pid("demo").expect("pid");
    let crash = mcpctl_user(&runtime, &["call", "demo", "crash", "{\"code\":3}"]);
    assert!(crash.status.success(), "{}", err(&crash));
    d.wait_until("demo running again", |d| {
        d.latest_pid("demo").is_some_and(|p| p != old)
    });
    let shown = text(&mcpctl_user(&runtime, &["status", "demo"]));
    assert!(
        shown.contains("\n   Restarts: 1\n")
            && shown.contains("\n  Last exit: exited with status 3\n")
            && shown.contains("\n Last error: process exited with status 3\n"),
        "{shown}"
    );
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn as_root_a_missing_system_instance_points_at_the_user_one() {
    assert!(
        rustix::process::geteuid().is_root(),
        "mcpctl picks the system instance only for root (CI runs as root)"
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut d = Daemon::user_no_bus(tmp.path(), &[]);
    d.wait_for("started 0 units");
    // The system instance's directory, /run/mcpd, has no daemon in the
    // tests (they give every system daemon its own MCPD_RUNTIME_DIR).
    let out = mcpctl()
        .arg("status")
        .env("XDG_RUNTIME_DIR", d.runtime_dir().expect("runtime"))
        // no system bus here, whatever the machine has
        .env("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/bus")
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .env_remove("MCPD_RUNTIME_DIR")
        .output()
        .expect("mcpctl");
    assert_eq!(out.status.code(), Some(1));
    let message = err(&out);
    assert!(
        message.starts_with(
            "mcpctl: cannot reach mcpd (system instance): no daemon at /run/mcpd/private"
        ) && message
            .trim_end()
            .ends_with("; no system instance is running, but a user instance is: use --user"),
        "{message}"
    );
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn tool_calls_are_counted_and_logged_with_their_caller_never_their_arguments() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (mut d, runtime) = quiet_demo(tmp.path(), &[]);
    let call = |args: &[&str]| {
        let child = mcpctl()
            .arg("--user")
            .args(args)
            .env("XDG_RUNTIME_DIR", &runtime)
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("mcpctl");
        let pid = child.id();
        (pid, child.wait_with_output().expect("mcpctl"))
    };
    let (ok_pid, ok) = call(&["call", "demo", "echo", "{\"text\":\"secret-argument\"}"]);
    assert!(ok.status.success(), "{}", err(&ok));
    let (fail_pid, _) = call(&["call", "demo", "fail", "{\"message\":\"nope\"}"]);
    let uid = rustix::process::getuid().as_raw();
    d.wait_for(&format!(
        "tools/call echo by uid {uid} pid {ok_pid}: ok in "
    ));
    d.wait_for(&format!(
        "tools/call fail by uid {uid} pid {fail_pid}: error result in "
    ));
    let line = d
        .seen
        .iter()
        .find(|l| l.contains("tools/call echo"))
        .expect("the echo line")
        .clone();
    for field in [
        "mcpd_server=demo",
        "mcpd_tool=echo",
        &format!("mcpd_caller_uid={uid}"),
        &format!("mcpd_caller_pid={ok_pid}"),
        "mcpd_duration_usec=",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    assert_eq!(d.count("secret-argument"), 0, "arguments are never logged");
    let shown = text(&mcpctl_user(&runtime, &["status", "demo"]));
    assert!(shown.contains("\n      Calls: 2 (1 failed)\n"), "{shown}");
    let json: serde_json::Value =
        serde_json::from_str(&text(&mcpctl_user(&runtime, &["status", "--json", "demo"])))
            .expect("json");
    assert_eq!(
        (json[0]["calls"].as_u64(), json[0]["failed_calls"].as_u64()),
        (Some(2), Some(1))
    );
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_call_logged_in_a_batch_is_written_before_the_daemon_stops() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // A minute's wait: only the daemon's flush at its end writes the line
    // before its last one.
    let (d, runtime) = quiet_demo(tmp.path(), &[("MCPD_CALL_LOG_DELAY", "60s".as_ref())]);
    let ok = mcpctl_user(&runtime, &["call", "demo", "echo", "{\"text\":\"x\"}"]);
    assert!(ok.status.success(), "{}", err(&ok));
    let (status, lines) = d.stop_logged(Signal::TERM);
    assert!(status.success());
    let at = |needle: &str| {
        lines
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle:?} in {lines:#?}"))
    };
    assert!(
        at("tools/call echo by uid ") < at(" INFO mcpd::daemon: stopped"),
        "{lines:#?}"
    );
}

#[test]
fn status_shows_health_and_a_flooding_server_is_rate_limited() {
    let units = tempfile::tempdir().expect("tempdir");
    let dir = units.path();
    std::fs::write(
        dir.join("probed.kdl"),
        "stdio { command \"mcp-fixture\"; }\nhealth {\n    interval \"100ms\"\n    timeout \"100ms\"\n}\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("unprobed.kdl"),
        "stdio { command \"mcp-fixture\"; }\nhealth { enabled #false; }\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("flood.kdl"),
        "stdio { command \"mcp-fixture\" \"--stderr-flood\"; }\nlog-rate-limit 20 \"1s\"\n",
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(dir, &[]);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    // the limit lets 20 lines a second through, then says what it dropped
    let report = d.wait_for("suppressed ");
    assert!(
        report.contains("flood") && report.contains("lines (log-rate-limit 20 per 1s)"),
        "{report}"
    );
    // … and said so when it began to drop, not only at the window's end.
    let reached = d
        .seen
        .iter()
        .position(|l| l.contains("log-rate-limit reached: dropping stderr until "))
        .expect("the limit says when it begins to drop");
    let reported = d
        .seen
        .iter()
        .position(|l| l.contains("suppressed "))
        .expect("report");
    assert!(reached < reported, "{:?}", &d.seen[reached..=reported]);
    // the daemon answers while the server floods; the ring has its newest lines
    let logs = text(&mcpctl_user(&runtime, &["logs", "flood"]));
    let newest: u64 = logs
        .lines()
        .filter_map(|l| {
            l.rsplit_once("flood line ")
                .and_then(|(_, n)| n.parse().ok())
        })
        .max()
        .unwrap_or_else(|| panic!("no flood lines kept:\n{logs}"));
    assert!(newest > 1000, "the ring keeps the newest lines: {newest}");
    let flood_lines = d.seen.iter().filter(|l| l.contains("flood line ")).count();
    assert!(
        flood_lines <= 40,
        "{flood_lines} flood lines reached the log"
    );

    let mut shown = String::new();
    let probed = holds_within(BOUND, || {
        shown = text(&mcpctl_user(&runtime, &["status", "probed"]));
        shown.contains("\n     Health: ok, ping ")
    });
    assert!(probed, "{}:\n{shown}", timed_out("a health probe", BOUND));
    let line = shown
        .lines()
        .find(|l| l.contains("Health:"))
        .expect("health line");
    assert!(line.ends_with(" ago") && line.contains(" ms "), "{line}");
    let json = mcpctl_user(&runtime, &["--json", "status", "probed"]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    let probed = &json[0];
    assert_eq!(probed["health_enabled"], true, "{json}");
    assert!(probed["last_ping_usec"].as_u64() > Some(0), "{json}");
    assert_eq!(probed["probes_missed"], 0, "{json}");
    let off = text(&mcpctl_user(&runtime, &["status", "unprobed"]));
    assert!(off.contains("\n     Health: off\n"), "{off}");
    assert!(d.stop(Signal::TERM).success());
}

/// One tool is "1 tool": in the daemon's log (which `status NAME` shows)
/// and in the overview.
#[test]
fn one_tool_is_one_tool() {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        tmp.path().join("one.kdl"),
        "description \"One\"\nstdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\ntools {\n    allow \"echo\"\n}\n",
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(tmp.path(), &[]);
    let line = d.wait_for("running (pid");
    assert!(line.contains(", 1 tool)"), "{line}");
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let out = mcpctl_user(&runtime, &["status"]);
    let overview = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        overview.contains("● one  running         1 tool   One"),
        "{overview}"
    );
    assert!(d.stop(Signal::TERM).success());
}
