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
    mcpctl()
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
    let out = ctl(home, runtime, &["--json", "status", name]);
    serde_json::from_slice::<Value>(&out.stdout)
        .ok()
        .and_then(|v| v[0]["state"].as_str().map(str::to_owned))
        .unwrap_or_default()
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
