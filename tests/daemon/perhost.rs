//! Per-host instances (DESIGN §13) with the real daemon: hosts are the
//! official MCP Python SDK behind `mcpctl bridge`
//! (`tests/data/perhost_client.py`, driven a line at a time), servers the
//! fixture (whose `whoami` says its pid) and `server-filesystem`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use serde_json::{Value, json};

use crate::helper::{
    BOUND, Daemon, alive, cgroup_of, eventually, holds_within, root, timed_out, within,
};

/// A host: the Python SDK behind `mcpctl bridge NAME`.
struct Host {
    child: Child,
    stdin: Option<ChildStdin>,
    answers: mpsc::Receiver<String>,
}

impl Host {
    /// A host of unit `name`, declaring `roots` when there are any.
    fn start(runtime: &Path, name: &str, roots: &[&str]) -> Self {
        Self::start_in(None, runtime, name, roots)
    }

    /// [`Host::start`] with the SDK's `Client` in `mode` (a host of MCP
    /// 2026-07-28 with "2026-07-28"), or its `ClientSession` (2025).
    fn start_in(mode: Option<&str>, runtime: &Path, name: &str, roots: &[&str]) -> Self {
        let mut child = Command::new("python3")
            .arg(root().join("tests/data/perhost_client.py"))
            .args(mode.map(|m| format!("--mode={m}")))
            .arg(env!("CARGO_BIN_EXE_mcpctl"))
            .arg(name)
            .args(roots)
            .env("XDG_RUNTIME_DIR", runtime)
            .env_remove("MCPD_RUNTIME_DIR")
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 perhost_client.py");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        let (tx, answers) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            stdin,
            answers,
        }
    }

    fn ask(&mut self, command: Value) -> Value {
        let stdin = self.stdin.as_mut().expect("the host is attached");
        writeln!(stdin, "{command}").expect("write to the host");
        let line = self
            .answers
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("the host did not answer {command}"));
        serde_json::from_str(&line).expect("a JSON line")
    }

    fn init(&mut self) -> Value {
        self.ask(json!({"op": "init"}))
    }

    fn call(&mut self, name: &str, args: Value) -> Value {
        self.ask(json!({"op": "call", "name": name, "args": args}))
    }

    /// The pid of the server answering this host (the fixture's `whoami`).
    fn server_pid(&mut self) -> u32 {
        let answer = self.call("whoami", json!({}));
        let who: Value = serde_json::from_str(answer["text"].as_str().unwrap_or_default())
            .unwrap_or_else(|_| panic!("whoami: {answer}"));
        let pid = who["pid"]
            .as_u64()
            .unwrap_or_else(|| panic!("whoami: {answer}"));
        u32::try_from(pid).expect("a pid")
    }

    /// The pid of the server answering this host's next `whoami` that is
    /// answered (calls during an outage fail; bounded).
    fn next_server_pid(&mut self) -> u32 {
        u32::try_from(self.next_whoami()["pid"].as_u64().expect("pid")).expect("pid")
    }

    /// The fixture's next `whoami` that is answered (bounded).
    fn next_whoami(&mut self) -> Value {
        let (mut answer, mut who) = (Value::Null, None);
        let answered = holds_within(BOUND, || {
            answer = self.call("whoami", json!({}));
            who = serde_json::from_str::<Value>(answer["text"].as_str().unwrap_or("")).ok();
            who.is_some()
        });
        assert!(
            answered,
            "{}; last: {answer}",
            timed_out("a server to answer whoami", BOUND)
        );
        who.expect("answered")
    }

    /// The host leaves: end of its input, and it exits (closing its bridge).
    fn leave(mut self) {
        drop(self.stdin.take());
        eventually("the host to exit", BOUND, || {
            self.child.try_wait().expect("wait").is_some()
        });
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two hosts attached to unit `mine` (the fixture and `extra`), each
/// with its server's pid.
struct Two {
    units: tempfile::TempDir,
    d: Daemon,
    runtime: PathBuf,
    a: (Host, u32),
    b: (Host, u32),
}

impl Two {
    fn start(extra: &str) -> Self {
        let units = tempfile::tempdir().expect("tempdir");
        fixture_unit(units.path(), "mine", extra);
        Self::on(units)
    }

    /// Two hosts of unit `mine` of `units`.
    fn on(units: tempfile::TempDir) -> Self {
        python_sdk();
        let (d, runtime) = daemon(units.path());
        let (mut a, mut b) = (
            Host::start(&runtime, "mine", &[]),
            Host::start(&runtime, "mine", &[]),
        );
        a.init();
        b.init();
        let (pa, pb) = (a.server_pid(), b.server_pid());
        Self {
            units,
            d,
            runtime,
            a: (a, pa),
            b: (b, pb),
        }
    }
}

/// A unit running the fixture.
fn fixture_unit(dir: &Path, name: &str, extra: &str) {
    std::fs::write(
        dir.join(format!("{name}.kdl")),
        format!(
            "stdio {{\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}}\nreconnect {{\n    initial-delay \"200ms\"\n    max-delay \"1s\"\n}}\nstop-timeout \"1s\"\n{extra}"
        ),
    )
    .expect("write unit");
}

fn daemon(units: &Path) -> (Daemon, PathBuf) {
    let d = Daemon::user_no_bus(units, &[]);
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    // A bridge with no daemon yet says so at once: hosts come once it
    // listens.
    let socket = runtime.join("mcpd/attach");
    crate::helper::eventually("the attach socket", crate::helper::BOUND, || {
        socket.exists()
    });
    (d, runtime)
}

/// SIGKILL to `pid`.
fn kill(pid: u32) {
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(pid).expect("pid")).expect("pid"),
        Signal::KILL,
    )
    .expect("kill");
}

