//! Daemon benchmarks against the targets of the daemon issue, driving the
//! real release `mcpd` on generated unit directories:
//!
//! 1. start-up: N fixture units, exec → all running (target ≤ 5 s at 500),
//!    and the daemon's RSS once they run;
//! 2. reload: one unit file changed among N → that unit running again
//!    (target p50 ≤ debounce + 50 ms); exactly one server restarts;
//! 3. idle: daemon CPU time over 10 s with M running servers (target
//!    < 10 ms at 100; no polling).
//!
//! Run through `bench/run`. `MCPD_BENCH_UNITS` (500), `MCPD_BENCH_IDLE_UNITS`
//! (100), `MCPD_BENCH_RELOADS` (20) and `MCPD_BENCH_IDLE_SECS` (10) set sizes.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn release(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/release")
        .join(name);
    assert!(
        path.is_file(),
        "{} is missing: run bench/run",
        path.display()
    );
    path
}

fn unit(tag: &str) -> String {
    format!(
        "stdio {{\n    command \"{}\" \"--name\" \"{tag}\" \"--chatter\" \"0\"\n}}\nstop-timeout \"2s\"\n",
        release("examples/mcp-fixture").display()
    )
}

struct Daemon {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
    runtime: tempfile::TempDir,
}

impl Daemon {
    fn start(units: &Path) -> Self {
        let runtime = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new(release("mcpd"))
            .args(["--user", "--units"])
            .arg(units)
            .env("XDG_RUNTIME_DIR", runtime.path())
            .env("MCPD_LOG", "info,mcpd::server=warn")
            .arg("--no-bus")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mcpd");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            runtime,
        }
    }

    /// Reads lines until `pred` has matched `n` of them; returns the time of
    /// the last match and every line read.
    fn until(&self, n: usize, pred: impl Fn(&str) -> bool) -> (Instant, Vec<String>) {
        let mut seen = Vec::new();
        let mut hits = 0;
        loop {
            let (at, line) = self
                .lines
                .recv_timeout(Duration::from_secs(120))
                .expect("mcpd stopped logging");
            let hit = pred(&line);
            seen.push(line);
            if hit {
                hits += 1;
                if hits == n {
                    return (at, seen);
                }
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let _ = self.child.wait();
    }
}

fn running(line: &str) -> bool {
    line.contains("mcpd::supervisor: running")
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time of every thread of `pid`, in nanoseconds (schedstat).
fn cpu_ns(pid: u32) -> u64 {
    let mut total = 0;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
                total += stat
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    total
}

fn units_dir(n: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..n {
        std::fs::write(
            dir.path().join(format!("u{i}.kdl")),
            unit(&format!("u{i}-a")),
        )
        .expect("write unit");
    }
    dir
}

fn stats(mut xs: Vec<f64>) -> (f64, f64, f64, f64) {
    xs.sort_by(f64::total_cmp);
    let pick = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
    (pick(0.5), pick(0.95), xs[0], xs[xs.len() - 1])
}

fn main() {
    let n = env_usize("MCPD_BENCH_UNITS", 500);
    let idle_n = env_usize("MCPD_BENCH_IDLE_UNITS", 100);
    let reloads = env_usize("MCPD_BENCH_RELOADS", 20);
    let idle_secs = env_usize("MCPD_BENCH_IDLE_SECS", 10) as u64;
    let mut rows: Vec<[String; 5]> = Vec::new();

    // 0: the daemon with no units, for the RSS baseline
    let empty = units_dir(0);
    let d = Daemon::start(empty.path());
    d.until(1, |l| l.contains("started 0 units"));
    std::thread::sleep(Duration::from_millis(500));
    let rss0 = rss_kib(d.pid());
    drop(d);

    // 1 + 2: start-up and reload at N units
    let dir = units_dir(n);
    let started = Instant::now();
    let d = Daemon::start(dir.path());
    let (all_up, _) = d.until(n, running);
    let startup = all_up - started;
    std::thread::sleep(Duration::from_millis(500));
    let rss = rss_kib(d.pid());
    rows.push([
        format!("start-up: {n} units, exec to all running"),
        "≤ 5 s".into(),
        format!("{:.2} s", startup.as_secs_f64()),
        "-".into(),
        "1".into(),
    ]);
    rows.push([
        format!("daemon RSS with 0 and {n} idle servers"),
        "-".into(),
        format!(
            "{:.1} → {:.1} MiB",
            rss0 as f64 / 1024.0,
            rss as f64 / 1024.0
        ),
        format!(
            "slope {:.1} KiB per server",
            rss.saturating_sub(rss0) as f64 / n as f64
        ),
        "1".into(),
    ]);

    let mut latencies = Vec::new();
    let mut extra_restarts = 0;
    for r in 0..reloads {
        let i = (r * 37) % n;
        let name = format!("u{i}");
        let t0 = Instant::now();
        std::fs::write(
            dir.path().join(format!("{name}.kdl")),
            unit(&format!("{name}-r{r}")),
        )
        .expect("write");
        let field = format!("mcpd_server={name} ");
        let (up, seen) = d.until(1, |l| running(l) && l.contains(&field));
        latencies.push((up - t0).as_secs_f64() * 1000.0);
        extra_restarts += seen
            .iter()
            .filter(|l| running(l) && !l.contains(&field))
            .count();
    }
    let (p50, p95, lo, hi) = stats(latencies);
    rows.push([
        format!("reload: 1 file changed among {n} → running again"),
        "≤ 150 ms (100 ms debounce + 50)".into(),
        format!("{p50:.0} ms"),
        format!("p95 {p95:.0}, {lo:.0}..{hi:.0} ms"),
        reloads.to_string(),
    ]);
    rows.push([
        "other servers restarted by those reloads".into(),
        "0".into(),
        extra_restarts.to_string(),
        "-".into(),
        reloads.to_string(),
    ]);
    rows.extend(dbus(&d.runtime.path().join("mcpd/private"), n));
    let mut walls = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let out = Command::new(release("mcpctl"))
            .args(["--user", "status"])
            .env("XDG_RUNTIME_DIR", d.runtime.path())
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .output()
            .expect("mcpctl");
        walls.push(t.elapsed().as_secs_f64() * 1000.0);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), n + 2);
    }
    let (p50, p95, lo, hi) = stats(walls);
    rows.push([
        format!("mcpctl status, {n} servers, whole process"),
        "< 100 ms".into(),
        format!("{p50:.1} ms"),
        format!("p95 {p95:.1}, {lo:.1}..{hi:.1} ms"),
        "20".into(),
    ]);
    drop(d);

    // 3: idle CPU at M units
    let dir = units_dir(idle_n);
    let d = Daemon::start(dir.path());
    d.until(idle_n, running);
    std::thread::sleep(Duration::from_secs(1));
    let before = cpu_ns(d.pid());
    std::thread::sleep(Duration::from_secs(idle_secs));
    let used = cpu_ns(d.pid()) - before;
    let rss_idle = rss_kib(d.pid());
    rows.push([
        format!("daemon RSS with {idle_n} idle servers"),
        "-".into(),
        format!("{:.1} MiB", rss_idle as f64 / 1024.0),
        format!(
            "slope {:.1} KiB per server",
            rss_idle.saturating_sub(rss0) as f64 / idle_n.max(1) as f64
        ),
        "1".into(),
    ]);
    rows.extend(call_overhead(&d));
    rows.push([
        format!("idle: daemon CPU over {idle_secs} s, {idle_n} running servers"),
        "< 10 ms".into(),
        format!("{:.2} ms", used as f64 / 1e6),
        "-".into(),
        "1".into(),
    ]);
    drop(d);

    println!("| figure | target | median | p95, min..max | runs |");
    println!("|---|---|---|---|---:|");
    for [a, b, c, e, f] in rows {
        println!("| {a} | {b} | {c} | {e} | {f} |");
    }
}

