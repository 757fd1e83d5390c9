//! The sandbox (DESIGN §10) with the real daemon and the real kernel:
//! Landlock, network and user namespaces, no_new_privs. The fixture's
//! probe tools (`read`, `write`, `connect`, `listen`, `exec`) report `ok`
//! or the OS error; each outcome is also checked on an unsandboxed server,
//! so a probe that would fail anyway proves nothing. CI runs as root.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::helper::{
    BOUND, Daemon, env_of, eventually, fixture_path, mcpctl, mcpctl_user, probe, root, session_of,
};

/// A unit running the fixture with the probe tools, and `extra` lines.
fn unit(dir: &Path, name: &str, extra: &str) {
    unit_as(dir, name, "", extra);
}

/// [`unit`] with `stdio` lines.
fn unit_as(dir: &Path, name: &str, stdio: &str, extra: &str) {
    std::fs::write(
        dir.join(format!("{name}.kdl")),
        format!(
            "stdio {{\n    command \"{}\" \"--chatter\" \"0\" \"--tools\" \"read,write,connect,listen,exec\"\n{stdio}}}\nreconnect {{\n    initial-delay \"50ms\"\n}}\nstop-timeout \"1s\"\n{extra}\n",
            fixture_path().display()
        ),
    )
    .expect("write unit");
}

fn status(runtime: &Path, server: &str) -> String {
    String::from_utf8_lossy(&mcpctl_user(runtime, &["status", server]).stdout).into_owned()
}

fn denied(answer: &str) -> bool {
    answer.starts_with("error: Permission denied")
}

