//! Both eras of MCP through mcpd. A host on 2025-11-25 connects with the
//! `initialize` handshake; a host on 2026-07-28 has none: it may ask
//! `server/discover`, stamps every request's `_meta` with its version and
//! capabilities, and is asked for elicitation and sampling by
//! `input_required` results instead of requests of the server's own. mcpd
//! serves 2026-07-28 to any host, whatever its server speaks.
//!
//! The host is the official MCP Python SDK's `mcp.client.Client` in each of
//! its modes (`legacy`, `auto`: discover then initialize, `2026-07-28`:
//! adopted without a probe), driven by `tests/data/era_client.py`, against
//! two servers: `@modelcontextprotocol/server-everything` (TypeScript SDK,
//! 2025-11-25 only) and the Python SDK's dual-era example server
//! (`mcp-everything-server` from the mcp 2.3.0 sdist, over stdio). Each run
//! is made directly and through `mcpctl bridge`; through mcpd a host gets
//! what it gets directly, or better (2026-07-28 from a server that does not
//! speak it).

use std::path::{Path, PathBuf};

use rustix::process::Signal;
use serde_json::Value;

use crate::daemon::fidelity::everything;
use crate::helper::{Daemon, mcpctl_user, root};

const MODERN: &str = "2026-07-28";
const LEGACY: &str = "2025-11-25";

/// The checks of a plain run (`era_client.py` without `--input`).
const CHECKS: [&str; 6] = ["tools", "resources", "read", "prompts", "prompt", "call"];

/// The virtualenv's Python: mcp 2.3.0 and the example server.
fn py_everything() -> PathBuf {
    let python = root().join("target/py-everything/bin/python");
    assert!(
        root()
            .join("target/py-everything/bin/mcp-everything-server")
            .is_file(),
        "{} is missing: .ci/run installs the mcp 2.3.0 sdist's example server into target/py-everything",
        python.display()
    );
    python
}

#[derive(Clone, Copy, Debug)]
enum Server {
    /// `@modelcontextprotocol/server-everything` (unit `everything`).
    Everything,
    /// The Python SDK's example server (unit `py`).
    Python,
    /// Both, as one aggregate (`mcpctl bridge @mix`, DESIGN §14).
    Mix,
}

impl Server {
    /// Its profile in `era_client.py`.
    fn profile(self) -> &'static str {
        match self {
            Server::Everything => "everything",
            Server::Python => "python",
            Server::Mix => "aggregate",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Server::Everything => "everything",
            Server::Python => "py",
            Server::Mix => "@mix",
        }
    }

    /// The command that runs it over stdio.
    fn command(self) -> Vec<String> {
        match self {
            Server::Mix => panic!("an aggregate is only reached through mcpd"),
            Server::Everything => vec![
                "node".into(),
                everything().to_str().expect("utf-8 path").into(),
                "stdio".into(),
            ],
            Server::Python => vec![
                py_everything().to_str().expect("utf-8 path").into(),
                root()
                    .join("tests/data/py_everything_stdio.py")
                    .to_str()
                    .expect("utf-8 path")
                    .into(),
            ],
        }
    }
}

/// One run of `era_client.py`: the host's mode, the server, directly or
/// through the daemon whose runtime dir is given, and whether it calls the
/// tools that ask the host for input.
#[derive(Clone, Copy, Debug)]
struct Run<'a> {
    mode: &'static str,
    server: Server,
    through: Option<&'a Path>,
    input: bool,
}

impl<'a> Run<'a> {
    /// A plain run (no `--input`).
    fn new(mode: &'static str, server: Server, through: Option<&'a Path>) -> Self {
        Self {
            mode,
            server,
            through,
            input: false,
        }
    }

    /// The same run calling the tools that ask the host for input.
    fn input(self) -> Self {
        Self {
            input: true,
            ..self
        }
    }

