//! Containment (DESIGN §10, invariant 11) with the real daemon, real
//! cgroups and processes that escape their process group: each stdio
//! server has a cgroup v2 of its own, and everything in it dies with it.
//! CI runs as root on a machine with a writable cgroup v2 hierarchy.

use std::path::Path;

use rustix::process::Signal;

use crate::helper::{
    BOUND, Daemon, alive, cgroup_of, eventually, holds_within, mcpctl_user, session_of, timed_out,
};

/// A unit running the fixture with `args`.
fn unit(dir: &Path, name: &str, args: &[&str]) {
    let args: String = args.iter().map(|a| format!(" \"{a}\"")).collect();
    std::fs::write(
        dir.join(format!("{name}.kdl")),
        format!(
            "stdio {{\n    command \"mcp-fixture\" \"--chatter\" \"0\"{args}\n}}\nreconnect {{\n    initial-delay \"50ms\"\n    max-delay \"1s\"\n}}\nstop-timeout \"1s\"\n"
        ),
    )
    .expect("write unit");
}

/// A daemon on `units` with its runtime directory in `runtime`.
fn daemon(units: &Path, runtime: &Path) -> Daemon {
    Daemon::user_no_bus(units, &[("XDG_RUNTIME_DIR", runtime.as_os_str())])
}

/// Waits (bounded) for `path` to hold a PID.
fn pid_in(path: &Path) -> u32 {
    let mut pid = None;
    eventually(format_args!("a PID in {}", path.display()), BOUND, || {
        pid = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        pid.is_some()
    });
    pid.expect("a PID")
}

/// A daemon's directories, kept for the test's length.
struct Dirs {
    _units: tempfile::TempDir,
    runtime: tempfile::TempDir,
    _files: tempfile::TempDir,
}

/// A daemon on one unit `name` whose fixture is given `flag` FILE: it
/// writes the PID of the helper it starts to FILE, returned.
fn with_helper(name: &str, flag: &str) -> (Dirs, std::path::PathBuf, Daemon) {
    let units = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    let files = tempfile::tempdir().expect("tempdir");
    let helper = files.path().join("helper");
    unit(units.path(), name, &[flag, &helper.display().to_string()]);
    let d = daemon(units.path(), runtime.path());
    let dirs = Dirs {
        _units: units,
        runtime,
        _files: files,
    };
    (dirs, helper, d)
}

#[test]
fn a_detached_helper_dies_with_stop_and_with_a_crash_of_its_server() {
    let (dirs, helper, mut d) = with_helper("spawner", "--detached-helper");
    let runtime = &dirs.runtime;
    d.wait_until("spawner running", |d| d.latest_pid("spawner").is_some());
    let main = d.latest_pid("spawner").expect("pid");
    let first = pid_in(&helper);
    let cgroup = cgroup_of(main);
    assert!(cgroup.ends_with("spawner"), "{}", cgroup.display());
    assert_eq!(
        cgroup_of(first),
        cgroup,
        "the helper is in its server's cgroup"
    );
    // its own session: a process-group kill would miss it
    assert_eq!(session_of(first), first, "the helper leads its own session");
    assert_ne!(session_of(main), first);
    let shown =
        String::from_utf8_lossy(&mcpctl_user(runtime.path(), &["status", "spawner"]).stdout)
            .into_owned();
    assert!(
        shown.contains(&format!("Containment: cgroup {}", cgroup.display())),
        "{shown}"
    );
    for line in ["      Tasks: ", "     Memory: ", "        CPU: "] {
        assert!(shown.contains(line), "{line:?} in {shown}");
    }

    // A crash: the helper is gone before the next generation runs.
    std::fs::remove_file(&helper).expect("rm");
    let crash = mcpctl_user(
        runtime.path(),
        &["call", "spawner", "crash", "{\"code\":3}"],
    );
    assert!(crash.status.success());
    d.wait_until("spawner running again", |d| {
        d.latest_pid("spawner").is_some_and(|p| p != main)
    });
    assert!(
        !alive(first),
        "the first helper outlived its server's crash"
    );
    let second = pid_in(&helper);
    // Both generations were forked straight into the cgroup (the kernels
    // CI runs have clone3's CLONE_INTO_CGROUP), said once.
    assert_eq!(
        d.count("servers are forked straight into their cgroups (clone3 CLONE_INTO_CGROUP)"),
        1
    );

    // A stop: the helper goes with it.
    let stop = mcpctl_user(runtime.path(), &["stop", "spawner"]);
    assert!(stop.status.success());
    eventually(
        format_args!("the second helper after stop (pid {second}) to exit"),
        BOUND,
        || !alive(second),
    );
    eventually("the server's cgroup to be removed", BOUND, || {
        !cgroup.exists()
    });
    let subtree = cgroup.parent().expect("subtree").to_owned();
    assert!(d.stop(Signal::TERM).success());
    assert!(
        !subtree.exists(),
        "the daemon removes its subtree when it exits"
    );
}

