//! Daemon benchmarks against the targets of the daemon, D-Bus and mcpctl
//! issues, driving the real `mcpd` on generated unit directories, on a
//! private `dbus-daemon` as well as its private socket:
//!
//! 1. start-up: N fixture units, exec → all running (target ≤ 1.5 s and
//!    ≤ 3× the floor at 500: the same fixtures spawned and listed without
//!    mcpd, in the same run), at N = 100 and 500, and the daemon's RSS at
//!    0, 100 and 500 servers;
//! 2. reload: one unit file changed among 500 → that unit running again
//!    (target p50 ≤ debounce + 50 ms); exactly one main PID changes;
//! 3. idle: daemon CPU time per 10 s with 100 running servers, over
//!    windows longer than the health probe interval (target < 10 ms; no
//!    polling), on the bus;
//! 4. D-Bus round trips: ListServers at 500, a property read, CallTool echo,
//!    over the private socket and over the bus;
//! 5. tool-call overhead: direct stdio to the fixture vs `mcpctl bridge` vs
//!    a bare byte relay (`examples/relay`, the floor of any proxy) vs
//!    D-Bus CallTool, and mcp-proxy (PyPI) in front of the same fixture;
//!    the same bridged call with the daemon logging to a real
//!    systemd-journald (`journald`: in a mount namespace of its own) vs
//!    to stderr;
//! 6. `mcpctl status` whole-process wall time at 500 servers, and of a
//!    small unit beside a unit of 100,000 tools vs without it;
//! 7. host sessions (`sessions`): server-everything through the bridge and
//!    through the bare relay vs direct, the bridge's start-up and RSS, 8 hosts on one server, the
//!    daemon's memory per idle session; a 2026-07-28 host's echo through the
//!    bridge vs a 2025-11-25 host's (fixture and server-everything);
//! 8. liveness (`liveness`): idle CPU with probes at the defaults (servers
//!    of 2026-07-28 vs of 2025), start to established (a server of both
//!    eras, `protocol "auto"` vs `"legacy"`), hung
//!    server detection time, the daemon's CPU under a stderr flood and a
//!    `list_changed` storm, another server's call latency and `mcpctl
//!    status` beside the flood;
//! 9. on-demand units (`ondemand`): idle server-everything units with
//!    cached lists (their processes, the daemon's memory per unit), the
//!    cold first call through the bridge vs the server's own cold start;
//! 10. per-host instances (`perhost`): a host's first call on a per-host
//!     unit vs the fixture's own cold start, the daemon's memory per
//!     running instance;
//! 11. the HTTP endpoint (`http`): a call over it vs direct stdio and vs
//!     supergateway (npm, pinned) on the same fixture, 64 HTTP sessions
//!     vs 64 bridges at once, the daemon's memory per idle HTTP session;
//! 12. telemetry (`telemetry`): a bridged call with OpenTelemetry export
//!     on (sample-ratio 1.0, a real OTLP receiver) vs off;
//! 13. lanes (`lanes`): a 2025 host's first call starting its lane vs the
//!     server's own cold start, and a call on either lane vs a bridged
//!     call of the same era without lanes;
//! 14. a host flooding (`flood`): a calm host's call beside a host
//!     flooding another unit vs quiet;
//! 15. OAuth (`oauth`): a call to an OAuth unit vs the same server with a
//!     static bearer header, and calls across token refreshes;
//! 16. comparisons: `bench/compare.py` (respawn delay under supervisord).
//!
//! Run through `bench/run` (release build); `cargo test` runs it as a smoke
//! run (see `common`). Sizes: `MCPD_BENCH_UNITS` (500),
//! `MCPD_BENCH_IDLE_UNITS` (100, also the smaller start-up size),
//! `MCPD_BENCH_STARTS` (3 start-ups per size), `MCPD_BENCH_RELOADS` (20),
//! `MCPD_BENCH_IDLE_SECS` (31: a window of the idle row, longer than the
//! 30 s probe interval), `MCPD_BENCH_TRIALS` (3 trials of each target row), `MCPD_BENCH_CALLS` (500 tool calls per
//! path), `MCPD_BENCH_COMPARE_SECS` (30 per supervisor),
//! `MCPD_BENCH_PROBE_SECS` (31: the idle window with probes),
//! `MCPD_BENCH_DETECTIONS` (5 hung servers), `MCPD_BENCH_FLOOD_SECS` (5),
//! `MCPD_BENCH_ONDEMAND_UNITS` (20), `MCPD_BENCH_COLD_CALLS` (20),
//! `MCPD_BENCH_CATALOG` (100,000 tools beside the small unit),
//! `MCPD_BENCH_HTTP_SESSIONS` (64) × `MCPD_BENCH_HTTP_CALLS` (500).
//! `MCPD_BENCH_ONLY=ondemand`, `perhost`, `http`, `journald`,
//! `telemetry`, `lanes`, `flood`, `oauth`, `startup` (start-up at `MCPD_BENCH_UNITS`
//! beside its floor, the fixtures spawned without mcpd), `sessions` (the tool-call paths and host
//! sessions), `everything` (server-everything direct, bridged and
//! relayed: the one ratio), `eras` (a 2026-07-28 host vs a 2025-11-25
//! host through the bridge, on the fixture and on server-everything;
//! probe cost and start to established, 2026-07-28 vs 2025 servers),
//! `aggregate` (a call through `mcpctl bridge u0+u1+u2` vs `mcpctl
//! bridge u0`) or `catalog` (`mcpctl status` beside a large catalog) runs
//! only that section (while working on it).

