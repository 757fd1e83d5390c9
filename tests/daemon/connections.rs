//! Connection hygiene: whatever a client of the private socket costs the
//! daemon (an fd, a zbus connection, objects, an in-flight call) is given
//! back when the client goes, however it goes: a clean exit, a malformed
//! message, a disconnect in the middle of a call. An fd shortage never makes
//! the accept loop spin, and servers get the fd limit they would have had.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rustix::process::Signal;

use crate::helper::{Daemon, alive, mcpctl_user, rss_kib};

/// The fixture as a unit that respawns quickly: one process whatever
/// era its hosts speak (pinned: its descriptors and processes are
/// counted; a 2025 host would otherwise get a lane, DESIGN §12).
fn demo_unit(dir: &Path) {
    std::fs::write(
        dir.join("demo.kdl"),
        "stdio {\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n}\nprotocol \"2026-07-28\"\nreconnect {\n    initial-delay \"50ms\"\n    max-delay \"1s\"\n}\n",
    )
    .expect("write");
}

/// `mcpd --user --no-bus` on `units` under `prlimit --nofile=LIMIT` (prlimit
/// execs mcpd, so the daemon keeps prlimit's pid).
fn daemon_with_nofile(units: &Path, limit: &str) -> Daemon {
    Daemon::start_binary(
        Path::new("prlimit"),
        &[
            format!("--nofile={limit}").as_ref(),
            "--".as_ref(),
            env!("CARGO_BIN_EXE_mcpd").as_ref(),
            "--user".as_ref(),
            "--no-bus".as_ref(),
            "--units".as_ref(),
            units.as_os_str(),
        ],
        &[],
    )
}

fn runtime_dir(d: &Daemon) -> PathBuf {
    d.runtime_dir()
        .expect("the helper's runtime dir")
        .to_owned()
}

fn socket(d: &Daemon) -> PathBuf {
    runtime_dir(d).join("mcpd/private")
}

/// Open file descriptors of `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/PID/fd")
        .count()
}

/// CPU time (user + system) of `pid`. /proc counts in USER_HZ, which is
/// 100 on every Linux architecture.
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("comm")
        .1
        .split_whitespace()
        .collect();
    // fields[0] is field 3 (state): utime is field 14, stime field 15.
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

/// The soft and hard "Max open files" of `pid`.
fn nofile(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files");
    let mut words = line["Max open files".len()..].split_whitespace();
    (
        words.next().expect("soft").to_owned(),
        words.next().expect("hard").to_owned(),
    )
}

/// Waits (bounded) until the daemon holds at most `most` fds.
fn wait_for_fds(d: &mut Daemon, most: usize, after: &str) {
    let pid = d.pid();
    d.wait_until(&format!("at most {most} fds {after}"), |_| fds(pid) <= most);
}

fn status(runtime: &Path) -> std::process::Output {
    mcpctl_user(runtime, &["status"])
}

/// `n` runs of `mcpctl status` on `threads` threads, each of which must
/// succeed.
fn statuses(runtime: &Path, n: usize, threads: usize) {
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                for _ in 0..n / threads {
                    let out = status(runtime);
                    assert!(
                        out.status.success(),
                        "mcpctl status failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            });
        }
    });
}

/// One host session through `mcpctl bridge`: initialize, list, one call.
async fn bridge_session(runtime: &Path) {
    let (mut bridge, io) = crate::helper::bridge(runtime, "demo");
    let client = ().serve(io).await.expect("initialize");
    assert_eq!(client.list_all_tools().await.expect("tools/list").len(), 9);
    let echo = client
        .call_tool(
            CallToolRequestParams::new("echo").with_arguments(
                serde_json::json!({"text": "hi"})
                    .as_object()
                    .cloned()
                    .expect("object"),
            ),
        )
        .await
        .expect("echo");
    assert_eq!(echo.is_error, Some(false));
    client.cancel().await.expect("close");
    assert!(bridge.wait().await.expect("bridge exits").success());
}

fn bridge_sessions(runtime: &Path, n: usize) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), async {
            for _ in 0..n {
                bridge_session(runtime).await;
            }
        })
        .await
        .expect("bridge sessions within 120 s");
    });
}

