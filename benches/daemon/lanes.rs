//! Lanes (issue 51 targets), with the fixture (a server of both eras)
//! under `protocol "lanes"`: the unit's process serves 2026-07-28 hosts,
//! and the first 2025-11-25 host starts a second process for its era.
//!
//! - A 2025 host's first call on a unit whose 2025 lane is not running
//!   (its bridge attached first; its `initialize` starts the lane, whose
//!   handshake the answer waits for) against the fixture's own spawn →
//!   initialize → first call, in turn, one fresh unit each time.
//! - A call on either lane against a bridged call of the same era
//!   without lanes: a 2025 host on the lanes unit vs a 2025 host on a
//!   unit pinned `protocol "legacy"`, and a 2026-07-28 host on the lanes
//!   unit vs one on a unit pinned `protocol "2026-07-28"`; raw JSON-RPC
//!   lines, the four hosts call by call in turn, in trials.

use std::time::{Duration, Instant};

use rmcp::ServiceExt;

use super::common::{self, Ratio, Row, stats};
use super::ondemand::{call, clean};
use super::sessions::{LineHost, spawn};
use super::{Daemon, Sizes};

const FIRST: &str = "lanes: a 2025-11-25 host's first tools/call, its lane not running (started by its initialize), minus the server's own spawn → initialize → first call (mcp-fixture)";
const EITHER: &str = "lanes: fixture echo through mcpctl bridge on either lane vs a bridged call of the same era without lanes (2025-11-25: protocol \"legacy\"; 2026-07-28: protocol \"2026-07-28\")";

pub fn rows(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Vec<Row> {
    match measure(rt, sizes) {
        Ok(rows) => rows,
        Err(why) => vec![
            Row::skipped_target(FIRST, "≤ +10 ms", &why),
            Row::skipped_target(EITHER, "p50 ≤ 1.05× each", &why),
        ],
    }
}

fn unit(dir: &std::path::Path, name: &str, protocol: &str) -> Result<(), String> {
    std::fs::write(
        dir.join(format!("{name}.kdl")),
        format!(
            "stdio {{\n    command \"{}\" \"--chatter\" \"0\"\n}}\nstop-timeout \"2s\"\nprotocol \"{protocol}\"\n",
            common::binary("examples/mcp-fixture").display()
        ),
    )
    .map_err(|e| e.to_string())
}

fn measure(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Result<Vec<Row>, String> {
    let n = sizes.cold_calls;
    let units = tempfile::tempdir().map_err(|e| e.to_string())?;
    for i in 0..n {
        unit(units.path(), &format!("l{i}"), "lanes")?;
    }
    unit(units.path(), "old", "legacy")?;
    unit(units.path(), "new", "2026-07-28")?;
    let d = Daemon::start(units.path(), None);
    d.until(n + 2, super::running);
    let fixture = common::binary("examples/mcp-fixture");
    let args = ["--chatter".to_owned(), "0".to_owned()];
    let mcpctl = common::binary("mcpctl");
    let echo = call("echo", serde_json::json!({"text": "x"}));

    let (direct, bridged) = rt.block_on(async {
        let (mut direct, mut bridged) = (Vec::new(), Vec::new());
        for i in 0..n {
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

            let unit = format!("l{i}");
            let (_bridge, io) = spawn(&mcpctl, &["--user", "bridge", &unit], d.runtime.path());
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
        }
        Ok::<_, String>((stats(direct), stats(bridged)))
    })?;
    // The 2025 host was served by a lane of its own.
    let status = std::process::Command::new(&mcpctl)
        .args(["--user", "status", "l0"])
        .env("XDG_RUNTIME_DIR", d.runtime.path())
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .output()
        .map_err(|e| format!("mcpctl status: {e}"))?;
    let status = String::from_utf8_lossy(&status.stdout);
    // `Protocol: 2026-07-28 (pid P, N hosts), 2025-11-25 (pid Q, M hosts)`
    if !status.contains("2025-11-25 (pid") {
        return Err(format!("no 2025-11-25 lane in mcpctl status l0: {status}"));
    }
    let extra = bridged.p50 - direct.p50;
    let first = Row::new(
        FIRST,
        "≤ +10 ms",
        format!(
            "{extra:+.1} ms ({:.1} vs {:.1} ms)",
            bridged.p50, direct.p50
        ),
        format!(
            "bridge {:.1}..{:.1}, direct {:.1}..{:.1} ms",
            bridged.min, bridged.max, direct.min, direct.max
        ),
        bridged.runs,
    )
    .met(extra <= 10.0);

    let either = rt.block_on(async {
        let runtime = d.runtime.path();
        let mut lane_old = LineHost::attach(runtime, "l0", false).await?;
        let mut lane_new = LineHost::attach(runtime, "l0", true).await?;
        let mut old = LineHost::attach(runtime, "old", false).await?;
        let mut new = LineHost::attach(runtime, "new", true).await?;
        let mut trials = Vec::new();
        for _ in 0..common::trials() {
            let mut xs: [Vec<f64>; 4] = Default::default();
            for _ in 0..sizes.calls {
                for (host, xs) in [&mut lane_old, &mut old, &mut lane_new, &mut new]
                    .into_iter()
                    .zip(xs.iter_mut())
                {
                    xs.push(host.call("echo", r#"{"text":"x"}"#).await?);
                }
            }
            trials.push(xs.map(stats));
        }
        Ok::<_, String>(trials)
    })?;
    let pairs = |a: usize, b: usize| -> Vec<_> { either.iter().map(|t| (t[a], t[b])).collect() };
    let (old, new) = (Ratio::of(&pairs(0, 1)), Ratio::of(&pairs(2, 3)));
    let either = Row::new(
        EITHER,
        "p50 ≤ 1.05× each",
        format!(
            "2025: {:.3} vs {:.3} ms, {:.2}×; 2026: {:.3} vs {:.3} ms, {:.2}×",
            old.a, old.b, old.median, new.a, new.b, new.median
        ),
        format!(
            "trials {:.2}..{:.2}× and {:.2}..{:.2}×",
            old.min, old.max, new.min, new.max
        ),
        old.runs + new.runs,
    )
    .met(old.median <= 1.05 && new.median <= 1.05);
    Ok(vec![first, either])
}