mod common;
#[path = "daemon/flood.rs"]
mod flood;
#[path = "daemon/http.rs"]
mod http;
#[path = "daemon/journald.rs"]
mod journald;
#[path = "daemon/lanes.rs"]
mod lanes;
#[path = "daemon/liveness.rs"]
mod liveness;
#[path = "daemon/oauth.rs"]
mod oauth;
#[path = "daemon/ondemand.rs"]
mod ondemand;
#[path = "daemon/perhost.rs"]
mod perhost;
#[path = "daemon/sessions.rs"]
mod sessions;
#[path = "daemon/telemetry.rs"]
mod telemetry;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Bus, Mode, Row, print_table, rss_kib, stats, venv_tool};
use mcpd::dbus::{ManagerProxy, ServerProxy, server_path};

struct Sizes {
    units: usize,
    idle_units: usize,
    starts: usize,
    reloads: usize,
    idle_secs: u64,
    calls: usize,
    round_trips: usize,
    status_runs: usize,
    churn_runs: usize,
    compare_secs: usize,
    bridge_starts: usize,
    host_calls: usize,
    sessions: usize,
    probe_secs: u64,
    detections: usize,
    flood_secs: u64,
    ondemand_units: usize,
    cold_calls: usize,
    restarts: usize,
    catalog: usize,
}

impl Sizes {
    fn new(mode: Mode) -> Self {
        Self {
            units: mode.size("MCPD_BENCH_UNITS", 500, 8),
            idle_units: mode.size("MCPD_BENCH_IDLE_UNITS", 100, 4),
            starts: mode.size("MCPD_BENCH_STARTS", 3, 1).max(1),
            reloads: mode.size("MCPD_BENCH_RELOADS", 20, 3).max(1),
            idle_secs: mode.size("MCPD_BENCH_IDLE_SECS", 31, 1) as u64,
            calls: mode.size("MCPD_BENCH_CALLS", 500, 20).max(1),
            round_trips: mode.size("MCPD_BENCH_ROUND_TRIPS", 1000, 20).max(1),
            status_runs: mode.size("MCPD_BENCH_STATUS_RUNS", 20, 2).max(1),
            churn_runs: mode.size("MCPD_BENCH_CHURN_RUNS", 10_000, 40).max(1),
            compare_secs: mode.size("MCPD_BENCH_COMPARE_SECS", 30, 5),
            bridge_starts: mode.size("MCPD_BENCH_BRIDGE_STARTS", 30, 2).max(1),
            host_calls: mode.size("MCPD_BENCH_HOST_CALLS", 1000, 10).max(1),
            sessions: mode.size("MCPD_BENCH_SESSIONS", 500, 5).max(1),
            probe_secs: mode.size("MCPD_BENCH_PROBE_SECS", 31, 1) as u64,
            detections: mode.size("MCPD_BENCH_DETECTIONS", 5, 1).max(1),
            flood_secs: mode.size("MCPD_BENCH_FLOOD_SECS", 5, 1) as u64,
            ondemand_units: mode.size("MCPD_BENCH_ONDEMAND_UNITS", 20, 2).max(1),
            cold_calls: mode.size("MCPD_BENCH_COLD_CALLS", 20, 1).max(1),
            restarts: mode.size("MCPD_BENCH_RESTARTS", 20, 2).max(1),
            catalog: mode.size("MCPD_BENCH_CATALOG", 100_000, 1_000),
        }
    }
}

/// The benchmark's fixture unit, pinned to the 2025 era (`protocol
/// "legacy"`): what direct stdio, the relays and supergateway speak to the
/// same fixture, so no row compares a translated call with an untranslated
/// one.
fn unit(tag: &str) -> String {
    format!(
        "stdio {{\n    command \"{}\" \"--name\" \"{tag}\" \"--chatter\" \"0\"\n}}\nstop-timeout \"2s\"\nprotocol \"legacy\"\n",
        common::binary("examples/mcp-fixture").display()
    )
}

struct Daemon {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
    runtime: tempfile::TempDir,
}

impl Daemon {
    /// Starts `mcpd --user` on `units`, on `bus` if given (else `--no-bus`).
    fn start(units: &Path, bus: Option<&Bus>) -> Self {
        let runtime = tempfile::tempdir().expect("tempdir");
        let state = runtime.path().join("state");
        Self::start_with(units, bus, runtime, &state, None)
    }

    /// [`Daemon::start`] (without a bus) with `--config settings`: the
    /// daemon's `mcpd.kdl` (its HTTP endpoint).
    fn start_configured(units: &Path, settings: &Path) -> Self {
        let runtime = tempfile::tempdir().expect("tempdir");
        let state = runtime.path().join("state");
        Self::start_with(units, None, runtime, &state, Some(settings))
    }

    /// [`Daemon::start`] keeping on-demand caches in `state`.
    fn start_in(units: &Path, bus: Option<&Bus>, state: &Path) -> Self {
        Self::start_with(
            units,
            bus,
            tempfile::tempdir().expect("tempdir"),
            state,
            None,
        )
    }

