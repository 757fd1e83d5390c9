//! The HTTP endpoint (issue 37 targets, DESIGN §15), with the fixture
//! unit `u0` behind a daemon whose `mcpd.kdl` serves `127.0.0.1:0` with a
//! token (the default `auth "token"`):
//!
//! - `tools/call` echo over the endpoint (a 2025-11-25 session, one
//!   keep-alive connection, hyper's HTTP/1.1 client) vs straight to a
//!   fixture over stdio (JSON-RPC lines), and vs the same client through
//!   supergateway (npm, pinned, `--stateful`: one child, sessions) in front
//!   of the same fixture, call by call in turn;
//! - `MCPD_BENCH_HTTP_SESSIONS` (64) HTTP sessions, each on its own
//!   connection, making `MCPD_BENCH_HTTP_CALLS` (500) calls one at a time,
//!   all at once, vs as many `mcpctl bridge` hosts on the same server;
//! - the daemon's RSS per idle HTTP session (initialized, its connection
//!   kept open), the slope over `MCPD_BENCH_SESSIONS` (at most 200)
//!   sessions; and per session whose client closed its connection.
//!
//! A smoke run never installs supergateway (no network): its row is
//! skipped saying so unless `target/bench-npm` has it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, StatusCode, header};

use super::common::{self, Mode, Row, stats};
use super::sessions::LineHost;
use super::{Daemon, Sizes, settled_rss};

/// supergateway, as installed for the comparison.
const SUPERGATEWAY: (&str, &str) = ("supergateway", "4.0.0");
/// Rounds of the concurrent comparison: bridges and HTTP sessions take
/// turns, so a slow spell of the machine falls on both alike.
const ROUNDS: usize = 3;
/// The longest any one answer may take.
const ANSWER: Duration = Duration::from_secs(30);

