//! The whole protocol through mcpd (DESIGN §8): what the official MCP
//! Python SDK (and, for initialize, list, call, progress and sampling, the
//! TypeScript SDK) gets from the reference server
//! (`@modelcontextprotocol/server-everything`, pinned in
//! `tests/npm/package-lock.json`, installed by `.ci/run`) through
//! `mcpctl bridge` is what it gets directly.

use std::path::PathBuf;

use rustix::process::Signal;
use serde_json::Value;

use crate::helper::{Daemon, mcpctl_user, root};

/// The reference server's entry point.
pub fn everything() -> PathBuf {
    let path = root()
        .join("target/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        path.is_file(),
        "{} is missing: .ci/run installs tests/npm (npm ci --prefix target/npm)",
        path.display()
    );
    path
}

/// Runs `tests/data/fidelity.py` against `command`: every check's outcome.
fn fidelity(command: &[&str], runtime: Option<&std::path::Path>) -> Value {
    fidelity_with(command, runtime, &[])
}

/// [`fidelity`] with more of the script's environment (`MCPD_TOKEN`).
pub fn fidelity_with(
    command: &[&str],
    runtime: Option<&std::path::Path>,
    env: &[(&str, &str)],
) -> Value {
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(root().join("tests/data/fidelity.py"))
        .args(command)
        .env("PYTHONWARNINGS", "ignore")
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .env_remove("MCPD_TOKEN")
        .envs(env.iter().copied());
    if let Some(runtime) = runtime {
        cmd.env("XDG_RUNTIME_DIR", runtime);
    }
    let out = cmd.output().expect("python3");
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

/// Runs `tests/data/SCRIPT`, a host on the official TypeScript SDK (from
/// `target/npm`), against `command` (started with `runtime` as its
/// XDG_RUNTIME_DIR, if one is given): each check's outcome.
pub fn ts_client(script: &str, command: &[&str], runtime: Option<&std::path::Path>) -> Value {
    let mut cmd = std::process::Command::new("node");
    cmd.arg(root().join("tests/data").join(script))
        .arg(root().join("target/npm/node_modules"))
        .args(command)
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .env_remove("MCPD_RUNTIME_DIR")
        .stdin(std::process::Stdio::null());
    if let Some(runtime) = runtime {
        cmd.env("XDG_RUNTIME_DIR", runtime);
    }
    // Each script bounds its waits itself.
    let out = cmd.output().expect("node");
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout).expect("one JSON object")
}

#[test]
fn two_official_sdks_get_through_the_bridge_what_they_get_directly() {
    let server = everything();
    let server = server.to_str().expect("utf-8 path");
    let direct = fidelity(&["node", server, "stdio"], None);
    // Every check passes directly (else the comparison proves nothing).
    for (check, outcome) in direct.as_object().expect("object") {
        assert!(
            !outcome.as_str().is_some_and(|o| o.starts_with("error")),
            "{check} fails even directly: {outcome}"
        );
    }
    assert_eq!(
        direct["tools"].as_array().map(Vec::len),
        Some(17),
        "{direct}"
    );
    assert_eq!(
        direct["progress"]["steps"],
        serde_json::json!([1.0, 2.0, 3.0])
    );

    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("everything.kdl"),
        format!("stdio {{\n    command \"node\" \"{server}\" \"stdio\"\n}}\n"),
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    // The reference server adds its capability-gated tools after
    // `initialized`: mcpd re-reads the list on its list_changed.
    d.wait_until("17 tools", |d| {
        let runtime = d.runtime_dir().expect("runtime");
        let out = mcpctl_user(runtime, &["tools", "everything"]);
        String::from_utf8_lossy(&out.stdout).lines().count() >= 17
    });
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let mcpctl = env!("CARGO_BIN_EXE_mcpctl");
    let bridged = fidelity(&[mcpctl, "--user", "bridge", "everything"], Some(&runtime));
    for (check, outcome) in direct.as_object().expect("object") {
        assert_eq!(&bridged[check], outcome, "{check} differs through mcpd");
    }
    assert_eq!(direct, bridged);

    // A second client stack: the official TypeScript SDK, declaring
    // sampling only. Through mcpd it also sees the tools the reference
    // server lists for mcpd's fuller capabilities (one upstream session,
    // shared): everything else is the same.
    let ts = |command: &[&str], runtime: Option<&std::path::Path>| {
        ts_client("ts_client.mjs", command, runtime)
    };
    let mut direct = ts(&["node", server, "stdio"], None);
    let mut bridged = ts(&[mcpctl, "--user", "bridge", "everything"], Some(&runtime));
    assert_eq!(direct["sampling"], true, "{direct}");
    assert_eq!(direct["progress"]["inOrder"], true, "{direct}");
    let names = |v: &mut Value| -> Vec<String> {
        serde_json::from_value(v["tools"].take()).expect("tool names")
    };
    let (few, all) = (names(&mut direct), names(&mut bridged));
    assert!(
        few.iter().all(|t| all.contains(t)),
        "{few:?} within {all:?}"
    );
    assert_eq!(all.len(), 17, "{all:?}");
    assert_eq!(direct, bridged);

    // The lists are published beside the tools, and reads go through.
    let lines = |args: &[&str]| {
        let out = mcpctl_user(&runtime, args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let resources = lines(&["resources", "everything"]);
    assert!(
        resources.starts_with("demo://resource/static/document/architecture.md"),
        "{resources}"
    );
    assert!(resources.lines().count() >= 7, "{resources}");
    let templates = lines(&["resources", "--templates", "everything"]);
    assert_eq!(templates.lines().count(), 2, "{templates}");
    let prompts = lines(&["prompts", "everything"]);
    assert_eq!(prompts.lines().count(), 4, "{prompts}");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let (_conn, server) =
            crate::helper::private_server(&runtime.join("mcpd/private"), "everything").await;
        let read: Value = serde_json::from_str(
            &server
                .read_resource("demo://resource/static/document/architecture.md")
                .await
                .expect("ReadResource"),
        )
        .expect("JSON");
        assert!(
            read["contents"][0]["text"]
                .as_str()
                .is_some_and(|t| t.contains("Architecture"))
        );
        let prompt: Value = serde_json::from_str(
            &server
                .get_prompt("simple-prompt", "")
                .await
                .expect("GetPrompt"),
        )
        .expect("JSON");
        assert_eq!(prompt["messages"][0]["role"], "user", "{prompt}");
        let missing = server
            .read_resource("demo://nothing")
            .await
            .expect_err("no such resource");
        assert!(!missing.message().is_empty());
    });
    assert!(d.stop(Signal::TERM).success());
}