    /// The run's JSON object.
    fn go(&self) -> Value {
        let mut cmd = std::process::Command::new(py_everything());
        cmd.arg(root().join("tests/data/era_client.py"));
        if self.input {
            cmd.arg("--input");
        }
        cmd.args([self.mode, self.server.profile()])
            .env("PYTHONWARNINGS", "ignore")
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .env_remove("MCPD_RUNTIME_DIR")
            .stdin(std::process::Stdio::null());
        match self.through {
            Some(runtime) => {
                cmd.args([env!("CARGO_BIN_EXE_mcpctl"), "--user", "bridge"])
                    .arg(self.server.unit())
                    .env("XDG_RUNTIME_DIR", runtime);
            }
            None => {
                cmd.args(self.server.command());
            }
        }
        // era_client.py bounds every wait itself (at most some 90 s).
        let out = cmd.output().expect("python");
        assert!(
            out.status.success(),
            "{self:?}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{self:?}: not one JSON object ({e})\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}

/// Every run at once (each is mostly waiting on its Python start-up).
fn all<const N: usize>(runs: [Run; N]) -> [Value; N] {
    std::thread::scope(|s| {
        let handles = runs.map(|run| s.spawn(move || run.go()));
        handles.map(|h| h.join().expect("a run panicked"))
    })
}

/// Both servers in `mode`, each directly and through the daemon whose
/// runtime dir is `runtime`.
fn each_server<'a>(mode: &'static str, runtime: &'a Path) -> [Run<'a>; 4] {
    [
        Run::new(mode, Server::Everything, None),
        Run::new(mode, Server::Everything, Some(runtime)),
        Run::new(mode, Server::Python, None),
        Run::new(mode, Server::Python, Some(runtime)),
    ]
}

/// `v` without the members `keys`.
fn without(v: &Value, keys: &[&str]) -> Value {
    let mut v = v.clone();
    let object = v.as_object_mut().expect("an object");
    for key in keys {
        object.remove(*key);
    }
    v
}

/// Whether a check's outcome is a failure.
fn failed(outcome: &Value) -> bool {
    outcome.as_str().is_some_and(|o| o.starts_with("error"))
}

/// Every check of `run` passed (else a comparison with it proves nothing).
fn passes(run: &Value, checks: &[&str]) {
    assert_eq!(run["connect"], "ok", "{run:#}");
    for check in checks {
        assert!(
            !run[check].is_null() && !failed(&run[check]),
            "{check} fails: {run:#}"
        );
    }
    assert!(run.get("close").is_none(), "{run:#}");
}

/// A daemon with both servers as units, ready: server-everything's
/// capability-gated tools listed (it adds them after `initialized`), the
/// Python server's 28.
struct Servers {
    daemon: Daemon,
    runtime: PathBuf,
    _units: tempfile::TempDir,
}

impl Servers {
    fn start() -> Self {
        let units = tempfile::tempdir().expect("tempdir");
        let unit = |server: Server, extra: &str| {
            let command: String = server
                .command()
                .iter()
                .map(|a| format!(" \"{a}\""))
                .collect();
            std::fs::write(
                units.path().join(format!("{}.kdl", server.unit())),
                format!("stdio {{\n    command{command}\n}}\n{extra}"),
            )
            .expect("write unit");
        };
        // Both in group `mix`, server-everything under the alias `ev`.
        unit(Server::Everything, "group \"mix\"\nalias \"ev\"\n");
        // Spoken to in 2025: its tools that ask in the middle of a call
        // (test_elicitation, test_sampling) need that era's channel.
        unit(
            Server::Python,
            "protocol \"legacy\"\nstartup-timeout \"60s\"\ngroup \"mix\"\n",
        );
        let mut daemon = Daemon::user_no_bus(units.path(), &[]);
        let runtime = daemon.runtime_dir().expect("runtime").to_owned();
        let tools = |name: &str| {
            let out = mcpctl_user(&runtime, &["tools", name]);
            String::from_utf8_lossy(&out.stdout).lines().count()
        };
        daemon.wait_until("both servers' tools", |_| {
            tools("everything") >= 17 && tools("py") >= 28
        });
        // server-everything speaks only 2025-11-25 (protocol "auto" finds
        // it out); the Python server is pinned to it.
        for name in ["everything", "py"] {
            let out = mcpctl_user(&runtime, &["status", name]);
            let status = String::from_utf8_lossy(&out.stdout);
            assert!(status.contains("   Protocol: 2025-11-25"), "{status}");
        }
        Self {
            daemon,
            runtime,
            _units: units,
        }
    }

    fn stop(self) {
        assert!(self.daemon.stop(Signal::TERM).success());
    }
}

#[test]
fn a_legacy_host_gets_through_mcpd_what_it_gets_directly() {
    let servers = Servers::start();
    let [e_direct, e_bridged, p_direct, p_bridged] = all(each_server("legacy", &servers.runtime));
    for direct in [&e_direct, &p_direct] {
        passes(direct, &CHECKS);
        assert_eq!(direct["protocol"], LEGACY, "{direct:#}");
    }
    assert_eq!(e_direct["tools"].as_array().map(Vec::len), Some(17));
    assert_eq!(e_direct["server"], "mcp-servers/everything");
    assert_eq!(p_direct["server"], "mcp-conformance-test-server");
    assert_eq!(e_bridged, e_direct);
    assert_eq!(p_bridged, p_direct);
    servers.stop();
}

#[test]
fn an_auto_host_gets_2026_07_28_through_mcpd_whatever_its_server_speaks() {
    let servers = Servers::start();
    let [e_direct, e_bridged, p_direct, p_bridged] = all(each_server("auto", &servers.runtime));
    passes(&e_direct, &CHECKS);
    passes(&p_direct, &CHECKS);
    // Directly, server-everything answers no `server/discover`: the SDK
    // falls back to initialize. The Python server speaks 2026-07-28.
    assert_eq!(e_direct["protocol"], LEGACY, "{e_direct:#}");
    assert_eq!(p_direct["protocol"], MODERN, "{p_direct:#}");
    // Through mcpd both are 2026-07-28, the server named by discover's
    // serverInfo as by initialize, and everything else the same.
    for (bridged, direct) in [(&e_bridged, &e_direct), (&p_bridged, &p_direct)] {
        assert_eq!(bridged["protocol"], MODERN, "{bridged:#}");
        assert_eq!(
            without(bridged, &["protocol"]),
            without(direct, &["protocol"]),
            "through mcpd: {bridged:#}"
        );
    }
    servers.stop();
}

#[test]
fn a_2026_07_28_host_gets_through_mcpd_what_server_everything_cannot_give_it() {
    let servers = Servers::start();
    let runtime = Some(servers.runtime.as_path());
    let [e_pinned, e_legacy, e_bridged, p_direct, p_bridged] = all([
        Run::new(MODERN, Server::Everything, None),
        Run::new("legacy", Server::Everything, None),
        Run::new(MODERN, Server::Everything, runtime),
        Run::new(MODERN, Server::Python, None),
        Run::new(MODERN, Server::Python, runtime),
    ]);
    // Directly, a pinned host gets nothing from server-everything: its
    // answers have no resultType (nor ttlMs, cacheScope on lists and
    // reads), and the SDK refuses every one.
    assert_eq!(e_pinned["protocol"], MODERN, "{e_pinned:#}");
    for check in CHECKS {
        assert!(failed(&e_pinned[check]), "{check}: {e_pinned:#}");
    }
    // Through mcpd it gets what a legacy host gets directly (a pinned host
    // asks no discover, so the server is unnamed).
    passes(&e_legacy, &CHECKS);
    assert_eq!(e_bridged["protocol"], MODERN, "{e_bridged:#}");
    assert_eq!(e_bridged["server"], Value::Null, "{e_bridged:#}");
    assert_eq!(
        without(&e_bridged, &["protocol", "server", "mode"]),
        without(&e_legacy, &["protocol", "server", "mode"]),
        "through mcpd: {e_bridged:#}"
    );
    // The Python server speaks 2026-07-28 itself: the same either way.
    passes(&p_direct, &CHECKS);
    assert_eq!(p_direct["protocol"], MODERN, "{p_direct:#}");
    assert_eq!(p_bridged, p_direct);
    servers.stop();
}

#[test]
fn a_2026_07_28_host_answers_elicitation_and_sampling_through_mcpd() {
    let servers = Servers::start();
    let runtime = Some(servers.runtime.as_path());
    let [e_legacy, e_bridged, p_legacy, p_pinned, p_bridged] = all([
        Run::new("legacy", Server::Everything, None).input(),
        Run::new(MODERN, Server::Everything, runtime).input(),
        Run::new("legacy", Server::Python, None).input(),
        Run::new(MODERN, Server::Python, None).input(),
        Run::new(MODERN, Server::Python, runtime).input(),
    ]);
    // Alone on the unit: the Python server's requests in the middle of a
    // call carry no related-request id, so with two hosts' calls in
    // flight mcpd could only guess whose they are (DESIGN §8).
    let p_legacy_bridged = Run::new("legacy", Server::Python, runtime).input().go();
    // Directly, on 2025-11-25, each tool asks the host once in the middle
    // of the call, and its result carries the host's answer.
    let asked = |run: &Value, check: &str, callback: &str, answer: &str| {
        let outcome = &run[check];
        assert_eq!(outcome["callbacks"][callback], 1, "{check}: {run:#}");
        assert_eq!(outcome["error"], false, "{check}: {run:#}");
        assert!(
            outcome["text"].as_str().is_some_and(|t| t.contains(answer)),
            "{check}: {run:#}"
        );
    };
    // Directly on 2025-11-25 the server also asks the host for its roots
    // when it likes (a count that lands on whichever call is running);
    // through mcpd a shared unit is answered from the unit's roots
    // (DESIGN §8), so the roots count is not compared.
    let but_roots = |outcome: &Value| {
        let mut outcome = outcome.clone();
        if let Some(callbacks) = outcome["callbacks"].as_object_mut() {
            callbacks.remove("roots");
        }
        outcome
    };
    for run in [&e_legacy, &p_legacy] {
        assert_eq!(run["protocol"], LEGACY, "{run:#}");
        asked(run, "elicit", "elicitation", "elicited by the host");
        asked(run, "sample", "sampling", "sampled by the host");
    }
    // A legacy host through mcpd (the server pinned to "legacy"): the
    // same, asked in the middle of the call as directly.
    assert_eq!(p_legacy_bridged["protocol"], LEGACY, "{p_legacy_bridged:#}");
    for check in ["elicit", "sample"] {
        assert_eq!(
            but_roots(&p_legacy_bridged[check]),
            but_roots(&p_legacy[check]),
            "{check}: {p_legacy_bridged:#}"
        );
    }
    // Directly on 2026-07-28, the Python server cannot ask in the middle
    // of a call (no back-channel), only by an input_required result.
    assert_eq!(p_pinned["protocol"], MODERN, "{p_pinned:#}");
    for check in ["elicit", "sample"] {
        assert!(
            p_pinned[check]["text"]
                .as_str()
                .is_some_and(|t| t.contains("no back-channel")),
            "{check}: {p_pinned:#}"
        );
    }
    asked(
        &p_pinned,
        "ir_elicit",
        "elicitation",
        "elicited by the host",
    );
    asked(&p_pinned, "ir_sample", "sampling", "sampled by the host");
    // Through mcpd, a 2026-07-28 host is asked by input_required results
    // (the SDK answers them with the same callbacks), and gets what a
    // legacy host gets directly: the server's own requests, answered.
    for (bridged, legacy) in [(&e_bridged, &e_legacy), (&p_bridged, &p_legacy)] {
        assert_eq!(bridged["protocol"], MODERN, "{bridged:#}");
        for check in ["elicit", "sample"] {
            assert_eq!(
                but_roots(&bridged[check]),
                but_roots(&legacy[check]),
                "{check}: {bridged:#}"
            );
        }
    }
    servers.stop();
}

/// How long unit `py` of [`modern_python`] stays idle, and its 2025 lane
/// after its last host left.
const IDLE_STOP: std::time::Duration = std::time::Duration::from_secs(8);

/// A daemon with the Python server as unit `py` under the default
/// `protocol` (`auto`: spoken to in 2026-07-28, a 2025 lane for 2025
/// hosts; on demand, [`IDLE_STOP`]), its tools listed:
/// the daemon, its runtime dir, and the units' directory (kept while the
/// daemon runs).
fn modern_python() -> (Daemon, PathBuf, tempfile::TempDir) {
    let idle = format!(
        "start \"on-demand\"\nidle-stop \"{}s\"\n",
        IDLE_STOP.as_secs()
    );
    python_units(&[("py", &idle)])
}

/// A daemon with the Python server as each of `units` (name, the unit's
/// lines besides its command), each spoken to in 2026-07-28 and its tools
/// listed.
fn python_units(units: &[(&str, &str)]) -> (Daemon, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let command: String = Server::Python
        .command()
        .iter()
        .map(|a| format!(" \"{a}\""))
        .collect();
    for (name, lines) in units {
        std::fs::write(
            dir.path().join(format!("{name}.kdl")),
            format!("stdio {{\n    command{command}\n}}\nstartup-timeout \"60s\"\n{lines}"),
        )
        .expect("write unit");
    }
    let mut daemon = Daemon::user_no_bus(dir.path(), &[]);
    let runtime = daemon.runtime_dir().expect("runtime").to_owned();
    let status = |name: &str| {
        let out = mcpctl_user(&runtime, &["status", name]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    daemon.wait_until_within("the server's tools", crate::helper::STARTUP, |_| {
        units
            .iter()
            .all(|(name, _)| status(name).contains("Tools: 28"))
    });
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    for (name, _) in units {
        assert!(
            status(name).contains("   Protocol: 2026-07-28"),
            "{}",
            status(name)
        );
        let version = rt.block_on(async {
            let (_conn, server) =
                crate::helper::private_server(&runtime.join("mcpd/private"), name).await;
            server.protocol_version().await.expect("ProtocolVersion")
        });
        assert_eq!(version, "2026-07-28", "D-Bus ProtocolVersion");
    }
    (daemon, runtime, dir)
}

/// The unit's upstreams as D-Bus `Lanes` shows them: (version, pid,
/// hosts).
fn lanes(runtime: &Path, unit: &str) -> Vec<(String, u32, u32)> {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let (_conn, server) =
            crate::helper::private_server(&runtime.join("mcpd/private"), unit).await;
        server.lanes().await.expect("Lanes")
    })
}

/// A 2025 host held on unit `unit` through `mcpctl bridge`, its
/// `initialize` answered; it leaves when dropped (its stdout is kept
/// open meanwhile: the daemon writes it).
struct Held {
    child: std::process::Child,
    _stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Held {
    fn attach(runtime: &Path, unit: &str) -> Self {
        use std::io::{BufRead, Write};
        let mut child = crate::helper::mcpctl_user_command(runtime, &["bridge", unit])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("bridge");
        let mut stdin = child.stdin.take().expect("stdin");
        writeln!(
            stdin,
            r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"{LEGACY}","capabilities":{{}},"clientInfo":{{"name":"held","version":"1"}}}}}}"#
        )
        .expect("write initialize");
        let mut line = String::new();
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        stdout.read_line(&mut line).expect("read the answer");
        let answer: Value = serde_json::from_str(&line).expect("an answer");
        assert_eq!(answer["result"]["protocolVersion"], LEGACY, "{answer:#}");
        // The bridge keeps its stdin: the host stays attached until then.
        child.stdin = Some(stdin);
        Self {
            child,
            _stdout: stdout,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// DESIGN §12, lanes: a server that speaks both eras serves each host in
/// its own era, by itself: the 2025 host's elicitation and sampling
/// tools ask it in the middle of the call, as directly; the 2026-07-28
/// host's input_required tools answer it, as directly; a second process
/// serves the 2025 hosts, and stops `idle-stop` after the last left.
#[test]
fn a_2026_07_28_server_serves_hosts_of_both_eras_through_mcpd() {
    let (daemon, runtime, _units) = modern_python();
    // One process, the 2026-07-28 one, until a 2025 host comes.
    let first = lanes(&runtime, "py");
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].0, MODERN, "{first:?}");
    let held = Held::attach(&runtime, "py");
    let through = Some(runtime.as_path());
    let [legacy, modern, legacy_direct, pinned_direct] = all([
        Run::new("legacy", Server::Python, through).input(),
        Run::new(MODERN, Server::Python, through).input(),
        Run::new("legacy", Server::Python, None).input(),
        Run::new(MODERN, Server::Python, None).input(),
    ]);
    // Two processes, one per era (the held host on the 2025 one).
    let both = lanes(&runtime, "py");
    assert_eq!(both.len(), 2, "{both:?}");
    assert_eq!((both[0].0.as_str(), both[1].0.as_str()), (MODERN, LEGACY));
    let (own, lane) = (both[0].1, both[1].1);
    assert!(own != 0 && lane != 0 && own != lane, "{both:?}");
    assert_eq!(both[1].2, 1, "the held host: {both:?}");
    for pid in [own, lane] {
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "{pid}: {both:?}"
        );
    }
    let shown =
        String::from_utf8_lossy(&mcpctl_user(&runtime, &["status", "py"]).stdout).into_owned();
    assert!(
        shown.contains(&format!(
            "   Protocol: {MODERN} (pid {own}, 0 hosts), {LEGACY} (pid {lane}, 1 host)"
        )),
        "{shown}"
    );
    for run in [&legacy, &modern] {
        passes(run, &[]);
    }
    // Each host in its own era.
    assert_eq!(legacy["protocol"], LEGACY, "{legacy:#}");
    assert_eq!(modern["protocol"], MODERN, "{modern:#}");
    // The 2025 host is asked in the middle of the call, as directly
    // (through one 2026-07-28 upstream it was not: "no back-channel").
    assert_eq!(
        legacy_direct["elicit"]["callbacks"]["elicitation"], 1,
        "{legacy_direct:#}"
    );
    assert_eq!(
        legacy_direct["sample"]["callbacks"]["sampling"], 1,
        "{legacy_direct:#}"
    );
    for check in ["elicit", "sample"] {
        assert_eq!(legacy[check], legacy_direct[check], "{check}: {legacy:#}");
    }
    // The 2026-07-28 host answers the server's input_required results as
    // it does directly: several questions in one result, and round after
    // round, the server's requestState given back unchanged (the server
    // checks its seal: `ir_tampered` says "state-ok" only for an intact
    // one).
    assert_eq!(
        pinned_direct["ir_multi_round"]["callbacks"]["elicitation"], 2,
        "{pinned_direct:#}"
    );
    assert_eq!(
        pinned_direct["ir_tampered"]["text"], "state-ok: round-1",
        "{pinned_direct:#}"
    );
    for check in [
        "ir_elicit",
        "ir_sample",
        "ir_roots",
        "ir_multiple",
        "ir_multi_round",
        "ir_tampered",
    ] {
        assert!(!failed(&pinned_direct[check]), "{check}: {pinned_direct:#}");
        assert_eq!(
            pinned_direct[check]["error"], false,
            "{check}: {pinned_direct:#}"
        );
        assert_eq!(modern[check], pinned_direct[check], "{check}: {modern:#}");
        // The 2025 host gets what it gets directly from the same tools.
        assert_eq!(legacy[check], legacy_direct[check], "{check}: {legacy:#}");
    }
    // The last 2025 host leaves: its process stops idle-stop later, not
    // before.
    drop(held);
    let left = std::time::Instant::now();
    crate::helper::eventually(
        "the 2025 lane to stop",
        IDLE_STOP + std::time::Duration::from_secs(60),
        || lanes(&runtime, "py").iter().all(|(v, _, _)| v != LEGACY),
    );
    assert!(
        left.elapsed() >= IDLE_STOP - std::time::Duration::from_secs(1),
        "stopped {:?} after its last host left",
        left.elapsed()
    );
    crate::helper::eventually(
        "its process to be gone",
        std::time::Duration::from_secs(30),
        || !Path::new(&format!("/proc/{lane}")).exists(),
    );
    assert!(daemon.stop(Signal::TERM).success());
}

