//! `mcpctl add` and `mcpctl remove` (issue 52, item 8): a stdio and an
//! HTTP server added as a host's `mcp add` takes them, their secrets in
//! the credstore, picked up by a running daemon whose unit directory did
//! not exist yet, served to a host through `mcpctl bridge`; an existing
//! unit kept without `--force`; `remove --purge` leaves nothing behind.

use std::path::Path;
use std::process::Output;

use rustix::process::Signal;
use serde_json::Value;

use crate::helper::{Daemon, fixture_path, mcpctl, root};

const SECRET: &str = "added-secret-4f9c2e81";

/// `mcpctl --user ARGS` with the test's home, config and runtime.
fn ctl(home: &Path, runtime: &Path, args: &[&str]) -> Output {
    ctl_with(home, runtime, args, &[])
}

/// [`ctl`] with more variables (`EDITOR`).
fn ctl_with(home: &Path, runtime: &Path, args: &[&str], vars: &[(&str, &Path)]) -> Output {
    let mut command = mcpctl();
    for (k, v) in vars {
        command.env(k, v);
    }
    command
        .env_remove("VISUAL")
        .arg("--user")
        .args(args)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("MCPD_STATE_DIR", home.join("state"))
        .env("XDG_RUNTIME_DIR", runtime)
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .env_remove("MCPD_RUNTIME_DIR")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("mcpctl")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A host on the Python SDK opens unit `name` through `mcpctl bridge`:
/// the tools it lists.
fn host_tools(runtime: &Path, name: &str) -> Value {
    let out = std::process::Command::new("python3")
        .arg(root().join("tests/data/cannot_serve.py"))
        .args([
            "legacy",
            env!("CARGO_BIN_EXE_mcpctl"),
            "--user",
            "bridge",
            name,
        ])
        .env("XDG_RUNTIME_DIR", runtime)
        .env("PYTHONWARNINGS", "ignore")
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .env_remove("MCPD_RUNTIME_DIR")
        .output()
        .expect("python3");
    let outcome: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    outcome["opened"].clone()
}

fn state_of(home: &Path, runtime: &Path, name: &str) -> String {
    field_of(home, runtime, name, "state")
}

/// A string field of `mcpctl --json status NAME`.
fn field_of(home: &Path, runtime: &Path, name: &str, field: &str) -> String {
    let out = ctl(home, runtime, &["--json", "status", name]);
    serde_json::from_slice::<Value>(&out.stdout)
        .ok()
        .and_then(|v| v[0][field].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// An editor: a shell script that first keeps what it was given in
/// `seen`, then runs `body` on the file ("$1").
fn editor(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    let seen = dir.join(format!("{name}.seen"));
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nset -e\ncp \"$1\" '{}'\n{body}\n",
            seen.display()
        ),
    )
    .expect("editor");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

#[test]
fn an_edit_is_kept_only_when_the_unit_still_loads() {
    let home = tempfile::tempdir().expect("home");
    let home = home.path();
    let runtime = tempfile::tempdir().expect("runtime");
    let runtime = runtime.path();
    let editors = tempfile::tempdir().expect("editors");
    let editors = editors.path();
    let units = home.join("config/mcpd/units");
    let mut d = Daemon::start(
        &["--user".as_ref(), "--no-bus".as_ref()],
        &[
            ("HOME", home.as_os_str()),
            ("XDG_CONFIG_HOME", home.join("config").as_os_str()),
            ("MCPD_STATE_DIR", home.join("state").as_os_str()),
            ("XDG_RUNTIME_DIR", runtime.as_os_str()),
        ],
    );
    d.wait_for("started 0 units");
    let fixture = fixture_path();
    let fixture = fixture.to_str().expect("utf-8");
    let out = ctl(
        home,
        runtime,
        &["add", "demo", "--", fixture, "--chatter", "0"],
    );
    assert!(out.status.success(), "{}", text(&out));
    d.wait_until("demo running", |_| {
        state_of(home, runtime, "demo") == "running"
    });
    let unit = std::fs::read_to_string(units.join("demo.kdl")).expect("the unit");
    let dropin = units.join("demo.kdl.d/override.kdl");

    // A drop-in: the editor is shown the unit below the marker; the
    // daemon picks the change up.
    let good = editor(
        editors,
        "good",
        r#"printf 'description "edited by a drop-in"\n' > "$1""#,
    );
    let out = ctl_with(home, runtime, &["edit", "demo"], &[("EDITOR", &good)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("wrote {}", dropin.display())),
        "{}",
        text(&out)
    );
    let seen = std::fs::read_to_string(editors.join("good.seen")).expect("seen");
    assert!(
        seen.contains(mcpd::ctl::edit::MARKER) && seen.contains("// description "),
        "{seen}"
    );
    assert_eq!(
        std::fs::read_to_string(&dropin).expect("drop-in"),
        "description \"edited by a drop-in\"\n"
    );
    assert_eq!(
        field_of(home, runtime, "demo", "description"),
        "edited by a drop-in"
    );
    assert_eq!(state_of(home, runtime, "demo"), "running");

    // An edit that breaks the unit: refused with the file, line and key;
    // nothing changed, and the daemon keeps the unit it runs.
    let bad = editor(
        editors,
        "bad",
        r#"printf 'description "broken"\nstop-timeout "soon"\n' > "$1""#,
    );
    let out = ctl_with(home, runtime, &["edit", "demo"], &[("EDITOR", &bad)]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("the edit does not load, nothing changed"),
        "{said}"
    );
    assert!(said.contains(&format!("{}:2:", dropin.display())), "{said}");
    assert!(said.contains("stop-timeout"), "{said}");
    // The user's edit is not lost.
    let kept = said
        .split("the edit is kept in ")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .expect("where the edit is kept");
    assert!(
        std::fs::read_to_string(kept)
            .expect("the kept edit")
            .contains("stop-timeout \"soon\""),
    );
    let _ = std::fs::remove_dir_all(Path::new(kept).parent().expect("its dir"));
    assert_eq!(
        std::fs::read_to_string(&dropin).expect("drop-in"),
        "description \"edited by a drop-in\"\n"
    );
    assert_eq!(state_of(home, runtime, "demo"), "running");
    assert_eq!(
        field_of(home, runtime, "demo", "description"),
        "edited by a drop-in"
    );

    // An editor that changes nothing changes nothing.
    let out = ctl_with(
        home,
        runtime,
        &["edit", "demo"],
        &[("EDITOR", Path::new("true"))],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("nothing changed"), "{}", text(&out));

    // --full: the unit file itself, judged with its drop-ins.
    let broken = editor(editors, "broken", r#"printf 'stdio {\n' > "$1""#);
    let out = ctl_with(
        home,
        runtime,
        &["edit", "--full", "demo"],
        &[("EDITOR", &broken)],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(&units.join("demo.kdl").display().to_string()),
        "{}",
        text(&out)
    );
    // Its kept draft, with its scratch directory, is the test's to remove.
    let said = text(&out);
    let kept = said
        .split("the edit is kept in ")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .expect("where the edit is kept");
    let _ = std::fs::remove_dir_all(Path::new(kept).parent().expect("its dir"));
    assert_eq!(
        std::fs::read_to_string(units.join("demo.kdl")).expect("the unit"),
        unit
    );
    let full = editor(editors, "full", r#"sed -i '1a startup-timeout "7s"' "$1""#);
    let out = ctl_with(
        home,
        runtime,
        &["edit", "--full", "demo"],
        &[("EDITOR", &full)],
    );
    assert!(out.status.success(), "{}", text(&out));
    let now = std::fs::read_to_string(units.join("demo.kdl")).expect("the unit");
    let (first, rest) = unit.split_once('\n').expect("lines");
    assert_eq!(now, format!("{first}\nstartup-timeout \"7s\"\n{rest}"));
    assert!(!now.contains(mcpd::ctl::edit::MARKER), "{now}");

    // An emptied drop-in is removed; the unit's own description is back.
    let empty = editor(editors, "empty", r#": > "$1""#);
    let out = ctl_with(home, runtime, &["edit", "demo"], &[("EDITOR", &empty)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!dropin.exists());
    assert_eq!(
        field_of(home, runtime, "demo", "description"),
        "demo, added by mcpctl add"
    );

    // No such unit: exit 4, where it looked.
    let out = ctl_with(home, runtime, &["edit", "nope"], &[("EDITOR", &good)]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("no unit nope in "), "{}", text(&out));
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn added_units_serve_a_host_and_removed_ones_leave_nothing_behind() {
    let home = tempfile::tempdir().expect("home");
    let home = home.path();
    let runtime = tempfile::tempdir().expect("runtime");
    let runtime = runtime.path();
    let units = home.join("config/mcpd/units");
    let store = home.join("config/mcpd/credstore");
    assert!(!units.exists());
    // The daemon of the user's own unit directory, which does not exist.
    let mut d = Daemon::start(
        &["--user".as_ref(), "--no-bus".as_ref()],
        &[
            ("HOME", home.as_os_str()),
            ("XDG_CONFIG_HOME", home.join("config").as_os_str()),
            ("MCPD_STATE_DIR", home.join("state").as_os_str()),
            ("XDG_RUNTIME_DIR", runtime.as_os_str()),
        ],
    );
    d.wait_for("started 0 units");

    // A stdio server, a secret in its environment.
    let fixture = fixture_path();
    let fixture = fixture.to_str().expect("utf-8");
    let token = format!("API_TOKEN={SECRET}");
    let out = ctl(
        home,
        runtime,
        &[
            "add",
            "demo",
            "-e",
            &token,
            "-e",
            "LEVEL=debug",
            "--",
            fixture,
            "--chatter",
            "0",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("demo"), "{}", text(&out));
    let unit = std::fs::read_to_string(units.join("demo.kdl")).expect("the unit");
    assert!(!unit.contains(SECRET), "{unit}");
    assert_eq!(
        std::fs::read_to_string(store.join("demo.API_TOKEN")).expect("credential"),
        SECRET
    );
    d.wait_until("demo running", |_| {
        state_of(home, runtime, "demo") == "running"
    });
    assert_eq!(host_tools(runtime, "demo")[0], "echo");
    let env = ctl(home, runtime, &["call", "demo", "env", "{}"]);
    let env: Value = serde_json::from_slice(&env.stdout).expect("env json");
    assert_eq!(env["API_TOKEN"], SECRET, "{env}");
    assert_eq!(env["LEVEL"], "debug", "{env}");

    // It exists: kept, unless --force.
    let again = ctl(home, runtime, &["add", "demo", "--", "/bin/false"]);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    assert!(text(&again).contains("exists (--force replaces it)"));
    assert_eq!(
        std::fs::read_to_string(units.join("demo.kdl")).expect("the unit"),
        unit
    );
    // Bad input is named and writes nothing.
    let bad = ctl(
        home,
        runtime,
        &["add", "other", "-e", "NOEQUALS", "--", "x"],
    );
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad).contains("--env NOEQUALS: expected KEY=VALUE"));
    assert!(!units.join("other.kdl").exists());

    // An HTTP server that wants a bearer token, given as a header.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let mut server = std::process::Command::new(fixture_path())
        .args([
            "--http",
            &format!("127.0.0.1:{port}"),
            "--require-auth",
            &format!("Bearer {SECRET}"),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("http fixture");
    let url = format!("http://127.0.0.1:{port}/mcp");
    let auth = format!("Authorization: Bearer {SECRET}");
    let out = ctl(
        home,
        runtime,
        &["add", "--transport", "http", "web", &url, "--header", &auth],
    );
    assert!(out.status.success(), "{}", text(&out));
    let unit = std::fs::read_to_string(units.join("web.kdl")).expect("the unit");
    assert!(!unit.contains(SECRET), "{unit}");
    d.wait_until("web running", |_| {
        state_of(home, runtime, "web") == "running"
    });
    assert_eq!(host_tools(runtime, "web")[0], "echo");

    // Removed with --purge: stopped, and no file of it is left.
    let cache = home.join("state/cache/demo.json");
    let out = ctl(home, runtime, &["remove", "--purge", "demo"]);
    assert!(out.status.success(), "{}", text(&out));
    for gone in [units.join("demo.kdl"), store.join("demo.API_TOKEN"), cache] {
        assert!(!gone.exists(), "{} is left", gone.display());
    }
    let status = ctl(home, runtime, &["status", "demo"]);
    assert_eq!(status.status.code(), Some(4), "{}", text(&status));
    let again = ctl(home, runtime, &["remove", "demo"]);
    assert_eq!(again.status.code(), Some(4), "{}", text(&again));
    assert!(
        text(&again).contains("no unit demo in "),
        "{}",
        text(&again)
    );

    let _ = server.kill();
    let _ = server.wait();
    assert!(d.stop(Signal::TERM).success());
}

/// A child killed and reaped when dropped.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_added_server_with_a_login_waits_for_one() {
    let home = tempfile::tempdir().expect("home");
    let home = home.path();
    let runtime = tempfile::tempdir().expect("runtime");
    let runtime = runtime.path();
    let units = home.join("config/mcpd/units");
    // The OAuth-protected server and its authorization server.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let _fake = Reaped(
        std::process::Command::new("python3")
            .arg(root().join("tests/data/oauth_fake.py"))
            .args([&port.to_string(), "ok"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 oauth_fake.py"),
    );
    crate::helper::eventually(
        format!("the fake to listen on {port}"),
        crate::helper::BOUND,
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
    );
    let mut d = Daemon::start(
        &["--user".as_ref(), "--no-bus".as_ref()],
        &[
            ("HOME", home.as_os_str()),
            ("XDG_CONFIG_HOME", home.join("config").as_os_str()),
            ("MCPD_STATE_DIR", home.join("state").as_os_str()),
            ("XDG_RUNTIME_DIR", runtime.as_os_str()),
        ],
    );
    d.wait_for("started 0 units");

    let url = format!("http://localhost:{port}/mcp");
    let args = [
        "add",
        "guarded",
        &url,
        "--oauth",
        "--scope",
        "read write",
        "--client-id",
        "mcpd-test",
        "--redirect-port",
        "8765",
    ];
    let out = ctl(home, runtime, &args);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).ends_with("then: mcpctl auth login guarded\n"),
        "{}",
        text(&out)
    );
    let path = units.join("guarded.kdl");
    let unit = std::fs::read_to_string(&path).expect("the unit");
    assert!(
        unit.contains(
            r#"oauth { client-id "mcpd-test"; scope "read write"; redirect-port 8765; }"#
        ),
        "{unit}"
    );
    let verified = ctl(home, runtime, &["verify", path.to_str().expect("utf-8")]);
    assert!(verified.status.success(), "{}", text(&verified));
    d.wait_until("guarded needs a login", |_| {
        state_of(home, runtime, "guarded") == "needs-login"
    });
    let status = ctl(home, runtime, &["status", "guarded"]);
    assert!(text(&status).contains("needs-login"), "{}", text(&status));

    // Its keys only with --oauth; --oauth only for an HTTP server.
    let out = ctl(home, runtime, &["add", "x", &url, "--scope", "a"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = ctl(home, runtime, &["add", "y", "--oauth", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("--oauth is for an HTTP server"),
        "{}",
        text(&out)
    );
    assert!(!units.join("x.kdl").exists() && !units.join("y.kdl").exists());
    assert!(d.stop(Signal::TERM).success());
}
