//! Liveness and self-protection (issue 15 targets): the daemon's idle CPU
//! with 100 servers probed at the defaults, over a window that holds each
//! server's first probe, servers of 2026-07-28 (probed with
//! `server/discover`) beside servers of 2025 (pinged); start to
//! established for a server of both eras under `protocol "auto"` vs
//! `"legacy"` (issue 34); how exactly a hung (SIGSTOPped) server is noticed
//! against interval + failures × timeout; the daemon's CPU while one
//! server floods stderr and while one sends 2,000 `tools/list_changed` a
//! second; another server's call latency and `mcpctl status` beside a
//! flood.

use std::path::Path;
use std::time::{Duration, Instant};

use super::common::{self, Bus, Row, stats};
use super::{Daemon, Sizes, cpu_ns, private, running, server, time};

/// A fixture unit with `extra` KDL and `args` appended to its command.
pub(super) fn fixture(dir: &Path, name: &str, args: &[&str], extra: &str) {
    let mut command = format!(
        "\"{}\" \"--name\" \"{name}\" \"--chatter\" \"0\"",
        common::binary("examples/mcp-fixture").display()
    );
    for arg in args {
        command.push_str(&format!(" \"{arg}\""));
    }
    std::fs::write(
        dir.join(format!("{name}.kdl")),
        format!("stdio {{\n    command {command}\n}}\nstop-timeout \"2s\"\n{extra}"),
    )
    .expect("write unit");
}

pub fn rows(rt: &tokio::runtime::Runtime, sizes: &Sizes, bus: Option<&Bus>) -> Vec<Row> {
    let mut rows = vec![idle_with_probes(sizes, bus), start_to_established(sizes)];
    rows.push(detection(sizes));
    rows.extend(floods(sizes));
    rows.extend(rt.block_on(beside_a_flood(sizes)));
    rows
}

