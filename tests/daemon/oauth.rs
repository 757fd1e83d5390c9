//! Logins held by mcpd (DESIGN §17), against the Python SDK's own OAuth
//! example (`examples/servers/simple-auth` of the mcp 2.3.0 sdist, which
//! `.ci/run` installs into `target/py-simple-auth`): its authorization
//! server and its protected MCP server, on free ports, reached as
//! `localhost` (the resource its metadata names).

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::helper::{BOUND, Daemon, eventually, mcpctl_user, mcpctl_user_command, root};

/// A child killed and reaped when dropped.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn simple_auth(program: &str, args: &[String], port: u16) -> Reaped {
    let bin = root().join("target/py-simple-auth/bin").join(program);
    assert!(
        bin.is_file(),
        "{} is missing: .ci/run installs the mcp 2.3.0 sdist's simple-auth example",
        bin.display()
    );
    let child = Command::new(&bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    let child = Reaped(child);
    eventually(format!("{program} to listen on {port}"), BOUND, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    child
}

/// `mcpctl status --json NAME`'s object (null while no daemon answers).
fn status(runtime: &Path, name: &str) -> serde_json::Value {
    let out = mcpctl_user(runtime, &["--json", "status", name]);
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    value
        .as_array()
        .and_then(|a| a.first().cloned())
        .unwrap_or(value)
}

fn state_of(runtime: &Path, name: &str) -> String {
    status(runtime, name)["state"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The SDK host through `mcpctl bridge NAME`: `expect` is `needs-login`
/// or `ok`.
fn host(runtime: &Path, name: &str, expect: &str) {
    let python = root().join("target/py-simple-auth/bin/python");
    let out = Command::new(python)
        .arg(root().join("tests/data/oauth_client.py"))
        .arg(env!("CARGO_BIN_EXE_mcpctl"))
        .args([name, expect])
        .env("XDG_RUNTIME_DIR", runtime)
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .output()
        .expect("python3 oauth_client.py");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("OK"),
        "host expecting {expect}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `mcpctl auth login NAME --no-browser`, completed by the test browser.
fn login(runtime: &Path, name: &str) {
    let mut mcpctl = mcpctl_user_command(runtime, &["auth", "login", name, "--no-browser"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mcpctl auth login");
    let mut lines = std::io::BufReader::new(mcpctl.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("text");
    assert_eq!(first, "Open this URL to log in:");
    let url = lines.next().expect("the URL").expect("text");
    assert!(url.starts_with("http://localhost:"), "{url}");
    let browser = Command::new(root().join("target/py-simple-auth/bin/python"))
        .arg(root().join("tests/data/oauth_browser.py"))
        .arg(&url)
        .output()
        .expect("python3 oauth_browser.py");
    assert!(
        browser.status.success(),
        "browser: {}",
        String::from_utf8_lossy(&browser.stderr)
    );
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let out = mcpctl.wait_with_output().expect("mcpctl ends");
    assert!(
        out.status.success(),
        "auth login: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(rest, [format!("Logged in to {name}.")]);
}

#[test]
fn a_login_held_by_mcpd_serves_every_host_survives_a_restart_and_logout_forgets_it() {
    let (as_port, rs_port) = (free_port(), free_port());
    let _as = simple_auth(
        "mcp-simple-auth-as",
        &[format!("--port={as_port}")],
        as_port,
    );
    let _rs = simple_auth(
        "mcp-simple-auth-rs",
        &[
            format!("--port={rs_port}"),
            format!("--auth-server=http://localhost:{as_port}"),
            "--transport=streamable-http".into(),
        ],
        rs_port,
    );
    let units = tempfile::tempdir().expect("units");
    std::fs::write(
        units.path().join("sa.kdl"),
        format!("http \"http://localhost:{rs_port}/mcp\" {{\n    oauth\n}}\n"),
    )
    .expect("unit");
    let runtime = tempfile::tempdir().expect("runtime");
    let state = tempfile::tempdir().expect("state");
    let env = [
        ("XDG_RUNTIME_DIR", runtime.path().as_os_str()),
        ("MCPD_STATE_DIR", state.path().as_os_str()),
    ];
    let rt = runtime.path();
    let mut daemon = Daemon::user_no_bus(units.path(), &env);

    // No token: needs-login at once, no retry spent, calls answered at once.
    daemon.wait_for("server sa needs a login: run mcpctl auth login sa");
    let s = status(rt, "sa");
    assert_eq!(s["state"], "needs-login", "{s}");
    assert_eq!(
        (s["attempt"].as_u64(), s["generation"].as_u64()),
        (Some(0), Some(1)),
        "{s}"
    );
    assert_eq!(s["auth"], "needs login", "{s}");
    let call = mcpctl_user(rt, &["call", "sa", "get_time", "{}"]);
    assert_eq!(
        String::from_utf8_lossy(&call.stderr).trim(),
        "mcpctl: server sa needs a login: run mcpctl auth login sa"
    );
    assert_eq!(mcpctl_user(rt, &["status", "sa"]).status.code(), Some(3));
    host(rt, "sa", "needs-login");
    daemon.read_for(std::time::Duration::from_millis(100));
    assert_eq!(
        daemon.count("starting mcpd_server=sa"),
        1,
        "no retries: {:#?}",
        daemon.seen
    );

    // The login brings it up with no other command; every host can call.
    login(rt, "sa");
    eventually("sa to run after the login", BOUND, || {
        state_of(rt, "sa") == "running"
    });
    host(rt, "sa", "ok");
    let s = status(rt, "sa");
    let auth = s["auth"].as_str().unwrap_or_default().to_owned();
    assert!(
        auth.starts_with(&format!("OAuth (http://localhost:{as_port}/), logged in")),
        "{auth}"
    );

    // The token is kept 0600 and shown nowhere.
    let file = state.path().join("oauth/sa.json");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file)
        .expect("token file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let stored: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("json");
    let token = stored["token_response"]["access_token"]
        .as_str()
        .expect("an access token")
        .to_owned();
    assert!(token.len() > 16);
    let shown = [
        mcpctl_user(rt, &["status", "sa"]).stdout,
        mcpctl_user(rt, &["--json", "status", "sa"]).stdout,
        mcpctl_user(rt, &["auth", "status"]).stdout,
        mcpctl_user(rt, &["cat", "sa"]).stdout,
    ];
    for out in &shown {
        assert!(!String::from_utf8_lossy(out).contains(&token));
    }

    daemon.read_for(std::time::Duration::from_millis(100));
    assert!(
        !daemon.seen.iter().any(|l| l.contains(&token)),
        "the token is in the log"
    );

    // A daemon restart keeps the login.
    daemon.stop(rustix::process::Signal::TERM);
    let mut daemon = Daemon::user_no_bus(units.path(), &env);
    eventually("sa to run after the restart", BOUND, || {
        state_of(rt, "sa") == "running"
    });
    let call = mcpctl_user(rt, &["call", "sa", "get_time", "{}"]);
    assert!(
        call.status.success(),
        "{}",
        String::from_utf8_lossy(&call.stderr)
    );

    // Logout forgets it.
    let out = mcpctl_user(rt, &["auth", "logout", "sa"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually("sa to need a login again", BOUND, || {
        state_of(rt, "sa") == "needs-login"
    });
    assert!(!file.exists(), "the token file is removed");
    assert_eq!(
        mcpctl_user(rt, &["auth", "status", "sa"]).status.code(),
        Some(3)
    );
    daemon.read_for(std::time::Duration::from_millis(100));
    assert!(
        !daemon.seen.iter().any(|l| l.contains(&token)),
        "the token is in the log"
    );
}

/// `tests/data/oauth_fake.py` on `port` in `mode`, its stdout piped.
fn fake(port: u16, mode: &str) -> Reaped {
    let child = Command::new("python3")
        .arg(root().join("tests/data/oauth_fake.py"))
        .args([&port.to_string(), mode])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 oauth_fake.py");
    let child = Reaped(child);
    eventually(format!("the fake to listen on {port}"), BOUND, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    child
}

/// A daemon with unit `fk` on the fake at `port`.
fn fake_daemon(
    port: u16,
) -> (
    Daemon,
    tempfile::TempDir,
    tempfile::TempDir,
    tempfile::TempDir,
) {
    let units = tempfile::tempdir().expect("units");
    std::fs::write(
        units.path().join("fk.kdl"),
        format!("http \"http://localhost:{port}/mcp\" {{\n    oauth\n}}\n"),
    )
    .expect("unit");
    let runtime = tempfile::tempdir().expect("runtime");
    let state = tempfile::tempdir().expect("state");
    let mut daemon = Daemon::user_no_bus(
        units.path(),
        &[
            ("XDG_RUNTIME_DIR", runtime.path().as_os_str()),
            ("MCPD_STATE_DIR", state.path().as_os_str()),
        ],
    );
    daemon.wait_for("server fk needs a login");
    (daemon, units, runtime, state)
}

/// Opens `url` in a browser that follows every redirect (the fake's
/// authorize endpoint redirects to mcpctl's listener at once); with
/// `state`, the redirect's state is replaced by it.
fn follow(url: &str, state: Option<&str>) {
    let script = r#"
import sys, urllib.request, urllib.parse
class Stop(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None
try:
    urllib.request.build_opener(Stop).open(sys.argv[1], timeout=30)
except urllib.error.HTTPError as e:
    target = e.headers["location"]
if len(sys.argv) > 2:
    u = urllib.parse.urlparse(target)
    q = dict(urllib.parse.parse_qsl(u.query)); q["state"] = sys.argv[2]
    target = u._replace(query=urllib.parse.urlencode(q)).geturl()
urllib.request.urlopen(target, timeout=30).read()
"#;
    let out = Command::new("python3")
        .args(["-c", script, url])
        .args(state)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `mcpctl auth login fk --no-browser` with the browser `follow`; its
/// output (exit status, stderr).
fn login_fk(runtime: &Path, state: Option<&str>) -> (Option<i32>, String) {
    login_to(runtime, "fk", state)
}

/// [`login_fk`] for unit `name`.
fn login_to(runtime: &Path, name: &str, state: Option<&str>) -> (Option<i32>, String) {
    let mut mcpctl = mcpctl_user_command(runtime, &["auth", "login", name, "--no-browser"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mcpctl auth login");
    let mut lines = std::io::BufReader::new(mcpctl.stdout.take().expect("stdout")).lines();
    if let Some(Ok(first)) = lines.next()
        && first == "Open this URL to log in:"
    {
        let url = lines.next().expect("the URL").expect("text");
        follow(&url, state);
    }
    let out = mcpctl.wait_with_output().expect("mcpctl ends");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_expired_access_token_is_refreshed_without_a_login() {
    let port = free_port();
    let mut fake = fake(port, "ok");
    let (_daemon, _units, runtime, _state) = fake_daemon(port);
    let rt = runtime.path();
    assert_eq!(login_fk(rt, None), (Some(0), String::new()));
    eventually("fk to run", BOUND, || state_of(rt, "fk") == "running");
    // The fake's tokens live 3 s: calls go on past the first one's end,
    // and none fails; a refreshed token answers.
    let mut seen = Vec::new();
    eventually("a call with a refreshed token", BOUND, || {
        let out = mcpctl_user(rt, &["call", "fk", "whoami", "{}"]);
        assert!(
            out.status.success(),
            "a call failed during the refresh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let refreshed = text.trim() != "token at-1";
        seen.push(text);
        refreshed
    });
    assert_eq!(state_of(rt, "fk"), "running");
    drop(fake.0.stdin.take());
    let _ = fake.0.kill();
    let mut printed = String::new();
    use std::io::Read;
    fake.0
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut printed)
        .expect("fake output");
    assert!(
        printed.contains("token refresh_token"),
        "no refresh grant: {printed}; calls {seen:?}"
    );
    assert_eq!(printed.matches("token authorization_code").count(), 1);
}

#[test]
fn each_check_of_a_login_is_refused_naming_it() {
    let port = free_port();
    let (_daemon, _units, runtime, state) = fake_daemon(port);
    let rt = runtime.path();
    for (mode, named) in [
        ("no-s256", "PKCE code challenge method (S256)"),
        ("wrong-issuer", "issuer check failed"),
        ("wrong-resource", "resource mismatch"),
        ("ok", "state check failed"),
    ] {
        let _fake = fake(port, mode);
        let spoiled = (mode == "ok").then_some("not-the-state");
        let (code, stderr) = login_fk(rt, spoiled);
        assert_eq!(code, Some(1), "{mode}: {stderr}");
        assert!(
            stderr.contains("login to fk failed") && stderr.contains(named),
            "{mode}: {stderr}"
        );
        assert!(
            !state.path().join("oauth/fk.json").exists(),
            "{mode}: a token was kept"
        );
        assert_eq!(state_of(rt, "fk"), "needs-login", "{mode}");
    }
}

// The token's lifetime (DESIGN §17): refreshed by the unit at ¾ of it,
// one refresh at a time, transient failures retried, a refused refresh
// token or a refused fresh token a login.

/// The fake's printed lines, read as they come.
struct Printed(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Printed {
    fn of(fake: &mut Reaped) -> Self {
        let out = fake.0.stdout.take().expect("the fake's stdout");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = std::sync::Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                kept.lock().expect("lines").push(line);
            }
        });
        Self(lines)
    }

    fn lines(&self, starting: &str) -> Vec<String> {
        let lines = self.0.lock().expect("lines");
        lines
            .iter()
            .filter(|l| l.starts_with(starting))
            .cloned()
            .collect()
    }

    /// Waits (bounded by `bound`) for `n` lines starting with `starting`.
    fn wait(&self, starting: &str, n: usize, bound: std::time::Duration) -> Vec<String> {
        eventually(
            format!("{n} lines {starting:?} from the fake"),
            bound,
            || self.lines(starting).len() >= n,
        );
        self.lines(starting)
    }
}

/// The fake at `port` behaves as `word` says from now (its /control).
fn control(port: u16, word: &str) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the fake");
    write!(
        stream,
        "POST /control HTTP/1.1\r\nhost: localhost\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{word}",
        word.len()
    )
    .expect("control");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("control answer");
    assert!(answer.contains(" 200 "), "{answer}");
}

/// `tests/data/oauth_fake.py` in mode `ok` with tokens living `lifetime`
/// seconds.
fn fake_living(port: u16, lifetime: u32) -> Reaped {
    let child = Command::new("python3")
        .arg(root().join("tests/data/oauth_fake.py"))
        .args([&port.to_string(), "ok", &lifetime.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 oauth_fake.py");
    let child = Reaped(child);
    eventually(format!("the fake to listen on {port}"), BOUND, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    child
}

/// A refresh line's `age=SECONDS`: how old the refresh token was.
fn age(line: &str) -> f64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("age="))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no age in {line:?}"))
}

#[test]
fn a_token_is_refreshed_at_three_quarters_of_its_life_and_no_call_fails_across_it() {
    let port = free_port();
    let mut fake = fake_living(port, 8);
    let printed = Printed::of(&mut fake);
    let (_daemon, _units, runtime, _state) = fake_daemon(port);
    let rt = runtime.path().to_owned();
    assert_eq!(login_fk(&rt, None), (Some(0), String::new()));
    eventually("fk to run", BOUND, || state_of(&rt, "fk") == "running");

    // Four hosts call without a pause across two refreshes.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let (rt, stop) = (rt.clone(), std::sync::Arc::clone(&stop));
            std::thread::spawn(move || {
                let (mut ok, mut failed) = (0, Vec::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let out = mcpctl_user(&rt, &["call", "fk", "whoami", "{}"]);
                    if out.status.success() {
                        ok += 1;
                    } else {
                        failed.push(String::from_utf8_lossy(&out.stderr).into_owned());
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    let refreshes = printed.wait("token refresh_token", 2, BOUND * 2);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut calls = 0;
    for caller in callers {
        let (ok, failed) = caller.join().expect("a caller");
        assert!(
            failed.is_empty(),
            "calls failed across a refresh: {failed:?}"
        );
        calls += ok;
    }
    assert!(calls > 8, "{calls} calls");
    // ¾ of 8 s is 6 s: not rmcp's own (half of a short lifetime, 30 s
    // before a long one), and before the token's end. The stored time of
    // receipt is rmcp's, in whole seconds, so the daemon's 6 s may be up
    // to 1 s early by the fake's clock (5.2 s seen in a clean-clone run).
    for line in &refreshes {
        let age = age(line);
        assert!(
            (5.0..8.0).contains(&age),
            "refreshed at {age} s: {refreshes:?}"
        );
    }
    assert_eq!(state_of(&rt, "fk"), "running");
}

#[test]
fn a_transient_refresh_failure_is_retried_and_never_asks_for_a_login() {
    let port = free_port();
    let mut fake = fake_living(port, 20);
    let printed = Printed::of(&mut fake);
    let (mut daemon, _units, runtime, _state) = fake_daemon(port);
    let rt = runtime.path();
    assert_eq!(login_fk(rt, None), (Some(0), String::new()));
    eventually("fk to run", BOUND, || state_of(rt, "fk") == "running");
    let first = mcpctl_user(rt, &["call", "fk", "whoami", "{}"]);
    assert!(first.status.success());

    // At 15 s the token endpoint answers 503, then 400
    // temporarily_unavailable, then recovers: retried with a backoff of its
    // own, the unit running all along.
    control(port, "503");
    printed.wait("token refresh_token", 1, BOUND * 2);
    control(port, "unavailable");
    printed.wait("token refresh_token", 2, BOUND);
    assert_eq!(state_of(rt, "fk"), "running");
    control(port, "ok");
    let tries = printed.wait("token refresh_token", 3, BOUND);
    assert!(tries[0].ends_with(" 503"), "{tries:?}");
    assert!(tries[1].ends_with(" unavailable"), "{tries:?}");
    eventually("a call with the refreshed token", BOUND, || {
        let out = mcpctl_user(rt, &["call", "fk", "whoami", "{}"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout != first.stdout
    });
    let s = status(rt, "fk");
    assert_eq!(s["state"], "running", "{s}");
    assert_eq!(
        (s["restarts"].as_u64(), s["attempt"].as_u64()),
        (Some(0), Some(0)),
        "{s}"
    );
    daemon.wait_for("token refresh failed");
    assert_eq!(
        daemon.count("needs a login"),
        1,
        "only before the login: {:#?}",
        daemon.seen
    );
}

#[test]
fn a_refused_refresh_token_or_a_refused_fresh_token_is_a_login_not_a_retry() {
    let port = free_port();
    let mut fake = fake_living(port, 4);
    let printed = Printed::of(&mut fake);
    let (mut daemon, _units, runtime, state) = fake_daemon(port);
    let rt = runtime.path();

    // invalid_grant at the ¾ refresh: needs-login with that reason, the
    // tokens dropped, no retry.
    assert_eq!(login_fk(rt, None), (Some(0), String::new()));
    eventually("fk to run", BOUND, || state_of(rt, "fk") == "running");
    control(port, "invalid_grant");
    eventually("fk to need a login", BOUND, || {
        state_of(rt, "fk") == "needs-login"
    });
    let s = status(rt, "fk");
    assert!(
        s["auth"]
            .as_str()
            .unwrap_or_default()
            .contains("invalid_grant"),
        "{s}"
    );
    let stored: serde_json::Value = serde_json::from_slice(
        &std::fs::read(state.path().join("oauth/fk.json")).expect("token file"),
    )
    .expect("json");
    assert!(stored["token_response"].is_null(), "{stored}");
    daemon.read_for(std::time::Duration::from_secs(4));
    // (a refresh before the control may have gone through)
    let refused: Vec<String> = printed
        .lines("token refresh_token")
        .into_iter()
        .filter(|l| l.ends_with(" invalid_grant"))
        .collect();
    assert_eq!(refused.len(), 1, "retried: {refused:?}");

    // A 401 invalid_token right after a refresh: needs-login at once.
    control(port, "ok");
    assert_eq!(login_fk(rt, None), (Some(0), String::new()));
    eventually("fk to run again", BOUND, || state_of(rt, "fk") == "running");
    let starts = daemon.count("starting mcpd_server=fk");
    control(port, "reject");
    let call = mcpctl_user(rt, &["call", "fk", "whoami", "{}"]);
    assert!(!call.status.success());
    eventually("fk to need a login again", BOUND, || {
        state_of(rt, "fk") == "needs-login"
    });
    let s = status(rt, "fk");
    assert!(
        s["auth"]
            .as_str()
            .unwrap_or_default()
            .contains("401 invalid_token"),
        "{s}"
    );
    assert_eq!(s["restarts"].as_u64(), Some(0), "{s}");
    daemon.read_for(std::time::Duration::from_secs(3));
    daemon.read_for(std::time::Duration::from_secs(1));
    assert_eq!(
        daemon.count("starting mcpd_server=fk"),
        starts,
        "no retry: {:#?}",
        daemon.seen
    );
}

/// How long `mcpctl ARGS` takes; it must succeed.
fn timed(runtime: &Path, args: &[&str]) -> std::time::Duration {
    let began = std::time::Instant::now();
    let out = mcpctl_user(runtime, args);
    assert!(
        out.status.success(),
        "mcpctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    began.elapsed()
}

#[test]
fn a_hung_authorization_server_blocks_neither_status_nor_another_unit() {
    let (pa, pb) = (free_port(), free_port());
    let mut fake_a = fake_living(pa, 6);
    let printed = Printed::of(&mut fake_a);
    let _fake_b = fake_living(pb, 3600);
    let units = tempfile::tempdir().expect("units");
    for (name, port) in [("fa", pa), ("fb", pb)] {
        std::fs::write(
            units.path().join(format!("{name}.kdl")),
            format!("http \"http://localhost:{port}/mcp\" {{\n    oauth\n}}\n"),
        )
        .expect("unit");
    }
    let runtime = tempfile::tempdir().expect("runtime");
    let state = tempfile::tempdir().expect("state");
    let rt = runtime.path();
    let mut daemon = Daemon::user_no_bus(
        units.path(),
        &[
            ("XDG_RUNTIME_DIR", rt.as_os_str()),
            ("MCPD_STATE_DIR", state.path().as_os_str()),
        ],
    );
    daemon.wait_for("server fb needs a login");
    for name in ["fa", "fb"] {
        assert_eq!(login_to(rt, name, None), (Some(0), String::new()));
        eventually(format!("{name} to run"), BOUND, || {
            state_of(rt, name) == "running"
        });
    }
    // What a host and mcpctl may wait, loaded as this machine may be: far
    // below the authorization server's bounds (10 s, 30 s).
    let normal = std::time::Duration::from_secs(5);
    let answered = |what: &str| {
        for args in [
            &["status"][..],
            &["status", "fa"][..],
            &["call", "fb", "whoami", "{}"][..],
        ] {
            let took = timed(rt, args);
            assert!(took < normal, "{what}: mcpctl {args:?} took {took:?}");
        }
    };
    answered("before");

    // fa's authorization server accepts and never answers: its refresh
    // (at 4.5 s) hangs.
    control(pa, "hang");
    printed.wait("hang /token", 1, BOUND);
    answered("during fa's refresh");

    // fa's login hangs on the authorization server's metadata.
    let began = std::time::Instant::now();
    let login = {
        let rt = rt.to_owned();
        std::thread::spawn(move || login_to(&rt, "fa", None))
    };
    printed.wait("hang /.well-known/oauth-authorization-server", 1, BOUND);
    while !login.is_finished() {
        answered("during fa's login");
        if began.elapsed() > std::time::Duration::from_secs(20) {
            break;
        }
    }
    let (code, stderr) = login.join().expect("login");
    let took = began.elapsed();
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "login to fa failed: the authorization server http://localhost:{pa}/ did not answer within 30s"
        )),
        "{stderr}"
    );
    assert!(
        took < std::time::Duration::from_secs(50),
        "the login took {took:?}"
    );
    answered("after");
}

#[test]
fn logout_revokes_the_tokens_and_forgets_them_even_when_revocation_fails() {
    let port = free_port();
    let mut fake = fake_living(port, 3600);
    let printed = Printed::of(&mut fake);
    let (_daemon, _units, runtime, state) = fake_daemon(port);
    let rt = runtime.path();
    let file = state.path().join("oauth/fk.json");
    let tokens = || {
        let stored: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).expect("token file")).expect("json");
        let token = |k: &str| {
            stored["token_response"][k]
                .as_str()
                .expect("a token")
                .to_owned()
        };
        (token("refresh_token"), token("access_token"))
    };
    let logout = || {
        let out = mcpctl_user(rt, &["auth", "logout", "fk"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eventually("fk to need a login", BOUND, || {
            state_of(rt, "fk") == "needs-login"
        });
        assert!(!file.exists(), "the token file is removed");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let log_in = || {
        assert_eq!(login_fk(rt, None), (Some(0), String::new()));
        eventually("fk to run", BOUND, || state_of(rt, "fk") == "running");
    };

    // RFC 7009: the refresh token, then the access token.
    log_in();
    let (refresh, access) = tokens();
    assert_eq!(logout(), "Logged out of fk: its tokens were revoked.");
    assert_eq!(
        printed.wait("revoke ", 2, BOUND),
        [
            format!("revoke refresh_token {refresh}"),
            format!("revoke access_token {access}")
        ]
    );

    // A failing revocation: forgotten here all the same, and said.
    log_in();
    control(port, "revoke-fails");
    let said = logout();
    assert!(
        said.starts_with("Logged out of fk: its tokens were forgotten here but not revoked: ")
            && said.contains("503"),
        "{said}"
    );

    // A hung authorization server: the same, within the bound.
    control(port, "ok");
    log_in();
    control(port, "hang");
    let began = std::time::Instant::now();
    let said = logout();
    assert!(said.ends_with("did not answer within 10s."), "{said}");
    assert!(began.elapsed() < std::time::Duration::from_secs(25));
}

#[test]
fn no_token_is_in_the_log_even_at_trace() {
    let port = free_port();
    let mut fake = fake_living(port, 3);
    let printed = Printed::of(&mut fake);
    let units = tempfile::tempdir().expect("units");
    std::fs::write(
        units.path().join("fk.kdl"),
        format!("http \"http://localhost:{port}/mcp\" {{\n    oauth\n}}\n"),
    )
    .expect("unit");
    let runtime = tempfile::tempdir().expect("runtime");
    let state = tempfile::tempdir().expect("state");
    let rt = runtime.path();
    let mut daemon = Daemon::user_no_bus(
        units.path(),
        &[
            ("XDG_RUNTIME_DIR", rt.as_os_str()),
            ("MCPD_STATE_DIR", state.path().as_os_str()),
            ("MCPD_LOG", "trace".as_ref()),
        ],
    );
    daemon.wait_for("server fk needs a login");
    // A login, calls, two refreshes (3 s tokens), a logout that revokes:
    // every path a token takes through rmcp, reqwest and hyper.
    assert_eq!(login_fk(rt, None), (Some(0), String::new()));
    eventually("fk to run", BOUND, || state_of(rt, "fk") == "running");
    eventually("two refreshes", BOUND, || {
        let out = mcpctl_user(rt, &["call", "fk", "whoami", "{}"]);
        assert!(out.status.success());
        printed.lines("token refresh_token").len() >= 2
    });
    let out = mcpctl_user(rt, &["auth", "logout", "fk"]);
    assert!(out.status.success());
    printed.wait("revoke ", 2, BOUND);
    daemon.read_for(std::time::Duration::from_secs(1));
    // Everything logged so far (read until half a second passes quiet).
    loop {
        let before = daemon.seen.len();
        daemon.read_until(std::time::Duration::from_millis(500), |_| false);
        if daemon.seen.len() == before {
            break;
        }
    }
    // The fake's tokens are at-N and rt-N: a word of a line exactly.
    let issued = printed.lines("token ").len();
    let words: Vec<&str> = daemon
        .seen
        .iter()
        .flat_map(|l| l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')))
        .collect();
    assert!(daemon.seen.len() > 100, "not at trace: {:#?}", daemon.seen);
    for n in 1..=issued {
        for token in [format!("at-{n}"), format!("rt-{n}")] {
            assert!(
                !words.contains(&token.as_str()),
                "{token} is in the log: {:#?}",
                daemon
                    .seen
                    .iter()
                    .filter(|l| l.contains(&token))
                    .collect::<Vec<_>>()
            );
        }
    }
}

/// `mcpctl call fk TOOL {}`: (success, stdout and stderr).
fn call_fk(runtime: &Path, tool: &str) -> (bool, String) {
    let out = mcpctl_user(runtime, &["call", "fk", tool, "{}"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Step-up (DESIGN §17): a call answered `403 insufficient_scope` fails
/// naming the scope, the unit needs a login with it, the next login asks
/// for the union of the scopes held and asked, and the call then works;
/// a scope the server goes on refusing is asked for at two logins, then
/// the call is refused with no further login asked.
#[test]
fn a_403_insufficient_scope_asks_a_login_with_the_union_of_the_scopes_twice_at_most() {
    let port = free_port();
    let mut fake = fake(port, "step-up");
    let (_daemon, _units, runtime, _state) = fake_daemon(port);
    let rt = runtime.path();
    let logged_in = |rt: &Path| {
        assert_eq!(login_fk(rt, None), (Some(0), String::new()));
        eventually("fk to run", BOUND, || state_of(rt, "fk") == "running");
    };
    logged_in(rt);
    let (ok, text) = call_fk(rt, "whoami");
    assert!(ok, "{text}");
    // The first login's token lacks `admin`.
    let needs_admin = "server fk needs a login with scope admin: run mcpctl auth login fk";
    let (ok, text) = call_fk(rt, "admin");
    assert!(!ok && text.contains(needs_admin), "{text}");
    eventually("fk to need a login", BOUND, || {
        state_of(rt, "fk") == "needs-login"
    });
    assert_eq!(status(rt, "fk")["reason"], needs_admin);
    let (ok, text) = call_fk(rt, "whoami");
    assert!(!ok && text.contains(needs_admin), "{text}");
    logged_in(rt);
    let (ok, text) = call_fk(rt, "admin");
    assert!(ok, "after the step-up: {text}");
    // A scope the authorization server never grants: two logins ask for
    // it, then the call is refused and the unit runs on.
    let needs_never = "server fk needs a login with scope never: run mcpctl auth login fk";
    for _ in 0..2 {
        let (ok, text) = call_fk(rt, "never");
        assert!(!ok && text.contains(needs_never), "{text}");
        eventually("fk to need a login", BOUND, || {
            state_of(rt, "fk") == "needs-login"
        });
        logged_in(rt);
    }
    let (ok, text) = call_fk(rt, "never");
    assert!(
        !ok && text.contains("scope never was refused 2 times and is not asked again"),
        "{text}"
    );
    assert_eq!(state_of(rt, "fk"), "running");
    let (ok, text) = call_fk(rt, "admin");
    assert!(ok, "{text}");
    let _ = fake.0.kill();
    let mut printed = String::new();
    use std::io::Read;
    fake.0
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut printed)
        .expect("fake output");
    let asked: Vec<Vec<&str>> = printed
        .lines()
        .filter_map(|l| l.strip_prefix("authorize"))
        .map(|s| {
            let mut scopes: Vec<&str> = s.split_whitespace().collect();
            scopes.sort_unstable();
            scopes
        })
        .collect();
    // The first login asks for what discovery gives; each step-up for the
    // union of what was held and what the 403 named.
    assert_eq!(asked.len(), 4, "{printed}");
    assert!(asked[1].contains(&"admin"), "{printed}");
    assert!(
        asked[2].contains(&"admin") && asked[2].contains(&"never"),
        "{printed}"
    );
    assert!(
        asked[3].contains(&"admin") && asked[3].contains(&"never"),
        "{printed}"
    );
}

/// `grant "client-credentials"` (DESIGN §17): the daemon fetches the
/// token itself with the client id and the secret of its credential, the
/// unit runs with no login, and a token that expired (the fake's live 3 s,
/// with no refresh token) is fetched again, never asking for a login.
#[test]
fn a_client_credentials_unit_fetches_and_renews_its_token_without_a_login() {
    let port = free_port();
    let mut fake = fake(port, "client-credentials");
    let units = tempfile::tempdir().expect("units");
    let secret = units.path().join("secret");
    std::fs::write(&secret, "s3cret\n").expect("secret");
    std::fs::write(
        units.path().join("fk.kdl"),
        format!(
            "credentials {{\n    load \"cc\" \"{}\"\n}}\nhttp \"http://localhost:{port}/mcp\" {{\n    oauth {{\n        client-id \"fake-cc\"\n        client-secret credential=\"cc\"\n        grant \"client-credentials\"\n    }}\n}}\n",
            secret.display()
        ),
    )
    .expect("unit");
    let runtime = tempfile::tempdir().expect("runtime");
    let state = tempfile::tempdir().expect("state");
    let _daemon = Daemon::user_no_bus(
        units.path(),
        &[
            ("XDG_RUNTIME_DIR", runtime.path().as_os_str()),
            ("MCPD_STATE_DIR", state.path().as_os_str()),
        ],
    );
    let rt = runtime.path();
    eventually("fk to run", BOUND, || state_of(rt, "fk") == "running");
    let (ok, first) = call_fk(rt, "whoami");
    assert!(ok, "{first}");
    // Past the first token's 3 s: the call still works, with a new token.
    let mut seen = Vec::new();
    eventually("a call with a new token", BOUND, || {
        let (ok, text) = call_fk(rt, "whoami");
        seen.push(text.clone());
        assert_ne!(state_of(rt, "fk"), "needs-login", "{seen:?}");
        ok && text != first
    });
    let _ = fake.0.kill();
    let mut printed = String::new();
    use std::io::Read;
    fake.0
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut printed)
        .expect("fake output");
    assert!(
        printed.matches("token client_credentials").count() >= 2,
        "{printed}"
    );
    assert!(!printed.contains("authorize"), "{printed}");
}
