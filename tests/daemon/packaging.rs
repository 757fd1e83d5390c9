//! The Debian package: its contents, where they land, the systemd units and
//! the D-Bus policy, and the installed daemon behind a bus that uses the
//! shipped policy.

use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::process::Signal;

use crate::helper::{Bus, Daemon, root, run};

/// Builds the .deb from the test build's binaries; returns (deb, scratch root).
fn build_and_extract(tmp: &Path) -> (PathBuf, PathBuf) {
    let bins = Path::new(env!("CARGO_BIN_EXE_mcpd"))
        .parent()
        .expect("bin dir");
    let out = run(Command::new(root().join("packaging/debian/build-deb"))
        .env("MCPD_BIN_DIR", bins)
        // fast compression: the test binaries are large debug builds
        .env("DEB_COMPRESS", "gzip")
        .env("DEB_LEVEL", "1")
        .env("OUT", tmp));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deb = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let scratch = tmp.join("root");
    let x = run(Command::new("dpkg").arg("-x").arg(&deb).arg(&scratch));
    assert!(x.status.success(), "{}", String::from_utf8_lossy(&x.stderr));
    (deb, scratch)
}

const FILES: &[&str] = &[
    "usr/bin/mcpd",
    "usr/bin/mcpctl",
    "usr/share/man/man1/mcpctl.1.gz",
    "usr/share/man/man5/mcpd.kdl.5.gz",
    "usr/share/man/man5/mcpd.unit.5.gz",
    "usr/share/man/man5/org.mcpd1.5.gz",
    "usr/share/man/man8/mcpd.8.gz",
    "usr/lib/systemd/system/mcpd.service",
    "usr/lib/systemd/user/mcpd.service",
    "usr/lib/systemd/system/mcpd-http.socket",
    "usr/lib/systemd/user/mcpd-http.socket",
    "usr/share/dbus-1/system.d/org.mcpd1.conf",
    "usr/share/dbus-1/services/org.mcpd1.service",
    "usr/share/dbus-1/system-services/org.mcpd1.service",
    "usr/lib/sysusers.d/mcpd.conf",
    "usr/share/bash-completion/completions/mcpctl",
    "usr/share/zsh/vendor-completions/_mcpctl",
    "usr/share/fish/vendor_completions.d/mcpctl.fish",
    "etc/mcpd/units/README",
    "usr/share/doc/mcpd/examples/units/github.kdl",
];

/// `systemd-analyze verify` of a shipped unit, with ExecStart pointing at
/// the extracted binary (verify insists the program exists); any output is
/// a finding.
fn verify_unit(scratch: &Path, unit: &str, user: bool, tmp: &Path) {
    let dir = tmp.join(if user { "verify-user" } else { "verify-system" });
    std::fs::create_dir_all(&dir).expect("mkdir");
    let binary = scratch.join("usr/bin/mcpd");
    // The unit, and beside it the service (a socket names it).
    let service = Path::new(unit).with_file_name("mcpd.service");
    let mut copy = dir.clone();
    for file in [service.as_path(), Path::new(unit)] {
        let text = std::fs::read_to_string(scratch.join(file)).expect("unit");
        copy = dir.join(file.file_name().expect("a file name"));
        std::fs::write(
            &copy,
            text.replace("/usr/bin/mcpd", &binary.display().to_string()),
        )
        .expect("write");
    }
    let mut cmd = Command::new("systemd-analyze");
    if user {
        cmd.arg("--user").env("XDG_RUNTIME_DIR", &dir);
    }
    let out = run(cmd.args(["verify", "--man=no"]).arg(&copy));
    let report =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && report.trim().is_empty(),
        "{unit}:\n{report}"
    );
}

#[test]
fn the_deb_carries_every_file_to_its_place() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (deb, scratch) = build_and_extract(tmp.path());
    let listing = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    let listing = String::from_utf8_lossy(&listing.stdout);
    for file in FILES {
        assert!(
            listing.contains(&format!("./{file}\n")),
            "{file} is not in the package:\n{listing}"
        );
        let path = scratch.join(file);
        let meta = std::fs::metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(meta.len() > 0, "{file} is empty");
    }
    assert!(
        !listing.contains("mcp-fixture"),
        "the test fixture is never packaged"
    );
    let info = run(Command::new("dpkg-deb")
        .arg("-f")
        .arg(&deb)
        .args(["Package", "Version"]));
    assert_eq!(
        String::from_utf8_lossy(&info.stdout),
        format!("Package: mcpd\nVersion: {}\n", env!("CARGO_PKG_VERSION"))
    );

    verify_unit(
        &scratch,
        "usr/lib/systemd/system/mcpd.service",
        false,
        tmp.path(),
    );
    verify_unit(
        &scratch,
        "usr/lib/systemd/user/mcpd.service",
        true,
        tmp.path(),
    );
    for (socket, user) in [
        ("usr/lib/systemd/system/mcpd-http.socket", false),
        ("usr/lib/systemd/user/mcpd-http.socket", true),
    ] {
        verify_unit(&scratch, socket, user, tmp.path());
    }
    let xml = run(Command::new("xmllint")
        .arg("--noout")
        .arg(scratch.join("usr/share/dbus-1/system.d/org.mcpd1.conf")));
    assert!(
        xml.status.success(),
        "{}",
        String::from_utf8_lossy(&xml.stderr)
    );
}

