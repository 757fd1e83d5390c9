//! The supervisor with real processes: the fixture server, real signals,
//! real process groups, real files.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mcpd::supervisor::process::Host;
use mcpd::supervisor::{
    CallError, ExitStatus, ListKind, LogRing, State, Status, Supervisor, SystemLauncher,
};
use mcpd::unit::spec::{ReconnectDraft, StdioDraft};
use mcpd::unit::{Instance, UnitDraft, UnitSpec};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::helper::fixture_path;
use crate::helper::{alive, eventually_async, ms, timed_out, within};

/// Bound for every wait: generous, so a loaded CI machine does not flake.
const BOUND: Duration = Duration::from_secs(30);

fn reconnect(initial: u64, max: u64, attempts: i128) -> ReconnectDraft {
    crate::helper::policy(initial, max, attempts, true)
}

/// A unit running the fixture with `args`.
fn fixture_unit(
    args: &[&str],
    reconnect: ReconnectDraft,
    tweak: impl FnOnce(&mut UnitDraft),
) -> UnitSpec {
    let mut command = vec![fixture_path().display().to_string()];
    command.extend(args.iter().map(|a| a.to_string()));
    let mut draft = UnitDraft {
        stdio: Some(StdioDraft {
            command,
            ..StdioDraft::default()
        }),
        reconnect,
        startup_timeout: Some(Duration::from_secs(20)),
        stop_timeout: Some(Duration::from_secs(5)),
        ..UnitDraft::default()
    };
    tweak(&mut draft);
    UnitSpec::new(draft).expect("valid spec")
}

struct Running {
    sup: Supervisor,
    task: JoinHandle<()>,
    rx: watch::Receiver<Status>,
}

fn spawn(name: &str, spec: UnitSpec) -> Running {
    spawn_in(Instance::User, name, spec)
}

fn spawn_in(instance: Instance, name: &str, spec: UnitSpec) -> Running {
    spawn_on(Host::current(instance, None), name, spec)
}

/// [`spawn`] by a daemon that sees `host`.
fn spawn_on(host: Host, name: &str, spec: UnitSpec) -> Running {
    let logs = LogRing::default();
    let launcher = Arc::new(SystemLauncher::new(name, host, logs.clone()));
    let (sup, task) = Supervisor::spawn(name, spec, launcher, logs, None);
    let rx = sup.subscribe();
    sup.start();
    Running { sup, task, rx }
}

impl Running {
    /// Waits until the status satisfies `pred`, failing with the last status.
    async fn until(&mut self, what: &str, pred: impl Fn(&Status) -> bool) -> Status {
        // woken by each change of the status, not polled
        let rx = &mut self.rx;
        let waited = within(BOUND, async {
            loop {
                {
                    let status = rx.borrow_and_update();
                    if pred(&status) {
                        return status.clone();
                    }
                }
                if rx.changed().await.is_err() {
                    return rx.borrow().clone();
                }
            }
        })
        .await;
        match waited {
            Some(status) if pred(&status) => status,
            _ => panic!(
                "{}; last status: {:#?}",
                timed_out(what, BOUND),
                self.sup.status()
            ),
        }
    }

    async fn running(&mut self, generation: u64) -> Status {
        self.until(&format!("running generation {generation}"), |s| {
            s.state == State::Running && s.generation == generation
        })
        .await
    }

    async fn call(
        &self,
        tool: &str,
        args: serde_json::Value,
    ) -> Result<rmcp::model::CallToolResult, CallError> {
        self.sup
            .call_tool(
                tool,
                args.as_object().cloned(),
                BOUND,
                std::future::ready(Default::default()),
            )
            .await
    }