#[test]
fn six_hundred_statuses_and_forty_bridges_leave_nothing_behind() {
    let units = tempfile::tempdir().expect("tempdir");
    demo_unit(units.path());
    let mut d = daemon_with_nofile(units.path(), "256:256");
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    let pid = d.pid();
    let runtime = runtime_dir(&d);
    assert_eq!(
        nofile(pid),
        ("256".into(), "256".into()),
        "the daemon runs under the test's limit"
    );

    // The fds before any client; then a warm-up (allocator arenas, tokio's
    // threads) after which the RSS baseline is taken.
    let base_fds = fds(pid);
    statuses(&runtime, 20, 2);
    bridge_sessions(&runtime, 2);
    wait_for_fds(&mut d, base_fds, "after the warm-up");
    let base_rss = rss_kib(pid);

    // Each of these left an fd and ~24 KiB behind: 640 of them exceed the
    // limit of 256 three times over.
    statuses(&runtime, 600, 4);
    bridge_sessions(&runtime, 40);
    wait_for_fds(&mut d, base_fds, "once every client is gone");
    let rss = rss_kib(pid);
    assert!(
        rss <= base_rss + 2048,
        "RSS grew from {base_rss} KiB to {rss} KiB over 640 clients"
    );

    // With fds to spare, a killed server is respawned.
    let old = d.latest_pid("demo").expect("pid");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(old).expect("pid")).expect("pid"),
        Signal::KILL,
    )
    .expect("kill the server");
    d.wait_until("a new demo process", |d| {
        d.latest_pid("demo").is_some_and(|p| p != old)
    });
    let out = mcpctl_user(&runtime, &["status", "demo"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("running"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(d.count("Too many open files"), 0, "{}", d.seen.join("\n"));
    assert!(d.stop(Signal::TERM).success());
}

/// A D-Bus method call message to `/org/mcpd1` `org.mcpd1.Manager.ListServers`,
/// built byte by byte so each case can break exactly one thing.
struct Message {
    endian: u8,
    version: u8,
    serial: u32,
    /// The header's body length; `None`: the real one.
    body_len: Option<u32>,
    signature: Option<&'static str>,
    body: Vec<u8>,
}

impl Default for Message {
    fn default() -> Self {
        Self {
            endian: b'l',
            version: 1,
            serial: 1,
            body_len: None,
            signature: None,
            body: Vec::new(),
        }
    }
}

impl Message {
    fn bytes(&self) -> Vec<u8> {
        let mut fields: Vec<u8> = Vec::new();
        // Offsets count from the message start: the fixed header and the
        // fields array's length are 16 bytes.
        let align = |fields: &mut Vec<u8>, n: usize| {
            while !(16 + fields.len()).is_multiple_of(n) {
                fields.push(0);
            }
        };
        let mut field = |code: u8, sig: u8, value: &str| {
            align(&mut fields, 8);
            fields.extend([code, 1, sig, 0]);
            if sig == b'g' {
                fields.push(u8::try_from(value.len()).expect("short"));
            } else {
                align(&mut fields, 4);
                fields.extend(u32::try_from(value.len()).expect("len").to_le_bytes());
            }
            fields.extend(value.as_bytes());
            fields.push(0);
        };
        field(1, b'o', "/org/mcpd1");
        field(2, b's', "org.mcpd1.Manager");
        field(3, b's', "ListServers");
        if let Some(sig) = self.signature {
            field(8, b'g', sig);
        }
        let body_len = self
            .body_len
            .unwrap_or(u32::try_from(self.body.len()).expect("len"));
        let mut out = vec![self.endian, 1, 0, self.version];
        out.extend(body_len.to_le_bytes());
        out.extend(self.serial.to_le_bytes());
        out.extend(u32::try_from(fields.len()).expect("len").to_le_bytes());
        out.extend(fields);
        while !out.len().is_multiple_of(8) {
            out.push(0);
        }
        out.extend(&self.body);
        out
    }
}

/// A raw client that has passed the SASL handshake.
pub(crate) fn handshaken(socket: &Path) -> UnixStream {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let uid = rustix::process::getuid().as_raw().to_string();
    let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
    stream
        .write_all(format!("\0AUTH EXTERNAL {hex}\r\n").as_bytes())
        .expect("AUTH");
    let mut line = Vec::new();
    let mut byte = [0u8];
    while !line.ends_with(b"\r\n") {
        stream
            .read_exact(&mut byte)
            .expect("server's answer to AUTH");
        line.push(byte[0]);
    }
    assert!(
        line.starts_with(b"OK "),
        "{}",
        String::from_utf8_lossy(&line)
    );
    stream.write_all(b"BEGIN\r\n").expect("BEGIN");
    stream
}

/// Reads until the daemon closes the connection (true) or nothing comes for
/// the read timeout (false); returns what was read too.
fn read_to_close(stream: &mut UnixStream) -> (bool, Vec<u8>) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (true, seen),
            Ok(n) => seen.extend(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (true, seen),
            // A read with a timeout is not restarted after a signal.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return (false, seen),
        }
    }
}

