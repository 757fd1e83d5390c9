//! Tokens of the HTTP endpoint (DESIGN §15): scopes, revocation,
//! expiry, writers at once, a session's calls accounted under its token,
//! and `mcpctl connect HOST --http` (issue 37).

use std::path::Path;

use super::http::{INITIALIZE, JSON, endpoint_with, get_stream, header, request, stream_ends};
use crate::helper::{eventually, holds_within, timed_out};

/// `mcpctl --user token ARGS` on the state directory `state`: its
/// standard output (a new token, trimmed), or a panic naming its failure.
pub(crate) fn token(state: &Path, args: &[&str]) -> String {
    let out = crate::helper::run(
        crate::helper::mcpctl()
            .arg("--user")
            .arg("token")
            .args(args)
            .env("MCPD_STATE_DIR", state),
    );
    assert!(
        out.status.success(),
        "mcpctl token {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn tokens_reach_their_units_only_and_a_revoked_one_ends_its_sessions() {
    let units = tempfile::tempdir().expect("tempdir");
    for name in ["a", "b"] {
        std::fs::write(
            units.path().join(format!("{name}.kdl")),
            "stdio {\n    command \"mcp-fixture\"\n}\n",
        )
        .expect("write");
    }
    let state = tempfile::tempdir().expect("tempdir");
    let only_a = token(state.path(), &["new", "only-a", "--units", "a"]);
    assert!(
        only_a.starts_with("mcpd_") && only_a.len() == 69,
        "{only_a}"
    );
    let all = token(state.path(), &["new", "all", "--expires", "30d"]);
    // Only hashes are kept, in a private file.
    let file = state.path().join("tokens.json");
    let kept = std::fs::read_to_string(&file).expect("tokens.json");
    assert!(
        !kept.contains(&only_a[5..]) && !kept.contains(&all[5..]),
        "{kept}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).expect("meta").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let list = token(state.path(), &["list"]);
    assert!(list.contains("only-a") && list.contains("all"), "{list}");
    assert!(!list.contains("mcpd_"), "{list}");

    let (mut d, _dir, addr) = endpoint_with(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n}\n",
        &[("MCPD_STATE_DIR", state.path().as_os_str())],
    );
    assert_eq!(d.count("2 HTTP tokens"), 1, "{:#?}", d.seen);
    d.wait_until("both units running", |d| d.count("running (pid") >= 2);
    let bearer = |t: &str| format!("Bearer {t}");
    let post = |path: &str, t: &str| {
        let auth = bearer(t);
        let mut h: Vec<(&str, &str)> = JSON.to_vec();
        h.push(("Authorization", &auth));
        request(addr, "POST", path, &h, INITIALIZE.as_bytes())
    };
    // A wrong token: 401; outside its units: 403, logged with the address.
    let (status, headers, _) = post("/mcp/a", "mcpd_0000");
    assert_eq!(status, 401);
    assert_eq!(
        header(&headers, "www-authenticate"),
        Some("Bearer realm=\"mcpd\"")
    );
    let (status, _, body) = post("/mcp/b", &only_a);
    assert_eq!(status, 403, "{body}");
    let line = d.wait_for("refused token only-a on /mcp/b");
    assert!(line.contains("peer=127.0.0.1:"), "{line}");
    // Within its units; the other token everywhere.
    let (status, headers, body) = post("/mcp/a", &only_a);
    assert_eq!(status, 200, "{body}");
    let session = header(&headers, "mcp-session-id").expect("id").to_owned();
    assert_eq!(post("/mcp/b", &all).0, 200);
    // A token minted while the daemon runs is good at once, before its
    // watch has read the file again.
    let late = token(state.path(), &["new", "late", "--units", "a"]);
    let (status, _, body) = post("/mcp/a", &late);
    assert_eq!(status, 200, "{body}");
    // A session is its token's: another token cannot use it.
    let auth = bearer(&all);
    let h = [
        ("Accept", "text/event-stream"),
        ("Authorization", auth.as_str()),
        ("Mcp-Session-Id", session.as_str()),
    ];
    assert_eq!(request(addr, "GET", "/mcp/a", &h, b"").0, 404);

    // Its GET stream is open when the token is revoked: the stream ends.
    let auth = format!("Authorization: Bearer {only_a}\r\n");
    let stream = get_stream(addr, "/mcp/a", &session, &auth);
    token(state.path(), &["revoke", "only-a"]);
    stream_ends(stream);
    d.wait_for("its token was revoked");
    assert_eq!(post("/mcp/a", &only_a).0, 401);
    assert_eq!(post("/mcp/a", &all).0, 200);
    let list = token(state.path(), &["list"]);
    assert!(!list.contains("only-a"), "{list}");
}

#[test]
fn parallel_token_writers_lose_no_token() {
    let state = tempfile::tempdir().expect("tempdir");
    // All started before any is waited for: their writes overlap.
    let children: Vec<_> = (0..16)
        .map(|i| {
            crate::helper::mcpctl()
                .args(["--user", "token", "new", &format!("t{i}")])
                .env("MCPD_STATE_DIR", state.path())
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn mcpctl")
        })
        .collect();
    let mut printed = Vec::new();
    for child in children {
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        printed.push(String::from_utf8_lossy(&out.stdout).trim().to_owned());
    }
    let file = state.path().join("tokens.json");
    let kept: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("tokens.json")).expect("json");
    assert_eq!(kept.len(), 16, "{kept:#?}");
    // Each printed token is the one kept under its name.
    for (i, token) in printed.iter().enumerate() {
        let entry = kept
            .iter()
            .find(|t| t["name"] == format!("t{i}"))
            .unwrap_or_else(|| panic!("t{i} lost: {kept:#?}"));
        assert_eq!(entry["hash"], mcpd::tokens::hash(token));
    }
    // And revoking half of them at once, beside new ones, loses nothing.
    let children: Vec<_> = (0..16)
        .map(|i| {
            let mut cmd = crate::helper::mcpctl();
            cmd.arg("--user").arg("token");
            if i % 2 == 0 {
                cmd.args(["revoke", &format!("t{i}")]);
            } else {
                cmd.args(["new", &format!("u{i}")]);
            }
            cmd.env("MCPD_STATE_DIR", state.path())
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("spawn mcpctl")
        })
        .collect();
    for mut child in children {
        assert!(child.wait().expect("wait").success());
    }
    let kept: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("tokens.json")).expect("json");
    let mut names: Vec<&str> = kept.iter().filter_map(|t| t["name"].as_str()).collect();
    names.sort_unstable();
    let mut want: Vec<String> = (0..16)
        .filter(|i| i % 2 == 1)
        .flat_map(|i| [format!("t{i}"), format!("u{i}")])
        .collect();
    want.sort_unstable();
    assert_eq!(names, want);
}

