//! The subcommands that talk to the daemon: `status`, `list`, `start`,
//! `stop`, `restart`, `reload`, `tools`, `call`, `logs`, `cat`.
//!
//! Each writes its output to the given writer and returns an exit code
//! (systemctl's: 0 ok, 1 failure, 3 not running, 4 no such server).

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::dbus::{Client, ServerProxy, ToolRow};
use crate::mux::method::Method;
use crate::supervisor::State;
use crate::unit::{self, UnitFiles};

use super::client::{CtlError, dbus_error};
use super::exit;

/// How output looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Output {
    pub color: bool,
    pub json: bool,
}

type Result<T> = std::result::Result<T, CtlError>;

fn io(e: std::io::Error) -> CtlError {
    CtlError::output(e)
}

/// The coloured state dot: green running, cyan idle (on demand, healthy),
/// yellow on the way, red failed, white stopped.
fn dot(state: &str, color: bool) -> String {
    if !color {
        return "●".into();
    }
    let code = match state.parse::<State>() {
        Ok(State::Running) => "32",
        Ok(State::Idle) => "36",
        Ok(s) if s.is_transient() => "33",
        Ok(State::Failed) => "31",
        _ => "37",
    };
    format!("\x1b[{code}m●\x1b[0m")
}

/// Everything `status` shows of one server, read from its properties.
#[derive(Debug, Clone)]
struct Props {
    name: String,
    description: String,
    state: String,
    reason: String,
    generation: u64,
    attempt: u32,
    max_attempts: u32,
    next_retry_usec: u64,
    since_usec: u64,
    main_pid: u32,
    last_exit: String,
    last_error: String,
    restarts: u32,
    health_enabled: bool,
    probes_missed: u32,
    last_ping_usec: u64,
    last_ping_timestamp: u64,
    containment: String,
    sandbox: String,
    credentials: String,
    start: String,
    idle_stop_usec: u64,
    tasks: u64,
    memory: u64,
    cpu_nsec: u64,
    calls: u64,
    failed_calls: u64,
    detached: u64,
    dropped: u64,
    slowed: u64,
    shed: u64,
    refused: u64,
    garbage: u64,
    sessions: u32,
    /// `max-instances` of a per-host unit; 0 for a shared one.
    max_instances: u32,
    /// Its instances (`ListInstances`' objects).
    instances: Vec<Value>,
    versions: Vec<(String, u32)>,
    protocol: String,
    /// (version, main pid or 0, hosts) per upstream (DESIGN §12).
    lanes: Vec<(String, u32, u32)>,
    groups: Vec<String>,
    prefix: String,
    unit_path: String,
    load_error: String,
    tools: Vec<ToolRow>,
    /// The unit's login (DESIGN §17); empty without `oauth`.
    auth: String,
    auth_expires_usec: u64,
}

async fn props(server: &ServerProxy<'_>) -> Result<Props> {
    let e = dbus_error;
    Ok(Props {
        name: server.name().await.map_err(e)?,
        description: server.description().await.map_err(e)?,
        state: server.state().await.map_err(e)?,
        reason: server.reason().await.map_err(e)?,
        generation: server.generation().await.map_err(e)?,
        attempt: server.attempt().await.map_err(e)?,
        max_attempts: server.max_attempts().await.map_err(e)?,
        next_retry_usec: server.next_retry_usec().await.map_err(e)?,
        since_usec: server.state_change_timestamp().await.map_err(e)?,
        main_pid: server.main_pid().await.map_err(e)?,
        last_exit: server.last_exit_status().await.map_err(e)?,
        last_error: server.last_error().await.map_err(e)?,
        restarts: server.restarts().await.map_err(e)?,
        health_enabled: server.health_enabled().await.map_err(e)?,
        probes_missed: server.probes_missed().await.map_err(e)?,
        last_ping_usec: server.last_ping_usec().await.map_err(e)?,
        last_ping_timestamp: server.last_ping_timestamp().await.map_err(e)?,
        containment: server.containment().await.map_err(e)?,
        sandbox: server.sandbox().await.map_err(e)?,
        credentials: server.credentials().await.map_err(e)?,
        start: server.activation().await.map_err(e)?,
        idle_stop_usec: server.idle_stop_usec().await.map_err(e)?,
        tasks: server.tasks_current().await.map_err(e)?,
        memory: server.memory_current().await.map_err(e)?,
        cpu_nsec: server.cpu_usage_nsec().await.map_err(e)?,
        calls: server.calls().await.map_err(e)?,
        failed_calls: server.failed_calls().await.map_err(e)?,
        detached: server.detached_sessions().await.map_err(e)?,
        dropped: server.dropped_notifications().await.map_err(e)?,
        slowed: server.slowed_sessions().await.map_err(e)?,
        shed: server.dropped_host_notifications().await.map_err(e)?,
        refused: server.refused_host_requests().await.map_err(e)?,
        garbage: server.garbage_lines().await.map_err(e)?,
        sessions: server.sessions().await.map_err(e)?,
        max_instances: server.max_instances().await.map_err(e)?,
        instances: {
            let text = server.list_instances().await.map_err(e)?;
            serde_json::from_str(&text).unwrap_or_default()
        },
        versions: server.session_versions().await.map_err(e)?,
        protocol: server.protocol_version().await.map_err(e)?,
        lanes: server.lanes().await.map_err(e)?,
        groups: server.groups().await.map_err(e)?,
        prefix: server.prefix().await.map_err(e)?,
        unit_path: server.unit_path().await.map_err(e)?,
        load_error: server.load_error().await.map_err(e)?,
        tools: server.tools().await.map_err(e)?,
        auth: server.auth().await.map_err(e)?,
        auth_expires_usec: server.auth_expires_usec().await.map_err(e)?,
    })
}

