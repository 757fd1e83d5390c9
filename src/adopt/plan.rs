//! What `mcpctl connect` will do, decided in one place (DESIGN §11): the
//! host's file and everything known about the instance's units in, a
//! [`ConnectPlan`] out (the file's new text, each entry's unit and why,
//! the entries left alone and why, the record to keep, whether to keep a
//! backup). Pure: `ctl::import` reads the files before and writes and
//! prints the plan after.

use std::path::Path;

use super::connect::{self, Record};
use super::convert::{self, Lookup};
use super::hosts::{Entry, Host};
use super::pair::{self, Unit};

/// What `connect` is given.
pub struct ConnectInput<'a> {
    pub host: Host,
    /// The host's user-level file (for messages) and its text.
    pub file: &'a Path,
    pub text: &'a str,
    /// The file's user-level entries, as `import` read them.
    pub entries: &'a [Entry],
    /// The instance's units, and its name.
    pub units: &'a [Unit],
    pub instance: &'a str,
    /// The other instance's units and name, to say "use --user" when the
    /// entries are its units.
    pub other_units: &'a [Unit],
    pub other: &'a str,
    /// The units named on the command line (none: every entry that has
    /// one), or the group to serve as one entry, with its units.
    pub names: &'a [String],
    pub group: Option<(&'a str, &'a [String])>,
    pub lookup: &'a Lookup<'a>,
    /// `mcpctl bridge UNIT` of this instance, and of the other.
    pub bridge: &'a dyn Fn(&str) -> Vec<String>,
    pub other_bridge: &'a dyn Fn(&str) -> Vec<String>,
    /// What each rewritten entry sets for the bridge to find its daemon.
    pub vars: &'a [(String, String)],
    /// The record of an earlier `connect` of this file, if any.
    pub earlier: Option<Record>,
}

impl std::fmt::Debug for ConnectInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectInput")
            .field("host", &self.host)
            .field("file", &self.file)
            .field("names", &self.names)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

/// What `connect` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectPlan {
    /// The host's file as it will be.
    pub text: String,
    /// Each entry rewritten: its name, what it bridges (a unit, or
    /// `@GROUP`) and why.
    pub servers: Vec<(String, String, &'static str)>,
    /// One line for each entry left alone, and why.
    pub left: Vec<String>,
    /// What is kept beside the file to undo it.
    pub record: Record,
    /// Whether the file as it is now is the backup to keep (the first
    /// `connect`; a later one keeps the first's backup).
    pub backup: bool,
}

