//! Pointing a host at mcpd, and back (DESIGN §11): `connect` rewrites the
//! host's entries to run `mcpctl bridge NAME`, editing the file in place so
//! every other key, comment and the formatting stay as they were
//! (jsonc-parser's CST for JSON, toml_edit for TOML); `disconnect` undoes
//! it. Pure: text in, text out.

use jsonc_parser::cst::{CstInputValue, CstObject, CstRootNode};
use serde_json::Value;

use super::hosts::Host;

/// What `connect` records beside the host's file, to undo it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// The entries it rewrote: the host's name for each, and its unit.
    pub servers: Vec<(String, String)>,
    /// The file as `connect` left it.
    pub connected: String,
    /// The entries pointed at mcpd's HTTP endpoint (`connect --http`):
    /// each one's name and the URL written (the others run the bridge).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<(String, String)>,
    /// The tokens minted for them: each one's name and the file that
    /// holds it for the host (`disconnect` revokes and removes both).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<(String, std::path::PathBuf)>,
    /// The host's file did not exist before the first `connect`, which
    /// made it: `disconnect` removes it rather than leave it empty.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub created: bool,
}

/// What an entry `connect` writes runs or reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// `mcpctl bridge UNIT`, this command line.
    Bridge(Vec<String>),
    /// mcpd's HTTP endpoint at `url`, the token sent as `auth` says
    /// (none: the endpoint asks for none).
    Http { url: String, auth: Option<Auth> },
}

/// How a host sends the token, in its own syntax: a reference where it
/// has one, never the token itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// `headers: {"Authorization": VALUE}`, VALUE holding a reference the
    /// host expands (`Bearer ${env:VAR}`, `Bearer ${file:PATH}`, …).
    Header(String),
    /// Claude Code's `headersHelper`: a command whose output is the
    /// headers, as JSON.
    Helper(String),
    /// Codex's `bearer_token_env_var`: the variable holding the token.
    EnvVar(String),
}

/// The type a host's HTTP entry declares (Claude Code and VS Code
/// document it; Cursor tells the transport by itself).
fn http_type(host: Host) -> Option<&'static str> {
    matches!(host, Host::ClaudeCode | Host::VsCode).then_some("http")
}

/// The key of a host's entry that holds a Streamable HTTP URL (Gemini's
/// `url` is SSE; Windsurf's docs use `serverUrl`).
pub fn url_key(host: Host) -> &'static str {
    match host {
        Host::Gemini => "httpUrl",
        Host::Windsurf => "serverUrl",
        _ => "url",
    }
}

/// `url` and `auth` as a new JSON entry, its keys in the order hosts'
/// docs show.
fn http_input(host: Host, url: &str, auth: Option<&Auth>) -> CstInputValue {
    let mut entry = Vec::new();
    if let Some(kind) = http_type(host) {
        entry.push(("type".to_owned(), CstInputValue::String(kind.into())));
    }
    entry.push((url_key(host).to_owned(), CstInputValue::String(url.into())));
    if let Some((key, value)) = auth.and_then(auth_input) {
        entry.push((key.to_owned(), value));
    }
    CstInputValue::Object(entry)
}

/// The key and value that carry `auth` in a JSON entry.
fn auth_input(auth: &Auth) -> Option<(&'static str, CstInputValue)> {
    match auth {
        Auth::Header(value) => Some((
            "headers",
            CstInputValue::Object(vec![(
                "Authorization".to_owned(),
                CstInputValue::String(value.clone()),
            )]),
        )),
        Auth::Helper(command) => Some(("headersHelper", CstInputValue::String(command.clone()))),
        Auth::EnvVar(_) => None,
    }
}

/// Rewrites the entry `object` in place to reach `url`: its transport
/// keys replaced, the others kept where they are.
fn rewrite_http(host: Host, object: &CstObject, url: &str, auth: Option<&Auth>) {
    for key in JSON_TRANSPORT {
        if *key != "type"
            && let Some(prop) = object.get(key)
        {
            prop.remove();
        }
    }
    let at = match (object.get("type"), http_type(host)) {
        (Some(prop), Some(kind)) => {
            prop.set_value(CstInputValue::String(kind.into()));
            prop.property_index() + 1
        }
        (Some(prop), None) => {
            prop.remove();
            0
        }
        (None, Some(kind)) => {
            object.insert(0, "type", CstInputValue::String(kind.into()));
            1
        }
        (None, None) => 0,
    };
    object.insert(at, url_key(host), CstInputValue::String(url.into()));
    if let Some((key, value)) = auth.and_then(auth_input) {
        object.insert(at + 1, key, value);
    }
}