/// The `Auth:` line's text: the login, and when its token expires.
pub(crate) fn auth_line(auth: &str, expires_usec: u64) -> String {
    if expires_usec == 0 || !auth.starts_with("OAuth") {
        return auth.to_owned();
    }
    let at = time_of(expires_usec);
    let when = match at.duration_since(SystemTime::now()) {
        Ok(left) => format!("expires in {}", span(left)),
        Err(_) => "expired (refreshed at the next request)".into(),
    };
    // "OAuth (issuer), logged in, expires in 41min, scopes …"
    match auth.split_once(", scopes ") {
        Some((head, scopes)) => format!("{head}, {when}, scopes {scopes}"),
        None => format!("{auth}, {when}"),
    }
}

impl Props {
    fn json(&self) -> Value {
        let mut value = self.json_main();
        // Apart: one json! of every member passes its recursion limit.
        if let Some(object) = value.as_object_mut() {
            for (key, n) in [
                ("slowed_sessions", self.slowed),
                ("dropped_host_notifications", self.shed),
                ("refused_host_requests", self.refused),
            ] {
                object.insert(key.into(), n.into());
            }
            object.insert("auth".into(), json!(self.auth));
            object.insert("auth_expires_usec".into(), json!(self.auth_expires_usec));
        }
        value
    }

    fn json_main(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.description,
            "state": self.state,
            "reason": self.reason,
            "generation": self.generation,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "next_retry_usec": self.next_retry_usec,
            "state_change_timestamp": self.since_usec,
            "main_pid": self.main_pid,
            "last_exit": self.last_exit,
            "last_error": self.last_error,
            "restarts": self.restarts,
            "health_enabled": self.health_enabled,
            "probes_missed": self.probes_missed,
            "last_ping_usec": self.last_ping_usec,
            "last_ping_timestamp": self.last_ping_timestamp,
            "containment": self.containment,
            "sandbox": self.sandbox,
            "credentials": self.credentials,
            "start": self.start,
            "idle_stop_usec": self.idle_stop_usec,
            "tasks_current": known(self.tasks),
            "memory_current": known(self.memory),
            "cpu_usage_nsec": known(self.cpu_nsec),
            "calls": self.calls,
            "failed_calls": self.failed_calls,
            "detached_sessions": self.detached,
            "dropped_notifications": self.dropped,
            "garbage_lines": self.garbage,
            "sessions": self.sessions,
            "max_instances": self.max_instances,
            "instances": self.instances,
            "protocol_version": self.protocol,
            "lanes": self.lanes.iter().map(|(v, pid, hosts)| json!({"version": v, "pid": pid, "hosts": hosts})).collect::<Vec<_>>(),
            "groups": self.groups,
            "prefix": self.prefix,
            "session_versions": self.versions.iter().map(|(v, n)| (v.clone(), Value::from(*n))).collect::<serde_json::Map<String, Value>>(),
            "unit_path": self.unit_path,
            "load_error": self.load_error,
            "tools": self.tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
        })
    }
}

fn time_of(usec: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(usec)
}

