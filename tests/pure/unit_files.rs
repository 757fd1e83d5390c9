//! Data-driven unit file cases: `tests/data/units/{good,bad}/*.kdl`.
//!
//! Each good file has `NAME.spec`, the debug form of the loaded spec; each bad
//! file has `NAME.expected`, the full diagnostic report `mcpctl verify`
//! prints. Adding a case is adding a file (`--features update-snapshots`
//! writes its snapshot: see [`Snapshot`]).

use std::path::{Path, PathBuf};

use mcpd::unit::{self, Style, UnitFiles};

use crate::helper::{Snapshot, check_snapshot, snapshot_mode};

fn cases(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new("tests/data/units").join(dir);
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "kdl"))
        .collect();
    out.sort();
    out
}

#[test]
fn good_units_load_to_their_snapshot() {
    good_units(snapshot_mode());
}

#[test]
fn bad_units_report_their_snapshot() {
    bad_units(snapshot_mode());
}

fn good_units(mode: Snapshot) {
    let mut failures = Vec::new();
    let good = cases("good");
    assert!(good.len() >= 5, "good cases missing");
    for path in good {
        match unit::load(&UnitFiles::beside(&path)) {
            Ok(spec) => {
                if let Some(diff) =
                    check_snapshot(mode, &path.with_extension("spec"), &format!("{spec:#?}\n"))
                {
                    failures.push(diff);
                }
            }
            Err(e) => failures.push(format!(
                "{} should load:\n{}",
                path.display(),
                e.render(Style::Plain)
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn bad_units(mode: Snapshot) {
    let mut failures = Vec::new();
    let bad = cases("bad");
    assert!(bad.len() >= 30, "only {} bad cases", bad.len());
    for path in bad {
        match unit::load(&UnitFiles::beside(&path)) {
            Ok(spec) => failures.push(format!(
                "{} should be rejected, loaded {spec:?}",
                path.display()
            )),
            Err(e) => {
                let report = e.render(Style::Plain);
                // Every problem names its file, and a line:col where it has one.
                for problem in e.problems() {
                    assert!(
                        problem.path().starts_with("tests/data/units/bad"),
                        "{}: problem names {}",
                        path.display(),
                        problem.path().display()
                    );
                }
                if let Some(diff) = check_snapshot(mode, &path.with_extension("expected"), &report)
                {
                    failures.push(diff);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn load_bad(name: &str) -> unit::LoadError {
    let path = Path::new("tests/data/units/bad").join(format!("{name}.kdl"));
    unit::load(&UnitFiles::beside(&path)).expect_err("bad case must be rejected")
}

#[test]
fn all_errors_of_a_file_are_reported_at_once() {
    let e = load_bad("many-errors");
    let lines: Vec<String> = e.to_string().lines().map(str::to_owned).collect();
    assert_eq!(
        lines,
        [
            "tests/data/units/bad/many-errors.kdl:1:1: unknown key `descripton` at the top level",
            "tests/data/units/bad/many-errors.kdl:3:13: `stdio.command`: program \"relative/server\" must be an absolute path or a bare name looked up in PATH",
            "tests/data/units/bad/many-errors.kdl:4:9: `stdio.env LIVES-9`: \"LIVES-9\" is not a valid environment variable name",
            "tests/data/units/bad/many-errors.kdl:7:13: `reconnect.enabled`: expected #true or #false, found string \"no\"",
            "tests/data/units/bad/many-errors.kdl:8:18: `reconnect.max-attempts` must be between 1 and 4294967295, got 0",
            "tests/data/units/bad/many-errors.kdl:10:14: `stop-timeout`: expected a duration string, found integer 5",
        ]
    );
}

#[test]
fn errors_in_drop_ins_name_the_drop_in() {
    let e = load_bad("dropin-broken");
    assert_eq!(
        e.problems()[0].path(),
        Path::new("tests/data/units/bad/dropin-broken.kdl.d/20-broken.kdl")
    );
    let e = load_bad("dropin-adds-http");
    assert_eq!(
        e.to_string(),
        "tests/data/units/bad/dropin-adds-http.kdl.d/10-http.kdl:1:1: a unit has exactly one transport, but both `stdio` and `http` are given"
    );
}

#[test]
fn kdl1_files_are_recognised() {
    for name in ["kdl1-boolean", "kdl1-raw-string"] {
        let e = load_bad(name);
        assert!(e.to_string().contains("looks like KDL 1"), "{name}: {e}");
    }
}

#[test]
fn unknown_keys_get_a_suggestion() {
    let report = load_bad("unknown-key-typo").render(Style::Plain);
    assert!(report.contains("did you mean `description`?"), "{report}");
    let report = load_bad("misplaced-key").render(Style::Plain);
    assert!(
        report.contains("`max-attempts` belongs in the `reconnect` block"),
        "{report}"
    );
}

#[test]
fn header_values_never_appear_in_errors_or_specs() {
    let e = load_bad("header-control-char");
    assert!(!e.to_string().contains("secret"), "{e}");
    let spec = unit::load(&UnitFiles::beside(Path::new(
        "tests/data/units/good/http.kdl",
    )))
    .expect("valid");
    assert!(!format!("{spec:?}").contains("not-shown-anywhere"));
}

#[test]
fn drop_ins_merge_in_order() {
    let spec = unit::load(&UnitFiles::beside(Path::new(
        "tests/data/units/good/dropin-override.kdl",
    )))
    .expect("valid");
    assert_eq!(spec.description(), Some("overridden"));
    assert_eq!(spec.reconnect().max_attempts(), 3);
    assert_eq!(spec.stop_timeout().as_millis(), 1000);
    let unit::Transport::Stdio(stdio) = spec.transport() else {
        panic!("stdio unit");
    };
    assert_eq!(stdio.program(), "/usr/bin/other");
    assert_eq!(stdio.args(), ["--dropin"]);
    let env: Vec<(&str, &str)> = stdio
        .env()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(env, [("A", "base"), ("B", "dropin"), ("C", "dropin")]);
    assert_eq!(stdio.pass_env(), ["HOME_PROXY", "EXTRA"]);
}

#[test]
fn url_credentials_are_rejected_without_being_shown() {
    let e = load_bad("http-url-credentials");
    assert!(e.to_string().contains("contains credentials"), "{e}");
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

#[test]
fn a_user_instance_only_runs_servers_as_its_own_user() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, user: &str| {
        let path = tmp.path().join(format!("{name}.kdl"));
        std::fs::write(
            &path,
            format!("stdio {{\n    command \"/bin/cat\"\n    user \"{user}\"\n}}\n"),
        )
        .expect("write");
        UnitFiles::beside(&path)
    };
    let user_instance = unit::Context {
        instance: Some(unit::Instance::User),
        own_user: Some((1000, Some("alice".into()))),
    };
    let other = write("other", "bob");
    let e = unit::load_in(&other, &user_instance).expect_err("bob is not us");
    assert_eq!(
        e.to_string(),
        format!(
            "{}:3:10: `stdio.user`: a user instance runs every server as its own user (alice), not \"bob\"",
            other.main.display()
        )
    );
    for own in ["alice", "1000"] {
        assert!(
            unit::load_in(&write(own, own), &user_instance).is_ok(),
            "{own}"
        );
    }
    let system = unit::Context {
        instance: Some(unit::Instance::System),
        own_user: Some((0, Some("root".into()))),
    };
    assert!(unit::load_in(&other, &system).is_ok());
    assert!(
        unit::load(&other).is_ok(),
        "without an instance only file rules apply"
    );
}

#[test]
fn oauth_blocks_load_with_their_keys() {
    use mcpd::unit::{Grant, OAuthSpec, Transport};
    let load = |name: &str| {
        let path = Path::new("tests/data/units/oauth").join(format!("{name}.kdl"));
        let spec = unit::load(&UnitFiles::beside(&path))
            .unwrap_or_else(|e| panic!("{name}: {}", e.render(Style::Plain)));
        match spec.transport() {
            Transport::Http(http) => http.oauth().cloned().expect("an oauth block"),
            Transport::Stdio(_) => panic!("{name} is an http unit"),
        }
    };
    assert_eq!(
        load("oauth"),
        OAuthSpec {
            client_id: Some("mcpd-linear".into()),
            client_secret: Some("linear".into()),
            scope: Some("read write".into()),
            redirect_port: Some(3118),
            grant: Grant::AuthorizationCode,
        }
    );
    assert_eq!(load("oauth-discovered"), OAuthSpec::default());
}