/// Whether `host` documents an entry's `type` (VS Code requires it).
fn typed(host: Host) -> bool {
    matches!(host, Host::ClaudeCode | Host::Cursor | Host::VsCode)
}

/// The keys of a JSON entry that say what to run or reach: `connect`
/// replaces them; every other key (Gemini's `timeout`, `trust`,
/// `excludeTools`, …) is the host's and stays.
const JSON_TRANSPORT: &[&str] = &[
    "type",
    "transport",
    "command",
    "args",
    "env",
    "cwd",
    "envFile",
    "url",
    "httpUrl",
    "serverUrl",
    "headers",
    "headersHelper",
];

/// Codex's keys of the same kind.
const TOML_TRANSPORT: &[&str] = &[
    "command",
    "args",
    "env",
    "env_vars",
    "cwd",
    "url",
    "bearer_token_env_var",
    "http_headers",
    "env_http_headers",
];

/// `env` as a JSON object.
fn env_input(env: &[(String, String)]) -> CstInputValue {
    CstInputValue::Object(
        env.iter()
            .map(|(k, v)| (k.clone(), CstInputValue::String(v.clone())))
            .collect(),
    )
}

/// A new entry that runs `bridge` with `env`, its keys in the order hosts'
/// docs show.
fn bridge_input(host: Host, bridge: &[String], env: &[(String, String)]) -> CstInputValue {
    let (command, args) = bridge.split_first().expect("a command");
    let mut entry = Vec::new();
    if typed(host) {
        entry.push(("type".to_owned(), CstInputValue::String("stdio".into())));
    }
    entry.push(("command".to_owned(), CstInputValue::String(command.clone())));
    entry.push((
        "args".to_owned(),
        CstInputValue::Array(args.iter().cloned().map(CstInputValue::String).collect()),
    ));
    if !env.is_empty() {
        entry.push(("env".to_owned(), env_input(env)));
    }
    CstInputValue::Object(entry)
}

/// Rewrites the entry `object` in place to run `bridge`: its transport keys
/// replaced, the others kept where they are.
fn rewrite(host: Host, object: &CstObject, bridge: &[String], env: &[(String, String)]) {
    let (command, args) = bridge.split_first().expect("a command");
    for key in JSON_TRANSPORT {
        if !["type", "command", "args"].contains(key)
            && let Some(prop) = object.get(key)
        {
            prop.remove();
        }
    }
    let set = |key: &str, value: CstInputValue, after: Option<&str>| match object.get(key) {
        Some(prop) => prop.set_value(value),
        None => {
            let at = after
                .and_then(|a| object.get(a))
                .map_or(0, |p| p.property_index() + 1);
            object.insert(at, key, value);
        }
    };
    match object.get("type") {
        Some(prop) if !typed(host) => prop.remove(),
        _ if typed(host) => set("type", CstInputValue::String("stdio".into()), None),
        _ => {}
    }
    set(
        "command",
        CstInputValue::String(command.clone()),
        Some("type"),
    );
    set(
        "args",
        CstInputValue::Array(args.iter().cloned().map(CstInputValue::String).collect()),
        Some("command"),
    );
    if !env.is_empty() {
        set("env", env_input(env), Some("args"));
    }
}

fn parse(text: &str) -> Result<CstRootNode, String> {
    CstRootNode::parse(text, &Default::default()).map_err(|e| e.kind().to_string())
}

/// The object of servers (`mcpServers`, VS Code's `servers`).
fn servers_key(host: Host) -> &'static str {
    if host == Host::VsCode {
        "servers"
    } else {
        "mcpServers"
    }
}

/// `text` with each `(entry, unit)` of `servers` run through `bridge(unit)`
/// with the variables `env` (what the bridge needs to find its daemon):
/// entries there are rewritten where they are (only the keys that say
/// what to run change), missing ones added.
pub fn connect(
    host: Host,
    text: &str,
    servers: &[(String, String)],
    bridge: &dyn Fn(&str) -> Vec<String>,
    env: &[(String, String)],
) -> Result<String, String> {
    connect_via(host, text, servers, &|unit| Via::Bridge(bridge(unit)), env)
}