fn python_sdk() {
    let probe = Command::new("python3")
        .args(["-c", "import mcp.client.stdio"])
        .output()
        .expect("python3");
    assert!(
        probe.status.success(),
        "the MCP Python SDK is missing: python3 -m pip install mcp (.ci/run does)"
    );
}

#[test]
fn two_hosts_get_two_servers_on_a_per_host_unit_and_one_on_a_shared_one() {
    python_sdk();
    let units = tempfile::tempdir().expect("tempdir");
    fixture_unit(units.path(), "mine", "sessions \"per-host\"\n");
    fixture_unit(units.path(), "ours", "");
    let (mut d, runtime) = daemon(units.path());
    d.wait_until("ours running", |d| d.latest_pid("ours").is_some());

    let (mut a, mut b) = (
        Host::start(&runtime, "mine", &[]),
        Host::start(&runtime, "mine", &[]),
    );
    assert_eq!(a.init()["name"], "mcp-fixture");
    assert_eq!(b.init()["name"], "mcp-fixture");
    let (pa, pb) = (a.server_pid(), b.server_pid());
    assert_ne!(
        pa, pb,
        "a per-host unit serves each host with its own server"
    );
    // Each in its own cgroup, below the unit's.
    let (ca, cb) = (cgroup_of(pa), cgroup_of(pb));
    assert_ne!(ca, cb);
    assert_eq!(ca.parent(), cb.parent());
    assert!(ca.parent().is_some_and(|p| p.ends_with("mine")), "{ca:?}");
    // Asked again, the same instance answers.
    assert_eq!(a.server_pid(), pa);

    let (mut c, mut e) = (
        Host::start(&runtime, "ours", &[]),
        Host::start(&runtime, "ours", &[]),
    );
    c.init();
    e.init();
    assert_eq!(
        c.server_pid(),
        e.server_pid(),
        "a shared unit has one server"
    );
    drop((a, b, c, e));
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_host_that_leaves_takes_its_instance_along_and_only_its_own() {
    let Two {
        units: _units,
        mut d,
        runtime: _,
        a: (a, pa),
        b: (mut b, pb),
    } = Two::start("sessions \"per-host\"\n");
    let cgroup = cgroup_of(pa);
    let left = Instant::now();
    a.leave();
    // stop-timeout (1 s) + 1 s.
    eventually("a's server is gone", BOUND, || !alive(pa));
    eventually("a's cgroup is gone", BOUND, || !cgroup.exists());
    assert!(
        left.elapsed() < Duration::from_secs(2) + Duration::from_millis(500),
        "{:?}",
        left.elapsed()
    );
    assert!(alive(pb));
    assert_eq!(b.server_pid(), pb, "the other host's instance is untouched");
    b.leave();
    eventually("b's server is gone", BOUND, || !alive(pb));
    d.wait_for("instance mine@2");
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_crashed_instance_restarts_for_its_host_alone() {
    let Two {
        units: _units,
        d,
        runtime: _,
        a: (mut a, pa),
        b: (mut b, pb),
    } = Two::start("sessions \"per-host\"\n");
    kill(pa);
    eventually("a's server is gone", BOUND, || !alive(pa));
    // After the backoff, a's next call is answered by a new server.
    let again = a.next_server_pid();
    assert_ne!(again, pa);
    assert_ne!(again, pb);
    assert_eq!(b.server_pid(), pb, "the other instance did not restart");
    drop((a, b));
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn an_instance_declares_exactly_its_hosts_capabilities() {
    python_sdk();
    let units = tempfile::tempdir().expect("tempdir");
    // The handshake's era: a server of 2026-07-28 (the fixture is one)
    // reads each request's capabilities, which are its host's already.
    fixture_unit(
        units.path(),
        "mine",
        "sessions \"per-host\"\nprotocol \"legacy\"\n",
    );
    let (mut d, runtime) = daemon(units.path());
    let mut with = Host::start(&runtime, "mine", &["file:///srv/with"]);
    let mut without = Host::start(&runtime, "mine", &[]);
    assert_eq!(with.init()["name"], "mcp-fixture");
    assert_eq!(without.init()["name"], "mcp-fixture");
    for h in [&mut with, &mut without] {
        let set = h.call("set_tools", json!({"tools": ["roots"]}));
        assert_eq!(set["error"], false, "{set}");
    }
    assert_eq!(with.call("roots", json!({}))["text"], "file:///srv/with");
    // Shared, mcpd's client declares `roots` for every host; this
    // instance's declares what its host did: nothing.
    assert_eq!(
        without.call("roots", json!({}))["text"],
        "no roots capability"
    );
    drop((with, without));
    d.wait_for("instance mine@2");
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn one_host_over_max_instances_is_refused_naming_the_limit() {
    let Two {
        units: _units,
        d,
        runtime,
        a: (mut a, pa),
        b: (mut b, pb),
    } = Two::start("sessions \"per-host\"\nmax-instances 2\n");
    let mut c = Host::start(&runtime, "mine", &[]);
    let refused = c.init();
    let why = refused["raised"].as_str().unwrap_or_default();
    assert!(
        why.contains("server mine") && why.contains("max-instances 2"),
        "{refused}"
    );
    assert_eq!(a.server_pid(), pa);
    assert_eq!(b.server_pid(), pb);
    // A place freed is a place taken.
    a.leave();
    eventually("a's server is gone", BOUND, || !alive(pa));
    c.leave();
    let mut e = Host::start(&runtime, "mine", &[]);
    e.init();
    let pe = e.server_pid();
    assert!(pe != pa && pe != pb);
    drop((b, e));
    assert!(d.stop(Signal::TERM).success());
}

/// `server-filesystem` from `target/npm` (`.ci/run` installs it).
fn filesystem() -> PathBuf {
    let path = root()
        .join("target/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    assert!(
        path.is_file(),
        "{} is missing: .ci/run installs tests/npm into target/npm",
        path.display()
    );
    path
}

#[test]
fn each_host_of_a_per_host_filesystem_server_sees_its_own_roots() {
    python_sdk();
    let server = filesystem();
    let units = tempfile::tempdir().expect("tempdir");
    let (one, two) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    std::fs::write(one.path().join("one.txt"), "one").expect("write");
    std::fs::write(two.path().join("two.txt"), "two").expect("write");
    std::fs::write(
        units.path().join("files.kdl"),
        format!(
            "stdio {{\n    command \"node\" \"{}\"\n}}\nsessions \"per-host\"\nstop-timeout \"1s\"\n",
            server.display()
        ),
    )
    .expect("write unit");
    let three = tempfile::tempdir().expect("tempdir");
    std::fs::write(three.path().join("three.txt"), "three").expect("write");
    let (d, runtime) = daemon(units.path());
    let uri = |p: &Path| format!("file://{}", p.canonicalize().expect("path").display());
    let (u1, u2, u3) = (uri(one.path()), uri(two.path()), uri(three.path()));
    let mut a = Host::start(&runtime, "files", &[&u1]);
    let mut b = Host::start(&runtime, "files", &[&u2]);
    // A host of MCP 2026-07-28 (the SDK's `Client`, as Claude Code
    // speaks): its instance asks it for its roots through the
    // `input_required` answer of its first call (the server is of 2025).
    let mut c = Host::start_in(Some("2026-07-28"), &runtime, "files", &[&u3]);
    a.init();
    b.init();
    assert_eq!(c.init()["protocol"], "2026-07-28");
    // The server asks each host for its roots once it is told they
    // changed; until it has, it may still list none.
    let allowed = |h: &mut Host, want: &Path| {
        let want = want.canonicalize().expect("path").display().to_string();
        let mut answer = Value::Null;
        let allowed = holds_within(BOUND, || {
            answer = h.call("list_allowed_directories", json!({}));
            answer["text"].as_str().unwrap_or_default().contains(&want)
        });
        let what = format!("the server to allow {want}");
        assert!(allowed, "{}; last: {answer}", timed_out(what, BOUND));
        answer["text"].as_str().unwrap_or_default().to_owned()
    };
    let seen_a = allowed(&mut a, one.path());
    let seen_b = allowed(&mut b, two.path());
    let seen_c = allowed(&mut c, three.path());
    let (n1, n2, n3) = (
        one.path().canonicalize().expect("path"),
        two.path().canonicalize().expect("path"),
        three.path().canonicalize().expect("path"),
    );
    let shows = |seen: &str, n: &Path| seen.contains(&n.display().to_string());
    assert!(!shows(&seen_a, &n2) && !shows(&seen_a, &n3), "{seen_a}");
    assert!(!shows(&seen_b, &n1) && !shows(&seen_b, &n3), "{seen_b}");
    assert!(!shows(&seen_c, &n1) && !shows(&seen_c, &n2), "{seen_c}");
    let listed = c.call("list_directory", json!({"path": n3.display().to_string()}));
    assert!(
        listed["text"]
            .as_str()
            .unwrap_or_default()
            .contains("three.txt"),
        "{listed}"
    );
    let listed = a.call("list_directory", json!({"path": n1.display().to_string()}));
    assert!(
        listed["text"]
            .as_str()
            .unwrap_or_default()
            .contains("one.txt"),
        "{listed}"
    );
    let refused = a.call("list_directory", json!({"path": n2.display().to_string()}));
    assert!(
        refused["error"] == true || refused.get("raised").is_some(),
        "a host's instance does not reach another host's roots: {refused}"
    );
    drop((a, b, c));
    assert!(d.stop(Signal::TERM).success());
}

/// One host through `mcpctl bridge NAME`, spoken raw: initialize, one
/// `whoami`, then it leaves (end of input). The server's pid.
fn raw_host(runtime: &Path, name: &str) -> u32 {
    let mut bridge = crate::helper::mcpctl_user_command(runtime, &["bridge", name])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("mcpctl bridge");
    let mut stdin = bridge.stdin.take().expect("stdin");
    let mut lines = BufReader::new(bridge.stdout.take().expect("stdout")).lines();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "loop", "version": "0"}}});
    writeln!(stdin, "{init}").expect("write");
    let answer = lines.next().expect("an answer").expect("a line");
    assert!(answer.contains("\"result\""), "{answer}");
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )
    .expect("write");
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "whoami", "arguments": {}}});
    writeln!(stdin, "{call}").expect("write");
    let answer: Value =
        serde_json::from_str(&lines.next().expect("an answer").expect("a line")).expect("json");
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    let who: Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("{answer}"));
    drop(stdin);
    assert!(bridge.wait().expect("wait").success());
    u32::try_from(who["pid"].as_u64().expect("pid")).expect("pid")
}