/// "5min 3s", rounded to seconds.
fn span(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// A wall-clock time as systemctl prints it, in the system's time zone
/// (`TZ`, else `/etc/localtime`): "Tue 2026-12-01 09:36:32 CET".
fn local(at: SystemTime) -> String {
    match jiff::Timestamp::try_from(at) {
        Ok(ts) => ts
            .to_zoned_datetime(jiff::tz::TimeZone::system())
            .strftime("%a %Y-%m-%d %H:%M:%S %Z")
            .to_string(),
        Err(_) => humantime::format_rfc3339_seconds(at).to_string(),
    }
}

fn ago(usec: u64) -> String {
    let at = time_of(usec);
    let elapsed = SystemTime::now().duration_since(at).unwrap_or_default();
    format!(
        "since {}; {} ago",
        local(at),
        if elapsed.as_secs() == 0 {
            "0s".into()
        } else {
            span(elapsed)
        }
    )
}

/// The `Health:` line: what the liveness probes found, while there is
/// something to probe.
fn health(p: &Props) -> Option<String> {
    if matches!(p.state.as_str(), "stopped" | "failed" | "needs-login") {
        return None;
    }
    if !p.health_enabled {
        return Some("off".into());
    }
    if p.state != "running" {
        return None;
    }
    Some(match p.probes_missed {
        0 if p.last_ping_usec == 0 => "ok, not probed yet".into(),
        0 => {
            let elapsed = SystemTime::now()
                .duration_since(time_of(p.last_ping_timestamp))
                .unwrap_or_default();
            format!(
                "ok, ping {} ms {} ago",
                format_ms(p.last_ping_usec),
                if elapsed.as_secs() == 0 {
                    "0s".into()
                } else {
                    span(elapsed)
                }
            )
        }
        1 => "1 probe unanswered".into(),
        n => format!("{n} probes unanswered"),
    })
}

/// `u64::MAX` (unknown) as null.
fn known(v: u64) -> Value {
    if v == u64::MAX { Value::Null } else { json!(v) }
}

/// Bytes as systemctl prints them: "68.2M", "512K", "900B".
fn bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)];
    for (unit, size) in UNITS {
        if n >= size {
            return format!("{:.1}{unit}", n as f64 / size as f64);
        }
    }
    format!("{n}B")
}

/// CPU time as systemctl prints it: "1.234s", "56ms".
fn cpu(nsec: u64) -> String {
    if nsec >= 1_000_000_000 {
        format!("{:.3}s", nsec as f64 / 1e9)
    } else {
        format!("{}ms", nsec / 1_000_000)
    }
}

/// µs as milliseconds: "0.4", "12", "1500".
fn format_ms(usec: u64) -> String {
    if usec < 10_000 {
        format!("{:.1}", usec as f64 / 1000.0)
    } else {
        (usec / 1000).to_string()
    }
}