#[test]
fn hosts_of_both_eras_get_an_aggregate_of_both_servers() {
    let servers = Servers::start();
    let through = Some(servers.runtime.as_path());
    let [legacy, auto, modern] = all([
        Run::new("legacy", Server::Mix, through),
        Run::new("auto", Server::Mix, through),
        Run::new(MODERN, Server::Mix, through),
    ]);
    // One at a time: a 2025 server's request to a host names no request
    // of the host's, so of two hosts calling at once the latest caller is
    // asked (DESIGN §8), which is not what this test is about.
    let legacy_input = Run::new("legacy", Server::Mix, through).input().go();
    let modern_input = Run::new(MODERN, Server::Mix, through).input().go();
    for run in [&legacy, &auto, &modern] {
        passes(run, &CHECKS);
        // (A host pinned to 2026-07-28 asks no discovery: it names none.)
        assert!(
            run["server"] == "mcpd" || run["mode"] == MODERN && run["server"].is_null(),
            "{run:#}"
        );
        let tools: Vec<&str> = run["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            tools.contains(&"ev__echo") && tools.contains(&"py__test_simple_text"),
            "{run:#}"
        );
        assert!(
            tools
                .iter()
                .all(|t| t.starts_with("ev__") || t.starts_with("py__")),
            "{run:#}"
        );
        assert_eq!(run["call"]["error"], false, "{run:#}");
    }
    assert_eq!(legacy["protocol"], LEGACY, "{legacy:#}");
    assert_eq!(auto["protocol"], MODERN, "{auto:#}");
    assert_eq!(modern["protocol"], MODERN, "{modern:#}");
    for run in [&legacy, &auto] {
        assert_eq!(run["tools"], modern["tools"], "one list in both eras");
        assert_eq!(run["call"], modern["call"]);
    }
    // Each unit's requests to the host reach it through the aggregate: as
    // requests of their own to a 2025 host, as input_required results to
    // a 2026-07-28 one, answered by the same callbacks.
    for run in [&legacy_input, &modern_input] {
        passes(run, &["elicit", "sample", "py_elicit", "py_sample"]);
        for (check, callback, answer) in [
            ("elicit", "elicitation", "elicited by the host"),
            ("sample", "sampling", "sampled by the host"),
            ("py_elicit", "elicitation", "elicited by the host"),
            ("py_sample", "sampling", "sampled by the host"),
        ] {
            let outcome = &run[check];
            assert_eq!(outcome["callbacks"][callback], 1, "{check}: {run:#}");
            assert_eq!(outcome["error"], false, "{check}: {run:#}");
            assert!(
                outcome["text"].as_str().is_some_and(|t| t.contains(answer)),
                "{check}: {run:#}"
            );
        }
    }
    servers.stop();
}

