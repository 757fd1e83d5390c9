//! On-demand units (issue 18 targets), with the reference server
//! (`@modelcontextprotocol/server-everything`, a Node server): N idle
//! on-demand units whose lists are cached (their processes' memory, the
//! daemon's memory per unit over an empty daemon), and the cold first
//! call through `mcpctl bridge` against the server's own spawn →
//! initialize → first call, measured side by side.

use std::path::Path;
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;

use super::common::{self, Row, Stats, rss_kib, stats};
use super::sessions::{everything, spawn};
use super::{Daemon, Sizes, settled_rss};

/// Every process below `pid` (children, grandchildren, …).
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                out.push(child);
                queue.push(child);
            }
        }
    }
    out
}

/// The summed RSS of `pid`'s descendants, in MiB, and how many there are.
fn descendants_mib(pid: u32) -> (usize, f64) {
    let all = descendants(pid);
    let kib: u64 = all.iter().map(|p| rss_kib(&p.to_string())).sum();
    (all.len(), kib as f64 / 1024.0)
}

/// `program args` with the environment mcpd gives its servers (PATH,
/// HOME, LANG), so both cold starts run the same program the same way.
pub fn clean(
    program: &Path,
    args: &[String],
) -> (
    tokio::process::Child,
    (tokio::process::ChildStdout, tokio::process::ChildStdin),
) {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env(
            "HOME",
            std::env::var_os("HOME").unwrap_or_else(|| "/".into()),
        )
        .env("LANG", "C.UTF-8")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn node");
    let io = (
        child.stdout.take().expect("stdout"),
        child.stdin.take().expect("stdin"),
    );
    (child, io)
}

pub fn call(tool: &str, arguments: serde_json::Value) -> CallToolRequestParams {
    CallToolRequestParams::new(tool.to_owned())
        .with_arguments(arguments.as_object().cloned().unwrap_or_default())
}

