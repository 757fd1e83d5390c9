//! The HTTP endpoint (DESIGN §15) through the real `mcpd`: its settings
//! file (`mcpd.kdl`), read at start and on reload.

use std::path::Path;

use crate::helper::Daemon;

use super::tokens::token;

/// A user daemon on `units` with `--config settings`.
fn daemon(units: &Path, settings: &Path) -> Daemon {
    daemon_with(units, settings, &[])
}

fn daemon_with(units: &Path, settings: &Path, env: &[(&str, &std::ffi::OsStr)]) -> Daemon {
    Daemon::start(
        &[
            "--user".as_ref(),
            "--no-bus".as_ref(),
            "--units".as_ref(),
            units.as_os_str(),
            "--config".as_ref(),
            settings.as_os_str(),
        ],
        env,
    )
}

#[test]
fn auth_none_on_an_address_that_is_not_loopback_refuses_to_start_naming_the_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = dir.path().join("mcpd.kdl");
    std::fs::write(
        &settings,
        "http {\n    listen \"127.0.0.1:0\"\n    listen \"0.0.0.0:0\"\n    auth \"none\"\n}\n",
    )
    .expect("write");
    let d = daemon(dir.path(), &settings);
    let (status, lines) = d.stop_logged(rustix::process::Signal::CONT);
    assert!(!status.success(), "{lines:?}");
    let want = format!(
        "{}:3:12: `auth \"none\"` with `listen` 0.0.0.0:0, which is not loopback",
        settings.display()
    );
    assert!(lines.iter().any(|l| l.contains(&want)), "{lines:#?}");

    // A named file must exist.
    let d = daemon(dir.path(), &dir.path().join("missing.kdl"));
    let (status, lines) = d.stop_logged(rustix::process::Signal::CONT);
    assert!(!status.success(), "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("missing.kdl: cannot read settings file")),
        "{lines:#?}"
    );
}

#[test]
fn a_changed_listen_rebinds_and_a_broken_settings_file_keeps_the_last_good_settings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let units = tempfile::tempdir().expect("tempdir");
    let settings = dir.path().join("mcpd.kdl");
    std::fs::write(&settings, "http {\n    listen \"127.0.0.1:0\"\n}\n").expect("write");
    let mut d = daemon(units.path(), &settings);
    d.wait_for("HTTP endpoint on 127.0.0.1:0, auth token, at most 256 sessions");
    d.wait_for("started 0 units");
    std::fs::write(&settings, "http {\n    max-sesions 3\n}\n").expect("write");
    let line = d.wait_for("keeping the last good settings");
    assert!(
        line.contains(&format!(
            "{}:2:5: unknown key `max-sesions` in `http`",
            settings.display()
        )),
        "{line}"
    );
    std::fs::write(
        &settings,
        "http {\n    listen \"127.0.0.1:0\"\n    max-sessions 3\n}\n",
    )
    .expect("write");
    d.wait_for("HTTP endpoint on 127.0.0.1:0, auth token, at most 3 sessions");
    // A changed listen rebinds: the new port answers, the old is closed.
    let old: std::net::SocketAddr = d
        .seen
        .iter()
        .find_map(|l| l.split("HTTP endpoint listening on ").nth(1))
        .and_then(|a| a.trim().parse().ok())
        .expect("the first address");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    std::fs::write(
        &settings,
        format!("http {{\n    listen \"127.0.0.1:{port}\"\n    max-sessions 3\n}}\n"),
    )
    .expect("write");
    d.wait_for(&format!("HTTP endpoint listening on 127.0.0.1:{port}"));
    let new = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    // `auth "token"` (the default): nothing passes without one.
    let (status, headers, _) = request(new, "POST", "/mcp/x", &JSON, INITIALIZE.as_bytes());
    assert_eq!(status, 401);
    assert_eq!(
        header(&headers, "www-authenticate"),
        Some("Bearer realm=\"mcpd\"")
    );
    assert!(
        d.wait_for("refused a request to /mcp/x: no token")
            .contains("127.0.0.1:")
    );
    assert!(
        std::net::TcpStream::connect(old).is_err(),
        "{old} still listens"
    );
    // No `http` section: no endpoint.
    std::fs::write(&settings, "").expect("write");
    d.wait_for("HTTP endpoint stopped");
    assert!(
        std::net::TcpStream::connect(new).is_err(),
        "{new} still listens"
    );
}

/// A user daemon on `units` whose `mcpd.kdl` is `settings` (listening on
/// an ephemeral port), and the address its endpoint logged.
fn endpoint(units: &Path, settings: &str) -> (Daemon, tempfile::TempDir, std::net::SocketAddr) {
    endpoint_with(units, settings, &[])
}

pub(crate) fn endpoint_with(
    units: &Path,
    settings: &str,
    env: &[(&str, &std::ffi::OsStr)],
) -> (Daemon, tempfile::TempDir, std::net::SocketAddr) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("mcpd.kdl");
    std::fs::write(&file, settings).expect("write");
    let mut d = daemon_with(units, &file, env);
    let line = d.wait_for("HTTP endpoint listening on ");
    let addr = line
        .rsplit("listening on ")
        .next()
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (d, dir, addr)
}

/// Runs `tests/data/fidelity.py` with `args`: every check's outcome.
fn fidelity(args: &[&str], token: Option<&str>) -> serde_json::Value {
    let env: Vec<(&str, &str)> = token.map(|t| ("MCPD_TOKEN", t)).into_iter().collect();
    crate::daemon::fidelity::fidelity_with(args, None, &env)
}

/// A unit file for the reference server.
fn everything_unit(units: &Path) {
    let server = crate::daemon::fidelity::everything();
    std::fs::write(
        units.join("everything.kdl"),
        format!(
            "stdio {{\n    command \"node\" \"{}\" \"stdio\"\n}}\n",
            server.display()
        ),
    )
    .expect("write");
}

