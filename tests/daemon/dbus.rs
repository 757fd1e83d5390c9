//! The D-Bus API with a real `dbus-daemon` the test starts itself, checked
//! from independent clients (busctl, gdbus) and over the private socket
//! with the project's own proxies.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use rustix::process::Signal;

use crate::helper::{BOUND, Bus, Daemon, holds_within, root, run, timed_out};

/// `gdbus monitor` on the bus, for signals from org.mcpd1.
struct Monitor {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Monitor {
    fn start(bus: &Bus) -> Self {
        let mut child = Command::new("gdbus")
            .args(["monitor", "--address", &bus.address, "--dest", "org.mcpd1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("gdbus is installed (.ci/run installs it)");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut monitor = Self {
            child,
            lines,
            seen: Vec::new(),
        };
        monitor.wait_until("the monitor is attached", |m| {
            m.seen.iter().any(|l| l.contains("owned by"))
        });
        monitor
    }

    /// Reads signals until `done(self)` holds (bounded).
    fn wait_until(&mut self, what: &str, done: impl Fn(&Self) -> bool) {
        let met = holds_within(BOUND, || {
            if done(self) {
                return true;
            }
            // the signals that have come, one by one: none after the one
            // that made `done` hold is read
            let mut next = self.lines.recv_timeout(Duration::from_millis(50)).ok();
            for _ in 0..1000 {
                let Some(line) = next else { break };
                self.seen.push(line);
                if done(self) {
                    return true;
                }
                next = self.lines.try_recv().ok();
            }
            false
        });
        assert!(
            met,
            "{}; signals seen:\n{}",
            timed_out(what, BOUND),
            self.seen.join("\n")
        );
    }

    fn count(&self, needle: &str) -> usize {
        self.seen.iter().filter(|l| l.contains(needle)).count()
    }

    /// The values the State property of `path` took, in order.
    fn states(&self, path: &str) -> Vec<String> {
        self.seen
            .iter()
            .filter(|l| {
                l.starts_with(&format!(
                    "{path}: org.freedesktop.DBus.Properties.PropertiesChanged"
                ))
            })
            .filter_map(|l| {
                l.split("'State': <'")
                    .nth(1)?
                    .split('\'')
                    .next()
                    .map(str::to_owned)
            })
            .collect()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn busctl(bus: &Bus, args: &[&str]) -> Output {
    run(Command::new("busctl")
        .arg(format!("--address={}", bus.address))
        .args(args))
}

fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `gdbus call` on a server method; returns stdout or the error text.
fn gdbus_call(bus: &Bus, path: &str, method: &str, args: &[&str]) -> Result<String, String> {
    let out = run(Command::new("gdbus")
        .args([
            "call",
            "--address",
            &bus.address,
            "--dest",
            "org.mcpd1",
            "--object-path",
            path,
            "--method",
            method,
        ])
        .args(args));
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn fixture_unit(dir: &Path, name: &str, extra: &str) {
    std::fs::write(
        dir.join(format!("{name}.kdl")),
        format!("description \"{name} server\"\nstdio {{\n    command \"mcp-fixture\" \"--chatter\" \"0\"{extra}\n}}\nreconnect {{\n    initial-delay \"50ms\"\n    max-delay \"1s\"\n}}\n"),
    )
    .expect("write unit");
}

fn start_daemon(bus: &Bus, dir: &Path, extra_args: &[&str]) -> Daemon {
    let mut args: Vec<&std::ffi::OsStr> =
        vec!["--user".as_ref(), "--units".as_ref(), dir.as_os_str()];
    args.extend(extra_args.iter().map(|a| std::ffi::OsStr::new(*a)));
    let mut d = Daemon::start(&args, &[("DBUS_SESSION_BUS_ADDRESS", bus.address.as_ref())]);
    d.wait_for("serving org.mcpd1 on the session bus");
    d
}

const DEMO: &str = "/org/mcpd1/server/demo";

#[test]
fn bus_api_seen_from_busctl_and_gdbus() {
    let bus = Bus::start();
    let tmp = tempfile::tempdir().expect("tempdir");
    fixture_unit(tmp.path(), "demo", "");
    let mut d = start_daemon(&bus, tmp.path(), &[]);
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());

    let intro = ok(busctl(&bus, &["introspect", "org.mcpd1", "/org/mcpd1"]));
    for member in [
        "org.mcpd1.Manager",
        ".ListServers",
        ".GetServer",
        ".Reload",
        ".ServerAdded",
        ".ServerRemoved",
        ".Reloaded",
        ".UnitPaths",
        "org.freedesktop.DBus.ObjectManager",
    ] {
        assert!(intro.contains(member), "{member} missing:\n{intro}");
    }
    let intro = ok(busctl(&bus, &["introspect", "org.mcpd1", DEMO]));
    for member in [
        ".CallTool",
        ".ListTools",
        ".RecentLogs",
        ".ToolsChanged",
        ".Tools",
        ".NextRetryUSec",
        ".MainPID",
        ".LoadError",
    ] {
        assert!(intro.contains(member), "{member} missing:\n{intro}");
    }
    // every member of our interfaces is documented in org.mcpd1(5)
    let page = std::fs::read_to_string(root().join("man/org.mcpd1.5")).expect("man page");
    let manager = ok(busctl(
        &bus,
        &["introspect", "org.mcpd1", "/org/mcpd1", "org.mcpd1.Manager"],
    ));
    let server = ok(busctl(
        &bus,
        &["introspect", "org.mcpd1", DEMO, "org.mcpd1.Server"],
    ));
    let mut members = 0;
    for line in manager
        .lines()
        .chain(server.lines())
        .filter(|l| l.starts_with('.'))
    {
        let mut cols = line.split_whitespace();
        let (name, kind) = (
            cols.next().unwrap_or_default().trim_start_matches('.'),
            cols.next().unwrap_or_default(),
        );
        let documented = match kind {
            "property" => page.contains(&format!(".It Va {name} ")),
            _ => page.contains(&format!(".It Fn {name}")),
        };
        assert!(documented, "{kind} {name} is not in man/org.mcpd1.5");
        members += 1;
    }
    assert!(members >= 30, "{members} members introspected");
    let list = ok(busctl(
        &bus,
        &[
            "call",
            "org.mcpd1",
            "/org/mcpd1",
            "org.mcpd1.Manager",
            "ListServers",
        ],
    ));
    assert!(
        list.starts_with(
            "a(ssssuo) 1 \"demo\" \"demo server\" \"running\" \"\" 9 \"/org/mcpd1/server/demo\""
        ),
        "{list}"
    );
    let objects = ok(busctl(
        &bus,
        &[
            "call",
            "org.mcpd1",
            "/org/mcpd1",
            "org.freedesktop.DBus.ObjectManager",
            "GetManagedObjects",
        ],
    ));
    assert!(
        objects.contains("\"/org/mcpd1/server/demo\"") && objects.contains("org.mcpd1.Server"),
        "{objects}"
    );
    let echo = ok(busctl(
        &bus,
        &[
            "call",
            "org.mcpd1",
            DEMO,
            "org.mcpd1.Server",
            "CallTool",
            "ss",
            "echo",
            "{\"text\":\"over the bus\"}",
        ],
    ));
    assert!(
        echo.contains("over the bus") && echo.contains("isError\\\":false"),
        "{echo}"
    );
    // accounted to the bus caller, found through the bus's credentials
    let uid = rustix::process::getuid().as_raw();
    let line = d.wait_for(&format!("tools/call echo by uid {uid} pid "));
    let pid = line
        .split(" pid ")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_default();
    assert!(pid.parse::<u32>().is_ok(), "busctl's pid: {line}");

    // a crash: running → reconnecting → running, and no ToolsChanged
    let mut monitor = Monitor::start(&bus);
    ok(busctl(
        &bus,
        &[
            "call",
            "org.mcpd1",
            DEMO,
            "org.mcpd1.Server",
            "CallTool",
            "ss",
            "crash",
            "{\"code\":3}",
        ],
    ));
    monitor.wait_until("running again", |m| {
        m.states(DEMO)
            .ends_with(&["reconnecting".to_owned(), "running".to_owned()])
    });
    assert_eq!(monitor.states(DEMO), ["reconnecting", "running"]);
    assert_eq!(
        monitor.count("ToolsChanged"),
        0,
        "an unchanged list is not announced"
    );

    // set_tools: exactly one ToolsChanged
    ok(busctl(
        &bus,
        &[
            "call",
            "org.mcpd1",
            DEMO,
            "org.mcpd1.Server",
            "CallTool",
            "ss",
            "set_tools",
            "{\"tools\":[\"extra\"]}",
        ],
    ));
    monitor.wait_until("ToolsChanged", |m| {
        m.count("org.mcpd1.Server.ToolsChanged") == 1
    });
    let changed = monitor
        .seen
        .iter()
        .find(|l| l.contains("ToolsChanged"))
        .expect("signal");
    assert!(changed.contains("'extra'"), "{changed}");
    d.signal(Signal::HUP);
    monitor.wait_until("Reloaded", |m| m.count("org.mcpd1.Manager.Reloaded") == 1);
    assert_eq!(monitor.count("org.mcpd1.Server.ToolsChanged"), 1);

    // units come and go: ServerAdded/ServerRemoved and the ObjectManager's signals
    fixture_unit(tmp.path(), "added", "");
    monitor.wait_until("ServerAdded", |m| {
        m.count("ServerAdded ('added', objectpath '/org/mcpd1/server/added')") == 1
    });
    monitor.wait_until("InterfacesAdded", |m| {
        m.count("InterfacesAdded (objectpath '/org/mcpd1/server/added'") == 1
    });
    std::fs::remove_file(tmp.path().join("added.kdl")).expect("rm");
    monitor.wait_until("ServerRemoved", |m| {
        m.count("ServerRemoved ('added', objectpath '/org/mcpd1/server/added')") == 1
    });
    monitor.wait_until("InterfacesRemoved", |m| {
        m.count("InterfacesRemoved (objectpath '/org/mcpd1/server/added'") == 1
    });

    // Reload returns the diff
    let diff = ok(busctl(
        &bus,
        &[
            "call",
            "org.mcpd1",
            "/org/mcpd1",
            "org.mcpd1.Manager",
            "Reload",
        ],
    ));
    assert_eq!(diff.trim(), "a(ss) 1 \"demo\" \"unchanged\"");
    let logs = ok(busctl(
        &bus,
        &[
            "call",
            "org.mcpd1",
            DEMO,
            "org.mcpd1.Server",
            "RecentLogs",
            "u",
            "2",
        ],
    ));
    assert!(logs.starts_with("as 2 "), "{logs}");
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn every_error_has_its_name() {
    let bus = Bus::start();
    let tmp = tempfile::tempdir().expect("tempdir");
    fixture_unit(tmp.path(), "demo", "");
    std::fs::write(
        tmp.path().join("doomed.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--die-on-start\" \"1\"\n}\nreconnect {\n    initial-delay \"1h\"\n    max-delay \"2h\"\n}\n",
    )
    .expect("write");
    let mut d = start_daemon(&bus, tmp.path(), &[]);
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    d.wait_until("doomed retrying", |d| d.count("retry 1/10 in 1h") == 1);

    let err = gdbus_call(&bus, "/org/mcpd1", "org.mcpd1.Manager.GetServer", &["nope"])
        .expect_err("no such server");
    assert!(
        err.contains("org.mcpd1.Error.NoSuchServer: no server named nope"),
        "{err}"
    );
    let call = |args: &[&str]| gdbus_call(&bus, DEMO, "org.mcpd1.Server.CallTool", args);
    let err = call(&["echo", "{not json"]).expect_err("bad json");
    assert!(
        err.contains("org.mcpd1.Error.InvalidArguments: arguments are not valid JSON"),
        "{err}"
    );
    let err = call(&["nosuchtool", "{}"]).expect_err("unknown tool");
    assert!(
        err.contains("org.mcpd1.Error.InvalidArguments: server demo has no tool nosuchtool"),
        "{err}"
    );
    let err = call(&["add", "{\"a\":\"one\"}"]).expect_err("wrong types");
    assert!(
        err.contains("org.mcpd1.Error.InvalidArguments: `a` and `b` (numbers) are required"),
        "{err}"
    );
    // an isError result is the server's answer, not a D-Bus error
    let failed = call(&["fail", "{\"message\":\"nope\"}"]).expect("isError is a result");
    assert!(
        failed.contains("isError\\\":true") || failed.contains("\"isError\":true"),
        "{failed}"
    );
    let err = gdbus_call(
        &bus,
        "/org/mcpd1/server/doomed",
        "org.mcpd1.Server.CallTool",
        &["echo", "{}"],
    )
    .expect_err("not running");
    assert!(
        err.contains("org.mcpd1.Error.NotRunning: server doomed is retrying (retry 1/10, next in "),
        "{err}"
    );
    // a call cut off by the server dying is ToolFailed
    let pid = d.latest_pid("demo").expect("pid");
    let hanging = Command::new("gdbus")
        .args([
            "call",
            "--address",
            &bus.address,
            "--dest",
            "org.mcpd1",
            "--object-path",
            DEMO,
            "--method",
            "org.mcpd1.Server.CallTool",
            "hang",
            "{}",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gdbus");
    d.wait_until("the hang call arrived", |d| d.count("call hang") == 1);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).expect("pid"),
        Signal::KILL,
    )
    .expect("kill");
    let out = hanging.wait_with_output().expect("gdbus exits");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("org.mcpd1.Error.ToolFailed"), "{err}");
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn system_instance_checks_the_callers_uid() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test runs a client as another uid and needs root (CI runs as root)"
    );
    let bus = Bus::start();
    let tmp = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    fixture_unit(tmp.path(), "demo", "");
    let mut d = Daemon::start(
        &[
            "--system".as_ref(),
            "--units".as_ref(),
            tmp.path().as_os_str(),
        ],
        &[
            ("DBUS_SYSTEM_BUS_ADDRESS", bus.address.as_ref()),
            ("MCPD_RUNTIME_DIR", runtime.path().as_os_str()),
        ],
    );
    d.wait_for("serving org.mcpd1 on the system bus");
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    let as_nobody = |args: &[&str]| {
        run(Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "gdbus",
                "call",
                "--address",
                &bus.address,
                "--dest",
                "org.mcpd1",
            ])
            .args(args))
    };
    let restart = as_nobody(&[
        "--object-path",
        "/org/mcpd1",
        "--method",
        "org.mcpd1.Manager.Restart",
        "demo",
    ]);
    let err = String::from_utf8_lossy(&restart.stderr);
    assert!(
        err.contains("org.mcpd1.Error.AccessDenied: uid 65534 may not control mcpd"),
        "{err}"
    );
    let call = as_nobody(&[
        "--object-path",
        DEMO,
        "--method",
        "org.mcpd1.Server.CallTool",
        "echo",
        "{\"text\":\"x\"}",
    ]);
    assert!(String::from_utf8_lossy(&call.stderr).contains("org.mcpd1.Error.AccessDenied"));
    let read = as_nobody(&[
        "--object-path",
        DEMO,
        "--method",
        "org.freedesktop.DBus.Properties.Get",
        "org.mcpd1.Server",
        "State",
    ]);
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    assert!(String::from_utf8_lossy(&read.stdout).contains("'running'"));
    let list = as_nobody(&[
        "--object-path",
        "/org/mcpd1",
        "--method",
        "org.mcpd1.Manager.ListServers",
    ]);
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    // root may
    let pid = d.latest_pid("demo").expect("pid");
    gdbus_call(&bus, "/org/mcpd1", "org.mcpd1.Manager.Restart", &["demo"])
        .expect("root may restart");
    d.wait_until("restarted", |d| {
        d.latest_pid("demo").is_some_and(|p| p != pid)
    });
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn the_private_socket_serves_everything_without_a_bus() {
    use futures_util::{FutureExt, StreamExt};
    use mcpd::dbus::{ManagerProxy, ServerProxy, server_path};
    use std::os::unix::fs::PermissionsExt;

    let tmp = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    fixture_unit(tmp.path(), "demo", "");
    let mut d = Daemon::user_no_bus(
        tmp.path(),
        &[("XDG_RUNTIME_DIR", runtime.path().as_os_str())],
    );
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    assert_eq!(d.count("serving org.mcpd1"), 0, "no bus was used");
    let socket = runtime.path().join("mcpd/private");
    let mode = std::fs::metadata(&socket)
        .expect("socket exists")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let stream = std::os::unix::net::UnixStream::connect(&socket).expect("connect");
            let conn = zbus::connection::Builder::unix_stream(stream)
                .p2p()
                .build()
                .await
                .expect("p2p handshake");
            let manager = ManagerProxy::new(&conn).await.expect("manager proxy");
            assert_eq!(manager.instance().await.expect("Instance"), "user");
            assert_eq!(
                manager.version().await.expect("Version"),
                env!("CARGO_PKG_VERSION")
            );
            let rows = manager.list_servers().await.expect("ListServers");
            assert_eq!(rows.len(), 1);
            assert_eq!(
                (rows[0].name.as_str(), rows[0].state.as_str(), rows[0].tools),
                ("demo", "running", 9)
            );
            assert_eq!(
                manager.get_server("demo").await.expect("GetServer"),
                server_path("demo")
            );
            match manager.get_server("nope").await {
                Err(e @ mcpd::dbus::Error::NoSuchServer(_)) => {
                    assert_eq!(
                        zbus::DBusError::name(&e).as_str(),
                        "org.mcpd1.Error.NoSuchServer"
                    );
                    assert_eq!(e.message(), "no server named nope");
                }
                other => panic!("{other:?}"),
            }

            let server = ServerProxy::builder(&conn)
                .path(server_path("demo"))
                .build()
                .await
                .expect("server proxy");
            assert_eq!(server.state().await.expect("State"), "running");
            assert_eq!(server.tools().await.expect("Tools").len(), 9);
            assert!(server.main_pid().await.expect("MainPID") > 0);
            let echo = server
                .call_tool("echo", "{\"text\":\"p2p\"}")
                .await
                .expect("CallTool");
            let echo: serde_json::Value = serde_json::from_str(&echo).expect("json");
            assert_eq!(echo["content"][0]["text"], "p2p");
            let tools: serde_json::Value =
                serde_json::from_str(&server.list_tools().await.expect("ListTools")).expect("json");
            assert_eq!(tools[0]["name"], "echo");

            let mut changes = server.receive_tool_list_changed().await.expect("subscribe");
            let mut lists = server.receive_list_changed().await.expect("subscribe");
            server
                .call_tool("set_tools", "{\"tools\":[\"extra\"]}")
                .await
                .expect("set_tools");
            let signal = changes.next().await.expect("ToolsChanged");
            let args = signal.args().expect("args");
            assert_eq!(*args.generation(), 1);
            assert!(args.tools().iter().any(|t| t.name == "extra"));
            let signal = lists.next().await.expect("ListChanged");
            let args = signal.args().expect("args");
            assert_eq!((*args.generation(), args.which.as_str()), (1, "tools"));

            // the object manager lists the server with its interface
            let managed = managed_objects(&object_manager(&conn).await).await;
            let demo = managed
                .iter()
                .find(|(path, _)| path.as_str() == DEMO)
                .expect("demo is managed");
            assert!(demo.1.keys().any(|i| i.as_str() == "org.mcpd1.Server"));

            // a crash: State goes reconnecting then running; no ToolsChanged
            let mut states = server.receive_state_changed().await;
            server
                .call_tool("crash", "{\"code\":3}")
                .await
                .expect("crash");
            // (a property stream may start with the current value)
            let mut seen: Vec<String> = Vec::new();
            while !(seen.iter().any(|s| s == "reconnecting")
                && seen.last().map(String::as_str) == Some("running"))
            {
                let change = states.next().await.expect("State change");
                seen.push(change.get().await.expect("value"));
            }
            let from = seen.iter().position(|s| s == "reconnecting").unwrap_or(0);
            assert_eq!(seen[from..], ["reconnecting", "running"]);

            // errors keep their names over the private socket too
            let name_of = |e: mcpd::dbus::Error| zbus::DBusError::name(&e).to_string();
            let bad = server
                .call_tool("echo", "[1]")
                .await
                .expect_err("not an object");
            assert_eq!(name_of(bad), "org.mcpd1.Error.InvalidArguments");

            // units come and go
            let mut added = manager.receive_server_added().await.expect("subscribe");
            let mut removed = manager.receive_server_removed().await.expect("subscribe");
            fixture_unit(tmp.path(), "late", "");
            let signal = added.next().await.expect("ServerAdded");
            assert_eq!(signal.args().expect("args").name(), "late");
            std::fs::remove_file(tmp.path().join("late.kdl")).expect("rm");
            let signal = removed.next().await.expect("ServerRemoved");
            assert_eq!(signal.args().expect("args").name(), "late");

            // a new unit that is invalid from the start is listed, so this
            // (older) connection gets its object, announced once
            std::fs::write(
                tmp.path().join("broken.kdl"),
                "stdio {\n    command \"mcp-fixture\"\n}\nreconnect {\n    max-attempts 0\n}\n",
            )
            .expect("write");
            let signal = added.next().await.expect("ServerAdded for an invalid unit");
            assert_eq!(signal.args().expect("args").name(), "broken");
            let diff = manager.reload().await.expect("Reload");
            assert!(
                diff.contains(&("broken".into(), "invalid".into())),
                "{diff:?}"
            );
            let broken = ServerProxy::builder(&conn)
                .path(server_path("broken"))
                .build()
                .await
                .expect("server proxy");
            let load_error = broken
                .load_error()
                .await
                .expect("LoadError on the old connection");
            assert!(load_error.contains("broken.kdl:5:18"), "{load_error}");
            assert_eq!(broken.state().await.expect("State"), "stopped");
            // fixed, it starts under the same object: no second ServerAdded
            let mut broken_states = broken.receive_state_changed().await;
            fixture_unit(tmp.path(), "broken", "");
            state_becomes(&mut broken_states, "running").await;
            std::fs::remove_file(tmp.path().join("broken.kdl")).expect("rm");
            let signal = removed.next().await.expect("ServerRemoved");
            assert_eq!(signal.args().expect("args").name(), "broken");
            // (signals arrive in order: a second ServerAdded would be queued)
            assert!(
                added.next().now_or_never().is_none(),
                "the server was announced once"
            );

            // a stopped server: NotRunning
            manager.stop("demo").await.expect("Stop");
            state_becomes(&mut states, "stopped").await;
            let stopped = server.call_tool("echo", "{}").await.expect_err("stopped");
            assert_eq!(name_of(stopped), "org.mcpd1.Error.NotRunning");
            // stopping withdrew the tools: a ToolsChanged says so (one
            // queued before it, of the crash's new generation, may come
            // first)
            loop {
                let signal = changes.next().await.expect("ToolsChanged");
                if signal.args().expect("args").tools().is_empty() {
                    break;
                }
            }
            // (read past the proxy's cache: its own task applies the
            // PropertiesChanged sent before the signal, maybe not yet)
            let uncached = ServerProxy::builder(&conn)
                .path(server_path("demo"))
                .cache_properties(zbus::proxy::CacheProperties::No)
                .build()
                .await
                .expect("server proxy");
            assert!(uncached.tools().await.expect("Tools").is_empty());
        })
        .await
        .expect("within 30 s");
    });
    assert!(d.stop(Signal::TERM).success());
    assert!(!socket.exists(), "the socket is removed on exit");
}

