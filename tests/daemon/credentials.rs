//! Credentials (DESIGN §16) with the real daemon: what a server finds in
//! `$CREDENTIALS_DIRECTORY` and its environment, when the directory goes,
//! how a start fails closed naming the credential, the sandbox's grant,
//! HTTP headers from a credential, and that no value is ever shown.

use std::path::{Path, PathBuf};

use crate::helper::{
    BOUND, Daemon, alive, env_of, eventually, fixture_path, mcpctl_user, probe as call,
};

/// A value no other text of a test contains.
const SECRET: &str = "tok-8f3a1c-credential-value";

/// A unit running the fixture with its probe tools, and `extra` lines.
fn unit(dir: &Path, name: &str, extra: &str) {
    std::fs::write(
        dir.join(format!("{name}.kdl")),
        format!(
            "stdio {{\n    command \"{}\" \"--chatter\" \"0\" \"--tools\" \"read,exec\"\n}}\nreconnect {{\n    initial-delay \"50ms\"\n    max-attempts 1\n}}\nstop-timeout \"1s\"\n{extra}\n",
            fixture_path().display()
        ),
    )
    .expect("write unit");
}

fn status(runtime: &Path, args: &[&str]) -> String {
    let mut all = vec!["status"];
    all.extend_from_slice(args);
    String::from_utf8_lossy(&mcpctl_user(runtime, &all).stdout).into_owned()
}

fn credentials_dir(runtime: &Path, server: &str) -> PathBuf {
    PathBuf::from(
        env_of(runtime, server)["CREDENTIALS_DIRECTORY"]
            .as_str()
            .expect("CREDENTIALS_DIRECTORY is set"),
    )
}

/// Every file below `dir` (symlinks not followed), except below `skip`.
fn files(dir: &Path, skip: &Path, out: &mut Vec<PathBuf>) {
    if dir == skip {
        return;
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => files(&path, skip, out),
            Ok(t) if t.is_file() => out.push(path),
            _ => {}
        }
    }
}

