//! Host sessions (issue 14 targets): `mcpctl bridge` in front of the
//! reference server (`@modelcontextprotocol/server-everything`, from
//! `target/npm`, which `.ci/run` installs) vs a direct stdio session; the
//! bridge's start-up and RSS; 8 hosts on one server vs one direct session
//! with 8 calls in flight; the daemon's memory per idle host session.

use std::io::{BufRead, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;

use super::common::{self, Bus, Row, rss_kib, stats};
use super::{Client, Daemon, Sizes, cpu_ns, private, server};

/// The reference server's entry point, if installed.
pub fn everything() -> Result<PathBuf, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if !path.is_file() {
        return Err(format!(
            "{} is missing (.ci/run installs tests/npm)",
            path.display()
        ));
    }
    Ok(path)
}

/// `program args` with piped stdio, for a daemon's runtime dir.
pub fn spawn(
    program: &Path,
    args: &[&str],
    runtime: &Path,
) -> (
    tokio::process::Child,
    (tokio::process::ChildStdout, tokio::process::ChildStdin),
) {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env("XDG_RUNTIME_DIR", runtime)
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
}

fn params(tool: &str, arguments: serde_json::Value) -> CallToolRequestParams {
    let serde_json::Value::Object(arguments) = arguments else {
        unreachable!("arguments are an object")
    };
    CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments)
}

/// Round trips of `tool` on each client in turn, one at a time (so the
/// machine's noise falls on all alike): milliseconds of each, per client.
pub async fn in_turn<const N: usize>(
    clients: [&Client; N],
    calls: usize,
    tool: &str,
    arguments: &serde_json::Value,
) -> [Vec<f64>; N] {
    let mut xs = std::array::from_fn(|_| Vec::with_capacity(calls));
    for _ in 0..calls {
        for (client, xs) in clients.iter().zip(xs.iter_mut()) {
            xs.push(one(client, tool, arguments).await);
        }
    }
    xs
}

/// [`in_turn`] [`common::trials`] times: each trial's stats, per client.
pub async fn in_trials<const N: usize>(
    clients: [&Client; N],
    calls: usize,
    tool: &str,
    arguments: &serde_json::Value,
) -> Vec<[common::Stats; N]> {
    let mut trials = Vec::new();
    for _ in 0..common::trials() {
        let xs = in_turn(clients, calls, tool, arguments).await;
        trials.push(xs.map(stats));
    }
    trials
}

/// One round trip, in milliseconds.
async fn one(client: &Client, tool: &str, arguments: &serde_json::Value) -> f64 {
    let t = Instant::now();
    let result = client
        .call_tool(params(tool, arguments.clone()))
        .await
        .expect("call");
    assert_ne!(result.is_error, Some(true), "{result:?}");
    t.elapsed().as_secs_f64() * 1000.0
}