#[test]
fn a_server_that_daemonizes_a_child_and_exits_ends_only_when_the_child_is_gone() {
    let (_dirs, helper, mut d) = with_helper("forker", "--daemonize");
    let helper_pid = pid_in(&helper);
    // The main process exited 0 at once: that is the reason, and its
    // daemonized child was killed before the retry.
    d.wait_for("connection failed: process exited with status 0");
    eventually(
        format_args!("the daemonized helper (pid {helper_pid}) to exit"),
        BOUND,
        || !alive(helper_pid),
    );
    // each retry starts only once the last one's cgroup is empty: never two
    // helpers alive at once
    let mut seen = vec![helper_pid];
    eventually("two more retries' helpers", BOUND, || {
        if let Some(pid) = std::fs::read_to_string(&helper)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .filter(|p| !seen.contains(p))
        {
            for old in &seen {
                assert!(!alive(*old), "helper {old} alive beside helper {pid}");
            }
            seen.push(pid);
        }
        seen.len() >= 3
    });
    assert!(d.stop(Signal::TERM).success());
    for pid in seen {
        eventually(
            format_args!("a helper after the daemon stopped (pid {pid}) to exit"),
            BOUND,
            || !alive(pid),
        );
    }
}

#[test]
fn a_killed_daemons_leftovers_are_killed_by_the_next_and_never_anothers() {
    let units = tempfile::tempdir().expect("tempdir");
    let mine = tempfile::tempdir().expect("tempdir");
    let theirs = tempfile::tempdir().expect("tempdir");
    let files = tempfile::tempdir().expect("tempdir");
    let (my_helper, their_helper) = (files.path().join("mine"), files.path().join("theirs"));
    let units2 = tempfile::tempdir().expect("tempdir");
    // the same unit name in two daemons with different runtime directories
    unit(
        units.path(),
        "same",
        &["--detached-helper", &my_helper.display().to_string()],
    );
    unit(
        units2.path(),
        "same",
        &["--detached-helper", &their_helper.display().to_string()],
    );
    let other = {
        let mut other = daemon(units2.path(), theirs.path());
        other.wait_until("their server running", |d| d.latest_pid("same").is_some());
        other
    };
    let theirs_pid = pid_in(&their_helper);
    let mut d = daemon(units.path(), mine.path());
    d.wait_until("my server running", |d| d.latest_pid("same").is_some());
    let orphan = pid_in(&my_helper);
    assert_ne!(cgroup_of(orphan), cgroup_of(theirs_pid));
    // SIGKILL: the server dies with the daemon (PR_SET_PDEATHSIG), its
    // detached helper does not
    assert!(!d.stop(Signal::KILL).success());
    assert!(alive(orphan), "the helper survived its daemon");
    std::fs::remove_file(&my_helper).expect("rm");
    let mut again = daemon(units.path(), mine.path());
    again.wait_for("killed 1 leftover process of server same");
    eventually(
        format_args!("the leftover helper (pid {orphan}) to exit"),
        BOUND,
        || !alive(orphan),
    );
    again.wait_until("my server running again", |d| {
        d.latest_pid("same").is_some()
    });
    let new = pid_in(&my_helper);
    assert!(alive(theirs_pid), "the other daemon's server was touched");
    assert!(again.stop(Signal::TERM).success());
    eventually(
        format_args!("my new helper (pid {new}) to exit"),
        BOUND,
        || !alive(new),
    );
    assert!(alive(theirs_pid), "the other daemon's server was touched");
    assert!(other.stop(Signal::TERM).success());
    eventually(
        format_args!("their helper (pid {theirs_pid}) to exit"),
        BOUND,
        || !alive(theirs_pid),
    );
}