#[test]
fn a_malformed_message_closes_that_connection_only() {
    let units = tempfile::tempdir().expect("tempdir");
    demo_unit(units.path());
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    let socket = socket(&d);
    let runtime = runtime_dir(&d);
    // Before any client.
    let base = fds(d.pid());
    assert!(status(&runtime).status.success());
    wait_for_fds(&mut d, base, "after the first status");

    // The framing is right: a well-formed call is answered and the
    // connection stays open.
    let mut good = handshaken(&socket);
    good.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    good.write_all(&Message::default().bytes()).expect("write");
    let (closed, answer) = read_to_close(&mut good);
    assert!(!closed, "a well-formed call must not close the connection");
    assert!(
        answer.windows(4).any(|w| w == b"demo"),
        "ListServers answered over the raw connection"
    );

    let cases: [(&str, Vec<u8>); 5] = [
        (
            "a body length beyond the 128 MiB limit",
            Message {
                body_len: Some(0x7fff_ffff),
                ..Message::default()
            }
            .bytes(),
        ),
        (
            "a signature that does not parse",
            Message {
                signature: Some("((("),
                ..Message::default()
            }
            .bytes(),
        ),
        (
            "serial 0",
            Message {
                serial: 0,
                ..Message::default()
            }
            .bytes(),
        ),
        (
            "protocol version 2",
            Message {
                version: 2,
                ..Message::default()
            }
            .bytes(),
        ),
        (
            "an unknown byte order",
            Message {
                endian: b'x',
                ..Message::default()
            }
            .bytes(),
        ),
    ];
    for (what, bytes) in cases {
        let mut bad = handshaken(&socket);
        bad.write_all(&bytes).expect("write");
        let (closed, _) = read_to_close(&mut bad);
        assert!(closed, "{what}: the daemon kept the connection open");
        // Others are still served, and nothing is left behind.
        assert!(status(&runtime).status.success(), "{what}: status after");
    }
    drop(good);
    wait_for_fds(&mut d, base, "after the malformed clients");
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn the_accept_loop_backs_off_when_fds_run_out() {
    let units = tempfile::tempdir().expect("tempdir");
    demo_unit(units.path());
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    let pid = d.pid();
    let socket = socket(&d);
    let (_, hard) = nofile(pid);
    let prlimit = |soft: &str| {
        let out = std::process::Command::new("prlimit")
            .args([format!("--pid={pid}"), format!("--nofile={soft}:{hard}")])
            .output()
            .expect("prlimit");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };

    // fds 0, 1 and 2 are open, so with a soft limit of 3 every new fd fails.
    prlimit("3");
    let pending = UnixStream::connect(&socket).expect("connect (into the backlog)");
    d.wait_for("out of file descriptors");
    let before = cpu(pid);
    // The measurement window (the log is read meanwhile).
    let window = Instant::now();
    d.wait_until("the 2 s window", |_| {
        window.elapsed() >= Duration::from_secs(2)
    });
    let spent = cpu(pid).saturating_sub(before);
    assert!(
        spent < Duration::from_millis(50),
        "the daemon spent {spent:?} of CPU in 2 s without fds"
    );
    assert_eq!(
        d.count("cannot accept clients"),
        1,
        "logged once: {}",
        d.seen.join("\n")
    );

    // fds free again: the pending client is served.
    prlimit(&hard);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let conn = zbus::connection::Builder::unix_stream(pending)
                .p2p()
                .build()
                .await
                .expect("handshake once accepted");
            let manager = mcpd::dbus::ManagerProxy::new(&conn).await.expect("proxy");
            assert_eq!(manager.list_servers().await.expect("ListServers").len(), 1);
        })
        .await
        .expect("the pending client is served within 30 s");
    });
    d.wait_for("accepting clients on");
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn servers_get_the_soft_fd_limit_the_daemon_was_given() {
    let units = tempfile::tempdir().expect("tempdir");
    demo_unit(units.path());
    let mut d = daemon_with_nofile(units.path(), "1024:4096");
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    assert_eq!(
        nofile(d.pid()),
        ("4096".into(), "4096".into()),
        "the daemon raised its soft limit to the hard one"
    );
    let child = d.latest_pid("demo").expect("pid");
    assert!(alive(child));
    assert_eq!(
        nofile(child),
        ("1024".into(), "4096".into()),
        "the server starts with the daemon's original soft limit"
    );
    assert!(d.stop(Signal::TERM).success());
}

#[test]
fn a_caller_that_disconnects_mid_call_cancels_it() {
    let units = tempfile::tempdir().expect("tempdir");
    demo_unit(units.path());
    let mut d = Daemon::user_no_bus(units.path(), &[]);
    d.wait_until("demo running", |d| d.latest_pid("demo").is_some());
    let socket = socket(&d);
    let base = fds(d.pid());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let conn = rt.block_on(async {
        let (conn, server) = crate::helper::private_server(&socket, "demo").await;
        tokio::spawn(async move {
            // Never answered: the connection closes under it.
            let _call = server.call_tool("hang", "{}").await;
        });
        conn
    });
    d.wait_for("call hang");
    rt.block_on(async { conn.close().await.expect("close") });
    // Without the cancellation the call (and the connection, its fd and
    // its objects) would live until CallTool's 120 s timeout.
    d.wait_for("hang cancelled");
    let uid = rustix::process::getuid().as_raw();
    let pid = std::process::id();
    d.wait_until("the abandoned call accounted for, to this process", |d| {
        d.seen.iter().any(|l| {
            l.contains(&format!(
                "tools/call hang by uid {uid} pid {pid}: cancelled: the caller left"
            ))
        })
    });
    wait_for_fds(&mut d, base, "after the caller left");
    drop(rt);
    assert!(d.stop(Signal::TERM).success());
}
