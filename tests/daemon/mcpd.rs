//! The real `mcpd` binary: it supervises the demo units, reports invalid
//! units with their location, and leaves no child behind.

use std::time::Duration;

use rustix::process::Signal;

use crate::helper::{
    BOUND, Daemon, alive, eventually, holds_within, mcpctl_user, root, running_pid, timed_out,
};

/// The PID in a "running (pid N, …)" log line.
fn pid_in(line: &str) -> u32 {
    line.split("(pid ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {line:?}"))
}

#[test]
fn runs_the_demo_units_and_stops_them_on_sigterm() {
    let units = root().join("units/demo");
    let mut d = Daemon::start(
        &["--user".as_ref(), "--units".as_ref(), units.as_os_str()],
        &[],
    );
    let demo = pid_in(&d.wait_for("running (pid").to_string());
    let other = pid_in(&d.wait_for("running (pid"));
    assert!(alive(demo) && alive(other));
    let seen = d.seen.join("\n");
    assert!(seen.contains("mcpd_server=demo "), "{seen}");
    assert!(seen.contains("mcpd_server=demo-paged"), "{seen}");
    assert!(
        seen.contains("running (pid") && seen.contains("11 tools"),
        "all pages read: {seen}"
    );
    let status = d.stop(Signal::TERM);
    assert!(status.success(), "{status:?}");
    assert!(
        !alive(demo) && !alive(other),
        "children stopped before exit"
    );
}

#[test]
fn sigkill_of_the_daemon_leaves_no_child_alive() {
    let units = root().join("units/demo");
    let mut d = Daemon::start(
        &["--user".as_ref(), "--units".as_ref(), units.as_os_str()],
        &[],
    );
    let first = pid_in(&d.wait_for("running (pid"));
    let second = pid_in(&d.wait_for("running (pid"));
    let subtree = crate::helper::cgroup_of(first)
        .parent()
        .expect("the daemon's subtree")
        .to_owned();
    let status = d.stop(Signal::KILL);
    assert!(!status.success());
    for pid in [first, second] {
        eventually(
            format_args!("server {pid} to die with the daemon"),
            BOUND,
            || !alive(pid),
        );
    }
    // (what a next daemon of this runtime directory would clean up:
    // tests/daemon/containment.rs)
    crate::helper::remove_cgroup_tree(&subtree);
}

#[test]
fn an_invalid_unit_is_reported_with_its_location_and_others_run() {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        root().join("units/demo/demo.kdl"),
        tmp.path().join("good.kdl"),
    )
    .expect("copy");
    std::fs::write(tmp.path().join("broken.kdl"), "stdio {\n    command 5\n}\n").expect("write");
    let mut d = Daemon::start(
        &[
            "--user".as_ref(),
            "--units".as_ref(),
            tmp.path().as_os_str(),
        ],
        &[],
    );
    d.wait_for("unit broken is invalid and was not started:");
    let located =
        d.wait_for("broken.kdl:2:13: `stdio.command`: expected a string, found integer 5");
    assert!(
        located.starts_with(&tmp.path().join("broken.kdl").display().to_string()),
        "{located}"
    );
    d.wait_until("good runs", |d| {
        d.count("started 1 unit (1 invalid)") == 1 && d.latest_pid("good").is_some()
    });
    assert!(d.stop(Signal::INT).success());
}

/// Datagrams sent to a fake `NOTIFY_SOCKET`, split into their lines.
struct NotifySocket {
    socket: std::os::unix::net::UnixDatagram,
    path: std::path::PathBuf,
}