#[test]
fn a_sandboxed_server_reaches_only_what_it_is_granted_and_keeps_it_across_restarts() {
    let home = tempfile::tempdir().expect("home");
    let secret = home.path().join("secret");
    std::fs::write(&secret, "the user's secret").expect("secret");
    let shared = tempfile::tempdir().expect("ro");
    let data = shared.path().join("data");
    std::fs::write(&data, "shared data").expect("data");
    let writable = tempfile::tempdir().expect("rw");
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    // A TCP listener on the host's loopback: connections complete in its
    // backlog without an accept.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let host_port = listener.local_addr().expect("addr").to_string();
    let paths = format!(
        "    read-only-paths \"{}\"\n    read-write-paths \"{}\"\n",
        shared.path().display(),
        writable.path().display()
    );
    unit(units.path(), "open", "");
    unit(
        units.path(),
        "none",
        &format!("sandbox {{\n{paths}    network \"none\"\n}}"),
    );
    unit(
        units.path(),
        "lo",
        &format!("sandbox {{\n{paths}    network \"loopback\"\n}}"),
    );
    let mut d = Daemon::user_no_bus(
        units.path(),
        &[
            ("XDG_RUNTIME_DIR", runtime.path().as_os_str()),
            ("HOME", home.path().as_os_str()),
        ],
    );
    let rt = runtime.path();
    for name in ["open", "none", "lo"] {
        d.wait_until(&format!("{name} running"), |d| d.latest_pid(name).is_some());
    }
    let outside =
        PathBuf::from("/var/tmp").join(format!("mcpd-sandbox-test-{}", std::process::id()));
    let outside_text = outside.display().to_string();
    let through_proc = format!("/proc/self/root{outside_text}");

    // Unsandboxed, every probe succeeds: the probes are honest.
    let open = |tool, text: &str| probe(rt, "open", tool, text);
    assert_eq!(open("read", "/etc/hostname").split(' ').next(), Some("ok"));
    assert_eq!(open("read", &secret.display().to_string()), "ok 17 bytes");
    assert_eq!(
        open("write", &writable.path().join("o").display().to_string()),
        "ok"
    );
    assert_eq!(open("write", &outside_text), "ok");
    std::fs::remove_file(&outside).expect("rm");
    assert_eq!(open("write", &through_proc), "ok");
    std::fs::remove_file(&outside).expect("rm");
    assert_eq!(open("connect", &host_port), "ok");
    assert!(open("exec", &format!("cat {}", secret.display())).contains("the user's secret"));
    assert!(!status(rt, "open").contains("Sandbox:"));
    let bounding = |server: &str| {
        probe(rt, server, "exec", "grep CapBnd /proc/self/status")
            .split_whitespace()
            .last()
            .unwrap_or_default()
            .to_owned()
    };
    assert_ne!(
        bounding("open"),
        "0000000000000000",
        "root keeps its capabilities outside"
    );
    let open_pid = d.latest_pid("open").expect("pid");
    assert_ne!(
        session_of(open_pid),
        open_pid,
        "unsandboxed, the daemon's session"
    );

    for name in ["none", "lo"] {
        let boxed = |tool, text: &str| probe(rt, name, tool, text);
        let tmpdir = env_of(rt, name)["TMPDIR"]
            .as_str()
            .expect("a TMPDIR")
            .to_owned();
        assert!(
            tmpdir.starts_with(&rt.join("mcpd/tmp").display().to_string()),
            "{tmpdir}"
        );
        // What it may read.
        assert_eq!(boxed("read", "/etc/hostname").split(' ').next(), Some("ok"));
        assert_eq!(boxed("read", &data.display().to_string()), "ok 11 bytes");
        // What it may not.
        let answer = boxed("read", &secret.display().to_string());
        assert!(denied(&answer), "{name} read $HOME: {answer}");
        let answer = boxed("exec", &format!("cat {}", secret.display()));
        assert!(
            answer.contains("Permission denied") && !answer.contains("the user's secret"),
            "{name}'s children are confined too: {answer}"
        );
        // Where it may write.
        assert_eq!(
            boxed("write", &writable.path().join(name).display().to_string()),
            "ok"
        );
        assert_eq!(boxed("write", &format!("{tmpdir}/x")), "ok");
        let answer = boxed("write", &outside_text);
        assert!(denied(&answer), "{name} wrote /var/tmp: {answer}");
        let answer = boxed("write", &through_proc);
        assert!(
            denied(&answer),
            "{name} wrote through /proc/self/root: {answer}"
        );
        assert!(!outside.exists());
        // Root, but with no capability left to use, nor one exec could give.
        assert_eq!(bounding(name), "0000000000000000", "{name}");
        let caps = probe(rt, name, "exec", "grep CapEff /proc/self/status");
        assert!(caps.ends_with("0000000000000000"), "{name}: {caps}");
        // A session of its own: no controlling terminal to push input into.
        let pid = d.latest_pid(name).expect("pid");
        assert_eq!(session_of(pid), pid, "{name} leads its own session");
        // The host's loopback is out of reach either way.
        let answer = boxed("connect", &host_port);
        assert!(
            answer.starts_with("error:"),
            "{name} reached the host: {answer}"
        );
        let shown = status(rt, name);
        let network = if name == "lo" { "loopback" } else { "none" };
        assert!(
            shown.contains("    Sandbox: landlock v")
                && shown.contains(&format!(", network {network}\n")),
            "{shown}"
        );
    }
    // Its own loopback only with "loopback".
    assert_eq!(probe(rt, "lo", "listen", ""), "ok");
    let answer = probe(rt, "none", "listen", "");
    assert!(
        answer.contains("unreachable"),
        "no loopback at all: {answer}"
    );
    assert_eq!(probe(rt, "open", "listen", ""), "ok");

    // A crash: the next generation is confined as the first was, in a new
    // temp directory; the old one is gone with its processes.
    let first = env_of(rt, "none")["TMPDIR"]
        .as_str()
        .expect("tmp")
        .to_owned();
    let pid = d.latest_pid("none").expect("pid");
    let crash = mcpctl_user(rt, &["call", "none", "crash", "{\"code\":3}"]);
    assert!(crash.status.success());
    d.wait_until("none running again", |d| {
        d.latest_pid("none").is_some_and(|p| p != pid)
    });
    eventually("the first temp directory removed", BOUND, || {
        !Path::new(&first).exists()
    });
    let second = env_of(rt, "none")["TMPDIR"]
        .as_str()
        .expect("tmp")
        .to_owned();
    assert_ne!(first, second);
    assert!(Path::new(&second).is_dir());
    let answer = probe(rt, "none", "read", &secret.display().to_string());
    assert!(denied(&answer), "after a restart: {answer}");

    // A stop removes the temp directory too.
    assert!(mcpctl_user(rt, &["stop", "none"]).status.success());
    eventually("the temp directory removed at stop", BOUND, || {
        !Path::new(&second).exists()
    });
    // A daemon that exits leaves no temp directories behind.
    assert!(rt.join("mcpd/tmp").is_dir());
    assert!(d.stop(rustix::process::Signal::TERM).success());
    assert!(!rt.join("mcpd/tmp").exists());
    drop(listener);
}