/// What `connect` will do with `input`, or why it cannot.
pub fn connect(input: ConnectInput<'_>) -> Result<ConnectPlan, String> {
    let host = input.host;
    let paired: Vec<(&Entry, pair::Pairing)> = input
        .entries
        .iter()
        .map(|e| (e, pair::pair(e, input.units, input.lookup, input.bridge)))
        .collect();
    let mut servers: Vec<(String, String, &'static str)> = Vec::new();
    let mut left = Vec::new();
    if let Some((group, members)) = input.group {
        if members.is_empty() {
            return Err(format!(
                "no unit of the {} instance is in group {group}",
                input.instance
            ));
        }
        // The host's own entries of those units would serve them twice.
        for (entry, pairing) in &paired {
            if let Ok((unit, _)) = pairing
                && members.contains(unit)
                && entry.name != group
            {
                left.push(format!(
                    "{}: {} is also unit {unit} of group {group}: remove it from {} (or the host has its tools twice)",
                    host.name(),
                    entry.name,
                    input.file.display()
                ));
            }
        }
        servers.push((group.to_owned(), format!("@{group}"), "the group"));
    } else if input.names.is_empty() {
        for (entry, pairing) in &paired {
            match pairing {
                Ok((unit, how)) => servers.push((entry.name.clone(), unit.clone(), how.says())),
                Err(why) => left.push(format!("{}: {} left alone: {why}", host.name(), entry.name)),
            }
        }
        if servers.is_empty() {
            let there = paired.iter().any(|(e, _)| {
                pair::pair(e, input.other_units, input.lookup, input.other_bridge).is_ok()
            });
            return Err(format!(
                "none of the servers in {} is a unit of the {} instance: {}",
                input.file.display(),
                input.instance,
                if there {
                    use_other("they are units", input.other)
                } else {
                    format!("run `mcpctl import {}` first", host.name())
                }
            ));
        }
    } else {
        for unit in input.names {
            if !input.units.iter().any(|u| u.name == *unit) {
                let there = input.other_units.iter().any(|u| u.name == *unit);
                return Err(format!(
                    "no unit {unit} in the {} instance's unit directories{}",
                    input.instance,
                    if there {
                        format!("; {}", use_other("it is a unit", input.other))
                    } else {
                        String::new()
                    }
                ));
            }
            let ours = paired.iter().find_map(|(e, p)| match p {
                Ok((u, how)) if u == unit => Some((e.name.clone(), how.says())),
                _ => None,
            });
            if let Some((entry, why)) = ours {
                servers.push((entry, unit.clone(), why));
                continue;
            }
            // An entry of that name that is another server is not replaced.
            if let Some((entry, _)) = paired.iter().find(|(e, _)| e.name == *unit) {
                return Err(format!(
                    "{}: entry {} is not the server of unit {unit}{}; `mcpctl import {}` makes a unit of it",
                    input.file.display(),
                    entry.name,
                    input
                        .units
                        .iter()
                        .find(|u| u.name == *unit)
                        .and_then(|u| convert::origin_of(&u.text))
                        .map(|o| format!(" (imported from {o})"))
                        .unwrap_or_default(),
                    host.name()
                ));
            }
            servers.push((unit.clone(), unit.clone(), "added"));
        }
    }
    let pairs: Vec<(String, String)> = servers
        .iter()
        .map(|(e, u, _)| (e.clone(), u.clone()))
        .collect();
    let text = connect::connect(host, input.text, &pairs, input.bridge, input.vars)
        .map_err(|e| format!("{}: {e}", input.file.display()))?;
    // Byte for byte only while nobody else changed the file: edits made
    // between two connects are kept by disconnect's merge.
    let exact = input
        .earlier
        .as_ref()
        .is_none_or(|r| !r.connected.is_empty() && r.connected == input.text);
    let backup = input.earlier.is_none();
    let mut all = input.earlier.map(|r| r.servers).unwrap_or_default();
    for server in &pairs {
        if !all.contains(server) {
            all.push(server.clone());
        }
    }
    let record = Record {
        servers: all,
        connected: if exact { text.clone() } else { String::new() },
    };
    Ok(ConnectPlan {
        text,
        servers,
        left,
        record,
        backup,
    })
}

/// What to say when the units are `other`'s (`they are units`, `it is a
/// unit`), as `status` says it.
pub fn use_other(they: &str, other: &str) -> String {
    format!("{they} of the {other} instance: use --{other}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn unit(name: &str, text: &str) -> Unit {
        Unit {
            name: name.into(),
            path: PathBuf::from(format!("/units/{name}.kdl")),
            text: text.into(),
            env: None,
        }
    }

    fn bridge(name: &str) -> Vec<String> {
        vec![
            "/usr/bin/mcpctl".into(),
            "--user".into(),
            "bridge".into(),
            name.into(),
        ]
    }

    fn other_bridge(name: &str) -> Vec<String> {
        vec![
            "/usr/bin/mcpctl".into(),
            "--system".into(),
            "bridge".into(),
            name.into(),
        ]
    }

    /// Plans `connect` of Gemini's `text` against `units`.
    fn plan(
        text: &str,
        units: &[Unit],
        names: &[String],
        group: Option<(&str, &[String])>,
        earlier: Option<Record>,
    ) -> Result<ConnectPlan, String> {
        let file = Path::new("/home/u/.gemini/settings.json");
        let base = Path::new("/home/u");
        let entries = super::super::hosts::read(Host::Gemini, file, text, base).expect("read");
        let var = |_: &str| None;
        let read = |_: &Path| None;
        let lookup = Lookup {
            var: &var,
            file: &read,
            home: base,
        };
        connect(ConnectInput {
            host: Host::Gemini,
            file,
            text,
            entries: &entries,
            units,
            instance: "user",
            other_units: &[],
            other: "system",
            names,
            group,
            lookup: &lookup,
            bridge: &bridge,
            other_bridge: &other_bridge,
            vars: &[],
            earlier,
        })
    }

    const TIMES: &str = r#"{"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone", "Asia/Tokyo"], "timeout": 30000}}}"#;

    /// Unit `t`, imported from Gemini's `time`.
    fn imported() -> [Unit; 1] {
        let origin = convert::origin(
            Host::Gemini,
            Path::new("/home/u/.gemini/settings.json"),
            "time",
        );
        [unit(
            "t",
            &format!("{origin}\nstdio {{ command \"uvx\" \"mcp-server-time\"; }}\n"),
        )]
    }

    #[test]
    fn an_entry_is_paired_with_the_unit_imported_from_it_never_by_name_alone() {
        let origin = convert::origin(
            Host::Gemini,
            Path::new("/home/u/.gemini/settings.json"),
            "time",
        );
        let units = [
            // Claude Code's `time`, another server of the same name.
            unit(
                "time",
                "// imported from claude-code (/home/u/.claude.json, entry \"time\")\nstdio { command \"uvx\" \"mcp-server-time\" \"--local-timezone\" \"Europe/Paris\"; }\n",
            ),
            unit(
                "time-gemini",
                &format!(
                    "{origin}\nstdio {{ command \"uvx\" \"mcp-server-time\" \"--local-timezone\" \"Asia/Tokyo\"; }}\n"
                ),
            ),
        ];
        let planned = plan(TIMES, &units, &[], None, None).expect("plan");
        assert_eq!(
            planned.servers,
            [(
                "time".to_owned(),
                "time-gemini".to_owned(),
                "imported from this entry"
            )]
        );
        assert!(planned.backup);
        assert_eq!(planned.record.connected, planned.text);
        // Naming the unit that only shares the entry's name is refused.
        let named = plan(TIMES, &units, &["time".to_owned()], None, None);
        assert!(
            named
                .as_ref()
                .is_err_and(|e| e.contains("entry time is not the server of unit time")),
            "{named:?}"
        );
        // With no unit for it: refused, saying to import first.
        let none = plan(TIMES, &units[..1], &[], None, None);
        assert!(
            none.as_ref()
                .is_err_and(|e| e.contains("run `mcpctl import gemini` first")),
            "{none:?}"
        );
    }

    #[test]
    fn the_hosts_own_keys_stay_and_a_group_is_one_entry() {
        let units = imported();
        let planned = plan(TIMES, &units, &[], None, None).expect("plan");
        let value: serde_json::Value =
            jsonc_parser::parse_to_serde_value(&planned.text, &Default::default()).expect("json");
        assert_eq!(value["mcpServers"]["time"]["timeout"], 30000);
        assert_eq!(value["mcpServers"]["time"]["args"][2], "t");

        let members = ["t".to_owned()];
        let planned = plan(TIMES, &units, &[], Some(("dev", &members)), None).expect("plan");
        assert_eq!(
            planned.servers,
            [("dev".to_owned(), "@dev".to_owned(), "the group")]
        );
        assert!(
            planned.left[0].starts_with("gemini: time is also unit t of group dev"),
            "{:?}",
            planned.left
        );
        let empty: [String; 0] = [];
        assert!(plan(TIMES, &units, &[], Some(("dev", &empty)), None).is_err());
    }

    #[test]
    fn a_second_connect_keeps_the_first_backup_and_merges_the_record() {
        let units = imported();
        let first = plan(TIMES, &units, &[], None, None).expect("plan");
        let again = plan(&first.text, &units, &[], None, Some(first.record.clone())).expect("plan");
        assert!(!again.backup, "the first connect's backup is the original");
        assert_eq!(again.record.servers, first.record.servers);
        assert_eq!(again.record.connected, again.text, "nobody else changed it");
        // The host edited the file between two connects: no byte-for-byte
        // undo any more.
        let edited = first.text.replace("30000", "60000");
        let merged = plan(&edited, &units, &[], None, Some(first.record)).expect("plan");
        assert!(merged.record.connected.is_empty());
    }
}
