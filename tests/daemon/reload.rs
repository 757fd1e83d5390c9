//! Hot reload of the real `mcpd`: files added, changed, broken, renamed
//! into place, removed, edited in bursts; PIDs prove what was restarted.

use std::path::Path;

use rustix::process::Signal;

use crate::helper::{Daemon, alive, cmdline};

/// A fixture unit whose server is named `tag` (visible in its command line).
fn unit(description: &str, tag: &str) -> String {
    format!(
        "description \"{description}\"\nstdio {{\n    command \"mcp-fixture\" \"--name\" \"{tag}\" \"--chatter\" \"0\"\n}}\nreconnect {{\n    initial-delay \"20ms\"\n    max-delay \"1s\"\n}}\nstop-timeout \"2s\"\n"
    )
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// Writes via a temporary file renamed into place, as editors do.
fn rename_save(path: &Path, text: &str) {
    let tmp = path.with_extension("kdl.tmp~");
    write(&tmp, text);
    std::fs::rename(&tmp, path).expect("rename into place");
}

fn start(dir: &Path, units: &[&str]) -> Daemon {
    let mut d = Daemon::start(
        &["--user".as_ref(), "--units".as_ref(), dir.as_os_str()],
        &[],
    );
    for name in units {
        d.wait_until(&format!("{name} running"), |d| d.latest_pid(name).is_some());
    }
    d
}

/// Waits until unit `name` runs a live process whose command line has `tag`.
fn wait_runs(d: &mut Daemon, name: &str, tag: &str) -> u32 {
    d.wait_until(&format!("{name} running with {tag}"), |d| {
        d.latest_pid(name)
            .is_some_and(|pid| alive(pid) && cmdline(pid).iter().any(|a| a == tag))
    });
    d.latest_pid(name).expect("pid")
}

#[test]
fn added_changed_removed_and_invalid_new_units() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    write(&dir.join("a.kdl"), &unit("A", "a1"));
    write(&dir.join("b.kdl"), &unit("B", "b1"));
    let mut d = start(dir, &["a", "b"]);
    let (a1, b1) = (d.latest_pid("a").expect("a"), d.latest_pid("b").expect("b"));

    // added
    write(&dir.join("c.kdl"), &unit("C", "c1"));
    let c1 = wait_runs(&mut d, "c", "c1");

    // changed command: a new generation, a new PID, only for a
    write(&dir.join("a.kdl"), &unit("A", "a2"));
    let a2 = wait_runs(&mut d, "a", "a2");
    assert_ne!(a1, a2);
    assert!(!alive(a1), "the old process is gone");
    assert_eq!(d.latest_pid("b"), Some(b1));
    assert!(alive(b1));

    // removed: stopped and gone
    std::fs::remove_file(dir.join("c.kdl")).expect("rm");
    d.wait_until("c stopped", |d| {
        d.about("c").any(|l| l.contains("unit c removed")) && !alive(c1)
    });

    // a new invalid unit is reported with its location and never started
    write(
        &dir.join("d.kdl"),
        "stdio {\n    command \"mcp-fixture\"\n    bogus 1\n}\n",
    );
    d.wait_until("d invalid", |d| {
        d.count("unit d is invalid and was not started") == 1
    });
    d.wait_for("d.kdl:3:5: unknown key `bogus` in `stdio`");
    assert_eq!(d.starts("d"), 0);
    assert_eq!(d.starts("b"), 1, "b was never restarted");
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn in_place_changes_and_invalid_edits_keep_the_process() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    write(&dir.join("a.kdl"), &unit("A", "a1"));
    let mut d = start(dir, &["a"]);
    let a1 = d.latest_pid("a").expect("a");

    // description only: applied in place, same process
    write(&dir.join("a.kdl"), &unit("A, described anew", "a1"));
    d.wait_for("unit a changed, applied in place");

    // an invalid edit keeps the last good spec running and says where it is wrong
    write(
        &dir.join("a.kdl"),
        "description \"A\"\nstdio {\n    command 5\n}\n",
    );
    d.wait_for("unit a is invalid (keeps running its last valid configuration):");
    d.wait_for("a.kdl:3:13: `stdio.command`: expected a string, found integer 5");
    assert!(alive(a1));

    // fixed by a rename-save back to the running content: nothing restarts
    rename_save(&dir.join("a.kdl"), &unit("A, described anew", "a1"));
    d.wait_for("reloaded: 0 added, 0 changed, 0 removed, 1 unchanged, 0 invalid");
    assert_eq!(d.latest_pid("a"), Some(a1));
    assert_eq!(d.starts("a"), 1);
    assert!(alive(a1));

    // cp over it and mv into place both apply
    let elsewhere = tmp.path().join("staging.txt");
    write(&elsewhere, &unit("A", "a2"));
    std::fs::copy(&elsewhere, dir.join("a.kdl")).expect("cp");
    let a2 = wait_runs(&mut d, "a", "a2");
    write(&elsewhere, &unit("A", "a3"));
    std::fs::rename(&elsewhere, dir.join("a.kdl")).expect("mv");
    let a3 = wait_runs(&mut d, "a", "a3");
    assert!(!alive(a1) && !alive(a2) && alive(a3));
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_burst_of_edits_and_a_drop_in_converge_to_the_final_content() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    write(&dir.join("a.kdl"), &unit("A", "a1"));
    write(&dir.join("b.kdl"), &unit("B", "b1"));
    let mut d = start(dir, &["a", "b"]);
    let b1 = d.latest_pid("b").expect("b");

    for i in 0..100 {
        write(&dir.join("a.kdl"), &unit("A", &format!("burst{i}")));
    }
    let last = wait_runs(&mut d, "a", "burst99");
    d.wait_until("the burst settled", |d| d.count("reloaded:") >= 1);
    let reloads = d.count("reloaded:");
    assert!(
        reloads < 20,
        "100 edits were debounced into {reloads} reloads"
    );

    // delete and re-create: converges to the re-created content
    std::fs::remove_file(dir.join("a.kdl")).expect("rm");
    write(&dir.join("a.kdl"), &unit("A", "recreated"));
    let recreated = wait_runs(&mut d, "a", "recreated");
    assert!(!alive(last));

    // a drop-in restarts its own unit only
    std::fs::create_dir(dir.join("b.kdl.d")).expect("mkdir");
    write(
        &dir.join("b.kdl.d/10-name.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--name\" \"b-dropin\"\n}\n",
    );
    let b2 = wait_runs(&mut d, "b", "b-dropin");
    assert_ne!(b1, b2);
    assert_eq!(d.latest_pid("a"), Some(recreated));
    assert!(alive(recreated));
    // and a change inside the (now watched) drop-in directory applies too
    write(
        &dir.join("b.kdl.d/10-name.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--name\" \"b-dropin2\"\n}\n",
    );
    wait_runs(&mut d, "b", "b-dropin2");
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn sighup_reloads_leave_unchanged_units_alone() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    write(&dir.join("a.kdl"), &unit("A", "a1"));
    write(&dir.join("b.kdl"), &unit("B", "b1"));
    let mut d = start(dir, &["a", "b"]);
    let pids = (d.latest_pid("a"), d.latest_pid("b"));
    for i in 1..=20 {
        d.signal(Signal::HUP);
        d.wait_until(&format!("reload {i}"), |d| {
            d.count("reloaded: 0 added, 0 changed, 0 removed, 2 unchanged, 0 invalid") == i
        });
    }
    assert_eq!((d.latest_pid("a"), d.latest_pid("b")), pids);
    assert_eq!((d.starts("a"), d.starts("b")), (1, 1));
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_changed_limit_restarts_the_server_with_it_and_health_applies_in_place() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    write(&dir.join("a.kdl"), &unit("A", "a1"));
    let mut d = start(dir, &["a"]);
    let a1 = d.latest_pid("a").expect("a");
    // liveness settings are the supervisor's: no new process
    write(
        &dir.join("a.kdl"),
        &(unit("A", "a1") + "health { interval \"1m\"; }\n"),
    );
    d.wait_for("unit a changed, applied in place");
    assert!(alive(a1));
    // a limit is set on a new process
    write(
        &dir.join("a.kdl"),
        &(unit("A", "a1") + "health { interval \"1m\"; }\nlimits { nofile 100; }\n"),
    );
    d.wait_for("unit a changed, restarting it");
    d.wait_until("a new a", |d| d.latest_pid("a").is_some_and(|p| p != a1));
    let a2 = d.latest_pid("a").expect("a");
    let limits = std::fs::read_to_string(format!("/proc/{a2}/limits")).expect("limits");
    assert!(
        limits
            .lines()
            .any(|l| l.starts_with("Max open files") && l.split_whitespace().nth(3) == Some("100")),
        "{limits}"
    );
    assert!(d.stop(Signal::TERM).success());
}