/// [`connect`] with each entry made as `via(unit)` says: the bridge, or
/// mcpd's HTTP endpoint (`env` is the bridge's only).
pub fn connect_via(
    host: Host,
    text: &str,
    servers: &[(String, String)],
    via: &dyn Fn(&str) -> Via,
    env: &[(String, String)],
) -> Result<String, String> {
    if host == Host::Codex {
        let mut doc: toml_edit::DocumentMut = text
            .parse()
            .map_err(|e: toml_edit::TomlError| e.to_string())?;
        let table = doc
            .entry("mcp_servers")
            .or_insert_with(|| {
                let mut t = toml_edit::Table::new();
                t.set_implicit(true);
                toml_edit::Item::Table(t)
            })
            .as_table_mut()
            .ok_or("`mcp_servers` is not a table")?;
        let vars: toml_edit::InlineTable = env
            .iter()
            .map(|(k, v)| (k.as_str(), toml_edit::Value::from(v.as_str())))
            .collect();
        for (name, unit) in servers {
            let via = via(unit);
            let entry = match table.get_mut(name).and_then(|e| e.as_table_like_mut()) {
                Some(entry) => {
                    for key in TOML_TRANSPORT {
                        if !["command", "args"].contains(key) || matches!(via, Via::Http { .. }) {
                            entry.remove(key);
                        }
                    }
                    entry
                }
                None => {
                    table_insert(table, name, toml_edit::table());
                    table[name].as_table_like_mut().expect("a table")
                }
            };
            match via {
                Via::Bridge(line) => {
                    let args: toml_edit::Array = line[1..].iter().map(String::as_str).collect();
                    entry.insert("command", toml_edit::value(line[0].clone()));
                    entry.insert("args", toml_edit::value(args));
                    if !env.is_empty() {
                        entry.insert("env", toml_edit::value(vars.clone()));
                    }
                }
                Via::Http { url, auth } => {
                    entry.insert("url", toml_edit::value(url));
                    match auth {
                        Some(Auth::EnvVar(var)) => {
                            entry.insert("bearer_token_env_var", toml_edit::value(var));
                        }
                        Some(other) => {
                            return Err(format!("codex cannot send a token as {other:?}"));
                        }
                        None => {}
                    }
                }
            }
        }
        return Ok(doc.to_string());
    }
    let root = parse(text)?;
    let object = root.object_value_or_set();
    let object = object.object_value_or_set(servers_key(host));
    for (name, unit) in servers {
        let via = via(unit);
        let existing = object.get(name);
        match (&via, existing.as_ref().and_then(|p| p.object_value())) {
            (Via::Bridge(line), Some(entry)) => rewrite(host, &entry, line, env),
            (Via::Http { url, auth }, Some(entry)) => {
                rewrite_http(host, &entry, url, auth.as_ref());
            }
            (via, None) => {
                let input = match via {
                    Via::Bridge(line) => bridge_input(host, line, env),
                    Via::Http { url, auth } => http_input(host, url, auth.as_ref()),
                };
                match existing {
                    Some(prop) => prop.set_value(input),
                    None => {
                        object.append(name, input);
                    }
                }
            }
        }
    }
    Ok(root.to_string())
}

/// Sets `name` in `table`, in place when it is there.
fn table_insert(table: &mut toml_edit::Table, name: &str, item: toml_edit::Item) {
    match table.get_mut(name) {
        Some(slot) => *slot = item,
        None => {
            table.insert(name, item);
        }
    }
}

impl Record {
    /// The URL `connect --http` wrote into entry `name`, if it did.
    pub fn url_of(&self, name: &str) -> Option<&str> {
        self.urls
            .iter()
            .find(|(entry, _)| entry == name)
            .map(|(_, url)| url.as_str())
    }
}

/// Why `disconnect` cannot undo a `connect`: the file no longer parses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict(pub String);

/// What `disconnect` did with an entry `connect` wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undo {
    /// Put back as it was (or removed, if `connect` added it).
    Restored,
    /// The host removed it since: left removed.
    Removed,
    /// The host changed it since (it no longer runs the bridge): left as is.
    Changed,
    /// The host edited its own keys since (`timeout`, `trust`, …): what
    /// `connect` replaced is put back, the host's edits kept.
    Merged,
}

