//! The daemon logging to a real `systemd-journald`, as the packaged
//! service does (`StandardError=journal`: stderr is a journal stream and
//! `JOURNAL_STREAM` names it, so every log event is one datagram of
//! journald's native protocol to `/run/systemd/journal/socket`), beside
//! the same daemon logging text to stderr (read by the benchmark): fixture
//! echo through `mcpctl bridge` on each, and direct, the same rmcp client,
//! call by call in turn.
//!
//! journald runs in a mount namespace of its own (`unshare --mount`, a
//! tmpfs on `/run` and on `/var/log/journal`), so neither the machine's
//! journal nor its sockets are touched; the daemon runs in that namespace,
//! started by `systemd-cat` (its stdout and stderr a journal stream), and
//! its runtime directory (the private socket, the attach socket) is under
//! the benchmark's temporary directory, outside the namespace's `/run`.
//! This needs root (a mount namespace) and `systemd-journald`; without
//! them the row says why and counts as not met. After the calls the
//! benchmark reads the namespace's journal (`journalctl` by `nsenter`) and
//! checks that the calls' lines are in it: the row measured the journal.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;

use super::common::{self, Ratio, Row};
use super::sessions::{in_trials, spawn};
use super::{Daemon, Sizes, cpu_ns};

const FIGURE: &str = "fixture echo through mcpctl bridge, the daemon logging to a real systemd-journald (its native socket, JOURNAL_STREAM) vs to stderr as text";
const TARGET: &str = "overhead over direct p50 ≤ 0.07 ms (the bridge's)";