/// `mcpctl --system` against the daemon whose runtime dir is `runtime`.
fn mcpctl_system(runtime: &Path, args: &[&str]) -> String {
    let out = mcpctl()
        .arg("--system")
        .args(args)
        .env("MCPD_RUNTIME_DIR", runtime)
        .env_remove("DBUS_SYSTEM_BUS_ADDRESS")
        .output()
        .expect("mcpctl");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn a_setuid_program_gains_nothing_in_a_sandbox() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test runs servers as nobody and needs root (CI runs as root)"
    );
    // A setuid-root copy of id(1), where nobody may run it.
    let bin = tempfile::tempdir().expect("bin");
    let id = bin.path().join("id");
    std::fs::copy("/usr/bin/id", &id).expect("copy id");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o4755)).expect("chmod");
    }
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    let nobody = "    user \"nobody\"\n";
    unit_as(units.path(), "plain", nobody, "");
    unit_as(
        units.path(),
        "boxed",
        nobody,
        &format!(
            "sandbox {{\n    read-only-paths \"{}\"\n}}",
            bin.path().display()
        ),
    );
    let mut d = Daemon::start(
        &[
            "--system".as_ref(),
            "--no-bus".as_ref(),
            "--units".as_ref(),
            units.path().as_os_str(),
        ],
        &[("MCPD_RUNTIME_DIR", runtime.path().as_os_str())],
    );
    for name in ["plain", "boxed"] {
        d.wait_until(&format!("{name} running"), |d| d.latest_pid(name).is_some());
    }
    let euid = |server: &str| {
        let args = serde_json::json!({ "text": format!("{} -u", id.display()) }).to_string();
        mcpctl_system(runtime.path(), &["call", server, "exec", &args])
    };
    assert_eq!(euid("plain"), "exit status: 0 0", "setuid works outside");
    let nobody = nix::unistd::User::from_name("nobody")
        .expect("lookup")
        .expect("nobody exists")
        .uid;
    assert_eq!(
        euid("boxed"),
        format!("exit status: 0 {nobody}"),
        "no_new_privs: the setuid bit gives nothing"
    );
    let shown = mcpctl_system(runtime.path(), &["status", "boxed"]);
    assert!(shown.contains(", network host\n"), "{shown}");
}