/// Unit `name` in `dir`: the fixture, with `extra` keys.
fn fixture_unit(dir: &Path, name: &str, extra: &str) {
    std::fs::write(
        dir.join(format!("{name}.kdl")),
        format!("stdio {{\n    command \"mcp-fixture\"\n}}\n{extra}"),
    )
    .expect("write unit");
}

#[test]
fn an_http_sessions_calls_and_instance_are_its_tokens() {
    let units = tempfile::tempdir().expect("tempdir");
    fixture_unit(units.path(), "a", "");
    fixture_unit(units.path(), "p", "sessions \"per-host\"\n");
    let state = tempfile::tempdir().expect("tempdir");
    let runtime = tempfile::tempdir().expect("tempdir");
    let laptop = format!("Bearer {}", token(state.path(), &["new", "laptop"]));
    token(state.path(), &["new", "idle"]);
    let (mut d, _dir, addr) = endpoint_with(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n}\n",
        &[
            ("MCPD_STATE_DIR", state.path().as_os_str()),
            ("XDG_RUNTIME_DIR", runtime.path().as_os_str()),
        ],
    );
    d.wait_until("a running", |d| {
        d.seen
            .iter()
            .any(|l| l.contains("running (pid") && l.contains("mcpd_server=a"))
    });
    // A session: initialize, initialized, a call.
    let open = |path: &str| {
        let mut h: Vec<(&str, &str)> = JSON.to_vec();
        h.push(("Authorization", &laptop));
        let (status, headers, body) = request(addr, "POST", path, &h, INITIALIZE.as_bytes());
        assert_eq!(status, 200, "{body}");
        let session = header(&headers, "mcp-session-id").expect("id").to_owned();
        h.push(("Mcp-Session-Id", &session));
        let initialized = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        assert_eq!(request(addr, "POST", path, &h, initialized).0, 202);
        session
    };
    let session = open("/mcp/a");
    let mut h: Vec<(&str, &str)> = JSON.to_vec();
    h.push(("Authorization", &laptop));
    h.push(("Mcp-Session-Id", &session));
    let call = br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"message":"hi"}}}"#;
    let (status, _, body) = request(addr, "POST", "/mcp/a", &h, call);
    assert_eq!(status, 200, "{body}");
    // Where a bridge's call says `by uid U pid P`.
    let line = d.wait_for("tools/call echo by token laptop from 127.0.0.1:");
    assert!(line.contains("mcpd_caller_token=laptop"), "{line}");
    assert!(line.contains("mcpd_caller_address=127.0.0.1:"), "{line}");
    assert!(line.contains("mcpd_server=a"), "{line}");
    // `token list` says when each was last used (written by the daemon
    // on its first use).
    let mut rows = serde_json::Value::Null;
    let within = std::time::Duration::from_secs(10);
    eventually("the token's last use in `token list`", within, || {
        rows = serde_json::from_str(&token(state.path(), &["--json", "list"])).expect("json");
        rows[0]["last_used"].is_string()
    });
    assert_eq!(rows[0]["name"], "laptop", "{rows}");
    let used = rows[0]["last_used"]
        .as_str()
        .unwrap_or_else(|| panic!("{rows}"));
    let used: jiff::Timestamp = used.parse().expect("a time");
    assert!(
        (jiff::Timestamp::now().as_second() - used.as_second()).abs() < 60,
        "{rows}"
    );
    assert_eq!(rows[1]["name"], "idle", "{rows}");
    assert!(rows[1]["last_used"].is_null(), "{rows}");
    let text = token(state.path(), &["list"]);
    assert!(text.contains("LAST USED"), "{text}");
    let idle = text.lines().find(|l| l.starts_with("idle")).expect("idle");
    assert!(idle.contains("never"), "{text}");

    // A per-host unit's instance for it is the token's, in status.
    open("/mcp/p");
    d.wait_for("instance p@1 for a host (token laptop from 127.0.0.1:");
    let out = crate::helper::mcpctl_user(runtime.path(), &["status", "p"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(", host token laptop from 127.0.0.1:"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = crate::helper::mcpctl_user(runtime.path(), &["--json", "status", "p"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let status = if json.is_array() { &json[0] } else { &json };
    assert_eq!(status["instances"][0]["host_token"], "laptop", "{status}");
}

#[test]
fn an_open_session_ends_the_moment_its_token_expires() {
    let units = tempfile::tempdir().expect("tempdir");
    fixture_unit(units.path(), "a", "");
    let state = tempfile::tempdir().expect("tempdir");
    let (mut d, _dir, addr) = endpoint_with(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n}\n",
        &[("MCPD_STATE_DIR", state.path().as_os_str())],
    );
    // Made while the daemon runs: the sweep learns of it by the reload.
    let short = token(state.path(), &["new", "short", "--expires", "3s"]);
    let long = token(state.path(), &["new", "long"]);
    d.wait_for("2 HTTP tokens");
    let kept: Vec<serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(state.path().join("tokens.json")).expect("tokens.json"),
    )
    .expect("json");
    let expires = kept
        .iter()
        .find(|t| t["name"] == "short")
        .and_then(|t| t["expires"].as_u64())
        .expect("expires");
    let open = |t: &str| {
        let auth = format!("Bearer {t}");
        let mut h: Vec<(&str, &str)> = JSON.to_vec();
        h.push(("Authorization", &auth));
        let (status, headers, body) = request(addr, "POST", "/mcp/a", &h, INITIALIZE.as_bytes());
        assert_eq!(status, 200, "{body}");
        header(&headers, "mcp-session-id").expect("id").to_owned()
    };
    let session = open(&short);
    let other = open(&long);
    let stream = get_stream(
        addr,
        "/mcp/a",
        &session,
        &format!("Authorization: Bearer {short}\r\n"),
    );
    // Nothing else happens: the stream ends when the token expires.
    stream_ends(stream);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    assert!(
        now >= expires,
        "ended at {now}, before the expiry {expires}"
    );
    d.wait_for(&format!("ending session {session} on a: its token expired"));
    let ping = br#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#;
    let post = |t: &str, id: &str| {
        let auth = format!("Bearer {t}");
        let mut h: Vec<(&str, &str)> = JSON.to_vec();
        h.push(("Authorization", &auth));
        h.push(("Mcp-Session-Id", id));
        request(addr, "POST", "/mcp/a", &h, ping).0
    };
    assert_eq!(post(&short, &session), 401);
    // The other token's session goes on.
    assert_eq!(post(&long, &other), 200);
    assert_eq!(d.count("its token expired"), 1, "{:#?}", d.seen);
}

/// An HTTP answer: status, headers (lowercase names), body.
type Answer = (u16, Vec<(String, String)>, String);

/// Waits (at most 10 s) until `post(path, auth)` is refused `401`: a
/// revocation applies when the daemon's watch reads the token file.
fn refused(post: &dyn Fn(&str, &str) -> Answer, path: &str, auth: &str) {
    let within = std::time::Duration::from_secs(10);
    let mut last = (0, String::new());
    let refused = holds_within(within, || {
        let (status, _, body) = post(path, auth);
        last = (status, body);
        status == 401
    });
    assert!(
        refused,
        "{}: still {} {}",
        timed_out(
            format_args!("{path} to be refused after revocation"),
            within
        ),
        last.0,
        last.1
    );
}

/// A loopback port nobody listens on now (for a `listen` a host's URL
/// can name: port 0 cannot be written into a host's file).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind")
        .port()
}

/// `mcpctl --user ARGS` as a user whose HOME is `home`, its tokens in
/// `state`.
fn as_user(home: &Path, state: &Path, args: &[&str]) -> std::process::Output {
    crate::helper::run(
        crate::helper::mcpctl()
            .arg("--user")
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home)
            .env("MCPD_STATE_DIR", state)
            .current_dir(home),
    )
}

