//! Shared test helpers: binaries, snapshots, bounded waits.

mod bus;
pub mod fake;

pub use bus::Bus;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// How long a test waits for what should happen soon, unless it says.
pub const BOUND: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a test waits for a server that may take its whole
/// `startup-timeout "60s"` to start under load (a Python SDK server on two
/// busy cores; its `server/discover` probe may take half of it): the
/// condition is waited for, the bound only ends a test that hangs.
pub const STARTUP: std::time::Duration = std::time::Duration::from_secs(120);

/// The package root (tests run with it as the working directory).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `n` milliseconds.
pub fn ms(n: u64) -> std::time::Duration {
    std::time::Duration::from_millis(n)
}

// Bounded waits: the tests' one way of waiting for something to happen.
// Each polls its condition (in sync code first after 10 ms, then less
// often, up to every 50 ms: quick to see what comes soon, cheap when the
// condition runs a command) or awaits an event, for at most `timeout`; a wait that
// runs out panics with "timed out after TIMEOUT waiting for WHAT". A test
// sleeps only as part of its scenario (a slow peer, time that must pass),
// and says so.

/// The first pause of a polled wait, and the longest.
const POLL: std::time::Duration = std::time::Duration::from_millis(10);
const POLL_MAX: std::time::Duration = std::time::Duration::from_millis(50);

/// The pause after `pause`.
fn next_pause(pause: std::time::Duration) -> std::time::Duration {
    (pause * 3 / 2).min(POLL_MAX)
}

/// The panic message of a bounded wait that ran out.
pub fn timed_out(what: impl std::fmt::Display, timeout: std::time::Duration) -> String {
    format!("timed out after {timeout:?} waiting for {what}")
}

/// Waits until `pred` holds, polling, for at most `timeout`; panics
/// naming `what` and `timeout` if it never does.
#[track_caller]
pub fn eventually(
    what: impl std::fmt::Display,
    timeout: std::time::Duration,
    pred: impl FnMut() -> bool,
) {
    assert!(holds_within(timeout, pred), "{}", timed_out(what, timeout));
}

