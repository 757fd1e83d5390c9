//! `mcpctl verify`: exit codes and diagnostics of the real binary.

use std::fs;

use crate::helper::{mcpctl, root, run};

#[test]
fn every_shipped_unit_verifies() {
    let units = root().join("units");
    let mut files = Vec::new();
    let mut stack = vec![units.clone()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("read units/") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "kdl") {
                files.push(path);
            }
        }
    }
    assert!(
        files.len() >= 5,
        "units/ should hold the demo and templates: {files:?}"
    );
    // each file on its own, then the whole tree at once
    for file in &files {
        // Paths in units are absolute: a home is the placeholder
        // /home/USER, never root's (whose server would run as root).
        let text = fs::read_to_string(file).expect("read");
        assert!(!text.contains("/root"), "{} names /root", file.display());
        let out = run(mcpctl().arg("verify").arg(file));
        assert!(
            out.status.success(),
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "1 unit, no problems\n"
        );
    }
    let out = run(mcpctl().arg("verify").arg(&units));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "valid units print no diagnostics: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What was checked, as systemd-analyze prints its findings.
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{} units, no problems\n", files.len())
    );
}

#[test]
fn invalid_unit_exits_1_with_located_diagnostics_on_stderr() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let good = tmp.path().join("good.kdl");
    let bad = tmp.path().join("bad.kdl");
    fs::write(&good, "stdio {\n    command \"/bin/cat\"\n}\n").expect("write");
    fs::write(
        &bad,
        "stdio {\n    command \"/bin/cat\"\n}\nreconnect {\n    max-attempts 0\n}\n",
    )
    .expect("write");
    let out = run(mcpctl().arg("verify").arg(&good).arg(&bad));
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("[{}:5:18]", bad.display())),
        "{stderr}"
    );
    assert!(
        stderr.contains("max-attempts 0"),
        "source line shown: {stderr}"
    );
    assert!(stderr.contains("mcpctl: 1 of 2 units invalid"), "{stderr}");
    assert!(
        !stderr.contains("\u{1b}["),
        "no colour when not a terminal: {stderr}"
    );

    let out = run(mcpctl().arg("verify").arg(&good));
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn directory_is_verified_with_subdirectories_and_drop_ins() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let sub = tmp.path().join("team");
    fs::create_dir_all(sub.join("x.kdl.d")).expect("mkdir");
    fs::write(sub.join("x.kdl"), "stdio {\n    command \"/bin/cat\"\n}\n").expect("write");
    fs::write(sub.join("x.kdl.d/10-bad.kdl"), "stop-timeout \"soon\"\n").expect("write");
    let out = run(mcpctl().arg("verify").arg(tmp.path()));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("x.kdl.d/10-bad.kdl:1:14"), "{stderr}");
}

#[test]
fn missing_path_and_empty_directory_fail_clearly() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let missing = tmp.path().join("nope.kdl");
    let out = run(mcpctl().arg("verify").arg(&missing));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!("mcpctl: {}: ", missing.display())),
        "{stderr}"
    );

    let out = run(mcpctl().arg("verify").arg(tmp.path()));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no unit files"));
}

#[test]
fn verify_without_paths_is_a_usage_error() {
    let out = run(mcpctl().arg("verify"));
    assert_eq!(out.status.code(), Some(2), "clap usage errors exit 2");
}

#[test]
fn user_and_system_add_that_instances_rules() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("other.kdl");
    fs::write(
        &file,
        "stdio {\n    command \"cat\"\n    user \"nobody\"\n}\n",
    )
    .expect("write");
    // without an instance, and for the system instance: valid
    for args in [
        &["verify"][..],
        &["--system", "verify"],
        &["verify", "--system"],
    ] {
        let out = run(mcpctl().args(args).arg(&file));
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // a user instance runs every server as its own user
    let out = run(mcpctl().args(["--user", "verify"]).arg(&file));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a user instance runs every server as its own user")
            && err.contains(&format!("{}:3:10", file.display()))
            && err.contains("1 of 1 unit invalid"),
        "{err}"
    );
    // naming yourself is what a user instance does anyway
    let me = String::from_utf8(run(std::process::Command::new("id").arg("-un")).stdout)
        .expect("utf-8")
        .trim()
        .to_owned();
    fs::write(
        &file,
        format!("stdio {{\n    command \"cat\"\n    user \"{me}\"\n}}\n"),
    )
    .expect("write");
    let out = run(mcpctl().args(["--user", "verify"]).arg(&file));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_file_named_mcpd_kdl_is_verified_as_the_daemons_settings() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("mcpd.kdl");
    fs::write(
        &file,
        "telemetry {\n    otlp \"http://127.0.0.1:4318\"\n    sample-ratio 0.5\n}\n",
    )
    .expect("write");
    let out = run(mcpctl().arg("verify").arg(&file));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    fs::write(
        &file,
        "telemetry {\n    otlp \"http://127.0.0.1:4318\"\n    sample-ratio 2\n    header \"k\" \"s3cret\\n\"\n}\n",
    )
    .expect("write");
    let out = run(mcpctl().arg("verify").arg(&file));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}:3:18", file.display()))
            && stderr.contains("`sample-ratio` is a number from 0 to 1"),
        "{stderr}"
    );
    assert!(
        stderr.contains("`header` value is not a string"),
        "{stderr}"
    );
    // (The report quotes the file's own lines, as for a unit file; the
    // daemon's one-line warning does not: `unit::settings` tests.)
}