    fn start_with(
        units: &Path,
        bus: Option<&Bus>,
        runtime: tempfile::TempDir,
        state: &Path,
        settings: Option<&Path>,
    ) -> Self {
        let mut cmd = Command::new(common::binary("mcpd"));
        cmd.args(["--user", "--units"]).arg(units);
        if let Some(settings) = settings {
            cmd.arg("--config").arg(settings);
        }
        cmd.env("XDG_RUNTIME_DIR", runtime.path())
            .env("MCPD_STATE_DIR", state)
            // The log configuration a user's daemon has by default: every
            // line a server writes to stderr (the fixture's one per call)
            // is logged.
            .env_remove("MCPD_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        match bus {
            Some(bus) => cmd.env("DBUS_SESSION_BUS_ADDRESS", &bus.address),
            None => cmd.arg("--no-bus").env_remove("DBUS_SESSION_BUS_ADDRESS"),
        };
        let mut child = cmd.spawn().expect("spawn mcpd");
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
                .unwrap_or_else(|_| panic!("mcpd stopped logging; last lines: {seen:#?}"));
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

    fn private_socket(&self) -> PathBuf {
        self.runtime.path().join("mcpd/private")
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

/// CPU time of every thread of `pid`, in nanoseconds (schedstat): the
/// live threads', and what a thread seen earlier had when last seen (a
/// runtime's blocking-pool thread ends after 10 s idle, taking its
/// figures with it; it was idle, so they are final).
pub(crate) fn cpu_ns(pid: u32) -> u64 {
    static SEEN: std::sync::Mutex<BTreeMap<(u32, u32), u64>> =
        std::sync::Mutex::new(BTreeMap::new());
    let mut seen = SEEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            if let Some(ns) = std::fs::read_to_string(task.path().join("schedstat"))
                .ok()
                .and_then(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
            {
                seen.insert((pid, tid), ns);
            }
        }
    }
    seen.range((pid, 0)..=(pid, u32::MAX))
        .map(|(_, ns)| ns)
        .sum()
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

/// The floor of a start-up: `n` fixture processes spawned without mcpd,
/// each through what makes a unit running (initialize, initialized,
/// tools/list answered), `runs` times; returns the row and its stats.
fn start_up_floor(n: usize, runs: usize) -> (Row, common::Stats) {
    use std::io::Write;
    let fixture = common::binary("examples/mcp-fixture");
    let mut times = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        let mut children: Vec<Child> = (0..n)
            .map(|i| {
                Command::new(&fixture)
                    .args(["--name", &format!("f{i}"), "--chatter", "0"])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn the fixture")
            })
            .collect();
        let mut readers = Vec::with_capacity(n);
        for child in &mut children {
            let mut stdin = child.stdin.take().expect("stdin");
            stdin
                .write_all(concat!(
                    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"floor","version":"1"}}}"#,
                    "\n",
                    r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                    "\n",
                    r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
                    "\n"
                ).as_bytes())
                .expect("write");
            readers.push((
                stdin,
                std::io::BufReader::new(child.stdout.take().expect("stdout")),
            ));
        }
        for (_, reader) in &mut readers {
            let mut line = String::new();
            loop {
                line.clear();
                assert!(
                    reader.read_line(&mut line).expect("read") > 0,
                    "the fixture closed its stdout"
                );
                if line.contains(r#""id":2"#) {
                    break;
                }
            }
        }
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        drop(readers);
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    let s = stats(times);
    (
        Row::ms(
            format!(
                "start-up floor: {n} fixture processes spawned without mcpd, to tools/list answered"
            ),
            "-",
            s,
            0,
        ),
        s,
    )
}

/// Starts a daemon on `n` units `runs` times, each to all running; returns
/// the start-up row and the last daemon, still running. At 500 the row is
/// judged against 1.5 s and 3× `floor` (the same start without mcpd).
fn start_up(
    dir: &Path,
    n: usize,
    runs: usize,
    bus: Option<&Bus>,
    floor: Option<common::Stats>,
) -> (Row, Daemon) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..runs {
        drop(last.take());
        let started = Instant::now();
        let d = Daemon::start(dir, bus);
        let (all_up, _) = d.until(n, running);
        times.push((all_up - started).as_secs_f64() * 1000.0);
        last = Some(d);
    }
    let s = stats(times);
    let figure = format!("start-up: {n} units, exec to all running");
    let row = match floor.filter(|_| n >= 500) {
        Some(floor) => Row::new(
            figure,
            "≤ 1.5 s and ≤ 3× the floor at 500",
            format!("{:.0} ms ({:.2}× the floor)", s.p50, s.p50 / floor.p50),
            format!("p95 {:.0}, {:.0}..{:.0} ms", s.p95, s.min, s.max),
            s.runs,
        )
        .met(s.p50 <= 1500.0 && s.p50 <= 3.0 * floor.p50),
        None => Row::ms(figure, "-", s, 0),
    };
    (row, last.expect("at least one run"))
}

/// A p2p connection to the daemon's private socket.
async fn private(d: &Daemon) -> zbus::Connection {
    let stream = std::os::unix::net::UnixStream::connect(d.private_socket()).expect("connect");
    zbus::connection::Builder::unix_stream(stream)
        .p2p()
        .build()
        .await
        .expect("p2p")
}

