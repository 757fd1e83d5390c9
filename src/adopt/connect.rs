//! Pointing a host at mcpd, and back (DESIGN §11): `connect` rewrites the
//! host's entries to run `mcpctl bridge NAME`, editing the file in place so
//! every other key, comment and the formatting stay as they were
//! (jsonc-parser's CST for JSON, toml_edit for TOML); `disconnect` undoes
//! it. Pure: text in, text out.

use jsonc_parser::cst::{CstInputValue, CstRootNode};
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

/// The entry that runs `mcpctl bridge` (`bridge` is the command line).
fn bridge_entry(host: Host, bridge: &[String]) -> Value {
    let (command, args) = bridge.split_first().expect("a command");
    let mut entry = serde_json::Map::new();
    if matches!(host, Host::ClaudeCode | Host::Cursor | Host::VsCode) {
        // These document `type` (VS Code requires it).
        entry.insert("type".into(), Value::String("stdio".into()));
    }
    entry.insert("command".into(), Value::String(command.clone()));
    entry.insert(
        "args".into(),
        Value::Array(args.iter().cloned().map(Value::String).collect()),
    );
    Value::Object(entry)
}

/// [`bridge_entry`] for the CST, its keys in the order hosts' docs show.
fn bridge_input(host: Host, bridge: &[String]) -> CstInputValue {
    let (command, args) = bridge.split_first().expect("a command");
    let mut entry = Vec::new();
    if matches!(host, Host::ClaudeCode | Host::Cursor | Host::VsCode) {
        entry.push(("type".to_owned(), CstInputValue::String("stdio".into())));
    }
    entry.push(("command".to_owned(), CstInputValue::String(command.clone())));
    entry.push((
        "args".to_owned(),
        CstInputValue::Array(args.iter().cloned().map(CstInputValue::String).collect()),
    ));
    CstInputValue::Object(entry)
}