pub fn rows(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Vec<Row> {
    match measure(rt, sizes) {
        Ok(rows) => rows,
        Err(reason) => vec![
            Row::new(
                "tool call over mcpd's HTTP endpoint",
                "-",
                format!("fails: {reason}"),
                "-",
                0,
            )
            .met(false),
        ],
    }
}

fn measure(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Result<Vec<Row>, String> {
    let mode = Mode::detect();
    let lanes = mode.size("MCPD_BENCH_HTTP_SESSIONS", 64, 4).max(1);
    let per_lane = mode.size("MCPD_BENCH_HTTP_CALLS", 500, 5).max(1);
    // Twice that many sessions are open at once, on a unit that takes
    // 512 host sessions.
    let idle = sizes.sessions.min(250);
    let units = super::units_dir(1);
    let settings = units.path().join("mcpd.kdl.settings");
    std::fs::write(
        &settings,
        format!(
            "http {{\n    listen \"127.0.0.1:0\"\n    max-sessions {}\n}}\n",
            2 * idle + 2 * lanes + 8
        ),
    )
    .map_err(|e| e.to_string())?;
    let d = Daemon::start_configured(units.path(), &settings);
    let (_, lines) = d.until(2, |l| {
        super::running(l) || l.contains("HTTP endpoint listening on ")
    });
    let addr: SocketAddr = lines
        .iter()
        .find_map(|l| {
            l.split("listening on ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .ok_or("the daemon logged no address")?;
    let token = new_token(&d)?;
    let token = Some(token.as_str());

    // Memory first, on a daemon nothing else has used yet.
    let mut rows = rt.block_on(idle_sessions(&d, addr, token, idle))?;
    let mut latency_rows = rt.block_on(latency(&d, addr, token, sizes))?;
    latency_rows.push(rt.block_on(concurrent(&d, addr, token, lanes, per_lane))?);
    latency_rows.append(&mut rows);
    Ok(latency_rows)
}

/// A token from `mcpctl token new` for the daemon's state directory.
fn new_token(d: &Daemon) -> Result<String, String> {
    let out = std::process::Command::new(common::binary("mcpctl"))
        .args(["--user", "token", "new", "bench"])
        .env("XDG_RUNTIME_DIR", d.runtime.path())
        .env("MCPD_STATE_DIR", d.runtime.path().join("state"))
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .output()
        .map_err(|e| format!("mcpctl token new: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mcpctl token new: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// One Streamable HTTP session (2025-11-25) on a keep-alive connection of
/// its own, as an SDK's client holds one.
struct Http {
    sender: SendRequest<Full<Bytes>>,
    host: String,
    path: String,
    authorization: Option<String>,
    session: Option<String>,
    next: u64,
}

impl Http {
    /// Connects to `addr` and initializes a session at `path`.
    async fn open(addr: SocketAddr, path: &str, token: Option<&str>) -> Result<Self, String> {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(connection);
        let mut http = Self {
            sender,
            host: addr.to_string(),
            path: path.to_owned(),
            authorization: token.map(|t| format!("Bearer {t}")),
            session: None,
            next: 1,
        };
        http.request(
            r#""method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}"#,
        )
        .await?;
        if http.session.is_none() {
            return Err("initialize was answered without Mcp-Session-Id".into());
        }
        let (status, _) = http
            .post(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.into())
            .await?;
        if status != StatusCode::ACCEPTED {
            return Err(format!("notifications/initialized: {status}"));
        }
        Ok(http)
    }

    async fn send(
        &mut self,
        method: hyper::Method,
        body: String,
    ) -> Result<(StatusCode, Bytes), String> {
        let mut request = Request::builder()
            .method(method)
            .uri(&self.path)
            .header(header::HOST, &self.host)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream");
        if let Some(auth) = &self.authorization {
            request = request.header(header::AUTHORIZATION, auth);
        }
        if let Some(session) = &self.session {
            request = request
                .header("mcp-session-id", session)
                .header("mcp-protocol-version", "2025-11-25");
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let exchange = async {
            self.sender
                .ready()
                .await
                .map_err(|e| format!("connection: {e}"))?;
            let response = self
                .sender
                .send_request(request)
                .await
                .map_err(|e| format!("request: {e}"))?;
            let status = response.status();
            if let Some(id) = response.headers().get("mcp-session-id") {
                self.session = Some(id.to_str().map_err(|e| e.to_string())?.to_owned());
            }
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("body: {e}"))?
                .to_bytes();
            Ok::<_, String>((status, body))
        };
        tokio::time::timeout(ANSWER, exchange)
            .await
            .map_err(|_| format!("no answer in {ANSWER:?}"))?
    }

    async fn post(&mut self, body: String) -> Result<(StatusCode, Bytes), String> {
        self.send(hyper::Method::POST, body).await
    }

    /// Sends a request (`members`: its method and params) and reads its
    /// answer (the one JSON body, or the SSE stream the answer ends).
    async fn request(&mut self, members: &str) -> Result<(), String> {
        let id = self.next;
        self.next += 1;
        let (status, body) = self
            .post(format!(r#"{{"jsonrpc":"2.0","id":{id},{members}}}"#))
            .await?;
        let text = String::from_utf8_lossy(&body);
        let answered = text.contains(&format!(r#""id":{id}"#)) && text.contains(r#""result""#);
        if status != StatusCode::OK || !answered || text.contains(r#""isError":true"#) {
            return Err(format!("{status}: {}", text.trim_end()));
        }
        Ok(())
    }

    /// One `tools/call` of `echo`, in milliseconds.
    async fn echo(&mut self) -> Result<f64, String> {
        let t = Instant::now();
        self.request(r#""method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}"#)
            .await?;
        Ok(t.elapsed().as_secs_f64() * 1000.0)
    }

    /// Ends the session (DELETE).
    async fn close(mut self) {
        let _ = self.send(hyper::Method::DELETE, String::new()).await;
    }
}

/// examples/http-relay in front of a fixture, listening.
async fn http_relay(
    fixture: &std::path::Path,
) -> Result<(tokio::process::Child, SocketAddr), String> {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(common::binary("examples/http-relay"))
        .arg(fixture)
        .args(["--chatter", "0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start examples/http-relay: {e}"))?;
    let stdout = child.stdout.take().ok_or("http-relay: no stdout")?;
    let mut line = String::new();
    tokio::time::timeout(
        ANSWER,
        tokio::io::BufReader::new(stdout).read_line(&mut line),
    )
    .await
    .map_err(|_| "http-relay printed no address".to_owned())?
    .map_err(|e| format!("http-relay: {e}"))?;
    let addr = line
        .trim()
        .parse()
        .map_err(|e| format!("http-relay printed {line:?}: {e}"))?;
    Ok((child, addr))
}

/// supergateway in front of a fixture, listening, or why not.
async fn supergateway() -> Result<(tokio::process::Child, SocketAddr), String> {
    let (package, version) = SUPERGATEWAY;
    let program = common::npm_tool(package, version, package, Mode::detect() == Mode::Full)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let fixture = common::binary("examples/mcp-fixture");
    let child = tokio::process::Command::new(program)
        .arg("--stdio")
        .arg(format!("{} --chatter 0", fixture.display()))
        .args(["--outputTransport", "streamableHttp", "--stateful"])
        .args(["--port", &port.to_string(), "--logLevel", "none"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start supergateway: {e}"))?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if Instant::now() > deadline {
            return Err("supergateway did not listen within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok((child, addr))
}

/// Echo round trips, call by call in turn: direct stdio, mcpd's HTTP
/// endpoint and (where it can be had) supergateway.
async fn latency(
    d: &Daemon,
    addr: SocketAddr,
    token: Option<&str>,
    sizes: &Sizes,
) -> Result<Vec<Row>, String> {
    let fixture = common::binary("examples/mcp-fixture");
    let mut direct =
        LineHost::spawn(&fixture, &["--chatter", "0"], d.runtime.path(), false).await?;
    let mut http = Http::open(addr, "/mcp/u0", token).await?;
    let (_floor, floor_at) = http_relay(&fixture).await?;
    let mut floor = Http::open(floor_at, "/mcp", None).await?;
    let mut gateway = match supergateway().await {
        Ok((child, at)) => match Http::open(at, "/mcp", None).await {
            Ok(session) => Ok((child, session)),
            Err(why) => Err(format!("supergateway's session: {why}")),
        },
        Err(why) => Err(why),
    };
    // Per trial: direct, mcpd, the floor, supergateway.
    let mut trials: Vec<[Option<common::Stats>; 4]> = Vec::new();
    for _ in 0..common::trials() {
        let mut xs: [Vec<f64>; 4] = Default::default();
        // The order turns with each round, so that each front follows each
        // other equally often (what one leaves running after its call,
        // Node's most of all, lands on whichever calls next).
        for round in 0..sizes.calls {
            for turn in 0..4 {
                let front = (round + turn) % 4;
                let took = match front {
                    0 => direct.call("echo", r#"{"text":"x"}"#).await?,
                    1 => http.echo().await?,
                    2 => floor.echo().await?,
                    _ => match &mut gateway {
                        Ok((_, session)) => session.echo().await?,
                        Err(_) => continue,
                    },
                };
                xs[front].push(took);
            }
        }
        trials.push(xs.map(|xs| (!xs.is_empty()).then(|| stats(xs))));
    }
    http.close().await;
    let pairs = |a: usize, b: usize| -> Vec<_> {
        trials.iter().filter_map(|t| Some((t[a]?, t[b]?))).collect()
    };
    let (vs_floor, vs_direct) = (
        common::Ratio::of(&pairs(1, 2)),
        common::Ratio::of(&pairs(1, 0)),
    );
    let mut rows = vec![
        Row::ratio(
            "fixture echo over mcpd's HTTP endpoint (2025-11-25 session, keep-alive, token), vs a bare HTTP front (examples/http-relay: the floor of any HTTP front to a stdio server), same client",
            // Issue 54 (was ≤ 1.5× direct stdio, below the floor itself).
            "p50 ≤ 1.25× http-relay",
            &vs_floor,
            "",
        )
        .met(vs_floor.median <= 1.25),
        Row::ratio(
            "fixture echo over mcpd's HTTP endpoint, vs direct stdio (JSON-RPC lines on a pipe: another client)",
            "-",
            &vs_direct,
            "",
        ),
        Row::ratio(
            "fixture echo through the bare HTTP front (examples/http-relay), vs direct stdio",
            "-",
            &common::Ratio::of(&pairs(2, 0)),
            "",
        ),
    ];
    let figure = "fixture echo over mcpd's HTTP endpoint vs through supergateway 4.0.0 (stdio → Streamable HTTP, --stateful), same client";
    let target = "mcpd p50 ≤ 30 % of supergateway's";
    rows.push(match gateway {
        Ok((_child, session)) => {
            session.close().await;
            let share = common::Ratio::of(&pairs(1, 3));
            Row::new(
                figure,
                target,
                format!(
                    "{:.3} ms vs {:.3} ms: {:.0} %",
                    share.a,
                    share.b,
                    share.median * 100.0
                ),
                format!(
                    "trials {:.0}..{:.0} %; p95 {:.3} vs {:.3} ms",
                    share.min * 100.0,
                    share.max * 100.0,
                    share.a95,
                    share.b95
                ),
                share.runs,
            )
            .met(share.median <= 0.30)
        }
        Err(why) => Row::skipped_target(figure, target, &why),
    });
    Ok(rows)
}

/// `lanes` HTTP sessions vs `lanes` bridges on u0, each lane making
/// `per_lane` calls one at a time, all lanes at once, [`ROUNDS`] turns
/// each: the aggregate calls/s, the median of the turns' ratios judged.
async fn concurrent(
    d: &Daemon,
    addr: SocketAddr,
    token: Option<&str>,
    lanes: usize,
    per_lane: usize,
) -> Result<Row, String> {
    let mut bridges = Vec::with_capacity(lanes);
    let mut sessions = Vec::with_capacity(lanes);
    for _ in 0..lanes {
        bridges.push(LineHost::attach(d.runtime.path(), "u0", false).await?);
        sessions.push(Http::open(addr, "/mcp/u0", token).await?);
    }
    let calls = (lanes * per_lane) as f64;
    let (mut bridge_rates, mut http_rates, mut shares) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cpu, mut http_calls) = (0, 0.0);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let runs = bridges.iter_mut().map(|host| async move {
            for _ in 0..per_lane {
                host.call("echo", r#"{"text":"x"}"#).await?;
            }
            Ok::<_, String>(())
        });
        for outcome in futures_util::future::join_all(runs).await {
            outcome?;
        }
        let bridge_rate = calls / t.elapsed().as_secs_f64();

        let before = super::cpu_ns(d.pid());
        let t = Instant::now();
        let runs = sessions.iter_mut().map(|session| async move {
            for _ in 0..per_lane {
                session.echo().await?;
            }
            Ok::<_, String>(())
        });
        for outcome in futures_util::future::join_all(runs).await {
            outcome?;
        }
        let http_rate = calls / t.elapsed().as_secs_f64();
        cpu += super::cpu_ns(d.pid()) - before;
        http_calls += calls;
        shares.push(http_rate / bridge_rate);
        bridge_rates.push(bridge_rate);
        http_rates.push(http_rate);
    }
    for session in sessions {
        session.close().await;
    }
    drop(bridges);
    let (share, bridge_rate, http_rate) = (stats(shares), stats(bridge_rates), stats(http_rates));
    Ok(Row::new(
        format!(
            "{lanes} HTTP sessions × {} calls on one server, all at once, vs {lanes} bridges ({ROUNDS} turns each)",
            per_lane * ROUNDS
        ),
        "≥ 70 % of the bridges' calls/s",
        format!(
            "{:.0} vs {:.0} calls/s: {:.0} %",
            http_rate.p50,
            bridge_rate.p50,
            share.p50 * 100.0
        ),
        format!(
            "turns {:.0}..{:.0} %; daemon CPU {:.0} µs per HTTP call",
            share.min * 100.0,
            share.max * 100.0,
            cpu as f64 / 1000.0 / http_calls
        ),
        ROUNDS,
    )
    .met(share.p50 >= 0.7))
}

/// The daemon's RSS growth per idle, initialized HTTP session whose
/// client keeps its connection open; then per session whose client closed
/// its connection (the session alone: it lasts until DELETE or its idle
/// end).
async fn idle_sessions(
    d: &Daemon,
    addr: SocketAddr,
    token: Option<&str>,
    n: usize,
) -> Result<Vec<Row>, String> {
    // A first one, so what every session shares is allocated already.
    let mut sessions = vec![Http::open(addr, "/mcp/u0", token).await?];
    let before = settled_rss(d);
    for _ in 0..n {
        sessions.push(Http::open(addr, "/mcp/u0", token).await?);
    }
    let after = settled_rss(d);
    let per = after.saturating_sub(before) as f64 / n as f64;
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        // Its connection closes as it goes.
        let session = Http::open(addr, "/mcp/u0", token).await?;
        ids.push(session.session.clone());
    }
    let alone = settled_rss(d);
    let per_alone = alone.saturating_sub(after) as f64 / n as f64;
    for session in sessions {
        session.close().await;
    }
    let mut closer = Http::open(addr, "/mcp/u0", token).await?;
    for id in ids {
        closer.session = id;
        let _ = closer.send(hyper::Method::DELETE, String::new()).await;
    }
    Ok(vec![
        Row::new(
            format!("daemon memory per idle HTTP session ({n} initialized, each on its open keep-alive connection)"),
            "≤ 16 KiB",
            format!("{per:.1} KiB"),
            format!(
                "RSS {:.1} → {:.1} MiB",
                before as f64 / 1024.0,
                after as f64 / 1024.0
            ),
            1,
        )
        .met(per <= 16.0),
        Row::new(
            format!("daemon memory per idle HTTP session whose client closed its connection ({n} more)"),
            "-",
            format!("{per_alone:.1} KiB"),
            format!(
                "RSS {:.1} → {:.1} MiB",
                after as f64 / 1024.0,
                alone as f64 / 1024.0
            ),
            1,
        ),
    ])
}