/// A connection to `bus`, once the daemon owns its name there.
async fn on_bus(bus: &Bus) -> zbus::Connection {
    let conn = zbus::connection::Builder::address(bus.address.as_str())
        .build()
        .await
        .expect("bus");
    let dbus = zbus::fdo::DBusProxy::new(&conn).await.expect("DBus proxy");
    let name = zbus::names::BusName::try_from("org.mcpd1").expect("name");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !dbus.name_has_owner(name.clone()).await.unwrap_or(false) {
        assert!(Instant::now() < deadline, "mcpd never owned org.mcpd1");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    conn
}

async fn server(conn: &zbus::Connection, name: &str) -> ServerProxy<'static> {
    ServerProxy::builder(conn)
        .path(server_path(name))
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .expect("proxy")
}

/// Main PIDs of every server, by name.
async fn pids(conn: &zbus::Connection) -> BTreeMap<String, u32> {
    let manager = ManagerProxy::new(conn).await.expect("proxy");
    let mut out = BTreeMap::new();
    for row in manager.list_servers().await.expect("ListServers") {
        let pid = server(conn, &row.name)
            .await
            .main_pid()
            .await
            .expect("MainPID");
        out.insert(row.name, pid);
    }
    out
}

/// Round trips of `f`, in milliseconds.
async fn time<F, Fut>(runs: usize, mut f: F) -> Vec<f64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut xs = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        f().await;
        xs.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    xs
}

/// ListServers and a property read at `n` servers, over `conn`.
async fn dbus_reads(conn: &zbus::Connection, via: &str, n: usize, sizes: &Sizes) -> Vec<Row> {
    let manager = ManagerProxy::new(conn).await.expect("proxy");
    let u0 = server(conn, "u0").await;
    let list = time(sizes.round_trips / 5 + 1, || async {
        assert_eq!(manager.list_servers().await.expect("ListServers").len(), n);
    })
    .await;
    let prop = time(sizes.round_trips, || async {
        assert_eq!(u0.state().await.expect("State"), "running");
    })
    .await;
    let (list, prop) = (stats(list), stats(prop));
    vec![
        Row::ms(
            format!("D-Bus ListServers, {n} servers, {via}"),
            "p50 < 5 ms",
            list,
            3,
        )
        .met(list.p50 < 5.0),
        Row::ms(
            format!("D-Bus property read (State), {via}"),
            "p50 < 0.3 ms",
            prop,
            3,
        )
        .met(prop.p50 < 0.3),
    ]
}