/// Open file descriptors of `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/PID/fd")
        .count()
}

/// The instances' cgroups below the unit's `unit` (its own server's,
/// `unit`, aside).
fn instance_cgroups(unit: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(unit)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()) && e.file_name() != "unit")
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_hundred_hosts_come_and_go_and_leave_nothing_behind() {
    let units = tempfile::tempdir().expect("tempdir");
    fixture_unit(units.path(), "mine", "sessions \"per-host\"\n");
    let (mut d, runtime) = daemon(units.path());
    let daemon_pid = d.pid();
    let line = d.wait_for("servers run in cgroups under ");
    let servers = line
        .split("servers run in cgroups under ")
        .nth(1)
        .expect("the servers' cgroup");
    let unit = Path::new(servers.trim()).join("mine");
    for _ in 0..5 {
        raw_host(&runtime, "mine");
    }
    eventually("the warm-up's instances are gone", BOUND, || {
        instance_cgroups(&unit).is_empty()
    });
    let (fds_before, rss_before) = (fds(daemon_pid), crate::helper::rss_kib(daemon_pid));
    let mut pids = Vec::new();
    for _ in 0..100 {
        pids.push(raw_host(&runtime, "mine"));
    }
    let distinct: std::collections::HashSet<_> = pids.iter().collect();
    assert_eq!(distinct.len(), 100, "each host had a server of its own");
    eventually("every instance's cgroup is gone", BOUND, || {
        instance_cgroups(&unit).is_empty()
    });
    eventually("every instance's process is gone", BOUND, || {
        pids.iter().all(|p| !alive(*p))
    });
    d.wait_until("the daemon's fds are back", |_| {
        fds(daemon_pid) <= fds_before
    });
    let rss_after = crate::helper::rss_kib(daemon_pid);
    assert!(
        rss_after <= rss_before + 1024,
        "daemon RSS {rss_before} KiB before, {rss_after} KiB after 100 hosts"
    );
    d.wait_for("instance mine@105");
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn status_dbus_stop_and_restart_name_each_instance() {
    let Two {
        units: _units,
        d,
        runtime,
        a: (mut a, pa),
        b: (mut b, pb),
    } = Two::start("sessions \"per-host\"\n");
    let ctl = |args: &[&str]| crate::helper::mcpctl_user(&runtime, args);

    // Which instance serves which host (they attached at once).
    let out = ctl(&["--json", "status", "mine"]);
    let json: Value = serde_json::from_slice(&out.stdout).expect("json");
    let status = if json.is_array() { &json[0] } else { &json };
    assert_eq!(status["max_instances"], 16, "{status}");
    let instances = status["instances"].as_array().expect("instances").clone();
    assert_eq!(instances.len(), 2, "{status}");
    let n_of = |pid: u32| {
        instances
            .iter()
            .find(|i| i["pid"] == pid)
            .and_then(|i| i["n"].as_u64())
            .unwrap_or_else(|| panic!("no instance with pid {pid}: {status}"))
    };
    let (na, nb) = (n_of(pa), n_of(pb));
    let uid = rustix::process::geteuid().as_raw();

    let out = ctl(&["status", "mine"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("  Instances: 2 of 16\n"), "{text}");
    let line_a = text
        .lines()
        .find(|l| {
            l.trim_start()
                .starts_with(&format!("mine@{na} running, pid {pa}, host pid "))
        })
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line_a.contains(&format!(" uid {uid}, since ")), "{line_a}");
    assert!(line_a.contains("; 1 call"), "{line_a}");
    assert!(
        text.contains(&format!("mine@{nb} running, pid {pb}")),
        "{text}"
    );
    // The unit's calls are its instances'.
    assert!(text.contains("      Calls: 2 (0 failed)\n"), "{text}");

    let socket = runtime.join("mcpd/private");
    let (stop_a, restart_b) = (format!("mine@{na}"), format!("mine@{nb}"));
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            use futures_util::StreamExt;
            let (_conn, server) = crate::helper::private_server(&socket, "mine").await;
            let rows = server.instances().await.expect("Instances");
            assert_eq!(rows.len(), 2, "{rows:?}");
            let row_a = rows.iter().find(|r| u64::from(r.0) == na).expect("a's row");
            assert_eq!((row_a.1.as_str(), row_a.2, row_a.4), ("running", pa, uid));
            let mut changes = server.receive_instances_changed().await;
            // `mcpctl stop mine@N` answers once the instance is gone; its
            // host is detached with an error that says so.
            let out = ctl(&["stop", &stop_a]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!alive(pa));
            within(BOUND, async {
                loop {
                    let change = changes.next().await.expect("a change");
                    if change.get().await.expect("Instances").len() == 1 {
                        break;
                    }
                }
            })
            .await
            .unwrap_or_else(|| panic!("{}", timed_out("PropertiesChanged for Instances", BOUND)));
        });
    let after = a.call("whoami", json!({}));
    assert!(after.get("raised").is_some(), "{after}");
    assert_eq!(b.server_pid(), pb);
    let out = ctl(&["stop", &stop_a]);
    assert_eq!(out.status.code(), Some(4), "no such instance any more");

    let out = ctl(&["restart", &restart_b]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually("b's old server is gone", BOUND, || !alive(pb));
    let again = b.next_server_pid();
    assert_ne!(again, pb, "the instance restarted for its host");
    let out = ctl(&["status", "mine"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("  Instances: 1 of 16\n"), "{text}");
    // A stopped instance's calls still count: a's one, b's two and more.
    let calls: u64 = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("Calls: "))
        .and_then(|c| c.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(calls >= 4, "{text}");
    drop((a, b));
    assert!(d.stop(Signal::TERM).success());
}

/// A host of MCP 2026-07-28 through `mcpctl bridge NAME`, spoken raw: no
/// handshake, a `whoami` whose `_meta` declares `caps`. The server's pid,
/// and the bridge with its input (the host stays attached until they are
/// dropped).
fn modern_host(runtime: &Path, name: &str, caps: Value) -> (u32, (Child, ChildStdin)) {
    let mut bridge = crate::helper::mcpctl_user_command(runtime, &["bridge", name])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("mcpctl bridge");
    let mut stdin = bridge.stdin.take().expect("stdin");
    let mut lines = BufReader::new(bridge.stdout.take().expect("stdout")).lines();
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
    "name": "whoami", "arguments": {},
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "raw-modern", "version": "1"},
    }}});
    writeln!(stdin, "{call}").expect("write");
    let answer: Value =
        serde_json::from_str(&lines.next().expect("an answer").expect("a line")).expect("json");
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    let who: Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("{answer}"));
    let pid = u32::try_from(who["pid"].as_u64().expect("pid")).expect("pid");
    (pid, (bridge, stdin))
}