fn write_block(
    out: &mut dyn Write,
    p: &Props,
    logs: &[String],
    color: bool,
) -> std::io::Result<()> {
    let title = if p.description.is_empty() {
        p.name.clone()
    } else {
        format!("{} - {}", p.name, p.description)
    };
    writeln!(out, "{} {title}", dot(&p.state, color))?;
    if p.load_error.is_empty() {
        writeln!(out, "     Loaded: {}", p.unit_path)?;
    } else {
        let first = p.load_error.lines().next().unwrap_or_default();
        writeln!(out, "     Loaded: {} (invalid: {first})", p.unit_path)?;
        for more in p.load_error.lines().skip(1) {
            writeln!(out, "             {more}")?;
        }
    }
    let reason = if p.reason.is_empty() {
        String::new()
    } else {
        format!(" ({})", p.reason)
    };
    if p.since_usec == 0 {
        writeln!(out, "     Active: {}{reason}", p.state)?;
    } else {
        writeln!(
            out,
            "     Active: {}{reason} {}",
            p.state,
            ago(p.since_usec)
        )?;
    }
    if p.main_pid != 0 {
        writeln!(out, "   Main PID: {}", p.main_pid)?;
    }
    if p.generation != 0 {
        writeln!(out, " Generation: {}", p.generation)?;
    }
    if p.restarts != 0 {
        writeln!(out, "   Restarts: {}", p.restarts)?;
    }
    if p.start == "on-demand" {
        let after = humantime::format_duration(std::time::Duration::from_micros(p.idle_stop_usec));
        writeln!(out, "      Start: on demand, stops after {after} idle")?;
    }
    if let Some(health) = health(p) {
        writeln!(out, "     Health: {health}")?;
    }
    if !p.auth.is_empty() {
        writeln!(
            out,
            "       Auth: {}",
            auth_line(&p.auth, p.auth_expires_usec)
        )?;
    }
    if p.tasks != u64::MAX {
        writeln!(out, "      Tasks: {}", p.tasks)?;
    }
    if p.memory != u64::MAX {
        writeln!(out, "     Memory: {} (sum of RSS)", bytes(p.memory))?;
    }
    if p.cpu_nsec != u64::MAX {
        writeln!(out, "        CPU: {}", cpu(p.cpu_nsec))?;
    }
    // (An idle server has no processes to contain.)
    if !matches!(
        p.state.as_str(),
        "stopped" | "failed" | "idle" | "needs-login"
    ) {
        if !p.containment.is_empty() {
            writeln!(out, "Containment: {}", p.containment)?;
        }
        if !p.sandbox.is_empty() {
            writeln!(out, "    Sandbox: {}", p.sandbox)?;
        }
        if !p.credentials.is_empty() {
            writeln!(out, "Credentials: {}", p.credentials)?;
        }
    }
    if !p.last_exit.is_empty() {
        writeln!(out, "  Last exit: {}", p.last_exit)?;
    }
    // (While it is not running, the reason already says it.)
    if !p.last_error.is_empty() && !p.reason.contains(&p.last_error) {
        writeln!(out, " Last error: {}", p.last_error)?;
    }
    if p.attempt != 0 {
        let next = if p.next_retry_usec == 0 {
            String::new()
        } else {
            let wait = time_of(p.next_retry_usec)
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            format!(
                ", next retry in {}",
                if wait.as_secs() == 0 {
                    "0s".into()
                } else {
                    span(wait)
                }
            )
        };
        writeln!(out, "    Attempt: {}/{}{next}", p.attempt, p.max_attempts)?;
    }
    let names: Vec<&str> = p.tools.iter().map(|t| t.name.as_str()).collect();
    let shown = names.iter().take(5).copied().collect::<Vec<_>>().join(", ");
    let more = if names.len() > 5 { ", …" } else { "" };
    if names.is_empty() {
        writeln!(out, "      Tools: 0")?;
    } else {
        writeln!(out, "      Tools: {} ({shown}{more})", names.len())?;
    }
    if p.lanes.len() > 1 {
        let lanes: Vec<String> = p
            .lanes
            .iter()
            .map(|(version, pid, hosts)| {
                let s = if *hosts == 1 { "" } else { "s" };
                match pid {
                    0 => format!("{version} (not running, {hosts} host{s})"),
                    pid => format!("{version} (pid {pid}, {hosts} host{s})"),
                }
            })
            .collect();
        writeln!(out, "   Protocol: {}", lanes.join(", "))?;
    } else if !p.protocol.is_empty() {
        writeln!(out, "   Protocol: {}", p.protocol)?;
    }
    if !p.groups.is_empty() {
        writeln!(
            out,
            "     Groups: {} (as {}{}…)",
            p.groups.join(", "),
            p.prefix,
            crate::mux::aggregate::SEPARATOR
        )?;
        let long: Vec<String> = names
            .iter()
            .map(|n| crate::mux::aggregate::prefixed(&p.prefix, n))
            .filter(|n| n.chars().count() > crate::mux::aggregate::LONG_NAME)
            .collect();
        if let Some(first) = long.first() {
            writeln!(
                out,
                "    Warning: {} in its groups over {} characters, which some hosts refuse ({first}{}); a shorter alias helps",
                if long.len() == 1 {
                    "1 tool name".to_owned()
                } else {
                    format!("{} tool names", long.len())
                },
                crate::mux::aggregate::LONG_NAME,
                if long.len() > 1 { ", …" } else { "" }
            )?;
        }
    }
    if p.sessions != 0 {
        let versions: Vec<String> = p
            .versions
            .iter()
            .map(|(version, n)| format!("{n} on {version}"))
            .collect();
        let versions = if versions.is_empty() {
            String::new()
        } else {
            format!(" ({})", versions.join(", "))
        };
        writeln!(out, "   Sessions: {}{versions}", p.sessions)?;
    }
    if p.max_instances != 0 {
        writeln!(
            out,
            "  Instances: {} of {}",
            // Hosts' instances count against the limit, callers' not.
            p.instances.iter().filter(|i| i["n"] != 0).count(),
            p.max_instances
        )?;
        for i in &p.instances {
            writeln!(out, "             {}", instance_line(&p.name, i))?;
        }
    }
    if p.calls != 0 {
        writeln!(out, "      Calls: {} ({} failed)", p.calls, p.failed_calls)?;
    }
    // What misbehaving peers cost, when they did.
    let plural = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let trouble: Vec<String> = [
        (
            p.detached,
            plural(p.detached, "session detached", "sessions detached"),
        ),
        (
            p.dropped,
            plural(p.dropped, "notification dropped", "notifications dropped"),
        ),
        (
            p.slowed,
            plural(p.slowed, "session slowed", "sessions slowed"),
        ),
        (
            p.shed,
            plural(
                p.shed,
                "notification from a host dropped",
                "notifications from hosts dropped",
            ),
        ),
        (
            p.refused,
            plural(
                p.refused,
                "request from a host refused",
                "requests from hosts refused",
            ),
        ),
        (
            p.garbage,
            plural(p.garbage, "line of garbage", "lines of garbage"),
        ),
    ]
    .into_iter()
    .filter(|(n, _)| *n != 0)
    .map(|(_, text)| text)
    .collect();
    if !trouble.is_empty() {
        writeln!(out, " Misbehaved: {}", trouble.join(", "))?;
    }
    if !logs.is_empty() {
        writeln!(out)?;
        for line in logs {
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}

/// One instance of a per-host unit, as `status` shows it: "web@3
/// running, pid 4242, host pid 4200 uid 1000, since Tue 2026-12-01
/// 09:36:32 CET; 12 calls, 48.0M"; the instance of a uid's D-Bus calls
/// "web@uid-1000 idle, caller uid 1000, since …".
fn instance_line(unit: &str, i: &Value) -> String {
    let number = |key: &str| i[key].as_u64();
    let name = match i["name"].as_str() {
        Some(name) => name.to_owned(),
        // From a daemon that sends no name: numbers are u32 on the wire.
        None => {
            let n = number("n").and_then(|n| u32::try_from(n).ok());
            crate::unit::InstanceOf::Host(n.unwrap_or_default()).name_in(unit)
        }
    };
    let mut line = format!("{name} {}", i["state"].as_str().unwrap_or_default());
    if let Some(pid) = number("pid") {
        line.push_str(&format!(", pid {pid}"));
    }
    if let Some(token) = i["host_token"].as_str() {
        line.push_str(&format!(", host token {token}"));
        if let Some(address) = i["host_address"].as_str() {
            line.push_str(&format!(" from {address}"));
        }
    }
    match (number("host_pid"), number("host_uid")) {
        (None, Some(uid)) if number("n") == Some(0) => {
            line.push_str(&format!(", caller uid {uid}"));
        }
        (Some(pid), Some(uid)) => line.push_str(&format!(", host pid {pid} uid {uid}")),
        (Some(pid), None) => line.push_str(&format!(", host pid {pid}")),
        (None, Some(uid)) => line.push_str(&format!(", host uid {uid}")),
        (None, None) => {}
    }
    if let Some(since) = number("since_usec") {
        line.push_str(&format!(", since {}", local(time_of(since))));
    }
    let calls = number("calls").unwrap_or_default();
    line.push_str(&format!(
        "; {calls} {}",
        if calls == 1 { "call" } else { "calls" }
    ));
    if let Some(memory) = number("memory") {
        line.push_str(&format!(", {}", bytes(memory)));
    }
    line
}

/// `status [NAME…]`
pub async fn status(
    client: &Client,
    names: &[String],
    output: Output,
    out: &mut dyn Write,
) -> Result<u8> {
    if names.is_empty() {
        return overview(client, output, out).await;
    }
    let mut code = exit::OK;
    let mut blocks = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let server = match client.server(name).await {
            Ok(server) => server,
            Err(e) => {
                let e = dbus_error(e);
                eprintln!("mcpctl: {e}");
                code = code.max(e.code);
                continue;
            }
        };
        let p = props(&server).await?;
        // Idle is healthy: an on-demand server starts on its first use.
        if !matches!(p.state.as_str(), "running" | "idle") && code == exit::OK {
            code = exit::NOT_RUNNING;
        }
        if output.json {
            blocks.push(p.json());
            continue;
        }
        let logs = server.recent_logs(10).await.map_err(dbus_error)?;
        if i > 0 {
            writeln!(out).map_err(io)?;
        }
        write_block(out, &p, &logs, output.color).map_err(io)?;
    }
    if output.json {
        writeln!(out, "{}", Value::Array(blocks)).map_err(io)?;
    }
    Ok(code)
}

/// `status` without names: a line per server and totals.
async fn overview(client: &Client, output: Output, out: &mut dyn Write) -> Result<u8> {
    let rows = client.manager.list_servers().await.map_err(dbus_error)?;
    if output.json {
        return list(client, output, out).await;
    }
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(0);
    for r in &rows {
        let detail = if r.reason.is_empty() {
            &r.description
        } else {
            &r.reason
        };
        writeln!(
            out,
            "{} {:<width$}  {:<12}  {:>3} {:<5}  {detail}",
            dot(&r.state, output.color),
            r.name,
            r.state,
            r.tools,
            crate::words::noun(r.tools as u64, "tool"),
        )
        .map_err(io)?;
    }
    let summary: Vec<String> = State::ALL
        .iter()
        .filter_map(|state| {
            let n = rows.iter().filter(|r| r.state == state.as_str()).count();
            (n > 0).then(|| format!("{n} {state}"))
        })
        .collect();
    let noun = if rows.len() == 1 { "server" } else { "servers" };
    writeln!(out, "\n{} {noun}: {}", rows.len(), summary.join(", ")).map_err(io)?;
    // A daemon without the method (older) or without an endpoint: no line.
    if let Ok((listen, sessions)) = client.manager.http_endpoint().await
        && !listen.is_empty()
    {
        let noun = if sessions == 1 { "session" } else { "sessions" };
        writeln!(out, "HTTP: {}, {sessions} {noun}", listen.join(" ")).map_err(io)?;
    }
    if let Ok((true, exported, dropped)) = client.manager.telemetry().await {
        writeln!(
            out,
            "Telemetry: {} exported, {dropped} dropped",
            crate::words::count(exported, "span")
        )
        .map_err(io)?;
    }
    Ok(exit::OK)
}

/// `list`
pub async fn list(client: &Client, output: Output, out: &mut dyn Write) -> Result<u8> {
    let rows = client.manager.list_servers().await.map_err(dbus_error)?;
    if output.json {
        let rows: Vec<Value> = rows
            .iter()
            .map(|r| {
                json!({"name": r.name, "description": r.description, "state": r.state, "reason": r.reason, "tools": r.tools, "path": r.path.as_str()})
            })
            .collect();
        writeln!(out, "{}", Value::Array(rows)).map_err(io)?;
        return Ok(exit::OK);
    }
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    writeln!(
        out,
        "{:<width$}  {:<12}  {:>5}  DESCRIPTION",
        "NAME", "STATE", "TOOLS"
    )
    .map_err(io)?;
    for r in &rows {
        writeln!(
            out,
            "{:<width$}  {:<12}  {:>5}  {}",
            r.name, r.state, r.tools, r.description
        )
        .map_err(io)?;
    }
    Ok(exit::OK)
}

/// What `start`, `stop` and `restart` ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Start,
    Stop,
    Restart,
}