fn main() {
    let mode = Mode::detect();
    let sizes = Sizes::new(mode);
    mode.announce();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let bus = Bus::try_start();
    let bus_skip = bus.as_ref().err().cloned();
    let bus = bus.ok();
    let mut rows = Vec::new();
    match std::env::var("MCPD_BENCH_ONLY").as_deref() {
        Ok("ondemand") => {
            print_table("Daemon", &ondemand::rows(&rt, &sizes));
            return;
        }
        Ok("perhost") => {
            print_table("Daemon", &perhost::rows(&rt, &sizes));
            return;
        }
        Ok("http") => {
            print_table("Daemon", &http::rows(&rt, &sizes));
            return;
        }
        Ok("journald") => {
            print_table("Daemon", &journald::rows(&rt, &sizes));
            return;
        }
        Ok("telemetry") => {
            print_table("Daemon", &telemetry::rows(&rt, &sizes));
            return;
        }
        Ok("lanes") => {
            print_table("Daemon", &lanes::rows(&rt, &sizes));
            return;
        }
        Ok("oauth") => {
            print_table("Daemon", &oauth::rows(&rt, &sizes));
            return;
        }
        Ok("flood") => {
            print_table("Daemon", &flood::rows(&rt, &sizes));
            return;
        }
        Ok("catalog") => {
            print_table("Daemon", &[beside_a_catalog(&rt, &sizes)]);
            return;
        }
        Ok("everything") => {
            let rows = rt.block_on(sessions::everything_rows(bus.as_ref(), &sizes));
            print_table("Daemon", &rows);
            return;
        }
        Ok("eras") => {
            let dir = units_dir(1);
            let d = Daemon::start(dir.path(), bus.as_ref());
            d.until(1, running);
            let fixture = rt.block_on(sessions::modern_vs_legacy(
                d.runtime.path(),
                "u0",
                "fixture",
                r#"{"text":"x"}"#,
                sizes.calls,
            ));
            let mut rows = vec![fixture];
            rows.extend(rt.block_on(sessions::everything_rows(bus.as_ref(), &sizes)));
            rows.push(liveness::idle_with_probes(&sizes, bus.as_ref()));
            rows.push(liveness::start_to_established(&sizes));
            print_table("Daemon", &rows);
            return;
        }
        Ok("aggregate") => {
            let dir = units_dir(3);
            let d = Daemon::start(dir.path(), bus.as_ref());
            d.until(3, running);
            let row = rt.block_on(sessions::aggregate_vs_one(d.runtime.path(), sizes.calls));
            print_table("Daemon", &[row]);
            return;
        }
        Ok("startup") => {
            let n = sizes.units;
            let dir = units_dir(n);
            let (floor_row, floor) = start_up_floor(n, sizes.starts);
            let (row, d) = start_up(dir.path(), n, sizes.starts, bus.as_ref(), Some(floor));
            drop(d);
            print_table("Daemon", &[row, floor_row]);
            return;
        }
        Ok("sessions") => {
            let m = sizes.idle_units;
            let dir = units_dir(m);
            let d = Daemon::start(dir.path(), bus.as_ref());
            d.until(m, running);
            let mut rows = rt.block_on(call_overhead(&d, bus.as_ref(), &sizes)).0;
            rows.extend(rt.block_on(sessions::rows(&d, bus.as_ref(), &sizes)));
            print_table("Daemon", &rows);
            return;
        }
        _ => {}
    }

    // RSS baseline: the daemon with no units
    let empty = units_dir(0);
    let d = Daemon::start(empty.path(), bus.as_ref());
    d.until(1, |l| l.contains("started 0 units"));
    let rss0 = settled_rss(&d);
    drop(d);

    // The smaller size: start-up, idle cost, tool-call paths
    let m = sizes.idle_units;
    let dir = units_dir(m);
    let (row, d) = start_up(dir.path(), m, sizes.starts, bus.as_ref(), None);
    rows.push(row);
    // Windows one after another from 1 s after all are running, each
    // longer than the health probe interval (30 s): each holds every
    // server's probe (the first window the first one).
    std::thread::sleep(Duration::from_secs(1));
    let window = Duration::from_secs(sizes.idle_secs);
    let mut per_10s = Vec::new();
    for _ in 0..common::trials() {
        let before = cpu_ns(d.pid());
        std::thread::sleep(window);
        let used = (cpu_ns(d.pid()) - before) as f64 / 1e6;
        per_10s.push(used * 10.0 / window.as_secs_f64().max(0.001));
    }
    let rss_m = rss_kib(&d.pid().to_string());
    let on = if bus.is_some() {
        "on the bus"
    } else {
        "--no-bus"
    };
    let cpu = stats(per_10s);
    let idle = Row::new(
        format!(
            "idle: daemon CPU per 10 s, {m} running servers (probes at the defaults, 30 s), windows of {} s, {on}",
            sizes.idle_secs
        ),
        "< 10 ms at 100",
        format!("{:.2} ms", cpu.p50),
        format!("trials {:.2}..{:.2} ms", cpu.min, cpu.max),
        cpu.runs,
    )
    .met(cpu.p50 < 10.0);
    let mut calls = rt.block_on(call_overhead(&d, bus.as_ref(), &sizes));
    let mut host_sessions = rt.block_on(sessions::rows(&d, bus.as_ref(), &sizes));
    let churn = client_churn(&d, m, &sizes);
    drop(d);

    // The larger size: start-up, reload, D-Bus reads, mcpctl status
    let n = sizes.units;
    let dir = units_dir(n);
    let (floor_row, floor) = start_up_floor(n, sizes.starts);
    let (row, d) = start_up(dir.path(), n, sizes.starts, bus.as_ref(), Some(floor));
    rows.push(row);
    rows.push(floor_row);
    let rss_n = settled_rss(&d);
    rows.push(Row::new(
        format!("daemon RSS with 0, {m} and {n} idle servers"),
        "-",
        format!(
            "{:.1} → {:.1} → {:.1} MiB",
            rss0 as f64 / 1024.0,
            rss_m as f64 / 1024.0,
            rss_n as f64 / 1024.0
        ),
        format!(
            "slope {:.1} KiB per server (0 → {n})",
            rss_n.saturating_sub(rss0) as f64 / n.max(1) as f64
        ),
        1,
    ));
    rows.push(idle);
    rows.extend(rt.block_on(reload(&d, dir.path(), n, &sizes)));
    rt.block_on(async {
        let conn = private(&d).await;
        rows.extend(dbus_reads(&conn, "private socket", n, &sizes).await);
        match (&bus, &bus_skip) {
            (Some(bus), _) => {
                let conn = on_bus(bus).await;
                rows.extend(dbus_reads(&conn, "bus", n, &sizes).await);
            }
            (None, Some(reason)) => {
                rows.push(Row::skipped_target(
                    "D-Bus ListServers and property read, bus",
                    "p50 < 5 ms; p50 < 0.3 ms",
                    reason,
                ));
            }
            (None, None) => unreachable!(),
        }
    });
    rows.push(mcpctl_status(&d, n, &sizes));
    drop(d);
    rows.push(beside_a_catalog(&rt, &sizes));
    rows.push(churn);
    rows.append(&mut calls.0);
    rows.extend(journald::rows(&rt, &sizes));
    rows.append(&mut host_sessions);
    rows.extend(liveness::rows(&rt, &sizes, bus.as_ref()));
    rows.extend(ondemand::rows(&rt, &sizes));
    rows.extend(perhost::rows(&rt, &sizes));
    rows.extend(http::rows(&rt, &sizes));
    rows.extend(telemetry::rows(&rt, &sizes));
    rows.extend(lanes::rows(&rt, &sizes));
    rows.extend(flood::rows(&rt, &sizes));
    rows.extend(oauth::rows(&rt, &sizes));
    print_table("Daemon", &rows);

    let mut comparisons = calls.1;
    comparisons.extend(compare(&sizes));
    print_table("Comparisons", &comparisons);
}