/// server-everything's `echo`: direct, through the bridge and through
/// both bare relays (the one-thread event-driven `examples/tokio-relay`,
/// the bridge's target's floor, and the two-thread blocking
/// `examples/relay`), the same rmcp client on each, call by call in turn,
/// [`common::trials`] times; then through the bridge from a 2026-07-28
/// host vs a 2025-11-25 one.
async fn everything_overhead(bus: Option<&Bus>, sizes: &Sizes) -> Result<Vec<Row>, String> {
    let server = everything()?;
    let server = server.to_str().ok_or("a non-UTF-8 path")?.to_owned();
    let units = tempfile::tempdir().map_err(|e| e.to_string())?;
    std::fs::write(
        units.path().join("everything.kdl"),
        format!("stdio {{\n    command \"node\" \"{server}\" \"stdio\"\n}}\nprotocol \"legacy\"\n"),
    )
    .map_err(|e| e.to_string())?;
    let d = Daemon::start(units.path(), bus);
    d.until(1, super::running);
    let echo = serde_json::json!({"message": "x"});
    let (_direct, io) = spawn(Path::new("node"), &[&server, "stdio"], d.runtime.path());
    let direct = ().serve(io).await.map_err(|e| e.to_string())?;
    let (_bridge, io) = spawn(
        &common::binary("mcpctl"),
        &["--user", "bridge", "everything"],
        d.runtime.path(),
    );
    let bridged = ().serve(io).await.map_err(|e| e.to_string())?;
    let relay = |name: &str| {
        spawn(
            &common::binary(name),
            &["node", &server, "stdio"],
            d.runtime.path(),
        )
    };
    let (_tokio_relay, io) = relay("examples/tokio-relay");
    let tokio_relayed = ().serve(io).await.map_err(|e| e.to_string())?;
    let (_relay, io) = relay("examples/relay");
    let relayed = ().serve(io).await.map_err(|e| e.to_string())?;
    let trials = in_trials(
        [&direct, &bridged, &tokio_relayed, &relayed],
        sizes.calls,
        "echo",
        &echo,
    )
    .await;
    for client in [direct, bridged, tokio_relayed, relayed] {
        let _ = client.cancel().await;
    }
    let pairs = |a: usize, b: usize| -> Vec<_> { trials.iter().map(|t| (t[a], t[b])).collect() };
    let vs_tokio = common::Ratio::of(&pairs(1, 2));
    let vs_direct = common::Ratio::of(&pairs(1, 0));
    let rows = vec![
        Row::ratio(
            "server-everything echo through mcpctl bridge, vs the one-thread event-driven relay (examples/tokio-relay), same client",
            // Issue 54 (was ≤ 1.15× direct).
            "p50 ≤ 1.10× tokio-relay",
            &vs_tokio,
            "",
        )
        .met(vs_tokio.median <= 1.10),
        Row::ratio(
            "server-everything echo through mcpctl bridge, vs direct stdio",
            "p50 ≤ 1.25× direct",
            &vs_direct,
            "",
        )
        .met(vs_direct.median <= 1.25),
        Row::ratio(
            "server-everything echo through the one-thread event-driven relay (examples/tokio-relay), vs direct stdio",
            "-",
            &common::Ratio::of(&pairs(2, 0)),
            "",
        ),
        Row::ratio(
            "server-everything echo through the two-thread blocking relay (examples/relay), vs direct stdio",
            "-",
            &common::Ratio::of(&pairs(3, 0)),
            "",
        ),
    ];
    let era = modern_vs_legacy(
        d.runtime.path(),
        "everything",
        "server-everything",
        r#"{"message":"x"}"#,
        sizes.calls,
    )
    .await;
    Ok(rows.into_iter().chain([era]).collect())
}

/// A host writing JSON-RPC lines to `mcpctl bridge` and reading its
/// answers, in either era: a 2025-11-25 host initializes first; a
/// 2026-07-28 host does not, and stamps each request's `_meta` with its
/// version and capabilities.
pub struct LineHost {
    _bridge: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::BufReader<tokio::process::ChildStdout>,
    modern: bool,
    next: u64,
}

/// The longest any one answer may take.
const ANSWER: Duration = Duration::from_secs(10);

impl LineHost {
    pub async fn attach(runtime: &Path, unit: &str, modern: bool) -> Result<Self, String> {
        Self::spawn(
            &common::binary("mcpctl"),
            &["--user", "bridge", unit],
            runtime,
            modern,
        )
        .await
    }

    /// A host of `program args` itself (a server over stdio, or a bridge).
    pub async fn spawn(
        program: &Path,
        args: &[&str],
        runtime: &Path,
        modern: bool,
    ) -> Result<Self, String> {
        let (bridge, (stdout, stdin)) = spawn(program, args, runtime);
        let mut host = Self {
            _bridge: bridge,
            stdin,
            stdout: tokio::io::BufReader::new(stdout),
            modern,
            next: 1,
        };
        if !modern {
            host.request(
                r#""method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}"#,
            )
            .await?;
            host.write(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
                .await?;
        }
        Ok(host)
    }

    async fn write(&mut self, line: &str) -> Result<(), String> {
        use tokio::io::AsyncWriteExt;
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))
    }

    /// Sends a request (`members`: its method and params) and waits for
    /// its answer, skipping whatever else arrives.
    async fn request(&mut self, members: &str) -> Result<serde_json::Value, String> {
        use tokio::io::AsyncBufReadExt;
        let id = self.next;
        self.next += 1;
        self.write(&format!(r#"{{"jsonrpc":"2.0","id":{id},{members}}}"#))
            .await?;
        let mut line = String::new();
        loop {
            line.clear();
            let n = tokio::time::timeout(ANSWER, self.stdout.read_line(&mut line))
                .await
                .map_err(|_| format!("no answer in {ANSWER:?}"))?
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("the bridge closed its stdout".into());
            }
            let answer: serde_json::Value =
                serde_json::from_str(&line).map_err(|e| format!("{e}: {line}"))?;
            if answer["id"] != id {
                continue;
            }
            return match answer.get("result") {
                Some(result) if result["isError"] != true => Ok(answer),
                _ => Err(line.trim_end().to_owned()),
            };
        }
    }

    /// One `tools/call` of `tool` with `arguments` (JSON text), in
    /// milliseconds.
    pub async fn call(&mut self, tool: &str, arguments: &str) -> Result<f64, String> {
        let meta = if self.modern {
            r#","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#
        } else {
            ""
        };
        let members = format!(
            r#""method":"tools/call","params":{{"name":"{tool}","arguments":{arguments}{meta}}}"#
        );
        let t = Instant::now();
        self.request(&members).await?;
        Ok(t.elapsed().as_secs_f64() * 1000.0)
    }
}