/// The credentials directories of `runtime`'s daemon.
fn delivered(runtime: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(runtime.join("mcpd/credentials"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn a_server_reads_its_credentials_as_files_and_only_env_puts_one_in_its_environment() {
    let secrets = tempfile::tempdir().expect("secrets");
    let tok = secrets.path().join("tok");
    std::fs::write(&tok, SECRET).expect("tok");
    let db = secrets.path().join("db");
    std::fs::create_dir(&db).expect("db");
    std::fs::write(db.join("password"), "db-pw-0f9e").expect("pw");
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    let state = tempfile::tempdir().expect("state");
    let load = format!(
        "    load \"tok\" \"{}\"\n    load \"db\" \"{}\"\n",
        tok.display(),
        db.display()
    );
    unit(units.path(), "filed", &format!("credentials {{\n{load}}}"));
    unit(
        units.path(),
        "inenv",
        // On demand: its lists go to the cache, its credentials never.
        &format!("credentials {{\n{load}    env \"API_TOKEN\" \"tok\"\n}}\nstart \"on-demand\""),
    );
    let mut d = Daemon::user_no_bus(
        units.path(),
        &[
            ("XDG_RUNTIME_DIR", runtime.path().as_os_str()),
            ("MCPD_STATE_DIR", state.path().as_os_str()),
        ],
    );
    let rt = runtime.path();
    for name in ["filed", "inenv"] {
        d.wait_until(&format!("{name} running"), |d| d.latest_pid(name).is_some());
    }

    let dir = credentials_dir(rt, "filed");
    assert!(
        dir.starts_with(rt.join("mcpd/credentials")),
        "{}",
        dir.display()
    );
    let at = |name: &str| dir.join(name).display().to_string();
    assert_eq!(
        call(rt, "filed", "exec", &format!("cat {}", at("tok"))),
        format!("exit status: 0 {SECRET}")
    );
    assert_eq!(
        call(rt, "filed", "exec", &format!("cat {}", at("db/password"))),
        "exit status: 0 db-pw-0f9e"
    );
    assert_eq!(
        call(
            rt,
            "filed",
            "exec",
            &format!("stat -c %a {} {} {}", at("tok"), at("db"), dir.display())
        ),
        "exit status: 0 400\n500\n500"
    );
    // A load-only credential is in no variable, not even through /proc.
    let env = env_of(rt, "filed");
    assert!(!env.to_string().contains(SECRET), "{env}");
    let pid = d.latest_pid("filed").expect("pid");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
    assert!(
        !String::from_utf8_lossy(&environ).contains(SECRET),
        "the value is in /proc/{pid}/environ"
    );
    // `env` puts it in the one variable asked, and no other.
    let env = env_of(rt, "inenv");
    assert_eq!(env["API_TOKEN"], SECRET);
    let holding: Vec<&String> = env
        .as_object()
        .expect("object")
        .iter()
        .filter(|(_, v)| v.as_str().is_some_and(|v| v.contains(SECRET)))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(holding, ["API_TOKEN"]);

    // Names and sizes are shown; the value nowhere.
    let shown = status(rt, &["filed"]);
    assert!(
        shown.contains(&format!(
            "Credentials: tok ({} B), db (1 file)",
            SECRET.len()
        )),
        "{shown}"
    );
    let json = status(rt, &["--json", "filed", "inenv"]);
    assert!(json.contains("tok ("), "{json}");
    let cat = String::from_utf8_lossy(&mcpctl_user(rt, &["cat", "inenv"]).stdout).into_owned();
    // Every D-Bus property of both servers, as a client reads them.
    let properties = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let mut all = String::new();
            for name in ["filed", "inenv"] {
                let (conn, _) = crate::helper::private_server(&rt.join("mcpd/private"), name).await;
                let props = zbus::fdo::PropertiesProxy::builder(&conn)
                    .destination("org.mcpd1")
                    .path(mcpd::dbus::server_path(name))
                    .build()
                    .await
                    .expect("proxy");
                let iface =
                    zbus::names::InterfaceName::try_from("org.mcpd1.Server").expect("interface");
                all += &format!("{:?}", props.get_all(iface).await.expect("GetAll"));
            }
            all
        });
    assert!(
        properties.contains(&format!("tok ({} B), db (1 file)", SECRET.len())),
        "{properties}"
    );
    for text in [&shown, &json, &cat, &properties, &d.seen.join("\n")] {
        assert!(
            !text.contains(SECRET) && !text.contains("db-pw-0f9e"),
            "{text}"
        );
    }
    // Neither in any file of the runtime or state directories but the
    // credentials' own.
    let cache = state.path().join("cache/inenv.json");
    eventually("the on-demand cache", BOUND, || cache.exists());
    let mut found = Vec::new();
    files(rt, &rt.join("mcpd/credentials"), &mut found);
    files(state.path(), Path::new("/nonexistent"), &mut found);
    for file in found {
        let text = String::from_utf8_lossy(&std::fs::read(&file).unwrap_or_default()).into_owned();
        assert!(!text.contains(SECRET), "{} holds the value", file.display());
    }
    // Said once when the runtime directory is not a tmpfs (as here, on
    // most test machines), never when it is.
    let tmpfs = rustix::fs::statfs(rt).is_ok_and(|s| {
        #[allow(clippy::useless_conversion)]
        let kind = i64::from(s.f_type);
        kind == 0x0102_1994
    });
    let warning = "which is not on a tmpfs: they may reach the disk";
    if !tmpfs && d.count(warning) == 0 {
        d.wait_for(warning);
    }
    assert_eq!(
        d.count(warning),
        usize::from(!tmpfs),
        "{}",
        d.seen.join("\n")
    );
    d.stop(rustix::process::Signal::TERM);
    assert!(delivered(rt).is_empty(), "{:?}", delivered(rt));
}

#[test]
fn the_directory_goes_with_its_generation_and_with_a_killed_daemon() {
    let (_secrets, creds) = loaded_secret();
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    unit(units.path(), "gen", &creds);
    let env = [("XDG_RUNTIME_DIR", runtime.path().as_os_str())];
    let rt = runtime.path();
    let mut d = Daemon::user_no_bus(units.path(), &env);
    d.wait_until("gen running", |d| d.latest_pid("gen").is_some());
    let first = credentials_dir(rt, "gen");
    assert!(first.join("tok").exists());

    // A crash: the next generation has a new directory, the old is gone.
    let pid = d.latest_pid("gen").expect("pid");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).expect("pid"),
        rustix::process::Signal::KILL,
    )
    .expect("kill");
    d.wait_until("gen restarted", |d| {
        d.latest_pid("gen").is_some_and(|p| p != pid)
    });
    eventually("the crashed generation's directory to go", BOUND, || {
        !first.exists()
    });
    let second = credentials_dir(rt, "gen");
    assert_ne!(first, second);
    assert!(second.join("tok").exists());
    assert_eq!(delivered(rt), std::slice::from_ref(&second));

    // Stop: gone.
    let out = mcpctl_user(rt, &["stop", "gen"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually("the stopped generation's directory to go", BOUND, || {
        !second.exists()
    });
    let out = mcpctl_user(rt, &["start", "gen"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually("a third directory", BOUND, || delivered(rt).len() == 1);
    let third = delivered(rt).remove(0);

    // A SIGKILLed daemon leaves it; the next daemon removes it at start.
    let server = d.latest_pid("gen").expect("pid");
    d.stop(rustix::process::Signal::KILL);
    assert!(third.exists(), "the killed daemon could not remove it");
    // The server dies with its daemon (PR_SET_PDEATHSIG); the instance
    // lock is free once every process that shared it is gone.
    eventually("the server to die with its daemon", BOUND, || {
        !alive(server)
    });
    eventually("the instance lock to be free", BOUND, || {
        std::fs::File::open(rt.join("mcpd/mcpd.lock")).is_ok_and(|f| {
            rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok()
        })
    });
    let mut d = Daemon::user_no_bus(units.path(), &env);
    d.wait_for("removed the servers' credentials an earlier daemon left");
    assert!(!third.exists());
    d.wait_until("gen running again", |d| d.latest_pid("gen").is_some());
    d.stop(rustix::process::Signal::TERM);
    assert!(delivered(rt).is_empty());
}

/// A directory holding [`SECRET`] as `tok`, and the `credentials` block
/// that loads it.
fn loaded_secret() -> (tempfile::TempDir, String) {
    let secrets = tempfile::tempdir().expect("secrets");
    let tok = secrets.path().join("tok");
    std::fs::write(&tok, SECRET).expect("tok");
    let block = format!("credentials {{\n    load \"tok\" \"{}\"\n}}", tok.display());
    (secrets, block)
}

/// The daemon's reason for `server` once it failed.
fn failed(d: &mut Daemon, rt: &Path, server: &str) -> String {
    d.wait_until(&format!("{server} failed"), |_| {
        status(rt, &[server]).contains("failed")
    });
    status(rt, &[server])
}

#[test]
fn a_credential_that_cannot_be_read_fails_the_start_naming_it_and_its_path() {
    let secrets = tempfile::tempdir().expect("secrets");
    let missing = secrets.path().join("missing");
    // Root reads any file whatever its mode; a socket cannot be read by anyone.
    let socket = secrets.path().join("socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("socket");
    let large = secrets.path().join("large");
    std::fs::write(&large, vec![b'x'; (1 << 20) + 1]).expect("large");
    let limit = secrets.path().join("limit");
    std::fs::write(&limit, vec![b'x'; 1 << 20]).expect("limit");
    // 17 files of 1 MiB: each allowed, together more than a unit may hold.
    let many = secrets.path().join("many");
    std::fs::create_dir(&many).expect("many");
    for i in 0..17 {
        std::fs::write(many.join(format!("f{i:02}")), vec![b'x'; 1 << 20]).expect("part");
    }
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    let rt = runtime.path();
    let load = |name: &str, path: &Path| {
        format!(
            "credentials {{\n    load \"{name}\" \"{}\"\n}}",
            path.display()
        )
    };
    unit(units.path(), "missing", &load("gone", &missing));
    unit(units.path(), "unreadable", &load("sock", &socket));
    unit(units.path(), "large", &load("big", &large));
    unit(units.path(), "limit", &load("exact", &limit));
    unit(units.path(), "total", &load("many", &many));
    unit(
        units.path(),
        "unimported",
        "credentials {\n    import \"nowhere.*\"\n    env \"X\" \"nowhere.x\"\n}",
    );
    let mut d = Daemon::user_no_bus(units.path(), &[("XDG_RUNTIME_DIR", rt.as_os_str())]);
    for (server, why) in [
        (
            "missing",
            format!(
                "credential gone: cannot read {}: No such file or directory",
                missing.display()
            ),
        ),
        (
            "unreadable",
            format!("credential sock: cannot read {}", socket.display()),
        ),
        (
            "large",
            format!("credential big: {} is larger than 1 MiB", large.display()),
        ),
        (
            "total",
            "credential many/f16: the unit's credentials pass 16 MiB together".into(),
        ),
        (
            "unimported",
            "X: credential nowhere.x: no `import` found it in ".into(),
        ),
    ] {
        let reason = failed(&mut d, rt, server);
        assert!(reason.contains(&why), "{server}: {reason}");
        // A start that failed was given nothing.
        assert!(!reason.contains("Credentials:"), "{server}: {reason}");
    }
    // Exactly 1 MiB is allowed.
    d.wait_until("limit running", |d| d.latest_pid("limit").is_some());
    assert!(
        status(rt, &["limit"]).contains("Credentials: exact (1048576 B)"),
        "{}",
        status(rt, &["limit"])
    );
    // A failed start leaves no directory behind.
    assert_eq!(delivered(rt).len(), 1, "{:?}", delivered(rt));
    d.stop(rustix::process::Signal::TERM);
}

/// A host key of the test's own for `systemd-creds`: the environment
/// (`SYSTEMD_CREDENTIAL_SECRET`, systemd's override of
/// `/var/lib/systemd/credential.secret`) that makes both the test's
/// `systemd-creds encrypt` and the daemon's `systemd-creds decrypt` use a
/// secret file in `dir` (made on first use), never the machine's. No TPM
/// needed; reading the key needs root, as CI runs.
fn host_key(dir: &Path) -> (&'static str, std::ffi::OsString) {
    (
        "SYSTEMD_CREDENTIAL_SECRET",
        dir.join("credential.secret").into_os_string(),
    )
}

/// Seals `value` as credential `name` into `out` with the host key `key`
/// ([`host_key`]), as an operator's `systemd-creds encrypt` does; panics
/// (with systemd-creds' reason) if it cannot: the tests that use it do not
/// skip.
fn encrypt(key: &(&str, std::ffi::OsString), name: &str, value: &str, out: &Path) {
    use std::io::Write as _;
    let mut child = std::process::Command::new("systemd-creds")
        .args(["encrypt", "--with-key=host", &format!("--name={name}"), "-"])
        .arg(out)
        .env(key.0, &key.1)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("systemd-creds (CI installs systemd)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(value.as_bytes())
        .expect("write to systemd-creds");
    let done = child.wait_with_output().expect("systemd-creds encrypt");
    assert!(
        done.status.success(),
        "systemd-creds encrypt --with-key=host failed ({}): {}",
        done.status,
        String::from_utf8_lossy(&done.stderr)
    );
}

#[test]
fn an_encrypted_credential_is_decrypted_at_start_and_a_corrupted_one_fails_it() {
    assert!(
        rustix::process::geteuid().is_root(),
        "systemd-creds reads the host key as root only (CI runs as root)"
    );
    let secrets = tempfile::tempdir().expect("secrets");
    let key = host_key(secrets.path());
    let good = secrets.path().join("api.cred");
    let corrupt = secrets.path().join("bad.cred");
    encrypt(&key, "api", SECRET, &good);
    encrypt(&key, "bad", SECRET, &corrupt);
    // Flip bytes in the middle: the authentication tag no longer holds.
    let mut bytes = std::fs::read(&corrupt).expect("cred");
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 8] {
        *b = if *b == b'A' { b'B' } else { b'A' };
    }
    std::fs::write(&corrupt, bytes).expect("corrupt");
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    let rt = runtime.path();
    let load = |name: &str, path: &Path| {
        format!(
            "credentials {{\n    load-encrypted \"{name}\" \"{}\"\n    env \"API\" \"{name}\"\n}}",
            path.display()
        )
    };
    unit(units.path(), "corrupt", &load("bad", &corrupt));
    unit(units.path(), "sealed", &load("api", &good));
    let mut d = Daemon::user_no_bus(
        units.path(),
        &[("XDG_RUNTIME_DIR", rt.as_os_str()), (key.0, &key.1)],
    );
    let reason = failed(&mut d, rt, "corrupt");
    assert!(
        reason.contains(&format!(
            "credential bad: cannot decrypt {}: systemd-creds decrypt failed",
            corrupt.display()
        )),
        "{reason}"
    );
    d.wait_until("sealed running", |d| d.latest_pid("sealed").is_some());
    let dir = credentials_dir(rt, "sealed");
    assert_eq!(
        call(
            rt,
            "sealed",
            "exec",
            &format!("cat {}", dir.join("api").display())
        ),
        format!("exit status: 0 {SECRET}")
    );
    assert_eq!(env_of(rt, "sealed")["API"], SECRET);
    d.stop(rustix::process::Signal::TERM);
}

#[test]
fn a_systemd_creds_that_hangs_is_killed_at_startup_timeout_and_fails_the_start() {
    use std::os::unix::fs::PermissionsExt;
    // A systemd-creds that never answers (a TPM that does not): the
    // daemon's PATH finds it first.
    let bin = tempfile::tempdir().expect("bin");
    let pids = bin.path().join("pids");
    let fake = bin.path().join("systemd-creds");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho $$ >> {}\nexec sleep 1000\n",
            pids.display()
        ),
    )
    .expect("fake");
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let secrets = tempfile::tempdir().expect("secrets");
    let sealed = secrets.path().join("api.cred");
    std::fs::write(&sealed, "sealed").expect("cred");
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    let rt = runtime.path();
    unit(
        units.path(),
        "hung",
        &format!(
            "startup-timeout \"1s\"\ncredentials {{\n    load-encrypted \"api\" \"{}\"\n}}",
            sealed.display()
        ),
    );
    unit(units.path(), "beside", "");
    let mut d = Daemon::user_no_bus(
        units.path(),
        &[
            ("XDG_RUNTIME_DIR", rt.as_os_str()),
            ("PATH", std::ffi::OsStr::new(&path)),
        ],
    );
    let reason = failed(&mut d, rt, "hung");
    assert!(
        reason.contains(&format!(
            "credential api: cannot decrypt {}: systemd-creds --user decrypt did not finish within 1s (startup-timeout); killed",
            sealed.display()
        )) || reason.contains(&format!(
            "credential api: cannot decrypt {}: systemd-creds decrypt did not finish within 1s (startup-timeout); killed",
            sealed.display()
        )),
        "{reason}"
    );
    // Each attempt's systemd-creds was killed, none left behind.
    let started: Vec<u32> = std::fs::read_to_string(&pids)
        .expect("pids")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert!(!started.is_empty());
    eventually("every systemd-creds gone", BOUND, || {
        started.iter().all(|p| !alive(*p))
    });
    // The unit beside it started, and the daemon answers.
    d.wait_until("beside running", |d| d.latest_pid("beside").is_some());
    assert!(status(rt, &["beside"]).contains("running"));
    d.stop(rustix::process::Signal::TERM);
}

#[test]
fn a_sandboxed_server_reads_its_credentials_and_nothing_else_of_the_runtime_directory() {
    let (_secrets, creds) = loaded_secret();
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    let rt = runtime.path();
    unit(
        units.path(),
        "boxed",
        &format!("{creds}\nsandbox {{\n    network \"none\"\n}}"),
    );
    unit(units.path(), "other", &creds);
    let mut d = Daemon::user_no_bus(units.path(), &[("XDG_RUNTIME_DIR", rt.as_os_str())]);
    for name in ["boxed", "other"] {
        d.wait_until(&format!("{name} running"), |d| d.latest_pid(name).is_some());
    }
    let mine = credentials_dir(rt, "boxed");
    let theirs = credentials_dir(rt, "other");
    assert_eq!(
        call(rt, "boxed", "read", &mine.join("tok").display().to_string()),
        format!("ok {} bytes", SECRET.len())
    );
    // What the unsandboxed server reads, the sandboxed one cannot.
    for path in [
        theirs.join("tok"),
        rt.join("mcpd/mcpd.lock"),
        rt.join("mcpd/credentials"),
    ] {
        let path = path.display().to_string();
        let open = call(rt, "other", "read", &path);
        assert!(
            open.starts_with("ok") || open.contains("Is a directory"),
            "{path}: {open}"
        );
        let boxed = call(rt, "boxed", "read", &path);
        assert!(
            boxed.starts_with("error: Permission denied"),
            "{path}: {boxed}"
        );
    }
    d.stop(rustix::process::Signal::TERM);
}

#[test]
fn an_http_header_takes_its_credential_at_each_connect() {
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
    let secrets = tempfile::tempdir().expect("secrets");
    let tok = secrets.path().join("gh");
    std::fs::write(&tok, format!("{SECRET}\n")).expect("tok");
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    let rt = runtime.path();
    std::fs::write(
        units.path().join("remote.kdl"),
        format!(
            "http \"http://127.0.0.1:{port}/mcp\" {{\n    header \"Authorization\" credential=\"gh\" format=\"Bearer {{}}\"\n}}\ncredentials {{\n    load \"gh\" \"{}\"\n}}\nreconnect {{\n    initial-delay \"50ms\"\n    max-attempts 100\n}}\n",
            tok.display()
        ),
    )
    .expect("unit");
    let mut d = Daemon::user_no_bus(units.path(), &[("XDG_RUNTIME_DIR", rt.as_os_str())]);
    d.wait_until("remote running", |_| {
        status(rt, &["remote"]).contains("running")
    });
    assert!(
        status(rt, &["remote"]).contains(&format!("Credentials: gh ({} B)", SECRET.len() + 1)),
        "{}",
        status(rt, &["remote"])
    );
    // Read again at the next connect: a changed file is a refused token.
    std::fs::write(&tok, "another-token\n").expect("tok");
    let out = mcpctl_user(rt, &["restart", "remote"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    d.wait_until("remote refused", |_| {
        status(rt, &["remote"]).contains("401")
    });
    let shown = status(rt, &["remote"]);
    assert!(
        !shown.contains("another-token") && !shown.contains(SECRET),
        "{shown}"
    );
    assert!(!d.seen.join("\n").contains(SECRET));
    d.stop(rustix::process::Signal::TERM);
    let _ = server.kill();
    let _ = server.wait();
}

/// `mcpctl --user credential ARGS` with `config` as XDG_CONFIG_HOME and
/// `input` on standard input.
fn credential(config: &Path, args: &[&str], input: &str) -> std::process::Output {
    use std::io::Write as _;
    let mut child = crate::helper::mcpctl()
        .args(["--user", "credential"])
        .args(args)
        .env("XDG_CONFIG_HOME", config)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("mcpctl");
    if let Some(mut stdin) = child.stdin.take() {
        // (A refused command exits without reading it.)
        let _ = stdin.write_all(input.as_bytes());
    }
    child.wait_with_output().expect("mcpctl")
}

#[test]
fn mcpctl_credential_keeps_the_credstore_that_import_reads() {
    use std::os::unix::fs::PermissionsExt as _;
    let config = tempfile::tempdir().expect("config");
    let store = config.path().join("mcpd/credstore");
    let out = credential(config.path(), &["set", "gh.token"], SECRET);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode(&store), 0o700);
    assert_eq!(mode(&store.join("gh.token")), 0o600);
    assert_eq!(
        std::fs::read_to_string(store.join("gh.token")).expect("value"),
        SECRET
    );
    let out = credential(config.path(), &["set", "../escape"], "x");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"../escape\" is not a credential name")
    );
    let listed = credential(config.path(), &["list"], "");
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(
        listed.contains(&format!("gh.token  {} B", SECRET.len())),
        "{listed}"
    );
    assert!(!listed.contains(SECRET));

    // A unit imports it from the store at its start.
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    let rt = runtime.path();
    unit(
        units.path(),
        "imports",
        "credentials {\n    import \"gh.*\" \"absent-*\"\n    env \"GH\" \"gh.token\"\n}",
    );
    let mut d = Daemon::user_no_bus(
        units.path(),
        &[
            ("XDG_RUNTIME_DIR", rt.as_os_str()),
            ("XDG_CONFIG_HOME", config.path().as_os_str()),
        ],
    );
    d.wait_until("imports running", |d| d.latest_pid("imports").is_some());
    assert_eq!(env_of(rt, "imports")["GH"], SECRET);
    let dir = credentials_dir(rt, "imports");
    assert_eq!(
        call(
            rt,
            "imports",
            "exec",
            &format!("cat {}", dir.join("gh.token").display())
        ),
        format!("exit status: 0 {SECRET}")
    );
    d.stop(rustix::process::Signal::TERM);

    let out = credential(config.path(), &["remove", "gh.token"], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!store.join("gh.token").exists());
    let out = credential(config.path(), &["remove", "gh.token"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no credential gh.token"));
}

#[test]
fn mcpctl_import_keeps_a_hosts_secret_in_the_credstore_and_the_server_receives_it() {
    use std::os::unix::fs::PermissionsExt as _;
    let home = tempfile::tempdir().expect("home");
    let h = home.path();
    std::fs::create_dir_all(h.join(".config/Claude")).expect("mkdir");
    std::fs::write(
        h.join(".config/Claude/claude_desktop_config.json"),
        format!(
            "{{\n  \"mcpServers\": {{\n    \"fixture\": {{\n      \"command\": \"{}\",\n      \"args\": [\"--chatter\", \"0\"],\n      \"env\": {{ \"API_TOKEN\": \"{SECRET}\", \"REGION\": \"eu\" }}\n    }}\n  }}\n}}\n",
            fixture_path().display()
        ),
    )
    .expect("desktop config");
    let import = || {
        crate::helper::mcpctl()
            .args(["--user", "import", "claude-desktop"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", h)
            .current_dir(h)
            .output()
            .expect("mcpctl")
    };
    let out = import();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("1 secret in the credstore as fixture.*"),
        "{said}"
    );
    let store = h.join(".config/mcpd/credstore");
    let held = store.join("fixture.API_TOKEN");
    assert_eq!(std::fs::read_to_string(&held).expect("credential"), SECRET);
    assert_eq!(
        std::fs::metadata(&held).expect("meta").permissions().mode() & 0o777,
        0o600
    );
    // In no unit file and no env-file.
    let units = h.join(".config/mcpd/units");
    let mut written = Vec::new();
    files(&units, Path::new("/nonexistent"), &mut written);
    assert!(
        !written
            .iter()
            .any(|f| f.extension().is_some_and(|e| e == "env"))
    );
    for file in &written {
        let text = std::fs::read_to_string(file).expect("unit");
        assert!(!text.contains(SECRET), "{}:\n{text}", file.display());
    }
    let unit = std::fs::read_to_string(units.join("fixture.kdl")).expect("unit");
    assert!(
        unit.contains("credentials {\n    import \"fixture.API_TOKEN\"\n    env \"API_TOKEN\" \"fixture.API_TOKEN\"\n}"),
        "{unit}"
    );
    // Again: nothing to change.
    let again = import();
    assert!(String::from_utf8_lossy(&again.stdout).contains("unchanged"));

    // The imported server receives it, in the variable the host gave it.
    let runtime = tempfile::tempdir().expect("runtime");
    let rt = runtime.path();
    let mut d = Daemon::user_no_bus(
        &units,
        &[
            ("XDG_RUNTIME_DIR", rt.as_os_str()),
            ("XDG_CONFIG_HOME", h.join(".config").as_os_str()),
        ],
    );
    d.wait_until("fixture running", |d| d.latest_pid("fixture").is_some());
    let env = env_of(rt, "fixture");
    assert_eq!(env["API_TOKEN"], SECRET);
    assert_eq!(env["REGION"], "eu");
    d.stop(rustix::process::Signal::TERM);
}

#[test]
fn a_server_run_as_another_user_owns_its_credentials_and_cannot_read_others() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test runs a server as nobody and needs root (CI runs as root)"
    );
    let (_secrets, creds) = loaded_secret();
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    let rt = runtime.path();
    std::fs::write(
        units.path().join("theirs.kdl"),
        format!(
            "stdio {{\n    command \"{}\" \"--chatter\" \"0\" \"--tools\" \"read,exec\"\n    user \"nobody\"\n}}\n{creds}\n",
            fixture_path().display()
        ),
    )
    .expect("unit");
    unit(units.path(), "roots", &creds);
    let mut d = Daemon::start(
        &[
            "--system".as_ref(),
            "--no-bus".as_ref(),
            "--units".as_ref(),
            units.path().as_os_str(),
        ],
        &[("MCPD_RUNTIME_DIR", rt.as_os_str())],
    );
    for name in ["theirs", "roots"] {
        d.wait_until(&format!("{name} running"), |d| d.latest_pid(name).is_some());
    }
    let system = |args: &[&str]| {
        let out = crate::helper::mcpctl()
            .arg("--system")
            .args(args)
            .env("MCPD_RUNTIME_DIR", rt)
            .env_remove("DBUS_SYSTEM_BUS_ADDRESS")
            .output()
            .expect("mcpctl");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let dir_of = |server: &str| {
        let env: serde_json::Value =
            serde_json::from_str(&system(&["call", server, "env", "{}"])).expect("env");
        PathBuf::from(env["CREDENTIALS_DIRECTORY"].as_str().expect("set"))
    };
    let (theirs, roots) = (dir_of("theirs"), dir_of("roots"));
    let read = |server: &str, path: &Path| {
        let args = serde_json::json!({ "text": path.display().to_string() }).to_string();
        system(&["call", server, "read", &args])
    };
    let nobody = nix::unistd::User::from_name("nobody")
        .expect("lookup")
        .expect("nobody exists")
        .uid
        .as_raw();
    use std::os::unix::fs::MetadataExt as _;
    for path in [theirs.clone(), theirs.join("tok")] {
        assert_eq!(std::fs::metadata(&path).expect("meta").uid(), nobody);
    }
    assert_eq!(
        read("theirs", &theirs.join("tok")),
        format!("ok {} bytes", SECRET.len())
    );
    assert!(
        read("theirs", &roots.join("tok")).starts_with("error: Permission denied"),
        "nobody reads root's credentials"
    );
    assert_eq!(
        read("roots", &roots.join("tok")),
        format!("ok {} bytes", SECRET.len())
    );
    d.stop(rustix::process::Signal::TERM);
    // (MCPD_RUNTIME_DIR is the runtime directory itself.) Emptied by the
    // servers' ends, then removed with the daemon.
    assert!(!rt.join("credentials").exists());
}

#[test]
fn import_passes_the_daemons_own_credentials_through_and_a_changed_block_restarts_the_unit() {
    // As systemd would start mcpd with `LoadCredential=`.
    let own = tempfile::tempdir().expect("own credentials");
    std::fs::write(own.path().join("sys.token"), SECRET).expect("own");
    std::fs::write(own.path().join("sys.other"), "other-value").expect("own");
    // The credstore comes first when both hold a name.
    let config = tempfile::tempdir().expect("config");
    let store = config.path().join("mcpd/credstore");
    std::fs::create_dir_all(&store).expect("store");
    std::fs::write(store.join("sys.other"), "from-the-store").expect("store");
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    let rt = runtime.path();
    unit(
        units.path(),
        "through",
        "credentials {\n    import \"sys.*\"\n    env \"TOKEN\" \"sys.token\"\n    env \"OTHER\" \"sys.other\"\n}",
    );
    let mut d = Daemon::user_no_bus(
        units.path(),
        &[
            ("XDG_RUNTIME_DIR", rt.as_os_str()),
            ("XDG_CONFIG_HOME", config.path().as_os_str()),
            ("CREDENTIALS_DIRECTORY", own.path().as_os_str()),
        ],
    );
    d.wait_until("through running", |d| d.latest_pid("through").is_some());
    let env = env_of(rt, "through");
    assert_eq!(env["TOKEN"], SECRET);
    assert_eq!(env["OTHER"], "from-the-store");
    // The daemon's own CREDENTIALS_DIRECTORY is not the server's.
    assert_ne!(env["CREDENTIALS_DIRECTORY"].as_str(), own.path().to_str());

    // A changed block is a new start with the new credentials.
    let first = d.latest_pid("through").expect("pid");
    unit(
        units.path(),
        "through",
        "credentials {\n    import \"sys.*\"\n    env \"TOKEN\" \"sys.other\"\n}",
    );
    let out = mcpctl_user(rt, &["reload"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    d.wait_until("through restarted", |d| {
        d.latest_pid("through").is_some_and(|p| p != first)
    });
    let env = env_of(rt, "through");
    assert_eq!(env["TOKEN"], "from-the-store");
    assert!(env.get("OTHER").is_none(), "{env}");
    d.stop(rustix::process::Signal::TERM);
}

#[test]
fn mcpctl_verify_locates_a_credentials_mistake() {
    let units = tempfile::tempdir().expect("units");
    let path = units.path().join("wrong.kdl");
    std::fs::write(
        &path,
        "stdio {\n    command \"/bin/cat\"\n}\ncredentials {\n    load \"gh\" \"/etc/mcpd/gh\"\n    env \"TOKEN\" \"hg\"\n}\n",
    )
    .expect("unit");
    let out = crate::helper::mcpctl()
        .arg("verify")
        .arg(&path)
        .output()
        .expect("mcpctl");
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("{}:6:9", path.display()))
            && said.contains("`credentials.env`: TOKEN names credential \"hg\", which no"),
        "{said}"
    );
}

#[test]
fn an_unprivileged_user_instance_removes_its_own_credentials_and_a_host_sealed_one_fails_closed() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test runs the daemon as nobody and needs root (CI runs as root)"
    );
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    let secrets = tempfile::tempdir().expect("secrets");
    let tok = secrets.path().join("tok");
    std::fs::write(&tok, SECRET).expect("tok");
    // Sealed with a host key (root's, 0400): an unprivileged instance asks
    // `systemd-creds --user`, which cannot decrypt it (systemd 252 has no
    // `--user` at all; later ones use the user's key, not the host's).
    let keys = tempfile::tempdir().expect("keys");
    let key = host_key(keys.path());
    let sealed = secrets.path().join("api.cred");
    encrypt(&key, "api", SECRET, &sealed);
    unit(
        units.path(),
        "mine",
        &format!("credentials {{\n    load \"tok\" \"{}\"\n}}", tok.display()),
    );
    unit(
        units.path(),
        "sealed",
        &format!(
            "credentials {{\n    load-encrypted \"api\" \"{}\"\n}}",
            sealed.display()
        ),
    );
    for path in [units.path(), runtime.path(), secrets.path(), &tok, &sealed] {
        rustix::fs::chown(
            path,
            Some(rustix::fs::Uid::from_raw(65534)),
            Some(rustix::fs::Gid::from_raw(65534)),
        )
        .expect("chown");
    }
    let mcpd = env!("CARGO_BIN_EXE_mcpd");
    let args: Vec<&std::ffi::OsStr> = vec![
        "--reuid=65534".as_ref(),
        "--regid=65534".as_ref(),
        "--clear-groups".as_ref(),
        mcpd.as_ref(),
        "--user".as_ref(),
        "--no-bus".as_ref(),
        "--units".as_ref(),
        units.path().as_os_str(),
    ];
    let rt = runtime.path();
    let mut d = Daemon::start_binary(
        Path::new("setpriv"),
        &args,
        &[
            ("XDG_RUNTIME_DIR", rt.as_os_str()),
            ("HOME", secrets.path().as_os_str()),
            (key.0, &key.1),
        ],
    );
    d.wait_until("mine running", |d| d.latest_pid("mine").is_some());
    d.wait_for("credential api: cannot decrypt");
    assert!(
        d.count(&format!(
            "credential api: cannot decrypt {}: systemd-creds --user decrypt failed",
            sealed.display()
        )) > 0,
        "{}",
        d.seen.join("\n")
    );
    assert_eq!(delivered(rt).len(), 1, "only mine's: {:?}", delivered(rt));
    let dir = delivered(rt).remove(0);
    assert!(dir.join("tok").exists());
    // The daemon's own directories (0500, as the server's) go all the same.
    assert!(d.stop(rustix::process::Signal::TERM).success());
    assert!(!dir.exists(), "{} is left", dir.display());
    assert!(!rt.join("mcpd/credentials").exists());
}

#[test]
fn an_unprivileged_user_instance_asks_systemd_creds_in_user_scope_and_delivers_its_plaintext() {
    use std::os::unix::fs::PermissionsExt;
    assert!(
        rustix::process::geteuid().is_root(),
        "this test runs the daemon as nobody and needs root (CI runs as root)"
    );
    // The success path of user scope, mcpd's side of it: the systemd-creds
    // CI has (252) cannot decrypt in user scope, so a stand-in on the
    // daemon's PATH records how it is asked and "decrypts" by dropping a
    // prefix. What mcpd must do is ask `--user decrypt --name=NAME PATH -`
    // and hand the server exactly what comes out.
    let bin = tempfile::tempdir().expect("bin");
    let secrets = tempfile::tempdir().expect("secrets");
    let asked = secrets.path().join("asked");
    let fake = bin.path().join("systemd-creds");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" > {}\nexec sed 's/^sealed://' \"$4\"\n",
            asked.display()
        ),
    )
    .expect("fake");
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let sealed = secrets.path().join("api.cred");
    std::fs::write(&sealed, format!("sealed:{SECRET}")).expect("sealed");
    let units = tempfile::tempdir().expect("units");
    let runtime = tempfile::tempdir().expect("runtime");
    unit(
        units.path(),
        "sealed",
        &format!(
            "credentials {{\n    load-encrypted \"api\" \"{}\"\n}}",
            sealed.display()
        ),
    );
    for path in [units.path(), runtime.path(), secrets.path(), &sealed] {
        rustix::fs::chown(
            path,
            Some(rustix::fs::Uid::from_raw(65534)),
            Some(rustix::fs::Gid::from_raw(65534)),
        )
        .expect("chown");
    }
    let path = std::env::join_paths(std::iter::once(bin.path().to_owned()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("PATH");
    let mcpd = env!("CARGO_BIN_EXE_mcpd");
    let args: Vec<&std::ffi::OsStr> = vec![
        "--reuid=65534".as_ref(),
        "--regid=65534".as_ref(),
        "--clear-groups".as_ref(),
        mcpd.as_ref(),
        "--user".as_ref(),
        "--no-bus".as_ref(),
        "--units".as_ref(),
        units.path().as_os_str(),
    ];
    let rt = runtime.path();
    let mut d = Daemon::start_binary(
        Path::new("setpriv"),
        &args,
        &[
            ("XDG_RUNTIME_DIR", rt.as_os_str()),
            ("HOME", secrets.path().as_os_str()),
            ("PATH", &path),
        ],
    );
    d.wait_until("sealed running", |d| d.latest_pid("sealed").is_some());
    assert_eq!(
        std::fs::read_to_string(&asked).expect("systemd-creds was asked"),
        format!("--user\ndecrypt\n--name=api\n{}\n-\n", sealed.display())
    );
    let dirs = delivered(rt);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert_eq!(
        std::fs::read_to_string(dirs[0].join("api")).expect("api"),
        SECRET
    );
    assert!(d.stop(rustix::process::Signal::TERM).success());
}