/// D-Bus round trips over the private socket with N servers loaded.
fn dbus(socket: &Path, n: usize) -> Vec<[String; 5]> {
    use mcpd::dbus::{ManagerProxy, ServerProxy, server_path};
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let stream = std::os::unix::net::UnixStream::connect(socket).expect("connect");
        let conn = zbus::connection::Builder::unix_stream(stream)
            .p2p()
            .build()
            .await
            .expect("p2p");
        let manager = ManagerProxy::new(&conn).await.expect("proxy");
        let server = ServerProxy::builder(&conn)
            .path(server_path("u0"))
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .expect("proxy");
        let mut list = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            let rows = manager.list_servers().await.expect("ListServers");
            list.push(t.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(rows.len(), n);
        }
        let mut prop = Vec::new();
        for _ in 0..1000 {
            let t = Instant::now();
            let state = server.state().await.expect("State");
            prop.push(t.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(state, "running");
        }
        let mut call = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            server
                .call_tool("echo", "{\"text\":\"x\"}")
                .await
                .expect("CallTool");
            call.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let row = |figure: String, target: &str, xs: Vec<f64>| {
            let runs = xs.len();
            let (p50, p95, lo, hi) = stats(xs);
            [
                figure,
                target.to_owned(),
                format!("{p50:.3} ms"),
                format!("p95 {p95:.3}, {lo:.3}..{hi:.3} ms"),
                runs.to_string(),
            ]
        };
        vec![
            row(
                format!("D-Bus ListServers, {n} servers, private socket"),
                "p50 < 5 ms",
                list,
            ),
            row(
                "D-Bus property read (State), private socket".into(),
                "p50 < 0.3 ms",
                prop,
            ),
            row("D-Bus CallTool echo, private socket".into(), "-", call),
        ]
    })
}