#[test]
fn the_official_sdks_streamable_http_clients_get_what_they_get_directly_and_through_the_bridge() {
    let units = tempfile::tempdir().expect("tempdir");
    everything_unit(units.path());
    let state = tempfile::tempdir().expect("tempdir");
    let token = token(state.path(), &["new", "host"]);
    let (mut d, _dir, addr) = endpoint_with(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n}\n",
        &[("MCPD_STATE_DIR", state.path().as_os_str())],
    );
    d.wait_until("17 tools", |d| {
        let runtime = d.runtime_dir().expect("runtime");
        let out = crate::helper::mcpctl_user(runtime, &["tools", "everything"]);
        String::from_utf8_lossy(&out.stdout).lines().count() >= 17
    });
    let server = crate::daemon::fidelity::everything();
    let server = server.to_str().expect("utf-8");
    let direct = fidelity(&["node", server, "stdio"], None);
    for (check, outcome) in direct.as_object().expect("object") {
        assert!(
            !outcome.as_str().is_some_and(|o| o.starts_with("error")),
            "{check} fails even directly: {outcome}"
        );
    }
    let url = format!("http://{addr}/mcp/everything");
    let over_http = fidelity(&["--http", &url], Some(&token));
    for (check, outcome) in direct.as_object().expect("object") {
        assert_eq!(&over_http[check], outcome, "{check} differs over HTTP");
    }
    assert_eq!(direct, over_http);

    // The TypeScript SDK's StreamableHTTPClientTransport gets what the same
    // host gets through the bridge.
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let ts = |target: &[&str]| {
        let out = std::process::Command::new("node")
            .arg(crate::helper::root().join("tests/data/ts_client.mjs"))
            .arg(crate::helper::root().join("target/npm/node_modules"))
            .args(target)
            .env("XDG_RUNTIME_DIR", &runtime)
            .env("MCPD_TOKEN", &token)
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .env_remove("MCPD_RUNTIME_DIR")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("node");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("one JSON object")
    };
    let mcpctl = env!("CARGO_BIN_EXE_mcpctl");
    let bridged = ts(&[mcpctl, "--user", "bridge", "everything"]);
    let over_http = ts(&[&url]);
    assert_eq!(over_http["sampling"], true, "{over_http}");
    assert_eq!(bridged, over_http);
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`):
/// the status, the headers (lowercase names) and the body.
pub(crate) fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("write");
    // A refused body may not be read: the answer counts, not the write.
    let _ = stream.write_all(body);
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

pub(crate) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

pub(crate) const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
pub(crate) const JSON: [(&str, &str); 2] = [
    ("Content-Type", "application/json"),
    ("Accept", "application/json"),
];

#[test]
fn bad_input_gets_http_and_json_rpc_errors_and_leaves_sessions_alone() {
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("fixture.kdl"),
        "group \"g\"\nstdio {\n    command \"mcp-fixture\"\n}\n",
    )
    .expect("write");
    let (mut d, _dir, addr) = endpoint(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n    auth \"none\"\n    max-sessions 3\n    allow-origin \"https://app.example\"\n}\n",
    );
    d.wait_for("running (pid");
    // A session, in JSON mode.
    let (status, headers, body) =
        request(addr, "POST", "/mcp/fixture", &JSON, INITIALIZE.as_bytes());
    assert_eq!(status, 200, "{body}");
    let session = header(&headers, "mcp-session-id")
        .expect("session id")
        .to_owned();
    assert_eq!(session.len(), 32, "{session}");
    assert!(
        body.contains("\"protocolVersion\":\"2025-11-25\""),
        "{body}"
    );
    let with_session = |extra: &[(&'static str, &str)]| -> Vec<(&'static str, String)> {
        let mut h: Vec<(&str, String)> = JSON.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        h.push(("Mcp-Session-Id", session.clone()));
        h.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
        h
    };
    let call = |h: &[(&'static str, String)], body: &str| {
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        request(addr, "POST", "/mcp/fixture", &h, body.as_bytes())
    };
    let (status, _, _) = call(
        &with_session(&[]),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert_eq!(status, 202);
    let ping = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let (status, _, body) = call(&with_session(&[]), ping);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"tools\""), "{body}");

    // Malformed JSON: a JSON-RPC parse error.
    let (status, _, body) = call(&with_session(&[]), "{\"jsonrpc\": ");
    assert_eq!(status, 400);
    assert!(body.contains("-32700"), "{body}");
    // A foreign origin: 403; a listed one gets CORS headers.
    let (status, _, _) = call(&with_session(&[("Origin", "https://evil.example")]), ping);
    assert_eq!(status, 403);
    assert!(
        d.wait_for("refused a request from origin")
            .contains("https://evil.example")
    );
    let (status, headers, _) = call(&with_session(&[("Origin", "https://app.example")]), ping);
    assert_eq!(status, 200);
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        Some("https://app.example")
    );
    // 17 MiB announced: 413 before the body is read.
    let big = vec![b' '; 17 << 20];
    let h: Vec<(&str, &str)> = JSON.to_vec();
    let (status, _, _) = request(addr, "POST", "/mcp/fixture", &h, &big);
    assert_eq!(status, 413);
    // An unknown session: 404; no session on a request that is not
    // initialize: 400; an unknown server: 404.
    let mut h: Vec<(&str, &str)> = JSON.to_vec();
    h.push(("Mcp-Session-Id", "00000000000000000000000000000000"));
    let (status, _, _) = request(addr, "POST", "/mcp/fixture", &h, ping.as_bytes());
    assert_eq!(status, 404);
    let (status, _, _) = request(addr, "POST", "/mcp/fixture", &JSON, ping.as_bytes());
    assert_eq!(status, 400);
    let (status, _, body) = request(addr, "POST", "/mcp/nope", &JSON, INITIALIZE.as_bytes());
    assert_eq!(status, 404);
    assert!(body.contains("no server named nope"), "{body}");
    // An aggregate: tools named UNIT__NAME.
    let (status, headers, _) = request(addr, "POST", "/mcp/@g", &JSON, INITIALIZE.as_bytes());
    assert_eq!(status, 200);
    let group = header(&headers, "mcp-session-id").expect("id").to_owned();
    let mut h: Vec<(&str, &str)> = JSON.to_vec();
    h.push(("Mcp-Session-Id", &group));
    let (status, _, body) = request(addr, "POST", "/mcp/@g", &h, ping.as_bytes());
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"fixture__"), "{body}");
    // A session is used only on its own path.
    let (status, _, _) = request(addr, "POST", "/mcp/fixture", &h, ping.as_bytes());
    assert_eq!(status, 404);
    // max-sessions 3 (with the aggregate's): the fourth is 503 until one ends.
    let mut others = Vec::new();
    for _ in 0..1 {
        let (status, headers, _) =
            request(addr, "POST", "/mcp/fixture", &JSON, INITIALIZE.as_bytes());
        assert_eq!(status, 200);
        others.push(header(&headers, "mcp-session-id").expect("id").to_owned());
    }
    let (status, _, body) = request(addr, "POST", "/mcp/fixture", &JSON, INITIALIZE.as_bytes());
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("more than 3 HTTP sessions"), "{body}");
    // DELETE ends a session: its id is 404 from then on, and its slot free.
    let mut h: Vec<(&str, &str)> = JSON.to_vec();
    h.push(("Mcp-Session-Id", &others[0]));
    let (status, _, _) = request(addr, "DELETE", "/mcp/fixture", &h, b"");
    assert_eq!(status, 200);
    let (status, _, _) = request(addr, "POST", "/mcp/fixture", &h, ping.as_bytes());
    assert_eq!(status, 404);
    let (status, _, _) = request(addr, "POST", "/mcp/fixture", &JSON, INITIALIZE.as_bytes());
    assert_eq!(status, 200);
    // Status shows the endpoint: the first, the aggregate's, the last.
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let status = crate::helper::mcpctl_user(&runtime, &["status"]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.contains(&format!("\nHTTP: {addr}, 3 sessions\n")),
        "{status}"
    );
    // The first session was never disturbed.
    let (status, _, body) = call(&with_session(&[]), ping);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"tools\""), "{body}");
}

#[test]
fn a_client_that_sends_its_headers_slowly_is_cut_off_at_the_deadline() {
    use std::io::{Read, Write};
    let units = tempfile::tempdir().expect("tempdir");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("mcpd.kdl");
    std::fs::write(
        &file,
        "http {\n    listen \"127.0.0.1:0\"\n    auth \"none\"\n}\n",
    )
    .expect("write");
    let mut d = daemon_with(
        units.path(),
        &file,
        &[("MCPD_HTTP_READ_TIMEOUT", "1s".as_ref())],
    );
    let line = d.wait_for("HTTP endpoint listening on ");
    let addr: std::net::SocketAddr = line
        .rsplit("listening on ")
        .next()
        .and_then(|a| a.trim().parse().ok())
        .expect("address");
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    let started = std::time::Instant::now();
    let request = b"POST /mcp/x HTTP/1.1\r\nHost: h\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut cut = false;
    for byte in request {
        if stream.write_all(&[*byte]).is_err() {
            cut = true;
            break;
        }
        // (scenario: a client that sends a byte every 100 ms)
        std::thread::sleep(std::time::Duration::from_millis(100));
        // Closed by the daemon: a read returns at once.
        stream.set_nonblocking(true).expect("nonblocking");
        let mut buf = [0u8; 512];
        let read = stream.read(&mut buf);
        stream.set_nonblocking(false).expect("blocking");
        if read.is_ok() {
            cut = true;
            break;
        }
    }
    let took = started.elapsed();
    assert!(cut, "the slow client was never cut off");
    assert!(
        took >= std::time::Duration::from_millis(900) && took < std::time::Duration::from_secs(5),
        "cut off after {took:?}"
    );
}

/// Binds a listening socket on an ephemeral loopback port, writes the
/// port to the file `argv[1]`, and execs `argv[2:]` with the socket as
/// descriptor 3 and `LISTEN_FDS`, as a service manager does.
const ACTIVATE: &str = r#"
import os, socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(64)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(s.getsockname()[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
if s.fileno() != 3:
    os.dup2(s.fileno(), 3)
os.set_inheritable(3, True)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1", LISTEN_FDNAMES="http")
os.execv(sys.argv[2], sys.argv[2:])
"#;

#[test]
fn a_socket_activated_daemon_serves_the_passed_socket() {
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("a.kdl"),
        "stdio {\n    command \"mcp-fixture\"\n}\n",
    )
    .expect("write");
    let state = tempfile::tempdir().expect("tempdir");
    let token = token(state.path(), &["new", "host"]);
    // No `http` section: the passed socket is served with the defaults
    // (tokens).
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = dir.path().join("mcpd.kdl");
    std::fs::write(&settings, "").expect("write");
    let port_file = dir.path().join("port");
    let mut d = Daemon::start_binary(
        Path::new("python3"),
        &[
            "-c".as_ref(),
            ACTIVATE.as_ref(),
            port_file.as_os_str(),
            env!("CARGO_BIN_EXE_mcpd").as_ref(),
            "--user".as_ref(),
            "--no-bus".as_ref(),
            "--units".as_ref(),
            units.path().as_os_str(),
            "--config".as_ref(),
            settings.as_os_str(),
        ],
        &[("MCPD_STATE_DIR", state.path().as_os_str())],
    );
    d.wait_for("socket-activated");
    let line = d.wait_for("HTTP endpoint listening on ");
    d.wait_for("running (pid");
    let port: u16 = std::fs::read_to_string(&port_file)
        .expect("port")
        .parse()
        .expect("a port");
    assert!(line.ends_with(&format!("127.0.0.1:{port}")), "{line}");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    assert_eq!(
        request(addr, "POST", "/mcp/a", &JSON, INITIALIZE.as_bytes()).0,
        401
    );
    let auth = format!("Bearer {token}");
    let mut h: Vec<(&str, &str)> = JSON.to_vec();
    h.push(("Authorization", &auth));
    let (status, _, body) = request(addr, "POST", "/mcp/a", &h, INITIALIZE.as_bytes());
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"serverInfo\""), "{body}");
}

/// `tests/data/era_client.py [--input] MODE everything TARGET…`: what a
/// host of that era gets.
fn era(input: bool, mode: &str, target: &[&str], runtime: &Path) -> serde_json::Value {
    let mut cmd = std::process::Command::new("python3");
    cmd.env("XDG_RUNTIME_DIR", runtime)
        .env_remove("MCPD_RUNTIME_DIR")
        .env_remove("DBUS_SESSION_BUS_ADDRESS");
    cmd.arg(crate::helper::root().join("tests/data/era_client.py"));
    if input {
        cmd.arg("--input");
    }
    let out = cmd
        .args([mode, "everything"])
        .args(target)
        .env("PYTHONWARNINGS", "ignore")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn a_host_of_2026_07_28_gets_over_http_what_it_gets_through_the_bridge() {
    let units = tempfile::tempdir().expect("tempdir");
    everything_unit(units.path());
    let (mut d, _dir, addr) = endpoint(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n    auth \"none\"\n}\n",
    );
    d.wait_for("running (pid");
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let url = format!("http://{addr}/mcp/everything");
    let bridge = [
        env!("CARGO_BIN_EXE_mcpctl"),
        "--user",
        "bridge",
        "everything",
    ];
    // Without a session: each request a host session of its own; the
    // server's questions come as input_required results, whose retry
    // reaches the session that parked the call.
    for (input, mode) in [(false, "2026-07-28"), (true, "2026-07-28"), (false, "auto")] {
        let bridged = era(input, mode, &bridge, &runtime);
        let over_http = era(input, mode, &[&url], &runtime);
        assert!(!over_http.to_string().contains("\"error: "), "{over_http}");
        assert_eq!(bridged, over_http, "{mode} (input: {input})");
        assert_eq!(over_http["protocol"], "2026-07-28", "{over_http}");
    }
    // A request whose headers do not say what its body does: -32020.
    let body = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"message":"x"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
    let mut h: Vec<(&str, &str)> = JSON.to_vec();
    h.extend([
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
    ]);
    // An unpadded base64 value is malformed (SEP-2243's table): -32020.
    for name in ["get-env", "=?base64?ZWNobw?=", "=?base64?ZWNobw==?="] {
        let mut h = h.clone();
        h.push(("Mcp-Name", name));
        let (status, _, answer) = request(addr, "POST", "/mcp/everything", &h, body.as_bytes());
        if name != "=?base64?ZWNobw==?=" {
            assert_eq!(status, 400, "{answer}");
            assert!(
                answer.contains("-32020") && answer.contains("\"id\":7"),
                "{answer}"
            );
        } else {
            // "echo" in base64: it matches, and the call is answered.
            assert_eq!(status, 200, "{answer}");
            assert!(answer.contains("Echo: x"), "{answer}");
        }
    }
}

#[test]
fn a_reload_that_removes_a_unit_ends_its_http_sessions() {
    let units = tempfile::tempdir().expect("tempdir");
    let unit = units.path().join("a.kdl");
    std::fs::write(&unit, "stdio {\n    command \"mcp-fixture\"\n}\n").expect("write");
    let (mut d, _dir, addr) = endpoint(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n    auth \"none\"\n}\n",
    );
    d.wait_for("running (pid");
    let (status, headers, _) = request(addr, "POST", "/mcp/a", &JSON, INITIALIZE.as_bytes());
    assert_eq!(status, 200);
    let session = header(&headers, "mcp-session-id").expect("id").to_owned();
    let stream = get_stream(addr, "/mcp/a", &session, "");
    std::fs::remove_file(&unit).expect("remove");
    stream_ends(stream);
    let line = d.wait_for("ended: a ended the session");
    assert!(line.contains(&session), "{line}");
    let mut h: Vec<(&str, &str)> = JSON.to_vec();
    h.push(("Mcp-Session-Id", &session));
    let ping = r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;
    assert_eq!(request(addr, "POST", "/mcp/a", &h, ping.as_bytes()).0, 404);
}

#[test]
fn refusals_are_logged_within_a_rate_limit() {
    let units = tempfile::tempdir().expect("tempdir");
    let (mut d, _dir, addr) = endpoint(units.path(), "http {\n    listen \"127.0.0.1:0\"\n}\n");
    d.wait_for("started 0 units");
    for _ in 0..150 {
        assert_eq!(
            request(addr, "POST", "/mcp/a", &JSON, INITIALIZE.as_bytes()).0,
            401
        );
    }
    // Every refusal was logged before its answer; a reload's line comes
    // after them all.
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    assert!(
        crate::helper::mcpctl_user(&runtime, &["reload"])
            .status
            .success()
    );
    d.wait_for("reloaded:");
    assert_eq!(d.count("refused a request to /mcp/a: no token"), 100);
}

/// Opens session `session`'s GET stream (with the header lines `extra`)
/// and reads its answer's head, which must be 200, and its first event,
/// which must be a priming event (SEP-1699): the id the stream resumes
/// from (the `Last-Event-ID` of `extra`, else the new stream's `N-0`),
/// empty data and a `retry:` field.
pub(crate) fn get_stream(
    addr: std::net::SocketAddr,
    path: &str,
    session: &str,
    extra: &str,
) -> std::net::TcpStream {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n{extra}Mcp-Session-Id: {session}\r\n\r\n"
    )
    .expect("write");
    read_ok_head(&mut stream);
    let (id, data, retry) = read_event(&mut stream);
    assert_eq!(
        (data.as_str(), retry.as_deref()),
        ("", Some("1000")),
        "not a priming event"
    );
    match extra
        .lines()
        .find_map(|l| l.strip_prefix("Last-Event-ID: "))
    {
        Some(resumed) => assert_eq!(id, resumed.trim(), "the priming event's id"),
        None => assert!(id.ends_with("-0"), "a new stream's priming id: {id}"),
    }
    stream
}

/// Reads a response's head off `stream`, byte by byte (its body is left
/// to read), and checks that it is `200`.
fn read_ok_head(stream: &mut std::net::TcpStream) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(read_byte(stream, &mut byte).expect("read"), 1, "{head:?}");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
}

/// One byte of `stream`, read again when a signal interrupted the read
/// (other tests' children exit while this one reads).
fn read_byte(stream: &mut std::net::TcpStream, byte: &mut [u8; 1]) -> std::io::Result<usize> {
    use std::io::Read;
    loop {
        match stream.read(byte) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Reads `stream` until its last chunk (the stream ended; the connection
/// stays usable), within its read timeout.
pub(crate) fn stream_ends(mut stream: std::net::TcpStream) {
    let mut rest = Vec::new();
    let mut byte = [0u8; 1];
    while !rest.ends_with(b"0\r\n\r\n") {
        match read_byte(&mut stream, &mut byte) {
            Ok(1) => rest.push(byte[0]),
            other => panic!("the stream did not end: {other:?} after {rest:?}"),
        }
    }
}

/// Reads the next SSE event of an open stream (one chunk of its chunked
/// body): its `id` and its `data`.
fn next_event(stream: &mut std::net::TcpStream) -> (String, String) {
    let (id, data, _) = read_event(stream);
    (id, data)
}

/// As [`next_event`], with its `retry:` field if it has one.
fn read_event(stream: &mut std::net::TcpStream) -> (String, String, Option<String>) {
    use std::io::Read;
    let mut size = Vec::new();
    let mut byte = [0u8; 1];
    while !size.ends_with(b"\r\n") {
        assert_eq!(read_byte(stream, &mut byte).expect("read"), 1, "{size:?}");
        size.push(byte[0]);
    }
    let size = std::str::from_utf8(&size).expect("utf-8");
    let size = usize::from_str_radix(size.trim(), 16).expect("a chunk size");
    assert!(size > 0, "the stream ended");
    let mut chunk = vec![0u8; size + 2];
    stream.read_exact(&mut chunk).expect("read");
    let text = String::from_utf8_lossy(&chunk[..size]).into_owned();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {text:?}"))
            .to_owned()
    };
    let retry = text
        .lines()
        .find_map(|l| l.strip_prefix("retry: "))
        .map(str::to_owned);
    (field("id: "), field("data: "), retry)
}

/// A fixture unit `a` that can `touch` (notify `resources/updated`), a
/// daemon serving it over HTTP, and an initialized session.
/// A daemon serving one fixture unit `a` offering `tools`, on an
/// endpoint without tokens, once the unit runs: the daemon, the units'
/// and the settings' directories, the address.
fn fixture_endpoint(
    tools: &str,
) -> (
    Daemon,
    tempfile::TempDir,
    tempfile::TempDir,
    std::net::SocketAddr,
) {
    let units = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        units.path().join("a.kdl"),
        format!("stdio {{\n    command \"mcp-fixture\" \"--chatter\" \"0\"\n    env MCP_FIXTURE_TOOLS=\"{tools}\"\n}}\n"),
    )
    .expect("write");
    let (mut d, dir, addr) = endpoint(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n    auth \"none\"\n}\n",
    );
    d.wait_for("running (pid");
    (d, units, dir, addr)
}

fn touching() -> (
    Daemon,
    tempfile::TempDir,
    tempfile::TempDir,
    std::net::SocketAddr,
    String,
) {
    let (d, units, dir, addr) = fixture_endpoint("touch");
    let (status, headers, body) = request(addr, "POST", "/mcp/a", &JSON, INITIALIZE.as_bytes());
    assert_eq!(status, 200, "{body}");
    let session = header(&headers, "mcp-session-id").expect("id").to_owned();
    (d, units, dir, addr, session)
}

/// A POSTed request of `session`, answered as JSON: the answer.
fn call(addr: std::net::SocketAddr, session: &str, id: u64, method: &str, params: &str) -> String {
    let mut h: Vec<(&str, &str)> = JSON.to_vec();
    h.push(("Mcp-Session-Id", session));
    let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#);
    let (status, _, answer) = request(addr, "POST", "/mcp/a", &h, body.as_bytes());
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("\"result\""), "{answer}");
    answer
}

fn subscribe(addr: std::net::SocketAddr, session: &str, id: u64, uri: &str) {
    call(
        addr,
        session,
        id,
        "resources/subscribe",
        &format!(r#"{{"uri":"{uri}"}}"#),
    );
}

fn touch(addr: std::net::SocketAddr, session: &str, id: u64, uri: &str) {
    call(
        addr,
        session,
        id,
        "tools/call",
        &format!(r#"{{"name":"touch","arguments":{{"uri":"{uri}"}}}}"#),
    );
}

/// The `uri` of a `notifications/resources/updated`.
fn updated(data: &str) -> String {
    let message: serde_json::Value = serde_json::from_str(data).expect("JSON");
    assert_eq!(
        message["method"], "notifications/resources/updated",
        "{data}"
    );
    message["params"]["uri"].as_str().expect("uri").to_owned()
}

fn event_seq(id: &str) -> u64 {
    id.split_once('-')
        .and_then(|(_, seq)| seq.parse().ok())
        .unwrap_or_else(|| panic!("not STREAM-SEQ: {id}"))
}

#[test]
fn a_dropped_stream_resumed_with_last_event_id_gets_what_it_missed_once_in_order() {
    let (_d, _units, _dir, addr, session) = touching();
    for (n, uri) in [
        "fixture://0",
        "fixture://1",
        "fixture://2",
        "fixture://3",
        "fixture://4",
    ]
    .into_iter()
    .enumerate()
    {
        subscribe(addr, &session, 10 + n as u64, uri);
    }
    let mut stream = get_stream(addr, "/mcp/a", &session, "");
    touch(addr, &session, 20, "fixture://0");
    let (last, data) = next_event(&mut stream);
    assert_eq!(updated(&data), "fixture://0");
    // The client goes; the server goes on sending.
    drop(stream);
    for (n, uri) in ["fixture://1", "fixture://2", "fixture://3"]
        .into_iter()
        .enumerate()
    {
        touch(addr, &session, 21 + n as u64, uri);
    }
    let mut stream = get_stream(
        addr,
        "/mcp/a",
        &session,
        &format!("Last-Event-ID: {last}\r\n"),
    );
    let mut seqs = vec![event_seq(&last)];
    for uri in ["fixture://1", "fixture://2", "fixture://3"] {
        let (id, data) = next_event(&mut stream);
        assert_eq!(updated(&data), uri);
        seqs.push(event_seq(&id));
    }
    // The stream goes on: the next event is new, nothing comes twice.
    touch(addr, &session, 30, "fixture://4");
    let (id, data) = next_event(&mut stream);
    assert_eq!(updated(&data), "fixture://4");
    seqs.push(event_seq(&id));
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");

    // An id this endpoint never gave out: 400.
    let h = [
        ("Accept", "text/event-stream"),
        ("Mcp-Session-Id", session.as_str()),
        ("Last-Event-ID", "nonsense"),
    ];
    assert_eq!(request(addr, "GET", "/mcp/a", &h, b"").0, 400);
}

#[test]
fn what_a_client_that_never_comes_back_leaves_is_bounded_and_the_loss_is_logged() {
    let (mut d, _units, _dir, addr, session) = touching();
    subscribe(addr, &session, 2, "fixture://n");
    let mut stream = get_stream(addr, "/mcp/a", &session, "");
    touch(addr, &session, 3, "fixture://n");
    let (first, _) = next_event(&mut stream);
    drop(stream);
    // More events than the buffer keeps.
    let limit = mcpd::endpoint::session::REPLAY_EVENTS;
    for n in 0..limit + 20 {
        touch(addr, &session, 100 + n as u64, "fixture://n");
    }
    let mut stream = get_stream(
        addr,
        "/mcp/a",
        &session,
        &format!("Last-Event-ID: {first}\r\n"),
    );
    let mut last = first.clone();
    for _ in 0..limit {
        let (id, data) = next_event(&mut stream);
        assert_eq!(updated(&data), "fixture://n");
        assert!(event_seq(&id) > event_seq(&last), "{id} after {last}");
        last = id;
    }
    d.wait_for("fell out of the replay buffer");
    // Exactly the newest `limit`: the next event is a new one.
    subscribe(addr, &session, 1000, "fixture://marker");
    touch(addr, &session, 1001, "fixture://marker");
    let (id, data) = next_event(&mut stream);
    assert_eq!(updated(&data), "fixture://marker");
    drop(stream);

    // Bytes: large events (URIs of 8000 bytes: an event of about 8.1 KiB),
    // more than the buffer's bytes: only the newest that fit are kept.
    let big = format!("fixture://{}", "b".repeat(8000));
    subscribe(addr, &session, 2000, &big);
    let bytes = mcpd::endpoint::session::REPLAY_BYTES;
    let sent = bytes / 8000 + 20;
    for n in 0..sent {
        touch(addr, &session, 2001 + n as u64, &big);
    }
    let mut stream = get_stream(
        addr,
        "/mcp/a",
        &session,
        &format!("Last-Event-ID: {id}\r\n"),
    );
    touch(addr, &session, 9000, "fixture://marker");
    let mut kept = 0;
    loop {
        let (_, data) = next_event(&mut stream);
        if updated(&data) == "fixture://marker" {
            break;
        }
        assert_eq!(updated(&data), big);
        kept += 1;
    }
    assert!(
        (bytes / 8200..=bytes / 8000).contains(&kept),
        "{kept} of {sent} events of 8.1 KiB kept within {bytes} bytes"
    );
}

#[test]
fn a_request_without_a_session_on_a_per_host_unit_is_refused_and_an_auto_client_opens_a_session() {
    let units = tempfile::tempdir().expect("tempdir");
    everything_unit(units.path());
    let file = units.path().join("everything.kdl");
    let unit = std::fs::read_to_string(&file).expect("read");
    std::fs::write(&file, format!("{unit}sessions \"per-host\"\n")).expect("write");
    let (mut d, _dir, addr) = endpoint(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n    auth \"none\"\n}\n",
    );
    d.wait_for("running (pid");
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let instances = || {
        let out = crate::helper::mcpctl_user(&runtime, &["status", "everything"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find_map(|l| l.trim().strip_prefix("Instances: "))
            .unwrap_or_else(|| panic!("no Instances line in {text}"))
            .to_owned()
    };
    // Stateless requests (discover, a call): -32022 naming the 2025
    // versions, and why; no instance is started for them.
    let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
    for (method, name, params) in [
        ("server/discover", None, format!("{{{meta}}}")),
        (
            "tools/call",
            Some("echo"),
            format!(r#"{{"name":"echo","arguments":{{"message":"x"}},{meta}}}"#),
        ),
    ] {
        let mut h: Vec<(&str, &str)> = JSON.to_vec();
        h.extend([
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", method),
        ]);
        if let Some(name) = name {
            h.push(("Mcp-Name", name));
        }
        let body = format!(r#"{{"jsonrpc":"2.0","id":5,"method":"{method}","params":{params}}}"#);
        let (status, _, answer) = request(addr, "POST", "/mcp/everything", &h, body.as_bytes());
        // The status the 2026-07-28 wire gives -32022.
        assert_eq!(status, 400, "{answer}");
        let answer: serde_json::Value = serde_json::from_str(&answer).expect("JSON");
        assert_eq!(answer["id"], 5, "{answer}");
        assert_eq!(answer["error"]["code"], -32022, "{answer}");
        let message = answer["error"]["message"].as_str().expect("message");
        assert!(
            message.contains("unit everything runs an instance per host session")
                && message.contains("initialize"),
            "{message}"
        );
        let supported = answer["error"]["data"]["supported"].to_string();
        assert!(supported.contains("\"2025-11-25\""), "{supported}");
    }
    assert!(instances().starts_with("0 of"), "{}", instances());
    // The Python SDK's client in mode auto falls back to a session, which
    // has an instance of its own, and gets what a 2025 host gets.
    let url = format!("http://{addr}/mcp/everything");
    let mut over_http = era(false, "auto", &[&url], &runtime);
    assert_eq!(over_http["protocol"], "2025-11-25", "{over_http}");
    assert!(!over_http.to_string().contains("\"error: "), "{over_http}");
    let mut legacy = era(false, "legacy", &[&url], &runtime);
    for out in [&mut over_http, &mut legacy] {
        out.as_object_mut().expect("an object").remove("mode");
    }
    assert_eq!(over_http, legacy);
}

#[test]
fn a_request_whose_stream_broke_gets_the_rest_and_its_answer_on_a_resuming_get() {
    let (_d, _units, _dir, addr) = fixture_endpoint("progress");
    let (status, headers, body) = request(addr, "POST", "/mcp/a", &JSON, INITIALIZE.as_bytes());
    assert_eq!(status, 200, "{body}");
    let session = header(&headers, "mcp-session-id").expect("id").to_owned();
    // The call's own stream: its first progress notification, then the
    // client goes.
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"progress","arguments":{"steps":3},"_meta":{"progressToken":"p"}}}"#;
    let mut stream = {
        use std::io::Write;
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .expect("timeout");
        write!(
            stream,
            "POST /mcp/a HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\nContent-Length: {}\r\n\r\n{call}",
            call.len()
        )
        .expect("write");
        read_ok_head(&mut stream);
        stream
    };
    // A priming event first (SEP-1699): resumable before any message.
    let (primed, data, retry) = read_event(&mut stream);
    assert_eq!((data.as_str(), retry.as_deref()), ("", Some("1000")));
    assert!(primed.ends_with("-0"), "{primed}");
    let (first, data) = next_event(&mut stream);
    assert_eq!(
        primed.split_once('-').map(|p| p.0),
        first.split_once('-').map(|f| f.0),
        "the priming event is of the call's stream"
    );
    assert!(
        data.contains("notifications/progress") && data.contains("\"progress\":1"),
        "{data}"
    );
    drop(stream);
    // A GET that resumes it: the rest of the call's stream, its answer
    // last, and then that stream is over.
    let mut stream = get_stream(
        addr,
        "/mcp/a",
        &session,
        &format!("Last-Event-ID: {first}\r\n"),
    );
    let mut last = event_seq(&first);
    for step in [2, 3] {
        let (id, data) = next_event(&mut stream);
        assert!(data.contains(&format!("\"progress\":{step}")), "{data}");
        assert!(event_seq(&id) > last);
        last = event_seq(&id);
    }
    let (_, data) = next_event(&mut stream);
    assert!(
        data.contains("\"id\":7") && data.contains("3 steps"),
        "{data}"
    );
    stream_ends(stream);
}

/// A request of [`requests_sent_as_2026_07_28_get_the_status_and_code_the_spec_gives`]:
/// its method, params, `MCP-Protocol-Version`, `Mcp-Param-Region`, and the
/// status and error code it gets.
type Case<'a> = (&'a str, String, &'a str, Option<&'a str>, u16, Option<i64>);

/// The 2026-07-28 wire to the letter (DESIGN §15), on a unit's path and
/// an aggregate's: each refusal with the HTTP status and JSON-RPC code
/// the spec gives it, before the unit sees the request; a unit's own
/// error answer with its code's status.
#[test]
fn requests_sent_as_2026_07_28_get_the_status_and_code_the_spec_gives() {
    let (_d, _units, _dir, addr) = fixture_endpoint("region");
    let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
    let v999 = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"v999","io.modelcontextprotocol/clientCapabilities":{}}"#;
    for (path, tool) in [("/mcp/a", "region"), ("/mcp/@all", "a__region")] {
        let call =
            format!(r#"{{"name":"{tool}","arguments":{{"region":"eu-west","text":"x"}},{meta}}}"#);
        // (method, params, version header, Mcp-Param-Region, status, code)
        let cases: Vec<Case> = vec![
            (
                "ping",
                format!("{{{meta}}}"),
                "2026-07-28",
                None,
                404,
                Some(-32601),
            ),
            (
                "initialize",
                format!("{{{meta}}}"),
                "2026-07-28",
                None,
                404,
                Some(-32601),
            ),
            (
                "logging/setLevel",
                format!(r#"{{"level":"info",{meta}}}"#),
                "2026-07-28",
                None,
                404,
                Some(-32601),
            ),
            (
                "resources/subscribe",
                format!(r#"{{"uri":"fixture://0",{meta}}}"#),
                "2026-07-28",
                None,
                404,
                Some(-32601),
            ),
            (
                "tools/list",
                "{}".into(),
                "2026-07-28",
                None,
                400,
                Some(-32602),
            ),
            (
                "server/discover",
                "{}".into(),
                "2026-07-28",
                None,
                400,
                Some(-32602),
            ),
            (
                "tools/list",
                format!("{{{v999}}}"),
                "v999",
                None,
                400,
                Some(-32022),
            ),
            (
                "tools/list",
                format!("{{{v999}}}"),
                "2026-07-28",
                None,
                400,
                Some(-32020),
            ),
            (
                "tools/call",
                call.clone(),
                "2026-07-28",
                Some("us-east"),
                400,
                Some(-32020),
            ),
            (
                "tools/call",
                call.clone(),
                "2026-07-28",
                None,
                400,
                Some(-32020),
            ),
            (
                "tools/call",
                call.clone(),
                "2026-07-28",
                Some("=?base64?ZXUtd2VzdA?="),
                400,
                Some(-32020),
            ),
            (
                "tools/call",
                call.clone(),
                "2026-07-28",
                Some("=?base64?ZXUtd2VzdA==?="),
                200,
                None,
            ),
            (
                "tools/call",
                call.clone(),
                "2026-07-28",
                Some("eu-west"),
                200,
                None,
            ),
            // The unit's (or the aggregate's) own answer: its code's status.
            (
                "no/such-method",
                format!("{{{meta}}}"),
                "2026-07-28",
                None,
                404,
                Some(-32601),
            ),
        ];
        for (method, params, version, region, status, code) in cases {
            let mut h: Vec<(&str, &str)> = JSON.to_vec();
            h.extend([("MCP-Protocol-Version", version), ("Mcp-Method", method)]);
            if method == "tools/call" {
                h.push(("Mcp-Name", tool));
            }
            if let Some(region) = region {
                h.push(("Mcp-Param-Region", region));
            }
            let body =
                format!(r#"{{"jsonrpc":"2.0","id":9,"method":"{method}","params":{params}}}"#);
            let (got, _, answer) = request(addr, "POST", path, &h, body.as_bytes());
            let what = format!("{path} {method} {version} {region:?}: {answer}");
            assert_eq!(got, status, "{what}");
            let answer: serde_json::Value = serde_json::from_str(&answer).expect("one JSON body");
            assert_eq!(answer["id"], 9, "{what}");
            assert_eq!(answer["error"]["code"].as_i64(), code, "{what}");
            if code.is_none() {
                assert!(answer["result"].is_object(), "{what}");
            }
        }
    }
}

#[test]
fn mcp_param_headers_reach_an_http_unit_of_2026_07_28() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recorded = dir.path().join("headers");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let mut server = std::process::Command::new(crate::helper::fixture_path())
        .args(["--http", &format!("127.0.0.1:{port}"), "--tools", "region"])
        .arg("--record-headers")
        .arg(&recorded)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("http fixture");
    let units = tempfile::tempdir().expect("units");
    std::fs::write(
        units.path().join("remote.kdl"),
        format!(
            "http \"http://127.0.0.1:{port}/mcp\"\nprotocol \"2026-07-28\"\nreconnect {{\n    initial-delay \"50ms\"\n    max-attempts 100\n}}\n"
        ),
    )
    .expect("unit");
    let (mut d, _settings, addr) = endpoint(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n    auth \"none\"\n}\n",
    );
    d.wait_for("running (");
    let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"region","arguments":{{"region":"eu-west","text":"x"}},{meta}}}}}"#
    );
    let mut h: Vec<(&str, &str)> = JSON.to_vec();
    h.extend([
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "region"),
        ("Mcp-Param-Region", "eu-west"),
    ]);
    let (status, _, answer) = request(addr, "POST", "/mcp/remote", &h, body.as_bytes());
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("\"result\""), "{answer}");
    let runtime = d.runtime_dir().expect("runtime").to_owned();
    let out = crate::helper::mcpctl_user(
        &runtime,
        &[
            "call",
            "remote",
            "region",
            r#"{"region":"us-east","text":"y"}"#,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = std::fs::read_to_string(&recorded).expect("recorded");
    let calls: Vec<&str> = lines
        .lines()
        .filter(|l| l.contains("mcp-method: tools/call"))
        .collect();
    assert_eq!(calls.len(), 2, "{lines}");
    for (line, region) in calls.iter().zip(["eu-west", "us-east"]) {
        assert!(line.contains("mcp-name: region"), "{line}");
        assert!(
            line.contains(&format!("mcp-param-region: {region}")),
            "{line}"
        );
    }
    let _ = server.kill();
    let _ = server.wait();
}

#[test]
fn a_session_the_unit_refuses_ends_its_initialize_with_the_units_reason() {
    // A unit takes 512 host sessions (`MAX_SESSIONS`); the endpoint here
    // takes more, so the unit is the one to refuse.
    let units = tempfile::tempdir().expect("tempdir");
    // One process, whose sessions are counted: pinned to one era.
    std::fs::write(
        units.path().join("u.kdl"),
        "stdio {\n    command \"mcp-fixture\"\n}\nprotocol \"2026-07-28\"\n",
    )
    .expect("write");
    let (mut d, _dir, addr) = endpoint(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n    auth \"none\"\n    max-sessions 600\n}\n",
    );
    d.wait_for("running (pid");
    for n in 1..=512 {
        let (status, _, body) = request(addr, "POST", "/mcp/u", &JSON, INITIALIZE.as_bytes());
        assert_eq!(status, 200, "session {n}: {body}");
        assert!(body.contains("\"protocolVersion\""), "session {n}: {body}");
    }
    let (_, _, body) = request(addr, "POST", "/mcp/u", &JSON, INITIALIZE.as_bytes());
    assert!(
        body.contains("too many sessions on server u (at most 512)"),
        "the 513th: {body}"
    );
}

/// A client that takes both: a request answered with nothing before it
/// gets one `application/json` body (its length given, no chunks); one
/// whose tool reports progress first gets an SSE stream, the progress
/// and then the answer.
#[test]
fn an_answer_that_comes_first_is_one_json_body_and_progress_makes_an_sse_stream() {
    let (_d, _units, _dir, addr) = fixture_endpoint("echo,progress");
    let both = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    let (status, headers, body) = request(addr, "POST", "/mcp/a", &both, INITIALIZE.as_bytes());
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        header(&headers, "content-type"),
        Some("application/json"),
        "{headers:?}"
    );
    let session = header(&headers, "mcp-session-id").expect("id").to_owned();
    let mut h: Vec<(&str, &str)> = both.to_vec();
    h.push(("Mcp-Session-Id", &session));

    let echo = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"at once"}}}"#;
    let (status, headers, body) = request(addr, "POST", "/mcp/a", &h, echo.as_bytes());
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        header(&headers, "content-type"),
        Some("application/json"),
        "{headers:?}"
    );
    assert_eq!(header(&headers, "transfer-encoding"), None, "{headers:?}");
    assert_eq!(
        header(&headers, "content-length").and_then(|n| n.parse::<usize>().ok()),
        Some(body.len()),
        "{headers:?}"
    );
    let answer: serde_json::Value = serde_json::from_str(&body).expect("one JSON answer");
    assert_eq!(answer["id"], 2);
    assert_eq!(
        answer["result"]["content"][0]["text"], "at once",
        "{answer}"
    );

    let progress = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"progress","arguments":{"steps":2},"_meta":{"progressToken":"p"}}}"#;
    let (status, headers, body) = request(addr, "POST", "/mcp/a", &h, progress.as_bytes());
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        header(&headers, "content-type"),
        Some("text/event-stream"),
        "{headers:?}"
    );
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| !d.is_empty())
        .collect();
    assert_eq!(data.len(), 3, "two progress events and the answer: {body}");
    // The stream starts with a priming event (SEP-1699).
    let first = body
        .split("\r\n")
        .find(|c| c.contains("id: "))
        .unwrap_or_default();
    assert!(
        first.contains("retry: 1000") && first.contains("data: \n"),
        "{body}"
    );
    assert!(
        data[0].contains("notifications/progress") && data[1].contains("notifications/progress"),
        "{body}"
    );
    assert!(
        data[2].contains("\"id\":3") && data[2].contains("\"result\""),
        "{body}"
    );
}