pub fn rows(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Vec<Row> {
    match measure(rt, sizes) {
        Ok(rows) => rows,
        Err(reason) => vec![
            Row::skipped_target(
                "on-demand server-everything units, idle",
                "0 MiB; ≤ 64 KiB per unit",
                &reason,
            ),
            Row::skipped_target("cold first call through mcpctl bridge", "≤ 5 ms", &reason),
            Row::skipped("cold first call of server-everything", &reason),
        ],
    }
}

fn measure(rt: &tokio::runtime::Runtime, sizes: &Sizes) -> Result<Vec<Row>, String> {
    let server = everything()?;
    let server = server.to_str().ok_or("a non-UTF-8 path")?.to_owned();
    let n = sizes.ondemand_units;
    let cold = sizes.cold_calls.min(n);
    let units = tempfile::tempdir().map_err(|e| e.to_string())?;
    for i in 0..n {
        std::fs::write(
            units.path().join(format!("e{i}.kdl")),
            format!(
                "stdio {{\n    command \"node\" \"{server}\" \"stdio\"\n}}\nstart \"on-demand\"\nidle-stop \"1s\"\nstartup-timeout \"60s\"\nprotocol \"legacy\"\n"
            ),
        )
        .map_err(|e| e.to_string())?;
    }
    let state = tempfile::tempdir().map_err(|e| e.to_string())?;

    // Discovery: every unit starts once, learns its lists, and idles.
    {
        let d = Daemon::start_in(units.path(), None, state.path());
        d.until(n, |l| l.contains("idle (stopped after 1s idle)"));
    }

    // The steady state: a daemon that finds every cache and starts nothing,
    // against one with no units and one with a single such unit (what
    // the first unit costs once, a thread's arena, is not per unit).
    let empty = tempfile::tempdir().map_err(|e| e.to_string())?;
    let rss0 = {
        let d = Daemon::start(empty.path(), None);
        d.until(1, |l| l.contains("started 0 units"));
        settled_rss(&d)
    };
    let one = tempfile::tempdir().map_err(|e| e.to_string())?;
    std::fs::copy(units.path().join("e0.kdl"), one.path().join("e0.kdl"))
        .map_err(|e| e.to_string())?;
    let rss1 = {
        let d = Daemon::start_in(one.path(), None, state.path());
        d.until(1, |l| l.contains("idle (waiting for first use)"));
        settled_rss(&d)
    };
    let d = Daemon::start_in(units.path(), None, state.path());
    d.until(n, |l| l.contains("idle (waiting for first use)"));
    let rss_n = settled_rss(&d);
    let (procs, idle_mib) = descendants_mib(d.pid());
    let per_unit = rss_n.saturating_sub(rss1) as f64 / (n.max(2) - 1) as f64;
    let average = rss_n.saturating_sub(rss0) as f64 / n as f64;
    // What one costs running (after its first call), for scale.
    let running_mib = rt.block_on(async {
        let (child, io) = spawn(Path::new("node"), &[&server, "stdio"], d.runtime.path());
        let client = ().serve(io).await.map_err(|e| e.to_string())?;
        client
            .call_tool(call("echo", serde_json::json!({"message": "x"})))
            .await
            .map_err(|e| e.to_string())?;
        let pid = child.id().unwrap_or_default();
        let mib = rss_kib(&pid.to_string()) as f64 / 1024.0;
        let _ = client.cancel().await;
        Ok::<f64, String>(mib)
    })?;
    let idle = Row::new(
        format!("{n} on-demand server-everything units idle (lists cached): their processes; the daemon's RSS per unit (slope 1 → {n} units)"),
        "0 MiB; ≤ 64 KiB per unit",
        format!("{procs} processes, {idle_mib:.1} MiB; {per_unit:.1} KiB per unit"),
        format!(
            "running, {n} would be {:.0} MiB ({running_mib:.0} MiB each); daemon {:.1} (no units) → {:.1} (1) → {:.1} MiB ({n}): {average:.1} KiB per unit over none",
            running_mib * n as f64,
            rss0 as f64 / 1024.0,
            rss1 as f64 / 1024.0,
            rss_n as f64 / 1024.0
        ),
        1,
    )
    .met(procs == 0 && per_unit <= 64.0);

    // Cold first calls of server-everything (Node: its own start-up
    // varies by ±100 ms on a busy machine, so this row is context)...
    let everything = Cold {
        program: "node".into(),
        args: vec![server.clone(), "stdio".into()],
        call: call("echo", serde_json::json!({"message": "x"})),
    };
    let (direct, bridged) = rt.block_on(cold_pairs(&d, &everything, "e", cold))?;
    drop(d);
    let everything_row = cold_row(
        "cold first tools/call of server-everything through mcpctl bridge minus its own spawn → initialize → first call",
        "-",
        direct,
        bridged,
    );

    // ... and of the fixture (a Rust server up in milliseconds), where
    // what mcpd adds is not lost in the server's own start-up: judged.
    let fixture = common::binary("examples/mcp-fixture");
    let fixture_units = tempfile::tempdir().map_err(|e| e.to_string())?;
    for i in 0..cold {
        std::fs::write(
            fixture_units.path().join(format!("f{i}.kdl")),
            format!(
                "stdio {{\n    command \"{}\" \"--chatter\" \"0\"\n}}\nstart \"on-demand\"\nidle-stop \"1s\"\nprotocol \"legacy\"\n",
                fixture.display()
            ),
        )
        .map_err(|e| e.to_string())?;
    }
    let d = Daemon::start_in(fixture_units.path(), None, state.path());
    d.until(cold, |l| l.contains("idle (stopped after 1s idle)"));
    let fixture = Cold {
        program: fixture,
        args: vec!["--chatter".into(), "0".into()],
        call: call("echo", serde_json::json!({"text": "x"})),
    };
    let (direct, bridged) = rt.block_on(cold_pairs(&d, &fixture, "f", cold))?;
    let fixture_row = cold_row(
        "cold first tools/call through mcpctl bridge (host attached, unit idle) minus the server's own spawn → initialize → first call (mcp-fixture)",
        "≤ 5 ms",
        direct,
        bridged,
    );
    let met = bridged.p50 - direct.p50 <= 5.0;
    Ok(vec![idle, fixture_row.met(met), everything_row])
}

/// A server to start cold, and the call that starts it.
struct Cold {
    program: std::path::PathBuf,
    args: Vec<String>,
    call: CallToolRequestParams,
}

/// `runs` cold first calls in turn: the server alone (spawn, initialize,
/// call, with the environment mcpd gives servers), then a host already
/// attached through the bridge to idle unit `PREFIXi` calling it (the
/// daemon spawns, initializes, lists, forwards). Milliseconds of each.
async fn cold_pairs(
    d: &Daemon,
    server: &Cold,
    prefix: &str,
    runs: usize,
) -> Result<(Stats, Stats), String> {
    let (mut direct, mut bridged) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let t = Instant::now();
        let (child, io) = clean(&server.program, &server.args);
        let client = ().serve(io).await.map_err(|e| e.to_string())?;
        client
            .call_tool(server.call.clone())
            .await
            .map_err(|e| e.to_string())?;
        direct.push(t.elapsed().as_secs_f64() * 1000.0);
        let _ = client.cancel().await;
        drop(child);

        let name = format!("{prefix}{i}");
        let (_bridge, io) = spawn(
            &common::binary("mcpctl"),
            &["--user", "bridge", &name],
            d.runtime.path(),
        );
        let host = ().serve(io).await.map_err(|e| e.to_string())?;
        let t = Instant::now();
        let result = host
            .call_tool(server.call.clone())
            .await
            .map_err(|e| e.to_string())?;
        bridged.push(t.elapsed().as_secs_f64() * 1000.0);
        if result.is_error == Some(true) {
            return Err(format!("{name}: {result:?}"));
        }
        let _ = host.cancel().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((stats(direct), stats(bridged)))
}

fn cold_row(figure: &str, target: &str, direct: Stats, bridged: Stats) -> Row {
    let extra = bridged.p50 - direct.p50;
    Row::new(
        figure,
        target,
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
}
