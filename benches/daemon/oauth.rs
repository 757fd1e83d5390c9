//! OAuth (issue 50 targets), on `tests/data/oauth_fake.py` (an MCP server
//! over Streamable HTTP with its own authorization server, Python's
//! standard library only):
//!
//! - `whoami` through `mcpctl bridge` to a unit with `oauth` (logged in
//!   with `mcpctl auth login --no-browser` and a browser that follows the
//!   redirects) vs through the bridge to a unit of the same server process
//!   with a static `Authorization: Bearer` header (a token the benchmark
//!   asked the fake for itself); tokens live an hour there (the fake's
//!   third argument), so no refresh falls in the calls; the same
//!   rmcp client on each, call by call in turn, in trials.
//! - Calls during token refreshes: a second fake whose tokens live 3 s,
//!   calls one at a time through the bridge for `MCPD_BENCH_REFRESH_SECS`
//!   (10; 4 in a smoke run), so several refreshes fall among them: none
//!   may fail, the fake must have seen a refresh grant, and the calls' p99
//!   over their p50 is judged against a token request's own round trip
//!   to the same fake (the benchmark's, timed before).

use std::io::{BufRead, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;

use super::common::{self, Mode, Ratio, Row, stats};
use super::ondemand::call;
use super::sessions::spawn;
use super::{Daemon, Sizes};

const STATIC: &str = "tool call through mcpctl bridge to an OAuth unit vs the same server with a static bearer header (oauth_fake.py)";
const REFRESH: &str = "tool calls through mcpctl bridge across token refreshes (3 s tokens, oauth_fake.py): failures; p99 over p50 vs a token request's round trip";

/// The fake on a free port, its stdout (one line per token request)
/// collected; killed when dropped.
struct Fake {
    child: Child,
    port: u16,
    said: Arc<Mutex<String>>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Fake {
    fn start(lifetime: u64) -> Result<Self, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let mut child = Command::new("python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/oauth_fake.py"))
            // The tokens' lifetime: the third argument (the token
            // lifetime's work, issue 50; without it 3 s).
            .args([&port.to_string(), "ok", &lifetime.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start oauth_fake.py: {e}"))?;
        let mut stdout = child.stdout.take().ok_or("the fake's stdout")?;
        let said = Arc::new(Mutex::new(String::new()));
        let into = Arc::clone(&said);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut said) = into.lock() {
                    said.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        });
        let fake = Self { child, port, said };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("oauth_fake.py did not listen within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(fake)
    }

    fn said(&self) -> String {
        self.said.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// A token request of the benchmark's own (the grant the fake answers
    /// without a code check): its access token and round trip in ms.
    fn token(&self) -> Result<(String, f64), String> {
        let body = "grant_type=authorization_code&code=the-code";
        let t = Instant::now();
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port))
            .map_err(|e| format!("connect to the fake: {e}"))?;
        write!(
            stream,
            "POST /token HTTP/1.1\r\nHost: localhost:{}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        )
        .map_err(|e| e.to_string())?;
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .map_err(|e| e.to_string())?;
        let took = t.elapsed().as_secs_f64() * 1000.0;
        let json = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
        let token: serde_json::Value =
            serde_json::from_str(json).map_err(|e| format!("{e}: {answer}"))?;
        let token = token["access_token"]
            .as_str()
            .ok_or_else(|| format!("no access_token: {answer}"))?;
        Ok((token.to_owned(), took))
    }
}

/// `mcpctl --user status UNIT` on `d`: its stdout (it exits non-zero for
/// a unit that is not running, as systemctl does).
fn status(d: &Daemon, unit: &str) -> Result<String, String> {
    let out = Command::new(common::binary("mcpctl"))
        .args(["--user", "status", unit])
        .env("XDG_RUNTIME_DIR", d.runtime.path())
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .output()
        .map_err(|e| format!("mcpctl: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `mcpctl auth login UNIT --no-browser`, the URL it prints opened by a
/// browser that follows the redirects (the fake's authorize endpoint
/// sends it straight back to mcpctl's listener); then waits for the unit
/// to run.
fn login(d: &Daemon, unit: &str) -> Result<(), String> {
    let mut login = Command::new(common::binary("mcpctl"))
        .args(["--user", "auth", "login", unit, "--no-browser"])
        .env("XDG_RUNTIME_DIR", d.runtime.path())
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("mcpctl auth login: {e}"))?;
    let mut lines = std::io::BufReader::new(login.stdout.take().ok_or("stdout")?).lines();
    if let Some(Ok(first)) = lines.next()
        && first == "Open this URL to log in:"
    {
        let url = lines
            .next()
            .and_then(Result::ok)
            .ok_or("mcpctl auth login printed no URL")?;
        let script =
            "import sys, urllib.request\nurllib.request.urlopen(sys.argv[1], timeout=30).read()\n";
        let out = Command::new("python3")
            .args(["-c", script, &url])
            .output()
            .map_err(|e| format!("python3: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "the browser: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    let out = login.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "mcpctl auth login {unit}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !status(d, unit)?.contains("Active: running") {
        if Instant::now() > deadline {
            return Err(format!("{unit} did not run within 60 s of its login"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

pub fn rows(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Vec<Row> {
    let mut rows = match static_vs_oauth(rt, sizes) {
        Ok(row) => vec![row],
        Err(why) => vec![Row::skipped_target(STATIC, "p50 ≤ 1.05×", &why)],
    };
    rows.push(match across_refreshes(rt) {
        Ok(row) => row,
        Err(why) => Row::new(
            REFRESH,
            "none fails; p99 ≤ p50 + the refresh's round trip",
            format!("fails: {why}"),
            "-",
            0,
        )
        .met(false),
    });
    rows
}

fn static_vs_oauth(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Result<Row, String> {
    let fake = Fake::start(3600)?;
    let (token, _) = fake.token()?;
    let port = fake.port;
    let units = tempfile::tempdir().map_err(|e| e.to_string())?;
    std::fs::write(
        units.path().join("oa.kdl"),
        format!("http \"http://localhost:{port}/mcp\" {{\n    oauth\n}}\n"),
    )
    .map_err(|e| e.to_string())?;
    std::fs::write(
        units.path().join("st.kdl"),
        format!("http \"http://localhost:{port}/mcp\" {{\n    header \"Authorization\" \"Bearer {token}\"\n}}\n"),
    )
    .map_err(|e| e.to_string())?;
    let d = Daemon::start(units.path(), None);
    d.until(2, |l| super::running(l) || l.contains("needs a login"));
    login(&d, "oa")?;
    let trials = rt.block_on(async {
        let mcpctl = common::binary("mcpctl");
        let (_o, io) = spawn(&mcpctl, &["--user", "bridge", "oa"], d.runtime.path());
        let oauth = ().serve(io).await.map_err(|e| e.to_string())?;
        let (_s, io) = spawn(&mcpctl, &["--user", "bridge", "st"], d.runtime.path());
        let fixed = ().serve(io).await.map_err(|e| e.to_string())?;
        // In turn, call by call; a failed call ends the row (the static
        // token expired: a fake without the lifetime argument).
        let whoami = call("whoami", serde_json::json!({}));
        let mut trials = Vec::new();
        for _ in 0..common::trials() {
            let mut xs: [Vec<f64>; 2] = Default::default();
            for _ in 0..sizes.calls {
                for (client, xs) in [&oauth, &fixed].into_iter().zip(xs.iter_mut()) {
                    let t = Instant::now();
                    match client.call_tool(whoami.clone()).await {
                        Ok(r) if r.is_error != Some(true) => {
                            xs.push(t.elapsed().as_secs_f64() * 1000.0)
                        }
                        Ok(r) => return Err(format!("a call failed: {r:?}")),
                        Err(e) => return Err(format!("a call failed: {e}")),
                    }
                }
            }
            trials.push(xs.map(stats));
        }
        for client in [oauth, fixed] {
            let _ = client.cancel().await;
        }
        Ok::<_, String>(trials)
    })?;
    let pairs: Vec<_> = trials.iter().map(|t| (t[0], t[1])).collect();
    let r = Ratio::of(&pairs);
    Ok(Row::ratio(STATIC, "p50 ≤ 1.05×", &r, "").met(r.median <= 1.05))
}

fn across_refreshes(rt: &tokio::runtime::Runtime) -> Result<Row, String> {
    let secs = Mode::detect().size("MCPD_BENCH_REFRESH_SECS", 10, 4) as u64;
    let fake = Fake::start(3)?;
    // A token request's own round trip, the median of a few.
    let round_trips: Result<Vec<f64>, String> =
        (0..5).map(|_| fake.token().map(|(_, took)| took)).collect();
    let round_trip = stats(round_trips?).p50;
    let units = tempfile::tempdir().map_err(|e| e.to_string())?;
    std::fs::write(
        units.path().join("ob.kdl"),
        format!(
            "http \"http://localhost:{}/mcp\" {{\n    oauth\n}}\n",
            fake.port
        ),
    )
    .map_err(|e| e.to_string())?;
    let d = Daemon::start(units.path(), None);
    d.until(1, |l| l.contains("needs a login"));
    login(&d, "ob")?;
    let (xs, failed) = rt.block_on(async {
        let (_b, io) = spawn(
            &common::binary("mcpctl"),
            &["--user", "bridge", "ob"],
            d.runtime.path(),
        );
        let host = ().serve(io).await.map_err(|e| e.to_string())?;
        let whoami = call("whoami", serde_json::json!({}));
        let (mut xs, mut failed) = (Vec::new(), Vec::new());
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end {
            let t = Instant::now();
            match host.call_tool(whoami.clone()).await {
                Ok(result) if result.is_error != Some(true) => {
                    xs.push(t.elapsed().as_secs_f64() * 1000.0)
                }
                Ok(result) => failed.push(format!("{result:?}")),
                Err(e) => failed.push(e.to_string()),
            }
        }
        let _ = host.cancel().await;
        Ok::<_, String>((xs, failed))
    })?;
    let refreshes = fake.said().matches("token refresh_token").count();
    if refreshes == 0 {
        return Err(format!("no refresh grant in {secs} s of calls"));
    }
    if xs.is_empty() {
        return Err(format!("every call failed: {}", failed.join("; ")));
    }
    let n = xs.len() + failed.len();
    let mut sorted = xs.clone();
    sorted.sort_by(f64::total_cmp);
    let p99 = sorted[((sorted.len() - 1) as f64 * 0.99).round() as usize];
    let s = stats(xs);
    Ok(Row::new(
        REFRESH,
        "none fails; p99 ≤ p50 + the refresh's round trip",
        format!(
            "{} of {n} failed; p99 {p99:.2} ms, p50 {:.2} ms (+{:.2}) vs a token request {round_trip:.2} ms",
            failed.len(),
            s.p50,
            p99 - s.p50
        ),
        format!(
            "{refreshes} refreshes in {secs} s; max {:.2} ms{}",
            s.max,
            failed
                .first()
                .map(|f| format!("; first failure: {f}"))
                .unwrap_or_default()
        ),
        n,
    )
    .met(failed.is_empty() && p99 - s.p50 <= round_trip))
}
