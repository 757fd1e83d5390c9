//! Search path precedence, drop-ins across directories, masking, and the
//! `--units` override, on real directories.

use std::fs;
use std::path::{Path, PathBuf};

use mcpd::unit::{self, Found};

use rustix::process::Signal;

use crate::helper::Daemon;

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, text).expect("write");
}

fn unit_text(description: &str) -> String {
    format!("description \"{description}\"\nstdio {{\n    command \"/bin/cat\"\n}}\n")
}

fn description(found: &Found) -> String {
    unit::load(&found.files)
        .expect("valid")
        .description()
        .unwrap_or_default()
        .to_owned()
}

/// Three directories, highest priority first.
fn three_dirs() -> (tempfile::TempDir, Vec<PathBuf>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dirs = ["etc", "run", "lib"]
        .iter()
        .map(|d| tmp.path().join(d))
        .collect();
    (tmp, dirs)
}

#[test]
fn earlier_directories_win_for_the_same_name() {
    let (_tmp, dirs) = three_dirs();
    write(&dirs[0].join("a.kdl"), &unit_text("a from etc"));
    write(&dirs[2].join("a.kdl"), &unit_text("a from lib"));
    write(&dirs[1].join("b.kdl"), &unit_text("b from run"));
    write(&dirs[2].join("b.kdl"), &unit_text("b from lib"));
    write(&dirs[2].join("c.kdl"), &unit_text("c from lib"));
    // not units: wrong suffix, hidden, editor backups
    write(&dirs[0].join("d.kdl~"), "junk");
    write(&dirs[0].join(".e.kdl"), "junk");
    write(&dirs[0].join("notes.txt"), "junk");
    let (found, errors) = unit::discover(&dirs);
    assert!(errors.is_empty(), "{errors:?}");
    let got: Vec<(String, String)> = found
        .iter()
        .map(|f| (f.name.clone(), description(f)))
        .collect();
    assert_eq!(
        got,
        [
            ("a".into(), "a from etc".into()),
            ("b".into(), "b from run".into()),
            ("c".into(), "c from lib".into()),
        ]
    );
    assert_eq!(found[0].files.main, dirs[0].join("a.kdl"));
}

#[test]
fn drop_ins_come_from_every_directory_in_lexical_order() {
    let (_tmp, dirs) = three_dirs();
    write(&dirs[2].join("a.kdl"), &unit_text("base"));
    // same drop-in name: the higher-priority directory's copy wins
    write(
        &dirs[2].join("a.kdl.d/10-desc.kdl"),
        "description \"lib 10\"\n",
    );
    write(
        &dirs[0].join("a.kdl.d/10-desc.kdl"),
        "description \"etc 10\"\n",
    );
    // a later name applies later, whatever its directory
    write(
        &dirs[1].join("a.kdl.d/20-attempts.kdl"),
        "reconnect {\n    max-attempts 2\n}\n",
    );
    write(
        &dirs[2].join("a.kdl.d/05-early.kdl"),
        "description \"lib 05\"\nstop-timeout \"2s\"\n",
    );
    let (found, _) = unit::discover(&dirs);
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].files.dropins,
        [
            dirs[2].join("a.kdl.d/05-early.kdl"),
            dirs[0].join("a.kdl.d/10-desc.kdl"),
            dirs[1].join("a.kdl.d/20-attempts.kdl"),
        ]
    );
    let spec = unit::load(&found[0].files).expect("valid");
    assert_eq!(spec.description(), Some("etc 10"));
    assert_eq!(spec.reconnect().max_attempts(), 2);
    assert_eq!(spec.stop_timeout().as_secs(), 2);
}

#[test]
fn a_dev_null_symlink_masks_a_unit_or_a_drop_in() {
    let (_tmp, dirs) = three_dirs();
    write(&dirs[2].join("a.kdl"), &unit_text("a"));
    write(&dirs[2].join("b.kdl"), &unit_text("b"));
    write(
        &dirs[2].join("b.kdl.d/10-x.kdl"),
        "description \"from drop-in\"\n",
    );
    fs::create_dir_all(&dirs[0]).expect("mkdir");
    std::os::unix::fs::symlink("/dev/null", dirs[0].join("a.kdl")).expect("symlink");
    fs::create_dir_all(dirs[0].join("b.kdl.d")).expect("mkdir");
    std::os::unix::fs::symlink("/dev/null", dirs[0].join("b.kdl.d/10-x.kdl")).expect("symlink");
    let (found, _) = unit::discover(&dirs);
    let a = found.iter().find(|f| f.name == "a").expect("a listed");
    assert!(a.masked);
    let b = found.iter().find(|f| f.name == "b").expect("b listed");
    assert!(!b.masked);
    assert!(b.files.dropins.is_empty(), "{:?}", b.files.dropins);
    assert_eq!(description(b), "b");
}

#[test]
fn drop_in_directory_without_a_unit_is_not_a_unit() {
    let (_tmp, dirs) = three_dirs();
    write(&dirs[0].join("ghost.kdl.d/10-x.kdl"), "description \"x\"\n");
    let (found, errors) = unit::discover(&dirs);
    assert!(
        found.is_empty() && errors.is_empty(),
        "{found:?} {errors:?}"
    );
}

#[test]
fn unreadable_search_directory_is_reported_missing_one_is_not() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("not-a-dir");
    write(&file, "x");
    let (_, errors) = unit::discover(&[tmp.path().join("missing"), file.clone()]);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, file);
}

#[test]
fn mcpd_units_flag_replaces_the_search_path() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = tmp.path().join("config");
    let explicit = tmp.path().join("explicit");
    write(&config.join("mcpd/units/from-xdg.kdl"), &unit_text("xdg"));
    write(&explicit.join("from-flag.kdl"), &unit_text("flag"));
    let env = [
        ("HOME", tmp.path().as_os_str()),
        ("XDG_CONFIG_HOME", config.as_os_str()),
        ("XDG_DATA_HOME", tmp.path().as_os_str()),
        ("XDG_RUNTIME_DIR", tmp.path().as_os_str()),
    ];

    let mut default_path = Daemon::start(&["--user".as_ref()], &env);
    let starting = default_path.wait_for("starting: user instance");
    assert!(
        starting.contains(&config.join("mcpd/units").display().to_string()),
        "{starting}"
    );
    // (the two lines come in either order)
    default_path.wait_until("from-xdg started", |d| {
        d.count("started 1 unit (0 invalid)") == 1 && d.count("starting mcpd_server=from-xdg") == 1
    });
    assert!(default_path.stop(Signal::TERM).success());

    let mut overridden = Daemon::start(
        &["--user".as_ref(), "--units".as_ref(), explicit.as_os_str()],
        &env,
    );
    let starting = overridden.wait_for("starting: user instance");
    assert!(
        starting.ends_with(&format!("units from {}", explicit.display())),
        "{starting}"
    );
    overridden.wait_until("from-flag started", |d| {
        d.count("started 1 unit (0 invalid)") == 1 && d.count("starting mcpd_server=from-flag") == 1
    });
    let seen = overridden.seen.join("\n");
    assert!(!seen.contains("from-xdg"), "{seen}");
    assert!(overridden.stop(Signal::TERM).success());
}