/// `value` as jsonc-parser's input.
fn input_of(value: &Value) -> CstInputValue {
    match value {
        Value::Null => CstInputValue::Null,
        Value::Bool(b) => CstInputValue::Bool(*b),
        Value::Number(n) => CstInputValue::Number(n.to_string()),
        Value::String(s) => CstInputValue::String(s.clone()),
        Value::Array(a) => CstInputValue::Array(a.iter().map(input_of).collect()),
        Value::Object(o) => {
            CstInputValue::Object(o.iter().map(|(k, v)| (k.clone(), input_of(v))).collect())
        }
    }
}

/// An entry's keys that are the host's own (not what to run or reach).
fn own_keys(entry: Option<&Value>, transport: &[&str]) -> serde_json::Map<String, Value> {
    entry
        .and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .filter(|(k, _)| !transport.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a command line (`command`, `args`) is `bridge`'s.
fn runs(bridge: &[String], command: Option<&str>, args: Option<Vec<String>>) -> bool {
    command == Some(bridge[0].as_str()) && args.as_deref() == Some(&bridge[1..])
}

/// The file `connect` changed, as it should be now, and what became of
/// each entry it wrote: `original` byte for byte when nothing else changed
/// since; else `current` with each entry that still runs the bridge put
/// back as it was in `original` (or removed, if it was not there), and the
/// host's own changes (entries it removed or changed) left alone.
pub fn disconnect(
    host: Host,
    current: &str,
    original: &str,
    record: &Record,
    bridge: &dyn Fn(&str) -> Vec<String>,
) -> Result<(String, Vec<Undo>), Conflict> {
    if current == record.connected {
        return Ok((
            original.to_owned(),
            vec![Undo::Restored; record.servers.len()],
        ));
    }
    let mut undone = Vec::new();
    if host == Host::Codex {
        let parse = |t: &str| {
            t.parse::<toml_edit::DocumentMut>()
                .map_err(|e| Conflict(e.to_string()))
        };
        let mut now = parse(current)?;
        let before = parse(original)?;
        for (name, unit) in &record.servers {
            let Some(entry) = now.get("mcp_servers").and_then(|s| s.get(name)) else {
                undone.push(Undo::Removed);
                continue;
            };
            let args = entry.get("args").and_then(|a| a.as_array()).map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            });
            let ours = match record.url_of(name) {
                Some(url) => entry.get("url").and_then(|u| u.as_str()) == Some(url),
                None => runs(
                    &bridge(unit),
                    entry.get("command").and_then(|c| c.as_str()),
                    args,
                ),
            };
            if !ours {
                undone.push(Undo::Changed);
                continue;
            }
            let old = before.get("mcp_servers").and_then(|s| s.get(name)).cloned();
            // The host's own keys as they are now and as they were.
            let own = |item: Option<&toml_edit::Item>| -> Vec<(String, String)> {
                item.and_then(toml_edit::Item::as_table_like)
                    .map(|t| {
                        t.iter()
                            .filter(|(k, _)| !TOML_TRANSPORT.contains(k))
                            .map(|(k, v)| (k.to_owned(), v.to_string().trim().to_owned()))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let edited = old.is_some() && own(Some(entry)) != own(old.as_ref());
            if let Some(servers) = now.get_mut("mcp_servers").and_then(|s| s.as_table_mut()) {
                match old {
                    Some(item) if edited => {
                        if let (Some(entry), Some(was)) = (
                            servers.get_mut(name).and_then(|e| e.as_table_like_mut()),
                            item.as_table_like(),
                        ) {
                            for key in TOML_TRANSPORT {
                                entry.remove(key);
                                if let Some(value) = was.get(key) {
                                    entry.insert(key, value.clone());
                                }
                            }
                        }
                    }
                    Some(item) => table_insert(servers, name, item),
                    None => {
                        servers.remove(name);
                    }
                }
            }
            undone.push(if edited { Undo::Merged } else { Undo::Restored });
        }
        return Ok((now.to_string(), undone));
    }
    let conflict = |e: String| Conflict(e);
    let now = parse(current).map_err(conflict)?;
    let before = parse(original).map_err(conflict)?;
    let old_servers = before
        .object_value()
        .and_then(|o| o.object_value(servers_key(host)));
    let servers = now
        .object_value()
        .and_then(|o| o.object_value(servers_key(host)));
    // Entries put back as their original text, byte for byte: each is
    // marked first, the marks replaced in the text at the end.
    let mut verbatim = Vec::new();
    for (name, unit) in &record.servers {
        let Some(prop) = servers.as_ref().and_then(|s| s.get(name)) else {
            undone.push(Undo::Removed);
            continue;
        };
        let value = prop.value().and_then(|v| v.to_serde_value());
        let field = |key: &str| value.as_ref().and_then(|v| v.get(key)).cloned();
        let command = field("command");
        let args = field("args").and_then(|a| serde_json::from_value(a).ok());
        let ours = match record.url_of(name) {
            Some(url) => field(url_key(host)).as_ref().and_then(Value::as_str) == Some(url),
            None => runs(
                &bridge(unit),
                command.as_ref().and_then(Value::as_str),
                args,
            ),
        };
        if !ours {
            undone.push(Undo::Changed);
            continue;
        }
        let old = old_servers
            .as_ref()
            .and_then(|s| s.get(name))
            .and_then(|p| p.value());
        let was = old.as_ref().and_then(|o| o.to_serde_value());
        // Kept keys the host edited while connected stay as edited: only
        // what `connect` replaced is put back, where the host has it.
        if was.is_some()
            && own_keys(value.as_ref(), JSON_TRANSPORT) != own_keys(was.as_ref(), JSON_TRANSPORT)
            && let Some(object) = prop.value().and_then(|v| v.as_object())
        {
            for key in JSON_TRANSPORT {
                if let Some(p) = object.get(key) {
                    p.remove();
                }
            }
            let was = was.as_ref().and_then(Value::as_object);
            let mut at = 0;
            for (key, v) in was.into_iter().flatten() {
                if JSON_TRANSPORT.contains(&key.as_str()) {
                    object.insert(at.min(object.properties().len()), key, input_of(v));
                    at += 1;
                }
            }
            undone.push(Undo::Merged);
            continue;
        }
        match old {
            Some(old) => {
                let mark = format!("mcpd-disconnect-{}-{}", std::process::id(), verbatim.len());
                prop.set_value(CstInputValue::String(mark.clone()));
                verbatim.push((format!("\"{mark}\""), old.to_string()));
            }
            None => prop.remove(),
        }
        undone.push(Undo::Restored);
    }
    let mut text = now.to_string();
    for (mark, old) in verbatim {
        text = text.replacen(&mark, &old, 1);
    }
    Ok((text, undone))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bridge(name: &str) -> Vec<String> {
        vec![
            "/usr/bin/mcpctl".into(),
            "--user".into(),
            "bridge".into(),
            name.into(),
        ]
    }

    fn json(text: &str) -> Value {
        jsonc_parser::parse_to_serde_value(text, &Default::default()).expect("json")
    }

    fn record_of(servers: &[(&str, &str)], connected: &str) -> Record {
        Record {
            servers: servers
                .iter()
                .map(|(e, u)| (e.to_string(), u.to_string()))
                .collect(),
            connected: connected.to_owned(),
            urls: Vec::new(),
            tokens: Vec::new(),
            created: false,
        }
    }

    #[test]
    fn connect_keeps_comments_and_other_keys_and_disconnect_restores_them() {
        let text = "{\n  // my servers\n  \"theme\": \"dark\",\n  \"mcpServers\": {\n    \"a\": { \"command\": \"x\" },\n    \"keep\": { \"command\": \"y\" }\n  }\n}\n";
        let names = vec![
            ("a".to_owned(), "a".to_owned()),
            ("b".to_owned(), "b".to_owned()),
        ];
        let connected = connect(Host::ClaudeDesktop, text, &names, &bridge, &[]).expect("connect");
        assert!(connected.contains("// my servers"), "{connected}");
        assert!(connected.contains("\"theme\": \"dark\""), "{connected}");
        assert!(
            connected.contains("\"keep\": { \"command\": \"y\" }"),
            "{connected}"
        );
        let value = json(&connected);
        assert_eq!(value["mcpServers"]["a"]["args"][2], "a");
        assert_eq!(value["mcpServers"]["b"]["command"], "/usr/bin/mcpctl");
        let record = record_of(&[("a", "a"), ("b", "b")], &connected);
        let restored = vec![Undo::Restored; 2];
        assert_eq!(
            disconnect(Host::ClaudeDesktop, &connected, text, &record, &bridge),
            Ok((text.to_owned(), restored.clone()))
        );
        // The user changed a key since: merged, not lost.
        let edited = connected.replace("\"theme\": \"dark\"", "\"theme\": \"light\"");
        assert_eq!(
            disconnect(Host::ClaudeDesktop, &edited, text, &record, &bridge),
            Ok((text.replace("dark", "light"), restored))
        );
    }

    #[test]
    fn connect_changes_only_the_keys_that_say_what_to_run() {
        // Gemini CLI's own settings of a server stay while it is connected.
        let text = r#"{
  "mcpServers": {
    "time": {
      "command": "uvx",
      "args": ["mcp-server-time"],
      "env": { "TZ": "Asia/Tokyo" },
      "cwd": "/srv",
      "timeout": 30000,
      "trust": false,
      "excludeTools": ["convert_time"]
    },
    "remote": { "httpUrl": "https://x/mcp", "headers": { "A": "b" }, "trust": true }
  }
}
"#;
        let names = [("time", "time"), ("remote", "remote")].map(|(e, u)| (e.into(), u.into()));
        let connected = connect(Host::Gemini, text, &names, &bridge, &[]).expect("connect");
        let value = json(&connected);
        assert_eq!(
            value["mcpServers"]["time"],
            serde_json::json!({
                "command": "/usr/bin/mcpctl",
                "args": ["--user", "bridge", "time"],
                "timeout": 30000,
                "trust": false,
                "excludeTools": ["convert_time"]
            })
        );
        assert_eq!(
            value["mcpServers"]["remote"],
            serde_json::json!({
                "command": "/usr/bin/mcpctl",
                "args": ["--user", "bridge", "remote"],
                "trust": true
            })
        );
        // In the order they were, where they were.
        assert!(
            connected.contains("\"args\": [\"--user\", \"bridge\", \"time\"],\n      \"timeout\": 30000,\n      \"trust\": false,"),
            "{connected}"
        );
        // Claude Code documents `type`: set to stdio.
        let claude = r#"{"mcpServers": {"r": {"type": "http", "url": "https://x/mcp", "oauth": {"clientId": "c"}}}}"#;
        let names = [("r".to_owned(), "r".to_owned())];
        let value =
            json(&connect(Host::ClaudeCode, claude, &names, &bridge, &[]).expect("connect"));
        assert_eq!(
            value["mcpServers"]["r"],
            serde_json::json!({
                "type": "stdio",
                "command": "/usr/bin/mcpctl",
                "args": ["--user", "bridge", "r"],
                "oauth": {"clientId": "c"}
            })
        );
    }

    #[test]
    fn disconnect_puts_back_its_entries_and_leaves_the_hosts_own_changes() {
        let text = "{\n  \"mcpServers\": {\n    \"memory\": {\n      \"command\": \"npx\",\n      \"args\": [\n        \"-y\",\n        \"@modelcontextprotocol/server-memory\"\n      ],\n      \"trust\": true\n    },\n    \"time\": { \"command\": \"uvx\", \"args\": [\"mcp-server-time\"] },\n    \"fetch\": { \"command\": \"uvx\", \"args\": [\"mcp-server-fetch\"] }\n  }\n}\n";
        let servers = [("memory", "memory"), ("time", "time"), ("fetch", "fetch")];
        let names: Vec<(String, String)> = servers
            .iter()
            .map(|(e, u)| (e.to_string(), u.to_string()))
            .collect();
        let connected = connect(Host::Gemini, text, &names, &bridge, &[]).expect("connect");
        let record = record_of(&servers, &connected);
        // The host removed `time` (`gemini mcp remove time`) and pointed
        // `fetch` elsewhere since.
        let root = parse(&connected).expect("parse");
        let object = root
            .object_value()
            .and_then(|o| o.object_value("mcpServers"))
            .expect("servers");
        object.get("time").expect("time").remove();
        object
            .get("fetch")
            .expect("fetch")
            .set_value(CstInputValue::Object(vec![(
                "command".into(),
                CstInputValue::String("my-fetch".into()),
            )]));
        let edited = root.to_string();
        let (undone, how) =
            disconnect(Host::Gemini, &edited, text, &record, &bridge).expect("disconnect");
        assert_eq!(how, vec![Undo::Restored, Undo::Removed, Undo::Changed]);
        // `memory` as it was, byte for byte (its key order and its array
        // over lines).
        assert!(
            undone.contains("    \"memory\": {\n      \"command\": \"npx\",\n      \"args\": [\n        \"-y\",\n        \"@modelcontextprotocol/server-memory\"\n      ],\n      \"trust\": true\n    },"),
            "{undone}"
        );
        let value = json(&undone);
        assert!(value["mcpServers"].get("time").is_none(), "{undone}");
        assert_eq!(value["mcpServers"]["fetch"]["command"], "my-fetch");

        // Codex: the same.
        let toml = "[mcp_servers.a]\ncommand = \"x\"\nstartup_timeout_sec = 20\nenabled_tools = [\"t\"]\n\n[mcp_servers.b]\ncommand = \"y\"\n";
        let names = [("a", "a"), ("b", "b")].map(|(e, u)| (e.into(), u.into()));
        let connected = connect(Host::Codex, toml, &names, &bridge, &[]).expect("connect");
        assert!(
            connected.contains("startup_timeout_sec = 20\nenabled_tools = [\"t\"]"),
            "{connected}"
        );
        let record = record_of(&[("a", "a"), ("b", "b")], &connected);
        let edited = connected.replace("[mcp_servers.b]", "[other]");
        let (undone, how) =
            disconnect(Host::Codex, &edited, toml, &record, &bridge).expect("disconnect");
        assert_eq!(how, vec![Undo::Restored, Undo::Removed]);
        assert!(
            undone.starts_with("[mcp_servers.a]\ncommand = \"x\"\nstartup_timeout_sec = 20\n"),
            "{undone}"
        );
    }

    #[test]
    fn disconnect_keeps_what_the_host_edited_of_its_own_keys_while_connected() {
        let text = r#"{
  "mcpServers": {
    "time": {
      "command": "uvx",
      "args": ["mcp-server-time"],
      "env": { "TZ": "Asia/Tokyo" },
      "timeout": 30000,
      "trust": false
    }
  }
}
"#;
        let names = [("time".to_owned(), "time".to_owned())];
        let connected = connect(Host::Gemini, text, &names, &bridge, &[]).expect("connect");
        let record = record_of(&[("time", "time")], &connected);
        // The user raised the timeout in Gemini's settings meanwhile.
        let edited = connected.replace("\"timeout\": 30000", "\"timeout\": 60000");
        assert_ne!(edited, connected);
        let (undone, how) =
            disconnect(Host::Gemini, &edited, text, &record, &bridge).expect("disconnect");
        assert_eq!(how, vec![Undo::Merged]);
        assert_eq!(
            json(&undone)["mcpServers"]["time"],
            serde_json::json!({
                "command": "uvx",
                "args": ["mcp-server-time"],
                "env": {"TZ": "Asia/Tokyo"},
                "timeout": 60000,
                "trust": false
            })
        );
        // Without an edit of its own keys: byte for byte, as before.
        let (undone, how) =
            disconnect(Host::Gemini, &connected, text, &record, &bridge).expect("disconnect");
        assert_eq!((undone.as_str(), how), (text, vec![Undo::Restored]));

        // Codex: the same.
        let toml = "[mcp_servers.a]\ncommand = \"x\"\nargs = [\"-v\"]\nstartup_timeout_sec = 20\n";
        let names = [("a".to_owned(), "a".to_owned())];
        let connected = connect(Host::Codex, toml, &names, &bridge, &[]).expect("connect");
        let record = record_of(&[("a", "a")], &connected);
        let edited = connected.replace("startup_timeout_sec = 20", "startup_timeout_sec = 45");
        let (undone, how) =
            disconnect(Host::Codex, &edited, toml, &record, &bridge).expect("disconnect");
        assert_eq!(how, vec![Undo::Merged]);
        let value: toml_edit::DocumentMut = undone.parse().expect("toml");
        let a = &value["mcp_servers"]["a"];
        assert_eq!(a["command"].as_str(), Some("x"), "{undone}");
        assert_eq!(a["startup_timeout_sec"].as_integer(), Some(45), "{undone}");
        assert_eq!(a["args"].as_array().map(|a| a.len()), Some(1), "{undone}");
    }

    #[test]
    fn an_entry_rewritten_to_a_url_keeps_its_own_keys_and_comes_back() {
        let text = "{\n  \"mcpServers\": {\n    \"time\": {\n      \"type\": \"stdio\",\n      \"command\": \"uvx\",\n      \"args\": [\"mcp-server-time\"],\n      \"timeout\": 30000\n    }\n  }\n}\n";
        let url = "http://127.0.0.1:8737/mcp/time";
        let names = [("time".to_owned(), "time".to_owned())];
        let via = |_: &str| Via::Http {
            url: url.into(),
            auth: Some(Auth::Header("Bearer ${MCPD_TOKEN_GEMINI_TIME}".into())),
        };
        let connected = connect_via(Host::Gemini, text, &names, &via, &[]).expect("connect");
        assert_eq!(
            json(&connected)["mcpServers"]["time"],
            serde_json::json!({
                "httpUrl": url,
                "headers": {"Authorization": "Bearer ${MCPD_TOKEN_GEMINI_TIME}"},
                "timeout": 30000
            })
        );
        let mut record = record_of(&[("time", "time")], &connected);
        record.urls = vec![("time".into(), url.into())];
        assert_eq!(
            disconnect(Host::Gemini, &connected, text, &record, &bridge),
            Ok((text.to_owned(), vec![Undo::Restored]))
        );
        // The host raised its timeout meanwhile: merged, recognised by
        // its URL (it runs no bridge).
        let edited = connected.replace("30000", "60000");
        let (undone, how) =
            disconnect(Host::Gemini, &edited, text, &record, &bridge).expect("disconnect");
        assert_eq!(how, vec![Undo::Merged]);
        assert_eq!(
            json(&undone)["mcpServers"]["time"],
            serde_json::json!({
                "type": "stdio",
                "command": "uvx",
                "args": ["mcp-server-time"],
                "timeout": 60000
            })
        );
        // Pointed elsewhere since: left as it is.
        let moved = connected.replace(url, "https://elsewhere/mcp");
        let (_, how) =
            disconnect(Host::Gemini, &moved, text, &record, &bridge).expect("disconnect");
        assert_eq!(how, vec![Undo::Changed]);
        // Claude Code: typed, its helper in place of headers; Codex: the
        // variable's name.
        let via = |_: &str| Via::Http {
            url: url.into(),
            auth: Some(Auth::Helper("cat '/t'".into())),
        };
        let value = json(&connect_via(Host::ClaudeCode, "{}", &names, &via, &[]).expect("connect"));
        assert_eq!(
            value["mcpServers"]["time"],
            serde_json::json!({"type": "http", "url": url, "headersHelper": "cat '/t'"})
        );
        let via = |_: &str| Via::Http {
            url: url.into(),
            auth: Some(Auth::EnvVar("MCPD_TOKEN_CODEX_TIME".into())),
        };
        let toml = "[mcp_servers.time]\ncommand = \"uvx\"\nstartup_timeout_sec = 20\n";
        let connected = connect_via(Host::Codex, toml, &names, &via, &[]).expect("connect");
        let doc: toml_edit::DocumentMut = connected.parse().expect("toml");
        let entry = &doc["mcp_servers"]["time"];
        assert!(entry.get("command").is_none(), "{connected}");
        assert_eq!(entry["url"].as_str(), Some(url));
        assert_eq!(
            entry["bearer_token_env_var"].as_str(),
            Some("MCPD_TOKEN_CODEX_TIME")
        );
        assert_eq!(entry["startup_timeout_sec"].as_integer(), Some(20));
        let mut record = record_of(&[("time", "time")], &connected);
        record.urls = vec![("time".into(), url.into())];
        let edited = connected.replace("= 20", "= 45");
        let (undone, how) =
            disconnect(Host::Codex, &edited, toml, &record, &bridge).expect("disconnect");
        assert_eq!(how, vec![Undo::Merged]);
        assert!(undone.contains("command = \"uvx\""), "{undone}");
        assert!(!undone.contains("bearer_token_env_var"), "{undone}");
    }

    #[test]
    fn codex_tables_are_rewritten_in_place() {
        let text =
            "model = \"o3\"\n\n# mine\n[mcp_servers.a]\ncommand = \"x\"\nenv = { K = \"v\" }\n";
        let names = vec![("a".to_owned(), "a".to_owned())];
        let connected = connect(Host::Codex, text, &names, &bridge, &[]).expect("connect");
        assert!(connected.starts_with("model = \"o3\"\n"), "{connected}");
        assert!(
            connected.contains("command = \"/usr/bin/mcpctl\""),
            "{connected}"
        );
        assert!(!connected.contains("K = "), "{connected}");
        let record = record_of(&[("a", "a")], &connected);
        assert_eq!(
            disconnect(Host::Codex, &connected, text, &record, &bridge),
            Ok((text.to_owned(), vec![Undo::Restored]))
        );
    }
}