/// `echo` on `unit` through the bridge: a 2026-07-28 host vs a 2025-11-25
/// host, both writing raw lines, call by call in turn.
pub async fn modern_vs_legacy(
    runtime: &Path,
    unit: &str,
    what: &str,
    arguments: &str,
    calls: usize,
) -> Row {
    let figure = format!(
        "{what} echo through mcpctl bridge, 2026-07-28 host (no initialize, _meta on each request) vs 2025-11-25 host"
    );
    let target = "p50 ≤ 1.25× the 2025-11-25 host";
    let timed = async {
        let mut legacy = LineHost::attach(runtime, unit, false).await?;
        let mut modern = LineHost::attach(runtime, unit, true).await?;
        let mut trials = Vec::new();
        for _ in 0..common::trials() {
            let (mut legacy_xs, mut modern_xs) = (Vec::new(), Vec::new());
            for _ in 0..calls {
                legacy_xs.push(legacy.call("echo", arguments).await?);
                modern_xs.push(
                    modern
                        .call("echo", arguments)
                        .await
                        .map_err(|e| format!("the 2026-07-28 host's call: {e}"))?,
                );
            }
            trials.push((stats(modern_xs), stats(legacy_xs)));
        }
        Ok::<_, String>(common::Ratio::of(&trials))
    };
    match timed.await {
        Ok(r) => Row::ratio(figure, target, &r, "").met(r.median <= 1.25),
        // Until mcpd serves 2026-07-28 hosts: the row says why, and misses.
        Err(why) => Row::new(figure, target, format!("fails: {why}"), "-", 0).met(false),
    }
}