fn input(value: &Value) -> CstInputValue {
    match value {
        Value::Null => CstInputValue::Null,
        Value::Bool(b) => CstInputValue::Bool(*b),
        Value::Number(n) => CstInputValue::Number(n.to_string()),
        Value::String(s) => CstInputValue::String(s.clone()),
        Value::Array(a) => CstInputValue::Array(a.iter().map(input).collect()),
        Value::Object(o) => {
            CstInputValue::Object(o.iter().map(|(k, v)| (k.clone(), input(v))).collect())
        }
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

/// `text` with each `(entry, unit)` of `servers` run through `bridge(unit)`:
/// entries there are replaced where they are, missing ones added.
pub fn connect(
    host: Host,
    text: &str,
    servers: &[(String, String)],
    bridge: &dyn Fn(&str) -> Vec<String>,
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
        for (name, unit) in servers {
            let line = bridge(unit);
            let mut entry = toml_edit::Table::new();
            entry["command"] = toml_edit::value(line[0].clone());
            let args: toml_edit::Array = line[1..].iter().map(String::as_str).collect();
            entry["args"] = toml_edit::value(args);
            table_insert(table, name, toml_edit::Item::Table(entry));
        }
        return Ok(doc.to_string());
    }
    let root = parse(text)?;
    let object = root.object_value_or_set();
    let object = object.object_value_or_set(servers_key(host));
    for (name, unit) in servers {
        let entry = bridge_input(host, &bridge(unit));
        match object.get(name) {
            Some(prop) => prop.set_value(entry),
            None => {
                object.append(name, entry);
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

/// Why `disconnect` cannot undo a `connect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict(pub String);

/// The file `connect` changed, as it should be now: `original` byte for
/// byte when nothing else changed since; else `current` with each entry
/// `connect` wrote put back as it was in `original` (or removed, if it was
/// not there), when those entries are still as `connect` wrote them.
pub fn disconnect(
    host: Host,
    current: &str,
    original: &str,
    record: &Record,
    bridge: &dyn Fn(&str) -> Vec<String>,
) -> Result<String, Conflict> {
    if current == record.connected {
        return Ok(original.to_owned());
    }
    if host == Host::Codex {
        let parse = |t: &str| {
            t.parse::<toml_edit::DocumentMut>()
                .map_err(|e| Conflict(e.to_string()))
        };
        let mut now = parse(current)?;
        let before = parse(original)?;
        for (name, unit) in &record.servers {
            let line = bridge(unit);
            let ours = now
                .get("mcp_servers")
                .and_then(|s| s.get(name))
                .and_then(|t| t.get("command"))
                .and_then(|c| c.as_str())
                == Some(line[0].as_str());
            if !ours {
                return Err(Conflict(format!(
                    "entry {name} is no longer `mcpctl bridge {unit}`"
                )));
            }
            let old = before.get("mcp_servers").and_then(|s| s.get(name)).cloned();
            if let Some(servers) = now.get_mut("mcp_servers").and_then(|s| s.as_table_mut()) {
                match old {
                    Some(item) => table_insert(servers, name, item),
                    None => {
                        servers.remove(name);
                    }
                }
            }
        }
        return Ok(now.to_string());
    }
    let conflict = |e: String| Conflict(e);
    let now = parse(current).map_err(conflict)?;
    let before: Value = jsonc_parser::parse_to_serde_value(original, &Default::default())
        .map_err(|e| Conflict(e.kind().to_string()))?;
    let servers = now
        .object_value()
        .and_then(|o| o.object_value(servers_key(host)))
        .ok_or_else(|| Conflict(format!("the `{}` object is gone", servers_key(host))))?;
    for (name, unit) in &record.servers {
        let prop = servers
            .get(name)
            .ok_or_else(|| Conflict(format!("entry {name} was removed")))?;
        if prop.value().and_then(|v| v.to_serde_value()) != Some(bridge_entry(host, &bridge(unit)))
        {
            return Err(Conflict(format!(
                "entry {name} is no longer `mcpctl bridge {unit}`"
            )));
        }
        match before.get(servers_key(host)).and_then(|s| s.get(name)) {
            Some(old) => prop.set_value(input(old)),
            None => prop.remove(),
        }
    }
    Ok(now.to_string())
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

    #[test]
    fn connect_keeps_comments_and_other_keys_and_disconnect_restores_them() {
        let text = "{\n  // my servers\n  \"theme\": \"dark\",\n  \"mcpServers\": {\n    \"a\": { \"command\": \"x\" },\n    \"keep\": { \"command\": \"y\" }\n  }\n}\n";
        let names = vec![
            ("a".to_owned(), "a".to_owned()),
            ("b".to_owned(), "b".to_owned()),
        ];
        let connected = connect(Host::ClaudeDesktop, text, &names, &bridge).expect("connect");
        assert!(connected.contains("// my servers"), "{connected}");
        assert!(connected.contains("\"theme\": \"dark\""), "{connected}");
        assert!(
            connected.contains("\"keep\": { \"command\": \"y\" }"),
            "{connected}"
        );
        let value: Value =
            serde_json::from_str(&connected.replace("// my servers", "")).expect("json");
        assert_eq!(value["mcpServers"]["a"]["args"][2], "a");
        assert_eq!(value["mcpServers"]["b"]["command"], "/usr/bin/mcpctl");
        let record = Record {
            servers: names.clone(),
            connected: connected.clone(),
        };
        assert_eq!(
            disconnect(Host::ClaudeDesktop, &connected, text, &record, &bridge),
            Ok(text.to_owned())
        );
        // The user added a key since: merged, not lost.
        let edited = connected.replace("\"theme\": \"dark\"", "\"theme\": \"light\"");
        let undone =
            disconnect(Host::ClaudeDesktop, &edited, text, &record, &bridge).expect("merge");
        assert!(undone.contains("\"theme\": \"light\""), "{undone}");
        let value: Value =
            serde_json::from_str(&undone.replace("// my servers", "")).expect("json");
        assert_eq!(
            value["mcpServers"]["a"],
            serde_json::json!({"command": "x"})
        );
        assert!(value["mcpServers"].get("b").is_none(), "{undone}");
        // The user changed an entry mcpd wrote: refused.
        let changed = connected.replacen("/usr/bin/mcpctl", "/opt/other", 1);
        assert!(disconnect(Host::ClaudeDesktop, &changed, text, &record, &bridge).is_err());
    }

    #[test]
    fn codex_tables_are_rewritten_in_place() {
        let text =
            "model = \"o3\"\n\n# mine\n[mcp_servers.a]\ncommand = \"x\"\nenv = { K = \"v\" }\n";
        let names = vec![("a".to_owned(), "a".to_owned())];
        let connected = connect(Host::Codex, text, &names, &bridge).expect("connect");
        assert!(connected.starts_with("model = \"o3\"\n"), "{connected}");
        assert!(
            connected.contains("command = \"/usr/bin/mcpctl\""),
            "{connected}"
        );
        assert!(!connected.contains("K = "), "{connected}");
        let record = Record {
            servers: names,
            connected: connected.clone(),
        };
        assert_eq!(
            disconnect(Host::Codex, &connected, text, &record, &bridge),
            Ok(text.to_owned())
        );
    }
}
