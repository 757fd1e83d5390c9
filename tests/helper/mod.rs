//! Shared test helpers: binaries, snapshots, bounded waits.

pub mod fake;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The package root (tests run with it as the working directory).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `mcpctl` as built for this test run.
pub fn mcpctl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcpctl"))
}

/// `mcpd` as built for this test run.
pub fn mcpd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcpd"))
}

/// The fixture MCP server (an example, built by `cargo test` beside the test binary).
pub fn fixture_path() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/tests-HASH → target/<profile>/examples/mcp-fixture
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    let path = profile_dir.join("examples").join("mcp-fixture");
    assert!(
        path.is_file(),
        "{} is missing: `cargo test` builds examples; run it without --tests filters that skip them",
        path.display()
    );
    path
}

/// Runs a command to completion with no stdin.
pub fn run(cmd: &mut Command) -> Output {
    cmd.stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Compares `actual` with the snapshot file `expected`; with UPDATE_EXPECT=1
/// in the environment, writes it instead. Returns a description of the
/// difference, if any.
pub fn check_snapshot(expected: &Path, actual: &str) -> Option<String> {
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(expected, actual).expect("write snapshot");
        return None;
    }
    match std::fs::read_to_string(expected) {
        Ok(want) if want == actual => None,
        Ok(want) => Some(format!(
            "{} differs (UPDATE_EXPECT=1 rewrites it)\n--- expected\n{want}\n--- actual\n{actual}",
            expected.display()
        )),
        Err(e) => Some(format!(
            "{}: {e} (UPDATE_EXPECT=1 writes it)\n--- actual\n{actual}",
            expected.display()
        )),
    }
}