/// Waits until the State property, as `states` (a proxy's
/// `receive_state_changed()`, taken before what changes it) reports it,
/// is `want`. The stream may skip values it was too slow for, never the
/// last one.
async fn state_becomes(states: &mut zbus::proxy::PropertyStream<'_, String>, want: &str) {
    use futures_util::StreamExt;
    let mut seen = Vec::new();
    while let Some(change) = states.next().await {
        let state = change.get().await.expect("State value");
        if state == want {
            return;
        }
        seen.push(state);
    }
    panic!("the State stream ended before {want}; seen {seen:?}");
}

#[test]
fn a_tool_filter_hides_and_refuses_tools_and_changes_in_place() {
    use futures_util::StreamExt;
    let tmp = tempfile::tempdir().expect("tempdir");
    let unit = |tools: &str| {
        format!(
            "stdio {{\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}}\ntools {{\n{tools}}}\n"
        )
    };
    std::fs::write(
        tmp.path().join("demo.kdl"),
        unit("    allow \"e*\" \"add\"\n    deny \"echo\"\n"),
    )
    .expect("write");
    let mut d = Daemon::user_no_bus(tmp.path(), &[]);
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    let pid = d.latest_pid("demo").expect("pid");
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let listed = || {
        let out = crate::helper::mcpctl_user(&runtime, &["tools", "demo"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect::<Vec<_>>()
    };
    assert_eq!(listed(), ["add", "env"], "allow e* and add, deny echo");
    let refused =
        crate::helper::mcpctl_user(&runtime, &["call", "demo", "echo", "{\"text\":\"x\"}"]);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("tool echo of server demo is filtered out by its unit's `tools` block: it matches deny \"echo\""),
        "{why}"
    );
    let added = crate::helper::mcpctl_user(&runtime, &["call", "demo", "add", "{\"a\":1,\"b\":2}"]);
    assert_eq!(String::from_utf8_lossy(&added.stdout).trim(), "3");

    // Lift the deny: the list changes in place (same process) and is signalled.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let signalled = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let (_conn, server) =
                crate::helper::private_server(&runtime.join("mcpd/private"), "demo").await;
            let mut changes = server.receive_tool_list_changed().await.expect("subscribe");
            std::fs::write(
                tmp.path().join("demo.kdl"),
                unit("    allow \"e*\" \"add\"\n"),
            )
            .expect("write");
            let signal = changes.next().await.expect("ToolsChanged");
            let names: Vec<String> = signal
                .args()
                .expect("args")
                .tools()
                .iter()
                .map(|t| t.name.clone())
                .collect();
            assert_eq!(names, ["echo", "add", "env"]);
        })
        .await
    });
    if signalled.is_err() {
        d.wait_until("the log", |d| d.count("reloaded") > 0);
        panic!(
            "no ToolsChanged within 30 s; mcpd logged:\n{}",
            d.seen.join("\n")
        );
    }
    assert_eq!(d.latest_pid("demo"), Some(pid), "not restarted");
    assert!(crate::helper::alive(pid));
    assert_eq!(listed(), ["echo", "add", "env"]);
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_private_bus_leaves_no_socket_file_behind() {
    let bus = Bus::start();
    let socket = bus
        .address
        .split(',')
        .find_map(|kv| kv.strip_prefix("unix:path="))
        .map(std::path::PathBuf::from)
        .expect("a unix:path= address");
    assert!(socket.exists(), "{}", socket.display());
    drop(bus);
    assert!(!socket.exists(), "{} is left", socket.display());
}