/// Tool-call round trips: straight to a fixture over stdio, through
/// `mcpctl bridge` (stdio → D-Bus → daemon → stdio), and D-Bus `CallTool`.
fn call_overhead(d: &Daemon) -> Vec<[String; 5]> {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    const CALLS: usize = 500;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let args = serde_json::json!({"text": "x"})
            .as_object()
            .cloned()
            .expect("object");
        let time_calls = |client: rmcp::service::RunningService<rmcp::RoleClient, ()>| {
            let args = args.clone();
            async move {
                let mut xs = Vec::with_capacity(CALLS);
                for _ in 0..CALLS {
                    let t = Instant::now();
                    client
                        .call_tool(CallToolRequestParams::new("echo").with_arguments(args.clone()))
                        .await
                        .expect("echo");
                    xs.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                let _ = client.cancel().await;
                xs
            }
        };
        let spawn = |program: PathBuf, args: Vec<String>| {
            let mut child = tokio::process::Command::new(program)
                .args(args)
                .env("XDG_RUNTIME_DIR", d.runtime.path())
                .env_remove("DBUS_SESSION_BUS_ADDRESS")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn");
            let io = (
                child.stdout.take().expect("stdout"),
                child.stdin.take().expect("stdin"),
            );
            (child, io)
        };
        let (_direct_child, io) = spawn(
            release("examples/mcp-fixture"),
            vec!["--chatter".into(), "0".into()],
        );
        let direct = time_calls(().serve(io).await.expect("initialize")).await;
        let (_bridge_child, io) = spawn(
            release("mcpctl"),
            vec!["--user".into(), "bridge".into(), "u0".into()],
        );
        let bridged = time_calls(().serve(io).await.expect("initialize")).await;

        let proxied = through_mcp_proxy(&time_calls).await;

        let (d50, d95, _, _) = stats(direct.clone());
        let (b50, b95, _, _) = stats(bridged);
        let proxy_row = match proxied {
            Ok(xs) => {
                let (p50, p95, _, _) = stats(xs);
                [
                    "tool call through mcp-proxy (stdio → streamable HTTP)".into(),
                    "-".into(),
                    format!(
                        "{p50:.3} ms (+{:.3}; bridge/proxy overhead {:.2}×)",
                        p50 - d50,
                        (b50 - d50) / (p50 - d50)
                    ),
                    format!("p95 {p95:.3} ms (+{:.3})", p95 - d95),
                    CALLS.to_string(),
                ]
            }
            Err(reason) => [
                "tool call through mcp-proxy".into(),
                "-".into(),
                format!("skipped: {reason}"),
                "-".into(),
                "0".into(),
            ],
        };
        vec![
            [
                "tool call, direct stdio to the fixture".into(),
                "-".into(),
                format!("{d50:.3} ms"),
                format!("p95 {d95:.3} ms"),
                CALLS.to_string(),
            ],
            [
                "tool call through mcpctl bridge (overhead = minus direct)".into(),
                "overhead p50 < 1 ms".into(),
                format!("{b50:.3} ms (+{:.3})", b50 - d50),
                format!("p95 {b95:.3} ms (+{:.3})", b95 - d95),
                CALLS.to_string(),
            ],
            proxy_row,
        ]
    })
}

/// Times echo calls through mcp-proxy (PyPI) in front of a fixture;
/// installs it with pip when missing, or says why it cannot.
async fn through_mcp_proxy<F, Fut>(time_calls: &F) -> Result<Vec<f64>, String>
where
    F: Fn(rmcp::service::RunningService<rmcp::RoleClient, ()>) -> Fut,
    Fut: std::future::Future<Output = Vec<f64>>,
{
    use rmcp::ServiceExt;
    let have = |name: &str| {
        Command::new(name)
            .arg("--help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    };
    if !have("mcp-proxy") {
        let pip = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "mcp-proxy",
            ])
            .output()
            .map_err(|e| format!("cannot run pip: {e}"))?;
        if !pip.status.success() || !have("mcp-proxy") {
            return Err(format!(
                "cannot install mcp-proxy: {}",
                String::from_utf8_lossy(&pip.stderr).trim()
            ));
        }
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let mut proxy = tokio::process::Command::new("mcp-proxy")
        .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--"])
        .arg(release("examples/mcp-fixture"))
        .args(["--chatter", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start mcp-proxy: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("mcp-proxy did not listen within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(format!(
        "http://127.0.0.1:{port}/mcp"
    ));
    let client = ()
        .serve(transport)
        .await
        .map_err(|e| format!("initialize through mcp-proxy: {e}"))?;
    let xs = time_calls(client).await;
    let _ = proxy.kill().await;
    Ok(xs)
}