/// `start|stop|restart NAME…`
pub async fn control(client: &Client, verb: Verb, names: &[String]) -> Result<u8> {
    let mut code = exit::OK;
    for name in names {
        let result = match verb {
            Verb::Start => client.manager.start(name).await,
            Verb::Stop => client.manager.stop(name).await,
            Verb::Restart => client.manager.restart(name).await,
        };
        if let Err(e) = result.map_err(dbus_error) {
            eprintln!("mcpctl: {e}");
            code = code.max(e.code);
        }
    }
    Ok(code)
}

/// `reload`: prints the diff; exit 1 if any unit is invalid.
pub async fn reload(client: &Client, output: Output, out: &mut dyn Write) -> Result<u8> {
    let diff = client.manager.reload().await.map_err(dbus_error)?;
    let mut code = exit::OK;
    let mut rows = Vec::new();
    for (name, change) in &diff {
        let load_error = if change == "invalid" {
            code = exit::FAILURE;
            client
                .server(name)
                .await?
                .load_error()
                .await
                .map_err(dbus_error)?
        } else {
            String::new()
        };
        rows.push((name.clone(), change.clone(), load_error));
    }
    if output.json {
        let rows: Vec<Value> = rows
            .iter()
            .map(|(n, c, e)| json!({"name": n, "change": c, "load_error": e}))
            .collect();
        writeln!(out, "{}", Value::Array(rows)).map_err(io)?;
        return Ok(code);
    }
    for (name, change, load_error) in rows {
        writeln!(out, "{name}: {change}").map_err(io)?;
        for line in load_error.lines() {
            writeln!(out, "  {line}").map_err(io)?;
        }
    }
    Ok(code)
}