/// A client of the private socket at `socket`, authenticated by hand
/// (SASL EXTERNAL), so that every byte the daemon sends is seen: sends one
/// `Peer.Ping` and returns what came before its reply, as (message type,
/// size, member name if a signal).
fn messages_before_the_first_reply(socket: &Path) -> Vec<(u8, usize, String)> {
    use std::io::{Read, Write};
    let mut s = crate::daemon::connections::handshaken(socket);
    let ping = zbus::message::Message::method_call("/org/mcpd1", "Ping")
        .interface("org.freedesktop.DBus.Peer")
        .build(&())
        .expect("a Ping");
    s.write_all(ping.data()).expect("ping");
    let mut before = Vec::new();
    loop {
        // The fixed header: endianness, type, flags, version, body length,
        // serial, header fields' length; the fields are padded to 8.
        let mut fixed = [0u8; 16];
        s.read_exact(&mut fixed).expect("a message");
        assert_eq!(fixed[0], b'l', "little-endian");
        let word =
            |at: usize| u32::from_le_bytes(fixed[at..at + 4].try_into().expect("4")) as usize;
        let size = (16 + word(12)).div_ceil(8) * 8 + word(4);
        let mut rest = vec![0u8; size - 16];
        s.read_exact(&mut rest).expect("the rest of the message");
        match fixed[1] {
            // the method return (or error) of the one call made
            2 | 3 => return before,
            kind => {
                let text = String::from_utf8_lossy(&rest);
                let member = ["InterfacesAdded", "PropertiesChanged"]
                    .into_iter()
                    .find(|m| text.contains(m))
                    .unwrap_or("?");
                before.push((kind, size, member.to_owned()));
            }
        }
    }
}