impl NotifySocket {
    fn bind(dir: &std::path::Path) -> Self {
        let path = dir.join("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("bind notify socket");
        socket
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        Self { socket, path }
    }

    /// The next datagram's lines (bounded wait).
    fn next(&self) -> Vec<String> {
        let mut buf = vec![0u8; 4096];
        // A receive with a timeout is not restarted after a signal.
        let n = loop {
            match self.socket.recv(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                other => break other.expect("a notification within 30 s"),
            }
        };
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The next datagram that is not a STATUS update or a watchdog ping.
    fn next_state(&self, statuses: &mut Vec<String>) -> Vec<String> {
        loop {
            let msg = self.next();
            if msg.iter().all(|l| l.starts_with("STATUS=")) {
                statuses.extend(msg);
            } else if msg != ["WATCHDOG=1"] {
                return msg;
            }
        }
    }
}

#[test]
fn notifies_systemd_ready_reloading_ready_stopping_and_keeps_children_clean() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let notify = NotifySocket::bind(tmp.path());
    let units = root().join("units/demo");
    let mut d = Daemon::start(
        &["--user".as_ref(), "--units".as_ref(), units.as_os_str()],
        &[("NOTIFY_SOCKET", notify.path.as_os_str())],
    );
    let mut statuses = Vec::new();
    let ready = notify.next_state(&mut statuses);
    assert_eq!(ready[0], "READY=1");
    assert!(ready[1].starts_with("STATUS=2 servers"), "{ready:?}");
    // the summary follows the servers until both run
    while !statuses.iter().any(|s| s == "STATUS=2 servers: 2 running") {
        let msg = notify.next();
        statuses.extend(msg.into_iter().filter(|l| l.starts_with("STATUS=")));
    }
    // the children never see the daemon's NOTIFY_SOCKET
    let pid = running_pid(&d.wait_for("running (pid")).expect("pid");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
    let environ = String::from_utf8_lossy(&environ);
    assert!(!environ.contains("NOTIFY_SOCKET"), "{environ}");

    d.signal(Signal::HUP);
    let reloading = notify.next_state(&mut statuses);
    assert_eq!(reloading[0], "RELOADING=1");
    let usec: u64 = reloading[1]
        .strip_prefix("MONOTONIC_USEC=")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{reloading:?}"));
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let now_usec = u64::try_from(now.tv_sec).expect("secs") * 1_000_000
        + u64::try_from(now.tv_nsec).expect("ns") / 1000;
    assert!(
        usec <= now_usec && now_usec - usec < 30_000_000,
        "CLOCK_MONOTONIC: {usec} vs {now_usec}"
    );
    let ready = notify.next_state(&mut statuses);
    assert_eq!(ready[0], "READY=1");

    d.signal(Signal::TERM);
    assert_eq!(notify.next_state(&mut statuses), ["STOPPING=1"]);
    assert!(d.exit().success());
}

#[test]
fn pings_the_watchdog_at_half_its_timeout() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let notify = NotifySocket::bind(tmp.path());
    let units = root().join("units/demo");
    let d = Daemon::start(
        &["--user".as_ref(), "--units".as_ref(), units.as_os_str()],
        &[
            ("NOTIFY_SOCKET", notify.path.as_os_str()),
            ("WATCHDOG_USEC", "200000".as_ref()),
        ],
    );
    let mut pings = Vec::new();
    while pings.len() < 4 {
        let msg = notify.next();
        if msg == ["WATCHDOG=1"] {
            pings.push(std::time::Instant::now());
        }
    }
    let gaps: Vec<Duration> = pings.windows(2).map(|w| w[1] - w[0]).collect();
    // 100 ms apart: generous bounds for a loaded machine, but not 200 ms
    assert!(
        gaps.iter()
            .all(|g| *g >= Duration::from_millis(50) && *g < Duration::from_millis(190)),
        "{gaps:?}"
    );
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_second_daemon_of_the_same_instance_refuses_to_start() {
    let runtime = tempfile::tempdir().expect("tempdir");
    let units = root().join("units/demo");
    let args = ["--user".as_ref(), "--units".as_ref(), units.as_os_str()];
    let env = [("XDG_RUNTIME_DIR", runtime.path().as_os_str())];
    let mut first = Daemon::start(&args, &env);
    first.wait_for("started 2 units");
    let mut second = Daemon::start(&args, &env);
    let lock = runtime.path().join("mcpd/mcpd.lock");
    let message = format!(
        "mcpd: another mcpd is already running the user instance: {} is locked by pid {}",
        lock.display(),
        first.pid()
    );
    second.wait_for(&message);
    let status = second.exit();
    assert_eq!(status.code(), Some(1));
    assert!(first.stop(Signal::TERM).success());
}

#[test]
fn a_bad_call_log_delay_or_initialize_timeout_is_refused_naming_the_variable() {
    let units = root().join("units/demo");
    let args = ["--user".as_ref(), "--units".as_ref(), units.as_os_str()];
    for (variable, value, why) in [
        ("MCPD_CALL_LOG_DELAY", "soon", "expected number"),
        ("MCPD_CALL_LOG_DELAY", "2m", "at most 60s"),
        ("MCPD_INITIALIZE_TIMEOUT", "0", "between 1ms and 1h"),
        ("MCPD_INITIALIZE_TIMEOUT", "later", "expected number"),
    ] {
        let runtime = tempfile::tempdir().expect("tempdir");
        let env = [
            ("XDG_RUNTIME_DIR", runtime.path().as_os_str()),
            (variable, value.as_ref()),
        ];
        let mut d = Daemon::start(&args, &env);
        let line = d.wait_for(&format!("mcpd: invalid {variable} {value:?}: "));
        assert!(line.contains(why), "{line}");
        assert_eq!(d.exit().code(), Some(2));
    }
}

#[test]
fn sigterm_stops_stubborn_servers_in_parallel_within_their_stop_timeout() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for name in ["s1", "s2"] {
        std::fs::write(
            tmp.path().join(format!("{name}.kdl")),
            "stdio {\n    command \"mcp-fixture\" \"--ignore-sigterm\" \"--linger\"\n}\nstop-timeout \"1s\"\n",
        )
        .expect("write");
    }
    let mut d = Daemon::start(
        &[
            "--user".as_ref(),
            "--units".as_ref(),
            tmp.path().as_os_str(),
        ],
        &[],
    );
    d.wait_until("both running", |d| {
        d.latest_pid("s1").is_some() && d.latest_pid("s2").is_some()
    });
    let pids = [
        d.latest_pid("s1").expect("s1"),
        d.latest_pid("s2").expect("s2"),
    ];
    d.signal(Signal::TERM);
    d.wait_until("both stopped", |d| {
        d.count("mcpd::supervisor: stopped") == 2
    });
    // parallel: both were stopping before either had stopped
    let first_stopped = d
        .seen
        .iter()
        .position(|l| l.contains("mcpd::supervisor: stopped"))
        .expect("stopped");
    let stopping = d.seen[..first_stopped]
        .iter()
        .filter(|l| l.contains("mcpd::supervisor: stopping"))
        .count();
    assert_eq!(stopping, 2, "{}", d.seen.join("\n"));
    assert!(d.exit().success());
    for pid in pids {
        assert!(!alive(pid), "SIGKILLed after its stop-timeout");
    }
}