/// `tools NAME`
pub async fn tools(client: &Client, name: &str, output: Output, out: &mut dyn Write) -> Result<u8> {
    if crate::mux::aggregate::Target::parse(name).is_ok_and(|t| t.is_aggregate()) {
        return aggregate_tools(client, name, output, out).await;
    }
    let server = client.server(name).await?;
    let list = server.list_tools().await.map_err(dbus_error)?;
    print_list(&list, "name", output, out)
}

/// `tools @GROUP` (or `A+B`): the tools a host of that aggregate sees, as
/// it sees them (the daemon is asked as a host asks: an aggregate session
/// of its own, `initialize`, then `tools/list`). Names longer than
/// [`LONG_NAME`](crate::mux::aggregate::LONG_NAME) are warned about on
/// stderr: some hosts refuse them.
async fn aggregate_tools(
    client: &Client,
    name: &str,
    output: Output,
    out: &mut dyn Write,
) -> Result<u8> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let fd = client.attach(name).await.map_err(dbus_error)?;
    let failed = |e: std::io::Error| CtlError::failure(format!("{name}: {e}"));
    let socket = std::os::unix::net::UnixStream::from(fd);
    socket.set_nonblocking(true).map_err(failed)?;
    let socket = tokio::net::UnixStream::from_std(socket).map_err(failed)?;
    let (read, mut write) = socket.into_split();
    let mut lines = tokio::io::BufReader::new(read).lines();
    let hello = json!({"jsonrpc": "2.0", "id": 1, "method": Method::Initialize.as_str(), "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "mcpctl", "version": env!("CARGO_PKG_VERSION")}}});
    let initialized = json!({"jsonrpc": "2.0", "method": Method::Initialized.as_str()});
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": Method::ToolsList.as_str()});
    let exchange = async {
        write
            .write_all(format!("{hello}\n{initialized}\n{list}\n").as_bytes())
            .await?;
        while let Some(line) = lines.next_line().await? {
            let answer: Value = serde_json::from_str(&line).unwrap_or_default();
            if answer["id"] == 2 {
                return Ok(answer);
            }
        }
        Err(std::io::Error::other("the session ended"))
    };
    let answer = tokio::time::timeout(Duration::from_secs(60), exchange)
        .await
        .map_err(|_| CtlError::failure(format!("{name}: no tools/list answer in 60 s")))?
        .map_err(failed)?;
    if let Some(error) = answer.get("error") {
        return Err(CtlError::failure(format!(
            "{name}: {}",
            error["message"].as_str().unwrap_or_default()
        )));
    }
    let tools = answer["result"]["tools"].clone();
    for tool in tools.as_array().into_iter().flatten() {
        let tool = tool["name"].as_str().unwrap_or_default();
        if tool.chars().count() > crate::mux::aggregate::LONG_NAME {
            eprintln!(
                "mcpctl: warning: {tool} is {} characters, more than some hosts take ({}): give its unit a shorter alias",
                tool.chars().count(),
                crate::mux::aggregate::LONG_NAME
            );
        }
    }
    print_list(&tools.to_string(), "name", output, out)
}

/// What `resources` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    Resources,
    Templates,
    Prompts,
}