/// `echo` through `mcpctl bridge u0+u1+u2` (an aggregate of three
/// fixture units, DESIGN §14) vs through `mcpctl bridge u0`, both 2025
/// hosts writing raw lines, call by call in turn.
pub async fn aggregate_vs_one(runtime: &Path, calls: usize) -> Row {
    let figure =
        "fixture echo through mcpctl bridge u0+u1+u2 (aggregate of 3 units) vs mcpctl bridge u0";
    let target = "p50 ≤ 1.1× the unit's own bridge";
    let timed = async {
        let mut one = LineHost::attach(runtime, "u0", false).await?;
        let mut many = LineHost::attach(runtime, "u0+u1+u2", false).await?;
        let mut trials = Vec::new();
        for _ in 0..common::trials() {
            let (mut one_xs, mut many_xs) = (Vec::new(), Vec::new());
            for _ in 0..calls {
                one_xs.push(one.call("echo", r#"{"text":"x"}"#).await?);
                many_xs.push(
                    many.call("u0__echo", r#"{"text":"x"}"#)
                        .await
                        .map_err(|e| format!("the aggregate's call: {e}"))?,
                );
            }
            trials.push((stats(many_xs), stats(one_xs)));
        }
        Ok::<_, String>(common::Ratio::of(&trials))
    };
    match timed.await {
        Ok(r) => Row::ratio(figure, target, &r, "").met(r.median <= 1.1),
        Err(why) => Row::new(figure, target, format!("fails: {why}"), "-", 0).met(false),
    }
}

/// `mcpctl bridge` from exec to the answer to `initialize`, and its RSS.
fn bridge_start(d: &Daemon, sizes: &Sizes) -> Vec<Row> {
    let initialize = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}
"#;
    let mut xs = Vec::new();
    let mut rss = Vec::new();
    let mut anon = Vec::new();
    for _ in 0..sizes.bridge_starts {
        let t = Instant::now();
        let mut child = Command::new(common::binary("mcpctl"))
            .args(["--user", "bridge", "u0"])
            .env("XDG_RUNTIME_DIR", d.runtime.path())
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mcpctl bridge");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(initialize).expect("write");
        let mut answer = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut answer)
            .expect("read");
        xs.push(t.elapsed().as_secs_f64() * 1000.0);
        assert!(answer.contains("\"result\""), "{answer}");
        rss.push(rss_kib(&child.id().to_string()) as f64 / 1024.0);
        anon.push(anon_kib(child.id()) as f64 / 1024.0);
        drop(stdin);
        let _ = child.wait();
    }
    let start = stats(xs);
    let rss = stats(rss);
    let anon = stats(anon);
    vec![
        Row::ms(
            "mcpctl bridge: exec to the answer to initialize",
            "≤ 10 ms",
            start,
            2,
        )
        .met(start.p50 <= 10.0),
        Row::new(
            "mcpctl bridge RSS, attached",
            "≤ 4 MiB",
            format!("{:.1} MiB ({:.1} MiB not file-backed)", rss.p50, anon.p50),
            format!("{:.1}..{:.1} MiB", rss.min, rss.max),
            rss.runs,
        )
        .met(rss.p50 <= 4.0),
    ]
}

/// The anonymous (not file-backed, so not shared) part of `pid`'s RSS.
fn anon_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Rounds of the 8-host comparison: direct and shared take turns, so a
/// slow spell of the machine falls on both alike.
const ROUNDS: usize = 5;

/// 8 bridges on one server, each making its calls one at a time, vs one
/// direct session with 8 calls in flight: [`ROUNDS`] turns each, the
/// median of the turns' ratios judged.
async fn eight_hosts(d: &Daemon, sizes: &Sizes) -> Row {
    let fixture = common::binary("examples/mcp-fixture");
    let per_round = sizes.host_calls.div_ceil(ROUNDS);
    let echo = || params("echo", serde_json::json!({"text": "x"}));
    let (_direct, io) = spawn(&fixture, &["--chatter", "0"], d.runtime.path());
    let direct = ().serve(io).await.expect("initialize");
    let mut bridges = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (child, io) = spawn(
            &common::binary("mcpctl"),
            &["--user", "bridge", "u0"],
            d.runtime.path(),
        );
        bridges.push(child);
        clients.push(().serve(io).await.expect("initialize"));
    }
    let calls = (8 * per_round) as f64;
    let (mut direct_rates, mut shared_rates, mut shares) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cpu, mut shared_calls) = (0, 0.0);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let lanes = (0..8).map(|_| async {
            for _ in 0..per_round {
                direct.call_tool(echo()).await.expect("echo");
            }
        });
        futures_util::future::join_all(lanes).await;
        let direct_rate = calls / t.elapsed().as_secs_f64();

        let t = Instant::now();
        let before = cpu_ns(d.pid());
        let hosts = clients.iter().map(|client| async move {
            for _ in 0..per_round {
                client.call_tool(echo()).await.expect("echo");
            }
        });
        futures_util::future::join_all(hosts).await;
        let shared_rate = calls / t.elapsed().as_secs_f64();
        cpu += cpu_ns(d.pid()) - before;
        shared_calls += calls;
        shares.push(shared_rate / direct_rate);
        direct_rates.push(direct_rate);
        shared_rates.push(shared_rate);
    }
    let _ = direct.cancel().await;
    for client in clients {
        let _ = client.cancel().await;
    }
    let cpu_per_call = cpu as f64 / 1000.0 / shared_calls;
    let (share, direct_rate, shared_rate) =
        (stats(shares), stats(direct_rates), stats(shared_rates));
    Row::new(
        format!(
            "8 hosts × {} calls on one server through bridges, vs one direct session with 8 in flight ({ROUNDS} turns each)",
            per_round * ROUNDS
        ),
        "≥ 80 % of direct",
        format!(
            "{:.0} vs {:.0} calls/s: {:.0} %",
            shared_rate.p50,
            direct_rate.p50,
            share.p50 * 100.0
        ),
        format!(
            "turns {:.0}..{:.0} %; daemon CPU {cpu_per_call:.0} µs per call",
            share.min * 100.0,
            share.max * 100.0
        ),
        ROUNDS,
    )
    .met(share.p50 >= 0.8)
}