#[test]
fn the_units_roots_answer_the_servers_roots_list() {
    let dir = tempfile::tempdir().expect("tempdir");
    let unit = |roots: &str| {
        format!(
            // roots/list in the middle of a call: the 2025 era's.
            "stdio {{\n    command \"mcp-fixture\" \"--tools\" \"roots\" \"--chatter\" \"0\"\n}}\nprotocol \"legacy\"\n{roots}"
        )
    };
    std::fs::write(
        dir.path().join("rooted.kdl"),
        unit("roots \"file:///srv/repo\" \"file:///srv/docs/\"\n"),
    )
    .expect("write");
    std::fs::write(dir.path().join("plain.kdl"), unit("")).expect("write");
    let mut d = Daemon::user_no_bus(dir.path(), &[]);
    d.wait_until("both running", |d| {
        d.latest_pid("rooted").is_some() && d.latest_pid("plain").is_some()
    });
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let roots = |name: &str| {
        let out = mcpctl_user(&runtime, &["call", name, "roots"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(roots("rooted"), "file:///srv/repo file:///srv/docs/");
    // Without `roots` the question goes to a host session that declared
    // the capability: a D-Bus call has none.
    let plain = roots("plain");
    assert!(
        plain.starts_with("roots/list failed") && plain.contains("no host is attached"),
        "{plain}"
    );

    // Roots are declared at initialize: a new list restarts the server.
    let old = d.latest_pid("rooted").expect("pid");
    std::fs::write(
        dir.path().join("rooted.kdl"),
        unit("roots \"file:///srv/other\"\n"),
    )
    .expect("write");
    d.wait_until("rooted restarted", |d| {
        d.latest_pid("rooted").is_some_and(|p| p != old)
    });
    assert_eq!(roots("rooted"), "file:///srv/other");
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_daemon_whose_log_pipe_closed_keeps_serving_and_stops_on_sigterm() {
    use std::io::BufRead;
    let units = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("demo.kdl"),
        format!(
            "stdio {{\n    command \"{}\" \"--chatter\" \"0\"\n}}\n",
            crate::helper::fixture_path().display()
        ),
    )
    .expect("write");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mcpd"))
        .args(["--user", "--no-bus", "--units"])
        .arg(units.path())
        .env("XDG_RUNTIME_DIR", runtime.path())
        .env("MCPD_STATE_DIR", runtime.path().join("state"))
        .env_remove("JOURNAL_STREAM")
        .env_remove("NOTIFY_SOCKET")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("mcpd");
    let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    while !line.contains("running (pid") {
        line.clear();
        assert!(
            stderr.read_line(&mut line).expect("read") > 0,
            "mcpd exited"
        );
    }
    // Whoever read the log went away (a closed terminal, a dead pipe
    // reader): logging fails from now on, and nothing else may.
    drop(stderr);
    let mut call = crate::helper::mcpctl_user_command(
        runtime.path(),
        &["call", "demo", "echo", "{\"text\":\"still here\"}"],
    )
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::piped())
    .spawn()
    .expect("mcpctl");
    let within = Duration::from_secs(10);
    if !holds_within(within, || call.try_wait().expect("wait").is_some()) {
        let _ = call.kill();
        let _ = child.kill();
        let _ = call.wait();
        let _ = child.wait();
        panic!(
            "{}",
            timed_out("an answer to a call once the log pipe closed", within)
        );
    }
    let out = call.wait_with_output().expect("mcpctl");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("still here"),
        "{out:?}"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).expect("pid"),
        Signal::TERM,
    )
    .expect("SIGTERM");
    let mut status = None;
    if !holds_within(within, || {
        status = child.try_wait().expect("wait");
        status.is_some()
    }) {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{}", timed_out("mcpd to stop on SIGTERM", within));
    }
    let status = status.expect("exited");
    assert!(status.success(), "{status:?}");
}
