//! A host flooding (issue 49): one host writes `echo` requests to
//! `mcpctl bridge u1` as fast as its pipe takes them, never waiting for an
//! answer (another reads and counts them), while a calm host makes its
//! calls one at a time through `mcpctl bridge u0`, a unit of its own. In
//! each trial the calm host calls quietly, then beside the flood; the
//! figure is the median over the trials of the ratio of its p50s.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use super::common::{self, Ratio, Row, stats};
use super::sessions::{LineHost, spawn};
use super::{Daemon, Sizes};

const FIGURE: &str = "a calm host's fixture echo through mcpctl bridge beside a host flooding another unit with requests (never waiting for answers), vs quiet";
const TARGET: &str = "p50 within 2× of quiet";

pub fn rows(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Vec<Row> {
    let dir = super::units_dir(2);
    let d = Daemon::start(dir.path(), None);
    d.until(2, super::running);
    match rt.block_on(measure(&d, sizes)) {
        Ok(row) => vec![row],
        Err(why) => vec![Row::new(FIGURE, TARGET, format!("fails: {why}"), "-", 0).met(false)],
    }
}

/// Requests the flooder wrote and answers it read.
struct Flood {
    sent: Arc<AtomicU64>,
    answered: Arc<AtomicU64>,
}

/// Floods `unit` until `stop`.
async fn flood(d: &Daemon, unit: &str, stop: Arc<AtomicBool>) -> Result<Flood, String> {
    let (mut bridge, (stdout, mut stdin)) = spawn(
        &common::binary("mcpctl"),
        &["--user", "bridge", unit],
        d.runtime.path(),
    );
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    stdin
        .write_all(concat!(
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"flood","version":"1"}}}"#,
            "\n"
        ).as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .map_err(|_| "the flooder's initialize: no answer in 30 s".to_owned())?
        .map_err(|e| e.to_string())?
        .ok_or("the flooder's bridge closed")?;
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
        .await
        .map_err(|e| e.to_string())?;
    let sent = Arc::new(AtomicU64::new(0));
    let answered = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&answered);
    tokio::spawn(async move {
        while let Ok(Some(_)) = lines.next_line().await {
            counted.fetch_add(1, Ordering::Relaxed);
        }
    });
    let written = Arc::clone(&sent);
    tokio::spawn(async move {
        let mut id = 1u64;
        let mut batch = String::new();
        while !stop.load(Ordering::Relaxed) {
            batch.clear();
            for _ in 0..64 {
                batch.push_str(&format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"x"}}}}}}"#
                ));
                batch.push('\n');
                id += 1;
            }
            if stdin.write_all(batch.as_bytes()).await.is_err() {
                break;
            }
            written.fetch_add(64, Ordering::Relaxed);
        }
        drop(stdin);
        let _ = bridge.kill().await;
    });
    Ok(Flood { sent, answered })
}

async fn measure(d: &Daemon, sizes: &Sizes) -> Result<Row, String> {
    let mut calm = LineHost::attach(d.runtime.path(), "u0", false).await?;
    let mut trials = Vec::new();
    let (mut sent, mut answered) = (0, 0);
    for _ in 0..common::trials() {
        let mut quiet = Vec::new();
        for _ in 0..sizes.calls {
            quiet.push(calm.call("echo", r#"{"text":"x"}"#).await?);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flood = flood(d, "u1", Arc::clone(&stop)).await?;
        // The flood under way: its first answers back.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while flood.answered.load(Ordering::Relaxed) == 0 {
            if tokio::time::Instant::now() > deadline {
                return Err("the flood got no answer within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut beside = Vec::new();
        let calls = async {
            for _ in 0..sizes.calls {
                beside.push(calm.call("echo", r#"{"text":"x"}"#).await?);
            }
            Ok::<_, String>(())
        };
        let outcome = calls.await;
        stop.store(true, Ordering::Relaxed);
        outcome?;
        sent += flood.sent.load(Ordering::Relaxed);
        answered += flood.answered.load(Ordering::Relaxed);
        trials.push((stats(beside), stats(quiet)));
    }
    let r = Ratio::of(&trials);
    Ok(Row::ratio(
        FIGURE,
        TARGET,
        &r,
        &format!("; the flood wrote {sent} requests, {answered} answered"),
    )
    .met(r.median <= 2.0))
}