/// One host's calls on u0 through a bridge, one at a time: quiet, then
/// while u1 is restarted every 50 ms (each restart stops a process and
/// forks, cgroup and all, a new one, on the daemon every session shares).
async fn beside_restarts(d: &Daemon, sizes: &Sizes) -> Row {
    let (_bridge, io) = spawn(
        &common::binary("mcpctl"),
        &["--user", "bridge", "u0"],
        d.runtime.path(),
    );
    let client = ().serve(io).await.expect("initialize");
    let echo = serde_json::json!({"text": "x"});
    let mut quiet = Vec::new();
    for _ in 0..sizes.calls {
        quiet.push(one(&client, "echo", &echo).await);
    }
    let conn = private(d).await;
    let u1 = server(&conn, "u1").await;
    let done = std::sync::atomic::AtomicBool::new(false);
    let restarts = async {
        for _ in 0..sizes.restarts {
            u1.restart().await.expect("Restart");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    };
    let calls = async {
        let mut xs = Vec::new();
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            xs.push(one(&client, "echo", &echo).await);
        }
        xs
    };
    let ((), busy) = tokio::join!(restarts, calls);
    let _ = client.cancel().await;
    let (quiet, busy) = (stats(quiet), stats(busy));
    Row::new(
        format!(
            "tool call through mcpctl bridge while another server restarts every 50 ms ({} restarts), vs quiet",
            sizes.restarts
        ),
        "-",
        format!("p50 {:.3} vs {:.3} ms", busy.p50, quiet.p50),
        format!(
            "p95 {:.3} vs {:.3}, max {:.1} vs {:.1} ms",
            busy.p95, quiet.p95, busy.max, quiet.max
        ),
        busy.runs,
    )
}

/// The daemon's RSS growth per idle, initialized host session.
async fn idle_sessions(d: &Daemon, sizes: &Sizes) -> Row {
    let n = sizes.sessions;
    let conn = private(d).await;
    let u0 = server(&conn, "u0").await;
    // A first one, so what every session shares is allocated already.
    let mut sockets = Vec::new();
    let open = async || {
        let fd: std::os::fd::OwnedFd = u0.attach().await.expect("Attach").into();
        let socket = UnixStream::from(fd);
        let mut writer = socket.try_clone().expect("clone");
        writer
            .write_all(br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}
"#)
            .expect("write");
        let mut answer = String::new();
        std::io::BufReader::new(socket.try_clone().expect("clone"))
            .read_line(&mut answer)
            .expect("read");
        assert!(answer.contains("\"result\""), "{answer}");
        socket
    };
    sockets.push(open().await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss_kib(&d.pid().to_string());
    for _ in 0..n {
        sockets.push(open().await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = rss_kib(&d.pid().to_string());
    let per = after.saturating_sub(before) as f64 / n as f64;
    drop(sockets);
    Row::new(
        format!("daemon memory per idle host session ({n} attached and initialized)"),
        "≤ 16 KiB",
        format!("{per:.1} KiB"),
        format!(
            "RSS {:.1} → {:.1} MiB",
            before as f64 / 1024.0,
            after as f64 / 1024.0
        ),
        1,
    )
    .met(per <= 16.0)
}

/// Only the server-everything rows (`MCPD_BENCH_ONLY=everything`).
pub async fn everything_rows(bus: Option<&Bus>, sizes: &Sizes) -> Vec<Row> {
    match everything_overhead(bus, sizes).await {
        Ok(rows) => rows,
        Err(reason) => vec![Row::skipped_target(
            "server-everything echo through mcpctl bridge",
            "p50 ≤ 1.10× tokio-relay and ≤ 1.25× direct",
            &reason,
        )],
    }
}

/// Every host-session row.
pub async fn rows(d: &Daemon, bus: Option<&Bus>, sizes: &Sizes) -> Vec<Row> {
    let mut rows = Vec::new();
    match everything_overhead(bus, sizes).await {
        Ok(everything) => rows.extend(everything),
        Err(reason) => rows.push(Row::skipped_target(
            "server-everything echo through mcpctl bridge",
            "p50 ≤ 1.10× tokio-relay and ≤ 1.25× direct",
            &reason,
        )),
    }
    rows.push(
        modern_vs_legacy(
            d.runtime.path(),
            "u0",
            "fixture",
            r#"{"text":"x"}"#,
            sizes.calls,
        )
        .await,
    );
    rows.push(aggregate_vs_one(d.runtime.path(), sizes.calls).await);
    rows.extend(bridge_start(d, sizes));
    rows.push(eight_hosts(d, sizes).await);
    rows.push(beside_restarts(d, sizes).await);
    rows.push(idle_sessions(d, sizes).await);
    rows
}