fn said(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// What `sh` prints for `script`.
fn sh(script: &str) -> String {
    let out = crate::helper::run(std::process::Command::new("sh").arg("-c").arg(script));
    assert!(out.status.success(), "{script}: {}", said(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn connect_http_writes_each_hosts_url_form_with_a_token_that_works_until_disconnect() {
    let home = tempfile::tempdir().expect("home");
    let h = home.path();
    let state = tempfile::tempdir().expect("state");
    let units = h.join(".config/mcpd/units");
    std::fs::create_dir_all(&units).expect("mkdir");
    for name in ["a", "b"] {
        std::fs::write(
            units.join(format!("{name}.kdl")),
            "stdio {\n    command \"mcp-fixture\"\n}\ngroup \"dev\"\n",
        )
        .expect("write");
    }
    // The hosts' user files, as a host leaves them before any server.
    let files = [
        (
            "claude-code",
            ".claude.json",
            "{\n  \"theme\": \"dark\"\n}\n",
        ),
        ("cursor", ".cursor/mcp.json", "{\n  \"mcpServers\": {}\n}\n"),
        (
            "vscode",
            ".config/Code/User/mcp.json",
            "{\n  // mine\n  \"servers\": {}\n}\n",
        ),
        ("windsurf", ".codeium/windsurf/mcp_config.json", "{}\n"),
        (
            "gemini",
            ".gemini/settings.json",
            "{\n  \"theme\": \"GitHub\"\n}\n",
        ),
        ("codex", ".codex/config.toml", "model = \"o3\"\n"),
        (
            "claude-desktop",
            ".config/Claude/claude_desktop_config.json",
            "{}\n",
        ),
    ];
    for (_, file, text) in files {
        let path = h.join(file);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, text).expect("write");
    }

    // No endpoint configured: said, nothing written.
    let out = as_user(h, state.path(), &["connect", "cursor", "a", "--http"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(
        said(&out).contains("mcpd's HTTP endpoint is not configured")
            && said(&out).contains(".config/mcpd/mcpd.kdl"),
        "{}",
        said(&out)
    );

    let port = free_port();
    let settings = format!("http {{\n    listen \"127.0.0.1:{port}\"\n}}\n");
    std::fs::write(h.join(".config/mcpd/mcpd.kdl"), &settings).expect("write");
    let (mut d, _dir, addr) = endpoint_with(
        &units,
        &settings,
        &[("MCPD_STATE_DIR", state.path().as_os_str())],
    );
    assert_eq!(addr.port(), port);
    d.wait_until("both units running", |d| d.count("running (pid") >= 2);
    let post = |path: &str, auth: &str| {
        let mut headers: Vec<(&str, &str)> = JSON.to_vec();
        headers.push(("Authorization", auth));
        request(addr, "POST", path, &headers, INITIALIZE.as_bytes())
    };

    // Claude Desktop has no URL form: refused, naming it.
    let out = as_user(
        h,
        state.path(),
        &["connect", "claude-desktop", "a", "--http"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(
        said(&out).contains("Claude Desktop's config file has no URL form"),
        "{}",
        said(&out)
    );

    let url = format!("http://127.0.0.1:{port}/mcp/a");
    let mut authorizations = Vec::new();
    for (host, file, _) in &files[..6] {
        let out = as_user(h, state.path(), &["connect", host, "a", "--http"]);
        assert!(out.status.success(), "{host}: {}", said(&out));
        let told = said(&out);
        assert!(
            told.contains(&format!("{host}: a → {url} (added)")),
            "{told}"
        );
        let token_file = h.join(format!(".config/mcpd/connect/connect-{host}-a"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&token_file)
            .expect("token file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{host}");
        let text = std::fs::read_to_string(h.join(file)).expect("host file");
        // Never the token itself in the host's file.
        assert!(!text.contains("mcpd_"), "{host}: {text}");
        let var = format!("MCPD_TOKEN_{}_A", host.to_uppercase().replace('-', "_"));
        // The export line mcpctl printed, as the user's shell runs it.
        let exported = || {
            let line = told
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("export {var}=")))
                .unwrap_or_else(|| panic!("{host}: no export line in {told}"));
            sh(&format!("{line}; printf %s \"${var}\""))
        };
        let authorization = if *host == "codex" {
            let doc: toml_edit::DocumentMut = text.parse().expect("toml");
            let entry = &doc["mcp_servers"]["a"];
            assert!(text.starts_with("model = \"o3\"\n"), "{text}");
            assert_eq!(entry["url"].as_str(), Some(url.as_str()), "{text}");
            assert_eq!(
                entry["bearer_token_env_var"].as_str(),
                Some(var.as_str()),
                "{text}"
            );
            assert!(entry.get("command").is_none(), "{text}");
            format!("Bearer {}", exported())
        } else {
            let value: serde_json::Value =
                jsonc_parser::parse_to_serde_value(&text, &Default::default()).expect("jsonc");
            let servers = if *host == "vscode" {
                "servers"
            } else {
                "mcpServers"
            };
            let entry = &value[servers]["a"];
            let url_key = match *host {
                "gemini" => "httpUrl",
                "windsurf" => "serverUrl",
                _ => "url",
            };
            assert_eq!(entry[url_key], url.as_str(), "{host}: {text}");
            assert!(entry.get("command").is_none(), "{host}: {text}");
            match *host {
                "claude-code" | "vscode" => assert_eq!(entry["type"], "http", "{text}"),
                _ => assert!(entry.get("type").is_none(), "{host}: {text}"),
            }
            let header = entry["headers"]["Authorization"].as_str();
            match *host {
                "claude-code" => {
                    // Its headersHelper's output is the headers.
                    let helper = entry["headersHelper"].as_str().expect("headersHelper");
                    let headers: serde_json::Value =
                        serde_json::from_str(&sh(helper)).expect("helper JSON");
                    assert!(value.get("theme").is_some(), "{text}");
                    headers["Authorization"]
                        .as_str()
                        .expect("Authorization")
                        .to_owned()
                }
                "windsurf" => {
                    let path = token_file.display().to_string();
                    assert_eq!(header, Some(format!("Bearer ${{file:{path}}}").as_str()));
                    format!(
                        "Bearer {}",
                        std::fs::read_to_string(&token_file).expect("token")
                    )
                }
                "gemini" => {
                    assert_eq!(header, Some(format!("Bearer ${{{var}}}").as_str()));
                    format!("Bearer {}", exported())
                }
                _ => {
                    assert_eq!(header, Some(format!("Bearer ${{env:{var}}}").as_str()));
                    format!("Bearer {}", exported())
                }
            }
        };
        assert!(
            authorization.starts_with("Bearer mcpd_"),
            "{host}: {authorization}"
        );
        // The token reaches its unit, and only it.
        let (status, _, body) = post("/mcp/a", &authorization);
        assert_eq!(status, 200, "{host}: {body}");
        assert_eq!(post("/mcp/b", &authorization).0, 403, "{host}");
        authorizations.push(authorization);
    }
    // A group: one entry, its token scoped to the group.
    let out = as_user(
        h,
        state.path(),
        &["connect", "cursor", "--group", "dev", "--http"],
    );
    let told = said(&out);
    assert!(out.status.success(), "{told}");
    let group_url = format!("http://127.0.0.1:{port}/mcp/@dev");
    assert!(
        told.contains(&format!("cursor: dev → {group_url} (the group)")),
        "{told}"
    );
    let line = told
        .lines()
        .find(|l| l.contains("export MCPD_TOKEN_CURSOR_DEV_GROUP="))
        .unwrap_or_else(|| panic!("{told}"));
    let group_auth = format!(
        "Bearer {}",
        sh(&format!(
            "{line}; printf %s \"$MCPD_TOKEN_CURSOR_DEV_GROUP\""
        ))
    );
    assert_eq!(post("/mcp/@dev", &group_auth).0, 200);
    assert_eq!(post("/mcp/b", &group_auth).0, 200);
    let list = token(state.path(), &["list"]);
    assert!(
        list.contains("connect-cursor-dev.group") && list.contains("@dev"),
        "{list}"
    );

    // Disconnect: the file as it was, the tokens revoked and their files gone.
    for (i, (host, file, text)) in files[..6].iter().enumerate() {
        let out = as_user(h, state.path(), &["disconnect", host]);
        assert!(out.status.success(), "{host}: {}", said(&out));
        assert!(
            said(&out).contains(&format!("token connect-{host}-a revoked")),
            "{}",
            said(&out)
        );
        assert_eq!(
            std::fs::read_to_string(h.join(file)).expect("file"),
            *text,
            "{host}"
        );
        assert!(
            !h.join(format!(".config/mcpd/connect/connect-{host}-a"))
                .exists()
        );
        refused(&post, "/mcp/a", &authorizations[i]);
    }
    refused(&post, "/mcp/@dev", &group_auth);
    let list = token(state.path(), &["list"]);
    assert!(!list.contains("connect-"), "{list}");
}

/// One request on an open keep-alive connection: its status and body
/// (every answer here has a length).
fn on_connection(
    stream: &mut std::net::TcpStream,
    auth: &str,
    extra: &str,
    body: &str,
) -> (u16, String) {
    use std::io::{Read, Write};
    write!(
        stream,
        "POST /mcp/a HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: application/json\r\nAuthorization: Bearer {auth}\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).expect("read"), 1, "closed: {head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let status = head[9..12].parse().expect("status");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no length: {head}"));
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).expect("body");
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The requests of one keep-alive connection are each checked: another
/// token, a wrong one, the first again, and the first once revoked (the
/// connection keeps the hash of the token it last bore, never the
/// verdict).
#[test]
fn each_request_of_a_keep_alive_connection_is_checked_and_a_revoked_token_fails_on_it() {
    let units = tempfile::tempdir().expect("tempdir");
    fixture_unit(units.path(), "a", "");
    let state = tempfile::tempdir().expect("tempdir");
    let first = token(state.path(), &["new", "first", "--units", "a"]);
    let second = token(state.path(), &["new", "second", "--units", "a"]);
    let (mut d, _dir, addr) = endpoint_with(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n}\n",
        &[("MCPD_STATE_DIR", state.path().as_os_str())],
    );
    d.wait_for("running (pid");
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    let (status, body) = on_connection(&mut stream, &first, "", INITIALIZE);
    assert_eq!(status, 200, "{body}");
    let (status, body) = on_connection(&mut stream, &second, "", INITIALIZE);
    assert_eq!(status, 200, "{body}");
    let (status, body) = on_connection(&mut stream, "mcpd_wrong", "", INITIALIZE);
    assert_eq!(status, 401, "{body}");
    // A refused request's connection is closed (issue 55, D1): a new one.
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    let (status, body) = on_connection(&mut stream, &first, "", INITIALIZE);
    assert_eq!(status, 200, "{body}");
    token(state.path(), &["revoke", "first"]);
    d.wait_for("1 HTTP tokens");
    let (status, body) = on_connection(&mut stream, &first, "", INITIALIZE);
    assert_eq!(
        status, 401,
        "revoked, on the connection that used it: {body}"
    );
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    let (status, body) = on_connection(&mut stream, &second, "", INITIALIZE);
    assert_eq!(status, 200, "{body}");
}

/// An HTTP session of unit `a` for `bearer`, initialized: its id.
fn session_for(addr: std::net::SocketAddr, bearer: &str) -> String {
    let auth = format!("Bearer {bearer}");
    let mut h: Vec<(&str, &str)> = JSON.to_vec();
    h.push(("Authorization", &auth));
    let (status, headers, body) = request(addr, "POST", "/mcp/a", &h, INITIALIZE.as_bytes());
    assert_eq!(status, 200, "{body}");
    let session = header(&headers, "mcp-session-id")
        .expect("session")
        .to_owned();
    h.push(("Mcp-Session-Id", &session));
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let (status, _, body) = request(addr, "POST", "/mcp/a", &h, initialized.as_bytes());
    assert_eq!(status, 202, "{body}");
    session
}

/// A good client: one keep-alive connection to session `session` with
/// its token, calling the fixture's `echo`.
struct Good {
    stream: std::net::TcpStream,
    extra: String,
    bearer: String,
    id: u64,
}

impl Good {
    fn new(addr: std::net::SocketAddr, bearer: &str) -> Self {
        let session = session_for(addr, bearer);
        let stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(crate::helper::BOUND))
            .expect("timeout");
        Self {
            stream,
            extra: format!("Mcp-Session-Id: {session}\r\n"),
            bearer: bearer.to_owned(),
            id: 100,
        }
    }

    /// One call: the time its answer took.
    fn call(&mut self) -> std::time::Duration {
        self.id += 1;
        let id = self.id;
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"good {id}"}}}}}}"#
        );
        let started = std::time::Instant::now();
        let (status, answer) = on_connection(&mut self.stream, &self.bearer, &self.extra, &body);
        let took = started.elapsed();
        assert_eq!(status, 200, "{answer}");
        assert!(answer.contains(&format!("good {id}")), "{answer}");
        took
    }
}

