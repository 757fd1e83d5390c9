//! Liveness and self-protection (issue 15 targets): the daemon's idle CPU
//! with 100 servers probed at the defaults, over a window that holds each
//! server's first probe; how exactly a hung (SIGSTOPped) server is noticed
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
    let mut rows = vec![idle_with_probes(sizes, bus)];
    rows.push(detection(sizes));
    rows.extend(floods(sizes));
    rows.extend(rt.block_on(beside_a_flood(sizes)));
    rows
}

/// Another server's D-Bus `CallTool` echo p50 with a flooding neighbour vs
/// without, and `mcpctl status` of the flooding server meanwhile.
async fn beside_a_flood(sizes: &Sizes) -> Vec<Row> {
    let calls = sizes.calls;
    let mut p50 = Vec::new();
    let mut status = Vec::new();
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
        if flood {
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
    let (quiet, flooded) = (p50[0], p50[1]);
    let s = stats(status);
    vec![
        Row::new(
            "stderr flood: another server's CallTool echo, p50 beside the flood vs without",
            "within 2×",
            format!("{flooded:.3} vs {quiet:.3} ms: {:.2}×", flooded / quiet),
            "-",
            calls,
        )
        .met(flooded <= 2.0 * quiet),
        Row::ms(
            "stderr flood: mcpctl status of the flooding server, whole process",
            "< 100 ms",
            s,
            1,
        )
        .met(s.p50 < 100.0),
    ]
}

/// CPU over a window from 1 s after all are running to 1 s past their
/// first probe (30 s of silence), scaled to 10 s.
fn idle_with_probes(sizes: &Sizes, bus: Option<&Bus>) -> Row {
    let m = sizes.idle_units;
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..m {
        fixture(dir.path(), &format!("p{i}"), &[], "");
    }
    let d = Daemon::start(dir.path(), bus);
    d.until(m, running);
    std::thread::sleep(Duration::from_secs(1));
    let window = Duration::from_secs(sizes.probe_secs);
    let before = cpu_ns(d.pid());
    std::thread::sleep(window);
    let used = cpu_ns(d.pid()) - before;
    let per_10s = used as f64 / 1e6 * 10.0 / window.as_secs_f64().max(0.001);
    Row::new(
        format!(
            "idle with probes at the defaults: daemon CPU per 10 s, {m} servers, over {} s (each probed once)",
            window.as_secs()
        ),
        "< 10 ms at 100",
        format!("{per_10s:.2} ms"),
        format!("{:.2} ms in the window", used as f64 / 1e6),
        1,
    )
    .met(per_10s < 10.0)
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
        let (lost, _) = d.until(1, |l| l.contains("connection lost: no answer to ping"));
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
            let started = Instant::now();
            let before = cpu_ns(d.pid());
            std::thread::sleep(window);
            let used = cpu_ns(d.pid()) - before;
            let share = used as f64 / started.elapsed().as_nanos() as f64 * 100.0;
            Row::new(
                format!(
                    "{what}: daemon CPU while one server {how}, over {} s",
                    window.as_secs()
                ),
                "< 10 % of a core",
                format!("{share:.1} %"),
                "-",
                1,
            )
            .met(share < 10.0)
        })
        .collect()
}