    async fn text(&self, tool: &str, args: serde_json::Value) -> String {
        let result = self
            .call(tool, args)
            .await
            .unwrap_or_else(|e| panic!("{tool}: {e}"));
        serde_json::to_value(&result.content).expect("json")[0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    async fn shutdown(self) {
        within(BOUND, self.sup.shutdown(self.task))
            .await
            .unwrap_or_else(|| panic!("{}", timed_out("shutdown", BOUND)));
    }
}

/// Waits (bounded) until `pid` is gone.
async fn gone(pid: u32) {
    eventually_async(format_args!("process {pid} to go"), BOUND, async || {
        !alive(pid)
    })
    .await;
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_recovers_with_a_new_pid_and_the_same_tools_unannounced() {
    let mut r = spawn("crashy", fixture_unit(&[], reconnect(50, 2000, 3), |_| {}));
    let first = r.running(1).await;
    let pid1 = first.main_pid.expect("pid");
    assert_eq!(first.tools_serial, 1);
    assert!(first.tools.contains("echo"));
    assert_eq!(
        r.text("echo", serde_json::json!({"text": "hello"})).await,
        "hello"
    );

    r.text("crash", serde_json::json!({"code": 7})).await;
    let lost = r
        .until("reconnecting", |s| {
            s.state == State::Reconnecting && s.last_exit.is_some()
        })
        .await;
    assert_eq!(lost.reason, "connection lost: process exited with status 7");
    assert_eq!(lost.last_exit, Some(ExitStatus::Code(7)));
    assert_eq!(
        lost.tools.len(),
        first.tools.len(),
        "tools stay published during the outage"
    );

    let second = r.running(2).await;
    let pid2 = second.main_pid.expect("pid");
    assert_ne!(pid1, pid2);
    assert!(!alive(pid1));
    assert_eq!(
        second.tools_serial, 1,
        "an unchanged list is not announced again"
    );
    assert_eq!(second.tools_generation, 2);
    assert_eq!(
        second.attempt, 1,
        "inside the stability window the outage goes on"
    );
    assert_eq!(
        r.text("echo", serde_json::json!({"text": "again"})).await,
        "again"
    );
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn die_on_start_fails_after_exactly_one_plus_max_attempts_spawns() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let count = tmp.path().join("spawns");
    let count_arg = count.display().to_string();
    let mut r = spawn(
        "doomed",
        fixture_unit(
            &["--die-on-start", "3", "--count-file", &count_arg],
            reconnect(5, 20, 4),
            |_| {},
        ),
    );
    let failed = r
        .until("failed with the exit status", |s| {
            s.state == State::Failed
                && s.last_error.as_deref() == Some("process exited with status 3")
        })
        .await;
    assert_eq!(lines(&count).len(), 5, "1 start + 4 retries");
    assert_eq!(
        failed.reason,
        "connection failed: process exited with status 3; gave up after 4 retries, run `mcpctl restart doomed` to try again"
    );
    assert_eq!(failed.generation, 5);
    assert!(failed.tools.is_empty());
    // call fails at once, naming the state
    let err = r
        .call("echo", serde_json::json!({"text": "x"}))
        .await
        .expect_err("not running");
    assert!(
        matches!(
            err,
            CallError::NotRunning {
                state: State::Failed,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().starts_with("server doomed is failed"),
        "{err}"
    );
    // restart: a fresh budget, 5 more spawns
    r.sup.restart();
    r.until("failed again", |s| {
        s.state == State::Failed && s.generation == 10
    })
    .await;
    assert_eq!(lines(&count).len(), 10);
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovers_after_failing_first_spawns_and_reports_retrying_meanwhile() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let count = tmp.path().join("spawns");
    let count_arg = count.display().to_string();
    let mut r = spawn(
        "flaky",
        fixture_unit(
            &["--fail-first", "2", "--count-file", &count_arg],
            reconnect(20, 1000, 5),
            |_| {},
        ),
    );
    // (the hang-up is reported first, the exit status as soon as it is reaped)
    let retrying = r
        .until("retrying with the exit status", |s| {
            s.state == State::Retrying
                && s.reason == "connection failed: process exited with status 3"
        })
        .await;
    assert_eq!(retrying.last_exit, Some(ExitStatus::Code(3)));
    let running = r.running(3).await;
    assert_eq!(running.attempt, 2);
    assert_eq!(lines(&count).len(), 3);
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_server_fails_its_startup_timeout_and_is_killed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let count = tmp.path().join("spawns");
    let count_arg = count.display().to_string();
    let spec = fixture_unit(
        &["--hang", "--count-file", &count_arg],
        reconnect(5000, 10_000, 2),
        |d| {
            d.startup_timeout = Some(ms(300));
        },
    );
    let mut r = spawn("hung", spec);
    let retrying = r
        .until("startup timeout", |s| {
            s.state == State::Retrying && s.last_exit.is_some()
        })
        .await;
    assert_eq!(
        retrying.reason,
        "connection failed: startup-timeout (300ms) expired before initialize and tools/list completed"
    );
    assert_eq!(
        retrying.last_exit,
        Some(ExitStatus::Signal(15)),
        "SIGTERMed"
    );
    let pid: u32 = lines(&count)[0].parse().expect("pid");
    assert!(!alive(pid));
    assert!(retrying.next_retry.is_some());
    // while in backoff, calls fail at once with the retry schedule
    let err = r
        .call("echo", serde_json::json!({"text": "x"}))
        .await
        .expect_err("not running");
    let shown = err.to_string();
    assert!(
        shown.starts_with("server hung is retrying (retry 1/2, next in "),
        "{shown}"
    );
    assert!(shown.ends_with("): connection failed: startup-timeout (300ms) expired before initialize and tools/list completed"), "{shown}");
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_ignoring_server_is_killed_and_never_overlaps_its_successor() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let lock = tmp.path().join("lock");
    let count = tmp.path().join("spawns");
    let (lock_arg, count_arg) = (lock.display().to_string(), count.display().to_string());
    let spec = fixture_unit(
        &[
            "--ignore-sigterm",
            "--linger",
            "--lock",
            &lock_arg,
            "--count-file",
            &count_arg,
        ],
        reconnect(10, 1000, 3),
        |d| d.stop_timeout = Some(ms(500)),
    );
    let mut r = spawn("stubborn", spec);
    let first = r.running(1).await;
    let pid1 = first.main_pid.expect("pid");
    r.sup.restart();
    let stopping = r.until("stopping", |s| s.state == State::Stopping).await;
    assert_eq!(
        stopping.main_pid,
        Some(pid1),
        "still alive: it ignores SIGTERM"
    );
    let second = r.running(2).await;
    assert!(!alive(pid1));
    assert_eq!(
        second.last_exit,
        Some(ExitStatus::Signal(9)),
        "SIGKILLed after stop-timeout"
    );
    // the successor got the lock: the two never ran at the same time
    let overlap = tmp.path().join("lock.overlap");
    assert!(
        !overlap.exists(),
        "a second process started while the first lived"
    );
    assert_eq!(lines(&count).len(), 2);
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grandchildren_die_with_their_server() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let grandchild = tmp.path().join("grandchild");
    let arg = grandchild.display().to_string();
    let mut r = spawn(
        "family",
        fixture_unit(&["--grandchild", &arg], reconnect(10, 1000, 3), |_| {}),
    );
    r.running(1).await;
    let first: u32 = lines(&grandchild)[0].parse().expect("pid");
    assert!(alive(first));
    // a crash leaves the grandchild behind: it is killed with the group
    r.text("crash", serde_json::json!({"code": 1})).await;
    r.running(2).await;
    gone(first).await;
    // and so is the next one on stop
    let second: u32 = lines(&grandchild)[0].parse().expect("pid");
    assert_ne!(first, second);
    r.sup.stop();
    r.until("stopped", |s| s.state == State::Stopped).await;
    gone(second).await;
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_tools_publishes_each_new_list_once() {
    let mut r = spawn(
        "dynamic",
        fixture_unit(&["--page-size", "2"], reconnect(10, 1000, 3), |_| {}),
    );
    let first = r.running(1).await;
    assert_eq!(first.tools.len(), 9, "every page was read");
    r.text("set_tools", serde_json::json!({"tools": ["x", "y"]}))
        .await;
    let changed = r.until("new tools", |s| s.tools_serial == 2).await;
    let names: Vec<&str> = changed.tools.names().skip(9).collect();
    assert_eq!(names, ["x", "y"]);
    // the same list again changes nothing; a different one is the next serial
    r.text("set_tools", serde_json::json!({"tools": ["x", "y"]}))
        .await;
    r.text("set_tools", serde_json::json!({"tools": ["z"]}))
        .await;
    let last = r.until("z", |s| s.tools.contains("z")).await;
    assert_eq!(last.tools_serial, 3);
    assert_eq!(
        r.text("z", serde_json::json!({"text": "dynamic"})).await,
        "dynamic"
    );
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_child_gets_a_clean_layered_environment() {
    assert!(
        std::env::var_os("CARGO_MANIFEST_DIR").is_some(),
        "cargo sets this for tests"
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let env_file = tmp.path().join("unit.env");
    std::fs::write(&env_file, "# secrets\nFROM_FILE=file\nBOTH=file\n").expect("write");
    let spec = fixture_unit(&[], reconnect(10, 1000, 3), |d| {
        let stdio = d.stdio.as_mut().expect("stdio");
        stdio.env = [("BOTH".to_string(), "unit".to_string())].into();
        stdio.env_files = vec![env_file.clone()];
        stdio.pass_env = vec!["CARGO_PKG_NAME".into()];
        stdio.working_directory = Some(tmp.path().to_owned());
    });
    let mut r = spawn("envy", spec);
    r.running(1).await;
    let env: serde_json::Value =
        serde_json::from_str(&r.text("env", serde_json::json!({})).await).expect("json");
    assert_eq!(env["FROM_FILE"], "file");
    assert_eq!(env["BOTH"], "unit", "env overrides env-file");
    assert_eq!(
        env["CARGO_PKG_NAME"], "mcpd",
        "pass-env copies from the daemon"
    );
    assert!(
        env.get("CARGO_MANIFEST_DIR").is_none(),
        "the daemon's environment does not leak"
    );
    assert!(env.get("PATH").is_some() && env.get("HOME").is_some());
    let who: serde_json::Value =
        serde_json::from_str(&r.text("whoami", serde_json::json!({})).await).expect("json");
    assert_eq!(who["cwd"], tmp.path().display().to_string());
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_env_file_and_working_directory_fail_the_attempt_by_name() {
    let mut r = spawn(
        "noenv",
        fixture_unit(&[], reconnect(10_000, 20_000, 3), |d| {
            d.stdio.as_mut().expect("stdio").env_files = vec!["/nonexistent/mcpd-test.env".into()];
        }),
    );
    let s = r.until("retrying", |s| s.state == State::Retrying).await;
    assert!(
        s.reason
            .starts_with("connection failed: env-file /nonexistent/mcpd-test.env: "),
        "{}",
        s.reason
    );
    r.shutdown().await;

    let mut r = spawn(
        "nodir",
        fixture_unit(&[], reconnect(10_000, 20_000, 3), |d| {
            d.stdio.as_mut().expect("stdio").working_directory =
                Some("/nonexistent/mcpd-dir".into());
        }),
    );
    let s = r.until("retrying", |s| s.state == State::Retrying).await;
    assert!(
        s.reason
            .starts_with("connection failed: working directory /nonexistent/mcpd-dir: "),
        "{}",
        s.reason
    );
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_switches_identity_with_groups_when_root() {
    let spec = fixture_unit(&[], reconnect(10_000, 20_000, 3), |d| {
        d.stdio.as_mut().expect("stdio").user = Some("nobody".into());
    });
    let mut r = spawn_in(Instance::System, "lowly", spec);
    if rustix::process::geteuid().is_root() {
        r.running(1).await;
        let who: serde_json::Value =
            serde_json::from_str(&r.text("whoami", serde_json::json!({})).await).expect("json");
        let nobody = nix::unistd::User::from_name("nobody")
            .expect("lookup")
            .expect("nobody exists");
        let (uid, gid) = (nobody.uid.to_string(), nobody.gid.to_string());
        assert_eq!(who["uid"], serde_json::json!([uid, uid, uid, uid]));
        assert_eq!(who["gid"], serde_json::json!([gid, gid, gid, gid]));
        assert_eq!(
            who["groups"],
            serde_json::json!([gid]),
            "the user's own groups, not root's"
        );
    } else {
        let s = r.until("retrying", |s| s.state == State::Retrying).await;
        assert!(
            s.reason
                .contains("only root can run a server as another user"),
            "{}",
            s.reason
        );
    }
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_the_kernel_cannot_give_fails_the_start_and_never_runs_unconfined() {
    use mcpd::supervisor::sandbox::Offer;
    let scratch = tempfile::tempdir().expect("scratch");
    let count = scratch.path().join("spawns");
    let gone = tempfile::tempdir().expect("rw");
    let sandboxed = |network: &str, rw: Option<&Path>| {
        let count = count.display().to_string();
        let network = network.to_owned();
        let rw = rw.map(|p| p.display().to_string());
        fixture_unit(&["--count-file", &count], reconnect(10, 100, 1), move |d| {
            d.sandbox = Some(mcpd::unit::spec::SandboxDraft {
                network: Some(network),
                read_write_paths: rw.into_iter().collect(),
                ..Default::default()
            });
        })
    };
    let host = |landlock: Result<i32, &str>, root: bool, userns: Result<(), &str>| {
        let mut host = Host::current(Instance::User, None);
        host.sandbox = Offer {
            landlock: landlock.map_err(str::to_owned),
            root,
            userns: userns.map_err(str::to_owned),
        };
        host.scratch = scratch.path().to_owned();
        host
    };
    let cases = [
        (
            host(
                Err("Landlock is built in but not enabled at boot"),
                true,
                Ok(()),
            ),
            sandboxed("host", None),
            "cannot sandbox the server: the sandbox needs Landlock: Landlock is built in but not enabled at boot",
        ),
        (
            host(Ok(2), true, Ok(())),
            sandboxed("host", None),
            "the kernel's Landlock is ABI v2, and the sandbox needs v3",
        ),
        (
            host(
                Ok(7),
                false,
                Err("user namespaces are disabled (user.max_user_namespaces = 0)"),
            ),
            sandboxed("none", None),
            "`network \"none\"` needs a network namespace, which an unprivileged daemon creates inside a user namespace: user namespaces are disabled (user.max_user_namespaces = 0)",
        ),
        (
            // A granted path that went away after the unit loaded.
            Host {
                scratch: scratch.path().to_owned(),
                ..Host::current(Instance::User, None)
            },
            sandboxed("host", Some(&gone.path().join("vanished"))),
            "cannot sandbox the server: sandbox read-write path",
        ),
    ];
    for (i, (host, spec, reason)) in cases.into_iter().enumerate() {
        let mut r = spawn_on(host, &format!("boxed{i}"), spec);
        let s = r.until("failed", |s| s.state == State::Failed).await;
        assert!(s.reason.contains(reason), "case {i}: {}", s.reason);
        r.shutdown().await;
    }
    assert!(!count.exists(), "a server ran unconfined");
    // Nothing left behind: no private temp directories.
    let left: Vec<_> = std::fs::read_dir(scratch.path()).expect("ls").collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_lines_are_kept_for_status() {
    let mut r = spawn(
        "chatty",
        fixture_unit(&["--chatter", "4"], reconnect(10, 1000, 3), |_| {}),
    );
    r.running(1).await;
    r.text("log", serde_json::json!({"text": "a line for the ring"}))
        .await;
    let mut waited = Vec::new();
    eventually_async("the log line in the ring", BOUND, async || {
        waited = r.sup.logs().tail(10);
        waited.iter().any(|l| l.ends_with("a line for the ring"))
    })
    .await;
    assert!(
        waited.iter().any(|l| l.ends_with("chatter line 3")),
        "{waited:?}"
    );
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_withdraws_tools_and_start_brings_them_back() {
    let mut r = spawn("toggle", fixture_unit(&[], reconnect(10, 1000, 3), |_| {}));
    let first = r.running(1).await;
    let pid = first.main_pid.expect("pid");
    r.sup.stop();
    let stopped = r.until("stopped", |s| s.state == State::Stopped).await;
    assert!(stopped.tools.is_empty());
    assert_eq!(stopped.main_pid, None);
    assert_eq!(stopped.last_exit, Some(ExitStatus::Signal(15)));
    assert!(!alive(pid));
    let err = r
        .call("echo", serde_json::json!({"text": "x"}))
        .await
        .expect_err("stopped");
    assert_eq!(err.to_string(), "server toggle is stopped");
    r.sup.start();
    let again = r.running(2).await;
    assert_eq!(again.tools.len(), first.tools.len());
    r.shutdown().await;
}

/// A loopback port nothing listens on (bound, then released).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

fn http_unit(url: &str, token: &str, reconnect: ReconnectDraft) -> UnitSpec {
    UnitSpec::new(UnitDraft {
        http: Some(mcpd::unit::spec::HttpDraft {
            url: url.to_owned(),
            headers: vec![(
                "Authorization".into(),
                mcpd::unit::spec::HeaderDraft::Value(format!("Bearer {token}")),
            )],
            ..Default::default()
        }),
        reconnect,
        startup_timeout: Some(Duration::from_secs(20)),
        ..UnitDraft::default()
    })
    .expect("valid spec")
}

/// The fixture serving Streamable HTTP on `port`, requiring `token`.
fn http_fixture(port: u16, token: &str) -> tokio::process::Child {
    tokio::process::Command::new(fixture_path())
        .args([
            "--http",
            &format!("127.0.0.1:{port}"),
            "--require-auth",
            &format!("Bearer {token}"),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn http fixture")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_unit_retries_until_the_server_answers_then_serves_calls() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let mut r = spawn(
        "remote",
        http_unit(&url, "s3cret", reconnect(50, 200, 1000)),
    );
    let refused = r.until("retrying", |s| s.state == State::Retrying).await;
    assert!(
        refused
            .reason
            .ends_with("tcp connect error: Connection refused (os error 111)"),
        "{}",
        refused.reason
    );
    assert_eq!(refused.main_pid, None);

    let mut server = http_fixture(port, "s3cret");
    let running = r.until("running", |s| s.state == State::Running).await;
    assert!(running.tools.contains("echo"));
    assert_eq!(
        r.text("echo", serde_json::json!({"text": "over http"}))
            .await,
        "over http"
    );
    r.shutdown().await;
    let _ = server.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_unit_with_a_wrong_token_fails_without_showing_it() {
    let port = free_port();
    let mut server = http_fixture(port, "right-token");
    let url = format!("http://127.0.0.1:{port}/mcp");
    let mut r = spawn(
        "denied",
        http_unit(&url, "wrong-token", reconnect(20, 40, 2)),
    );
    let failed = r.until("failed", |s| s.state == State::Failed).await;
    assert!(failed.reason.contains("401"), "{}", failed.reason);
    assert!(!failed.reason.contains("wrong-token"), "{}", failed.reason);
    assert_eq!(failed.generation, 3);
    r.shutdown().await;
    let _ = server.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_from_an_env_file_is_read_at_connect_and_a_missing_one_named() {
    use mcpd::unit::spec::{HeaderDraft, HttpDraft};
    let port = free_port();
    let mut server = http_fixture(port, "from-the-env-file");
    let url = format!("http://127.0.0.1:{port}/mcp");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = dir.path().join("remote.env");
    std::fs::write(&env, "API_TOKEN=\"Bearer from-the-env-file\"\n").expect("env-file");
    let unit = |var: &str| {
        UnitSpec::new(UnitDraft {
            http: Some(HttpDraft {
                url: url.clone(),
                env_files: vec![env.clone()],
                headers: vec![("Authorization".into(), HeaderDraft::Env(var.into()))],
                oauth: None,
            }),
            reconnect: reconnect(20, 40, 1),
            startup_timeout: Some(Duration::from_secs(20)),
            ..UnitDraft::default()
        })
        .expect("valid")
    };
    let mut r = spawn("fromenv", unit("API_TOKEN"));
    r.until("running", |s| s.state == State::Running).await;
    assert_eq!(
        r.text("echo", serde_json::json!({"text": "hi"})).await,
        "hi"
    );
    r.shutdown().await;
    let mut r = spawn("unset", unit("OTHER_TOKEN"));
    let failed = r.until("failed", |s| s.state == State::Failed).await;
    assert!(
        failed.reason.contains(&format!(
            "header Authorization: OTHER_TOKEN is not set in {}",
            env.display()
        )),
        "{}",
        failed.reason
    );
    r.shutdown().await;
    let _ = server.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_http_server_is_noticed_on_the_next_call_and_reconnected() {
    let port = free_port();
    let mut server = http_fixture(port, "t");
    let url = format!("http://127.0.0.1:{port}/mcp");
    let mut r = spawn("remote2", http_unit(&url, "t", reconnect(50, 200, 1000)));
    let first = r.until("running", |s| s.state == State::Running).await;
    // mcpd reads the resource lists once running: done before the server
    // dies, so the call below is what meets the dead server (on a loaded
    // machine a late list read could, and the call would find the
    // connection already lost).
    let mut lists = r.sup.subscribe_lists();
    within(BOUND, async {
        while [ListKind::Resources, ListKind::Templates]
            .into_iter()
            .any(|kind| r.sup.list(kind).is_none())
        {
            lists.changed().await.expect("the sessions run");
        }
    })
    .await
    .unwrap_or_else(|| panic!("{}", timed_out("the resource lists read", BOUND)));
    let _ = server.kill().await;
    let _ = server.wait().await;
    let err = r
        .call("echo", serde_json::json!({"text": "x"}))
        .await
        .expect_err("server is dead");
    // Refused, or reset when the killed server's port is still going away.
    let gone = err.to_string();
    assert!(
        gone.contains("Connection refused") || gone.contains("Connection reset"),
        "{gone}"
    );
    let lost = r
        .until("reconnecting", |s| s.state == State::Reconnecting)
        .await;
    assert!(
        lost.reason
            .starts_with("connection lost: request failed: error sending request"),
        "{}",
        lost.reason
    );
    assert_eq!(
        lost.tools.len(),
        first.tools.len(),
        "tools kept during the outage"
    );
    let mut server = http_fixture(port, "t");
    let again = r
        .until("running again", |s| {
            s.state == State::Running && s.generation > 1
        })
        .await;
    assert_eq!(again.tools_serial, first.tools_serial);
    assert_eq!(
        r.text("echo", serde_json::json!({"text": "back"})).await,
        "back"
    );
    r.shutdown().await;
    let _ = server.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_stdout_is_ignored() {
    let mut r = spawn(
        "noisy",
        fixture_unit(&["--garbage-stdout"], reconnect(10, 1000, 3), |_| {}),
    );
    let running = r.running(1).await;
    assert!(running.tools.contains("echo"));
    assert_eq!(
        r.text("echo", serde_json::json!({"text": "clean"})).await,
        "clean"
    );
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_and_concurrent_messages_cross_the_stdio_transport_intact() {
    // Each message far larger than a read (8 KiB) and than the pipe
    // buffer (64 KiB), in both directions, with answers interleaving.
    let mut r = spawn("large", fixture_unit(&[], reconnect(10, 1000, 3), |_| {}));
    r.running(1).await;
    let texts: Vec<String> = [3 << 20, 100_000, 5, 1 << 20]
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{i}:{}é", "x".repeat(*n)))
        .collect();
    let calls = texts
        .iter()
        .map(|t| r.text("echo", serde_json::json!({ "text": t })));
    let answers = futures_util::future::join_all(calls).await;
    for (sent, got) in texts.iter().zip(&answers) {
        assert_eq!(got.len(), sent.len());
        assert!(
            got == sent,
            "echo of {} bytes came back changed",
            sent.len()
        );
    }
    // the same generation still serves small calls afterwards
    assert_eq!(
        r.text("echo", serde_json::json!({"text": "after"})).await,
        "after"
    );
    assert_eq!(r.sup.status().generation, 1);
    r.shutdown().await;
}

/// Probes after `interval` ms of silence, `timeout` ms each, `failures`
/// misses ending the generation.
fn health(interval: u64, timeout: u64, failures: i128) -> mcpd::unit::spec::HealthDraft {
    mcpd::unit::spec::HealthDraft {
        interval: Some(ms(interval)),
        timeout: Some(ms(timeout)),
        failures: Some(failures),
        ..Default::default()
    }
}

/// SIGSTOPs `pid`, and waits until the probes (`health(_, 200, 2)`, each
/// a `probe` request) end the generation.
async fn freeze_until_lost(r: &mut Running, pid: u32, probe: &str) -> Status {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).expect("pid")).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).expect("SIGSTOP");
    let lost = r
        .until("reconnecting", |s| s.state == State::Reconnecting)
        .await;
    assert_eq!(
        lost.reason,
        format!("connection lost: no answer to {probe} (2 probes, 200ms each)")
    );
    lost
}

/// Waits until the server's sessions say it speaks `version` (they learn
/// it just after the generation is published as running).
async fn speaks(r: &Running, version: &str) {
    eventually_async(
        format_args!("the server to speak {version}"),
        BOUND,
        async || r.sup.protocol_version() == version,
    )
    .await;
}

/// The fixture as unit `name` spoken to in `version` (`protocol` pinned),
/// probed as `health` says: running, and its first generation's status.
async fn probed_fixture(
    name: &str,
    args: &[&str],
    version: &str,
    health: mcpd::unit::spec::HealthDraft,
) -> (Running, Status) {
    let pinned = if version == "2026-07-28" {
        version
    } else {
        "legacy"
    };
    let mut r = spawn(
        name,
        fixture_unit(args, reconnect(10, 1000, 3), |d| {
            d.protocol = Some(pinned.into());
            d.health = health;
            d.stop_timeout = Some(ms(500));
        }),
    );
    let first = r.running(1).await;
    speaks(&r, version).await;
    (r, first)
}

/// A server spoken to in `version`, SIGSTOPped, is noticed by its probes
/// (each a `probe` request) after `interval` + `failures` x `timeout` of
/// silence (the bound itself is the machine's, tested in
/// tests/pure/machine.rs), killed and replaced.
async fn a_stopped_server_is_replaced(name: &str, version: &str, probe: &str) {
    let (mut r, first) = probed_fixture(name, &[], version, health(300, 200, 2)).await;
    let pid = first.main_pid.expect("pid");
    // probes answered while it runs: the round trip is published
    let pinged = r
        .until("a probe answered", |s| s.health.last_ping.is_some())
        .await;
    assert_eq!((pinged.generation, pinged.main_pid), (1, Some(pid)));
    let lost = freeze_until_lost(&mut r, pid, probe).await;
    assert_eq!(lost.tools.len(), first.tools.len(), "tools kept");
    // SIGTERM (with SIGCONT) reaches the stopped process; it is gone
    // before a new one starts
    let again = r.running(2).await;
    assert_ne!(again.main_pid, Some(pid));
    assert!(!alive(pid), "the stopped process was killed and reaped");
    assert_eq!(again.restarts, 1);
    speaks(&r, version).await;
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_noticed_by_its_probes_killed_and_replaced() {
    a_stopped_server_is_replaced("frozen", "2025-11-25", "ping").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_2026_07_28_server_is_noticed_by_its_discover_probes_and_replaced() {
    // A server of 2026-07-28 has no ping: it is probed with server/discover,
    // on the same interval, timeout and failures.
    a_stopped_server_is_replaced("frozen-modern", "2026-07-28", "server/discover").await;
}

/// A call of 6 s to a server spoken to in `version` kills nothing: its
/// probes meanwhile are answered. The server, still running.
async fn a_slow_call_kills_nothing(name: &str, version: &str) -> Running {
    let (r, first) =
        probed_fixture(name, &["--tools", "sleep"], version, health(1000, 1000, 2)).await;
    // 6 s without a word about the call: the probes meanwhile are answered
    assert_eq!(
        r.text("sleep", serde_json::json!({"ms": 6000})).await,
        "slept 6000 ms"
    );
    let after = r.sup.status();
    assert_eq!(
        (after.state, after.generation, after.main_pid),
        (State::Running, 1, first.main_pid)
    );
    assert!(after.health.last_ping.is_some(), "it was probed meanwhile");
    assert_eq!(after.health.missed, 0);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_is_not_a_dead_server() {
    let r = a_slow_call_kills_nothing("busy", "2025-11-25").await;
    // a call's own timeout fails that call, not the server
    let timed_out = r
        .sup
        .call_tool(
            "hang",
            None,
            ms(300),
            std::future::ready(Default::default()),
        )
        .await
        .expect_err("hang times out");
    assert!(matches!(timed_out, CallError::Timeout(_)), "{timed_out}");
    let after = r.sup.status();
    assert_eq!((after.state, after.generation), (State::Running, 1));
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_is_not_a_dead_2026_07_28_server() {
    // Its probes are server/discover, answered while the call runs.
    let r = a_slow_call_kills_nothing("busy-modern", "2026-07-28").await;
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_that_stops_answering_is_noticed_without_a_call() {
    let port = free_port();
    let mut server = http_fixture(port, "t");
    let url = format!("http://127.0.0.1:{port}/mcp");
    let spec = UnitSpec::new(UnitDraft {
        http: Some(mcpd::unit::spec::HttpDraft {
            url: url.clone(),
            headers: vec![("Authorization".into(), "Bearer t".into())],
            ..Default::default()
        }),
        reconnect: reconnect(50, 200, 1000),
        health: health(300, 200, 2),
        startup_timeout: Some(Duration::from_secs(20)),
        ..UnitDraft::default()
    })
    .expect("valid spec");
    let mut r = spawn("remote3", spec);
    r.until("running", |s| s.state == State::Running).await;
    r.until("a probe answered", |s| s.health.last_ping.is_some())
        .await;
    freeze_until_lost(&mut r, server.id().expect("pid"), "ping").await;
    let _ = server.kill().await;
    let _ = server.wait().await;
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_changed_storm_is_read_at_most_every_100ms() {
    let r = spawn(
        "storm",
        fixture_unit(
            &["--list-changed-storm", "2000"],
            reconnect(10, 1000, 3),
            |_| {},
        ),
    );
    let listed = |n: usize| {
        let logs = r.sup.logs().clone();
        async move {
            let needle = format!("listed {n}");
            eventually_async(
                format_args!("the server listed {n} times"),
                BOUND,
                async || logs.tail(usize::MAX).iter().any(|l| l.ends_with(&needle)),
            )
            .await;
            std::time::Instant::now()
        }
    };
    // reads 2 to 7 are re-syncs, begun at least 100 ms apart however fast
    // the notifications come: 500 ms for 5, seen here through the server's
    // stderr and a 10 ms poll, so with 100 ms of slack for when each line
    // is seen (without the spacing, 5 take a few ms)
    let second = listed(2).await;
    let seventh = listed(7).await;
    assert!(
        seventh - second >= ms(400),
        "5 re-syncs in {:?}",
        seventh - second
    );
    let status = r.sup.status();
    assert_eq!((status.state, status.generation), (State::Running, 1));
    r.shutdown().await;
}
