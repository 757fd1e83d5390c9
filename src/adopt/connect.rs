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
            let line = bridge(unit);
            let args: toml_edit::Array = line[1..].iter().map(String::as_str).collect();
            let entry = match table.get_mut(name).and_then(|e| e.as_table_like_mut()) {
                Some(entry) => {
                    for key in TOML_TRANSPORT {
                        if !["command", "args"].contains(key) {
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
            entry.insert("command", toml_edit::value(line[0].clone()));
            entry.insert("args", toml_edit::value(args));
            if !env.is_empty() {
                entry.insert("env", toml_edit::value(vars.clone()));
            }
        }
        return Ok(doc.to_string());
    }
    let root = parse(text)?;
    let object = root.object_value_or_set();
    let object = object.object_value_or_set(servers_key(host));
    for (name, unit) in servers {
        let line = bridge(unit);
        match object.get(name) {
            Some(prop) => match prop.object_value() {
                Some(entry) => rewrite(host, &entry, &line, env),
                None => prop.set_value(bridge_input(host, &line, env)),
            },
            None => {
                object.append(name, bridge_input(host, &line, env));
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
            if !runs(
                &bridge(unit),
                entry.get("command").and_then(|c| c.as_str()),
                args,
            ) {
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
        if !runs(
            &bridge(unit),
            command.as_ref().and_then(Value::as_str),
            args,
        ) {
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