/// Another server's D-Bus `CallTool` echo p50 with a flooding neighbour vs
/// without, and `mcpctl status` of the flooding server meanwhile.
async fn beside_a_flood(sizes: &Sizes) -> Vec<Row> {
    let calls = sizes.calls;
    let mut trials = Vec::new();
    let mut status = Vec::new();
    for _ in 0..common::trials() {
        let mut p50 = Vec::new();
        for flood in [false, true] {
            let dir = tempfile::tempdir().expect("tempdir");
            fixture(dir.path(), "calm", &[], "");
            if flood {
                fixture(dir.path(), "bad", &["--stderr-flood"], "");
            }
            let d = Daemon::start(dir.path(), None);
            d.until(if flood { 2 } else { 1 }, running);
            let conn = private(&d).await;
            let calm = server(&conn, "calm").await;
            let xs = time(calls, || async {
                calm.call_tool("echo", r#"{"text":"x"}"#)
                    .await
                    .expect("echo");
            })
            .await;
            p50.push(stats(xs).p50);
            if flood && status.is_empty() {
                let runtime = d.runtime.path().to_owned();
                status = (0..sizes.status_runs)
                    .map(|_| {
                        let t = Instant::now();
                        let out = std::process::Command::new(common::binary("mcpctl"))
                            .args(["--user", "status", "bad"])
                            .env("XDG_RUNTIME_DIR", &runtime)
                            .env_remove("DBUS_SESSION_BUS_ADDRESS")
                            .output()
                            .expect("mcpctl");
                        assert!(out.status.success());
                        t.elapsed().as_secs_f64() * 1000.0
                    })
                    .collect();
            }
        }
        trials.push((p50[1], p50[0]));
    }
    // Per trial the quiet daemon, then the flooded one, each fresh.
    let ratios = stats(trials.iter().map(|(f, q)| f / q).collect());
    let flooded = stats(trials.iter().map(|(f, _)| *f).collect()).p50;
    let quiet = stats(trials.iter().map(|(_, q)| *q).collect()).p50;
    let s = stats(status);
    vec![
        Row::new(
            "stderr flood: another server's CallTool echo, p50 beside the flood vs without",
            "within 2×",
            format!("{flooded:.3} vs {quiet:.3} ms: {:.2}×", ratios.p50),
            format!("trials {:.2}..{:.2}×", ratios.min, ratios.max),
            calls * trials.len(),
        )
        .met(ratios.p50 <= 2.0),
        Row::ms(
            "stderr flood: mcpctl status of the flooding server, whole process",
            "< 100 ms",
            s,
            1,
        )
        .met(s.p50 < 100.0),
    ]
}

/// The daemon's idle CPU with probes at the defaults, side by side: the
/// fixture (of both eras) spoken to in 2026-07-28, probed with
/// `server/discover`, vs pinned to 2025 (`protocol "legacy"`), pinged.
pub(super) fn idle_with_probes(sizes: &Sizes, bus: Option<&Bus>) -> Row {
    let m = sizes.idle_units;
    let (modern, modern_used) = idle_cpu(sizes, bus, "2026-07-28", "");
    let (legacy, _) = idle_cpu(sizes, bus, "2025-11-25", "protocol \"legacy\"\n");
    Row::new(
        format!(
            "idle with probes at the defaults: daemon CPU per 10 s, {m} servers over {} s (each probed once), 2026-07-28 (server/discover) vs 2025-11-25 (ping)",
            sizes.probe_secs
        ),
        "< 10 ms at 100",
        format!("{modern:.2} vs {legacy:.2} ms"),
        format!("{modern_used:.2} ms in the window, {:.2}×", modern / legacy.max(0.001)),
        1,
    )
    .met(modern < 10.0)
}

/// CPU over a window from 1 s after `idle_units` fixture units (with
/// `extra` KDL) are running, spoken to in `version`, to 1 s past their
/// first probe (30 s of silence): per 10 s, and in the window, in ms.
fn idle_cpu(sizes: &Sizes, bus: Option<&Bus>, version: &str, extra: &str) -> (f64, f64) {
    let m = sizes.idle_units;
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..m {
        fixture(dir.path(), &format!("p{i}"), &[], extra);
    }
    let d = Daemon::start(dir.path(), bus);
    d.until(m, running);
    let status = mcpctl(&d, &["status", "p0"]);
    assert!(
        status.contains(&format!("Protocol: {version}")),
        "not spoken to in {version}: {status}"
    );
    std::thread::sleep(Duration::from_secs(1));
    let window = Duration::from_secs(sizes.probe_secs);
    let before = cpu_ns(d.pid());
    std::thread::sleep(window);
    let used = (cpu_ns(d.pid()) - before) as f64 / 1e6;
    (used * 10.0 / window.as_secs_f64().max(0.001), used)
}

/// `mcpctl --user ARGS` against `d`, which must succeed: its stdout.
fn mcpctl(d: &Daemon, args: &[&str]) -> String {
    let out = std::process::Command::new(common::binary("mcpctl"))
        .arg("--user")
        .args(args)
        .env("XDG_RUNTIME_DIR", d.runtime.path())
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .output()
        .expect("mcpctl");
    assert!(
        out.status.success(),
        "mcpctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Seconds into the day of a daemon log line's timestamp
/// (`2026-12-04T23:31:33.085425Z ...`).
fn logged_at(line: &str) -> f64 {
    let time = line
        .split_whitespace()
        .next()
        .and_then(|t| t.split('T').nth(1))
        .map(|t| t.trim_end_matches('Z'))
        .expect("a timestamped line");
    time.split(':')
        .map(|x| x.parse::<f64>().expect("a time"))
        .fold(0.0, |acc, x| acc * 60.0 + x)
}

/// Start to established (the daemon's `starting` line to its `running`
/// line, by their timestamps) of the fixture, a server of both eras,
/// under `protocol "auto"` (server/discover, then 2026-07-28) vs the same
/// server with `protocol "legacy"` (initialize), restarted in turn.
pub(super) fn start_to_established(sizes: &Sizes) -> Row {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture(dir.path(), "dual", &[], "");
    fixture(dir.path(), "old", &[], "protocol \"legacy\"\n");
    let d = Daemon::start(dir.path(), None);
    d.until(2, running);
    let mut times: [Vec<f64>; 2] = Default::default();
    for generation in 2..2 + sizes.restarts {
        for (i, unit) in ["dual", "old"].into_iter().enumerate() {
            mcpctl(&d, &["restart", unit]);
            let this = |l: &str| l.contains(&format!("mcpd_server={unit} generation={generation}"));
            let (_, lines) = d.until(1, |l| running(l) && this(l));
            let starting = lines
                .iter()
                .rev()
                .find(|l| l.contains("mcpd::supervisor: starting") && this(l))
                .expect("a starting line");
            let up = lines.last().expect("the running line");
            times[i].push((logged_at(up) - logged_at(starting)) * 1000.0);
        }
    }
    let [dual, old] = times.map(stats);
    Row::new(
        "start to established: a server of both eras, protocol \"auto\" (server/discover, 2026-07-28) vs \"legacy\" (initialize)",
        "within 20 ms",
        format!(
            "{:.2} vs {:.2} ms: +{:.2} ms",
            dual.p50,
            old.p50,
            dual.p50 - old.p50
        ),
        format!("p95 {:.2} vs {:.2} ms", dual.p95, old.p95),
        dual.runs,
    )
    .met(dual.p50 <= old.p50 + 20.0)
}

/// SIGSTOP a server the moment it runs; the daemon's "connection lost"
/// line comes interval + failures × timeout after it last spoke.
fn detection(sizes: &Sizes) -> Row {
    let (interval, timeout, failures) = (1000u64, 500u64, 2u64);
    let expected = Duration::from_millis(interval + failures * timeout);
    let mut errors = Vec::new();
    for _ in 0..sizes.detections {
        let dir = tempfile::tempdir().expect("tempdir");
        fixture(
            dir.path(),
            "hung",
            &[],
            &format!(
                "health {{\n    interval \"{interval}ms\"\n    timeout \"{timeout}ms\"\n    failures {failures}\n}}\n"
            ),
        );
        let d = Daemon::start(dir.path(), None);
        let (up, lines) = d.until(1, running);
        let pid: i32 = lines
            .last()
            .and_then(|l| l.split("pid ").nth(1))
            .and_then(|p| p.split(',').next())
            .and_then(|p| p.parse().ok())
            .expect("the running line names the pid");
        let pid = rustix::process::Pid::from_raw(pid).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::STOP).expect("SIGSTOP");
        // ping, or server/discover to a server of 2026-07-28
        let (lost, _) = d.until(1, |l| l.contains("connection lost: no answer to "));
        let took = lost - up;
        errors.push((took.as_secs_f64() - expected.as_secs_f64()).abs() * 1000.0);
    }
    let s = stats(errors);
    Row::ms(
        format!(
            "hung server noticed: distance of detection from interval + failures × timeout ({} ms)",
            expected.as_millis()
        ),
        "within 50 ms",
        s,
        1,
    )
    .met(s.p50 <= 50.0)
}

/// The daemon's CPU over a window while one server misbehaves.
fn floods(sizes: &Sizes) -> Vec<Row> {
    let cases: [(&str, &[&str], &str); 2] = [
        (
            "stderr flood",
            &["--stderr-flood"],
            "writes stderr as fast as it can",
        ),
        (
            "list_changed storm",
            &["--list-changed-storm", "2000"],
            "sends 2,000 tools/list_changed a second",
        ),
    ];
    cases
        .into_iter()
        .map(|(what, args, how)| {
            let dir = tempfile::tempdir().expect("tempdir");
            fixture(dir.path(), "bad", args, "");
            let d = Daemon::start(dir.path(), None);
            d.until(1, running);
            std::thread::sleep(Duration::from_millis(500));
            let window = Duration::from_secs(sizes.flood_secs);
            // Trials: windows one after another, the flood going on.
            let shares = (0..common::trials())
                .map(|_| {
                    let started = Instant::now();
                    let before = cpu_ns(d.pid());
                    std::thread::sleep(window);
                    let used = cpu_ns(d.pid()) - before;
                    used as f64 / started.elapsed().as_nanos() as f64 * 100.0
                })
                .collect();
            let share = stats(shares);
            Row::new(
                format!(
                    "{what}: daemon CPU while one server {how}, windows of {} s",
                    window.as_secs()
                ),
                "< 10 % of a core",
                format!("{:.1} %", share.p50),
                format!("trials {:.1}..{:.1} %", share.min, share.max),
                share.runs,
            )
            .met(share.p50 < 10.0)
        })
        .collect()
}