fn settled_rss(d: &Daemon) -> u64 {
    std::thread::sleep(Duration::from_millis(500));
    rss_kib(&d.pid().to_string())
}

/// Rewrites one unit file at a time (a changed command) and waits for that
/// unit to run again; every other server keeps its main PID.
async fn reload(d: &Daemon, dir: &Path, n: usize, sizes: &Sizes) -> Vec<Row> {
    let conn = private(d).await;
    let mut before = pids(&conn).await;
    assert_eq!(before.len(), n);
    let mut latencies = Vec::new();
    for r in 0..sizes.reloads {
        let name = format!("u{}", (r * 37) % n);
        let t0 = Instant::now();
        std::fs::write(
            dir.join(format!("{name}.kdl")),
            unit(&format!("{name}-r{r}")),
        )
        .expect("write");
        let field = format!("mcpd_server={name} ");
        let (up, _) = d.until(1, |l| running(l) && l.contains(&field));
        latencies.push((up - t0).as_secs_f64() * 1000.0);
        let after = pids(&conn).await;
        let changed: Vec<&String> = after
            .iter()
            .filter(|(k, pid)| before.get(*k) != Some(pid))
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            changed,
            [&name],
            "changing {name}.kdl must restart {name} and nothing else"
        );
        before = after;
    }
    let runs = latencies.len();
    vec![
        {
            let s = stats(latencies);
            Row::ms(
                format!("reload: 1 file changed among {n} → running again"),
                "≤ 150 ms (100 ms debounce + 50)",
                s,
                0,
            )
            .met(s.p50 <= 150.0)
        },
        // Asserted above for every reload.
        Row::new(
            "main PIDs changed per reload (checked over all servers)",
            "exactly 1",
            "1",
            "-",
            runs,
        )
        .met(true),
    ]
}

