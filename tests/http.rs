//! The HTTP endpoint (DESIGN §15) through the real `mcpd`: its settings
//! file (`mcpd.kdl`), read at start and on reload.

use std::path::Path;

use crate::helper::Daemon;

/// A user daemon on `units` with `--config settings`.
fn daemon(units: &Path, settings: &Path) -> Daemon {
    Daemon::start(
        &[
            "--user".as_ref(),
            "--no-bus".as_ref(),
            "--units".as_ref(),
            units.as_os_str(),
            "--config".as_ref(),
            settings.as_os_str(),
        ],
        &[],
    )
}

#[test]
fn auth_none_on_an_address_that_is_not_loopback_refuses_to_start_naming_the_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = dir.path().join("mcpd.kdl");
    std::fs::write(
        &settings,
        "http {\n    listen \"127.0.0.1:0\"\n    listen \"0.0.0.0:0\"\n    auth \"none\"\n}\n",
    )
    .expect("write");
    let d = daemon(dir.path(), &settings);
    let (status, lines) = d.stop_logged(rustix::process::Signal::CONT);
    assert!(!status.success(), "{lines:?}");
    let want = format!(
        "{}:3:12: `auth \"none\"` with `listen` 0.0.0.0:0, which is not loopback",
        settings.display()
    );
    assert!(lines.iter().any(|l| l.contains(&want)), "{lines:#?}");

    // A named file must exist.
    let d = daemon(dir.path(), &dir.path().join("missing.kdl"));
    let (status, lines) = d.stop_logged(rustix::process::Signal::CONT);
    assert!(!status.success(), "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("missing.kdl: cannot read settings file")),
        "{lines:#?}"
    );
}

#[test]
fn a_settings_file_that_breaks_keeps_the_last_good_settings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let units = tempfile::tempdir().expect("tempdir");
    let settings = dir.path().join("mcpd.kdl");
    std::fs::write(&settings, "http {\n    listen \"127.0.0.1:0\"\n}\n").expect("write");
    let mut d = daemon(units.path(), &settings);
    d.wait_for("HTTP endpoint on 127.0.0.1:0, auth token, at most 256 sessions");
    d.wait_for("started 0 units");
    std::fs::write(&settings, "http {\n    max-sesions 3\n}\n").expect("write");
    let line = d.wait_for("keeping the last good settings");
    assert!(
        line.contains(&format!(
            "{}:2:5: unknown key `max-sesions` in `http`",
            settings.display()
        )),
        "{line}"
    );
    std::fs::write(
        &settings,
        "http {\n    listen \"127.0.0.1:0\"\n    max-sessions 3\n}\n",
    )
    .expect("write");
    d.wait_for("HTTP endpoint on 127.0.0.1:0, auth token, at most 3 sessions");
}