/// Where `systemd-journald` is installed.
fn journald() -> Option<PathBuf> {
    [
        "/lib/systemd/systemd-journald",
        "/usr/lib/systemd/systemd-journald",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

/// Sets up the namespace, starts journald in it and then `mcpd` logging
/// to it; writes journald's pid to `pidfile`.
const SCRIPT: &str = r#"set -e
mount -t tmpfs tmpfs /run
if [ -d /var/log/journal ]; then mount -t tmpfs tmpfs /var/log/journal; fi
mkdir -p /run/systemd/journal
"$JOURNALD" </dev/null >/dev/null 2>&1 &
echo $! > "$PIDFILE"
i=0
until [ -S /run/systemd/journal/socket ] && [ -S /run/systemd/journal/stdout ]; do
    i=$((i + 1))
    if [ "$i" -gt 3000 ]; then echo "systemd-journald made no sockets in 30 s" >&2; exit 3; fi
    sleep 0.01
done
exec systemd-cat -t mcpd -- sh -c 'JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2); export JOURNAL_STREAM; exec "$@"' sh "$@"
"#;

/// journald in its namespace, killed (after the daemon) when dropped.
struct Journald {
    pid: i32,
}

impl Journald {
    /// `journalctl ARGS` in journald's namespace: its stdout.
    fn journalctl(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("nsenter")
            .arg(format!("--mount=/proc/{}/ns/mnt", self.pid))
            .args(["--", "journalctl", "--no-pager"])
            .args(args)
            .output()
            .map_err(|e| format!("nsenter journalctl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "journalctl: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Journald {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            // Not our child (its parent was the shell that became mcpd):
            // wait, bounded, for it to be gone.
            let deadline = Instant::now() + Duration::from_secs(10);
            while Path::new(&format!("/proc/{}", self.pid)).exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// `mcpd --user --no-bus` on `units`, logging to a journald of its own;
/// returns once its private socket answers and `u0` is running.
fn start(units: &Path) -> Result<(Daemon, Journald), String> {
    let journald = journald().ok_or("systemd-journald is not installed")?;
    if !rustix::process::geteuid().is_root() {
        return Err("a journald of its own needs a mount namespace: root".into());
    }
    let runtime = tempfile::tempdir().map_err(|e| e.to_string())?;
    let pidfile = runtime.path().join("journald.pid");
    let mut child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(SCRIPT)
        .arg("sh")
        .arg(common::binary("mcpd"))
        .args(["--user", "--no-bus", "--units"])
        .arg(units)
        .env("JOURNALD", &journald)
        .env("PIDFILE", &pidfile)
        .env("XDG_RUNTIME_DIR", runtime.path())
        .env("MCPD_STATE_DIR", runtime.path().join("state"))
        .env_remove("MCPD_LOG")
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run unshare: {e}"))?;
    let mut stderr = child.stderr.take();
    // No lines: this daemon logs to the journal.
    let (_, lines) = std::sync::mpsc::channel();
    let mut daemon = Daemon {
        child,
        lines,
        runtime,
    };
    // What the set-up said if it failed (mcpd's own stderr is the journal
    // once it runs): read once the process is gone.
    let mut failed = |mut daemon: Daemon, what: &str| {
        let _ = daemon.child.kill();
        drop(daemon);
        let mut said = String::new();
        if let Some(mut stderr) = stderr.take() {
            use std::io::Read;
            let _ = stderr.read_to_string(&mut said);
        }
        format!("{what}: {}", said.trim())
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|p| p.trim().parse().ok())
        {
            break pid;
        }
        // Without the right to mount (a container), unshare fails at once.
        if let Ok(Some(_)) = daemon.child.try_wait() {
            return Err(failed(daemon, "no journald of its own"));
        }
        if Instant::now() > deadline {
            return Err(failed(daemon, "systemd-journald did not start within 60 s"));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let journal = Journald { pid };
    loop {
        let status = Command::new(common::binary("mcpctl"))
            .args(["--user", "status", "u0"])
            .env("XDG_RUNTIME_DIR", daemon.runtime.path())
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .output()
            .map_err(|e| format!("mcpctl: {e}"))?;
        if String::from_utf8_lossy(&status.stdout).contains("running") {
            return Ok((daemon, journal));
        }
        if let Ok(Some(_)) = daemon.child.try_wait() {
            return Err(failed(daemon, "mcpd under journald ended"));
        }
        if Instant::now() > deadline {
            return Err(failed(daemon, "u0 was not running within 60 s"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn rows(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Vec<Row> {
    match measure(rt, sizes) {
        Ok(row) => vec![row],
        Err(why) => vec![Row::skipped_target(FIGURE, TARGET, &why)],
    }
}

fn measure(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Result<Row, String> {
    let units = super::units_dir(1);
    let (journaled, journal) = start(units.path())?;
    let text = Daemon::start(units.path(), None);
    text.until(1, super::running);
    let before = [cpu_ns(journaled.pid()), cpu_ns(text.pid())];
    let trials = rt.block_on(async {
        let fixture = common::binary("examples/mcp-fixture");
        let mcpctl = common::binary("mcpctl");
        let bridge = ["--user", "bridge", "u0"];
        let (_direct, io) = spawn(&fixture, &["--chatter", "0"], text.runtime.path());
        let direct = ().serve(io).await.map_err(|e| e.to_string())?;
        let (_j, io) = spawn(&mcpctl, &bridge, journaled.runtime.path());
        let to_journal = ().serve(io).await.map_err(|e| e.to_string())?;
        let (_t, io) = spawn(&mcpctl, &bridge, text.runtime.path());
        let to_stderr = ().serve(io).await.map_err(|e| e.to_string())?;
        let echo = serde_json::json!({"text": "x"});
        let trials = in_trials(
            [&direct, &to_journal, &to_stderr],
            sizes.calls,
            "echo",
            &echo,
        )
        .await;
        for client in [direct, to_journal, to_stderr] {
            let _ = client.cancel().await;
        }
        Ok::<_, String>(trials)
    })?;
    let calls = (trials.len() * sizes.calls) as f64;
    let cpu = [
        (cpu_ns(journaled.pid()) - before[0]) as f64 / 1000.0 / calls,
        (cpu_ns(text.pid()) - before[1]) as f64 / 1000.0 / calls,
    ];
    // The calls' lines reached the journal: the fixture's stderr line for
    // each (`call echo`), as journald stores it, with its fields.
    let logged = journal.journalctl(&["-o", "cat", "MCPD_SERVER=u0", "SYSLOG_IDENTIFIER=mcpd"])?;
    let lines = logged
        .lines()
        .filter(|l| l.ends_with(": call echo"))
        .count();
    if (lines as f64) < calls {
        return Err(format!(
            "the journal holds {lines} of the {calls} calls' lines: {}",
            logged.lines().last().unwrap_or("nothing")
        ));
    }
    drop(journaled);
    drop(journal);
    let pairs = |a: usize, b: usize| -> Vec<_> { trials.iter().map(|t| (t[a], t[b])).collect() };
    let over = Ratio::difference(&pairs(1, 0));
    let vs_text = Ratio::of(&pairs(1, 2));
    let text_over = Ratio::difference(&pairs(2, 0));
    Ok(Row::new(
        FIGURE,
        TARGET,
        format!(
            "{:.3} vs {:.3} ms: {:.2}×; over direct {:+.3} vs {:+.3} ms",
            vs_text.a, vs_text.b, vs_text.median, over.p50, text_over.p50
        ),
        format!(
            "trials {:+.3}..{:+.3} ms; daemon CPU {:.0} vs {:.0} µs per call; {lines} lines in the journal",
            over.min, over.max, cpu[0], cpu[1]
        ),
        vs_text.runs,
    )
    .met(over.p50 <= 0.07))
}
