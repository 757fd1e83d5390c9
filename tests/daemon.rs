//! The real `mcpd` binary: it supervises the demo units, reports invalid
//! units with their location, and leaves no child behind.

use std::time::Duration;

use rustix::process::Signal;

use crate::helper::{Daemon, root};

/// The PID in a "running (pid N, …)" log line.
fn pid_in(line: &str) -> u32 {
    line.split("(pid ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {line:?}"))
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

fn wait_gone(pid: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while alive(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} outlived the daemon"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
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
    let status = d.stop(Signal::KILL);
    assert!(!status.success());
    wait_gone(first);
    wait_gone(second);
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
    d.wait_for("started 1 unit (1 invalid)");
    d.wait_for("running (pid");
    assert!(d.stop(Signal::INT).success());
}