/// [`eventually`] for a caller whose panic message shows more (what it
/// saw last): whether `pred` came to hold within `timeout`.
pub fn holds_within(timeout: std::time::Duration, mut pred: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    let mut pause = POLL;
    loop {
        if pred() {
            return true;
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = next_pause(pause);
    }
}

/// [`eventually`] in async code, for a condition that may await (a call,
/// a read): `async || …`.
pub async fn eventually_async(
    what: impl std::fmt::Display,
    timeout: std::time::Duration,
    pred: impl AsyncFnMut() -> bool,
) {
    assert!(
        holds_within_async(timeout, pred).await,
        "{}",
        timed_out(what, timeout)
    );
}

/// [`holds_within`] in async code: polls every 10 ms (its conditions are
/// in-process or a call away, and some tests time what they see) with
/// tokio's sleep (virtual time in a paused runtime).
pub async fn holds_within_async(
    timeout: std::time::Duration,
    mut pred: impl AsyncFnMut() -> bool,
) -> bool {
    within(timeout, async {
        while !pred().await {
            tokio::time::sleep(POLL).await;
        }
    })
    .await
    .is_some()
}

/// Awaits `event` (a wait woken by what it waits for, not polled) for at
/// most `timeout`; `None` if it ran out (the caller panics with
/// [`timed_out`] and what it saw).
pub async fn within<T>(
    timeout: std::time::Duration,
    event: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::time::timeout(timeout, event).await.ok()
}

/// A `reconnect` block: delays in milliseconds, retries per outage.
pub fn policy(
    initial: u64,
    max: u64,
    attempts: i128,
    enabled: bool,
) -> mcpd::unit::spec::ReconnectDraft {
    mcpd::unit::spec::ReconnectDraft {
        enabled: Some(enabled),
        initial_delay: Some(ms(initial)),
        max_delay: Some(ms(max)),
        max_attempts: Some(attempts),
    }
}

/// Runs `mcpctl --user ARGS` against the daemon whose runtime dir is
/// `runtime`, off any bus, to completion.
pub fn mcpctl_user(runtime: &Path, args: &[&str]) -> Output {
    mcpctl_user_command(runtime, args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("mcpctl")
}

/// Calls `tool` of `server` with `text` through `mcpctl --user` (the
/// fixture's probe tools); its answer.
pub fn probe(runtime: &Path, server: &str, tool: &str, text: &str) -> String {
    let args = serde_json::json!({ "text": text }).to_string();
    let out = mcpctl_user(runtime, &["call", server, tool, &args]);
    assert!(
        out.status.success(),
        "{server} {tool} {text}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The server's environment, from the fixture's `env` tool.
pub fn env_of(runtime: &Path, server: &str) -> serde_json::Value {
    let out = mcpctl_user(runtime, &["call", server, "env", "{}"]);
    serde_json::from_slice(&out.stdout).expect("env json")
}

/// `mcpctl --user ARGS` for the daemon whose runtime dir is `runtime`,
/// off any bus, not started yet.
pub fn mcpctl_user_command(runtime: &Path, args: &[&str]) -> Command {
    let mut cmd = mcpctl();
    cmd.arg("--user")
        .args(args)
        .env("XDG_RUNTIME_DIR", runtime)
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .env_remove("MCPD_RUNTIME_DIR");
    cmd
}

/// `mcpctl` as built for this test run.
pub fn mcpctl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcpctl"))
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

/// `mcpctl --user bridge NAME` for the daemon whose runtime dir is
/// `runtime`, off any bus, with stdin and stdout piped (stderr is the
/// caller's choice), killed when dropped.
pub fn bridge_command(runtime: &Path, name: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcpctl"));
    command
        .args(["--user", "bridge", name])
        .env("XDG_RUNTIME_DIR", runtime)
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .env_remove("MCPD_RUNTIME_DIR")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    command
}

/// [`bridge_command`] spawned with stderr inherited: the host's end of it.
pub fn bridge(
    runtime: &Path,
    name: &str,
) -> (
    tokio::process::Child,
    (tokio::process::ChildStdout, tokio::process::ChildStdin),
) {
    let mut child = bridge_command(runtime, name)
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("spawn mcpctl bridge");
    let io = (
        child.stdout.take().expect("stdout"),
        child.stdin.take().expect("stdin"),
    );
    (child, io)
}

/// A peer-to-peer D-Bus connection to the private socket at `socket`.
pub async fn private_conn(socket: &Path) -> zbus::Connection {
    let stream = std::os::unix::net::UnixStream::connect(socket).expect("connect");
    zbus::connection::Builder::unix_stream(stream)
        .p2p()
        .build()
        .await
        .expect("handshake")
}

/// [`private_conn`], and the proxy of server `name` on it.
pub async fn private_server(
    socket: &Path,
    name: &str,
) -> (zbus::Connection, mcpd::dbus::ServerProxy<'static>) {
    let conn = private_conn(socket).await;
    let server = mcpd::dbus::ServerProxy::builder(&conn)
        .path(mcpd::dbus::server_path(name))
        .build()
        .await
        .expect("proxy");
    (conn, server)
}

/// The resident set of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Runs a command to completion with no stdin.
pub fn run(cmd: &mut Command) -> Output {
    cmd.stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// What [`check_snapshot`] does with a snapshot file.
///
/// Every test compares, unless the test binary was built with the
/// `update-snapshots` feature: snapshots are rewritten only by asking for
/// it in the test command ([`snapshot_mode`]):
///
/// ```sh
/// cargo test --test tests --features update-snapshots
/// ```
///
/// (narrowed as any run: `… -- unit_files`). No environment variable
/// turns a snapshot test green, and rewriting is refused where `CI` is
/// set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Snapshot {
    Compare,
    Update,
}

/// How a snapshot is rewritten, for the messages that say so.
pub const UPDATE_SNAPSHOTS: &str = "cargo test --test tests --features update-snapshots";

/// Whether this run compares snapshots or rewrites them (the
/// `update-snapshots` feature, asked for in the test command).
pub fn snapshot_mode() -> Snapshot {
    if cfg!(feature = "update-snapshots") {
        Snapshot::Update
    } else {
        Snapshot::Compare
    }
}

/// Compares `actual` with the snapshot file `expected` (or, in
/// [`Snapshot::Update`], writes it if it differs). Returns a description
/// of the difference, if any.
pub fn check_snapshot(mode: Snapshot, expected: &Path, actual: &str) -> Option<String> {
    let want = std::fs::read_to_string(expected);
    if mode == Snapshot::Update {
        assert!(
            std::env::var_os("CI").is_none(),
            "snapshots are never rewritten in CI"
        );
        if want.as_deref().ok() != Some(actual) {
            std::fs::write(expected, actual).expect("write snapshot");
            eprintln!("rewrote {}", expected.display());
        }
        return None;
    }
    match want {
        Ok(want) if want == actual => None,
        Ok(want) => Some(format!(
            "{} differs (`{UPDATE_SNAPSHOTS}` rewrites it)\n--- expected\n{want}\n--- actual\n{actual}",
            expected.display()
        )),
        Err(e) => Some(format!(
            "{}: {e} (`{UPDATE_SNAPSHOTS}` writes it)\n--- actual\n{actual}",
            expected.display()
        )),
    }
}

/// A running `mcpd` whose stderr is read line by line.
pub struct Daemon {
    child: std::process::Child,
    /// The daemon's own XDG_RUNTIME_DIR unless the test gave one.
    _runtime: Option<tempfile::TempDir>,
    /// Its own MCPD_STATE_DIR (on-demand caches) unless the test gave one:
    /// never the user's.
    _state: Option<tempfile::TempDir>,
    lines: std::sync::mpsc::Receiver<String>,
    /// Every line read so far.
    pub seen: Vec<String>,
}

impl Daemon {
    /// A user instance on `units`, off any bus (private socket only).
    pub fn user_no_bus(units: &Path, env: &[(&str, &std::ffi::OsStr)]) -> Self {
        Self::start(
            &[
                "--user".as_ref(),
                "--no-bus".as_ref(),
                "--units".as_ref(),
                units.as_os_str(),
            ],
            env,
        )
    }

    /// Starts `mcpd` with `args`, the fixture's directory first on PATH.
    pub fn start(args: &[&std::ffi::OsStr], env: &[(&str, &std::ffi::OsStr)]) -> Self {
        Self::start_binary(Path::new(env!("CARGO_BIN_EXE_mcpd")), args, env)
    }

    /// [`Daemon::start`] with another `mcpd` binary (an installed one).
    pub fn start_binary(
        binary: &Path,
        args: &[&std::ffi::OsStr],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Self {
        use std::io::BufRead;
        let fixture_dir = fixture_path().parent().expect("examples dir").to_owned();
        let path = std::env::join_paths(std::iter::once(fixture_dir).chain(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        )))
        .expect("PATH");
        let mut cmd = Command::new(binary);
        let runtime = if env.iter().any(|(k, _)| *k == "XDG_RUNTIME_DIR") {
            None
        } else {
            let dir = tempfile::tempdir().expect("runtime dir");
            cmd.env("XDG_RUNTIME_DIR", dir.path());
            Some(dir)
        };
        let state = if env.iter().any(|(k, _)| *k == "MCPD_STATE_DIR") {
            None
        } else {
            let dir = tempfile::tempdir().expect("state dir");
            cmd.env("MCPD_STATE_DIR", dir.path());
            Some(dir)
        };
        // No bus unless the test starts one: never a developer's session bus;
        // and the runtime dir chosen here, never one from the environment.
        cmd.env_remove("DBUS_SESSION_BUS_ADDRESS")
            .env_remove("MCPD_RUNTIME_DIR");
        cmd.args(args)
            .env("PATH", path)
            .env("MCPD_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn mcpd");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            _runtime: runtime,
            _state: state,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one contains `needle` (bounded); returns it.
    pub fn wait_for(&mut self, needle: &str) -> String {
        self.wait_for_within(needle, BOUND)
    }

    /// [`Daemon::wait_for`] within `bound` (a server that takes its
    /// `startup-timeout` to start, under load: [`STARTUP`]).
    pub fn wait_for_within(&mut self, needle: &str, bound: std::time::Duration) -> String {
        let mut found = None;
        let seen = holds_within(bound, || {
            // what came by now (a few at a time: the bound is checked between)
            let first = self.lines.recv_timeout(POLL).into_iter();
            for line in first.chain(self.lines.try_iter().take(1000)) {
                self.seen.push(line.clone());
                if line.contains(needle) {
                    found = Some(line);
                    return true;
                }
            }
            false
        });
        assert!(
            seen,
            "{}; mcpd logged:\n{}",
            timed_out(format_args!("mcpd to log {needle:?}"), bound),
            self.seen.join("\n")
        );
        found.expect("the line")
    }

    /// Reads lines until `done(self)` holds (bounded), checking after each
    /// line and at least every 50 ms.
    pub fn wait_until(&mut self, what: &str, done: impl Fn(&Self) -> bool) {
        self.wait_until_within(what, BOUND, done);
    }

    /// [`Daemon::wait_until`] within `bound`.
    pub fn wait_until_within(
        &mut self,
        what: &str,
        bound: std::time::Duration,
        done: impl Fn(&Self) -> bool,
    ) {
        let met = holds_within(bound, || done(self) || self.read_until(ms(50), &done));
        assert!(
            met,
            "{}; mcpd logged:\n{}",
            timed_out(what, bound),
            self.seen.join("\n")
        );
    }

    /// Reads what the daemon logs for at most `wait` (the first line
    /// ends it).
    pub fn read_for(&mut self, wait: std::time::Duration) {
        if let Ok(line) = self.lines.recv_timeout(wait) {
            self.seen.push(line);
        }
    }

    /// Reads the lines that have come (waiting at most `wait` for a first;
    /// a thousand at most), one by one, until `done(self)` holds: whether
    /// it does. The lines after the one that made it hold stay unread, for
    /// a next [`Daemon::wait_for`].
    pub fn read_until(&mut self, wait: std::time::Duration, done: impl Fn(&Self) -> bool) -> bool {
        let mut next = self.lines.recv_timeout(wait).ok();
        for _ in 0..1000 {
            let Some(line) = next else { break };
            self.seen.push(line);
            if done(self) {
                return true;
            }
            next = self.lines.try_recv().ok();
        }
        false
    }

    /// Lines logged about unit `name` (its `mcpd_server` field).
    pub fn about<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a String> + 'a {
        let field = format!("mcpd_server={name}");
        self.seen
            .iter()
            .filter(move |l| l.split_whitespace().any(|word| word == field))
    }

    /// The PID of the newest "running (pid N, …)" line of unit `name`.
    pub fn latest_pid(&self, name: &str) -> Option<u32> {
        self.about(name).filter_map(|l| running_pid(l)).last()
    }

    /// How many times unit `name` has been logged as running.
    pub fn starts(&self, name: &str) -> usize {
        self.about(name)
            .filter(|l| running_pid(l).is_some())
            .count()
    }

    /// Lines containing `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.seen.iter().filter(|l| l.contains(needle)).count()
    }

    /// Sends `signal` without waiting.
    pub fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"))
            .expect("pid");
        rustix::process::kill_process(pid, signal).expect("signal mcpd");
    }

    /// Sends `signal` and waits (bounded) for the exit status.
    pub fn stop(self, signal: rustix::process::Signal) -> std::process::ExitStatus {
        self.signal(signal);
        self.exit()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The XDG_RUNTIME_DIR the helper gave the daemon, if it chose one.
    pub fn runtime_dir(&self) -> Option<&Path> {
        self._runtime.as_ref().map(tempfile::TempDir::path)
    }

    /// Waits (bounded) for the daemon to exit by itself.
    pub fn exit(self) -> std::process::ExitStatus {
        self.exit_logged().0
    }

    /// Sends `signal`, waits (bounded) for the exit, and returns its status
    /// with every line the daemon logged.
    pub fn stop_logged(
        self,
        signal: rustix::process::Signal,
    ) -> (std::process::ExitStatus, Vec<String>) {
        self.signal(signal);
        self.exit_logged()
    }

    fn exit_logged(mut self) -> (std::process::ExitStatus, Vec<String>) {
        let mut status = None;
        let exited = holds_within(BOUND, || {
            status = self.child.try_wait().expect("wait");
            status.is_some()
        });
        assert!(
            exited,
            "{}; it logged:\n{}",
            timed_out("mcpd to exit", BOUND),
            self.seen.join("\n")
        );
        while let Ok(line) = self.lines.recv_timeout(std::time::Duration::from_secs(5)) {
            self.seen.push(line);
        }
        (status.expect("exited"), std::mem::take(&mut self.seen))
    }
}

impl Drop for Daemon {
    /// A daemon a test did not stop is stopped as an operator would
    /// (SIGTERM, bounded), so it removes its servers' cgroups; SIGKILL only
    /// if it does not exit.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal(rustix::process::Signal::TERM);
            // (no panic in a drop: SIGKILL below if it did not exit)
            holds_within(std::time::Duration::from_secs(10), || {
                !matches!(self.child.try_wait(), Ok(None))
            });
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The cgroup v2 directory of process `pid` (the daemon's servers' are
/// below its subtree).
pub fn cgroup_of(pid: u32) -> PathBuf {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let mount = mcpd::supervisor::cgroup::v2_mount(&mountinfo).expect("a cgroup v2 hierarchy");
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    let path = mcpd::supervisor::cgroup::v2_path(&own).expect("a v2 path");
    mount.join(path.trim_start_matches('/'))
}

/// Removes the (empty) cgroups a SIGKILLed daemon left: its subtree and
/// the server cgroups in it.
pub fn remove_cgroup_tree(subtree: &Path) {
    if let Ok(entries) = std::fs::read_dir(subtree) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir(entry.path()).expect("an empty server cgroup");
            }
        }
    }
    std::fs::remove_dir(subtree).expect("the daemon's subtree");
}

/// The PID in a "running (pid N, …)" or "running again (pid N, …)" log line.
pub fn running_pid(line: &str) -> Option<u32> {
    if !line.contains("mcpd::supervisor: running") {
        return None;
    }
    line.split("(pid ").nth(1)?.split(',').next()?.parse().ok()
}

/// Whether `pid` is a live process (zombies count as gone).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// The command line of process `pid`.
pub fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The session id of `pid`, from `/proc/PID/stat` (field 6). Not getsid(2):
/// in a container the server's session may be led from outside the pid
/// namespace, and getsid then reports 0, which rustix refuses.
pub fn session_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    after
        .split(' ')
        .nth(3)
        .and_then(|s| s.parse().ok())
        .expect("session field")
}