/// `resources NAME [--templates]`, `prompts NAME`: one line per item, its
/// URI (or name) and the first line of its description.
pub async fn items(
    client: &Client,
    name: &str,
    listing: Listing,
    output: Output,
    out: &mut dyn Write,
) -> Result<u8> {
    let server = client.server(name).await?;
    let (list, key) = match listing {
        Listing::Resources => (server.list_resources().await, "uri"),
        Listing::Templates => (server.list_resource_templates().await, "uriTemplate"),
        Listing::Prompts => (server.list_prompts().await, "name"),
    };
    print_list(&list.map_err(dbus_error)?, key, output, out)
}

fn print_list(list: &str, key: &str, output: Output, out: &mut dyn Write) -> Result<u8> {
    if output.json {
        writeln!(out, "{list}").map_err(io)?;
        return Ok(exit::OK);
    }
    let items: Vec<Value> =
        serde_json::from_str(list).map_err(|e| CtlError::failure(e.to_string()))?;
    let width = items
        .iter()
        .filter_map(|t| t[key].as_str())
        .map(str::len)
        .max()
        .unwrap_or(0);
    for item in &items {
        let name = item[key].as_str().unwrap_or_default();
        let description = item["description"]
            .as_str()
            .unwrap_or_default()
            .lines()
            .next()
            .unwrap_or_default();
        let line = format!("{name:<width$}  {description}");
        writeln!(out, "{}", line.trim_end()).map_err(io)?;
    }
    Ok(exit::OK)
}