fn mcpctl_status(d: &Daemon, n: usize, sizes: &Sizes) -> Row {
    let mut walls = Vec::new();
    for _ in 0..sizes.status_runs {
        let t = Instant::now();
        let out = Command::new(common::binary("mcpctl"))
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
    let s = stats(walls);
    Row::ms(
        format!("mcpctl status, {n} servers, whole process"),
        "< 100 ms",
        s,
        1,
    )
    .met(s.p50 < 100.0)
}

/// `mcpctl status small` beside a unit of `sizes.catalog` tools vs on a
/// daemon with `small` alone: both daemons run at once and the runs
/// alternate, so the machine's noise falls on both alike. Every run is a
/// new private-socket client; the daemon's CPU per run is the cost a
/// client's connection and reads put on it.
fn beside_a_catalog(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Row {
    let n = sizes.catalog;
    let count = n.to_string();
    let daemons = [false, true].map(|big| {
        let dir = tempfile::tempdir().expect("tempdir");
        liveness::fixture(dir.path(), "small", &[], "");
        if big {
            let args = ["--many-tools", &count, "--page-size", "10000"];
            liveness::fixture(dir.path(), "big", &args, "");
        }
        let d = Daemon::start(dir.path(), None);
        d.until(if big { 2 } else { 1 }, running);
        (d, dir)
    });
    // The catalog is listed in full before the first run.
    let tools = rt.block_on(async {
        let conn = private(&daemons[1].0).await;
        let manager = ManagerProxy::new(&conn).await.expect("proxy");
        manager
            .list_servers()
            .await
            .expect("ListServers")
            .iter()
            .map(|r| r.tools as usize)
            .sum::<usize>()
    });
    assert_eq!(tools, 2 * 9 + n, "small's and big's tools");
    let mut walls = [Vec::new(), Vec::new()];
    let mut cpu = [0u64; 2];
    for _ in 0..sizes.status_runs {
        for (i, (d, _)) in daemons.iter().enumerate() {
            let before = cpu_ns(d.pid());
            let t = Instant::now();
            let out = Command::new(common::binary("mcpctl"))
                .args(["--user", "status", "small"])
                .env("XDG_RUNTIME_DIR", d.runtime.path())
                .env_remove("DBUS_SESSION_BUS_ADDRESS")
                .output()
                .expect("mcpctl");
            walls[i].push(t.elapsed().as_secs_f64() * 1000.0);
            cpu[i] += cpu_ns(d.pid()) - before;
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let runs = sizes.status_runs;
    let [alone, beside] = walls.map(|w| stats(w).p50);
    let [cpu_alone, cpu_beside] = cpu.map(|c| c as f64 / 1e6 / runs as f64);
    Row::new(
        format!(
            "mcpctl status of a small unit beside a unit of {n} tools vs without, whole process"
        ),
        "within 2×",
        format!("{beside:.1} vs {alone:.1} ms: {:.2}×", beside / alone),
        format!("daemon CPU per run {cpu_beside:.1} vs {cpu_alone:.1} ms"),
        runs,
    )
    .met(beside <= 2.0 * alone)
}

/// Open file descriptors of `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// The daemon's fds and RSS before and after `churn_runs` runs of `mcpctl
/// status` (two at a time), each a private-socket client that comes and
/// goes: what a host polling the status costs over a day.
fn client_churn(d: &Daemon, m: usize, sizes: &Sizes) -> Row {
    let runtime = d.runtime.path();
    let status = || {
        let out = Command::new(common::binary("mcpctl"))
            .args(["--user", "status"])
            .env("XDG_RUNTIME_DIR", runtime)
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .output()
            .expect("mcpctl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let runs = |n: usize| {
        std::thread::scope(|scope| {
            for share in [n / 2, n - n / 2] {
                scope.spawn(move || (0..share).for_each(|_| status()));
            }
        });
    };
    // Released connections go asynchronously: wait (bounded) for the count
    // to stop falling.
    let settled_fds = || {
        let mut last = fds(d.pid());
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(100));
            let now = fds(d.pid());
            if now == last {
                break;
            }
            last = now;
        }
        last
    };
    runs(sizes.churn_runs.min(100));
    let (fds0, rss0) = (settled_fds(), settled_rss(d));
    runs(sizes.churn_runs);
    let (fds1, rss1) = (settled_fds(), settled_rss(d));
    let grew_fds = fds1.saturating_sub(fds0);
    let grew_kib = rss1.saturating_sub(rss0);
    Row::new(
        format!(
            "daemon fds and RSS after {} mcpctl status runs, {m} servers",
            sizes.churn_runs
        ),
        "unchanged within 64 fds and 1 MiB",
        format!("+{grew_fds} fds, +{grew_kib} KiB"),
        format!(
            "fds {fds0} → {fds1}, RSS {:.1} → {:.1} MiB",
            rss0 as f64 / 1024.0,
            rss1 as f64 / 1024.0
        ),
        sizes.churn_runs,
    )
    .met(grew_fds <= 64 && grew_kib <= 1024)
}

type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

/// Echo round trips through an MCP client, which is then closed.
async fn time_mcp_calls(client: Client, calls: usize) -> Vec<f64> {
    use rmcp::model::CallToolRequestParams;
    let args = serde_json::json!({"text": "x"})
        .as_object()
        .cloned()
        .expect("object");
    let xs = time(calls, || async {
        let result = client
            .call_tool(CallToolRequestParams::new("echo").with_arguments(args.clone()))
            .await
            .expect("echo");
        assert_ne!(result.is_error, Some(true), "{result:?}");
    })
    .await;
    let _ = client.cancel().await;
    xs
}

/// Tool-call round trips: straight to a fixture over stdio, through
/// `mcpctl bridge` (stdio → host session socket → daemon → stdio), D-Bus `CallTool` on
/// the private socket and on the bus, and mcp-proxy. Returns the daemon's
/// rows and the comparison row.
async fn call_overhead(d: &Daemon, bus: Option<&Bus>, sizes: &Sizes) -> (Vec<Row>, Vec<Row>) {
    use rmcp::ServiceExt;
    let spawn = |program: PathBuf, args: &[&str]| sessions::spawn(&program, args, d.runtime.path());
    let (_direct, io) = spawn(common::binary("examples/mcp-fixture"), &["--chatter", "0"]);
    let direct = ().serve(io).await.expect("initialize");
    let (_bridge, io) = spawn(common::binary("mcpctl"), &["--user", "bridge", "u0"]);
    let bridged = ().serve(io).await.expect("initialize");
    let fixture = common::binary("examples/mcp-fixture");
    let fixture = fixture.to_str().expect("a UTF-8 path");
    let (_relay, io) = spawn(
        common::binary("examples/relay"),
        &[fixture, "--chatter", "0"],
    );
    let relayed = ().serve(io).await.expect("initialize");
    // Call by call in turn, so the machine's noise falls on all alike;
    // D-Bus calls after each trial's, against that trial's direct calls.
    let echo = serde_json::json!({"text": "x"});
    let (private_conn, bus_conn) = (
        private(d).await,
        match bus {
            Some(bus) => Ok(on_bus(bus).await),
            None => Err("no dbus-daemon"),
        },
    );
    let dbus_calls = |conn: &zbus::Connection| {
        let conn = conn.clone();
        async move {
            let u0 = server(&conn, "u0").await;
            stats(
                time(sizes.calls, || async {
                    let out = u0
                        .call_tool("echo", "{\"text\":\"x\"}")
                        .await
                        .expect("CallTool");
                    assert!(out.contains("\"x\""), "{out}");
                })
                .await,
            )
        }
    };
    let mut trials = Vec::new();
    for _ in 0..common::trials() {
        let [direct_xs, bridged_xs, relayed_xs] =
            sessions::in_turn([&direct, &bridged, &relayed], sizes.calls, "echo", &echo).await;
        let over_private = dbus_calls(&private_conn).await;
        let over_bus = match &bus_conn {
            Ok(conn) => Some(dbus_calls(conn).await),
            Err(_) => None,
        };
        trials.push((
            stats(direct_xs),
            stats(bridged_xs),
            stats(relayed_xs),
            over_private,
            over_bus,
        ));
    }
    for client in [direct, bridged, relayed] {
        let _ = client.cancel().await;
    }
    let direct: Vec<common::Stats> = trials.iter().map(|t| t.0).collect();
    let vs_direct = |pick: &dyn Fn(&_) -> common::Stats| -> Vec<(common::Stats, common::Stats)> {
        trials.iter().map(|t| (pick(t), t.0)).collect()
    };
    // Overheads over direct: the median of the trials' differences of p50s.
    let overhead = |pairs: &[(common::Stats, common::Stats)]| {
        let d = common::Ratio::difference(pairs);
        let r = common::Ratio::of(pairs);
        (
            d.p50,
            format!("{:.3} ms ({:+.3})", r.a, d.p50),
            format!(
                "trials {:+.3}..{:+.3}; p95 {:.3} ms ({:+.3})",
                d.min,
                d.max,
                r.a95,
                r.a95 - r.b95
            ),
            r.runs,
        )
    };
    let direct_p50 = stats(direct.iter().map(|s| s.p50).collect());
    let mut rows = vec![Row::new(
        "tool call, direct stdio to the fixture",
        "-",
        format!("{:.3} ms", direct_p50.p50),
        format!("trials {:.3}..{:.3} ms", direct_p50.min, direct_p50.max),
        direct.iter().map(|s| s.runs).sum(),
    )];
    let bridged = vs_direct(&|t| t.1);
    let (over, m, s, runs) = overhead(&bridged);
    rows.push(
        Row::new(
            "tool call through mcpctl bridge (+ overhead over direct)",
            "overhead p50 ≤ 0.07 ms",
            m,
            s,
            runs,
        )
        .met(over <= 0.07),
    );
    let (_, m, s, runs) = overhead(&vs_direct(&|t| t.2));
    rows.push(Row::new(
        "tool call through a bare relay (examples/relay: the floor of any proxy) (+ overhead)",
        "-",
        m,
        s,
        runs,
    ));
    let (over, m, s, runs) = overhead(&vs_direct(&|t| t.3));
    rows.push(
        Row::new(
            "tool call through D-Bus CallTool, private socket (+ overhead)",
            "overhead p50 < 0.5 ms",
            m,
            s,
            runs,
        )
        .met(over < 0.5),
    );
    rows.push(match &bus_conn {
        Ok(_) => {
            let (over, m, s, runs) = overhead(&vs_direct(&|t| t.4.expect("on the bus")));
            Row::new(
                "tool call through D-Bus CallTool, bus (+ overhead)",
                "overhead p50 < 0.5 ms",
                m,
                s,
                runs,
            )
            .met(over < 0.5)
        }
        Err(reason) => Row::skipped_target(
            "tool call through D-Bus CallTool, bus",
            "overhead p50 < 0.5 ms",
            reason,
        ),
    });
    let (direct, bridged) = (
        common::Stats {
            p50: direct_p50.p50,
            ..direct[0]
        },
        common::Ratio::of(&bridged),
    );

    let proxy = match through_mcp_proxy(sizes.calls).await {
        Ok(xs) => {
            let p = stats(xs);
            Row::new(
                "tool call through mcp-proxy (stdio → streamable HTTP), vs mcpctl bridge",
                "-",
                format!(
                    "{:.3} ms (+{:.3}); bridge overhead / proxy overhead = {:.2}",
                    p.p50,
                    p.p50 - direct.p50,
                    (bridged.a - direct.p50) / (p.p50 - direct.p50)
                ),
                format!("p95 {:.3} ms (+{:.3})", p.p95, p.p95 - direct.p95),
                p.runs,
            )
        }
        Err(reason) => Row::skipped("tool call through mcp-proxy", &reason),
    };
    (rows, vec![proxy])
}

/// Times echo calls through mcp-proxy (PyPI) in front of a fixture.
async fn through_mcp_proxy(calls: usize) -> Result<Vec<f64>, String> {
    use rmcp::ServiceExt;
    let program = venv_tool("mcp-proxy")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let mut proxy = tokio::process::Command::new(program)
        .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--"])
        .arg(common::binary("examples/mcp-fixture"))
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
    let xs = time_mcp_calls(client, calls).await;
    let _ = proxy.kill().await;
    Ok(xs)
}

/// `bench/compare.py`: the same crashing fixture under mcpd and supervisord.
fn compare(sizes: &Sizes) -> Vec<Row> {
    let mut cmd = Command::new("python3");
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/compare.py"))
        .arg(common::profile_dir())
        .arg(sizes.compare_secs.to_string());
    match venv_tool("supervisord") {
        Ok(path) => cmd.arg("--supervisord").arg(path),
        Err(reason) => cmd.arg("--skip-supervisord").arg(reason),
    };
    let out = cmd
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .stderr(Stdio::inherit())
        .output()
        .expect("python3 bench/compare.py");
    assert!(out.status.success(), "bench/compare.py failed");
    let rows: Vec<Row> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line
                .trim()
                .strip_prefix('|')?
                .strip_suffix('|')?
                .split('|')
                .map(str::trim)
                .collect();
            let (figure, target, median, spread, runs, met) = match cells[..] {
                [figure, target, median, spread, runs] => {
                    (figure, target, median, spread, runs, None)
                }
                [figure, target, median, spread, runs, met] => {
                    (figure, target, median, spread, runs, Some(met == "yes"))
                }
                _ => return None,
            };
            let row = Row::new(figure, target, median, spread, runs.parse().ok()?);
            Some(match met {
                Some(met) => row.met(met),
                None => row,
            })
        })
        .collect();
    assert_eq!(
        rows.len(),
        3,
        "compare.py prints a row per supervisor and their ratio"
    );
    assert!(
        rows[0].runs > 0,
        "mcpd restarted the crashing fixture no time in {} s",
        sizes.compare_secs
    );
    rows
}
