//! Per-host instances (issue 35 targets), with the fixture: a host's first
//! call on a per-host unit (its bridge attached, its instance started by
//! its `initialize`) against the fixture's own spawn → initialize → first
//! call, measured side by side; and the daemon's memory per running
//! instance beyond the server's own (the slope of its RSS from one host
//! attached to N).

use std::time::{Duration, Instant};

use rmcp::ServiceExt;

use super::common::{self, Row, rss_kib, stats};
use super::ondemand::{call, clean};
use super::sessions::spawn;
use super::{Daemon, Sizes, settled_rss};

pub fn rows(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Vec<Row> {
    match measure(rt, sizes) {
        Ok(rows) => rows,
        Err(reason) => vec![
            Row::skipped_target("per-host first call", "≤ 10 ms", &reason),
            Row::skipped_target(
                "per-host instances running",
                "≤ 64 KiB per instance",
                &reason,
            ),
        ],
    }
}

fn measure(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Result<Vec<Row>, String> {
    let fixture = common::binary("examples/mcp-fixture");
    let units = tempfile::tempdir().map_err(|e| e.to_string())?;
    std::fs::write(
        units.path().join("p.kdl"),
        format!(
            "stdio {{\n    command \"{}\" \"--chatter\" \"0\"\n}}\nsessions \"per-host\"\nmax-instances 1024\nstop-timeout \"2s\"\nprotocol \"legacy\"\n",
            fixture.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let d = Daemon::start(units.path(), None);
    // The unit learns its lists once (its own server), then idles.
    d.until(1, |l| l.contains("running (pid"));
    let echo = call("echo", serde_json::json!({"text": "x"}));
    let args = ["--chatter".to_owned(), "0".to_owned()];
    let mcpctl = common::binary("mcpctl");

    let first = rt.block_on(async {
        let (mut direct, mut bridged) = (Vec::new(), Vec::new());
        for _ in 0..sizes.cold_calls {
            let t = Instant::now();
            let (child, io) = clean(&fixture, &args);
            let client = ().serve(io).await.map_err(|e| e.to_string())?;
            client
                .call_tool(echo.clone())
                .await
                .map_err(|e| e.to_string())?;
            direct.push(t.elapsed().as_secs_f64() * 1000.0);
            let _ = client.cancel().await;
            drop(child);

            // The bridge attached first; the host's initialize starts its
            // instance, whose handshake its answer waits for.
            let (_bridge, io) = spawn(&mcpctl, &["--user", "bridge", "p"], d.runtime.path());
            tokio::time::sleep(Duration::from_millis(50)).await;
            let t = Instant::now();
            let host = ().serve(io).await.map_err(|e| e.to_string())?;
            let result = host
                .call_tool(echo.clone())
                .await
                .map_err(|e| e.to_string())?;
            bridged.push(t.elapsed().as_secs_f64() * 1000.0);
            if result.is_error == Some(true) {
                return Err(format!("{result:?}"));
            }
            let _ = host.cancel().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok::<_, String>((stats(direct), stats(bridged)))
    })?;
    let (direct, bridged) = first;
    let extra = bridged.p50 - direct.p50;
    let first_row = Row::new(
        "per-host first tools/call (bridge attached, its instance started by its initialize) minus the server's own spawn → initialize → first call (mcp-fixture)",
        "≤ 10 ms",
        format!("{extra:+.1} ms ({:.1} vs {:.1} ms)", bridged.p50, direct.p50),
        format!(
            "bridge {:.1}..{:.1}, direct {:.1}..{:.1} ms",
            bridged.min, bridged.max, direct.min, direct.max
        ),
        bridged.runs,
    )
    .met(extra <= 10.0);

    // Memory: the daemon with one host (and its instance) attached, then
    // with N; the servers' own memory is theirs, not the daemon's.
    let n = sizes.ondemand_units.max(2);
    let memory = rt.block_on(async {
        let mut hosts = Vec::new();
        let mut rss1 = 0;
        for i in 0..n {
            let (bridge, io) = spawn(&mcpctl, &["--user", "bridge", "p"], d.runtime.path());
            let host = ().serve(io).await.map_err(|e| e.to_string())?;
            host.call_tool(echo.clone())
                .await
                .map_err(|e| e.to_string())?;
            hosts.push((bridge, host));
            if i == 0 {
                tokio::time::sleep(Duration::from_millis(500)).await;
                rss1 = rss_kib(&d.pid().to_string());
            }
        }
        let rss_n = settled_rss(&d);
        for (_bridge, host) in hosts {
            let _ = host.cancel().await;
        }
        Ok::<_, String>((rss1, rss_n))
    })?;
    let (rss1, rss_n) = memory;
    let per_instance = rss_n.saturating_sub(rss1) as f64 / (n - 1) as f64;
    let memory_row = Row::new(
        format!("{n} per-host instances running (a host each): the daemon's RSS per instance (slope 1 → {n})"),
        "≤ 64 KiB per instance",
        format!("{per_instance:.1} KiB per instance"),
        format!(
            "daemon {:.1} (1) → {:.1} MiB ({n})",
            rss1 as f64 / 1024.0,
            rss_n as f64 / 1024.0
        ),
        1,
    )
    .met(per_instance <= 64.0);
    Ok(vec![first_row, memory_row])
}
