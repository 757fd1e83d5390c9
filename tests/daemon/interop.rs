//! Servers mcpd did not write: one built on the official MCP Python SDK,
//! supervised over stdio and used through mcpctl.

use crate::helper::{Daemon, mcpctl, root, run};

#[test]
fn a_server_built_on_the_official_python_sdk_runs_under_mcpd() {
    let units = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    let script = root().join("tests/data/python_sdk_server.py");
    std::fs::write(
        units.path().join("py.kdl"),
        format!(
            "stdio {{\n    command \"python3\" \"{}\"\n}}\nstartup-timeout \"60s\"\n",
            script.display()
        ),
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(
        units.path(),
        &[("XDG_RUNTIME_DIR", runtime.path().as_os_str())],
    );
    d.wait_until_within("py running", crate::helper::STARTUP, |d| {
        d.latest_pid("py").is_some()
    });
    let ctl = |args: &[&str]| {
        let out = run(mcpctl()
            .env("XDG_RUNTIME_DIR", runtime.path())
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .arg("--user")
            .args(args));
        assert!(
            out.status.success(),
            "mcpctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    };

    let tools: serde_json::Value =
        serde_json::from_str(&ctl(&["tools", "py", "--json"])).expect("json");
    let names: Vec<&str> = tools
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["shout", "big"]);
    assert_eq!(
        ctl(&["call", "py", "shout", r#"{"text":"hello"}"#]),
        "HELLO\n"
    );
    // an answer of 2 MB, far beyond a read and the pipe buffer
    let big = ctl(&["call", "py", "big", r#"{"n":2000000}"#]);
    assert_eq!(big.trim_end().len(), 2_000_000);
    assert!(big.trim_end().bytes().all(|b| b == b'y'));
    let status: serde_json::Value =
        serde_json::from_str(&ctl(&["status", "py", "--json"])).expect("json");
    assert_eq!(status[0]["state"], "running", "{status}");
    assert_eq!(
        status[0]["generation"], 1,
        "no reconnect happened: {status}"
    );
}