/// Runs `tests/data/ts_era_client.mjs` (the TypeScript SDK's client, a
/// host of the 2025 era) against `command`: each check's outcome.
fn ts_era(command: &[&str], runtime: Option<&Path>) -> Value {
    crate::daemon::fidelity::ts_client("ts_era_client.mjs", command, runtime)
}

#[test]
fn a_typescript_sdk_host_gets_a_2026_07_28_servers_questions_as_requests_through_mcpd() {
    // `py` serves each host in its own era (a 2025 lane for this host);
    // `pinned` is one process speaking 2026-07-28, and translates.
    let (daemon, runtime, _units) =
        python_units(&[("py", ""), ("pinned", "protocol \"2026-07-28\"\n")]);
    let command = Server::Python.command();
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    let mcpctl = env!("CARGO_BIN_EXE_mcpctl");
    let (direct, laned, bridged) = std::thread::scope(|s| {
        let direct = s.spawn(|| ts_era(&command, None));
        let laned = s.spawn(|| ts_era(&[mcpctl, "--user", "bridge", "py"], Some(&runtime)));
        let bridged = ts_era(&[mcpctl, "--user", "bridge", "pinned"], Some(&runtime));
        (
            direct.join().expect("direct run"),
            laned.join().expect("laned run"),
            bridged,
        )
    });
    // Lists, a read, a prompt and a call: the same either way.
    for check in ["tools", "resources", "read", "prompts", "prompt", "call"] {
        assert!(
            !failed(&direct[check]),
            "{check} fails directly: {direct:#}"
        );
        assert_eq!(bridged[check], direct[check], "{check}: {bridged:#}");
        assert_eq!(laned[check], direct[check], "{check}: {laned:#}");
    }
    assert_eq!(direct["tools"], 28, "{direct:#}");
    assert_eq!(bridged["server"], direct["server"], "{bridged:#}");
    // Directly the SDK (2025 only) refuses the tools that answer with an
    // input_required result: the server speaks 2025 to it, and sends it
    // what only 2026-07-28 has. So through a 2025 lane, where the server
    // itself serves the host in its era (DESIGN §12).
    let inputs = [
        "elicitation",
        "sampling",
        "list_roots",
        "multiple_inputs",
        "multi_round",
        "tampered_state",
    ];
    for check in inputs {
        assert!(
            direct[check]
                .as_str()
                .is_some_and(|e| e.contains("invalid result")),
            "{check}: {direct:#}"
        );
        assert_eq!(laned[check], direct[check], "{check}: {laned:#}");
    }
    let py = lanes(&runtime, "py");
    assert_eq!(py.len(), 2, "a 2025 lane beside the unit's own: {py:?}");
    // Through a unit pinned to 2026-07-28 (one process, translation) each
    // completes, its questions arriving as ordinary requests to the
    // host's handlers, as many rounds as the server asks, its
    // requestState given back unchanged (the server checks its seal, and
    // says "state-ok" only for an intact one).
    let pinned = lanes(&runtime, "pinned");
    assert_eq!(pinned.len(), 1, "one process: {pinned:?}");
    assert_eq!(pinned[0].0, MODERN, "{pinned:?}");
    let expect = [
        ("elicitation", [1, 0, 0], "Hello, name from the ts host!"),
        ("sampling", [0, 1, 0], "Model said: sampled by the ts host"),
        ("list_roots", [0, 0, 1], "Client exposed 1 root(s)."),
        ("multiple_inputs", [1, 1, 1], "All inputs received."),
        (
            "multi_round",
            [2, 0, 0],
            "name from the ts host likes color from the ts host.",
        ),
        ("tampered_state", [1, 0, 0], "state-ok: round-1"),
    ];
    for (check, [elicitation, sampling, roots], text) in expect {
        let got = &bridged[check];
        assert_eq!(
            got,
            &serde_json::json!({
                "asked": {"elicitation": elicitation, "sampling": sampling, "roots": roots},
                "error": false,
                "text": text,
            }),
            "{check}: {bridged:#}"
        );
    }
    assert!(daemon.stop(Signal::TERM).success());
}

