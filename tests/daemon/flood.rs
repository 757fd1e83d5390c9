//! Hosts that send faster than their server reads (issue 49), under the
//! real `mcpd`: a server stopped with SIGSTOP, and hosts flooding it
//! through `mcpctl bridge` (notifications, small and 2 KB, and
//! requests), through an aggregate, and through the HTTP endpoint. What
//! waits for the server is bounded by host (`mux::session::toward`): the
//! daemon stays small, a host of another unit is answered throughout, and
//! the flood's cost is in `mcpctl status`.

use std::time::{Duration, Instant};

use rustix::process::Signal;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::daemon::http::{INITIALIZE as HTTP_INITIALIZE, JSON, endpoint_with, header, request};
use crate::helper::{BOUND, bridge_command, rss_kib, timed_out};

const INITIALIZE: &str = concat!(
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
    "\n",
    r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    "\n",
);

/// How long the hosts flood.
const FLOOD: Duration = Duration::from_secs(10);

/// A host behind `mcpctl bridge ARGS`, initialized: its bridge, its
/// stdin, and its stdout's lines.
struct Host {
    _child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Host {
    async fn new(runtime: &std::path::Path, args: &[&str]) -> Self {
        let mut command = bridge_command(runtime, args[0]);
        command.args(&args[1..]).stderr(std::process::Stdio::null());
        let mut child = command.spawn().expect("spawn mcpctl bridge");
        let mut stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        stdin.write_all(INITIALIZE.as_bytes()).await.expect("write");
        let first = tokio::time::timeout(BOUND, lines.next_line())
            .await
            .expect("initialize answered in time")
            .expect("read")
            .expect("a line");
        let first: Value = serde_json::from_str(&first).expect("json");
        assert_eq!(first["id"], 1, "{first}");
        Self {
            _child: child,
            stdin,
            lines,
        }
    }

    /// Calls the fixture's `echo` with `text` (id `id`): the time the
    /// answer took.
    async fn echo(&mut self, id: u64, text: &str) -> Duration {
        let call = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"echo\",\"arguments\":{{\"text\":\"{text}\"}}}}}}\n"
        );
        let started = Instant::now();
        self.stdin.write_all(call.as_bytes()).await.expect("write");
        loop {
            let line = tokio::time::timeout(BOUND, self.lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("{}", timed_out(format!("the answer to {id}"), BOUND)))
                .expect("read")
                .expect("a line");
            let answer: Value = serde_json::from_str(&line).expect("json");
            if answer["id"] == id {
                assert_eq!(answer["result"]["content"][0]["text"], text, "{answer}");
                return started.elapsed();
            }
        }
    }

    /// Writes `lines` until `until`, as fast as the daemon takes them,
    /// reading (and dropping) what it is sent: the bytes written. Ends
    /// only at `until` or when aborted (a held-back host's write waits).
    fn flood(self, lines: Vec<Vec<u8>>, until: Instant) -> tokio::task::JoinHandle<u64> {
        self.flood_counted(lines, until, Default::default())
    }

    /// [`Host::flood`], counting the bytes written in `written` as they
    /// are (a held-back host's count is known while its write waits).
    fn flood_counted(
        self,
        lines: Vec<Vec<u8>>,
        until: Instant,
        counted: std::sync::Arc<std::sync::atomic::AtomicU64>,
    ) -> tokio::task::JoinHandle<u64> {
        let Host {
            _child: child,
            mut stdin,
            lines: mut from_daemon,
        } = self;
        tokio::spawn(async move {
            let _child = child;
            let drain =
                tokio::spawn(
                    async move { while let Ok(Some(_)) = from_daemon.next_line().await {} },
                );
            let mut written = 0;
            'flood: loop {
                for line in &lines {
                    if Instant::now() >= until {
                        break 'flood;
                    }
                    if stdin.write_all(line).await.is_err() {
                        break 'flood;
                    }
                    written += line.len() as u64;
                    counted.fetch_add(line.len() as u64, std::sync::atomic::Ordering::Relaxed);
                }
            }
            drain.abort();
            written
        })
    }
}

/// A notification line of about `size` bytes.
fn notification(size: usize) -> Vec<u8> {
    let pad = "x".repeat(size.saturating_sub(100));
    format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x-flood\",\"params\":{{\"pad\":\"{pad}\"}}}}\n"
    )
    .into_bytes()
}