#[test]
fn hosts_of_mcp_2026_07_28_get_an_instance_each_too() {
    let units = tempfile::tempdir().expect("tempdir");
    fixture_unit(units.path(), "mine", "sessions \"per-host\"\n");
    let (d, runtime) = daemon(units.path());
    let (pa, (mut a, a_in)) = modern_host(&runtime, "mine", json!({}));
    let (pb, (mut b, b_in)) = modern_host(&runtime, "mine", json!({"roots": {}}));
    assert_ne!(pa, pb);
    drop((a_in, b_in));
    let _ = a.kill();
    let _ = b.kill();
    let _ = (a.wait(), b.wait());
    eventually("their servers are gone", BOUND, || !alive(pa) && !alive(pb));
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_reload_switches_sessions_and_moves_the_limit_for_the_next_hosts() {
    python_sdk();
    let units = tempfile::tempdir().expect("tempdir");
    fixture_unit(units.path(), "mine", "");
    let (mut d, runtime) = daemon(units.path());
    d.wait_until("mine running", |d| d.latest_pid("mine").is_some());
    let shared = d.latest_pid("mine").expect("pid");
    let reload = || {
        let out = crate::helper::mcpctl_user(&runtime, &["reload"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    fixture_unit(
        units.path(),
        "mine",
        "sessions \"per-host\"\nmax-instances 1\n",
    );
    let diff = reload();
    assert!(diff.contains("mine") && diff.contains("changed"), "{diff}");
    // The shared server is gone; the unit now gives each host its own.
    eventually("the shared server is gone", BOUND, || !alive(shared));
    let mut a = Host::start(&runtime, "mine", &[]);
    a.init();
    let pa = a.server_pid();
    assert_ne!(pa, shared);
    assert!(cgroup_of(pa).parent().is_some_and(|p| p.ends_with("mine")));
    let mut b = Host::start(&runtime, "mine", &[]);
    let refused = b.init();
    assert!(
        refused["raised"]
            .as_str()
            .unwrap_or_default()
            .contains("max-instances 1"),
        "{refused}"
    );

    // A new limit applies in place, to the hosts that come next.
    fixture_unit(
        units.path(),
        "mine",
        "sessions \"per-host\"\nmax-instances 2\n",
    );
    reload();
    assert_eq!(a.server_pid(), pa, "a running instance is left alone");
    let mut c = Host::start(&runtime, "mine", &[]);
    c.init();
    let pc = c.server_pid();
    assert!(pc != pa && pc != shared);
    drop((a, b, c));
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn limits_hold_per_instance_or_its_host_is_told_why_not() {
    python_sdk();
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("capped.kdl"),
        "stdio { command \"mcp-fixture\"; }\nsessions \"per-host\"\nlimits { nofile 64; }\n",
    )
    .expect("write");
    std::fs::write(
        units.path().join("bounded.kdl"),
        "stdio { command \"mcp-fixture\"; }\nsessions \"per-host\"\nlimits { memory-max \"256M\"; }\nreconnect { enabled #false; }\n",
    )
    .expect("write");
    let (d, runtime) = daemon(units.path());
    let mut a = Host::start(&runtime, "capped", &[]);
    a.init();
    let pid = a.server_pid();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    assert_eq!(
        nofile.split_whitespace().collect::<Vec<_>>(),
        ["Max", "open", "files", "64", "64", "files"],
        "{nofile}"
    );
    // memory-max needs the memory controller: enforced on the instance's
    // own cgroup where it is delegated, else the instance's start fails
    // and its host is told why (never unlimited).
    let servers = cgroup_of(pid)
        .parent()
        .and_then(Path::parent)
        .expect("servers")
        .to_owned();
    let controllers =
        std::fs::read_to_string(servers.join("cgroup.controllers")).unwrap_or_default();
    let mut b = Host::start(&runtime, "bounded", &[]);
    let init = b.init();
    if controllers.split_whitespace().any(|c| c == "memory") {
        assert_eq!(init["name"], "mcp-fixture", "{init}");
        let pb = b.server_pid();
        let max = std::fs::read_to_string(cgroup_of(pb).join("memory.max")).expect("memory.max");
        assert_eq!(max.trim(), (256u64 << 20).to_string());
        assert!(
            cgroup_of(pb)
                .parent()
                .is_some_and(|p| p.ends_with("bounded"))
        );
    } else {
        let why = init["raised"].as_str().unwrap_or_default();
        assert!(
            why.contains("server bounded@")
                && why.contains("`limits.memory-max` needs the cgroup memory controller"),
            "{init}"
        );
    }
    drop((a, b));
    assert!(d.stop(Signal::TERM).success());
    // Nothing of either unit's cgroups is left, the failed start's
    // included.
    assert!(
        !servers.join("bounded").exists() && !servers.join("capped").exists(),
        "{}",
        servers.display()
    );
}

#[test]
fn dbus_calls_get_an_instance_per_caller_uid_never_a_hosts() {
    python_sdk();
    let units = tempfile::tempdir().expect("tempdir");
    fixture_unit(
        units.path(),
        "mine",
        "sessions \"per-host\"\nidle-stop \"1s\"\n",
    );
    let (d, runtime) = daemon(units.path());
    let mut a = Host::start(&runtime, "mine", &[]);
    a.init();
    let pa = a.server_pid();
    let call = || {
        let out = crate::helper::mcpctl_user(&runtime, &["call", "mine", "whoami", "{}"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let who: Value = serde_json::from_slice(&out.stdout).expect("json");
        u32::try_from(who["pid"].as_u64().expect("pid")).expect("pid")
    };
    let first = call();
    assert_ne!(
        first, pa,
        "an operator's call never lands in a host's instance"
    );
    let uid = rustix::process::geteuid().as_raw();
    assert!(
        cgroup_of(first).ends_with(format!("mine/uid-{uid}")),
        "{:?}",
        cgroup_of(first)
    );
    assert_eq!(call(), first, "the same uid, the same instance");
    // Stopped after idle-stop; the next call starts it again.
    eventually("the caller's instance idles", BOUND, || !alive(first));
    let again = call();
    assert!(again != first && again != pa);
    assert_eq!(a.server_pid(), pa);
    drop(a);
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn an_aggregate_gives_each_host_its_own_instance_of_a_per_host_member() {
    python_sdk();
    let units = tempfile::tempdir().expect("tempdir");
    fixture_unit(units.path(), "mine", "sessions \"per-host\"\n");
    fixture_unit(units.path(), "ours", "");
    let (mut d, runtime) = daemon(units.path());
    d.wait_until("ours running", |d| d.latest_pid("ours").is_some());
    let (mut a, mut b) = (
        Host::start(&runtime, "mine+ours", &[]),
        Host::start(&runtime, "mine+ours", &[]),
    );
    a.init();
    b.init();
    let pid = |h: &mut Host, tool: &str| {
        let answer = h.call(tool, json!({}));
        let who: Value = serde_json::from_str(answer["text"].as_str().unwrap_or_default())
            .unwrap_or_else(|_| panic!("{tool}: {answer}"));
        who["pid"]
            .as_u64()
            .unwrap_or_else(|| panic!("{tool}: {answer}"))
    };
    assert_ne!(pid(&mut a, "mine__whoami"), pid(&mut b, "mine__whoami"));
    assert_eq!(pid(&mut a, "ours__whoami"), pid(&mut b, "ours__whoami"));
    drop((a, b));
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_host_back_from_a_daemon_restart_gets_a_fresh_instance() {
    python_sdk();
    let units = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    fixture_unit(units.path(), "mine", "sessions \"per-host\"\n");
    let start = || {
        Daemon::user_no_bus(
            units.path(),
            &[("XDG_RUNTIME_DIR", runtime.path().as_os_str())],
        )
    };
    let d = start();
    let mut a = Host::start(runtime.path(), "mine", &[]);
    a.init();
    let before = a.server_pid();
    assert!(d.stop(Signal::TERM).success());
    assert!(!alive(before), "no server outlives its daemon");
    let mut d = start();
    // The bridge attaches again and replays the host's initialize: a new
    // instance for it.
    let after = a.next_server_pid();
    assert_ne!(after, before);
    assert!(
        cgroup_of(after)
            .parent()
            .is_some_and(|p| p.ends_with("mine"))
    );
    d.wait_for("instance mine@1");
    drop(a);
    assert!(d.stop(Signal::TERM).success());
}

/// The names `mcpctl tools NAME` lists.
fn published(runtime: &Path, name: &str) -> Vec<String> {
    let out = crate::helper::mcpctl_user(runtime, &["--json", "tools", name]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tools: Value = serde_json::from_slice(&out.stdout).expect("json");
    tools
        .as_array()
        .expect("an array")
        .iter()
        .map(|t| t["name"].as_str().expect("a name").to_owned())
        .collect()
}

type InstanceRow = (u32, String, u32, u32, u32);

/// What `read` makes of the next signal on `changes` that `done`
/// accepts (bounded; `what` names the signal).
async fn signalled<S, T, F, Fut>(
    changes: &mut S,
    read: F,
    done: impl Fn(&T) -> bool,
    what: &str,
) -> T
where
    S: futures_util::Stream + Unpin,
    F: Fn(S::Item) -> Fut,
    Fut: Future<Output = T>,
{
    use futures_util::StreamExt;
    within(BOUND, async {
        loop {
            let now = read(changes.next().await.expect(what)).await;
            if done(&now) {
                return now;
            }
        }
    })
    .await
    .unwrap_or_else(|| panic!("{}", timed_out(what, BOUND)))
}

#[test]
fn published_lists_are_the_newest_instances_then_the_cache() {
    python_sdk();
    let units = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    fixture_unit(units.path(), "mine", "sessions \"per-host\"\n");
    let env = [
        ("MCPD_STATE_DIR", state.path().as_os_str()),
        ("XDG_RUNTIME_DIR", runtime.path().as_os_str()),
    ];
    let runtime = runtime.path();
    let mut d = Daemon::user_no_bus(units.path(), &env);
    // With no cache, the unit starts once to learn its lists.
    d.wait_until("mine learnt its lists", |d| d.starts("mine") == 1);
    let has = |name: &str| published(runtime, "mine").iter().any(|n| n == name);
    assert!(has("set_tools") && !has("alpha"));
    let mut a = Host::start(runtime, "mine", &[]);
    a.init();
    let set = a.call("set_tools", json!({"tools": ["alpha"]}));
    assert_eq!(set["error"], false, "{set}");
    eventually("a's list is the unit's", BOUND, || has("alpha"));

    let socket = runtime.join("mcpd/private");
    let has_name = |names: &[String], name: &str| names.iter().any(|n| n == name);
    let b = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let (_conn, server) = crate::helper::private_server(&socket, "mine").await;
            let names = |rows: Vec<mcpd::dbus::ToolRow>| -> Vec<String> {
                rows.into_iter().map(|r| r.name).collect()
            };
            let rows = names(server.tools().await.expect("Tools"));
            assert!(has_name(&rows, "alpha"), "{rows:?}");
            let mut changes = server.receive_tool_list_changed().await.expect("subscribe");
            // A newer host: its instance's list (the fixture's own, no
            // extra tools) is the unit's, with ToolsChanged.
            let mut b = Host::start(runtime, "mine", &[]);
            b.init();
            let now = signalled(
                &mut changes,
                |signal| async move {
                    let args = signal.args().expect("args");
                    args.tools()
                        .iter()
                        .map(|t| t.name.clone())
                        .collect::<Vec<_>>()
                },
                |n| !has_name(n.as_slice(), "alpha"),
                "ToolsChanged",
            )
            .await;
            assert!(has_name(&now, "set_tools"), "{now:?}");
            let set = b.call("set_tools", json!({"tools": ["beta"]}));
            assert_eq!(set["error"], false, "{set}");
            let now = signalled(
                &mut changes,
                |signal| async move {
                    let args = signal.args().expect("args");
                    args.tools()
                        .iter()
                        .map(|t| t.name.clone())
                        .collect::<Vec<_>>()
                },
                |n| has_name(n.as_slice(), "beta"),
                "ToolsChanged",
            )
            .await;
            assert_eq!(names(server.tools().await.expect("Tools")), now);
            b
        });
    assert!(has("beta") && !has("alpha"));
    // The newest instance leaves: the newest left is a's.
    b.leave();
    eventually("a's list is back", BOUND, || has("alpha") && !has("beta"));
    // None runs: the cache's, which is a's.
    let pa = a.server_pid();
    a.leave();
    eventually("a's server is gone", BOUND, || !alive(pa));
    assert!(has("alpha"));
    let cache: Value = serde_json::from_slice(
        &std::fs::read(state.path().join("cache/mine.json")).expect("the cache"),
    )
    .expect("json");
    let cached: Vec<&str> = cache["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(cached.contains(&"alpha"), "{cache}");
    assert!(d.stop(Signal::TERM).success());
    // The next daemon publishes the cached list and starts nothing.
    let mut d = Daemon::user_no_bus(units.path(), &env);
    d.wait_for("started 1 unit");
    assert!(has("alpha"), "the cached list");
    d.read_for(Duration::from_millis(200));
    assert_eq!(d.starts("mine"), 0, "{:?}", d.seen);
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn the_instance_of_a_uids_dbus_calls_is_shown_beside_the_hosts() {
    python_sdk();
    let units = tempfile::tempdir().expect("tempdir");
    fixture_unit(
        units.path(),
        "mine",
        "sessions \"per-host\"\nidle-stop \"1s\"\n",
    );
    let (d, runtime) = daemon(units.path());
    let ctl = |args: &[&str]| crate::helper::mcpctl_user(&runtime, args);
    let mut a = Host::start(&runtime, "mine", &[]);
    a.init();
    let pa = a.server_pid();
    let uid = rustix::process::geteuid().as_raw();
    let socket = runtime.join("mcpd/private");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let (_conn, server) = crate::helper::private_server(&socket, "mine").await;
            let mut changes = server.receive_instances_changed().await;
            let out = ctl(&["call", "mine", "whoami", "{}"]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let who: Value = serde_json::from_slice(&out.stdout).expect("json");
            let pid = u32::try_from(who["pid"].as_u64().expect("pid")).expect("pid");
            // Signalled, numbered 0, host pid 0 and the caller's uid.
            let row = |rows: &[(u32, String, u32, u32, u32)], state: &str, pid: u32| {
                rows.iter()
                    .any(|r| *r == (0, state.to_owned(), pid, 0, uid))
            };
            let get = |c: zbus::proxy::PropertyChanged<'static, Vec<InstanceRow>>| async move {
                c.get().await.expect("Instances")
            };
            let rows = signalled(
                &mut changes,
                get,
                |r: &Vec<InstanceRow>| row(r, "running", pid),
                "PropertiesChanged of Instances",
            )
            .await;
            assert!(rows.iter().any(|r| r.0 != 0 && r.2 == pa), "{rows:?}");

            let out = ctl(&["--json", "status", "mine"]);
            let json: Value = serde_json::from_slice(&out.stdout).expect("json");
            let status = if json.is_array() { &json[0] } else { &json };
            let mine = status["instances"]
                .as_array()
                .expect("instances")
                .iter()
                .find(|i| i["n"] == 0)
                .unwrap_or_else(|| panic!("{status}"))
                .clone();
            assert_eq!(mine["name"], format!("mine@uid-{uid}"), "{mine}");
            assert_eq!(
                (&mine["pid"], &mine["host_uid"]),
                (&json!(pid), &json!(uid))
            );
            assert!(mine["host_pid"].is_null(), "{mine}");
            assert_eq!(mine["calls"], 1, "{mine}");
            let out = ctl(&["status", "mine"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            // The limit counts hosts' instances alone.
            assert!(text.contains("  Instances: 1 of 16\n"), "{text}");
            let line = format!("mine@uid-{uid} running, pid {pid}, caller uid {uid}, since ");
            let line = text
                .lines()
                .find(|l| l.trim_start().starts_with(&line))
                .unwrap_or_else(|| panic!("{text}"));
            assert!(
                line.ends_with("; 1 call") || line.contains("; 1 call,"),
                "{line}"
            );
            // Stopped after idle-stop: shown idle, with no pid.
            signalled(
                &mut changes,
                get,
                |r: &Vec<InstanceRow>| row(r, "idle", 0),
                "PropertiesChanged of Instances",
            )
            .await;
            assert!(!alive(pid));

            // Addressed by its name as a host's is.
            let mine = format!("mine@uid-{uid}");
            let out = ctl(&["restart", &mine]);
            assert!(out.status.success(), "{out:?}");
            let rows = signalled(
                &mut changes,
                get,
                |r: &Vec<InstanceRow>| r.iter().any(|r| r.0 == 0 && r.1 == "running"),
                "PropertiesChanged of Instances",
            )
            .await;
            let restarted = rows.iter().find(|r| r.0 == 0).expect("its row").2;
            assert!(restarted != pid && alive(restarted), "{rows:?}");
            let out = ctl(&["stop", &mine]);
            assert!(out.status.success(), "{out:?}");
            assert!(!alive(restarted), "stop answers once it has stopped");
            signalled(
                &mut changes,
                get,
                |r: &Vec<InstanceRow>| row(r, "stopped", 0),
                "PropertiesChanged of Instances",
            )
            .await;
            // Its next use starts it again; a request that checks the state
            // first does not find it stopped.
            let read = server.read_resource("fixture://a").await;
            // The fixture reads no resources: what answers is the server
            // (method not found), not NotRunning.
            assert!(
                matches!(read, Err(mcpd::dbus::Error::InvalidArguments(_))),
                "{read:?}"
            );
            signalled(
                &mut changes,
                get,
                |r: &Vec<InstanceRow>| r.iter().any(|r| r.0 == 0 && r.1 == "running"),
                "PropertiesChanged of Instances",
            )
            .await;
            let out = ctl(&["stop", &format!("mine@uid-{}", uid + 1)]);
            assert_eq!(out.status.code(), Some(4), "no such instance");
        });
    assert_eq!(a.server_pid(), pa);
    drop(a);
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_reload_reaches_running_instances_at_the_units_restart() {
    let Two {
        units,
        d,
        runtime,
        a: (mut a, pa),
        b: (mut b, pb),
    } = Two::start("sessions \"per-host\"\n");
    let ctl = |args: &[&str]| {
        let out = crate::helper::mcpctl_user(&runtime, args);
        assert!(
            out.status.success(),
            "{args:?}: {:?} {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let cwd = elsewhere.path().to_str().expect("utf-8").to_owned();
    std::fs::write(
        units.path().join("mine.kdl"),
        format!(
            "stdio {{\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n    working-directory \"{cwd}\"\n}}\nstop-timeout \"1s\"\nsessions \"per-host\"\n"
        ),
    )
    .expect("write unit");
    ctl(&["reload"]);
    // Running instances keep their spec; the next host gets the new one.
    let mut c = Host::start(&runtime, "mine", &[]);
    c.init();
    assert_eq!(c.next_whoami()["cwd"], cwd);
    assert_eq!(a.server_pid(), pa);
    assert_ne!(a.next_whoami()["cwd"], cwd);
    // `mcpctl restart NAME` restarts every instance, under the new spec.
    ctl(&["restart", "mine"]);
    eventually("the old servers are gone", BOUND, || {
        !alive(pa) && !alive(pb)
    });
    for (h, old) in [(&mut a, pa), (&mut b, pb)] {
        let who = h.next_whoami();
        assert_ne!(who["pid"], old, "{who}");
        assert_eq!(who["cwd"], cwd, "{who}");
    }
    drop((a, b, c));
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn an_instance_that_fails_for_good_fails_its_host_alone_with_the_reason() {
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("mine.kdl"),
        "stdio { command \"mcp-fixture\" \"--chatter\" \"0\"; }\nsessions \"per-host\"\nstop-timeout \"1s\"\nreconnect {\n    initial-delay \"200ms\"\n    max-attempts 1\n}\n",
    )
    .expect("write unit");
    let Two {
        units: _units,
        d,
        runtime,
        a: (mut a, pa),
        b: (mut b, pb),
    } = Two::on(units);
    // The retry's server crashes too: the budget is spent.
    a.call("crash", json!({"code": 3}));
    eventually("a's server is gone", BOUND, || !alive(pa));
    let again = a.next_server_pid();
    a.call("crash", json!({"code": 3}));
    eventually("a's second server is gone", BOUND, || !alive(again));
    let failed = || {
        let out = crate::helper::mcpctl_user(&runtime, &["--json", "status", "mine"]);
        let json: Value = serde_json::from_slice(&out.stdout).expect("json");
        if json.is_array() {
            json[0].clone()
        } else {
            json
        }
    };
    eventually("a's instance failed", BOUND, || {
        failed()["instances"]
            .as_array()
            .is_some_and(|i| i.iter().any(|i| i["state"] == "failed"))
    });
    // Its host is told why; the unit and the other host are not touched.
    let status = failed();
    let name = status["instances"]
        .as_array()
        .and_then(|i| i.iter().find(|i| i["state"] == "failed"))
        .and_then(|i| i["name"].as_str())
        .expect("the failed instance's name")
        .to_owned();
    let answer = a.call("whoami", json!({}));
    let text = answer.to_string();
    assert!(
        text.contains(&format!("server {name} is failed")) && text.contains("status 3"),
        "{answer}"
    );
    assert_ne!(status["state"], "failed", "{status}");
    assert_eq!(b.server_pid(), pb);
    drop((a, b));
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_call_in_flight_when_its_instance_crashes_is_answered_with_the_error_at_once() {
    let Two {
        units: _units,
        d,
        runtime: _,
        a: (mut a, pa),
        b: (mut b, pb),
    } = Two::start("sessions \"per-host\"\n");
    let stdin = a.stdin.as_mut().expect("attached");
    writeln!(
        stdin,
        "{}",
        json!({"op": "call", "name": "hang", "args": {}})
    )
    .expect("write");
    // In flight (or, if the kill wins the race, sent during the outage):
    // either way an error naming the instance, at once.
    kill(pa);
    let line = a
        .answers
        .recv_timeout(Duration::from_secs(5))
        .expect("the call in flight is answered, not left hanging");
    assert!(
        line.contains("server mine@")
            && (line.contains("connection lost") || line.contains("retry 1/")),
        "{line}"
    );
    assert_ne!(a.next_server_pid(), pa);
    assert_eq!(b.server_pid(), pb);
    drop((a, b));
    assert!(d.stop(Signal::TERM).success());
}