/// A 2026-07-28 host's call of `test_input_required_result_tampered_state`
/// over `command` (started with `runtime` as its XDG_RUNTIME_DIR, if one
/// is given), raw lines: the server's answer to the retry with its
/// requestState changed, and to the retry with it intact.
async fn tampered(command: &[&str], runtime: Option<&Path>) -> (Value, Value) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut cmd = tokio::process::Command::new(command[0]);
    cmd.args(&command[1..])
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .env_remove("MCPD_RUNTIME_DIR")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    if let Some(runtime) = runtime {
        cmd.env("XDG_RUNTIME_DIR", runtime);
    }
    let mut child = cmd.spawn().expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let call = |id: u64, retry: Option<(&str, Value)>| {
        let mut params = serde_json::json!({
            "name": "test_input_required_result_tampered_state",
            "arguments": {},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
                "io.modelcontextprotocol/clientInfo": {"name": "raw-modern", "version": "1"},
            },
        });
        if let Some((state, responses)) = retry {
            params["requestState"] = state.into();
            params["inputResponses"] = responses;
        }
        let mut line = serde_json::to_vec(
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}),
        )
        .expect("json");
        line.push(b'\n');
        line
    };
    type Lines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>;
    /// Sends `line`, and reads until the answer to `id`.
    async fn answer(
        stdin: &mut tokio::process::ChildStdin,
        lines: &mut Lines,
        line: Vec<u8>,
        id: u64,
    ) -> Value {
        stdin.write_all(&line).await.expect("write");
        loop {
            let line = lines.next_line().await.expect("read").expect("a line");
            let message: Value = serde_json::from_str(&line).expect("JSON");
            if message.get("method").is_none() && message["id"] == id {
                return message;
            }
        }
    }
    let answers = async {
        let asked = answer(&mut stdin, &mut lines, call(1, None), 1).await;
        assert_eq!(asked["result"]["resultType"], "input_required", "{asked}");
        let state = asked["result"]["requestState"]
            .as_str()
            .expect("a requestState")
            .to_owned();
        let responses =
            serde_json::json!({"confirm": {"action": "accept", "content": {"ok": true}}});
        // One character of the sealed state changed.
        let mut changed = state.clone().into_bytes();
        let last = changed.len() / 2;
        changed[last] = if changed[last] == b'A' { b'B' } else { b'A' };
        let changed = String::from_utf8(changed).expect("ASCII");
        let line = call(2, Some((&changed, responses.clone())));
        let refused = answer(&mut stdin, &mut lines, line, 2).await;
        let line = call(3, Some((&state, responses)));
        let intact = answer(&mut stdin, &mut lines, line, 3).await;
        (refused, intact)
    };
    let answers = tokio::time::timeout(std::time::Duration::from_secs(60), answers)
        .await
        .expect("answered within 60 s");
    drop(stdin);
    let _ = child.kill().await;
    answers
}

#[test]
fn a_tampered_request_state_is_refused_through_mcpd_as_the_server_refuses_it() {
    let (daemon, runtime, _units) = modern_python();
    let command = Server::Python.command();
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    let mcpctl = env!("CARGO_BIN_EXE_mcpctl");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let bridge = [mcpctl, "--user", "bridge", "py"];
    let (direct, bridged) = rt.block_on(async {
        tokio::join!(tampered(&command, None), tampered(&bridge, Some(&runtime)))
    });
    // Directly: the changed state refused (invalid params), the intact one
    // accepted.
    let (refused, intact) = &direct;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert_eq!(
        intact["result"]["content"][0]["text"], "state-ok: round-1",
        "{intact}"
    );
    // Through mcpd the host's requestState reaches the server untouched:
    // the same refusal, the same acceptance.
    assert_eq!(bridged.0["error"], refused["error"], "{}", bridged.0);
    assert_eq!(
        bridged.1["result"]["content"], intact["result"]["content"],
        "{}",
        bridged.1
    );
    assert!(daemon.stop(Signal::TERM).success());
}
