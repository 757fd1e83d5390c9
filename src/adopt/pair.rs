//! Which unit an entry of a host's file is, for `connect` (DESIGN §11): the
//! unit imported from that very entry (its origin line names the host, the
//! file and the entry), else the unit the entry already bridges to, else a
//! unit that runs the same server. Never a unit only because it has the entry's
//! name: two hosts' `time` may be two different servers. Pure.

use std::path::PathBuf;

use super::convert::{self, Lookup};
use super::hosts::{Entry, Server};

/// A unit of the instance, as `connect` sees it.
#[derive(Debug, Clone)]
pub struct Unit {
    pub name: String,
    /// Its main file.
    pub path: PathBuf,
    pub text: String,
    /// Its env-file's text (`NAME.env` beside it), if there is one.
    pub env: Option<String>,
}

/// Why an entry is paired with its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// The unit was imported from this entry.
    Imported,
    /// The unit runs the same server (imported from another host's entry).
    Same,
    /// The entry already runs `mcpctl bridge UNIT`.
    Bridged,
}

impl How {
    pub fn says(self) -> &'static str {
        match self {
            How::Imported => "imported from this entry",
            How::Same => "the same server",
            How::Bridged => "already bridged",
        }
    }
}

/// An entry's unit and why, or why it has none.
pub type Pairing = Result<(String, How), String>;

/// The unit `entry` is, among `units`, or why none is. `bridge(unit)` is
/// the command line `connect` writes for `unit`.
pub fn pair(
    entry: &Entry,
    units: &[Unit],
    lookup: &Lookup<'_>,
    bridge: &dyn Fn(&str) -> Vec<String>,
) -> Pairing {
    let named = convert::unit_name(&entry.name);
    // The unit of the entry's own name first, where two would do.
    let mut ordered: Vec<&Unit> = units.iter().collect();
    ordered.sort_by_key(|u| Some(&u.name) != named.as_ref());
    let origin = convert::origin(entry.host, &entry.file, &entry.name);
    if let Some(u) = ordered
        .iter()
        .find(|u| u.text.lines().next() == Some(origin.as_str()))
    {
        return Ok((u.name.clone(), How::Imported));
    }
    if let Server::Stdio { command, args, .. } = &entry.server {
        let line: Vec<&str> = std::iter::once(command)
            .chain(args)
            .map(String::as_str)
            .collect();
        if let Some(u) = ordered.iter().find(|u| bridge(&u.name) == line) {
            return Ok((u.name.clone(), How::Bridged));
        }
    }
    for u in &ordered {
        let env_file = u.path.with_extension("env");
        if convert::convert(entry, convert::Keep::EnvFile(&env_file), lookup)
            .is_ok_and(|c| convert::same_server(&c, &u.text, u.env.as_deref()))
        {
            return Ok((u.name.clone(), How::Same));
        }
    }
    Err(
        match ordered.first().filter(|u| Some(&u.name) == named.as_ref()) {
            Some(u) => match convert::origin_of(&u.text) {
                Some(from) => format!("unit {} is another server, imported from {from}", u.name),
                None => format!("unit {} is another server", u.name),
            },
            None => "no unit was imported from it".into(),
        },
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::adopt::hosts::{self, Host};

    fn bridge(unit: &str) -> Vec<String> {
        vec![
            "/bin/mcpctl".into(),
            "--user".into(),
            "bridge".into(),
            unit.into(),
        ]
    }

    #[test]
    fn entries_pair_by_origin_or_server_never_by_name_alone() {
        let home = Path::new("/h");
        let units_dir = Path::new("/h/.config/mcpd/units");
        let lookup = Lookup {
            var: &|_| None,
            file: &|_| None,
            home,
        };
        let read = |host: Host, file: &str, text: &str| -> Vec<Entry> {
            hosts::read(host, &home.join(file), text, home).expect("entries")
        };
        let claude = read(
            Host::ClaudeCode,
            ".claude.json",
            r#"{"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone", "Europe/Paris"]}}}"#,
        );
        let gemini = read(
            Host::Gemini,
            ".gemini/settings.json",
            r#"{"mcpServers": {
                "time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone", "Asia/Tokyo"]},
                "same": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone", "Europe/Paris"]},
                "bridged": {"command": "/bin/mcpctl", "args": ["--user", "bridge", "time"]},
                "other": {"command": "x"}
            }}"#,
        );
        let by = |entries: &[Entry], name: &str| -> Entry {
            entries
                .iter()
                .find(|e| e.name == name)
                .expect("entry")
                .clone()
        };
        let unit = |name: &str, entry: &Entry| -> Unit {
            let path = units_dir.join(format!("{name}.kdl"));
            let env_file = path.with_extension("env");
            let c = convert::convert(entry, convert::Keep::EnvFile(&env_file), &lookup)
                .expect("convert");
            Unit {
                name: name.into(),
                path,
                text: c.unit,
                env: None,
            }
        };
        let paris = by(&claude, "time");
        let tokyo = by(&gemini, "time");
        let both = vec![unit("time", &paris), unit("time-gemini", &tokyo)];
        let claudes = vec![unit("time", &paris)];
        type Want<'a> = Result<(&'a str, How), String>;
        let table: [(&[Unit], Entry, Want); 6] = [
            (&both, paris.clone(), Ok(("time", How::Imported))),
            (&both, tokyo.clone(), Ok(("time-gemini", How::Imported))),
            (&both, by(&gemini, "same"), Ok(("time", How::Same))),
            (&both, by(&gemini, "bridged"), Ok(("time", How::Bridged))),
            (
                &both,
                by(&gemini, "other"),
                Err("no unit was imported from it".into()),
            ),
            // Gemini's `time` is not Claude Code's, though it has its name.
            (
                &claudes,
                tokyo,
                Err(format!(
                    "unit time is another server, imported from claude-code ({}, entry \"time\")",
                    home.join(".claude.json").display()
                )),
            ),
        ];
        for (units, entry, want) in table {
            let got = pair(&entry, units, &lookup, &bridge);
            let got = got
                .as_ref()
                .map(|(u, h)| (u.as_str(), *h))
                .map_err(String::clone);
            assert_eq!(got, want, "{}", entry.name);
        }
    }
}