#[test]
fn without_a_writable_cgroup_hierarchy_servers_run_in_process_groups_and_it_says_so() {
    let units = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    unit(units.path(), "plain", &[]);
    // nobody cannot write the hierarchy
    for dir in [units.path(), runtime.path()] {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .expect("chmod");
    }
    std::fs::set_permissions(
        units.path().join("plain.kdl"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .expect("chmod");
    let mcpd = Path::new(env!("CARGO_BIN_EXE_mcpd"));
    let setpriv = Path::new("/usr/bin/setpriv");
    let mut d = Daemon::start_binary(
        setpriv,
        &[
            "--reuid=65534".as_ref(),
            "--regid=65534".as_ref(),
            "--clear-groups".as_ref(),
            mcpd.as_os_str(),
            "--user".as_ref(),
            "--no-bus".as_ref(),
            "--units".as_ref(),
            units.path().as_os_str(),
        ],
        // (the servers' working directory is the user's home)
        &[
            ("XDG_RUNTIME_DIR", runtime.path().as_os_str()),
            ("HOME", runtime.path().as_os_str()),
        ],
    );
    let warning = d.wait_for("contained by process groups only");
    assert!(warning.contains("cannot create cgroup"), "{warning}");
    assert_eq!(d.count("contained by process groups only"), 1);
    d.wait_until("plain running", |d| d.latest_pid("plain").is_some());
    let shown = String::from_utf8_lossy(
        &std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_mcpctl"))
            .args(["--user", "status", "plain"])
            .env("XDG_RUNTIME_DIR", runtime.path())
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .output()
            .expect("mcpctl")
            .stdout,
    )
    .into_owned();
    assert!(shown.contains("Containment: process group"), "{shown}");
    assert!(!shown.contains("Tasks:"), "{shown}");
    let main = d.latest_pid("plain").expect("pid");
    assert!(d.stop(Signal::TERM).success());
    eventually(
        format_args!("the server (pid {main}) to exit"),
        BOUND,
        || !alive(main),
    );
}

#[test]
fn limits_reach_the_server_or_its_start_fails_saying_what_is_missing() {
    let units = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("capped.kdl"),
        "stdio { command \"mcp-fixture\"; }\nlimits { nofile 64; core \"1M\"; }\n",
    )
    .expect("write");
    std::fs::write(
        units.path().join("bounded.kdl"),
        "stdio { command \"mcp-fixture\"; }\nlimits { memory-max \"256M\"; }\nreconnect { enabled #false; }\n",
    )
    .expect("write");
    let mut d = daemon(units.path(), runtime.path());
    d.wait_until("capped running", |d| d.latest_pid("capped").is_some());
    let pid = d.latest_pid("capped").expect("pid");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    assert_eq!(
        nofile.split_whitespace().collect::<Vec<_>>(),
        ["Max", "open", "files", "64", "64", "files"],
        "{nofile}"
    );
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .expect("a Max core file size line");
    assert_eq!(
        core.split_whitespace().collect::<Vec<_>>(),
        ["Max", "core", "file", "size", "1048576", "1048576", "bytes"],
        "{core}"
    );
    // memory-max needs the memory controller: enforced where it is
    // delegated, else the start fails and says so (never unlimited)
    let servers = cgroup_of(pid).parent().expect("servers").to_owned();
    let controllers =
        std::fs::read_to_string(servers.join("cgroup.controllers")).unwrap_or_default();
    if controllers.split_whitespace().any(|c| c == "memory") {
        d.wait_until("bounded running", |d| d.latest_pid("bounded").is_some());
        let max = std::fs::read_to_string(servers.join("bounded/memory.max")).expect("memory.max");
        assert_eq!(max.trim(), (256u64 << 20).to_string());
    } else {
        let failing = |l: &String| l.contains("mcpd_server=bounded") && l.contains("failed");
        d.wait_until("bounded failed", |d| d.seen.iter().any(failing));
        let failed = d
            .seen
            .iter()
            .find(|l| failing(l))
            .cloned()
            .unwrap_or_default();
        assert!(
            failed.contains("connection failed: `limits.memory-max` needs the cgroup memory controller, which is not delegated to")
                && failed.contains("reconnect is disabled"),
            "{failed}"
        );
        assert_eq!(d.starts("bounded"), 0, "it never ran unlimited");
        let shown =
            String::from_utf8_lossy(&mcpctl_user(runtime.path(), &["status", "bounded"]).stdout)
                .into_owned();
        assert!(
            shown.contains("failed (connection failed: `limits.memory-max` needs"),
            "{shown}"
        );
    }
    assert!(d.stop(Signal::TERM).success());
}

/// Threads and resident bytes of the processes in `cgroup`, from /proc.
fn from_proc(cgroup: &Path) -> (u64, u64) {
    let procs = std::fs::read_to_string(cgroup.join("cgroup.procs")).unwrap_or_default();
    let mut threads = 0;
    let mut rss = 0;
    for pid in procs.lines() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        threads += field("Threads:");
        rss += field("VmRSS:") * 1024;
    }
    (threads, rss)
}

#[test]
fn status_shows_what_the_servers_processes_use_as_proc_counts_it() {
    let (dirs, helper, mut d) = with_helper("pair", "--grandchild");
    d.wait_until("pair running", |d| d.latest_pid("pair").is_some());
    let main = d.latest_pid("pair").expect("pid");
    let _ = pid_in(&helper);
    let cgroup = cgroup_of(main);
    let mut last = String::new();
    let agreed = holds_within(BOUND, || {
        let out = mcpctl_user(dirs.runtime.path(), &["--json", "status", "pair"]);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let (threads, rss) = from_proc(&cgroup);
        let shown = &json[0];
        let tasks = shown["tasks_current"].as_u64();
        let memory = shown["memory_current"].as_u64().unwrap_or(0);
        // two processes; the numbers move a little between the two reads
        let close = memory.abs_diff(rss) <= rss / 10;
        if tasks == Some(threads)
            && close
            && std::fs::read_to_string(cgroup.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .count()
                == 2
        {
            assert!(shown["cpu_usage_nsec"].as_u64() > Some(0), "{shown}");
            assert_eq!(
                shown["containment"],
                format!("cgroup {}", cgroup.display()),
                "{shown}"
            );
            return true;
        }
        last = format!(
            "status says {tasks:?} tasks and {memory} bytes, /proc {threads} threads and {rss} bytes"
        );
        false
    });
    assert!(
        agreed,
        "{}: {last}",
        timed_out("status and /proc to agree", BOUND)
    );
    assert!(d.stop(Signal::TERM).success());
}