/// `call NAME TOOL [JSON|-]`: prints the result's content; exit 1 for an
/// `isError` result.
pub async fn call(
    client: &Client,
    name: &str,
    tool: &str,
    arguments: &str,
    output: Output,
    out: &mut dyn Write,
) -> Result<u8> {
    let server = client.server(name).await?;
    let result = server
        .call_tool(tool, arguments)
        .await
        .map_err(dbus_error)?;
    let value: Value =
        serde_json::from_str(&result).map_err(|e| CtlError::failure(e.to_string()))?;
    let is_error = value["isError"].as_bool().unwrap_or(false);
    if output.json {
        writeln!(out, "{value}").map_err(io)?;
    } else {
        for item in value["content"].as_array().into_iter().flatten() {
            match item["text"].as_str() {
                Some(text) if item["type"] == "text" => writeln!(out, "{text}").map_err(io)?,
                _ => writeln!(out, "{item}").map_err(io)?,
            }
        }
    }
    Ok(if is_error { exit::FAILURE } else { exit::OK })
}

/// `logs NAME [-n N]`
pub async fn logs(
    client: &Client,
    name: &str,
    lines: u32,
    output: Output,
    out: &mut dyn Write,
) -> Result<u8> {
    let server = client.server(name).await?;
    let lines = server.recent_logs(lines).await.map_err(dbus_error)?;
    if output.json {
        writeln!(out, "{}", json!(lines)).map_err(io)?;
        return Ok(exit::OK);
    }
    for line in lines {
        writeln!(out, "{line}").map_err(io)?;
    }
    Ok(exit::OK)
}

/// Replaces the value of every `http { header NAME VALUE }` with a marker.
fn redact(text: &str) -> Option<String> {
    let mut doc = kdl::KdlDocument::parse(text).ok()?;
    for node in doc.nodes_mut() {
        if node.name().value() != "http" {
            continue;
        }
        if let Some(children) = node.children_mut() {
            for header in children
                .nodes_mut()
                .iter_mut()
                .filter(|n| n.name().value() == "header")
            {
                if let Some(entry) = header
                    .entries_mut()
                    .iter_mut()
                    .filter(|e| e.name().is_none())
                    .nth(1)
                {
                    entry.set_value("<redacted>");
                    // The printed text comes from the kept representation.
                    if let Some(format) = entry.format_mut() {
                        format.value_repr = "\"<redacted>\"".into();
                    }
                }
            }
        }
    }
    Some(doc.to_string())
}

/// `cat NAME`: the unit file and its drop-ins, header values redacted.
pub async fn cat(client: &Client, name: &str, output: Output, out: &mut dyn Write) -> Result<u8> {
    let server = client.server(name).await?;
    let path = server.unit_path().await.map_err(dbus_error)?;
    let dirs: Vec<std::path::PathBuf> = client
        .manager
        .unit_paths()
        .await
        .map_err(dbus_error)?
        .into_iter()
        .map(Into::into)
        .collect();
    let (found, _) = unit::discover(&dirs);
    let files = found
        .into_iter()
        .find(|f| f.name == name)
        .map(|f| f.files)
        .unwrap_or_else(|| UnitFiles::beside(std::path::Path::new(&path)));
    if output.json {
        let shown: Vec<Value> = std::iter::once(&files.main)
            .chain(&files.dropins)
            .map(|file| {
                let text = std::fs::read_to_string(file).ok().and_then(|t| redact(&t));
                json!({"path": file.display().to_string(), "text": text})
            })
            .collect();
        writeln!(out, "{}", Value::Array(shown)).map_err(io)?;
        return Ok(exit::OK);
    }
    for (i, file) in std::iter::once(&files.main)
        .chain(&files.dropins)
        .enumerate()
    {
        if i > 0 {
            writeln!(out).map_err(io)?;
        }
        writeln!(out, "# {}", file.display()).map_err(io)?;
        match std::fs::read_to_string(file) {
            Ok(text) => match redact(&text) {
                Some(shown) => write!(out, "{shown}").map_err(io)?,
                None => writeln!(
                    out,
                    "# (not valid KDL; not shown, it may hold secrets: see mcpctl verify)"
                )
                .map_err(io)?,
            },
            Err(e) => writeln!(out, "# (cannot read: {e})").map_err(io)?,
        }
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_are_redacted() {
        let text = "http \"https://h/mcp\" {\n    header \"Authorization\" \"Bearer s3cret\"\n}\n";
        let shown = redact(text).expect("valid");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            shown.contains("header \"Authorization\" \"<redacted>\""),
            "{shown}"
        );
        assert!(redact("stdio {").is_none());
    }
}