/// The object manager at `/org/mcpd1` on `conn`.
async fn object_manager(conn: &zbus::Connection) -> zbus::fdo::ObjectManagerProxy<'_> {
    zbus::fdo::ObjectManagerProxy::builder(conn)
        .destination("org.mcpd1")
        .path("/org/mcpd1")
        .build()
        .await
        .expect("object manager proxy")
}

async fn managed_objects(objects: &zbus::fdo::ObjectManagerProxy<'_>) -> zbus::fdo::ManagedObjects {
    objects
        .get_managed_objects()
        .await
        .expect("GetManagedObjects")
}

/// The properties of `org.mcpd1.Server` among an object's interfaces.
fn server_interface<I: std::fmt::Display, P>(interfaces: &HashMap<I, P>) -> &P {
    interfaces
        .iter()
        .find(|(i, _)| i.to_string() == "org.mcpd1.Server")
        .map(|(_, p)| p)
        .expect("org.mcpd1.Server")
}

fn string(value: &zbus::Variant<'_>) -> String {
    String::try_from(value.try_clone().expect("clone")).expect("a string")
}

/// Issue 32: a unit with a large catalog made every new private-socket
/// client (every `mcpctl` run, whatever it asked about) cost the daemon
/// the reading and serializing of that catalog: zbus's object manager
/// announced every object, properties and all, when a connection was
/// set up. A client is now sent nothing it did not ask for; the objects
/// are there on request (`GetManagedObjects`), and units that come and go
/// are announced.
#[test]
fn a_new_connection_is_not_sent_every_servers_properties() {
    use futures_util::StreamExt;
    use mcpd::dbus::server_path;

    let tmp = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    fixture_unit(tmp.path(), "small", "");
    fixture_unit(
        tmp.path(),
        "big",
        " \"--many-tools\" \"20000\" \"--page-size\" \"5000\"",
    );
    let mut d = Daemon::user_no_bus(
        tmp.path(),
        &[("XDG_RUNTIME_DIR", runtime.path().as_os_str())],
    );
    d.wait_until("both running", |d| {
        d.latest_pid("small").is_some() && d.latest_pid("big").is_some()
    });
    let socket = runtime.path().join("mcpd/private");

    let told = messages_before_the_first_reply(&socket);
    assert!(
        told.is_empty(),
        "a new connection was sent (type, bytes, member) {told:?} before the answer to its first call"
    );

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            let conn = crate::helper::private_conn(&socket).await;
            let objects = object_manager(&conn).await;
            // every server, with every property, on request
            let managed = managed_objects(&objects).await;
            let mut paths: Vec<&str> = managed.keys().map(|p| p.as_str()).collect();
            paths.sort_unstable();
            assert_eq!(paths, ["/org/mcpd1/server/big", "/org/mcpd1/server/small"]);
            let server = server_interface(&managed[&server_path("big")]);
            assert_eq!(string(&server["Name"]), "big");
            let zbus::Variant::Array(tools) = &*server["Tools"] else {
                panic!("Tools is an array")
            };
            assert_eq!(tools.len(), 20_009);

            // a unit that comes is announced with its properties, and
            // withdrawn when it goes
            let mut added = objects.receive_interfaces_added().await.expect("subscribe");
            let mut removed = objects
                .receive_interfaces_removed()
                .await
                .expect("subscribe");
            fixture_unit(tmp.path(), "late", "");
            let signal = added.next().await.expect("InterfacesAdded");
            let args = signal.args().expect("args");
            assert_eq!(args.object_path().as_str(), server_path("late").as_str());
            let properties = server_interface(args.interfaces_and_properties());
            assert_eq!(string(&properties["Name"]), "late");
            std::fs::remove_file(tmp.path().join("late.kdl")).expect("rm");
            let signal = removed.next().await.expect("InterfacesRemoved");
            let args = signal.args().expect("args");
            assert_eq!(args.object_path().as_str(), server_path("late").as_str());
            let interfaces: Vec<&str> = args.interfaces().iter().map(|i| i.as_str()).collect();
            assert_eq!(interfaces, ["org.mcpd1.Server"]);
        })
        .await
        .expect("within 60 s");
    });
    assert!(d.stop(Signal::TERM).success());
}