#[test]
fn an_unprivileged_daemon_confines_its_servers_inside_a_user_namespace() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test runs the daemon as nobody and needs root (CI runs as root)"
    );
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    let home = tempfile::tempdir().expect("home");
    unit(units.path(), "lo", "sandbox { network \"loopback\"; }");
    for dir in [units.path(), runtime.path(), home.path()] {
        rustix::fs::chown(
            dir,
            Some(rustix::fs::Uid::from_raw(65534)),
            Some(rustix::fs::Gid::from_raw(65534)),
        )
        .expect("chown");
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let host_port = listener.local_addr().expect("addr").to_string();
    let as_nobody = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    let mcpd = env!("CARGO_BIN_EXE_mcpd");
    let mut args: Vec<&std::ffi::OsStr> = as_nobody.iter().map(|a| a.as_ref()).collect();
    args.extend([
        mcpd.as_ref(),
        "--user".as_ref(),
        "--no-bus".as_ref(),
        "--units".as_ref(),
        units.path().as_os_str(),
    ]);
    let mut d = Daemon::start_binary(
        Path::new("setpriv"),
        &args,
        &[
            ("XDG_RUNTIME_DIR", runtime.path().as_os_str()),
            ("HOME", home.path().as_os_str()),
        ],
    );
    d.wait_until("lo running", |d| d.latest_pid("lo").is_some());
    // `mcpctl --user call lo TOOL ARGS` as nobody: its output.
    let mcpctl_call = |tool: &str, json: &str| {
        let out = Command::new("setpriv")
            .args(as_nobody)
            .arg(env!("CARGO_BIN_EXE_mcpctl"))
            .args(["--user", "call", "lo", tool, json])
            .env("XDG_RUNTIME_DIR", runtime.path())
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .output()
            .expect("mcpctl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let call = |tool: &str, text: &str| {
        mcpctl_call(tool, &serde_json::json!({ "text": text }).to_string())
    };
    assert_eq!(call("listen", ""), "ok", "its own loopback is up");
    // A directory it leaves that nobody may list is removed with its
    // temp directory all the same.
    let env: serde_json::Value = serde_json::from_str(&mcpctl_call("env", "{}")).expect("env");
    let tmpdir = PathBuf::from(env["TMPDIR"].as_str().expect("TMPDIR"));
    let locked = tmpdir.join("locked");
    let made = call("exec", &format!("mkdir -p {}/inner", locked.display()));
    assert!(made.starts_with("exit status: 0"), "{made}");
    let made = call("exec", &format!("chmod 000 {}", locked.display()));
    assert!(made.starts_with("exit status: 0"), "{made}");
    let answer = call("connect", &host_port);
    assert!(answer.starts_with("error:"), "reached the host: {answer}");
    // The daemon's own files are out of reach.
    let lock = runtime.path().join("mcpd/mcpd.lock");
    assert!(lock.exists());
    let answer = call("read", &lock.display().to_string());
    assert!(denied(&answer), "{answer}");
    // In its user namespace it is still nobody, with no other ids mapped.
    let map = std::fs::read_to_string(format!(
        "/proc/{}/uid_map",
        d.latest_pid("lo").expect("pid")
    ))
    .expect("uid_map");
    assert_eq!(
        map.split_whitespace().collect::<Vec<_>>(),
        ["65534", "65534", "1"]
    );
    assert!(d.stop(rustix::process::Signal::TERM).success());
    assert!(!tmpdir.exists(), "{} outlived its server", tmpdir.display());
    drop(listener);
}

/// A daemon on `units` with its runtime directory in `runtime`.
fn daemon(units: &Path, runtime: &Path) -> Daemon {
    Daemon::user_no_bus(units, &[("XDG_RUNTIME_DIR", runtime.as_os_str())])
}

#[test]
fn a_console_script_in_a_virtualenv_runs_sandboxed_with_no_extra_paths() {
    // A PyPI server in a virtualenv whose python is a symlink into the
    // version manager's prefix (pyenv's on CI).
    let script = root().join("target/py-time/bin/mcp-server-time");
    assert!(
        script.is_file(),
        "{} is missing: .ci/run installs mcp-server-time into target/py-time",
        script.display()
    );
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    std::fs::write(
        units.path().join("time.kdl"),
        format!(
            "stdio {{\n    command \"{}\" \"--local-timezone\" \"UTC\"\n}}\nsandbox {{ network \"none\"; }}\n",
            script.display()
        ),
    )
    .expect("unit");
    let mut d = daemon(units.path(), runtime.path());
    d.wait_until("time running", |d| d.latest_pid("time").is_some());
    let out = mcpctl_user(
        runtime.path(),
        &[
            "call",
            "time",
            "get_current_time",
            "{\"timezone\":\"Europe/Berlin\"}",
        ],
    );
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{answer}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        answer.contains("\"timezone\": \"Europe/Berlin\""),
        "{answer}"
    );
    assert!(status(runtime.path(), "time").contains(", network none\n"));
}

#[test]
fn the_reference_filesystem_server_gets_only_what_its_sandbox_grants() {
    let modules = root().join("target/npm/node_modules");
    let server = modules.join("@modelcontextprotocol/server-filesystem/dist/index.js");
    assert!(
        server.is_file(),
        "{} is missing: .ci/run installs tests/npm (npm ci --prefix target/npm)",
        server.display()
    );
    let allowed = tempfile::tempdir().expect("allowed");
    let inside = allowed.path().join("inside.txt");
    std::fs::write(&inside, "inside the sandbox").expect("write");
    let elsewhere = tempfile::tempdir().expect("elsewhere");
    let outside = elsewhere.path().join("outside.txt");
    std::fs::write(&outside, "outside the sandbox").expect("write");
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    // The server itself allows "/": only the OS stands between it and
    // `outside`.
    std::fs::write(
        units.path().join("files.kdl"),
        format!(
            "stdio {{\n    command \"node\" \"{}\" \"/\"\n}}\nsandbox {{\n    read-only-paths \"{}\"\n    read-write-paths \"{}\"\n    network \"none\"\n}}\n",
            server.display(),
            modules.display(),
            allowed.path().display()
        ),
    )
    .expect("unit");
    let mut d = daemon(units.path(), runtime.path());
    d.wait_until("files running", |d| d.latest_pid("files").is_some());
    let read = |path: &Path| {
        let args = serde_json::json!({ "path": path }).to_string();
        let out = mcpctl_user(runtime.path(), &["call", "files", "read_text_file", &args]);
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    let answer = read(&inside);
    assert!(answer.contains("inside the sandbox"), "{answer}");
    let answer = read(&outside);
    assert!(
        answer.contains("EACCES") && !answer.contains("outside the sandbox"),
        "{answer}"
    );
}