/// `mcpctl status NAME --json`'s object.
fn status(runtime: &std::path::Path, name: &str) -> Value {
    let out = crate::helper::mcpctl_user(runtime, &["status", name, "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout).expect("json");
    status[0].clone()
}

#[test]
fn hosts_flooding_a_stopped_server_are_slowed_or_shed_and_the_daemon_stays_small() {
    let units = tempfile::tempdir().expect("tempdir");
    // One process each (the test stops `stuck`'s): pinned to one era.
    std::fs::write(
        units.path().join("stuck.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\nprotocol \"2026-07-28\"\nhealth {\n    enabled #false\n}\n",
    )
    .expect("write");
    std::fs::write(
        units.path().join("calm.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\nprotocol \"2026-07-28\"\n",
    )
    .expect("write");
    let (mut d, _settings, addr) = endpoint_with(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n    auth \"none\"\n}\n",
        &[],
    );
    d.wait_until("both running", |d| {
        d.starts("stuck") == 1 && d.starts("calm") == 1
    });
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let pid = d.pid();
    let server = d.latest_pid("stuck").expect("stuck's pid");
    // An HTTP session on the stuck unit.
    let (code, headers, body) = request(
        addr,
        "POST",
        "/mcp/stuck",
        &JSON,
        HTTP_INITIALIZE.as_bytes(),
    );
    assert_eq!(code, 200, "{body}");
    let session = header(&headers, "mcp-session-id")
        .expect("session")
        .to_owned();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (baseline, peak, latencies, http_sent) = rt.block_on(async {
        let mut calm = Host::new(&runtime, &["calm"]).await;
        calm.echo(2, "warm").await;
        let notifier = Host::new(&runtime, &["stuck"]).await;
        let caller = Host::new(&runtime, &["stuck"]).await;
        let aggregated = Host::new(&runtime, &["stuck", "calm"]).await;
        let baseline = rss_kib(pid);
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(server as i32).expect("pid"),
            Signal::STOP,
        )
        .expect("SIGSTOP");
        let until = Instant::now() + FLOOD;
        let small_and_2k = vec![notification(100), notification(2048)];
        let calls: Vec<Vec<u8>> = (10..2010)
            .map(|id| {
                format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"echo\",\"arguments\":{{\"text\":\"{id}\"}}}}}}\n"
                )
                .into_bytes()
            })
            .collect();
        let floods = [
            notifier.flood(small_and_2k.clone(), until),
            caller.flood(calls, until),
            aggregated.flood(vec![notification(2048)], until),
        ];
        // The HTTP endpoint: 32 KB notifications, one request each.
        let http = std::thread::spawn(move || {
            let mut h: Vec<(&str, &str)> = JSON.to_vec();
            h.push(("Mcp-Session-Id", &session));
            let body = notification(32 << 10);
            let mut sent = 0u64;
            while Instant::now() < until {
                let (code, _, answer) = request(addr, "POST", "/mcp/stuck", &h, &body);
                assert_eq!(code, 202, "{answer}");
                sent += 1;
            }
            sent
        });
        // The daemon's RSS, sampled apart from the calm host's calls.
        let sampler = std::thread::spawn(move || {
            let mut peak = baseline;
            while Instant::now() < until {
                peak = peak.max(rss_kib(pid));
                std::thread::sleep(Duration::from_millis(50)); // the sampling period
            }
            peak
        });
        let mut latencies = Vec::new();
        let mut id = 100;
        while Instant::now() < until {
            latencies.push(calm.echo(id, "calm").await);
            id += 1;
            tokio::time::sleep(Duration::from_millis(100)).await; // the calm host's pace
        }
        let (http_sent, peak) = tokio::task::spawn_blocking(move || {
            (
                http.join().expect("http flood"),
                sampler.join().expect("sampler"),
            )
        })
        .await
        .expect("join");
        for flood in floods {
            // A host held back still waits in its write: ended here.
            flood.abort();
        }
        let peak = peak.max(rss_kib(pid));
        (baseline, peak, latencies, http_sent)
    });
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(server as i32).expect("pid"),
        Signal::CONT,
    )
    .expect("SIGCONT");
    // The server works again, for a new host.
    rt.block_on(async {
        let mut after = Host::new(&runtime, &["stuck"]).await;
        after.echo(7, "after").await;
    });
    let growth = peak.saturating_sub(baseline);
    let slowest = latencies.iter().max().copied().unwrap_or_default();
    eprintln!(
        "flood: daemon RSS {baseline} KiB at the start, peak {peak} KiB (+{growth} KiB); {} calls of the calm host, slowest {slowest:?}; {http_sent} HTTP notifications",
        latencies.len()
    );
    assert!(growth < 64 * 1024, "the daemon grew by {growth} KiB");
    // A call every 100 ms at its usual latency (an aggregate reading its
    // flooding host at full speed made it 2.9 s, and 8 calls).
    assert!(
        latencies.len() >= 20,
        "{} calls in {FLOOD:?}",
        latencies.len()
    );
    assert!(
        slowest < Duration::from_millis(1500),
        "the calm host's slowest call took {slowest:?}"
    );
    // What the flood cost, in status.
    let stuck = status(&runtime, "stuck");
    assert!(stuck["slowed_sessions"].as_u64() >= Some(2), "{stuck}");
    assert!(
        stuck["dropped_host_notifications"].as_u64() > Some(0),
        "{stuck}"
    );
    let out = crate::helper::mcpctl_user(&runtime, &["status", "stuck"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("sessions slowed"), "{text}");
    assert!(text.contains("notifications from hosts dropped"), "{text}");
    // And in the journal.
    d.wait_for("is not reading what it is sent");
    assert!(d.stop(Signal::TERM).success());
}

fn median(mut of: Vec<Duration>) -> Duration {
    of.sort();
    of.get(of.len() / 2).copied().unwrap_or_default()
}

/// An aggregate holds back its own host (issue 49): a host floods
/// notifications through `mcpctl bridge stuck calm` while `stuck`'s server
/// is stopped. Its member session on `stuck` is slowed, the aggregate
/// then reads its host no more (its writes wait: a few MiB taken in 10
/// s, not the hundreds it writes when read at full speed), and a calm
/// host of `calm` (whose server got every one of those notifications
/// too, before) is answered at its usual latency throughout. One process
/// a unit (`protocol "2026-07-28"`): the one stopped is the one the
/// aggregate's member session speaks to.
#[test]
fn an_aggregate_over_a_stopped_member_holds_its_host_back_and_a_calm_host_keeps_its_latency() {
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("stuck.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\nprotocol \"2026-07-28\"\nhealth {\n    enabled #false\n}\n",
    )
    .expect("write");
    std::fs::write(
        units.path().join("calm.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\nprotocol \"2026-07-28\"\n",
    )
    .expect("write");
    let (mut d, _settings, _addr) = endpoint_with(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n    auth \"none\"\n}\n",
        &[],
    );
    d.wait_until("both running", |d| {
        d.starts("stuck") == 1 && d.starts("calm") == 1
    });
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let pid = d.pid();
    let server = d.latest_pid("stuck").expect("stuck's pid");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (baseline, during, written, growth) = rt.block_on(async {
        let mut calm = Host::new(&runtime, &["calm"]).await;
        let mut baseline = Vec::new();
        for id in 2..12 {
            baseline.push(calm.echo(id, "warm").await);
            tokio::time::sleep(Duration::from_millis(100)).await; // the calm host's pace
        }
        let aggregated = Host::new(&runtime, &["stuck", "calm"]).await;
        let start = rss_kib(pid);
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(server as i32).expect("pid"),
            Signal::STOP,
        )
        .expect("SIGSTOP");
        let until = Instant::now() + FLOOD;
        let counted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let flood = aggregated.flood_counted(
            vec![notification(2048)],
            until,
            std::sync::Arc::clone(&counted),
        );
        let mut during = Vec::new();
        let mut id = 100;
        let mut peak = start;
        while Instant::now() < until {
            during.push(calm.echo(id, "calm").await);
            id += 1;
            peak = peak.max(rss_kib(pid));
            tokio::time::sleep(Duration::from_millis(100)).await; // the calm host's pace
        }
        // A held-back host still waits in its write: ended here.
        flood.abort();
        let written = counted.load(std::sync::atomic::Ordering::Relaxed);
        (baseline, during, written, peak.saturating_sub(start))
    });
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(server as i32).expect("pid"),
        Signal::CONT,
    )
    .expect("SIGCONT");
    rt.block_on(async {
        let mut after = Host::new(&runtime, &["stuck"]).await;
        after.echo(7, "after").await;
    });
    let slowest = during.iter().max().copied().unwrap_or_default();
    eprintln!(
        "aggregate flood: {written} bytes taken from the host; the calm host's median {:?} before, {:?} during ({} calls), slowest {slowest:?}; daemon RSS +{growth} KiB",
        median(baseline.clone()),
        median(during.clone()),
        during.len()
    );
    let stuck = status(&runtime, "stuck");
    assert!(stuck["slowed_sessions"].as_u64() >= Some(1), "{stuck}");
    assert!(growth < 64 * 1024, "the daemon grew by {growth} KiB");
    // Its share toward `stuck` (256 KiB), what the in-memory pair and the
    // member's queue hold (256 KiB each) and the pipes' buffers: the
    // rest of its writes waited.
    assert!(
        written < 8 << 20,
        "the aggregate took {written} bytes of its host's flood"
    );
    // Generous: other tests load the machine too (reading the host at
    // full speed made the calm host's calls take up to 2.9 s).
    let usual = median(baseline) * 5 + Duration::from_millis(100);
    assert!(during.len() >= 20, "{} calls in {FLOOD:?}", during.len());
    assert!(
        median(during) <= usual && slowest < Duration::from_millis(1500),
        "the calm host's calls: slowest {slowest:?} (usually {usual:?})"
    );
    assert!(d.stop(Signal::TERM).success());
}

/// A Streamable HTTP server that streams notifications on its GET stream
/// as fast as its socket takes them (`tests/data/sse_flood.py`, issue
/// 49): the daemon's HTTP adapter holds at most
/// `supervisor::http::FROM_SERVER` of its messages not yet taken (and
/// rmcp's channels behind it 16 each), the rest waits in the server's
/// writes, so the daemon stays small for the 10 s, and a calm unit beside
/// it answers throughout.
#[test]
fn an_http_server_streaming_faster_than_the_daemon_takes_its_messages_never_grows_the_daemon() {
    let units = tempfile::tempdir().expect("tempdir");
    let port_file = units.path().join("port");
    let _server = Ended(
        std::process::Command::new("python3")
            .arg(crate::helper::root().join("tests/data/sse_flood.py"))
            .arg(&port_file)
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("python3 sse_flood.py"),
    );
    let mut port = String::new();
    crate::helper::eventually("sse_flood.py to listen", BOUND, || {
        port = std::fs::read_to_string(&port_file).unwrap_or_default();
        !port.is_empty()
    });
    std::fs::write(
        units.path().join("flooder.kdl"),
        format!("http \"http://127.0.0.1:{port}/mcp\"\nhealth {{\n    enabled #false\n}}\n"),
    )
    .expect("write");
    std::fs::write(
        units.path().join("calm.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\nprotocol \"2026-07-28\"\n",
    )
    .expect("write");
    let (mut d, _settings, _addr) = endpoint_with(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n    auth \"none\"\n}\n",
        &[],
    );
    d.wait_until("calm running", |d| d.starts("calm") == 1);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let pid = d.pid();
    let sent = || {
        std::fs::read_to_string(units.path().join("port.sent"))
            .ok()
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    crate::helper::eventually("the server's flood to start", BOUND, || sent() > 0);
    let start = rss_kib(pid);
    let from = sent();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (peak, latencies) = rt.block_on(async {
        let mut calm = Host::new(&runtime, &["calm"]).await;
        let until = Instant::now() + FLOOD;
        let mut peak = start;
        let mut latencies = Vec::new();
        let mut id = 100;
        while Instant::now() < until {
            latencies.push(calm.echo(id, "calm").await);
            id += 1;
            peak = peak.max(rss_kib(pid));
            tokio::time::sleep(Duration::from_millis(100)).await; // the calm host's pace
        }
        (peak, latencies)
    });
    let streamed = sent() - from;
    let growth = peak.saturating_sub(start);
    let slowest = latencies.iter().max().copied().unwrap_or_default();
    eprintln!(
        "SSE flood: the server streamed {} MiB in {FLOOD:?}; daemon RSS {start} KiB, peak +{growth} KiB; {} calm calls, median {:?}, slowest {slowest:?}",
        streamed >> 20,
        latencies.len(),
        median(latencies.clone())
    );
    let status = status(&runtime, "flooder");
    assert_eq!(status["state"], "running", "{status}");
    assert!(growth < 64 * 1024, "the daemon grew by {growth} KiB");
    assert!(latencies.len() >= 20, "{} calm calls", latencies.len());
    assert!(
        slowest < Duration::from_secs(2),
        "the calm host's slowest call took {slowest:?}"
    );
    assert!(d.stop(Signal::TERM).success());
}

/// A child killed (and reaped) when the test ends, however it ends.
struct Ended(std::process::Child);

impl Drop for Ended {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