/// A group `mcpd` and a user in it, for the access test (created if missing).
fn ensure_member() -> &'static str {
    let name = "mcpd-tester";
    let _ = run(Command::new("groupadd").args(["-f", "--system", "mcpd"]));
    if nix::unistd::User::from_name(name).ok().flatten().is_none() {
        let out = run(Command::new("useradd").args([
            "--system",
            "-M",
            "-N",
            "-g",
            "nogroup",
            "-G",
            "mcpd",
            "-s",
            "/usr/sbin/nologin",
            name,
        ]));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    name
}

#[test]
fn the_installed_daemon_obeys_the_shipped_bus_policy() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test installs a group and runs clients as other users; it needs root (CI runs as root)"
    );
    let member = ensure_member();
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_, scratch) = build_and_extract(tmp.path());
    // A system-like bus: method calls denied unless a policy allows them,
    // plus the shipped policy.
    let config = tmp.path().join("system-bus.conf");
    std::fs::write(
        &config,
        format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:tmpdir=/tmp</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow send_destination="org.freedesktop.DBus"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
  </policy>
  <include>{}</include>
</busconfig>
"#,
            scratch
                .join("usr/share/dbus-1/system.d/org.mcpd1.conf")
                .display()
        ),
    )
    .expect("write bus config");
    let bus = Bus::start_with(&config);
    let address = bus.address.clone();

    let units = tmp.path().join("units");
    std::fs::create_dir(&units).expect("mkdir");
    std::fs::copy(root().join("units/demo/demo.kdl"), units.join("demo.kdl")).expect("copy");
    let runtime = tmp.path().join("run");
    let installed = scratch.join("usr/bin/mcpd");
    let mut d = Daemon::start_binary(
        &installed,
        &["--system".as_ref(), "--units".as_ref(), units.as_os_str()],
        &[
            ("DBUS_SYSTEM_BUS_ADDRESS", address.as_ref()),
            ("MCPD_RUNTIME_DIR", runtime.as_os_str()),
        ],
    );
    d.wait_for("serving org.mcpd1 on the system bus");
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    let first = d.latest_pid("demo").expect("pid");

    let gdbus_as = |user: &str, args: &[&str]| {
        run(Command::new("setpriv")
            .arg(format!("--reuid={user}"))
            .arg("--regid=nogroup")
            .arg("--init-groups")
            .args([
                "gdbus",
                "call",
                "--address",
                &address,
                "--dest",
                "org.mcpd1",
            ])
            .args(args))
    };
    // outside group mcpd: reading works, restarting does not
    let read = gdbus_as(
        "nobody",
        &[
            "--object-path",
            "/org/mcpd1/server/demo",
            "--method",
            "org.freedesktop.DBus.Properties.Get",
            "org.mcpd1.Server",
            "State",
        ],
    );
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let denied = gdbus_as(
        "nobody",
        &[
            "--object-path",
            "/org/mcpd1",
            "--method",
            "org.mcpd1.Manager.Restart",
            "demo",
        ],
    );
    assert!(!denied.status.success());
    assert!(
        String::from_utf8_lossy(&denied.stderr).contains("AccessDenied"),
        "{}",
        String::from_utf8_lossy(&denied.stderr)
    );
    // a member of group mcpd may
    let allowed = gdbus_as(
        member,
        &[
            "--object-path",
            "/org/mcpd1",
            "--method",
            "org.mcpd1.Manager.Restart",
            "demo",
        ],
    );
    assert!(
        allowed.status.success(),
        "{}",
        String::from_utf8_lossy(&allowed.stderr)
    );
    d.wait_until("restarted", |d| {
        d.latest_pid("demo").is_some_and(|p| p != first)
    });
    assert!(d.stop(Signal::TERM).success());
    drop(bus);
}

#[test]
fn the_package_is_lintian_clean() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let bins = Path::new(env!("CARGO_BIN_EXE_mcpd"))
        .parent()
        .expect("bin dir");
    let out = run(Command::new(root().join("packaging/debian/build-deb"))
        .env("MCPD_BIN_DIR", bins)
        .env("DEB_COMPRESS", "gzip")
        .env("DEB_LEVEL", "1")
        .env("DEB_MAINTAINER", "Jane Doe <jane@example.org>")
        .env("OUT", tmp.path()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deb = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    // lintian is installed by .ci/run; every tag it prints is a finding.
    let lint = run(Command::new("lintian").arg(&deb));
    let said = String::from_utf8_lossy(&lint.stdout);
    assert!(
        lint.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&lint.stderr)
    );
    assert!(said.trim().is_empty(), "{said}");
}
