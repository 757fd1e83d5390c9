//! Telemetry (issue 53 target): fixture echo through `mcpctl bridge` on a
//! daemon exporting OpenTelemetry (`telemetry` in its `mcpd.kdl`,
//! `sample-ratio 1.0`: every call a server span and a client span) to a
//! real OTLP/HTTP receiver (`tests/data/otlp_receiver.py`, which decodes
//! every export with the OpenTelemetry project's protobuf messages, in
//! `target/py-otel`), beside the same unit on a daemon without telemetry,
//! the same rmcp client on each, call by call in turn. After the calls the
//! receiver must have had a span for each call: the row measured export.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;

use super::common::{self, Ratio, Row};
use super::sessions::{in_trials, spawn};
use super::{Daemon, Sizes, cpu_ns};

const FIGURE: &str = "fixture echo through mcpctl bridge, telemetry on (OTLP/HTTP to a receiver, sample-ratio 1.0) vs off";
const TARGET: &str = "p50 ≤ 1.05× off";

/// The receiver, killed when dropped.
struct Receiver {
    child: Child,
    port: u16,
    spans: Arc<AtomicUsize>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    fn start() -> Result<Self, String> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let python = root.join("target/py-otel/bin/python");
        if !python.exists() {
            return Err(format!(
                "{} is missing (.ci/run installs it)",
                python.display()
            ));
        }
        let mut child = Command::new(python)
            .arg(root.join("tests/data/otlp_receiver.py"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start the OTLP receiver: {e}"))?;
        let stdout = child.stdout.take().ok_or("the receiver's stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        let spans = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&spans);
        // Drained to the end, so the receiver never blocks on its stdout.
        std::thread::spawn(move || {
            let mut lines = std::io::BufReader::new(stdout).lines();
            if let Some(Ok(first)) = lines.next() {
                let _ = tx.send(first);
            }
            for line in lines.map_while(Result::ok) {
                if line.starts_with("{\"span\"") {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        let mut receiver = Self {
            child,
            port: 0,
            spans,
        };
        let first = rx
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| "the receiver said no port within 60 s".to_owned())?;
        receiver.port = first
            .strip_prefix("listening ")
            .and_then(|p| p.trim().parse().ok())
            .ok_or_else(|| format!("the receiver said {first:?}"))?;
        Ok(receiver)
    }
}

pub fn rows(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Vec<Row> {
    match measure(rt, sizes) {
        Ok(row) => vec![row],
        Err(why) => vec![Row::skipped_target(FIGURE, TARGET, &why)],
    }
}

fn measure(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Result<Row, String> {
    let receiver = Receiver::start()?;
    let units = super::units_dir(1);
    let settings = units.path().join("mcpd.kdl.settings");
    std::fs::write(
        &settings,
        format!(
            "telemetry {{\n    otlp \"http://127.0.0.1:{}\"\n    sample-ratio 1.0\n}}\n",
            receiver.port
        ),
    )
    .map_err(|e| e.to_string())?;
    let on = Daemon::start_configured(units.path(), &settings);
    on.until(1, super::running);
    let off = Daemon::start(units.path(), None);
    off.until(1, super::running);
    let before = [cpu_ns(on.pid()), cpu_ns(off.pid())];
    let trials = rt.block_on(async {
        let mcpctl = common::binary("mcpctl");
        let bridge = ["--user", "bridge", "u0"];
        let (_on, io) = spawn(&mcpctl, &bridge, on.runtime.path());
        let traced = ().serve(io).await.map_err(|e| e.to_string())?;
        let (_off, io) = spawn(&mcpctl, &bridge, off.runtime.path());
        let plain = ().serve(io).await.map_err(|e| e.to_string())?;
        let echo = serde_json::json!({"text": "x"});
        let trials = in_trials([&traced, &plain], sizes.calls, "echo", &echo).await;
        for client in [traced, plain] {
            let _ = client.cancel().await;
        }
        Ok::<_, String>(trials)
    })?;
    let calls = trials.len() * sizes.calls;
    let cpu = [
        (cpu_ns(on.pid()) - before[0]) as f64 / 1000.0 / calls as f64,
        (cpu_ns(off.pid()) - before[1]) as f64 / 1000.0 / calls as f64,
    ];
    // Each call is a server span and a client span; batches go out on
    // their own schedule: wait (bounded) for the calls' server spans.
    let deadline = Instant::now() + Duration::from_secs(60);
    while receiver.spans.load(Ordering::Relaxed) < calls {
        if Instant::now() > deadline {
            return Err(format!(
                "the receiver got {} spans for {calls} calls within 60 s",
                receiver.spans.load(Ordering::Relaxed)
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let spans = receiver.spans.load(Ordering::Relaxed);
    let pairs: Vec<_> = trials.iter().map(|t| (t[0], t[1])).collect();
    let r = Ratio::of(&pairs);
    Ok(Row::ratio(
        FIGURE,
        TARGET,
        &r,
        &format!(
            "; daemon CPU {:.0} vs {:.0} µs per call, {spans} spans received",
            cpu[0], cpu[1]
        ),
    )
    .met(r.median <= 1.05))
}