fn median(mut of: Vec<std::time::Duration>) -> std::time::Duration {
    of.sort();
    of.get(of.len() / 2).copied().unwrap_or_default()
}

/// 10,000 HTTP requests with random bearer tokens (issue 49): each is
/// refused from memory, the token file is looked at no more than once
/// per `TOKENS_LOOK_EVERY` (10 ms) whatever their number (`strace`
/// counts the daemon's `stat`s and `open`s of `tokens.json`), and a good
/// client's calls are answered at their usual latency throughout.
#[test]
fn random_bearer_tokens_cost_no_look_at_the_token_file_each_and_delay_no_good_client() {
    use std::io::{Read, Write};
    let units = tempfile::tempdir().expect("tempdir");
    fixture_unit(units.path(), "a", "");
    let state = tempfile::tempdir().expect("tempdir");
    let good = token(state.path(), &["new", "good", "--units", "a"]);
    let (mut d, _dir, addr) = endpoint_with(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n}\n",
        &[("MCPD_STATE_DIR", state.path().as_os_str())],
    );
    d.wait_for("running (pid");
    let mut client = Good::new(addr, &good);
    // Every thread of the daemon, those of the blocking pool included.
    let trace = state.path().join("strace.out");
    let mut strace = std::process::Command::new("strace")
        .args(["-f", "-qq", "-e", "signal=none", "-e"])
        .arg("trace=stat,lstat,newfstatat,statx,open,openat")
        .arg("-o")
        .arg(&trace)
        .arg("-p")
        .arg(d.pid().to_string())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("strace (apt-get install strace)");
    let looks = || {
        std::fs::read_to_string(&trace)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("tokens.json\""))
            .count()
    };
    let refused = |bearer: &str| {
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(crate::helper::BOUND))
            .expect("timeout");
        write!(
            stream,
            "POST /mcp/a HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: application/json\r\nAuthorization: Bearer {bearer}\r\nContent-Length: {}\r\n\r\n{INITIALIZE}",
            INITIALIZE.len()
        )
        .expect("write");
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        assert!(
            answer.starts_with(b"HTTP/1.1 401"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    };
    // strace is attached once it sees a look at the file.
    let mut n = 0u64;
    eventually(
        "strace sees the daemon look at tokens.json",
        crate::helper::BOUND,
        || {
            n += 1;
            refused(&format!("mcpd_attach{n}"));
            looks() > 0
        },
    );
    let baseline: Vec<_> = (0..20).map(|_| client.call()).collect();
    let before = looks();
    const REQUESTS: usize = 10_000;
    const THREADS: usize = 4;
    let started = std::time::Instant::now();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flood: Vec<_> = (0..THREADS)
        .map(|t| {
            let done = std::sync::Arc::clone(&done);
            std::thread::spawn(move || {
                for i in 0..REQUESTS / THREADS {
                    // 64 hex digits, all different.
                    let mut made = format!("mcpd_{t:032x}{i:032x}");
                    made.truncate(69);
                    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
                    stream
                        .set_read_timeout(Some(crate::helper::BOUND))
                        .expect("timeout");
                    write!(
                        stream,
                        "POST /mcp/a HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: application/json\r\nAuthorization: Bearer {made}\r\nContent-Length: {}\r\n\r\n{INITIALIZE}",
                        INITIALIZE.len()
                    )
                    .expect("write");
                    let mut answer = Vec::new();
                    let _ = stream.read_to_end(&mut answer);
                    assert!(answer.starts_with(b"HTTP/1.1 401"), "{}", String::from_utf8_lossy(&answer));
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut during = Vec::new();
    while done.load(std::sync::atomic::Ordering::Relaxed) < REQUESTS
        && !flood.iter().all(|f| f.is_finished())
    {
        during.push(client.call());
        std::thread::sleep(std::time::Duration::from_millis(20)); // the good client's pace
    }
    for f in flood {
        f.join().expect("flood");
    }
    let took = started.elapsed();
    // Lets strace write what it saw and detach.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(strace.id() as i32).expect("pid"),
        rustix::process::Signal::INT,
    )
    .expect("SIGINT strace");
    strace.wait().expect("strace");
    let looked = looks() - before;
    let allowed = took.as_millis() as usize / 10 + 2;
    let slowest = during.iter().max().copied().unwrap_or_default();
    eprintln!(
        "random tokens: {REQUESTS} refused in {took:?}; the token file looked at {looked} times (at most {allowed} allowed); the good client: median {:?} before, {:?} during ({} calls), slowest {slowest:?}",
        median(baseline.clone()),
        median(during.clone()),
        during.len()
    );
    assert_eq!(done.load(std::sync::atomic::Ordering::Relaxed), REQUESTS);
    assert!(
        looked <= allowed && looked < REQUESTS / 2,
        "{looked} looks at tokens.json for {REQUESTS} requests in {took:?}"
    );
    assert!(during.len() >= 5, "{} good calls", during.len());
    // Generous: other tests load the machine too.
    let usual = median(baseline) * 5 + std::time::Duration::from_millis(100);
    assert!(
        median(during) <= usual && slowest < std::time::Duration::from_secs(3),
        "the good client's calls took {slowest:?} at worst"
    );
}

/// `tokens.json` of `count` tokens (the first `good`'s hash, named
/// `good`, the rest made up with long names), each `created` at `at`.
fn token_file(good: &str, count: usize, at: u64) -> String {
    let mut entries = vec![serde_json::json!({
        "name": "good", "hash": mcpd::tokens::hash(good), "scope": {"units": ["a"]},
        "created": at, "expires": null,
    })];
    for i in 1..count {
        entries.push(serde_json::json!({
            "name": format!("{}{i}", "n".repeat(120)),
            "hash": mcpd::tokens::hash(&format!("mcpd_{i}")),
            "scope": {"units": ["a", "b", "c"]},
            "created": at, "expires": null,
        }));
    }
    serde_json::Value::from(entries).to_string()
}

/// Reloading the token file after a change runs on the blocking pool
/// (issue 49): a large file rewritten over and over, then a file that
/// does not answer (a FIFO nobody writes to: a read that never ends),
/// delay no good client's calls; once the FIFO is written, its tokens
/// are taken.
#[test]
fn the_token_file_is_reread_off_the_runtime_thread_however_large_or_slow() {
    let units = tempfile::tempdir().expect("tempdir");
    fixture_unit(units.path(), "a", "");
    let state = tempfile::tempdir().expect("tempdir");
    let good = token(state.path(), &["new", "good", "--units", "a"]);
    let file = state.path().join("tokens.json");
    let write = |text: &str| {
        let next = state.path().join("tokens.json.next");
        std::fs::write(&next, text).expect("write");
        std::fs::rename(&next, &file).expect("rename");
    };
    let (mut d, _dir, addr) = endpoint_with(
        units.path(),
        "http {\n    listen \"127.0.0.1:0\"\n}\n",
        &[("MCPD_STATE_DIR", state.path().as_os_str())],
    );
    d.wait_for("running (pid");
    let mut client = Good::new(addr, &good);
    let baseline: Vec<_> = (0..10).map(|_| client.call()).collect();
    // Large: 4,096 tokens (the most a file may hold), rewritten 10
    // times, each read in full by the daemon.
    let big = token_file(&good, mcpd::tokens::MAX_TOKENS, 1).len();
    let mut during = Vec::new();
    for round in 0..10u64 {
        write(&token_file(&good, mcpd::tokens::MAX_TOKENS, 10 + round));
        let seen = d.count("4096 HTTP tokens");
        let read = std::time::Instant::now();
        while !d.read_until(std::time::Duration::from_millis(10), |d| {
            d.count("4096 HTTP tokens") > seen
        }) {
            during.push(client.call());
            assert!(
                read.elapsed() < crate::helper::BOUND,
                "{}",
                timed_out("the token file's reload", crate::helper::BOUND)
            );
        }
    }
    let slowest = during.iter().max().copied().unwrap_or_default();
    eprintln!(
        "tokens.json of {big} bytes rewritten 10 times: the good client's median {:?} before, {:?} during ({} calls), slowest {slowest:?}",
        median(baseline.clone()),
        median(during.clone()),
        during.len()
    );
    assert!(
        slowest < std::time::Duration::from_secs(2),
        "a call took {slowest:?}"
    );
    // Slow: a FIFO put in its place. Its read waits for a writer, on the
    // blocking pool; the good client is answered meanwhile.
    let fifo = state.path().join("slow");
    let out = crate::helper::run(std::process::Command::new("mkfifo").arg(&fifo));
    assert!(out.status.success(), "mkfifo");
    let reloads = d.count("reloaded:");
    let link = state.path().join("slow.link");
    std::fs::hard_link(&fifo, &link).expect("link");
    std::fs::rename(&link, &file).expect("rename");
    d.wait_until("the daemon's reload after the change", |d| {
        d.count("reloaded:") > reloads
    });
    for _ in 0..10 {
        let took = client.call();
        assert!(
            took < std::time::Duration::from_secs(5),
            "a call took {took:?} while the token file did not answer"
        );
    }
    // A regular file back first (a reload queued behind reads it), then
    // the FIFO written: the read that waited takes its tokens.
    let late = "mcpd_".to_owned() + &"1".repeat(64);
    let small = serde_json::json!([
        {"name": "good", "hash": mcpd::tokens::hash(&good), "scope": {"units": ["a"]}, "created": 1, "expires": null},
        {"name": "late", "hash": mcpd::tokens::hash(&late), "scope": {"units": ["a"]}, "created": 1, "expires": null},
    ])
    .to_string();
    write(&small);
    // Opened without waiting: only the daemon's read that waits is its
    // reader (no reader yet: ENXIO, tried again).
    eventually("the daemon reading the FIFO", crate::helper::BOUND, || {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
            .open(&fifo)
            .and_then(|mut f| f.write_all(small.as_bytes()))
            .is_ok()
    });
    d.wait_for("2 HTTP tokens");
    let mut late_client = Good::new(addr, &late);
    late_client.call();
    client.call();
}
